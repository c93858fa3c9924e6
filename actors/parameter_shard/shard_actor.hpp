#pragma once
// The parameter shard's actor shell (event-based): its node transport, its
// snapshots (restore at start, commits on the writer's thread), its disk faults
// and its status; every message goes to shard_wire.

#include <caf/fwd.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/clock.hpp"
#include "core/log.hpp"
#include "core/ids.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/io_context.hpp"

namespace archipelago {

/// What a shard's actor is given; the pointers outlive it.
struct shard_actor_args {
  const mesh_setup* setup = nullptr;
  std::uint32_t index = 0;
  const std::vector<float>* initial = nullptr;  // the initial global model, laid out by the layout
  /// Called once the shard has taken its fragments from `initial` (a node process
  /// frees the whole model then: a shard keeps only its own). May be empty.
  std::function<void()> initial_used;
  transport::io_context io;          // the process's transport context
  const clock_source* clock = nullptr;
  logger* logs = nullptr;  // where its lines go (the process's logger, rate-limited by kind)
  incarnation inc{1};
  /// Commits go here (with no snapshot to resume from, the initial state first); null: no snapshots.
  storage::snapshot_writer* writer = nullptr;
  bool record_contributions = false;  // record what every merge merged (replay verify)
  /// Resume every owned fragment from this manifest of `restore_store`.
  const storage::snapshot_store* restore_store = nullptr;
  std::optional<storage::manifest> resume_from;
  /// Fragment states already read and verified (a recovery's head): those that
  /// `resume_from` names are taken from here, not read again. May be null.
  const std::vector<storage::fragment_state>* restored = nullptr;
  /// For manifests: the learners' mean inner steps and the tokens they processed. May be empty.
  std::function<std::uint64_t()> learner_steps, tokens;
  /// The store's writes fail (true) or work again (false): the chaos monkey's
  /// storage fault, carried out on the disk this process owns. Empty where
  /// shards share a store (one process): the fault then fails this shard's
  /// commits alone, as its own disk would.
  std::function<void(bool failing)> set_storage_failing;
  /// Where its status goes, after every message and commit.
  status_board* board = nullptr;
};

/// Spawns the shard. It answers metrics_atom and values_atom (its fragments' Θ).
caf::actor spawn_shard(caf::actor_system& sys, shard_actor_args args);

}  // namespace archipelago
