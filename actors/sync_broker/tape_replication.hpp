#pragma once
// The tape as the leading broker copies it to each standby, and as a standby
// takes it in. The leader keeps its tape (what its store held when it began
// to lead, then every round it commits) as a numbered log and sends each
// standby the records after those it acknowledged; the standby stores them in
// order, skips rounds its store already holds, and acknowledges how far it
// got (BrokerState.tapeFrom, Ack.sequence). A standby that was unreachable,
// restarted or lost its store catches up from where it stands, at most
// `budget_bytes` per copy so that a long tape does not crowd the control lane.
// Pure: no sockets, no clock reads.

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/clock.hpp"

namespace archipelago {

/// The leader's side: its tape as a log, and how far each standby has it.
class tape_log {
 public:
  /// The log keeps the newest `capacity` records; a standby further behind gets
  /// only those (the rest are counted as skipped on its side).
  static constexpr std::size_t capacity = std::size_t{1} << 18;

  /// `resend_after`: a standby that acknowledged nothing new this long after being
  /// sent more is sent again from its acknowledgement (a copy was lost).
  explicit tape_log(nanos resend_after) : resend_after_(resend_after) {}

  /// A record (storage::encode_record of a tape_record) of round `round`.
  void append(std::uint64_t round, std::string record);

  struct chunk {
    std::uint64_t from = 0;    // the log index of records.front()
    std::uint64_t oldest = 0;  // the oldest index the log still holds
    std::vector<const std::string*> records;  // valid until the next append
  };
  /// What to send `standby` now: the records after those sent to it, up to
  /// `budget_bytes` (at least one record when any is due).
  chunk next_for(std::uint32_t standby, std::size_t budget_bytes, nanos now);
  /// The standby holds every record below `next` (its acknowledgement). A lower
  /// value than before: it restarted; it is sent again from there.
  void on_ack(std::uint32_t standby, std::uint64_t next, nanos now);
  /// A new connection to the standby: what was queued on the old one may be gone.
  void on_reconnect(std::uint32_t standby);

  std::uint64_t end() const { return base_ + records_.size(); }
  /// The rounds the log holds (a leader stepping down keeps them as its own: it will not store them twice).
  std::vector<std::uint64_t> rounds() const;
  /// Acknowledged by `standby` (0: nothing yet).
  std::uint64_t acknowledged(std::uint32_t standby) const;

 private:
  struct cursor {
    std::uint64_t sent = 0, acked = 0;
    nanos progress_ns = 0;  // when `acked` last grew or the cursor went back
  };
  const nanos resend_after_;
  std::uint64_t base_ = 0;  // the index of records_.front()
  std::deque<std::pair<std::uint64_t, std::string>> records_;  // (round, record)
  std::map<std::uint32_t, cursor> standbys_;
};

/// The standby's side: which of a BrokerState's tape records to store, and what to acknowledge.
class tape_intake {
 public:
  /// Rounds remembered as held, newest kept; a record of an older round than all of them is taken as held.
  static constexpr std::size_t remembered_rounds = std::size_t{1} << 20;

  /// The rounds its store holds already (read at start).
  explicit tape_intake(const std::vector<std::uint64_t>& held_rounds);

  struct accepted {
    std::size_t first = 0;  // the first record of the message to take (== count: none)
    std::uint64_t ack = 0;  // acknowledge this (the log index after the last one it has)
  };
  /// A BrokerState of the leader of `epoch` carrying `count` tape records from log
  /// index `from`, the leader holding nothing older than `oldest`. A new epoch
  /// is a new leader's log: counted from 0 again.
  accepted on_state(std::uint64_t epoch, std::uint64_t from, std::uint64_t oldest, std::size_t count);
  /// True the first time `round` is seen (store it), false for a round held already.
  bool first_time(std::uint64_t round);
  /// Rounds this standby led and stored itself.
  void held(const std::vector<std::uint64_t>& rounds);
  /// Records the leader no longer held when this standby asked for them.
  std::uint64_t skipped() const { return skipped_; }

 private:
  std::uint64_t epoch_ = 0, next_ = 0, skipped_ = 0;
  std::set<std::uint64_t> rounds_;
};

}  // namespace archipelago
