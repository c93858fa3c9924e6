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

/// A fragment's outer state as the store writes it: its buffers, not a copy (the
/// write keeps them alive; a core's Nesterov buffer must not change before it is done).
storage::fragment_write stored_write(fragment_index p, fragment_outer_state&& s, std::int64_t time_ns);
fragment_outer_state outer_state_of(storage::fragment_state&& f);

/// The initial outer state of `owned` fragments of `core` (version 0) as one commit,
/// copying nothing: Θ is the core's (a merge replaces it, never changes it) and the
/// Nesterov buffer, zero at version 0, one shared buffer of zeros — the core may
/// merge while the commit is written.
storage::commit_job initial_writes(const shard_core& core, const std::vector<fragment_index>& owned,
                                   std::int64_t time_ns);
/// The initial outer state of every fragment (version 0), as the shards start it from `params`,
/// stamped `time_ns` (the wall clock's: the caller reads it, the state core reads no clock).
storage::commit_job initial_commit(const mesh_setup& setup, const std::vector<float>& params, std::int64_t time_ns);

}  // namespace archipelago
