// The sync broker's CAF shell: feeds messages and ticks to broker_core and
// turns its effects into RoundOpen / RoundClose messages.

#include <chrono>

#include "node/mesh_actors.hpp"
#include "sync_broker/broker_core.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {
namespace {

using namespace transport;

struct broker_state {
  std::unique_ptr<broker_core> core;
  std::unique_ptr<node_transport> wire;
  std::vector<node_address> learners;
  static inline const char* name = "sync_broker";
};

broker_config broker_settings(const mesh_setup& s) {
  broker_config b;
  const mesh_config& m = s.cfg.mesh;
  b.fragments = static_cast<int>(s.plan.fragments.size());
  b.rounds_in_flight = m.rounds_in_flight;
  b.quorum = m.quorum;
  b.grace_factor = m.grace_factor;
  b.adaptive_grace = m.grace;
  b.ema_alpha = m.ema_alpha;
  b.liveness_timeout_ns = s.cfg.wire.heartbeat_interval_ms * s.cfg.wire.liveness * 1'000'000;
  b.shard_of_fragment = s.shard_of_fragment;
  return b;
}

caf::behavior broker_actor(caf::stateful_actor<broker_state>* self, const mesh_setup* setup, mesh_stats* stats,
                           const clock_source* clock) {
  auto& st = self->state;
  st.core = std::make_unique<broker_core>(broker_settings(*setup));
  st.wire = start_mesh_wire(self, *setup, broker_address, setup->broker_endpoint, *clock);
  if (!st.wire) return {};
  for (std::uint32_t s = 0; s < setup->shard_endpoints.size(); ++s)
    (void)st.wire->add_peer({role::parameter_shard, s}, setup->shard_endpoints[s]);

  auto dispatch = [self, stats] {
    auto& st = self->state;
    for (auto& effect : st.core->take_effects()) {
      if (auto* o = std::get_if<open_round>(&effect)) {
        auto b = st.wire->make_envelope(o->round.value);
        auto body = b.body().initRoundOpen();
        body.setFragment(o->fragment.value);
        body.setShard(o->shard);
        (void)st.wire->broadcast(st.learners, b.finish());
      } else if (auto* c = std::get_if<close_round>(&effect)) {
        auto b = st.wire->make_envelope(c->round.value);
        auto body = b.body().initRoundClose();
        body.setFragment(c->fragment.value);
        body.setQuorumNs(c->quorum_ns);
        body.setGraceNs(c->grace_ns);
        body.setReason(c->reason == close_reason::all_eligible    ? wire::CloseReason::ALL_ELIGIBLE
                       : c->reason == close_reason::grace_expired ? wire::CloseReason::GRACE_EXPIRED
                                                                  : wire::CloseReason::TIMEOUT);
        auto members = body.initMembers(static_cast<unsigned>(c->members.size()));
        for (unsigned i = 0; i < c->members.size(); ++i) {
          members[i].setLearner(c->members[i].learner.value);
          members[i].setIncarnation(c->members[i].inc.value);
          members[i].setWeight(c->members[i].weight);
        }
        (void)st.wire->send({role::parameter_shard, c->shard}, b.finish());
        ++stats->rounds_closed;
        stats->members += c->members.size();
      } else if (std::get_if<late_contribution>(&effect)) {
        ++stats->late;
      }
    }
  };

  self->send(self, tick_atom::value);
  return {
      [self, dispatch, clock](tick_atom) {
        self->state.core->tick(clock->now());
        dispatch();
        self->delayed_send(self, std::chrono::milliseconds(2), tick_atom::value);
      },
      [self, dispatch, clock](const inbound_ptr& m) {
        auto& st = self->state;
        const nanos now = clock->now();
        const auto& env = *m->envelope;
        const node_address from = env.sender();
        auto body = env.root().getBody();
        switch (env.body()) {
          case wire::Envelope::Body::JOIN:
            if (std::find(st.learners.begin(), st.learners.end(), from) == st.learners.end()) st.learners.push_back(from);
            (void)st.wire->add_peer(from, body.getJoin().getEndpoint().cStr());
            st.core->on_join({from.index}, incarnation{env.header().getIncarnation()}, now);
            break;
          case wire::Envelope::Body::LEAVE:
            st.core->on_leave({from.index}, incarnation{env.header().getIncarnation()}, now);
            break;
          case wire::Envelope::Body::PROGRESS: {
            auto p = body.getProgress();
            st.core->on_progress({from.index}, incarnation{env.header().getIncarnation()}, p.getStep(),
                                 static_cast<nanos>(p.getStepTimeNs()), now);
            break;
          }
          case wire::Envelope::Body::CONTRIBUTION: {  // a shard's arrival notice
            auto c = body.getContribution();
            st.core->on_contribution(round_number{env.header().getRound()}, {c.getLearner()},
                                     incarnation{c.getLearnerIncarnation()}, c.getTokens(), c.getSteps(), now);
            break;
          }
          case wire::Envelope::Body::FRAGMENT_UPDATE: {  // a shard published
            auto u = body.getFragmentUpdate();
            st.core->on_published(round_number{env.header().getRound()}, {u.getFragment()}, u.getVersion(), now);
            break;
          }
          default: break;
        }
        dispatch();
      },
  };
}

}  // namespace

caf::actor spawn_broker(caf::actor_system& sys, const mesh_setup& setup, mesh_stats& stats,
                        const clock_source& clock) {
  return sys.spawn(broker_actor, &setup, &stats, &clock);
}

}  // namespace archipelago
