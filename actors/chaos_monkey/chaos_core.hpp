#pragma once
// The chaos monkey's state core (pure, deterministic): walks a fault timeline
// (expand_fault_plan) and says, for a time since the drill's start, which faults
// to inject and which to repair now. Every fault is repaired after its `for`,
// and at the latest when the safety phase ends (the heal before the liveness
// phase) — but a lost host (broker_host_lost), which is never repaired. A process fault on a target whose process is already down is skipped
// (and recorded): a crashed learner cannot be paused. The record of what was
// done is the drill report's timeline.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chaos_monkey/fault_plan.hpp"

namespace archipelago {

struct chaos_action {
  enum class what : std::uint8_t { inject, repair, skip };
  what action = what::inject;
  std::size_t fault = 0;  // index into the timeline
  nanos at_ns = 0;        // when it is due (since the start)
};
const char* to_string(chaos_action::what w);

class chaos_core {
 public:
  chaos_core(std::vector<planned_fault> timeline, nanos safety_ns);

  /// The actions due at or before `now` (since the start), in time order; each once.
  std::vector<chaos_action> tick(nanos now);

  /// The next time tick() has something to do; -1 when nothing is left.
  nanos next_due() const;
  /// The safety phase is over and every fault is repaired.
  bool healed(nanos now) const;

  const std::vector<planned_fault>& timeline() const { return timeline_; }
  const std::vector<chaos_action>& record() const { return record_; }
  std::size_t injected() const { return injected_; }
  std::size_t active() const;
  /// Learners whose process is down (crashed or paused) right now.
  int learners_down() const;

 private:
  static bool is_process_fault(fault_kind k);
  bool target_down(const fault_target& t) const;

  std::vector<planned_fault> timeline_;
  nanos safety_ns_;
  std::size_t next_inject_ = 0;
  std::vector<nanos> repair_at_;  // per fault: -1 not injected (or skipped / repaired)
  std::vector<chaos_action> record_;
  std::size_t injected_ = 0;
};

}  // namespace archipelago
