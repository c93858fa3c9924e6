#include "node/local_mesh.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <thread>

#include "learner/learner_core.hpp"
#include "node/mesh_actors.hpp"
#include "node/mesh_snapshots.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/caf_bridge.hpp"

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
  std::shared_ptr<storage::faulty_kv> disk;  // a drill's: the store's writes can be made to fail
  std::optional<storage::manifest> from;
  std::uint64_t resumed_version = 0;  // the version resumed, as the resumed store numbers it
  std::vector<float> start_params;    // a resumed run: its model at that version; empty: the initial model
  std::int64_t start_step = 0;
};

expected<snapshot_start> prepare_snapshots(const mesh_setup& setup, const mesh_snapshots& o,
                                           const std::vector<float>& initial, bool failing_disk) {
  snapshot_start out;
  std::optional<recovered_store> target;
  if (!o.db.empty() && o.db != o.resume_db) {
    // A store that already holds a run is refused before it is opened for writing.
    if (auto existing = open_store_read_only(o.db); existing)
      if (auto head = (*existing)->latest_manifest(); !head || *head)
        return make_error(errc::invalid_input, o.db + " already holds a run: continue it with --resume " + o.db +
                                                   " or pick a new --db");
  }
  if (!o.db.empty()) {
    auto opened = open_mesh_store(o.db, setup, failing_disk);
    if (!opened) return opened.err();
    for (const auto& d : opened->dropped) std::fprintf(stderr, "archipelago run: recovery of %s: %s\n", o.db.c_str(), d.c_str());
    target = std::move(*opened);
    out.store = target->store;
    out.disk = target->disk;
  }
  if (!o.resume_db.empty()) {
    if (o.resume_db == o.db) {  // continue the same lineage, from its recovered head
      if (!target->head) return make_error(errc::not_found, o.db + ": the store holds no snapshot to resume from");
      if (o.resume_version && *o.resume_version != target->head->mesh_version)
        return make_error(errc::invalid_input, "resuming " + o.db + " from version " + std::to_string(*o.resume_version) +
                                                   " (not its newest) would overwrite its later history: "
                                                   "resume into another --db");
      out.source = out.store;
      out.from = target->head;
    } else {
      auto source = open_store_read_only(o.resume_db);
      if (!source) return source.err();
      if ((*source)->info().layout_fingerprint != setup.layout.fingerprint())
        return make_error(errc::invalid_input, o.resume_db + " holds another model (model.* knobs differ)");
      auto m = pick_manifest(**source, o.resume_version);
      if (!m) return make_error(m.err().code, o.resume_db + ": " + m.err().message);
      out.source = *source;
      out.from = std::move(*m);
    }
    // Before anything is written: the plan must match fragment by fragment (read_params
    // checks counts and sizes); the model read is the resumed run's starting point.
    auto params = out.source->read_params(*out.from, setup.layout, setup.plan);
    if (!params) return make_error(params.err().code, o.resume_db + ": " + params.err().message);
    out.start_params = std::move(*params);
    out.start_step = static_cast<std::int64_t>(out.from->learner_steps);
    out.resumed_version = out.from->mesh_version;
  }
  if (!out.store) return out;
  if (!target->head || out.source != out.store) {
    // A new store starts with every fragment's state: the initial model, or the copied starting point.
    storage::commit_job first = initial_commit(setup, initial);
    if (out.source) {
      first.fragments.clear();
      for (const auto& e : out.from->entries) {
        auto f = out.source->read_fragment(e.fragment, e.version);
        if (!f) return f.err();
        first.fragments.push_back(std::move(*f));
      }
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

/// The launcher of a one-process mesh: its "processes" are the actors.
class local_processes final : public process_control {
 public:
  struct world {
    caf::actor_system& sys;
    const mesh_setup& setup;
    const dataset& data;
    mesh_stats& stats;
    const clock_source& clock;
    const snapshot_context& snaps;
    storage::snapshot_writer& writer;
    const std::vector<float>& initial;
    mesh_drill& drill;
  };
  local_processes(world w, std::vector<caf::actor>& learners, std::vector<caf::actor>& shards, caf::actor& broker)
      : w_(w), learners_(learners), shards_(shards), broker_(broker),
        learner_inc_(learners.size(), 1), shard_inc_(shards.size(), 1), learner_steps_at_start_(learners.size(), 0) {}

  void crash(const fault_target& t) override {
    std::lock_guard lock(mutex);
    caf::actor& a = slot(t);
    if (!a) return;
    caf::scoped_actor self{w_.sys};
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::kill);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(30)) >> [] {});
    a = caf::actor{};
    if (t.kind == role::learner && t.index < w_.stats.learner_steps.size()) {
      const std::uint64_t steps = w_.stats.learner_steps[t.index].load() - learner_steps_at_start_[t.index];
      std::lock_guard record(w_.drill.mutex);
      w_.drill.killed.push_back({t.index, learner_inc_[t.index], steps});
    }
  }

  void restart(const fault_target& t) override {
    std::lock_guard lock(mutex);
    caf::actor& a = slot(t);
    if (a) return;
    mesh_drill::restart r{t, 0, 0, 0, 0};
    if (t.kind == role::learner) {
      r.incarnation = ++learner_inc_[t.index];
      if (t.index < w_.stats.learner_steps.size()) learner_steps_at_start_[t.index] = w_.stats.learner_steps[t.index].load();
      const auto m = static_cast<std::uint64_t>(learners_.size());
      a = spawn_learner(w_.sys, w_.setup, t.index, w_.data, w_.stats, w_.clock, incarnation{r.incarnation},
                        w_.setup.start_step + static_cast<std::int64_t>(w_.stats.steps.load() / m));
    } else if (t.kind == role::parameter_shard) {
      // What the dead incarnation handed to the disk lands first; then the newest manifest is what it left.
      (void)w_.writer.drain(std::chrono::seconds(30));
      auto head = w_.writer.store().latest_manifest();
      contexts_.push_back(w_.snaps);
      snapshot_context& ctx = contexts_.back();
      if (head && *head) {
        ctx.resume_from = **head;
        ctx.restore_store = &w_.writer.store();
        r.restored_version = (*head)->mesh_version;
        for (std::uint32_t p = 0; p < w_.setup.shard_of_fragment.size(); ++p) {
          if (w_.setup.shard_of_fragment[p] != t.index || p >= w_.stats.committed_version.size()) continue;
          const storage::manifest_entry* e = (*head)->find(p);
          const std::uint64_t restored = e ? e->version : 0, committed = w_.stats.committed_version[p].load();
          if (committed > restored) r.versions_lost += committed - restored;
        }
      }
      r.incarnation = ++shard_inc_[t.index];
      a = spawn_shard(w_.sys, w_.setup, t.index, w_.initial, w_.stats, w_.clock, &ctx, incarnation{r.incarnation});
    } else {
      r.incarnation = ++broker_inc_;
      // Like `node --role broker --db` restarted: the ledger and the learners' endpoints its
      // predecessor wrote to the run's store are restored (it greets the learners at once).
      contexts_.push_back(w_.snaps);
      contexts_.back().broker_recovery = true;
      a = spawn_broker(w_.sys, w_.setup, w_.stats, w_.clock, &contexts_.back(), incarnation{r.incarnation});
    }
    std::lock_guard record(w_.drill.mutex);
    {
      std::lock_guard started(w_.drill.log.mutex);
      r.at_ns = w_.clock.now() - w_.drill.log.started_ns;
    }
    w_.drill.restarts.push_back(r);
  }

  void pause(const fault_target& t, nanos duration) override {
    std::lock_guard lock(mutex);
    if (caf::actor& a = slot(t)) caf::anon_send(a, pause_atom::value, duration);
  }

  std::mutex mutex;  // guards the actor handles: the chaos monkey's thread changes them

 private:
  caf::actor& slot(const fault_target& t) {
    if (t.kind == role::learner) return learners_.at(t.index);
    if (t.kind == role::parameter_shard) return shards_.at(t.index);
    return broker_;
  }

  world w_;
  std::vector<caf::actor>& learners_;
  std::vector<caf::actor>& shards_;
  caf::actor& broker_;
  std::vector<std::uint64_t> learner_inc_, shard_inc_;
  std::vector<std::uint64_t> learner_steps_at_start_;  // the index's step count when its incarnation started
  std::uint64_t broker_inc_ = 1;
  std::deque<snapshot_context> contexts_;  // restarted shards keep a pointer to theirs
};

}  // namespace

expected<mesh_summary> run_local_mesh(const config& base, const mesh_progress& progress,
                                      const std::function<bool()>& stop_requested, const mesh_snapshots& snapshots,
                                      mesh_drill* drill, const metrics_endpoint& metrics, const mesh_eval& eval) {
  auto policy = resolve_policy(base);
  if (!policy) return policy.err();
  mesh_setup setup = make_mesh_setup(base, *policy);
  const int m = base.mesh.learners, s = policy->shards;
  setup.broker_endpoint = "inproc://broker";
  for (int i = 0; i < s; ++i) setup.shard_endpoints.push_back("inproc://shard-" + std::to_string(i));
  for (int i = 0; i < m; ++i) setup.learner_endpoints.push_back("inproc://learner-" + std::to_string(i));

  auto data = load_dataset(base.data, m, setup.shape.context, base.train.seed);
  if (!data) return data.err();

  const std::vector<float> initial = initial_global_params(setup, *data);
  if (drill && snapshots.db.empty()) return make_error(errc::invalid_input, "a drill needs a snapshot store (--db)");
  auto origin = prepare_snapshots(setup, snapshots, initial, drill != nullptr);
  if (!origin) return origin.err();
  setup.start_step = origin->start_step;
  // Evaluations of Θ run on this thread, with one compute thread.
  engine evaluator(setup.cfg, setup.shape, *data, 0);
  set_compute_threads(1);
  auto evaluate = [&](const std::vector<float>& theta) {
    std::copy(theta.begin(), theta.end(), evaluator.model().params());
    return evaluator.evaluate();
  };

  mesh_stats stats;
  stats.learner_steps = std::vector<std::atomic<std::uint64_t>>(static_cast<std::size_t>(m));
  if (drill) {
    stats.committed_version = std::vector<std::atomic<std::uint64_t>>(setup.plan.fragments.size());
  }
  steady_clock_source clock;
  mesh_summary out;
  // The curve starts at the loss of Θ the run starts from (a resumed run's: its snapshot's).
  out.start_eval_loss = evaluate(origin->start_params.empty() ? initial : origin->start_params).loss;
  out.eval_curve.emplace_back(0, out.start_eval_loss);
  out.eval_times_s.push_back(0);
  out.resumed_from = origin->resumed_version;
  out.start_step = origin->start_step;
  nanos stopped_ns = 0;
  bool all_done = false;
  {
    caf::actor_system_config sys_cfg;
    sys_cfg.set("scheduler.max-threads", 2);
    caf::actor_system sys{sys_cfg};
    // Declared after the actor system: it is gone before the system, and the
    // actors that use it are gone before it (see the end of this block).
    std::unique_ptr<storage::snapshot_writer> writer;
    if (origin->store)
      writer = std::make_unique<storage::snapshot_writer>(
          origin->store, storage::writer_options{static_cast<std::size_t>(base.storage.queue_mb) << 20});
    snapshot_context snaps;
    snaps.writer = writer.get();
    snaps.record_contributions = snapshots.record_contributions;
    snaps.restore_store = origin->source.get();
    snaps.resume_from = origin->from;
    snaps.learner_steps = [&stats, m, first = origin->start_step] {
      return static_cast<std::uint64_t>(first) + stats.steps.load() / static_cast<std::uint64_t>(m);
    };
    snaps.tokens = [&stats, first = origin->from ? origin->from->ledger.processed : 0] {
      return first + stats.tokens.load();
    };
    if (origin->disk)
      snaps.set_storage_failing = [disk = origin->disk](bool failing) { disk->set_write_error_rate(failing ? 1 : 0); };
    // Bound before the roles start, so a port in use stops nothing. A drill's
    // restarts would replace the roles: a drill serves no metrics.
    served_roles served;
    std::unique_ptr<metrics_server> metrics_http;
    if (metrics.port >= 0 && !drill) {
      auto started = metrics_server::start(metrics, served.pages(sys, true));
      if (!started) return started.err();
      metrics_http = std::move(*started);
    }
    std::vector<caf::actor> shards, actors;
    for (int i = 0; i < s; ++i)
      shards.push_back(spawn_shard(sys, setup, static_cast<std::uint32_t>(i), initial, stats, clock, &snaps));
    caf::actor broker = spawn_broker(sys, setup, stats, clock, &snaps);
    for (int i = 0; i < m; ++i) actors.push_back(spawn_learner(sys, setup, static_cast<std::uint32_t>(i), *data, stats, clock));
    if (metrics_http) {
      std::lock_guard lock(served.mutex);
      served.roles = shards;
      served.roles.push_back(broker);
      served.roles.insert(served.roles.end(), actors.begin(), actors.end());
      served.broker = broker;
    }
    caf::scoped_actor self{sys};
    std::unique_ptr<local_processes> processes;
    caf::actor chaos;
    if (drill) {
      processes = std::make_unique<local_processes>(
          local_processes::world{sys, setup, *data, stats, clock, snaps, *writer, initial, *drill}, actors, shards,
          broker);
      chaos = spawn_chaos_monkey(sys, setup, "inproc://chaos", drill->timeline, drill->safety_ns, *processes,
                                 drill->log, clock);
    }
    auto drill_clock = [&] {
      std::lock_guard lock(drill->log.mutex);
      return drill->log.started_ns < 0 ? nanos{0} : clock.now() - drill->log.started_ns;
    };

    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    double last_eval_s = 0, last_loss = std::nan("");
    const double eval_period_s = eval.period_s > 0 ? eval.period_s : 20;
    while (stats.learners_done.load() < m && !stop_requested() && out.target_reached_s < 0 &&
           (eval.stop_tokens == 0 || stats.tokens.load() < eval.stop_tokens) &&
           (base.train.time_limit_s <= 0 || elapsed() < base.train.time_limit_s)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(drill ? 250 : 500));
      if (drill && drill->sample) drill->sample(drill_clock(), stats);
      if (elapsed() - last_eval_s >= eval_period_s) {
        last_eval_s = elapsed();
        const std::uint64_t tokens = stats.tokens.load();
        // With snapshots, exactly the newest committed version is evaluated, so the loss
        // recorded for it is that version's (replay list shows it).
        std::optional<storage::manifest> head;
        std::optional<std::vector<float>> theta;
        if (origin->store)
          if (auto m = origin->store->latest_manifest(); m && *m)
            if (auto p = origin->store->read_params(**m, setup.layout, setup.plan); p) {
              head = std::move(**m);
              theta = std::move(*p);
            }
        last_loss = evaluate(theta ? *theta : gather_global(self, shards, setup)).loss;
        const std::uint64_t at = head ? head->ledger.processed : tokens;
        out.eval_curve.emplace_back(at, last_loss);
        out.eval_times_s.push_back(elapsed());
        // When Θ was taken, not when its evaluation ended.
        if (eval.target_loss > 0 && last_loss <= eval.target_loss) out.target_reached_s = last_eval_s;
        if (head) (void)writer->submit(storage::eval_record{head->mesh_version, wall_clock_ns(), last_loss, at});
      }
      broker_report r;
      {
        std::lock_guard lock(stats.report_mutex);
        r.ledger = stats.report.ledger;
        r.uptime = stats.report.uptime;
        r.first_join_ns = stats.report.first_join_ns;
        r.xi_quorum_ms = stats.report.xi_quorum_ms;
        r.last_grace_ms = stats.report.last_grace_ms;
      }
      if (!drill) {
        run_sample sample{elapsed(), stats.tokens.load(), stats.rounds_closed.load(), r.ledger.merged_step_time_s, r.uptime, {}};
        for (const auto& steps : stats.learner_steps) sample.learner_steps.push_back(steps.load());
        out.timeline.push_back(std::move(sample));
      }
      if (progress) {
        const double rounds = static_cast<double>(stats.rounds_closed.load());
        // A drill's broker may have restarted (a new span, a restored ledger): there, the run's time.
        const double span_s = drill                  ? elapsed()
                              : r.first_join_ns < 0 ? 0
                                                    : static_cast<double>(clock.now() - r.first_join_ns) * 1e-9;
        char eval[32] = "-";  // until the first evaluation, every 20 s
        if (!std::isnan(last_loss)) std::snprintf(eval, sizeof eval, "%.3f", last_loss);
        char line[320];
        std::snprintf(line, sizeof line,
                      "%.0fs  round %.0f  version %llu  tokens %llu  eval %s  goodput %.1f%%  uptime %.1f%%  "
                      "members %.2f  quorum %.0fms  grace %.0fms  late %llu",
                      elapsed(), rounds, static_cast<unsigned long long>(stats.published.load()),
                      static_cast<unsigned long long>(stats.tokens.load()), eval,
                      span_s > 0 ? 100 * r.ledger.merged_step_time_s / (m * span_s) : 0.0, 100 * r.uptime,
                      rounds > 0 ? static_cast<double>(stats.members.load()) / rounds : 0.0, r.xi_quorum_ms,
                      r.last_grace_ms, static_cast<unsigned long long>(r.ledger.late));
        progress(line);
      }
    }
    out.wall_s = elapsed();
    stopped_ns = clock.now();
    all_done = stats.learners_done.load() == m;
    if (chaos) {  // no fault and no restart from here on
      self->monitor(chaos);
      self->send_exit(chaos, caf::exit_reason::user_shutdown);
      self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(30)) >> [] {});
    }
    // A drill stopped early (a signal) may leave actors down: only the running ones are stopped.
    std::erase_if(actors, [](const caf::actor& a) { return !a; });
    std::erase_if(shards, [](const caf::actor& a) { return !a; });

    // Learners still running (a stop or time limit) leave after their current
    // step, so the broker's last report covers every step they took.
    stop_learners(self, actors, stats);
    for (auto& a : actors) self->send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& a : actors) {
      self->monitor(a);
      self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(30)) >> [] {});
    }
    if (writer) {  // the last versions become durable, the broker hears of them and writes the tape
      (void)writer->drain(std::chrono::seconds(30));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (broker)
      self->request(broker, std::chrono::seconds(10), report_atom::value).receive([](bool) {}, [](caf::error&) {});
    const std::vector<float> theta = gather_global(self, shards, setup);
    for (auto& a : shards) self->monitor(a);
    if (broker) {
      self->monitor(broker);
      self->send_exit(broker, caf::exit_reason::user_shutdown);
    }
    for (auto& a : shards) self->send_exit(a, caf::exit_reason::user_shutdown);
    for (std::size_t i = 0; i < shards.size() + (broker ? 1 : 0); ++i)
      self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(10)) >> [] {});
    actors.clear();
    shards.clear();
    const eval_result r = evaluate(theta);
    if (writer) {
      (void)writer->submit(storage::eval_record{origin->store->last_mesh_version(), wall_clock_ns(), r.loss,
                                                stats.tokens.load()});
      if (auto ok = writer->drain(std::chrono::seconds(60)); !ok)
        std::fprintf(stderr, "archipelago run: %s\n", ok.err().message.c_str());
      out.snapshot_errors = writer->stats().failed + writer->stats().refused;
      writer.reset();
      out.mesh_version = origin->store->last_mesh_version();
    }
    out.global_params = theta;
    out.eval_loss = r.loss;
    out.eval_bpb = r.bits_per_byte;
    out.eval_curve.emplace_back(stats.tokens.load(), r.loss);
    out.eval_times_s.push_back(out.wall_s);
  }
  {
    std::lock_guard lock(stats.report_mutex);
    out.broker = stats.report;
  }
  out.mode = base.mesh.mode;
  out.learners = m;
  out.shards = s;
  out.fragments = static_cast<int>(setup.plan.fragments.size());
  out.steps = stats.steps;
  out.tokens = stats.tokens;
  out.rounds = stats.rounds_closed;
  out.published = stats.published;
  out.bytes_on_wire = stats.bytes_sent;
  out.refetches = stats.refetches;
  out.committed = stats.committed;
  out.budget_overruns = stats.budget_overruns;
  out.mean_members = out.rounds ? static_cast<double>(stats.members.load()) / static_cast<double>(out.rounds) : 0;
  out.entropy_floor_bpb = data->entropy_floor_bpb;
  const ledger_totals& l = out.broker.ledger;
  // The learners' span: from the first Join to the last Leave, or to the stop
  // when a time limit or a signal ended the run.
  const nanos end_ns = all_done && out.broker.last_leave_ns > 0 ? out.broker.last_leave_ns : stopped_ns;
  const double span_s = out.broker.first_join_ns >= 0 && end_ns > out.broker.first_join_ns
                            ? static_cast<double>(end_ns - out.broker.first_join_ns) * 1e-9
                            : out.wall_s;
  out.goodput = l.merged_step_time_s / (m * span_s);
  out.wait_share = static_cast<double>(stats.wait_ns.load()) * 1e-9 / (m * span_s);
  out.ledger_exact = l.balanced() && l.processed == out.tokens;
  return out;
}

}  // namespace archipelago
