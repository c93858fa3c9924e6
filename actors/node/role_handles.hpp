#pragma once
// The roles a process runs, as it talks to them: asking learners to leave,
// the pages of its metrics port (/metrics from every role, /node from its
// status board, /status from the broker).

#include <caf/all.hpp>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/node_status.hpp"
#include "node/metrics_server.hpp"

namespace archipelago {

/// Asks running learners to leave after their current step (stop_atom) and
/// waits, bounded, until `board` shows them all left; then gives their Leave
/// and last Progress a moment to reach the broker.
void stop_learners(caf::scoped_actor& self, const std::vector<caf::actor>& learners, const status_board& board);

/// Ends every actor of `actors` (user_shutdown) and waits, bounded, until each is down.
void end_actors(caf::scoped_actor& self, const std::vector<caf::actor>& actors,
                std::chrono::seconds bound = std::chrono::seconds(30));

/// The roles of a process that its metrics server asks, filled in once they are
/// spawned (the server is bound before: a port in use stops nothing).
struct served_roles {
  std::mutex mutex;
  std::vector<caf::actor> roles;  // guarded by mutex
  caf::actor broker;              // /status; guarded by mutex; none: 404
  const status_board* board = nullptr;  // /node

  void set(std::vector<caf::actor> all, caf::actor status_source);
  /// The handlers of a metrics_server; `sys` and this outlive it.
  metrics_server::handlers pages(caf::actor_system& sys, bool with_status);
};

}  // namespace archipelago
