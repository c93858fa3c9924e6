#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "sync_broker/tape_replication.hpp"

namespace archipelago {
namespace {

constexpr nanos resend_ns = 3'000'000'000;

std::string record_of(std::uint64_t round) { return "round-" + std::to_string(round); }

tape_log log_of(std::uint64_t rounds) {
  tape_log log(resend_ns);
  for (std::uint64_t r = 0; r < rounds; ++r) log.append(r, record_of(r));
  return log;
}

/// What a standby keeps of one copy: the rounds it stores (each once), and its acknowledgement.
std::uint64_t deliver(const tape_log::chunk& c, std::uint64_t epoch, tape_intake& intake,
                      std::vector<std::uint64_t>& stored) {
  const tape_intake::accepted take = intake.on_state(epoch, c.from, c.oldest, c.records.size());
  for (std::size_t i = take.first; i < c.records.size(); ++i) {
    const std::uint64_t round = std::stoull(c.records[i]->substr(6));
    if (intake.first_time(round)) stored.push_back(round);
  }
  return take.ack;
}

std::vector<std::uint64_t> iota(std::uint64_t from, std::uint64_t to) {
  std::vector<std::uint64_t> v;
  for (std::uint64_t r = from; r < to; ++r) v.push_back(r);
  return v;
}

}  // namespace

TEST_CASE("tape replication: copies go out in order within the budget, each record once") {
  tape_log log = log_of(10);
  tape_intake intake({});
  std::vector<std::uint64_t> stored;
  nanos now = 0;
  // A budget of two records a copy: five copies, each acknowledged.
  for (int copy = 0; copy < 5; ++copy) {
    const tape_log::chunk c = log.next_for(1, 2 * record_of(0).size(), now);
    CHECK(c.records.size() == 2);
    log.on_ack(1, deliver(c, 7, intake, stored), now += 1'000'000);
  }
  CHECK(log.next_for(1, 1024, now).records.empty());
  CHECK(stored == iota(0, 10));
  CHECK(log.acknowledged(1) == 10);
}

TEST_CASE("tape replication: a lost copy is sent again from the acknowledgement, and a gap is not stored") {
  tape_log log = log_of(4);
  tape_intake intake({});
  std::vector<std::uint64_t> stored;
  nanos now = 0;
  (void)log.next_for(1, 2 * record_of(0).size(), now);  // rounds 0, 1: lost on the way
  const tape_log::chunk second = log.next_for(1, 2 * record_of(0).size(), now);
  CHECK(second.from == 2);
  // The standby got only the second: a gap, nothing stored, it acknowledges 0.
  log.on_ack(1, deliver(second, 7, intake, stored), now);
  CHECK(stored.empty());
  CHECK(log.next_for(1, 1024, now + resend_ns / 2).records.empty());  // not yet: the copy may be in flight
  const tape_log::chunk again = log.next_for(1, 1024, now + resend_ns + 1);
  CHECK(again.from == 0);
  CHECK(again.records.size() == 4);
  log.on_ack(1, deliver(again, 7, intake, stored), now + resend_ns + 2);
  CHECK(stored == iota(0, 4));
}

TEST_CASE("tape replication: a standby back from a partition gets what it missed, once") {
  tape_log log = log_of(3);
  tape_intake intake({});
  std::vector<std::uint64_t> stored;
  log.on_ack(1, deliver(log.next_for(1, 1024, 0), 7, intake, stored), 0);
  for (std::uint64_t r = 3; r < 8; ++r) {  // committed while the standby is cut off: every copy lost
    log.append(r, record_of(r));
    (void)log.next_for(1, 1024, static_cast<nanos>(r) * 1'000'000);
  }
  log.on_reconnect(1);  // heard again: a fresh connection
  log.append(8, record_of(8));
  const tape_log::chunk c = log.next_for(1, 1024, 10'000'000);
  CHECK(c.from == 3);
  log.on_ack(1, deliver(c, 7, intake, stored), 10'000'000);
  CHECK(stored == iota(0, 9));
}

TEST_CASE("tape replication: a restarted standby (fresh store) catches up from zero") {
  tape_log log = log_of(6);
  tape_intake first({});
  std::vector<std::uint64_t> stored;
  log.on_ack(1, deliver(log.next_for(1, 1024, 0), 7, first, stored), 0);
  CHECK(log.acknowledged(1) == 6);
  tape_intake fresh({});  // its host replaced: nothing held
  std::vector<std::uint64_t> refilled;
  log.append(6, record_of(6));
  const std::uint64_t ack = deliver(log.next_for(1, 1024, 1), 7, fresh, refilled);  // from 6: a gap for it
  CHECK(ack == 0);
  log.on_ack(1, ack, 2);  // lower than before: sent again from 0
  log.on_ack(1, deliver(log.next_for(1, 1024, 3), 7, fresh, refilled), 4);
  CHECK(refilled == iota(0, 7));
}

TEST_CASE("tape replication: a new leader's log is taken from index 0 again, rounds held are not stored twice") {
  tape_intake intake({0, 1, 2});  // its store holds rounds 0-2 (from the old leader, or led itself)
  tape_log new_leader(resend_ns);
  for (std::uint64_t r = 0; r < 5; ++r) new_leader.append(r, record_of(r));  // its store's tape, then more
  std::vector<std::uint64_t> stored;
  const std::uint64_t ack = deliver(new_leader.next_for(2, 1024, 0), 9, intake, stored);
  CHECK(ack == 5);
  CHECK(stored == iota(3, 5));
  // A copy of the deposed leader (an older epoch) is not its log any more.
  CHECK(intake.on_state(8, 0, 0, 3).first == 3);
}

TEST_CASE("tape replication: a standby further behind than the log holds takes what is left and counts the rest") {
  tape_log log(resend_ns);
  const std::uint64_t total = tape_log::capacity + 5;
  for (std::uint64_t r = 0; r < total; ++r) log.append(r, "x");
  tape_intake intake({});
  const tape_log::chunk c = log.next_for(1, 16, 0);
  CHECK(c.from == 5);
  CHECK(c.oldest == 5);
  const tape_intake::accepted take = intake.on_state(3, c.from, c.oldest, c.records.size());
  CHECK(take.first == 0);
  CHECK(take.ack == 5 + c.records.size());
  CHECK(intake.skipped() == 5);
}

}  // namespace archipelago
