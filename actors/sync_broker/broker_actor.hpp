#pragma once
// The sync broker's actor shell (event-based): ticks, its node transport, its
// store and its status; everything it hears goes to broker_wire.

#include <caf/fwd.hpp>

#include <memory>
#include <optional>

#include "core/clock.hpp"
#include "core/log.hpp"
#include "core/ids.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/io_context.hpp"

namespace archipelago {

/// What the broker's actor is given; the pointers outlive it.
struct broker_actor_args {
  const mesh_setup* setup = nullptr;
  transport::io_context io;  // the process's transport context
  const clock_source* clock = nullptr;
  logger* logs = nullptr;  // where its lines go (the process's logger, rate-limited by kind)
  incarnation inc{1};
  /// Which broker it is: 0 the primary, 1, 2, ... the standbys (mesh_setup::standby_endpoints).
  std::uint32_t index = 0;
  /// The tape and the ledger go here; null: no snapshots.
  storage::snapshot_writer* writer = nullptr;
  /// A resumed run's starting point: rounds are numbered after the ones it names.
  std::optional<storage::manifest> resume_from;
  /// A node broker on its own store (`node --role broker --db`): restores the
  /// ledger and the round lease its predecessor wrote, and leases round numbers ahead.
  bool recovery = false;
  /// Where its status goes: every 250 ms, and its final report when asked (report_atom).
  status_board* board = nullptr;
};

/// Spawns the broker. It answers metrics_atom, status_atom and report_atom.
caf::actor spawn_broker(caf::actor_system& sys, broker_actor_args args);

}  // namespace archipelago
