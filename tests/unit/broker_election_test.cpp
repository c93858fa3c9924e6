#include <doctest/doctest.h>

#include <cstdint>

#include "core/broker_follower.hpp"
#include "sync_broker/broker_election.hpp"

using namespace archipelago;

namespace {

constexpr nanos s = 1'000'000'000;
constexpr nanos ms = 1'000'000;

election_config brokers(std::uint32_t self, std::uint32_t count) { return {self, count, 1 * s, 3 * s}; }

}  // namespace

TEST_CASE("election: a mesh without standbys leads at once, in its incarnation's epoch") {
  broker_election e(brokers(0, 1), 77, 0);
  const auto epoch = e.take_over(0);
  REQUIRE(epoch);
  CHECK(*epoch == broker_epoch_of(77, 0));
  CHECK(e.leading());
  CHECK_FALSE(e.take_over(1 * s));  // once
}

TEST_CASE("election: the primary listens a liveness window before it leads, hearing a leader, it follows") {
  broker_election fresh(brokers(0, 2), 100, 0);
  CHECK_FALSE(fresh.take_over(2900 * ms));
  CHECK(fresh.take_over(3 * s) == broker_epoch_of(100, 0));
  broker_election lone_standby(brokers(1, 2), 100, 0);  // no leader heard of: a heartbeat longer
  CHECK_FALSE(lone_standby.take_over(3900 * ms));
  CHECK(lone_standby.take_over(4 * s));

  // Restarted while standby 1 leads (epoch of its incarnation 90): it follows, and does not lead while it hears it.
  broker_election restarted(brokers(0, 2), 120, 0);
  CHECK_FALSE(restarted.on_epoch(broker_epoch_of(90, 1), 500 * ms));  // not leading: nothing to step down from
  CHECK(restarted.leader() == 1u);
  for (nanos t = 1 * s; t <= 20 * s; t += 1 * s) {
    restarted.on_leader_heard(t);
    CHECK_FALSE(restarted.take_over(t));
  }
}

TEST_CASE("election: a standby takes over on the leader's death verdict, above every epoch it heard of") {
  broker_election standby(brokers(1, 2), 50, 0);
  standby.on_epoch(broker_epoch_of(60, 0), 100 * ms);  // the primary's incarnation is newer than the standby's
  standby.on_leader_heard(1 * s);
  CHECK_FALSE(standby.take_over(2 * s));
  standby.on_broker_peer(0, false, 4 * s);  // the control lane: silent for 3 s
  const auto epoch = standby.take_over(4 * s);
  REQUIRE(epoch);
  CHECK(*epoch == broker_epoch_of(61, 1));  // above the primary's, though its own incarnation is older
  CHECK(*epoch > broker_epoch_of(60, 0));
  CHECK(leader_of_epoch(*epoch) == 1u);
  CHECK(standby.leading());
}

TEST_CASE("election: a leader heard from is taken over only on a death verdict, one only heard of, after a long silence") {
  broker_election standby(brokers(1, 2), 50, 0);
  standby.on_epoch(broker_epoch_of(40, 0), 0);
  standby.on_leader_heard(100 * ms);  // its BrokerState
  CHECK_FALSE(standby.take_over(60 * s));  // quiet, but the control lane says nothing: it lives
  standby.on_broker_peer(0, false, 61 * s);
  CHECK(standby.take_over(61 * s));

  broker_election hearsay(brokers(1, 2), 50, 0);
  hearsay.on_epoch(broker_epoch_of(40, 0), 0);  // from a shard's header; the leader never heard
  CHECK_FALSE(hearsay.take_over(5900 * ms));
  CHECK(hearsay.take_over(6 * s));  // twice the liveness window
}

TEST_CASE("election: a second standby waits a heartbeat longer, and a deposed one steps down") {
  broker_election one(brokers(1, 3), 50, 0), two(brokers(2, 3), 51, 0);
  for (auto* b : {&one, &two}) {
    b->on_epoch(broker_epoch_of(40, 0), 0);
    b->on_leader_heard(0);
    b->on_broker_peer(0, false, 3 * s);
  }
  const auto first = one.take_over(3 * s);
  REQUIRE(first);
  CHECK_FALSE(two.take_over(3 * s));  // staggered by one heartbeat
  two.on_epoch(*first, 3100 * ms);    // ...and meanwhile hears of the new leader: it follows it
  CHECK(two.leader() == 1u);
  CHECK_FALSE(two.take_over(4 * s));

  // Had both campaigned, the higher epoch wins: the other steps down on hearing of it.
  broker_election a(brokers(1, 3), 50, 0), b(brokers(2, 3), 50, 0);
  const auto ea = a.take_over(10 * s), eb = b.take_over(10 * s);
  REQUIRE(ea);
  REQUIRE(eb);
  CHECK(*ea != *eb);
  CHECK(a.on_epoch(*eb, 11 * s));  // deposed
  CHECK_FALSE(a.leading());
  CHECK_FALSE(b.on_epoch(*ea, 11 * s));
  CHECK(b.leading());
}

TEST_CASE("follower: nodes follow the newest epoch from anyone and fence a deposed broker") {
  broker_follower f;
  CHECK(f.leader() == broker_address);
  CHECK(f.join_targets(3).size() == 3u);  // no epoch yet: Join goes to every broker
  const std::uint64_t old_epoch = broker_epoch_of(10, 0), new_epoch = broker_epoch_of(11, 1);
  CHECK(f.on_message(broker_at(0), old_epoch) == broker_follower::news::first);
  CHECK(f.on_message(broker_at(0), old_epoch) == broker_follower::news::same);
  // A shard heard of the takeover first: the news spreads through its header.
  CHECK(f.on_message({role::parameter_shard, 0}, new_epoch) == broker_follower::news::changed);
  CHECK(f.leader() == broker_at(1));
  CHECK(f.join_targets(3) == std::vector<node_address>{broker_at(1)});
  CHECK(f.join_targets(3, true).size() == 3u);  // the leader silent: every broker (a successor may not know us)
  // The old primary, back from a partition, is refused; so is a standby speaking in the leader's epoch.
  CHECK(f.on_message(broker_at(0), old_epoch) == broker_follower::news::fenced);
  CHECK(f.on_message(broker_at(2), new_epoch) == broker_follower::news::fenced);
  CHECK(f.on_message(broker_at(1), new_epoch) == broker_follower::news::same);
  CHECK(f.fenced() == 2u);
}
