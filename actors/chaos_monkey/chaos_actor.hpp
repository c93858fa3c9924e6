#pragma once
// The chaos monkey's actor shell (detached: process faults may block it
// briefly): its own node transport and its clock; chaos_wire decides.

#include <caf/fwd.hpp>

#include <memory>
#include <string>
#include <vector>

#include "chaos_monkey/chaos_wire.hpp"
#include "core/clock.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "transport/io_context.hpp"

namespace archipelago {

/// What the chaos monkey's actor is given; the pointers outlive it.
struct chaos_actor_args {
  const mesh_setup* setup = nullptr;
  transport::io_context io;  // the process's transport context
  const clock_source* clock = nullptr;
  logger* logs = nullptr;  // where its lines go (the process's logger, rate-limited by kind)
  std::string endpoint;                // where it listens (nobody calls it)
  std::vector<planned_fault> timeline;
  nanos safety_ns = 0;
  process_control* control = nullptr;
  chaos_log* log = nullptr;  // its start (the drill clock's zero) and what it did
};

caf::actor spawn_chaos_monkey(caf::actor_system& sys, chaos_actor_args args);

}  // namespace archipelago
