#pragma once
// What every node of a mesh must agree on, derived from the configuration: the
// model layout, the fragment plan, which shard owns which fragment and where
// each node listens. Every role is given one; nothing in it changes while the
// mesh runs.

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/ids.hpp"
#include "core/layout.hpp"

namespace archipelago {

/// The mesh has one sync broker, at this address.
inline constexpr node_address broker_address{role::sync_broker, 0};

struct mesh_setup {
  config cfg;
  sync_policy policy;
  model_shape shape;
  param_layout layout;
  fragment_plan plan;
  std::vector<std::uint32_t> shard_of_fragment;
  std::string broker_endpoint;
  std::vector<std::string> shard_endpoints;
  std::vector<std::string> learner_endpoints;
  std::int64_t start_step = 0;  // a resumed run: where the learners' schedule starts

  std::size_t fragments() const { return plan.fragments.size(); }
  /// The fragments parameter shard `shard` owns, ascending.
  std::vector<fragment_index> fragments_of(std::uint32_t shard) const;
};

/// Everything a mesh agrees on but the endpoints, from the configuration and
/// its resolved policy (resolve_policy(cfg)).
mesh_setup make_mesh_setup(const config& cfg, const sync_policy& policy);

}  // namespace archipelago
