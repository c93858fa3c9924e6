#include "node/local_mesh.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <thread>

#include "chaos_monkey/chaos_actor.hpp"
#include "learner/learner_core.hpp"
#include "learner/model/trainer.hpp"
#include "node/mesh_snapshots.hpp"
#include "node/process_roles.hpp"
#include "node/role_handles.hpp"
#include "parameter_shard/shard_snapshots.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/actor_bridge.hpp"

namespace archipelago {
namespace {

/// The global model Θ, gathered from the shards (values_atom).
std::vector<float> gather_global(caf::scoped_actor& self, const std::vector<caf::actor>& shards,
                                 const mesh_setup& setup) {
  std::vector<float> theta(setup.layout.total_floats, 0.f);
  learner_core scatterer(setup.layout, setup.plan, {});
  for (const auto& shard : shards) {
    self->request(shard, std::chrono::seconds(10), values_atom::value)
        .receive(
            [&](const std::vector<std::uint32_t>& fragments, const std::vector<std::vector<float>>& values) {
              for (std::size_t k = 0; k < fragments.size(); ++k)
                scatterer.scatter({fragments[k]}, values[k].data(), theta.data());
            },
            [&](caf::error&) {});
  }
  return theta;
}

/// Where a run's snapshots go and what its shards start from.
struct snapshot_start {
  std::shared_ptr<storage::snapshot_store> store, source;  // write here; read the starting point there
  std::optional<storage::manifest> from;
  std::vector<storage::fragment_state> from_states;  // `from`'s fragment states, read once
  std::uint64_t resumed_version = 0;  // the version resumed, as the resumed store numbers it
  std::vector<float> start_params;    // a resumed run: its model at that version; empty: the initial model
  std::int64_t start_step = 0;
};

/// The run's own store (--db), opened and recovered; a store that already holds
/// another run is refused before it is opened for writing.
expected<std::optional<recovered_store>> open_target(const mesh_setup& setup, const mesh_snapshots& o, logger& log) {
  if (o.db.empty()) return std::optional<recovered_store>{};
  if (o.db != o.resume_db)
    if (auto existing = open_store_read_only(o.db); existing)
      if (auto head = (*existing)->latest_manifest(); !head || *head)
        return make_error(errc::invalid_input, o.db + " already holds a run: continue it with --resume " + o.db +
                                                   " or pick a new --db");
  auto opened = open_mesh_store(o.db, setup);
  if (!opened) return opened.err();
  for (const auto& d : opened->dropped)
    log.warn("node.recovery", "archipelago run: recovery of %s: %s", o.db.c_str(), d.c_str());
  return std::optional<recovered_store>{std::move(*opened)};
}

/// The starting point of a resumed run (--resume): the same lineage from its
/// recovered head, or a manifest of another store.
status pick_resume_point(const mesh_setup& setup, const mesh_snapshots& o, const std::optional<recovered_store>& target,
                         snapshot_start& out) {
  if (o.resume_db == o.db) {  // continue the same lineage, from its recovered head
    if (!target->head) return make_error(errc::not_found, o.db + ": the store holds no snapshot to resume from");
    if (o.resume_version && *o.resume_version != target->head->mesh_version)
      return make_error(errc::invalid_input, "resuming " + o.db + " from version " + std::to_string(*o.resume_version) +
                                                 " (not its newest) would overwrite its later history: "
                                                 "resume into another --db");
    out.source = out.store;
    out.from = target->head;
    out.from_states = target->head_states;
  } else {
    auto source = open_store_read_only(o.resume_db);
    if (!source) return source.err();
    if ((*source)->info().layout_fingerprint != setup.layout.fingerprint())
      return make_error(errc::invalid_input, o.resume_db + " holds another model (model.* knobs differ)");
    auto m = pick_manifest(**source, o.resume_version, &out.from_states);
    if (!m) return make_error(m.err().code, o.resume_db + ": " + m.err().message);
    out.source = *source;
    out.from = std::move(*m);
  }
  // Before anything is written: the plan must match fragment by fragment (read_params
  // checks counts and sizes); the model read is the resumed run's starting point.
  auto params = storage::snapshot_store::params_from(*out.from, out.from_states, setup.layout, setup.plan);
  if (!params) return make_error(params.err().code, o.resume_db + ": " + params.err().message);
  out.start_params = std::move(*params);
  out.start_step = static_cast<std::int64_t>(out.from->learner_steps);
  out.resumed_version = out.from->mesh_version;
  return {};
}

expected<snapshot_start> prepare_snapshots(const mesh_setup& setup, const mesh_snapshots& o,
                                           const std::vector<float>& initial, logger& log) {
  snapshot_start out;
  auto target = open_target(setup, o, log);
  if (!target) return target.err();
  if (*target) out.store = (*target)->store;
  if (!o.resume_db.empty())
    if (auto ok = pick_resume_point(setup, o, *target, out); !ok) return ok.err();
  if (!out.store) return out;
  if (!(*target)->head || out.source != out.store) {
    // A new store starts with every fragment's state: the initial model, or the copied starting point.
    storage::commit_job first = initial_commit(setup, initial, wall_clock_ns());
    if (out.source) {
      first.fragments.clear();
      for (auto& f : out.from_states) first.fragments.push_back(storage::owned_write(std::move(f)));  // read once, by pick_resume_point
      out.from_states.clear();
      first.learner_steps = out.from->learner_steps;
      first.ledger = out.from->ledger;
    }
    auto v = out.store->commit(first);
    if (!v) return make_error(v.err().code, o.db + ": " + v.err().message);
    auto head = out.store->latest_manifest();
    if (!head) return head.err();
    out.from = std::move(**head);
    out.source = out.store;
  }
  return out;
}

/// A broker's own store (mesh_snapshots::broker_dbs) and the writer it goes through.
struct broker_store_slot {
  std::string dir;
  std::unique_ptr<storage::snapshot_writer> writer;
};

/// The launcher of a one-process mesh: its "processes" are the actors.
class local_processes final : public process_control {
 public:
  local_processes(process_roles& roles, mesh_drill& drill, std::vector<caf::actor>& learners,
                  std::vector<caf::actor>& shards, std::vector<caf::actor>& brokers,
                  std::vector<broker_store_slot>& broker_stores)
      : roles_(roles), drill_(drill), learners_(learners), shards_(shards), brokers_(brokers),
        broker_stores_(broker_stores), learner_inc_(learners.size(), 1), shard_inc_(shards.size(), 1),
        broker_inc_(brokers.size(), 1) {}

  void crash(const fault_target& t) override {
    std::lock_guard lock(mutex);
    caf::actor& a = slot(t);
    if (!a) return;
    caf::scoped_actor self{roles_.sys};
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::kill);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(30)) >> [] {});
    a = caf::actor{};
    if (t.kind == role::learner) {  // the steps it took, as it counted them: its status after every step
      const auto e = roles_.board.find({role::learner, t.index});
      std::lock_guard record(drill_.mutex);
      drill_.killed.push_back({t.index, learner_inc_[t.index], e ? e->now.counts.steps : 0});
    }
  }

  void restart(const fault_target& t) override {
    std::lock_guard lock(mutex);
    caf::actor& a = slot(t);
    if (a) return;
    mesh_drill::restart r{t, 0, 0, 0, 0};
    if (t.kind == role::learner) {
      r.incarnation = ++learner_inc_[t.index];
      const auto m = static_cast<std::uint64_t>(learners_.size());
      a = roles_.learner(t.index, incarnation{r.incarnation},
                         roles_.setup.start_step + static_cast<std::int64_t>(roles_.board.total(role::learner).steps / m));
    } else if (t.kind == role::parameter_shard) {
      // What the dead incarnation handed to the disk lands first; then the newest manifest is what it left.
      (void)roles_.writer->drain(std::chrono::seconds(30));
      auto head = roles_.writer->store().latest_manifest();
      std::optional<storage::manifest> from;
      if (head && *head) {
        from = **head;
        r.restored_version = (*head)->mesh_version;
        r.versions_lost = versions_lost(t.index, **head);
      }
      r.incarnation = ++shard_inc_[t.index];
      a = roles_.shard(t.index, incarnation{r.incarnation}, std::move(from));
    } else {
      // Like `node --role broker --db` restarted: the ledger and the learners' endpoints its
      // predecessor wrote to the run's store are restored (it greets the learners at once).
      r.incarnation = ++broker_inc_.at(t.index);
      a = roles_.broker(incarnation{r.incarnation}, std::nullopt, true, t.index);
    }
    std::lock_guard record(drill_.mutex);
    r.at_ns = drill_.log.since_start(roles_.clock.now());
    drill_.restarts.push_back(r);
  }

  void pause(const fault_target& t, nanos duration) override {
    std::lock_guard lock(mutex);
    if (caf::actor& a = slot(t)) caf::anon_send(a, pause_atom::value, duration);
  }

  /// The broker killed and its own store gone with its host: the writer stops (what
  /// it had queued lands first), the store closes, its directory is removed.
  void lose_host(const fault_target& t) override {
    crash(t);
    std::lock_guard lock(mutex);
    if (t.kind != role::sync_broker || t.index >= broker_stores_.size()) return;
    broker_store_slot& lost = broker_stores_[t.index];
    roles_.broker_writers.at(t.index) = nullptr;
    lost.writer.reset();
    std::error_code ec;
    std::filesystem::remove_all(lost.dir, ec);
    if (ec)
      roles_.log.error("drill.remove", "archipelago drill: cannot remove %s: %s", lost.dir.c_str(),
                       ec.message().c_str());
  }

  std::mutex mutex;  // guards the actor handles: the chaos monkey's thread changes them

 private:
  caf::actor& slot(const fault_target& t) {
    if (t.kind == role::learner) return learners_.at(t.index);
    if (t.kind == role::parameter_shard) return shards_.at(t.index);
    return brokers_.at(t.index);
  }

  /// Committed versions of the shard's fragments newer than the manifest it restarts from.
  std::uint64_t versions_lost(std::uint32_t shard, const storage::manifest& head) const {
    const auto e = roles_.board.find({role::parameter_shard, shard});
    if (!e) return 0;
    std::uint64_t lost = 0;
    for (fragment_index p : roles_.setup.fragments_of(shard)) {
      const storage::manifest_entry* m = head.find(p.value);
      const std::uint64_t restored = m ? m->version : 0;
      const auto& committed = e->now.committed_versions;
      if (p.value < committed.size() && committed[p.value] > restored) lost += committed[p.value] - restored;
    }
    return lost;
  }

  process_roles& roles_;
  mesh_drill& drill_;
  std::vector<caf::actor>& learners_;
  std::vector<caf::actor>& shards_;
  std::vector<caf::actor>& brokers_;
  std::vector<broker_store_slot>& broker_stores_;
  std::vector<std::uint64_t> learner_inc_, shard_inc_, broker_inc_;
};

/// What the mesh's status board says right now, for the progress line and the run's timeline.
struct mesh_figures {
  node_counters learners, shards, broker;
  broker_report report;
  std::vector<std::uint64_t> learner_steps;  // per learner index, over its incarnations

  static mesh_figures of(const status_board& board, int m) {
    mesh_figures f;
    f.learners = board.total(role::learner);
    f.shards = board.total(role::parameter_shard);
    f.broker = board.total(role::sync_broker);
    if (auto b = board.leading_broker(); b && b->now.report) f.report = *b->now.report;
    f.learner_steps.assign(static_cast<std::size_t>(m), 0);
    for (const auto& e : board.entries())
      if (e.now.node.kind == role::learner && e.now.node.index < f.learner_steps.size())
        f.learner_steps[e.now.node.index] = e.total().steps;
    return f;
  }
};

/// One phase of a warm-started run (mesh.warm_start): where its schedule
/// starts and stops, and the model it starts from.
struct run_phase {
  const std::vector<float>* start_params = nullptr;  // nullptr: the initial model
  std::int64_t start_step = 0;
  std::int64_t stop_step = -1;  // -1: train.steps
  /// The learners' first incarnation: a learner's batches are drawn from a seed
  /// its incarnation takes part in, so a later phase does not replay the first's.
  std::uint64_t learner_incarnation = 1;
};

/// One run of a one-process mesh, from its configuration to its summary.
class local_run {
 public:
  local_run(const config& base, logger& log, const mesh_snapshots& snapshots, mesh_drill* drill, const mesh_eval& eval,
            std::string admin_endpoint, run_phase phase = {})
      : base_(base), log_(log), snapshots_(snapshots), drill_(drill), eval_(eval), m_(base.mesh.learners),
        admin_endpoint_(std::move(admin_endpoint)), phase_(phase) {}

  status prepare();
  expected<mesh_summary> run(const mesh_progress& progress, const std::function<bool()>& stop_requested,
                             const metrics_endpoint& metrics);

 private:
  eval_result evaluate(const std::vector<float>& theta) {
    std::copy(theta.begin(), theta.end(), evaluator_->model().params());
    return evaluator_->evaluate();
  }
  void evaluate_now(caf::scoped_actor& self, double elapsed_s, storage::snapshot_writer* writer);
  std::string progress_text(double elapsed_s, const mesh_figures& f) const;
  void stop_roles(caf::scoped_actor& self, storage::snapshot_writer* writer);
  void summarize(bool all_done, nanos stopped_ns);

  const config& base_;
  logger& log_;
  const mesh_snapshots& snapshots_;
  mesh_drill* drill_;
  const mesh_eval& eval_;
  const int m_;
  const std::string admin_endpoint_;
  const run_phase phase_;
  mesh_setup setup_;
  std::optional<dataset> data_;
  std::vector<float> initial_;
  snapshot_start origin_;
  std::unique_ptr<engine> evaluator_;  // evaluations of Θ run on the calling thread, with one compute thread
  status_board board_;
  steady_clock_source clock_;
  mesh_summary out_;
  /// The eval curve as GET /evals serves it (the HTTP thread reads it).
  void add_eval_point(std::uint64_t tokens, double loss);
  std::mutex evals_mutex_;
  std::string evals_json_ = "[]";
  std::vector<caf::actor> shards_, learners_;
  std::vector<caf::actor> brokers_;  // the primary, then the standbys
  double last_loss_ = std::nan("");
};

status local_run::prepare() {
  auto policy = resolve_policy(base_);
  if (!policy) return policy.err();
  if (!base_.model.layout.empty())
    return make_error(errc::invalid_input, "model.layout: a one-process mesh runs native learners, which train only "
                                           "the GPT; run a layout file's mesh with `node` processes");
  setup_ = make_mesh_setup(base_, *policy);
  setup_.broker_endpoint = "inproc://broker";
  setup_.admin_endpoint = admin_endpoint_;
  if (!admin_endpoint_.empty() && (!admin_endpoint_.starts_with("tcp://") || !base_.wire.curve))
    return make_error(errc::invalid_input, "--admin " + admin_endpoint_ +
                                               ": expected tcp://HOST:PORT, with wire.curve on (the broker's key and "
                                               "an admin key on wire.allow)");
  if (snapshots_.broker_dbs.size() > max_brokers)
    return make_error(errc::invalid_input, std::to_string(snapshots_.broker_dbs.size()) + " brokers; at most " +
                                               std::to_string(max_brokers));
  for (std::size_t b = 1; b < snapshots_.broker_dbs.size(); ++b)
    setup_.standby_endpoints.push_back("inproc://broker-" + std::to_string(b));
  for (int i = 0; i < policy->shards; ++i) setup_.shard_endpoints.push_back("inproc://shard-" + std::to_string(i));
  for (int i = 0; i < m_; ++i) setup_.learner_endpoints.push_back("inproc://learner-" + std::to_string(i));
  auto data = load_dataset(base_.data, m_, setup_.shape.context, base_.train.seed);
  if (!data) return data.err();
  data_ = std::move(*data);
  initial_ = initial_global_params(setup_.cfg, setup_.shape, *data_);
  if (drill_ && snapshots_.db.empty()) return make_error(errc::invalid_input, "a drill needs a snapshot store (--db)");
  auto origin = prepare_snapshots(setup_, snapshots_, initial_, log_);
  if (!origin) return origin.err();
  origin_ = std::move(*origin);
  if (phase_.start_params) {  // no snapshots here (run_warm_started): the phase's model and step instead
    initial_ = *phase_.start_params;
    origin_.start_step = phase_.start_step;
  }
  setup_.start_step = origin_.start_step;
  setup_.stop_step = phase_.stop_step;
  evaluator_ = std::make_unique<engine>(setup_.cfg, setup_.shape, *data_, 0);
  set_compute_threads(1);
  // The curve starts at the loss of Θ the run starts from (a resumed run's: its snapshot's).
  out_.start_eval_loss = evaluate(origin_.start_params.empty() ? initial_ : origin_.start_params).loss;
  add_eval_point(0, out_.start_eval_loss);
  out_.eval_times_s.push_back(0);
  out_.resumed_from = origin_.resumed_version;
  out_.start_step = origin_.start_step;
  return {};
}

void local_run::add_eval_point(std::uint64_t tokens, double loss) {
  out_.eval_curve.emplace_back(tokens, loss);
  std::string json = "[";
  for (const auto& [t, l] : out_.eval_curve) {
    char point[64];
    if (!std::isfinite(l)) continue;  // JSON has no NaN: a failed evaluation is left out
    std::snprintf(point, sizeof point, "%s[%llu,%.6g]", json.size() > 1 ? "," : "", static_cast<unsigned long long>(t), l);
    json += point;
  }
  std::lock_guard lock(evals_mutex_);
  evals_json_ = json + "]";
}

/// Evaluates Θ now. With snapshots, exactly the newest committed version is evaluated, so the
/// loss recorded for it is that version's (replay list shows it).
void local_run::evaluate_now(caf::scoped_actor& self, double elapsed_s, storage::snapshot_writer* writer) {
  const std::uint64_t tokens = board_.total(role::learner).tokens;
  std::optional<storage::manifest> head;
  std::optional<std::vector<float>> theta;
  if (origin_.store)
    if (auto m = origin_.store->latest_manifest(); m && *m)
      if (auto p = origin_.store->read_params(**m, setup_.layout, setup_.plan); p) {
        head = std::move(**m);
        theta = std::move(*p);
      }
  last_loss_ = evaluate(theta ? *theta : gather_global(self, shards_, setup_)).loss;
  const std::uint64_t at = head ? head->ledger.processed : tokens;
  add_eval_point(at, last_loss_);
  out_.eval_times_s.push_back(elapsed_s);
  // When Θ was taken, not when its evaluation ended.
  if (eval_.target_loss > 0 && last_loss_ <= eval_.target_loss) out_.target_reached_s = elapsed_s;
  if (head) (void)writer->submit(storage::eval_record{head->mesh_version, wall_clock_ns(), last_loss_, at});
}

std::string local_run::progress_text(double elapsed_s, const mesh_figures& f) const {
  const double rounds = static_cast<double>(f.broker.rounds_closed);
  const broker_report& r = f.report;
  // A drill's broker may have restarted (a new span, a restored ledger): there, the run's time.
  const double span_s = drill_                 ? elapsed_s
                        : r.first_join_ns < 0 ? 0
                                              : static_cast<double>(clock_.now() - r.first_join_ns) * 1e-9;
  char eval[32] = "-";  // until the first evaluation
  if (!std::isnan(last_loss_)) std::snprintf(eval, sizeof eval, "%.3f", last_loss_);
  char line[320];
  std::snprintf(line, sizeof line,
                "%.0fs  round %.0f  version %llu  tokens %llu  eval %s  goodput %.1f%%  uptime %.1f%%  "
                "members %.2f  quorum %.0fms  grace %.0fms  late %llu",
                elapsed_s, rounds, static_cast<unsigned long long>(f.shards.published),
                static_cast<unsigned long long>(f.learners.tokens), eval,
                span_s > 0 ? 100 * r.ledger.merged_step_time_s / (m_ * span_s) : 0.0, 100 * r.uptime,
                rounds > 0 ? static_cast<double>(f.broker.members) / rounds : 0.0, r.xi_quorum_ms, r.last_grace_ms,
                static_cast<unsigned long long>(r.ledger.late));
  return line;
}

expected<mesh_summary> local_run::run(const mesh_progress& progress, const std::function<bool()>& stop_requested,
                                      const metrics_endpoint& metrics) {
  nanos stopped_ns = 0;
  bool all_done = false;
  caf::actor_system_config sys_cfg;
  sys_cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{sys_cfg};
  // Declared after the actor system: it is gone before the system, and the
  // actors that use it are gone before it (see stop_roles()).
  std::unique_ptr<storage::snapshot_writer> writer;
  if (origin_.store)
    writer = std::make_unique<storage::snapshot_writer>(
        origin_.store, log_, storage::writer_options{static_cast<std::size_t>(base_.storage.queue_mb) << 20});
  process_roles roles{sys, setup_, transport::make_io_context(), clock_, log_, board_, &*data_, &initial_};
  roles.writer = writer.get();
  roles.record_contributions = snapshots_.record_contributions;
  roles.restore_store = origin_.source.get();
  roles.restored = &origin_.from_states;  // the resumed manifest's states where already read
  roles.learner_steps = [this, first = origin_.start_step] {
    return static_cast<std::uint64_t>(first) + board_.total(role::learner).steps / static_cast<std::uint64_t>(m_);
  };
  roles.tokens = [this, first = origin_.from ? origin_.from->ledger.processed : 0] {
    return first + board_.total(role::learner).tokens;
  };
  // Brokers with stores of their own (a mesh with standbys): each as `node --role broker --db` would.
  std::vector<broker_store_slot> broker_stores;
  for (const std::string& dir : snapshots_.broker_dbs) {
    auto opened = open_mesh_store(dir, setup_);
    if (!opened) return opened.err();
    broker_stores.push_back({dir, std::make_unique<storage::snapshot_writer>(
                                      opened->store, log_, storage::writer_options{static_cast<std::size_t>(base_.storage.queue_mb) << 20})});
    roles.broker_writers.push_back(broker_stores.back().writer.get());
  }
  // No set_storage_failing: the shards share this one store, so a storage fault
  // fails only its shard's commits (the shard actor's own flag), not the others'.
  // Bound before the roles start, so a port in use stops nothing. A drill's
  // restarts would replace the roles: a drill serves no metrics.
  served_roles served;
  served.board = &board_;
  std::unique_ptr<metrics_server> metrics_http;
  if (metrics.port >= 0 && !drill_) {
    metrics_server::handlers pages = served.pages(sys, true);
    pages.evals = [this] {
      std::lock_guard lock(evals_mutex_);
      return evals_json_;
    };
    auto started = metrics_server::start(metrics, std::move(pages), log_);
    if (!started) return started.err();
    metrics_http = std::move(*started);
  }
  for (int i = 0; i < setup_.policy.shards; ++i) shards_.push_back(roles.shard(static_cast<std::uint32_t>(i), incarnation{1}, origin_.from));
  for (std::uint32_t b = 0; b < setup_.brokers(); ++b)  // on a store of its own, a broker recovers from it as a node does
    brokers_.push_back(roles.broker(incarnation{1}, origin_.from, !broker_stores.empty(), b));
  for (int i = 0; i < m_; ++i)
    learners_.push_back(roles.learner(static_cast<std::uint32_t>(i), incarnation{phase_.learner_incarnation}));
  if (metrics_http) {
    std::vector<caf::actor> all = shards_;
    all.insert(all.end(), brokers_.begin(), brokers_.end());
    all.insert(all.end(), learners_.begin(), learners_.end());
    served.set(std::move(all), brokers_.front());
  }
  caf::scoped_actor self{sys};
  // A broker that could not bind its admin endpoint ended, its log line saying why: a
  // run operators cannot reach as asked does not go on.
  bool broker_up = true;
  if (!admin_endpoint_.empty())
    self->request(brokers_.front(), std::chrono::seconds(10), status_atom::value)
        .receive([](std::string&) {}, [&](caf::error&) { broker_up = false; });
  std::unique_ptr<local_processes> processes;
  caf::actor chaos;
  if (drill_) {
    processes = std::make_unique<local_processes>(roles, *drill_, learners_, shards_, brokers_, broker_stores);
    chaos = spawn_chaos_monkey(sys, {&setup_, roles.io, &clock_, &log_, "inproc://chaos", drill_->timeline, drill_->safety_ns,
                                     processes.get(), &drill_->log});
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  double last_eval_s = 0;
  const double eval_period_s = eval_.period_s > 0 ? eval_.period_s : 20;
  while (broker_up && board_.learners_left() < m_ && !stop_requested() && out_.target_reached_s < 0 &&
         (eval_.stop_tokens == 0 || board_.total(role::learner).tokens < eval_.stop_tokens) &&
         (base_.train.time_limit_s <= 0 || elapsed() < base_.train.time_limit_s)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(drill_ ? 250 : 500));
    if (drill_ && drill_->sample) drill_->sample(drill_->log.since_start(clock_.now()), board_);
    if (elapsed() - last_eval_s >= eval_period_s) {
      last_eval_s = elapsed();
      evaluate_now(self, last_eval_s, writer.get());
    }
    const mesh_figures f = mesh_figures::of(board_, m_);
    if (!drill_)
      out_.timeline.push_back({elapsed(), f.learners.tokens, f.broker.rounds_closed, f.report.ledger.merged_step_time_s,
                               f.report.uptime, f.learner_steps});
    if (progress) progress(progress_text(elapsed(), f));
  }
  out_.wall_s = elapsed();
  stopped_ns = clock_.now();
  all_done = board_.learners_left() == m_;
  if (chaos) end_actors(self, {chaos});  // no fault and no restart from here on
  stop_roles(self, writer.get());
  for (broker_store_slot& b : broker_stores)  // their tapes on disk for whoever reads them next
    if (b.writer) {
      if (auto ok = b.writer->drain(std::chrono::seconds(60)); !ok)
        log_.error("node.drain", "archipelago run: %s: %s", b.dir.c_str(), ok.err().message.c_str());
      b.writer.reset();
    }
  if (writer) {
    if (auto ok = writer->drain(std::chrono::seconds(60)); !ok)
      log_.error("node.drain", "archipelago run: %s", ok.err().message.c_str());
    out_.snapshot_errors = writer->stats().failed + writer->stats().refused;
    writer.reset();
    out_.mesh_version = origin_.store->last_mesh_version();
  }
  summarize(all_done, stopped_ns);
  if (!broker_up)
    return make_error(errc::invalid_input, "--admin " + admin_endpoint_ + ": the broker could not listen there "
                                                                          "(its error above says why)");
  return std::move(out_);
}

/// The end: learners still running (a stop or a time limit) leave after their
/// current step, so the broker's last report covers every step they took; the
/// last versions become durable (the broker hears of them and writes the tape);
/// the broker's final report; Θ gathered from the shards and evaluated; every
/// actor ended (no handle outlives the actor system).
void local_run::stop_roles(caf::scoped_actor& self, storage::snapshot_writer* writer) {
  // A drill stopped early (a signal) may leave actors down: only the running ones are stopped.
  std::erase_if(learners_, [](const caf::actor& a) { return !a; });
  std::erase_if(shards_, [](const caf::actor& a) { return !a; });
  std::erase_if(brokers_, [](const caf::actor& a) { return !a; });
  stop_learners(self, learners_, board_);
  end_actors(self, learners_);
  if (writer) {
    (void)writer->drain(std::chrono::seconds(30));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (const caf::actor& b : brokers_)  // each one's final status; the leader's has its report
    self->request(b, std::chrono::seconds(10), report_atom::value).receive([](bool) {}, [](caf::error&) {});
  const std::vector<float> theta = gather_global(self, shards_, setup_);
  std::vector<caf::actor> rest = shards_;
  rest.insert(rest.end(), brokers_.begin(), brokers_.end());
  end_actors(self, rest, std::chrono::seconds(10));
  learners_.clear();
  shards_.clear();
  brokers_.clear();
  const eval_result r = evaluate(theta);
  const std::uint64_t tokens = board_.total(role::learner).tokens;
  if (writer)
    (void)writer->submit(storage::eval_record{origin_.store->last_mesh_version(), wall_clock_ns(), r.loss, tokens});
  out_.global_params = theta;
  out_.eval_loss = r.loss;
  out_.eval_bpb = r.bits_per_byte;
  add_eval_point(tokens, r.loss);
  out_.eval_times_s.push_back(out_.wall_s);
}

/// The run's figures from the status board once every role is down.
void local_run::summarize(bool all_done, nanos stopped_ns) {
  fill_mesh_counts(board_, m_, out_);
  out_.mode = base_.mesh.mode;
  out_.shards = setup_.policy.shards;
  out_.fragments = static_cast<int>(setup_.fragments());
  out_.entropy_floor_bpb = data_->entropy_floor_bpb;
  const ledger_totals& l = out_.broker.ledger;
  // The learners' span: from the first Join to the last Leave, or to the stop
  // when a time limit or a signal ended the run.
  const nanos end_ns = all_done && out_.broker.last_leave_ns > 0 ? out_.broker.last_leave_ns : stopped_ns;
  const double span_s = out_.broker.first_join_ns >= 0 && end_ns > out_.broker.first_join_ns
                            ? static_cast<double>(end_ns - out_.broker.first_join_ns) * 1e-9
                            : out_.wall_s;
  out_.span_s = span_s;
  out_.goodput = ledger_goodput(l, m_, span_s);
  out_.wait_share = static_cast<double>(board_.total(role::learner).wait_ns) * 1e-9 / (m_ * span_s);
  out_.ledger_exact = l.balanced() && l.processed == out_.tokens;
}

}  // namespace

void fill_mesh_counts(const status_board& board, int learners, mesh_summary& out) {
  const mesh_figures f = mesh_figures::of(board, learners);
  out.broker = f.report;
  out.learners = learners;
  out.steps = f.learners.steps;
  out.tokens = f.learners.tokens;
  out.rounds = f.broker.rounds_closed;
  out.published = f.shards.published;
  out.bytes_on_wire = f.learners.bytes_sent + f.shards.bytes_sent;
  out.refetches = f.learners.refetches;
  out.committed = f.broker.committed;
  out.budget_overruns = f.learners.budget_overruns;
  out.mean_members = out.rounds ? static_cast<double>(f.broker.members) / static_cast<double>(out.rounds) : 0;
  out.broker_step_downs.clear();
  out.refused.clear();
  for (const auto& e : board.entries()) {
    for (const auto& [reason, n] : e.total().refused) out.refused[reason] += n;
    if (e.now.node.kind == role::sync_broker) {
      if (out.broker_step_downs.size() <= e.now.node.index) out.broker_step_downs.resize(e.now.node.index + 1, 0);
      out.broker_step_downs[e.now.node.index] = e.total().step_downs;
    }
  }
}

namespace {

/// The warm start's two phases as one run: counts and the ledger add up,
/// the eval curve and the timeline continue the first phase's, goodput and the
/// wait share are over both spans; the rest (the broker's per-fragment figures,
/// participation, timing estimates) is the second phase's, the mode's own.
mesh_summary join_phases(mesh_summary first, mesh_summary second) {
  mesh_summary out = std::move(second);
  out.steps += first.steps;
  out.tokens += first.tokens;
  if (out.rounds + first.rounds > 0)
    out.mean_members = (out.mean_members * static_cast<double>(out.rounds) +
                        first.mean_members * static_cast<double>(first.rounds)) /
                       static_cast<double>(out.rounds + first.rounds);
  out.rounds += first.rounds;
  out.published += first.published;
  out.bytes_on_wire += first.bytes_on_wire;
  out.refetches += first.refetches;
  out.budget_overruns += first.budget_overruns;
  for (const auto& [reason, n] : first.refused) out.refused[reason] += n;
  const double first_wall_s = first.wall_s;
  const std::uint64_t first_tokens = first.tokens;
  for (std::size_t i = 1; i < out.eval_curve.size(); ++i) {  // its first point is the first phase's last
    first.eval_curve.emplace_back(out.eval_curve[i].first + first_tokens, out.eval_curve[i].second);
    if (i < out.eval_times_s.size()) first.eval_times_s.push_back(out.eval_times_s[i] + first_wall_s);
  }
  out.eval_curve = std::move(first.eval_curve);
  out.eval_times_s = std::move(first.eval_times_s);
  if (out.target_reached_s >= 0) out.target_reached_s += first_wall_s;
  const run_sample last = first.timeline.empty() ? run_sample{} : first.timeline.back();
  for (run_sample& t : out.timeline) {
    t.t_s += first_wall_s;
    t.tokens += first_tokens;
    t.rounds += last.rounds;
    t.merged_step_time_s += first.broker.ledger.merged_step_time_s;
    for (std::size_t i = 0; i < t.learner_steps.size() && i < last.learner_steps.size(); ++i)
      t.learner_steps[i] += last.learner_steps[i];
  }
  first.timeline.insert(first.timeline.end(), out.timeline.begin(), out.timeline.end());
  out.timeline = std::move(first.timeline);
  const double wait_s = out.wait_share * out.learners * out.span_s + first.wait_share * first.learners * first.span_s;
  out.broker.ledger += first.broker.ledger;
  out.wall_s += first_wall_s;
  out.span_s += first.span_s;
  out.goodput = ledger_goodput(out.broker.ledger, out.learners, out.span_s);
  out.wait_share = wait_s / (out.learners * out.span_s);
  out.ledger_exact = first.ledger_exact && out.ledger_exact;
  out.start_eval_loss = first.start_eval_loss;
  out.start_step = first.start_step;
  out.warm_start_steps = first.steps / static_cast<std::uint64_t>(first.learners);
  out.warm_start_tokens = first_tokens;
  return out;
}

/// mesh.warm_start: the schedule's first steps as dp, then the mode from dp's
/// model at that step, each phase a mesh of its own (fresh optimizer states:
/// the learners' AdamW moments and the shards' outer momentum start at zero).
expected<mesh_summary> run_warm_started(const config& base, logger& log, const mesh_progress& progress,
                                        const std::function<bool()>& stop_requested, const mesh_snapshots& snapshots,
                                        const metrics_endpoint& metrics, const mesh_eval& eval) {
  if (!snapshots.db.empty() || !snapshots.resume_db.empty())
    return make_error(errc::invalid_input, "mesh.warm_start: a warm-started run keeps no snapshots (--db, --resume)");
  config dp = base;
  dp.mesh.mode = "dp";
  const std::int64_t warm_steps = base.mesh.warm_start;
  local_run warm(dp, log, snapshots, nullptr, eval, {}, run_phase{nullptr, 0, warm_steps});
  if (auto ok = warm.prepare(); !ok) return ok.err();
  log.info("run.warm_start", "archipelago run: the first %lld steps as dp", static_cast<long long>(warm_steps));
  auto first = warm.run(progress, stop_requested, metrics);
  if (!first) return first.err();
  const bool ended = stop_requested() || first->target_reached_s >= 0 ||
                     (eval.stop_tokens > 0 && first->tokens >= eval.stop_tokens) ||
                     first->steps < static_cast<std::uint64_t>(warm_steps) * static_cast<std::uint64_t>(base.mesh.learners);
  if (ended) {  // stopped, at its target or out of time within the warm start: nothing follows
    first->warm_start_steps = first->steps / static_cast<std::uint64_t>(base.mesh.learners);
    first->warm_start_tokens = first->tokens;
    return first;
  }
  mesh_eval rest = eval;
  if (eval.stop_tokens > 0) rest.stop_tokens = eval.stop_tokens - first->tokens;
  log.info("run.warm_start", "archipelago run: %s from step %lld", base.mesh.mode.c_str(),
           static_cast<long long>(warm_steps));
  config then = base;  // train.time_limit_s bounds both phases together
  if (base.train.time_limit_s > 0) then.train.time_limit_s = std::max(1e-3, base.train.time_limit_s - first->wall_s);
  local_run mode(then, log, snapshots, nullptr, rest, {}, run_phase{&first->global_params, warm_steps, -1, 2});
  if (auto ok = mode.prepare(); !ok) return ok.err();
  auto second = mode.run(progress, stop_requested, metrics);
  if (!second) return second.err();
  return join_phases(std::move(*first), std::move(*second));
}

}  // namespace

expected<mesh_summary> run_local_mesh(const config& base, logger& log, const mesh_progress& progress,
                                      const std::function<bool()>& stop_requested, const mesh_snapshots& snapshots,
                                      mesh_drill* drill, const metrics_endpoint& metrics, const mesh_eval& eval,
                                      const std::string& admin_endpoint) {
  if (base.mesh.warm_start > 0 && base.mesh.mode != "dp") {
    if (drill || !admin_endpoint.empty())
      return make_error(errc::invalid_input, "mesh.warm_start: a drill or a run with --admin has no warm start");
    return run_warm_started(base, log, progress, stop_requested, snapshots, metrics, eval);
  }
  local_run run(base, log, snapshots, drill, eval, admin_endpoint);
  if (auto ok = run.prepare(); !ok) return ok.err();
  return run.run(progress, stop_requested, metrics);
}

}  // namespace archipelago
