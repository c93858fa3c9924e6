#pragma once
// The learner's actor shell: a detached actor, since its compute has a thread
// of its own. Each inner step is one step_atom message it sends itself, so
// fragment updates and round openings that arrived meanwhile are handled
// between two steps, in arrival order. Under decoupled it never waits; the
// synchronous policies park it (no step_atom) until the awaited fragment
// arrives. Messages go to learner_wire; the shell steps the model and paces it.

#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>

#include "core/clock.hpp"
#include "core/log.hpp"
#include "core/ids.hpp"
#include "core/mesh_setup.hpp"
#include "transport/io_context.hpp"
#include "core/node_status.hpp"

namespace archipelago {

struct dataset;

/// What a learner's actor is given; the pointers outlive it.
struct learner_actor_args {
  const mesh_setup* setup = nullptr;
  std::uint32_t index = 0;
  const dataset* data = nullptr;
  transport::io_context io;  // the process's transport context
  const clock_source* clock = nullptr;
  logger* logs = nullptr;  // where its lines go (the process's logger, rate-limited by kind)
  /// A restarted learner has a higher incarnation (and draws new batches).
  incarnation inc{1};
  /// Where its learning-rate schedule starts (>= 0); -1: setup->start_step.
  std::int64_t start_step = -1;
  /// Where its status goes, after every step.
  status_board* board = nullptr;
};

/// Spawns the learner: it trains up to setup->last_step() of the schedule, then
/// leaves. stop_atom makes it leave after its current step (its last Progress
/// and contributions go out first); pause_atom freezes it for a duration (a
/// one-process SIGSTOP). It answers metrics_atom.
caf::actor spawn_learner(caf::actor_system& sys, learner_actor_args args);

}  // namespace archipelago
