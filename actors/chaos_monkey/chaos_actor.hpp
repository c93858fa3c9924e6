#pragma once
// The chaos monkey's CAF shell: a role of its own that walks a fault timeline
// (chaos_core) in real time. Faults a node carries out itself — link shaping
// and partitions, slow-downs, storage errors — travel as ChaosCommand messages
// over the mesh's own wire; process faults (crash, pause, shard and broker
// crashes) go to the launcher that owns the processes, which also restarts them.

#include <caf/all.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "chaos_monkey/chaos_core.hpp"
#include "core/clock.hpp"
#include "node/mesh_setup.hpp"

namespace archipelago {

/// The launcher that owns the mesh's processes (in one process: its actors).
/// Calls come from the chaos monkey's own thread and may block briefly.
class process_control {
 public:
  virtual ~process_control() = default;
  virtual void crash(const fault_target& target) = 0;    // SIGKILL (an actor kill)
  virtual void restart(const fault_target& target) = 0;  // a new incarnation of it
  /// SIGSTOP now and SIGCONT after `duration` (the launcher resumes it itself).
  virtual void pause(const fault_target& target, nanos duration) = 0;
};

/// One line of the drill's timeline.
struct chaos_event {
  nanos at_ns = 0;  // since the drill's start
  chaos_action::what action = chaos_action::what::inject;
  std::size_t fault = 0;  // index into the timeline
};

/// What the chaos monkey did and what is down right now; shared with the drill.
struct chaos_log {
  mutable std::mutex mutex;
  std::vector<chaos_event> events;  // guarded by mutex
  nanos started_ns = -1;            // the drill clock's zero (the chaos monkey's start); guarded
  std::atomic<bool> healed{false};  // the safety phase is over and every fault repaired
  // Down right now (process faults; learners also when partitioned away from the broker).
  std::atomic<int> learners_down{0};
  std::atomic<bool> broker_down{false};
  std::atomic<int> shards_down{0};
  std::atomic<std::uint64_t> commands_sent{0}, commands_failed{0};
};

/// Starts the chaos monkey (detached: process faults may block it briefly). It
/// listens at `endpoint`, sends its commands to the nodes `setup` lists, and
/// records into `log`; `control`, `log`, `setup` and `clock` outlive it.
caf::actor spawn_chaos_monkey(caf::actor_system& sys, const mesh_setup& setup, std::string endpoint,
                              std::vector<planned_fault> timeline, nanos safety_ns, process_control& control,
                              chaos_log& log, const clock_source& clock);

/// One line for a fault: "crash learner/2 for 3.2s", "partition {learner/0} | {broker, shard/0}".
std::string describe(const planned_fault& fault);

}  // namespace archipelago
