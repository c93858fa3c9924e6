// The learner's CAF shell, a detached actor: its compute has a thread of its
// own. Each inner step is one step_atom message it sends itself, so fragment
// updates and round openings that arrived meanwhile are handled between two
// steps, in arrival order. Under decoupled it never waits; the synchronous
// policies park it (no step_atom) until the awaited fragment arrives.

#include <chrono>
#include <thread>

#include "chaos_monkey/chaos_command.hpp"
#include "learner/learner_core.hpp"
#include "node/mesh_actors.hpp"
#include "node/node_metrics.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {
namespace {

using namespace transport;

using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;

struct learner_state {
  std::unique_ptr<engine> eng;
  std::unique_ptr<learner_core> core;
  std::unique_ptr<node_transport> wire;
  learner_profile profile;
  std::size_t to_install = 0;
  bool stepping = false, waiting = false, done = false;
  nanos wait_since = 0;
  std::uint64_t wake_generation = 0;  // invalidates wake-ups of finished waits
  tensor_encoding encoding = tensor_encoding::fp32;
  std::vector<std::uint64_t> shard_incarnations;  // as last seen; 0: not yet
  std::uint64_t broker_incarnation = 0;           // as last seen; 0: not yet
  bool broker_silent = false;                     // the transport found the broker silent; Join is re-sent
  bool welcomed = false;                          // the broker's first Welcome of this incarnation arrived
  chaos_receiver chaos;                           // link shaping and slow-down from the chaos monkey
  // This incarnation's own figures, for its metrics (mesh_stats sums every learner of the process).
  nanos started_ns = 0, last_step_ns = 0, waited_ns = 0;
  std::uint64_t steps = 0, tokens = 0, contributions = 0, overruns = 0;
  static inline const char* name = "learner";
};

using learner_self = caf::stateful_actor<learner_state, caf::event_based_actor>;

/// Clone pattern: (re)subscribe with every shard (or just `only_shard`) and fetch its fragments.
void fetch_all(learner_self* self, const mesh_setup& setup, std::optional<std::uint32_t> only_shard = std::nullopt) {
  for (std::uint32_t p = 0; p < setup.plan.fragments.size(); ++p) {
    if (only_shard && setup.shard_of_fragment[p] != *only_shard) continue;
    auto b = self->state.wire->make_envelope();
    auto f = b.body().initFetchFragment();
    f.setFragment(p);
    f.setReplyEndpoint(self->state.wire->endpoint());
    (void)self->state.wire->send({role::parameter_shard, setup.shard_of_fragment[p]}, b.finish());
  }
}

/// A shard restarted from its snapshot (a higher incarnation): its versions
/// start again from the snapshot's, below the ones held here, and it lost our
/// endpoint. Accept its versions from now on; fetch when asked to.
bool shard_restarted(learner_self* self, const mesh_setup& setup, std::uint32_t shard, std::uint64_t inc) {
  auto& known = self->state.shard_incarnations;
  if (inc == 0 || shard >= known.size() || inc <= known[shard]) return false;
  const bool restarted = known[shard] != 0;
  known[shard] = inc;
  if (!restarted) return false;
  // Reconnect now: the link may sit in a long back-off after the shard's crash,
  // and the new shard cannot call first (it lost our endpoint).
  (void)self->state.wire->add_peer({role::parameter_shard, shard}, setup.shard_endpoints[shard]);
  for (std::uint32_t p = 0; p < setup.plan.fragments.size(); ++p)
    if (setup.shard_of_fragment[p] == shard) self->state.core->forget_version({p});
  return true;
}

/// Announces this incarnation to the broker (first start, and again whenever the
/// broker may have restarted: a new broker knows no learner until it joins).
void send_join(learner_self* self, const mesh_setup& setup) {
  auto& st = self->state;
  auto b = st.wire->make_envelope();
  auto j = b.body().initJoin();
  j.setLayoutFingerprint(setup.layout.fingerprint());
  j.setConfigHash(mesh_agreement_hash(setup.cfg));
  j.setBatchTokens(static_cast<std::uint32_t>(st.eng->tokens_per_step()));
  j.setThreads(static_cast<std::uint16_t>(st.profile.threads));
  j.setEndpoint(st.wire->endpoint());
  (void)st.wire->send(broker_address, b.finish());
}

/// A message from the broker. A higher incarnation than the one known is a
/// restarted broker: the rounds of the old one will never close, and the new
/// one's are new rounds whatever their numbers (learner_core::on_broker_restarted).
/// Join again: a broker that greets the learners its predecessor knew has not
/// heard this one's Join yet (one that answers a Join has; a second changes nothing).
void broker_seen(learner_self* self, const mesh_setup& setup, std::uint32_t index, std::uint64_t inc) {
  auto& st = self->state;
  st.broker_silent = false;
  if (inc <= st.broker_incarnation) return;
  if (st.broker_incarnation != 0) {
    // Reconnect now: the old broker's socket may be dead for good (an inproc:// pipe never reconnects).
    (void)st.wire->add_peer(broker_address, setup.broker_endpoint);
    const std::size_t dropped = st.core->on_broker_restarted();
    std::fprintf(stderr,
                 "archipelago learner/%u: the broker restarted (incarnation %llu); %zu pending round(s) dropped\n",
                 index, static_cast<unsigned long long>(inc), dropped);
    if (!st.done) send_join(self, setup);  // a finished incarnation left (its Leave went to the old broker)
  }
  st.broker_incarnation = inc;
}

/// Answers every pending round that is ready (dp: with the gradient of the last step).
void send_contributions(learner_self* self, const mesh_setup& setup, mesh_stats& stats) {
  auto& st = self->state;
  const float* gradient = setup.policy.send_gradients ? st.eng->model().grads() : nullptr;
  while (auto c = st.core->next_contribution(st.eng->model().params(), gradient)) {
    auto cb = st.wire->make_envelope(c->round.value);
    auto body = cb.body().initContribution();
    body.setFragment(c->fragment.value);
    body.setAnchorVersion(c->anchor_version);
    body.setSteps(c->steps);
    body.setTokens(c->tokens);
    body.setStep(c->step);
    body.setBrokerIncarnation(st.broker_incarnation);  // shards refuse rounds of an older broker
    if (!cb.add_tensor_values("delta/" + std::to_string(c->fragment.value), c->delta.data(), c->delta.size(),
                              st.encoding, static_cast<std::uint32_t>(setup.cfg.wire.block_size)))
      continue;  // a non-finite delta is never sent
    // What the encoding puts on the wire, not the fp32 delta it came from.
    stats.bytes_sent += encoded_bytes(st.encoding, c->delta.size(), setup.cfg.wire.block_size);
    ++st.contributions;
    (void)st.wire->send({role::parameter_shard, setup.shard_of_fragment[c->fragment.value]}, cb.finish());
  }
}

/// Tells the broker this incarnation is finished; the actor stays until ended.
void leave(learner_self* self, mesh_stats& stats, const char* reason) {
  auto& st = self->state;
  st.done = true;
  auto b = st.wire->make_envelope();
  b.body().initLeave().setReason(reason);
  (void)st.wire->send(broker_address, b.finish());
  ++stats.learners_done;
}

/// Pads a step that took `compute_ns` to the learner's pace: at least
/// mesh.step_time_ms (a fixed compute budget), times its slow-down (a slower
/// machine, or the chaos monkey's). Returns the step's time as the ledger counts it.
nanos pace_step(learner_state& st, const mesh_setup& setup, mesh_stats& stats, nanos compute_ns) {
  const auto budget_ns = static_cast<nanos>(setup.cfg.mesh.step_time_ms * 1e6);
  if (budget_ns > 0 && compute_ns > budget_ns) {
    ++stats.budget_overruns;
    ++st.overruns;
  }
  const double factor = st.profile.slowdown * st.chaos.slowdown;
  const auto paced = static_cast<nanos>(static_cast<double>(std::max(budget_ns, compute_ns)) * factor);
  if (paced > compute_ns) std::this_thread::sleep_for(std::chrono::nanoseconds(paced - compute_ns));
  return std::max(paced, compute_ns);
}

caf::behavior learner_actor(learner_self* self, const mesh_setup* setup, std::uint32_t index, const dataset* data,
                            mesh_stats* stats, const clock_source* clock, incarnation inc, std::int64_t start_step) {
  auto& st = self->state;
  const node_address me{role::learner, index};
  st.profile = learner_profile_of(setup->cfg, static_cast<int>(index));
  set_compute_threads(st.profile.threads);
  config cfg = setup->cfg;
  // Own batches; a restarted learner (new incarnation) draws new ones.
  cfg.train.seed = derive_seed(derive_seed(setup->cfg.train.seed, 1000 + index), inc.value);
  cfg.data.batch = st.profile.batch;
  st.eng = std::make_unique<engine>(cfg, setup->shape, *data, static_cast<int>(index));
  st.eng->start_at_step(start_step >= 0 ? start_step : setup->start_step);
  st.chaos.accept = setup->cfg.wire.accept_chaos;
  learner_sync_config sync;
  sync.mix = setup->policy.mix;
  sync.contribute_after = static_cast<std::uint64_t>(setup->policy.contribute_after);
  sync.wait_slack = setup->policy.wait_slack;
  st.core = std::make_unique<learner_core>(setup->layout, setup->plan, sync);
  st.encoding = *parse_tensor_encoding(setup->cfg.wire.encoding);
  st.wire = start_mesh_wire(self, *setup, me, setup->learner_endpoints[index], *clock, inc);
  if (!st.wire) return {};
  (void)st.wire->add_peer(broker_address, setup->broker_endpoint);
  for (std::uint32_t s = 0; s < setup->shard_endpoints.size(); ++s)
    (void)st.wire->add_peer({role::parameter_shard, s}, setup->shard_endpoints[s]);

  st.started_ns = clock->now();
  st.to_install = setup->plan.fragments.size();
  st.shard_incarnations.assign(setup->shard_endpoints.size(), 0);
  fetch_all(self, *setup);
  send_join(self, *setup);

  const auto wait_bound = std::chrono::milliseconds(static_cast<std::int64_t>(setup->cfg.mesh.round_timeout_s * 1000));
  // Joining is bounded too: fetch again until every fragment is installed.
  const auto fetch_retry = std::chrono::milliseconds(setup->cfg.wire.heartbeat_interval_ms * setup->cfg.wire.liveness);
  self->delayed_send(self, fetch_retry, wake_atom::value, std::uint64_t{0});
  // A waiting learner resumes when an update arrives; the wake-up bounds the wait.
  auto resume_if_ready = [self, stats, clock] {
    auto& st = self->state;
    if (!st.waiting || st.core->must_wait()) return;
    st.waiting = false;
    ++st.wake_generation;
    stats->wait_ns += static_cast<std::uint64_t>(clock->now() - st.wait_since);
    st.waited_ns += clock->now() - st.wait_since;
    self->send(self, step_atom::value);
  };

  return {
      // The broker fell silent (crashed?) or speaks again: Join again, so that a
      // restarted broker, which knows no learner, takes this one in; while it
      // stays silent, again every liveness period (the reconnecting socket may
      // drop what it queued). Other peers' liveness matters to the broker only.
      [self, setup, fetch_retry](peer_atom, std::uint8_t kind, std::uint32_t, bool alive) {
        auto& st = self->state;
        if (kind != static_cast<std::uint8_t>(role::sync_broker) || st.done) return;
        const bool was_silent = st.broker_silent;
        st.broker_silent = !alive;
        send_join(self, *setup);
        if (!alive && !was_silent) self->delayed_send(self, fetch_retry, rejoin_atom::value);
      },
      [self, setup, fetch_retry](rejoin_atom) {
        auto& st = self->state;
        if (!st.broker_silent || st.done) return;
        send_join(self, *setup);
        self->delayed_send(self, fetch_retry, rejoin_atom::value);
      },
      [self, setup, stats, clock, wait_bound, index](step_atom) {
        auto& st = self->state;
        if (st.done) return;
        if (st.core->must_wait()) {  // the synchronous policies, also before leaving: the last work is merged
          send_contributions(self, *setup, *stats);
          st.waiting = true;
          st.wait_since = clock->now();
          self->delayed_send(self, wait_bound, wake_atom::value, ++st.wake_generation);
          return;
        }
        if (st.eng->steps_done() >= setup->cfg.train.steps) return leave(self, *stats, "steps done");
        const nanos t0 = clock->now();
        if (setup->policy.send_gradients) st.eng->compute_gradient();
        else st.eng->step();
        const nanos step_ns = pace_step(st, *setup, *stats, clock->now() - t0);
        const auto tokens = static_cast<std::uint64_t>(st.eng->tokens_per_step());
        st.core->on_step(tokens);
        st.last_step_ns = step_ns;
        ++st.steps;
        st.tokens += tokens;
        ++stats->steps;
        stats->tokens += tokens;
        if (index < stats->learner_steps.size()) ++stats->learner_steps[index];
        auto b = st.wire->make_envelope();
        auto p = b.body().initProgress();
        p.setStep(st.core->steps_done());  // this incarnation's steps (the ledger counts from 1)
        p.setStepTimeNs(static_cast<std::uint64_t>(step_ns));
        p.setTokens(st.core->steps_done() * tokens);
        (void)st.wire->send(broker_address, b.finish());
        send_contributions(self, *setup, *stats);
        self->send(self, step_atom::value);
      },
      [self, clock, me, inc](metrics_atom, const metrics_page& page) {
        const auto& st = self->state;
        add_node_metrics(*page, me, inc, clock->now() - st.started_ns, st.wire->counters());
        const metric_labels l = role_labels(me);
        page->counter("archipelago_learner_steps_total", "Inner steps this incarnation took.", static_cast<double>(st.steps), l);
        page->counter("archipelago_learner_tokens_total", "Tokens this incarnation trained on.", static_cast<double>(st.tokens), l);
        page->gauge("archipelago_learner_step_seconds", "The last inner step's time, as the ledger counts it (paced).",
                    static_cast<double>(st.last_step_ns) * 1e-9, l);
        page->counter("archipelago_learner_wait_seconds_total", "Time spent waiting for fragments (synchronous modes).",
                      static_cast<double>(st.waited_ns) * 1e-9, l);
        page->counter("archipelago_learner_contributions_total", "Fragment contributions sent to the shards.",
                      static_cast<double>(st.contributions), l);
        page->counter("archipelago_learner_budget_overruns_total", "Steps whose compute exceeded mesh.step_time_ms.",
                      static_cast<double>(st.overruns), l);
        page->gauge("archipelago_learner_schedule_step",
                    "Where this learner is in the learning-rate schedule (a new incarnation starts at the mesh's).",
                    static_cast<double>(st.eng->steps_done()), l);
        page->gauge("archipelago_learner_pending_rounds", "Rounds opened that this learner has not answered yet.",
                    static_cast<double>(st.core->pending_rounds()), l);
        for (std::uint32_t p = 0; p < st.core->fragments(); ++p) {
          metric_labels f = l;
          f.emplace_back("fragment", std::to_string(p));
          page->gauge("archipelago_fragment_version", "The version of each fragment this node holds.",
                      static_cast<double>(st.core->installed({p}) ? st.core->version({p}) : 0), f);
        }
        return true;
      },
      [self, stats](stop_atom) {
        if (!self->state.done) leave(self, *stats, "stopped");
      },
      // The chaos monkey's pause in a one-process mesh (SIGSTOP's stand-in): the
      // transport goes silent — peers declare this learner dead — and no step runs.
      [self](pause_atom, nanos duration) {
        self->state.wire->freeze_for(duration);
        std::this_thread::sleep_for(std::chrono::nanoseconds(duration));
      },
      [self, setup, stats, wait_bound, fetch_retry](wake_atom, std::uint64_t generation) {
        auto& st = self->state;
        if (generation == 0) {  // joining
          if (st.to_install == 0) return;
          ++stats->refetches;
          fetch_all(self, *setup);
          self->delayed_send(self, fetch_retry, wake_atom::value, std::uint64_t{0});
          return;
        }
        if (!st.waiting || generation != st.wake_generation) return;
        // No update within the bound: a broadcast may have been lost. Fetch again.
        ++stats->refetches;
        fetch_all(self, *setup);
        self->delayed_send(self, wait_bound, wake_atom::value, ++st.wake_generation);
      },
      [self, setup, stats, clock, resume_if_ready, index](const inbound_ptr& m) {
        auto& st = self->state;
        const auto& env = *m->envelope;
        auto body = env.root().getBody();
        if (env.body() == wire::Envelope::Body::CHAOS_COMMAND) {
          (void)st.chaos.on_command(env, *st.wire, st.wire->config().default_link, clock->now());
          return;
        }
        if (env.sender().kind == role::sync_broker) broker_seen(self, *setup, index, env.header().getIncarnation());
        if (env.body() == wire::Envelope::Body::ERROR &&
            body.getError().getCode() == wire::ErrorCode::MESH_MISMATCH) {  // refused: nothing to train for
          std::lock_guard lock(stats->report_mutex);
          stats->refusal = body.getError().getMessage().cStr();
          self->quit(caf::exit_reason::user_shutdown);
          return;
        }
        if (env.body() == wire::Envelope::Body::WELCOME && env.sender().kind == role::sync_broker) {
          // A restarted learner takes up the mesh's schedule where the others are, not
          // at its warm-up (the broker sends 0 to a first start): only forward, only
          // once (a slow learner keeps its own pace through later broker restarts).
          if (!st.welcomed) {
            const auto mesh_step = static_cast<std::int64_t>(body.getWelcome().getScheduleStep());
            if (mesh_step > st.eng->steps_done()) st.eng->start_at_step(mesh_step);
          }
          st.welcomed = true;
        } else if (env.body() == wire::Envelope::Body::ROUND_OPEN) {
          auto open = body.getRoundOpen();
          if (shard_restarted(self, *setup, open.getShard(), open.getShardIncarnation()))
            fetch_all(self, *setup, open.getShard());
          st.core->on_round_open(round_number{env.header().getRound()}, {open.getFragment()});
          send_contributions(self, *setup, *stats);
        } else if (env.body() == wire::Envelope::Body::FRAGMENT_UPDATE && env.tensor_count() == 1) {
          auto u = body.getFragmentUpdate();
          const fragment_index p{u.getFragment()};
          if (env.sender().kind == role::parameter_shard)
            (void)shard_restarted(self, *setup, env.sender().index, env.header().getIncarnation());
          if (p.value >= st.core->fragments() || env.tensor_info(0).getElementCount() != st.core->fragment_floats(p))
            return;
          std::vector<float> value(st.core->fragment_floats(p));
          if (!env.decode_tensor_values(0, value.data())) return;
          if (!st.core->installed(p)) {
            if (!st.core->install(p, u.getVersion(), value, st.eng->model().params())) return;
            if (--st.to_install == 0 && !st.stepping) {
              st.stepping = true;
              self->send(self, step_atom::value);
            }
          } else {
            st.core->on_fragment_update(p, u.getVersion(), value, st.eng->model().params(),
                                        round_number{env.header().getRound()});
            resume_if_ready();
          }
        }
      },
  };
}

}  // namespace

caf::actor spawn_learner(caf::actor_system& sys, const mesh_setup& setup, std::uint32_t index, const dataset& data,
                         mesh_stats& stats, const clock_source& clock, incarnation inc, std::int64_t start_step) {
  return sys.spawn<caf::detached>(learner_actor, &setup, index, &data, &stats, &clock, inc, start_step);
}

}  // namespace archipelago
