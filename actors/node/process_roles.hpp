#pragma once
// What the roles of one process share — the actor system, the mesh setup, the
// transport context, the clock, the logger, the status board, the snapshot writer — and
// the spawning of each role from it, at the start and on a drill's restart.

#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/clock.hpp"
#include "core/ids.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/io_context.hpp"

namespace archipelago {

struct dataset;

struct process_roles {
  caf::actor_system& sys;
  const mesh_setup& setup;
  transport::io_context io;
  const clock_source& clock;
  logger& log;
  status_board& board;
  const dataset* data = nullptr;               // learners
  const std::vector<float>* initial = nullptr;  // shards: the initial global model
  // shards: called once one has taken its fragments from `initial`
  std::function<void()> initial_used = {};
  // snapshots (null writer: none)
  storage::snapshot_writer* writer = nullptr;
  bool record_contributions = false;
  const storage::snapshot_store* restore_store = nullptr;  // shards resume from a manifest of it
  const std::vector<storage::fragment_state>* restored = nullptr;  // its head's states, read by the recovery
  std::function<std::uint64_t()> learner_steps{}, tokens{};  // for manifests; may be empty
  std::function<void(bool failing)> set_storage_failing{}; // the chaos monkey's disk faults; may be empty
  /// Brokers with a store of their own (a mesh with standbys in one process, as
  /// `node --role broker --db` each): broker b writes through broker_writers[b]
  /// (null: none, its host lost); beyond the vector, brokers write through `writer`.
  std::vector<storage::snapshot_writer*> broker_writers{};

  /// Learner `index`; its schedule starts at `start_step` (-1: the setup's).
  caf::actor learner(std::uint32_t index, incarnation inc = incarnation{1}, std::int64_t start_step = -1) const;
  /// Shard `index`, resuming its fragments from `resume_from` (nullopt: a new store, or none).
  caf::actor shard(std::uint32_t index, incarnation inc, std::optional<storage::manifest> resume_from) const;
  /// The broker; rounds numbered after those of `resume_from` and the tape; `recovery`:
  /// restores what its predecessor stored (a node broker on its own store). `index`: 0
  /// the primary, from 1 a standby.
  caf::actor broker(incarnation inc, std::optional<storage::manifest> resume_from, bool recovery,
                    std::uint32_t index = 0) const;
};

}  // namespace archipelago
