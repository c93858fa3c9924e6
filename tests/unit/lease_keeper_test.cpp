// The brokers' lease state machine (lease_keeper): which call comes next, and what
// each answer does to where the broker stands. No service: the answers are written here.

#include <doctest/doctest.h>

#include "core/mesh_setup.hpp"
#include "sync_broker/lease_keeper.hpp"

using namespace archipelago;
using kind = lease_call::kind;

namespace {

constexpr nanos second = 1'000'000'000;
const lease_keeper_config settings{1, 3, second};  // broker 1, TTL 3 s, a range each second

lease_reply ranged(std::uint64_t leader_epoch, std::uint64_t epoch = 0, std::int64_t revision = 0) {
  lease_reply r = lease_reply::answered();
  r.keys = {leader_epoch, epoch, revision};
  return r;
}
lease_reply granted(std::int64_t id) {
  lease_reply r = lease_reply::answered();
  r.granted = id;
  return r;
}
lease_reply won(bool yes) {
  lease_reply r = lease_reply::answered();
  r.won = yes;
  return r;
}
lease_reply renewed(std::int64_t ttl_s) {
  lease_reply r = lease_reply::answered();
  r.ttl_left_s = ttl_s;
  return r;
}

/// Campaigns from `now` through range, grant and transaction; the lease is held after.
void take(lease_keeper& k, nanos now, std::uint64_t min_epoch) {
  k.campaign(min_epoch);
  auto range = k.next(now);
  REQUIRE(range);
  REQUIRE(range->what == kind::range);
  k.answer(ranged(0, 0x0100, 7), now + 1);
  auto grant = k.next(now + 2);
  REQUIRE(grant);
  REQUIRE(grant->what == kind::grant);
  CHECK(grant->ttl_s == 3);
  k.answer(granted(42), now + 3);
  auto txn = k.next(now + 4);
  REQUIRE(txn);
  REQUIRE(txn->what == kind::campaign);
  CHECK(txn->lease_id == 42);
  CHECK(txn->epoch_mod_revision == 7);
  k.answer(won(true), now + 5);
}

}  // namespace

TEST_CASE("lease keeper: a campaign takes the lease in an epoch above the recorded one, valid from the grant's sending") {
  lease_keeper k(settings);
  take(k, 10 * second, 1);
  const lease_state s = k.state();
  CHECK(s.held_epoch == broker_epoch_of(2, 1));  // above the recorded epoch 0x0100 (counter 1), broker 1
  CHECK(s.leader_epoch == s.held_epoch);
  CHECK(s.valid_until == 10 * second + 2 + 3 * second - 300'000'000);  // the grant went at +2; margin TTL/10
  CHECK(!k.next(10 * second + 100));                                    // nothing due until the renewal
  CHECK(k.due_at() == 10 * second + 2 + second);                        // TTL/3 after the grant went
  // A renewal moves the validity from its own sending.
  auto renewal = k.next(11 * second + 2);
  REQUIRE(renewal);
  CHECK(renewal->what == kind::keepalive);
  CHECK(renewal->lease_id == 42);
  k.answer(renewed(3), 11 * second + 500);
  CHECK(k.state().valid_until == 11 * second + 2 + 3 * second - 300'000'000);
}

TEST_CASE("lease keeper: a campaign for a higher epoch than recorded asks for that one") {
  lease_keeper k(settings);
  k.campaign(broker_epoch_of(9, 1));
  (void)k.next(0);
  k.answer(ranged(0, 0x0100, 7), 1);
  (void)k.next(2);
  k.answer(granted(5), 3);
  auto txn = k.next(4);
  REQUIRE(txn);
  CHECK(txn->epoch == broker_epoch_of(9, 1));
}

TEST_CASE("lease keeper: a leader recorded: no grant, the next range a retry later") {
  lease_keeper k(settings);
  k.campaign(1);
  (void)k.next(0);
  k.answer(ranged(0x0200), 1);
  CHECK(k.state().leader_epoch == 0x0200);
  CHECK(k.state().observed_at == 1);
  CHECK(!k.next(2));
  CHECK(k.due_at() == second);
  auto again = k.next(second);
  REQUIRE(again);
  CHECK(again->what == kind::range);
}

TEST_CASE("lease keeper: a lost or unanswered transaction gives the granted lease back") {
  for (const bool answered : {true, false}) {
    CAPTURE(answered);
    lease_keeper k(settings);
    k.campaign(1);
    (void)k.next(0);
    k.answer(ranged(0), 1);
    (void)k.next(2);
    k.answer(granted(77), 3);
    (void)k.next(4);
    k.answer(answered ? won(false) : lease_reply::failed("timed out"), 5);
    CHECK(k.state().held_epoch == 0);
    auto revoke = k.next(6);
    REQUIRE(revoke);
    CHECK(revoke->what == kind::revoke);
    CHECK(revoke->lease_id == 77);
    CHECK(k.state().error == (answered ? "" : "timed out"));
  }
}

TEST_CASE("lease keeper: release gives a held lease back at once, and a grant that comes after it") {
  lease_keeper k(settings);
  take(k, 0, 1);
  k.release();
  auto revoke = k.next(10);
  REQUIRE(revoke);
  CHECK(revoke->what == kind::revoke);
  CHECK(k.state().held_epoch == 0);  // not leading from the moment it is given back
  k.answer(lease_reply::answered(), 11);

  lease_keeper late(settings);
  late.campaign(1);
  (void)late.next(0);
  late.answer(ranged(0), 1);
  (void)late.next(2);  // the grant is out when the seat gives up
  late.release();
  late.answer(granted(9), 3);
  auto back = late.next(4);
  REQUIRE(back);
  CHECK(back->what == kind::revoke);
  CHECK(back->lease_id == 9);
}

TEST_CASE("lease keeper: a renewal that finds the lease gone stops holding it, a renewal unanswered keeps the old validity") {
  lease_keeper k(settings);
  take(k, 0, 1);
  const nanos valid = k.state().valid_until;
  REQUIRE(k.next(second + 2));  // the renewal, TTL/3 after the grant went
  k.answer(lease_reply::failed("connection refused"), second + 3);
  CHECK(k.state().held_epoch != 0);
  CHECK(k.state().valid_until == valid);  // the seat stops leading when it passes
  CHECK(k.state().error == "connection refused");
  REQUIRE(k.next(2 * second + 2));
  k.answer(renewed(0), 2 * second + 3);
  CHECK(k.state().held_epoch == 0);
  CHECK(!k.state().error.empty());
}

TEST_CASE("lease keeper: without a campaign it still observes the service each retry") {
  lease_keeper k(settings);
  CHECK(k.state().observed_at == -1);
  auto range = k.next(0);
  REQUIRE(range);
  CHECK(range->what == kind::range);
  CHECK(!k.next(1));  // one call out at a time
  k.answer(ranged(0), 5);
  CHECK(!k.next(6));  // observing only: no grant
  CHECK(k.state().observed_at == 5);
  CHECK(k.state().leader_epoch == 0);
  CHECK(k.due_at() == second);
}
