// The learner's CAF shell, a detached actor: its compute has a thread of its
// own and never waits. Each inner step is one step_atom message it sends
// itself, so fragment updates and round openings that arrived meanwhile are
// handled between two steps, in arrival order.

#include <chrono>

#include "learner/learner_core.hpp"
#include "node/mesh_actors.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {
namespace {

using namespace transport;

struct learner_state {
  std::unique_ptr<engine> eng;
  std::unique_ptr<learner_core> core;
  std::unique_ptr<node_transport> wire;
  std::size_t to_install = 0;
  bool stepping = false, done = false;
  tensor_encoding encoding = tensor_encoding::fp32;
  static inline const char* name = "learner";
};

caf::behavior learner_actor(caf::stateful_actor<learner_state, caf::event_based_actor>* self,
                            const mesh_setup* setup, std::uint32_t index, const dataset* data, mesh_stats* stats,
                            const clock_source* clock) {
  auto& st = self->state;
  const node_address me{role::learner, index};
  set_compute_threads(setup->cfg.train.threads);
  config cfg = setup->cfg;
  cfg.train.seed = derive_seed(setup->cfg.train.seed, 1000 + index);  // own batches
  st.eng = std::make_unique<engine>(cfg, setup->shape, *data, static_cast<int>(index));
  const double mix = setup->cfg.mesh.mix >= 0 ? setup->cfg.mesh.mix : (setup->cfg.mesh.mode == "streaming" ? 0.5 : 0.0);
  st.core = std::make_unique<learner_core>(setup->layout, setup->plan, learner_sync_config{mix, 64});
  st.encoding = *parse_tensor_encoding(setup->cfg.wire.encoding);
  st.wire = start_mesh_wire(self, *setup, me, setup->learner_endpoints[index], *clock);
  if (!st.wire) return {};
  (void)st.wire->add_peer(broker_address, setup->broker_endpoint);
  for (std::uint32_t s = 0; s < setup->shard_endpoints.size(); ++s)
    (void)st.wire->add_peer({role::parameter_shard, s}, setup->shard_endpoints[s]);

  // Clone pattern: subscribe (the shard adds us to its broadcast list) and fetch.
  st.to_install = setup->plan.fragments.size();
  for (std::uint32_t p = 0; p < setup->plan.fragments.size(); ++p) {
    auto b = st.wire->make_envelope();
    auto f = b.body().initFetchFragment();
    f.setFragment(p);
    f.setReplyEndpoint(setup->learner_endpoints[index]);
    (void)st.wire->send({role::parameter_shard, setup->shard_of_fragment[p]}, b.finish());
  }
  {
    auto b = st.wire->make_envelope();
    auto j = b.body().initJoin();
    j.setLayoutFingerprint(setup->layout.fingerprint());
    j.setBatchTokens(static_cast<std::uint32_t>(st.eng->tokens_per_step()));
    j.setThreads(static_cast<std::uint16_t>(setup->cfg.train.threads));
    j.setEndpoint(setup->learner_endpoints[index]);
    (void)st.wire->send(broker_address, b.finish());
  }

  return {
      [self, setup, stats, clock](step_atom) {
        auto& st = self->state;
        if (st.done) return;
        if (st.eng->steps_done() >= setup->cfg.train.steps) {
          st.done = true;
          auto b = st.wire->make_envelope();
          b.body().initLeave().setReason("steps done");
          (void)st.wire->send(broker_address, b.finish());
          ++stats->learners_done;
          return;
        }
        const nanos t0 = clock->now();
        st.eng->step();
        const nanos step_ns = clock->now() - t0;
        st.core->on_step(static_cast<std::uint64_t>(st.eng->tokens_per_step()));
        ++stats->steps;
        stats->tokens += static_cast<std::uint64_t>(st.eng->tokens_per_step());
        auto b = st.wire->make_envelope();
        auto p = b.body().initProgress();
        p.setStep(static_cast<std::uint64_t>(st.eng->steps_done()));
        p.setStepTimeNs(static_cast<std::uint64_t>(step_ns));
        (void)st.wire->send(broker_address, b.finish());
        while (auto c = st.core->next_contribution(st.eng->model().params())) {
          auto cb = st.wire->make_envelope(c->round.value);
          auto body = cb.body().initContribution();
          body.setFragment(c->fragment.value);
          body.setAnchorVersion(c->anchor_version);
          body.setSteps(c->steps);
          body.setTokens(c->tokens);
          if (!cb.add_tensor_values("delta/" + std::to_string(c->fragment.value), c->delta.data(), c->delta.size(),
                                    st.encoding, static_cast<std::uint32_t>(setup->cfg.wire.block_size)))
            continue;  // a non-finite delta is never sent
          stats->bytes_sent += c->delta.size() * 4;
          (void)st.wire->send({role::parameter_shard, setup->shard_of_fragment[c->fragment.value]}, cb.finish());
        }
        self->send(self, step_atom::value);
      },
      [self](const inbound_ptr& m) {
        auto& st = self->state;
        const auto& env = *m->envelope;
        auto body = env.root().getBody();
        if (env.body() == wire::Envelope::Body::ROUND_OPEN) {
          st.core->on_round_open(round_number{env.header().getRound()}, {body.getRoundOpen().getFragment()});
        } else if (env.body() == wire::Envelope::Body::FRAGMENT_UPDATE && env.tensor_count() == 1) {
          auto u = body.getFragmentUpdate();
          const fragment_index p{u.getFragment()};
          if (p.value >= st.core->fragments() || env.tensor_info(0).getElementCount() != st.core->fragment_floats(p))
            return;
          std::vector<float> value(st.core->fragment_floats(p));
          if (!env.decode_tensor_values(0, value.data())) return;
          if (!st.core->installed(p)) {
            st.core->install(p, u.getVersion(), value, st.eng->model().params());
            if (--st.to_install == 0 && !st.stepping) {
              st.stepping = true;
              self->send(self, step_atom::value);
            }
          } else {
            st.core->on_fragment_update(p, u.getVersion(), value, st.eng->model().params());
          }
        }
      },
  };
}

}  // namespace

caf::actor spawn_learner(caf::actor_system& sys, const mesh_setup& setup, std::uint32_t index, const dataset& data,
                         mesh_stats& stats, const clock_source& clock) {
  return sys.spawn<caf::detached>(learner_actor, &setup, index, &data, &stats, &clock);
}

}  // namespace archipelago
