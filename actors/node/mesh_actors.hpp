#pragma once
// The thin CAF shells of the mesh roles. Each owns its pure state core and a
// node_transport; inbound messages arrive in its mailbox (transport/caf_bridge).

#include <caf/all.hpp>

#include "core/clock.hpp"
#include "learner/model/trainer.hpp"
#include "node/mesh_setup.hpp"

namespace archipelago {

using tick_atom = caf::atom_constant<caf::atom("tick")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using values_atom = caf::atom_constant<caf::atom("values")>;

/// The sync broker (event-based). `setup`, `stats` and `clock` outlive it.
caf::actor spawn_broker(caf::actor_system& sys, const mesh_setup& setup, mesh_stats& stats,
                        const clock_source& clock);
/// Parameter shard `index` (event-based); answers values_atom with its fragments' Θ.
caf::actor spawn_shard(caf::actor_system& sys, const mesh_setup& setup, std::uint32_t index,
                       const std::vector<float>& initial_params, mesh_stats& stats, const clock_source& clock);
/// Learner `index` (detached: its compute has a thread of its own). It trains
/// `steps` inner steps, then leaves; `data` outlives it.
caf::actor spawn_learner(caf::actor_system& sys, const mesh_setup& setup, std::uint32_t index,
                         const dataset& data, mesh_stats& stats, const clock_source& clock);

}  // namespace archipelago
