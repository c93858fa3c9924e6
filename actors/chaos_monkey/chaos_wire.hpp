#pragma once
// The chaos monkey's wire layer: walks the fault timeline (chaos_core) and
// carries each injection and repair out. Faults a node carries out itself —
// link shaping and partitions, slow-downs, storage errors — go as ChaosCommand
// envelopes through the message port; process faults (crash, pause, shard and
// broker crashes, a broker's host lost) go to the launcher that owns the
// processes, which also restarts them (a lost host: never). Pure: no CAF, no sockets, no clock reads. The actor shell
// (chaos_actor) and the simulation (tests/sim) both run it.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chaos_monkey/chaos_core.hpp"
#include "core/clock.hpp"
#include "core/mesh_setup.hpp"
#include "transport/chaos_command.hpp"
#include "transport/message_port.hpp"

namespace archipelago {

/// The launcher that owns the mesh's processes (in one process: its actors; in
/// the simulation: its virtual nodes). Calls may block briefly.
class process_control {
 public:
  virtual ~process_control() = default;
  virtual void crash(const fault_target& target) = 0;    // SIGKILL (an actor kill)
  virtual void restart(const fault_target& target) = 0;  // a new incarnation of it
  /// SIGSTOP now and SIGCONT after `duration` (the launcher resumes it itself).
  virtual void pause(const fault_target& target, nanos duration) = 0;
  /// Its host is lost: SIGKILL, and its store removed. Never restarted.
  virtual void lose_host(const fault_target& target) = 0;
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

  /// Time since the chaos monkey started, on the clock its start was read from; 0 before.
  nanos since_start(nanos now) const {
    std::lock_guard lock(mutex);
    return started_ns < 0 ? nanos{0} : now - started_ns;
  }
};

class chaos_wire {
 public:
  /// `setup`, `port`, `control` and `log` outlive it.
  chaos_wire(const mesh_setup& setup, std::vector<planned_fault> timeline, nanos safety_ns,
             transport::message_port& port, process_control& control, chaos_log& log);

  /// Registers every node of the mesh as a peer.
  void start();
  /// Carries out what is due `since_start` into the drill, records it and what is
  /// down now. Returns when it next has something to do (since the start); -1
  /// once every fault is repaired and every node told to heal.
  nanos tick(nanos since_start);

  /// A restarted node's transport has its default links and its learner no
  /// slow-down: the faults in force that concern it (slow-downs, link faults,
  /// partitions) are sent to it again. Called after every restart it orders; a
  /// launcher whose restarts start later calls it again once the node is up.
  /// (A storage fault is not sent again: it ends with the process whose writes
  /// it failed, as a failed disk replaced with its host would.)
  void reapply(const fault_target& restarted);

  const chaos_core& core() const { return core_; }

 private:
  void reconnect(node_address n);
  void command(node_address target, const chaos_order& order);
  void shape_between(const std::vector<node_address>& a, const std::vector<node_address>& b,
                     const link_profile& profile);
  void carry_out(const chaos_action& a, nanos since_start);
  /// Carries out fault `f`'s shaping (slow-downs, link faults, partitions) again, only
  /// on what concerns `node`; `inject` false restores the normal link instead.
  void shape(const planned_fault& f, bool inject, std::optional<node_address> only);
  void count_down();

  const mesh_setup& setup_;
  chaos_core core_;
  const nanos safety_ns_;
  transport::message_port& port_;
  process_control& control_;
  chaos_log& log_;
  std::vector<bool> active_;  // per fault of the timeline: injected, not yet repaired
};

/// One line for a fault: "crash learner/2 for 3.2s", "partition {learner/0} | {broker, shard/0}".
std::string describe(const planned_fault& fault);

}  // namespace archipelago
