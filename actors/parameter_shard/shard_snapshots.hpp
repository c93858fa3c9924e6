#pragma once
// A shard's fragment state as the snapshot store keeps it (storage/FORMAT.md),
// and back.

#include <cstdint>
#include <vector>

#include "core/ids.hpp"
#include "core/mesh_setup.hpp"
#include "parameter_shard/shard_core.hpp"
#include "storage/snapshot_store.hpp"

namespace archipelago {

storage::fragment_state stored_state(fragment_index p, fragment_outer_state&& s, std::int64_t time_ns);
fragment_outer_state outer_state_of(storage::fragment_state&& f);

/// The initial outer state of every fragment (version 0), as the shards start it from `params`.
storage::commit_job initial_commit(const mesh_setup& setup, const std::vector<float>& params);

}  // namespace archipelago
