#include "drill/process_drill.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <future>
#include <nlohmann/json.hpp>

#include <caf/all.hpp>

#include "chaos_monkey/chaos_actor.hpp"
#include "drill/process_launcher.hpp"
#include "learner/learner_core.hpp"
#include "learner/model/trainer.hpp"
#include "node/mesh_snapshots.hpp"
#include "transport/curve_keys.hpp"
#include "transport/transport.hpp"

namespace archipelago {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

/// The mesh's processes as the drill lays them out: endpoints, ports, keys, commands.
struct process_mesh {
  mesh_setup setup;
  std::vector<node_child> children;  // brokers (the primary, then the standbys), shards, learners
  std::vector<std::string> shard_dbs, broker_dbs;
};

/// With wire.curve, every node gets a keypair of its own (learner-I, standby I is
/// broker-I: each key binds its node's identity, so a learner cannot speak for
/// another) and the chaos monkey one too; every node allows the public keys of the
/// run's key directory and finds its peers' there by name.
status make_keys(const fs::path& keys, int shards, int standbys, int learners) {
  std::error_code ec;
  fs::create_directories(keys, ec);
  if (ec) return make_error(errc::io_error, "cannot create " + keys.string() + ": " + ec.message());
  fs::permissions(keys, fs::perms::owner_all, ec);
  std::vector<std::string> names{"broker", "chaos"};
  for (int l = 0; l < learners; ++l) names.push_back("learner-" + std::to_string(l));
  for (int s = 0; s < shards; ++s) names.push_back("shard-" + std::to_string(s));
  for (int b = 1; b <= standbys; ++b) names.push_back("broker-" + std::to_string(b));
  for (const auto& name : names) {
    auto pair = transport::generate_keypair();
    if (!pair) return pair.err();
    if (auto ok = transport::save_keypair(keys.string(), name, *pair); !ok) return ok.err();
  }
  return {};
}

expected<process_mesh> lay_out(const config& cfg, const sync_policy& policy, int standbys, const fs::path& dir,
                               const drill_options& o) {
  const int m = cfg.mesh.learners, shards = policy.shards, brokers = 1 + standbys;
  std::error_code ec;
  fs::create_directories(dir / "logs", ec);
  if (ec) return make_error(errc::io_error, "cannot create " + (dir / "logs").string() + ": " + ec.message());
  const std::string toml = (dir / "mesh.toml").string();
  std::ofstream(toml) << to_toml(cfg);
  const int nodes = brokers + shards + m;  // a listening port and a metrics port each
  auto ports = free_loopback_ports(static_cast<std::size_t>(2 * nodes));
  if (!ports) return ports.err();
  auto tcp = [](int port) { return "tcp://127.0.0.1:" + std::to_string(port); };
  process_mesh out;
  out.setup = make_mesh_setup(cfg, policy);
  mesh_setup& setup = out.setup;
  setup.broker_endpoint = tcp((*ports)[0]);
  std::string broker_list = setup.broker_endpoint;  // the primary first, then the standbys: every node is given all
  for (int b = 1; b < brokers; ++b) {
    setup.standby_endpoints.push_back(tcp((*ports)[b]));
    broker_list += "," + setup.standby_endpoints.back();
  }
  std::string shard_list;
  for (int s = 0; s < shards; ++s) {
    setup.shard_endpoints.push_back(tcp((*ports)[brokers + s]));
    shard_list += (s ? "," : "") + setup.shard_endpoints.back();
  }
  for (int l = 0; l < m; ++l) setup.learner_endpoints.push_back(tcp((*ports)[brokers + shards + l]));
  const fs::path keys = dir / "keys";
  if (cfg.wire.curve) {
    if (auto ok = make_keys(keys, shards, standbys, m); !ok) return ok.err();
    setup.cfg.wire.key_file = (keys / "chaos.key").string();
    setup.cfg.wire.allow = keys.string();
  }
  auto add = [&](std::string name, role kind, std::uint32_t index, int slot) {
    node_child c;
    c.name = std::move(name);
    c.target = {kind, index};
    c.metrics_port = (*ports)[nodes + slot];
    c.argv = {o.binary, "node", "--role", kind == role::sync_broker ? "broker" : kind == role::parameter_shard ? "shard" : "learner",
              "--index", std::to_string(index), "--config", toml, "--broker", broker_list, "--shards",
              shard_list, "--metrics-host", "127.0.0.1", "--metrics-port", std::to_string(c.metrics_port), "--json"};
    if (kind == role::sync_broker && index > 0) c.argv.push_back("--standby");
    if (cfg.wire.curve)
      c.argv.insert(c.argv.end(), {"--set", "wire.key_file=" + (keys / (c.name + ".key")).string(),
                                   "--set", "wire.allow=" + keys.string()});
    if (kind == role::learner) {
      c.argv.insert(c.argv.end(), {"--listen", setup.learner_endpoints[index]});
      if (const auto own = o.learner_commands.find(index); own != o.learner_commands.end()) {
        std::vector<std::string> argv;  // the command's words, then the node's arguments
        std::istringstream words(own->second);
        for (std::string w; words >> w;) argv.push_back(std::move(w));
        argv.insert(argv.end(), c.argv.begin() + 2, c.argv.end());
        c.argv = std::move(argv);
      }
    } else {
      c.db = (dir / (c.name + ".db")).string();
      c.argv.insert(c.argv.end(), {"--db", c.db});
      (kind == role::parameter_shard ? out.shard_dbs : out.broker_dbs).push_back(c.db);
    }
    out.children.push_back(std::move(c));
  };
  add("broker", role::sync_broker, 0, 0);
  for (int b = 1; b < brokers; ++b) add("broker-" + std::to_string(b), role::sync_broker, static_cast<std::uint32_t>(b), b);
  for (int s = 0; s < shards; ++s)
    add("shard-" + std::to_string(s), role::parameter_shard, static_cast<std::uint32_t>(s), brokers + s);
  for (int l = 0; l < m; ++l)
    add("learner-" + std::to_string(l), role::learner, static_cast<std::uint32_t>(l), brokers + shards + l);
  return out;
}

/// Mirrors the nodes' statuses onto the drill's board: GET /node of every
/// running child, every node at once (a learner answers between its steps, so
/// one by one would add up).
void mirror(process_launcher& launcher, status_board& board, const std::vector<std::size_t>& which = {}) {
  std::vector<std::future<std::optional<std::string>>> asked;
  for (const node_child& c : launcher.children())
    if (c.pid >= 0 && !c.paused &&
        (which.empty() || std::find(which.begin(), which.end(), launcher.find(c.target)) != which.end()))
      asked.push_back(std::async(std::launch::async, [port = c.metrics_port] { return http_get(port, "/node", 1000); }));
  for (auto& a : asked) {
    const auto page = a.get();
    if (!page) continue;
    const json nodes = json::parse(*page, nullptr, false);
    if (!nodes.is_array()) continue;
    for (const json& n : nodes)
      if (auto s = node_status_from_json(n.dump())) board.update(*s);
  }
}

/// The last JSON line of a node's log: its `node --json` summary.
std::optional<json> last_json_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::optional<json> out;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded()) out = std::move(j);
    }
  return out;
}

/// The drill's hold on the processes for the chaos monkey: it records what each
/// kill and restart did, the killed learners' last counts and the killed shards'
/// durable versions (read from their stores once their process is gone).
class drill_processes final : public process_control {
 public:
  drill_processes(process_launcher& launcher, status_board& board, mesh_drill& drill, const mesh_setup& setup,
                  const clock_source& clock, logger& log)
      : launcher_(launcher), board_(board), drill_(drill), setup_(setup), clock_(clock), log_(log) {}

  void crash(const fault_target& t) override {
    const std::size_t i = launcher_.find(t);
    if (i == process_launcher::npos) return;
    const node_child c = launcher_.children()[i];
    if (c.pid < 0) return;
    if (t.kind == role::learner && !c.paused) mirror(launcher_, board_, {i});  // its counts right before it dies
    launcher_.kill(i);
    std::lock_guard lock(mutex_);
    if (t.kind == role::learner) {
      const auto e = board_.find({role::learner, t.index});
      const bool seen = e && e->now.incarnation >= c.spawned_ms;  // this process's status, not its predecessor's
      std::lock_guard record(drill_.mutex);
      drill_.killed.push_back({t.index, seen ? e->now.incarnation : 0, seen ? e->now.counts.steps : 0});
      killed_spans_.push_back({c.spawned_ms, static_cast<std::uint64_t>(wall_clock_ns() / 1'000'000)});
    }
    if (t.kind == role::parameter_shard) durable_at_kill_[t.index] = durable_versions(c);
  }

  void restart(const fault_target& t) override {
    const std::size_t i = launcher_.find(t);
    if (i == process_launcher::npos || launcher_.children()[i].pid >= 0) return;
    auto pid = launcher_.start(i);
    if (!pid) {
      log_.error("drill.restart", "archipelago drill: cannot restart %s: %s", launcher_.children()[i].name.c_str(),
                 pid.err().message.c_str());
      return;
    }
    std::lock_guard lock(mutex_);
    std::lock_guard record(drill_.mutex);
    drill_.restarts.push_back({t, 0, drill_.log.since_start(clock_.now()), 0, 0});
    restarts_.push_back({drill_.restarts.size() - 1, launcher_.children()[i].spawned_ms, false});
  }

  void pause(const fault_target& t, nanos duration) override {
    if (const std::size_t i = launcher_.find(t); i != process_launcher::npos) launcher_.pause(i, duration);
  }

  void lose_host(const fault_target& t) override {
    if (const std::size_t i = launcher_.find(t); i != process_launcher::npos) launcher_.lose_host(i);
  }

  /// A restarted shard's first status: the versions it restored against what its store held durable.
  void check_restored_shards() {
    std::lock_guard lock(mutex_);
    std::lock_guard record(drill_.mutex);
    for (pending_restart& p : restarts_) {
      mesh_drill::restart& r = drill_.restarts[p.row];
      if (p.checked || r.target.kind != role::parameter_shard) continue;
      const auto e = board_.find({role::parameter_shard, r.target.index});
      const auto d = durable_at_kill_.find(r.target.index);
      if (!e || e->now.incarnation < p.spawned_ms || d == durable_at_kill_.end()) continue;
      const auto& restored = e->now.committed_versions;
      for (std::size_t f = 0; f < d->second.size() && f < restored.size(); ++f)
        if (d->second[f] > restored[f]) r.versions_lost += d->second[f] - restored[f];
      for (auto v : restored) r.restored_version += v;
      p.checked = true;
    }
  }

  /// Which incarnation each kill and restart was, from the broker's records: a
  /// node's incarnation is its start's wall-clock ms.
  void name_incarnations(const broker_report& b) {
    std::lock_guard lock(mutex_);
    std::lock_guard record(drill_.mutex);
    for (std::size_t k = 0; k < drill_.killed.size() && k < killed_spans_.size(); ++k) {
      auto& kl = drill_.killed[k];
      if (kl.incarnation != 0) continue;
      // Never seen: the broker's record of an incarnation that started within this
      // process's life, if it ever joined (one killed before joining has none: 0 stays).
      for (const auto& r : b.learners)
        if (r.who.learner.value == kl.learner && r.who.inc.value >= killed_spans_[k].spawned_ms &&
            r.who.inc.value <= killed_spans_[k].killed_ms)
          kl.incarnation = r.who.inc.value;
    }
    for (const pending_restart& p : restarts_) {
      auto& rs = drill_.restarts[p.row];
      if (rs.target.kind != role::learner) continue;
      std::uint64_t best = 0;
      for (const auto& r : b.learners)
        if (r.who.learner.value == rs.target.index && r.who.inc.value >= p.spawned_ms && (!best || r.who.inc.value < best))
          best = r.who.inc.value;
      rs.incarnation = best;
    }
  }

 private:
  struct lifetime {
    std::uint64_t spawned_ms, killed_ms;
  };
  struct pending_restart {
    std::size_t row;
    std::uint64_t spawned_ms;
    bool checked;
  };

  /// A shard's newest durable fragment versions, read from its store once its process is gone.
  std::vector<std::uint64_t> durable_versions(const node_child& c) const {
    std::vector<std::uint64_t> out(setup_.fragments(), 0);
    auto store = open_store_read_only(c.db);
    if (!store) return out;
    auto head = (*store)->latest_manifest();
    if (!head || !*head) return out;
    for (const auto& e : (*head)->entries)
      if (e.fragment < out.size() && setup_.shard_of_fragment[e.fragment] == c.target.index) out[e.fragment] = e.version;
    return out;
  }

  process_launcher& launcher_;
  status_board& board_;
  mesh_drill& drill_;
  const mesh_setup& setup_;
  const clock_source& clock_;
  logger& log_;
  std::mutex mutex_;
  std::map<std::uint32_t, std::vector<std::uint64_t>> durable_at_kill_;
  std::vector<pending_restart> restarts_;
  std::vector<lifetime> killed_spans_;
};

/// Θ at the end, read out of the shards' stores (each holds its own fragments), evaluated.
expected<eval_result> evaluate_stores(const config& cfg, const mesh_setup& layout, const std::vector<std::string>& dbs) {
  auto data = load_dataset(cfg.data, cfg.mesh.learners, layout.shape.context, cfg.train.seed);
  if (!data) return data.err();
  std::vector<float> theta(layout.layout.total_floats, 0.f);
  learner_core scatterer(layout.layout, layout.plan, {});
  std::vector<bool> seen(layout.fragments(), false);
  for (std::size_t s = 0; s < dbs.size(); ++s) {
    auto store = open_store_read_only(dbs[s]);
    if (!store) return store.err();
    auto head = (*store)->latest_manifest();
    if (!head) return head.err();
    if (!*head) return make_error(errc::not_found, dbs[s] + " holds no snapshot");
    for (const auto& e : (*head)->entries) {
      if (e.fragment >= seen.size() || layout.shard_of_fragment[e.fragment] != s) continue;
      auto f = (*store)->read_fragment(e.fragment, e.version);
      if (!f) return make_error(f.err().code, dbs[s] + ": " + f.err().message);
      scatterer.scatter({e.fragment}, f->theta.data(), theta.data());
      seen[e.fragment] = true;
    }
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end())
    return make_error(errc::not_found, "the shards' stores do not hold every fragment");
  set_compute_threads(1);
  engine evaluator(cfg, layout.shape, *data, 0);
  std::copy(theta.begin(), theta.end(), evaluator.model().params());
  return evaluator.evaluate();
}

struct process_run {
  mesh_summary summary;
  std::vector<drill_sample> samples;
  std::vector<drill_process_event> events;
  std::vector<std::string> broker_dbs;  // the brokers' stores (their tapes), the primary's first
};

/// One run of the mesh as processes, with the chaos monkey walking drill.timeline
/// (empty: the fault-free reference). `dir` receives the stores and the logs.
class process_run_of {
 public:
  process_run_of(const config& cfg, logger& log, mesh_drill& drill, const mesh_progress& progress,
                 const std::function<bool()>& stop_requested)
      : cfg_(cfg), log_(log), drill_(drill), progress_(progress), stop_requested_(stop_requested) {}

  /// stop_tokens > 0: the run also ends once the learners processed that many tokens.
  /// `standbys`: standby brokers beside the primary.
  expected<process_run> run(const sync_policy& policy, int standbys, const fs::path& dir, const drill_options& o,
                            std::uint64_t stop_tokens);

 private:
  double drill_time() const {
    std::lock_guard lock(drill_.log.mutex);
    return drill_.log.started_ns < 0 ? -1 : static_cast<double>(clock_.now() - drill_.log.started_ns) * 1e-9;
  }
  status wait_up(std::size_t first, std::size_t count, double bound_s, const char* what);
  status observe();
  void final_statuses();
  status summarize(const process_mesh& mesh, double wall_s, process_run& out);

  const config& cfg_;
  logger& log_;
  mesh_drill& drill_;
  const mesh_progress& progress_;
  const std::function<bool()>& stop_requested_;
  steady_clock_source clock_;
  status_board board_;
  first_merges merges_;
  std::unique_ptr<process_launcher> launcher_;
  std::unique_ptr<drill_processes> control_;
};

/// Waits until children [first, first + count) serve their /node; a child that dies meanwhile is an error.
status process_run_of::wait_up(std::size_t first, std::size_t count, double bound_s, const char* what) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(bound_s);
  for (std::size_t i = first; i < first + count; ++i)
    for (;;) {
      if (auto ok = launcher_->reap_exited(); !ok) return ok.err();
      const node_child c = launcher_->children()[i];
      if (http_get(c.metrics_port, "/node", 1000)) break;
      if (stop_requested_()) return make_error(errc::timeout, "stopped by a signal while the mesh started");
      if (std::chrono::steady_clock::now() > until)
        return make_error(errc::timeout, c.name + " did not serve /node within " + std::to_string(static_cast<int>(bound_s)) +
                                             " s (" + what + "); its log " + c.log + ":\n" + log_tail(c.log));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  return {};
}

/// One look at the mesh: who died on their own, every node's status, restarted shards, first merges.
status process_run_of::observe() {
  if (auto ok = launcher_->reap_exited(); !ok) return ok.err();
  mirror(*launcher_, board_);
  control_->check_restored_shards();
  if (const auto b = board_.leading_broker(); b && b->now.report) merges_.observe(*b->now.report, clock_.now());
  return {};
}

/// Each node's last word: the status in its `node --json` summary (its final counts
/// and, from the broker, its final report), over what the polls last saw.
void process_run_of::final_statuses() {
  for (const node_child& c : launcher_->children()) {
    auto summary = last_json_line(c.log);
    if (!summary || !summary->contains("status")) continue;
    if (auto s = node_status_from_json((*summary)["status"].dump())) board_.update(*s);
  }
}

expected<process_run> process_run_of::run(const sync_policy& policy, int standbys, const fs::path& dir,
                                          const drill_options& o, std::uint64_t stop_tokens) {
  auto mesh = lay_out(cfg_, policy, standbys, dir, o);
  if (!mesh) return mesh.err();
  const int m = cfg_.mesh.learners, servers = 1 + standbys + policy.shards;  // brokers and shards start first
  caf::actor_system_config sys_cfg;
  sys_cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{sys_cfg};
  caf::actor chaos;
  // Declared after the actor system: the launcher (whose pause/crash the chaos monkey
  // calls) outlives the chaos monkey, which is stopped below before it goes.
  launcher_ = std::make_unique<process_launcher>(mesh->children, (dir / "logs").string(), [this] { return drill_time(); });
  control_ = std::make_unique<drill_processes>(*launcher_, board_, drill_, mesh->setup, clock_, log_);
  caf::scoped_actor self{sys};
  auto stop_chaos = [&] {
    if (!chaos) return;
    self->monitor(chaos);
    self->send_exit(chaos, caf::exit_reason::user_shutdown);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(30)) >> [] {});
    chaos = caf::actor{};
  };
  auto fail = [&](error e) -> error {
    stop_chaos();
    launcher_->stop_all(std::chrono::seconds(5));
    return e;
  };
  for (std::size_t i = 0; i < static_cast<std::size_t>(servers); ++i)
    if (auto pid = launcher_->start(i); !pid) return fail(pid.err());
  if (auto ok = wait_up(0, servers, 60, "brokers and shards"); !ok) return fail(ok.err());
  // The run's span, for goodput, starts with the learners (the ledger counts their work from there).
  const auto learners_started = std::chrono::steady_clock::now();
  for (std::size_t i = static_cast<std::size_t>(servers); i < mesh->children.size(); ++i)
    if (auto pid = launcher_->start(i); !pid) return fail(pid.err());
  if (auto ok = wait_up(servers, m, 90, "learners"); !ok) return fail(ok.err());
  if (progress_)
    progress_("mesh of processes up: broker" + (standbys ? " and " + std::to_string(standbys) + " standby(s)" : std::string()) +
              ", " + std::to_string(policy.shards) + " shards, " + std::to_string(m) + " learners");

  chaos = spawn_chaos_monkey(sys, {&mesh->setup, transport::make_io_context(), &clock_, &log_, "tcp://127.0.0.1:0",
                                   drill_.timeline, drill_.safety_ns, control_.get(), &drill_.log});
  process_run out;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  // As in one process: the run ends at its time limit, or once every learner has done its steps.
  while (elapsed() < cfg_.train.time_limit_s && !stop_requested_() && !launcher_->learners_done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (auto ok = observe(); !ok) return fail(ok.err());
    const double t = drill_time();
    if (t < 0) continue;
    drill_sample s = sample_of(board_, drill_.log, mesh->setup, t);
    if (progress_) {
      char line[256];
      std::snprintf(line, sizeof line, "%.0fs  rounds %llu  versions %llu  tokens %llu  down: %d learners, %d shards%s",
                    elapsed(), static_cast<unsigned long long>(s.rounds), static_cast<unsigned long long>(s.published),
                    static_cast<unsigned long long>(s.tokens), s.learners_down, s.shards_down,
                    s.broker_down ? ", broker" : "");
      progress_(line);
    }
    const bool enough = stop_tokens > 0 && s.tokens >= stop_tokens;
    out.samples.push_back(std::move(s));
    if (enough) break;
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - learners_started).count();
  stop_chaos();  // no fault and no restart from here on
  launcher_->stop_all(std::chrono::seconds(60));
  out.events = launcher_->events();
  out.broker_dbs = mesh->broker_dbs;
  final_statuses();
  if (auto ok = summarize(*mesh, wall_s, out); !ok) return ok.err();
  return out;
}

/// The run's summary from the board: the same counts as in one process; the
/// learners' tokens at least what the broker heard of each killed incarnation.
status process_run_of::summarize(const process_mesh& mesh, double wall_s, process_run& out) {
  mesh_summary& sum = out.summary;
  const auto b = board_.leading_broker();
  if (!b || !b->now.report) {
    const node_child& c = launcher_->children()[launcher_->find({role::sync_broker, b ? b->now.node.index : 0})];
    return make_error(errc::io_error, "no broker printed a summary with its report (as the one that leads); the end "
                                      "of " + c.name + "'s log " + c.log + ":\n" + log_tail(c.log));
  }
  fill_mesh_counts(board_, cfg_.mesh.learners, sum);
  merges_.apply(sum.broker);
  control_->name_incarnations(sum.broker);
  const auto tokens_per_step = [&] {
    double total = 0;
    for (int l = 0; l < cfg_.mesh.learners; ++l) total += learner_profile_of(cfg_, l).batch;
    return static_cast<std::uint64_t>(std::llround(total / cfg_.mesh.learners * mesh.setup.shape.context));
  }();
  {
    std::lock_guard lock(drill_.mutex);
    for (const auto& k : drill_.killed)
      for (const auto& r : sum.broker.learners)
        if (r.who.learner.value == k.learner && r.who.inc.value == k.incarnation && r.ledger.steps > k.steps) {
          sum.steps += r.ledger.steps - k.steps;
          sum.tokens += (r.ledger.steps - k.steps) * tokens_per_step;
        }
  }
  sum.mode = cfg_.mesh.mode;
  sum.shards = static_cast<int>(mesh.shard_dbs.size());
  sum.fragments = static_cast<int>(mesh.setup.fragments());
  sum.wall_s = wall_s;
  const ledger_totals& l = sum.broker.ledger;
  sum.ledger_exact = l.balanced() && l.processed == sum.tokens;
  sum.goodput = ledger_goodput(l, cfg_.mesh.learners, wall_s);
  auto eval = evaluate_stores(cfg_, mesh.setup, mesh.shard_dbs);
  if (!eval) return make_error(eval.err().code, "evaluating Θ from the shards' stores: " + eval.err().message);
  sum.eval_loss = eval->loss;
  sum.eval_bpb = eval->bits_per_byte;
  sum.eval_curve.emplace_back(l.processed, eval->loss);
  return {};
}

}  // namespace

expected<drill_report> run_process_drill(const config& base, logger& log, const drill_options& o,
                                         const mesh_progress& progress, const std::function<bool()>& stop_requested) {
  auto prepared = prepare_drill(base, o);
  if (!prepared) return prepared.err();
  const config& cfg = prepared->cfg;
  const sync_policy& policy = prepared->policy;
  drill_work_area& area = *prepared->area;
  drill_report& r = prepared->report;
  auto one_run = [&](const char* name, const config& run_cfg, const sync_policy& run_policy, mesh_drill& drill,
                     const std::string& phase, int standbys, std::uint64_t stop_tokens) -> expected<process_run> {
    auto d = area.fresh(name);
    if (!d) return d.err();
    auto run = process_run_of(run_cfg, log, drill, phase_progress(progress, phase), stop_requested)
                   .run(run_policy, standbys, *d, o, stop_tokens);
    if (!run) {
      area.keep = true;
      return make_error(run.err().code, phase + ": " + run.err().message + " (logs kept in " +
                                            (*d / "logs").string() + ")");
    }
    return run;
  };
  mesh_drill drill;
  drill.timeline = expand_fault_plan(prepared->plan, cfg.mesh.learners);
  drill.safety_ns = prepared->plan.duration_ns;
  auto run = one_run("drill", cfg, policy, drill, "drill", prepared->plan.standbys, 0);
  if (!run) return run.err();
  r.run = std::move(run->summary);
  r.samples = std::move(run->samples);
  r.process_events = std::move(run->events);
  const std::vector<std::string> broker_dbs = std::move(run->broker_dbs);
  r.chaos_commands = drill.log.commands_sent.load();
  r.chaos_commands_failed = drill.log.commands_failed.load();
  // The reference runs after the drill, fault-free, until it has processed the
  // drill's tokens (or for as long): eval loss is compared at equal tokens.
  if (o.reference) {
    mesh_drill none;
    none.safety_ns = prepared->plan.duration_ns;
    auto ref = one_run("reference", prepared->reference_cfg, prepared->reference_policy, none, reference_phase(r), 0,
                       r.run.tokens);
    if (!ref) return ref.err();
    r.reference = std::move(ref->summary);
    if (stop_requested()) return make_error(errc::timeout, "stopped by a signal during the reference run");
  }
  finish_drill_report(r, drill, cfg, prepared->layout, broker_dbs, log);
  return std::move(r);
}

}  // namespace archipelago
