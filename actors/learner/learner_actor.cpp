#include "learner/learner_actor.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/prng.hpp"
#include "learner/learner_wire.hpp"
#include "learner/model/trainer.hpp"
#include "transport/actor_bridge.hpp"
#include "transport/wire_metrics.hpp"

namespace archipelago {
namespace {

using step_atom = caf::atom_constant<caf::atom("step")>;
/// (wake_atom, generation): a join retry (generation 0) or the bound on a wait.
using wake_atom = caf::atom_constant<caf::atom("wake")>;
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;  // the bound on mesh.flush's wait

struct learner_state {
  learner_actor_args args;
  learner_profile profile;
  std::unique_ptr<engine> eng;
  std::unique_ptr<transport::node_transport> wire;
  std::unique_ptr<learner_wire> learner;
  std::uint64_t wake_generation = 0;  // invalidates wake-ups of finished waits
  nanos started_ns = 0, last_step_ns = 0;
  std::uint64_t overruns = 0;  // steps whose compute exceeded mesh.step_time_ms
  std::optional<global_eval> last_eval;  // mesh.global_eval_every: the newest evaluation of Θ
  static inline const char* name = "learner";

  const mesh_setup& setup() const { return *args.setup; }
  nanos now() const { return args.clock->now(); }
  void publish() {
    if (!args.board) return;
    node_status s = learner->status();
    s.counts.budget_overruns = overruns;
    if (wire) count_wire(s.counts, wire->counters());
    s.schedule_step = eng->steps_done();
    s.eval = last_eval;
    args.board->update(s);
  }
};

using learner_self = caf::stateful_actor<learner_state, caf::event_based_actor>;

/// Pads a step that took `compute_ns` to the learner's pace: at least
/// mesh.step_time_ms (a fixed compute budget), times its slow-down (a slower
/// machine, or the chaos monkey's). Returns the step's time as the ledger counts it.
/// The bound on any wait for the mesh (mesh.round_timeout_s).
std::chrono::milliseconds round_timeout(const mesh_setup& setup) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(setup.cfg.mesh.round_timeout_s * 1000));
}

nanos pace_step(learner_state& st, nanos compute_ns) {
  const auto budget_ns = static_cast<nanos>(st.setup().cfg.mesh.step_time_ms * 1e6);
  if (budget_ns > 0 && compute_ns > budget_ns) ++st.overruns;
  const double factor = st.profile.slowdown * st.learner->slowdown();
  const auto paced = static_cast<nanos>(static_cast<double>(std::max(budget_ns, compute_ns)) * factor);
  if (paced > compute_ns) std::this_thread::sleep_for(std::chrono::nanoseconds(paced - compute_ns));
  return std::max(paced, compute_ns);
}

/// mesh.global_eval_every: learner 0 evaluates Θ as it holds it — every fragment's
/// anchor, the value it last received — in its own model's buffer, then puts its
/// parameters back. Its ledger is untouched: the time is not a step's.
bool evaluates_global(const learner_state& st) {
  return st.args.index == 0 && st.setup().cfg.mesh.global_eval_every > 0;
}

void evaluate_global(learner_state& st) {
  const learner_core& core = st.learner->core();
  global_eval e;
  for (std::uint32_t p = 0; p < core.fragments(); ++p) {
    if (!core.installed({p})) return;  // not joined yet: no Θ to speak of
    e.versions.push_back(core.version({p}));
  }
  float* params = st.eng->model().params();
  const std::vector<float> own(params, params + st.eng->model().buffer_size());
  for (std::uint32_t p = 0; p < core.fragments(); ++p) core.scatter({p}, core.anchor({p}).data(), params);
  const eval_result r = st.eng->evaluate();
  std::copy(own.begin(), own.end(), params);
  e.loss = r.loss;
  e.bits_per_byte = r.bits_per_byte;
  e.step = st.eng->steps_done();
  e.evaluations = (st.last_eval ? st.last_eval->evaluations : 0) + 1;
  std::string cut;
  for (std::uint64_t v : e.versions) cut += (cut.empty() ? "" : ",") + std::to_string(v);
  st.args.logs->info("learner.global_eval",
                     "archipelago learner/%u: the global model it holds evaluates to %.4f nats/byte at step %lld "
                     "(fragment versions %s)",
                     st.args.index, e.loss, static_cast<long long>(e.step), cut.c_str());
  st.last_eval = std::move(e);
}

void leave(learner_self* self, const char* reason) {
  if (evaluates_global(self->state)) evaluate_global(self->state);
  self->state.learner->leave(reason);
  self->state.publish();
}

/// The last step is done: leave, or with mesh.flush first wait (bounded) until
/// every fragment's work is merged.
void finish(learner_self* self) {
  auto& st = self->state;
  if (st.learner->flushing()) return;
  if (!st.learner->begin_flush()) return leave(self, "steps done");
  self->delayed_send(self, round_timeout(st.setup()), flush_atom::value);
}

/// One step_atom: wait (the synchronous policies), leave (its steps are done) or step.
void step(learner_self* self) {
  auto& st = self->state;
  if (st.learner->done()) return;
  const mesh_setup& setup = st.setup();
  if (st.learner->wait_before_step(st.now())) {
    self->delayed_send(self, round_timeout(setup), wake_atom::value, ++st.wake_generation);
    return;
  }
  if (st.eng->steps_done() >= setup.last_step()) return finish(self);
  const nanos t0 = st.now();
  if (setup.policy.send_gradients) st.eng->compute_gradient();
  else st.eng->step();
  st.last_step_ns = pace_step(st, st.now() - t0);
  st.learner->after_step(static_cast<std::uint64_t>(st.eng->tokens_per_step()), st.last_step_ns);
  if (evaluates_global(st) && st.eng->steps_done() % setup.cfg.mesh.global_eval_every == 0) evaluate_global(st);
  st.publish();
  self->send(self, step_atom::value);
}

/// Set up: the engine (its own batches: a restarted learner draws new ones), the wire, the first fetch and Join.
bool start(learner_self* self) {
  auto& st = self->state;
  const mesh_setup& setup = st.setup();
  const learner_actor_args& a = st.args;
  st.profile = learner_profile_of(setup.cfg, static_cast<int>(a.index));
  set_compute_threads(st.profile.threads);
  config cfg = setup.cfg;
  cfg.train.seed = derive_seed(derive_seed(setup.cfg.train.seed, 1000 + a.index), a.inc.value);
  cfg.data.batch = st.profile.batch;
  st.eng = std::make_unique<engine>(cfg, setup.shape, *a.data, static_cast<int>(a.index));
  st.eng->start_at_step(a.start_step >= 0 ? a.start_step : setup.start_step);
  const node_address me{role::learner, a.index};
  st.wire = start_actor_wire(self, setup.cfg, a.io, me, a.inc, setup.learner_endpoints[a.index], *a.clock,
                             *a.logs);
  if (!st.wire) return false;
  const learner_model_view model{st.eng->model().params(), st.eng->model().grads(),
                                 static_cast<std::uint32_t>(st.eng->tokens_per_step()),
                                 static_cast<std::uint16_t>(st.profile.threads)};
  st.learner = std::make_unique<learner_wire>(setup, learner_settings(setup), a.index, a.inc, *st.wire, *a.logs, model);
  st.started_ns = st.now();
  st.learner->start();
  st.publish();
  return true;
}

caf::behavior learner_actor(learner_self* self, learner_actor_args args) {
  auto& st = self->state;
  st.args = std::move(args);
  if (!start(self)) return {};
  const wire_config& w = st.setup().cfg.wire;
  const auto wait_bound = round_timeout(st.setup());
  // Joining is bounded too: fetch again until every fragment is installed.
  const auto retry = std::chrono::milliseconds(w.heartbeat_interval_ms * w.liveness);
  self->delayed_send(self, retry, wake_atom::value, std::uint64_t{0});
  return {
      [self, retry](peer_atom, std::uint8_t kind, std::uint32_t index, bool alive) {
        if (self->state.learner->on_peer({static_cast<role>(kind), index}, alive))
          self->delayed_send(self, retry, rejoin_atom::value);
      },
      [self, retry](rejoin_atom) {
        if (self->state.learner->on_rejoin_timer()) self->delayed_send(self, retry, rejoin_atom::value);
      },
      [self](step_atom) { step(self); },
      [self, wait_bound, retry](wake_atom, std::uint64_t generation) {
        auto& st = self->state;
        if (generation == 0) {  // joining
          if (st.learner->on_join_timer(st.now())) self->delayed_send(self, retry, wake_atom::value, std::uint64_t{0});
          return;
        }
        if (!st.learner->waiting() || generation != st.wake_generation) return;
        st.learner->on_wait_timeout();
        self->delayed_send(self, wait_bound, wake_atom::value, ++st.wake_generation);
      },
      [self](const inbound_ptr& m) {
        auto& st = self->state;
        const learner_event e = st.learner->on_message(*m->envelope, st.now());
        if (e.refused) {  // nothing to train for
          st.publish();
          self->quit(caf::exit_reason::user_shutdown);
          return;
        }
        if (e.schedule_step && *e.schedule_step > st.eng->steps_done()) st.eng->start_at_step(*e.schedule_step);
        if (e.resume) ++st.wake_generation;
        if (e.flushed) return leave(self, "steps done");
        if (e.start_stepping || e.resume) self->send(self, step_atom::value);
      },
      [self](flush_atom) {
        auto& st = self->state;
        if (st.learner->done() || !st.learner->flushing()) return;
        st.args.logs->warn("learner.flush_bound",
                           "archipelago learner/%u: leaving with %zu fragment(s) of work not merged: "
                           "mesh.round_timeout_s passed since its last step",
                           st.args.index, st.learner->core().fragments_with_unmerged_work());
        leave(self, "steps done");
      },
      [self](stop_atom) {
        if (!self->state.learner->done()) leave(self, "stopped");
      },
      // The chaos monkey's pause in a one-process mesh (SIGSTOP's stand-in): the
      // transport goes silent — peers declare this learner dead — and no step runs.
      [self](pause_atom, nanos duration) {
        self->state.wire->freeze_for(duration);
        std::this_thread::sleep_for(std::chrono::nanoseconds(duration));
      },
      [self](metrics_atom, const metrics_page& page) {
        const auto& st = self->state;
        const node_address me{role::learner, st.args.index};
        add_node_metrics(*page, me, st.args.inc, st.now() - st.started_ns, st.wire->counters(), st.args.logs);
        st.learner->add_metrics(*page);
        const metric_labels l = role_labels(me);
        page->gauge("archipelago_learner_step_seconds", "The last inner step's time, as the ledger counts it (paced).",
                    static_cast<double>(st.last_step_ns) * 1e-9, l);
        page->counter("archipelago_learner_budget_overruns_total", "Steps whose compute exceeded mesh.step_time_ms.",
                      static_cast<double>(st.overruns), l);
        if (st.last_eval)
          page->gauge("archipelago_global_eval_loss",
                      "The global model as this learner holds it (mesh.global_eval_every), held-out nats/byte.",
                      st.last_eval->loss, l);
        page->gauge("archipelago_learner_schedule_step",
                    "Where this learner is in the learning-rate schedule (a new incarnation starts at the mesh's).",
                    static_cast<double>(st.eng->steps_done()), l);
        return true;
      },
  };
}

}  // namespace

caf::actor spawn_learner(caf::actor_system& sys, learner_actor_args args) {
  return sys.spawn<caf::detached>(learner_actor, std::move(args));
}

}  // namespace archipelago
