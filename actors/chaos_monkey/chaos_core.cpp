#include "chaos_monkey/chaos_core.hpp"

#include <algorithm>

namespace archipelago {

const char* to_string(chaos_action::what w) {
  switch (w) {
    case chaos_action::what::inject: return "inject";
    case chaos_action::what::repair: return "repair";
    case chaos_action::what::skip: return "skip";
  }
  return "?";
}

chaos_core::chaos_core(std::vector<planned_fault> timeline, nanos safety_ns)
    : timeline_(std::move(timeline)), safety_ns_(safety_ns), repair_at_(timeline_.size(), -1) {}

bool chaos_core::is_process_fault(fault_kind k) {
  return k == fault_kind::crash || k == fault_kind::pause || k == fault_kind::shard_crash ||
         k == fault_kind::broker_crash || k == fault_kind::broker_host_lost;
}

bool chaos_core::target_down(const fault_target& t) const {
  for (std::size_t i = 0; i < timeline_.size(); ++i) {
    if (repair_at_[i] < 0 || !is_process_fault(timeline_[i].kind)) continue;
    for (const auto& other : timeline_[i].targets)
      if (other.kind == t.kind && other.index == t.index) return true;
  }
  return false;
}

std::vector<chaos_action> chaos_core::tick(nanos now) {
  std::vector<chaos_action> due;
  for (;;) {
    // The earliest of: the next injection, the earliest repair.
    nanos repair_time = -1;
    std::size_t repair = 0;
    for (std::size_t i = 0; i < repair_at_.size(); ++i)
      if (repair_at_[i] >= 0 && (repair_time < 0 || repair_at_[i] < repair_time)) repair_time = repair_at_[i], repair = i;
    const nanos inject_time = next_inject_ < timeline_.size() ? timeline_[next_inject_].at_ns : -1;
    const bool repair_first = repair_time >= 0 && (inject_time < 0 || repair_time <= inject_time);
    const nanos when = repair_first ? repair_time : inject_time;
    if (when < 0 || when > now) break;
    chaos_action a{chaos_action::what::repair, repair, when};
    if (repair_first) {
      repair_at_[repair] = -1;
    } else {
      const std::size_t i = next_inject_++;
      const planned_fault& f = timeline_[i];
      a.fault = i;
      if (is_process_fault(f.kind) && std::any_of(f.targets.begin(), f.targets.end(),
                                                   [&](const fault_target& t) { return target_down(t); })) {
        a.action = chaos_action::what::skip;
      } else {
        a.action = chaos_action::what::inject;
        // A lost host is never repaired: there is nothing to restart it on (a standby took over).
        if (f.kind != fault_kind::broker_host_lost) repair_at_[i] = std::min(f.at_ns + f.for_ns, std::max(safety_ns_, f.at_ns));
        ++injected_;
      }
    }
    due.push_back(a);
    record_.push_back(a);
  }
  return due;
}

nanos chaos_core::next_due() const {
  nanos next = next_inject_ < timeline_.size() ? timeline_[next_inject_].at_ns : -1;
  for (nanos r : repair_at_)
    if (r >= 0 && (next < 0 || r < next)) next = r;
  return next;
}

bool chaos_core::healed(nanos now) const { return now >= safety_ns_ && active() == 0 && next_inject_ == timeline_.size(); }

std::size_t chaos_core::active() const {
  return static_cast<std::size_t>(std::count_if(repair_at_.begin(), repair_at_.end(), [](nanos r) { return r >= 0; }));
}

int chaos_core::learners_down() const {
  int down = 0;
  for (std::size_t i = 0; i < timeline_.size(); ++i)
    if (repair_at_[i] >= 0 && (timeline_[i].kind == fault_kind::crash || timeline_[i].kind == fault_kind::pause))
      down += static_cast<int>(timeline_[i].targets.size());
  return down;
}

}  // namespace archipelago
