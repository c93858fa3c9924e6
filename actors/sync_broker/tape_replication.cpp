#include "sync_broker/tape_replication.hpp"

#include <algorithm>

namespace archipelago {

void tape_log::append(std::uint64_t round, std::string record) {
  records_.emplace_back(round, std::move(record));
  if (records_.size() > capacity) {
    records_.pop_front();
    ++base_;
  }
}

tape_log::chunk tape_log::next_for(std::uint32_t standby, std::size_t budget_bytes, nanos now) {
  cursor& c = standbys_[standby];
  if (c.sent > c.acked && now - c.progress_ns > resend_after_) {  // a copy went missing: from the acknowledgement
    c.sent = c.acked;
    c.progress_ns = now;
  }
  chunk out;
  out.oldest = base_;
  out.from = std::max(c.sent, base_);
  std::size_t bytes = 0;
  for (std::uint64_t i = out.from; i < end(); ++i) {
    const std::string& r = records_[i - base_].second;
    if (!out.records.empty() && bytes + r.size() > budget_bytes) break;
    bytes += r.size();
    out.records.push_back(&r);
  }
  if (!out.records.empty() && c.sent <= c.acked) c.progress_ns = now;  // the resend clock starts with the first unacknowledged copy
  c.sent = out.from + out.records.size();
  return out;
}

void tape_log::on_ack(std::uint32_t standby, std::uint64_t next, nanos now) {
  cursor& c = standbys_[standby];
  if (next > end()) return;  // not an index of this log: ignored
  if (next < c.acked) {      // it restarted (or lost its store): send again from where it stands
    c.acked = c.sent = next;
    c.progress_ns = now;
    return;
  }
  if (next > c.acked) c.progress_ns = now;
  c.acked = next;
  c.sent = std::max(c.sent, next);
}

void tape_log::on_reconnect(std::uint32_t standby) {
  cursor& c = standbys_[standby];
  c.sent = c.acked;
}

std::vector<std::uint64_t> tape_log::rounds() const {
  std::vector<std::uint64_t> out;
  out.reserve(records_.size());
  for (const auto& [round, record] : records_) out.push_back(round);
  return out;
}

std::uint64_t tape_log::acknowledged(std::uint32_t standby) const {
  const auto it = standbys_.find(standby);
  return it == standbys_.end() ? 0 : it->second.acked;
}

tape_intake::tape_intake(const std::vector<std::uint64_t>& held_rounds) { held(held_rounds); }

tape_intake::accepted tape_intake::on_state(std::uint64_t epoch, std::uint64_t from, std::uint64_t oldest,
                                            std::size_t count) {
  if (epoch > epoch_) {
    epoch_ = epoch;
    next_ = 0;
  }
  if (epoch < epoch_) return {count, next_};  // a deposed leader's copy: not its log
  if (from > next_) {
    if (from != oldest) return {count, next_};  // a gap (a copy lost): the leader sends again from next_
    skipped_ += from - next_;                   // the leader holds nothing older
    next_ = from;
  }
  const std::uint64_t end = from + count;
  if (end <= next_) return {count, next_};  // all held already
  const std::size_t first = static_cast<std::size_t>(next_ - from);
  next_ = end;
  return {first, next_};
}

bool tape_intake::first_time(std::uint64_t round) {
  if (rounds_.size() >= remembered_rounds && round < *rounds_.begin()) return false;
  if (!rounds_.insert(round).second) return false;
  if (rounds_.size() > remembered_rounds) rounds_.erase(rounds_.begin());
  return true;
}

void tape_intake::held(const std::vector<std::uint64_t>& rounds) {
  for (std::uint64_t r : rounds) rounds_.insert(r);
  while (rounds_.size() > remembered_rounds) rounds_.erase(rounds_.begin());
}

}  // namespace archipelago
