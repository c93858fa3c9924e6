#include "sync_broker/participation.hpp"

#include <algorithm>

namespace archipelago {

void participation_tracker::on_close(std::uint64_t round, std::uint32_t fragment, std::uint32_t live,
                                     const std::vector<learner_ref>& accepted, bool merge, nanos now) {
  participation_round r{round, fragment, live, 0, now};
  if (!merge || accepted.empty()) return settle(r);
  if (pending_.size() >= pending_capacity) {  // the oldest waited longest: it merged nothing we saw
    settle(pending_.begin()->second.r);
    pending_.erase(pending_.begin());
  }
  pending_[round] = {r, accepted};
}

void participation_tracker::on_screened(std::uint64_t round, learner_ref who) {
  if (auto it = pending_.find(round); it != pending_.end()) std::erase(it->second.accepted, who);
}

void participation_tracker::on_published(std::uint64_t round) {
  auto it = pending_.find(round);
  if (it == pending_.end()) return;
  participation_round r = it->second.r;
  r.merged = static_cast<std::uint32_t>(it->second.accepted.size());
  pending_.erase(it);
  settle(r);
}

void participation_tracker::tick(nanos now, nanos settle_ns) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now - it->second.r.closed_ns < settle_ns) {
      ++it;
      continue;
    }
    settle(it->second.r);
    it = pending_.erase(it);
  }
}

void participation_tracker::settle(participation_round r) {
  if (r.live == 0) return;  // nobody could have taken part
  ++rounds_;
  merged_total_ += r.merged;
  live_total_ += r.live;
  share_sum_ += r.share();
  recent_.push_back(r);
  if (recent_.size() > recent_capacity) recent_.pop_front();
}

}  // namespace archipelago
