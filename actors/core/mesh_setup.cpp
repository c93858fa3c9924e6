#include "core/mesh_setup.hpp"

namespace archipelago {

std::vector<fragment_index> mesh_setup::fragments_of(std::uint32_t shard) const {
  std::vector<fragment_index> owned;
  for (std::uint32_t p = 0; p < shard_of_fragment.size(); ++p)
    if (shard_of_fragment[p] == shard) owned.push_back({p});
  return owned;
}

mesh_setup make_mesh_setup(const config& cfg, const sync_policy& policy) {
  mesh_setup setup;
  setup.cfg = cfg;
  setup.policy = policy;
  setup.shape = *resolve_model(cfg.model);
  setup.layout = *resolve_layout(cfg);
  setup.plan = *make_fragment_plan(setup.layout, policy.fragments);
  setup.shard_of_fragment =
      round_robin_shards(static_cast<int>(setup.plan.fragments.size()), static_cast<std::uint32_t>(policy.shards));
  return setup;
}

}  // namespace archipelago
