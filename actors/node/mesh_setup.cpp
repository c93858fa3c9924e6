#include "node/mesh_setup.hpp"

#include "learner/model/trainer.hpp"
#include "sync_broker/broker_core.hpp"
#include "transport/transport.hpp"

namespace archipelago {

mesh_setup make_mesh_setup(const config& cfg, const sync_policy& policy) {
  mesh_setup setup;
  setup.cfg = cfg;
  setup.policy = policy;
  setup.shape = *resolve_model(cfg.model);
  setup.layout = make_layout(setup.shape);
  setup.plan = *make_fragment_plan(setup.layout, policy.fragments);
  setup.shard_of_fragment =
      round_robin_shards(static_cast<int>(setup.plan.fragments.size()), static_cast<std::uint32_t>(policy.shards));
  setup.io_context = transport::make_io_context();
  return setup;
}

std::vector<float> initial_global_params(const mesh_setup& setup, const dataset& data) {
  engine init(setup.cfg, setup.shape, data, 0);
  return {init.model().params(), init.model().params() + init.model().buffer_size()};
}

}  // namespace archipelago
