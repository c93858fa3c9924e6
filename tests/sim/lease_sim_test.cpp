// The brokers' lease (mesh.etcd) in the seeded simulation: every broker's real
// seat and lease_keeper, their calls carried to a model of etcd (sim_lease_service)
// over virtual time. What the lease promises — at most one broker leads at any
// time, epochs only grow — under the faults a lease exists for: a split brain, a
// primary cut from etcd alone, a primary stopped past its lease, its host lost,
// etcd itself down. The same faults against a real etcd and real processes:
// integration/broker_lease.

#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "sim/mesh_sim.hpp"

using namespace archipelago;
using namespace archipelago::sim;

namespace {

constexpr nanos second = 1'000'000'000;

/// A primary and a standby holding a lease; the defaults' liveness (heartbeat 1 s,
/// 3 s window: a 3 s TTL, a range or renewal each second), 30 s.
sim_config with_lease(std::uint64_t seed) {
  sim_config c;
  c.seed = seed;
  c.learners = 4;
  c.shards = 2;
  c.fragments = 4;
  c.duration_ns = 30 * second;
  c.drain_ns = 100'000'000;
  c.broker.quorum = 1;
  c.broker.liveness_timeout_ns = 200'000'000;
  c.broker.round_timeout_ns = 2 * second;
  c.broker_silence_ns = 3 * second;
  c.broker_ledger_write_ns = 500'000'000;
  c.standbys = 1;
  c.lease = true;
  return c;
}

/// The round closes in time order never go back to an older epoch once a newer
/// one closed a round, and each epoch's closes come from one broker.
void check_closes_in_epoch_order(const sim_result& r) {
  std::uint64_t newest = 0;
  std::map<std::uint64_t, std::uint32_t> broker_of_epoch;
  for (const auto& [t, broker, epoch] : r.round_closes) {
    CAPTURE(t);
    CHECK(epoch >= newest);
    newest = std::max(newest, epoch);
    CHECK(broker_of_epoch.try_emplace(epoch, broker).first->second == broker);
  }
}

void check_nothing_lost(const sim_result& r) {
  CHECK(r.rounds_acted_without_lease == 0);
  std::map<std::uint32_t, std::uint64_t> version;
  for (const auto& v : r.versions)
    if (v.kind == version_event::what::published) {
      CHECK(v.version > version[v.fragment.value]);  // nothing installed is taken back
      version[v.fragment.value] = v.version;
    }
  CHECK(r.ledger.balanced());
  CHECK(r.ledger.processed == r.tokens_processed);
  CHECK(r.final_loss < 0.05 * r.initial_loss);
}

nanos last_close_of(const sim_result& r, std::uint32_t broker) {
  nanos last = -1;
  for (const auto& [t, b, epoch] : r.round_closes)
    if (b == broker) last = t;
  return last;
}

}  // namespace

// Only the brokers lose each other. Without a lease the standby takes over while
// the primary still serves (two leaders until fencing settles it); with one, etcd
// refuses the standby: the primary leads throughout.
TEST_CASE("sim: with a lease a split brain never has two leaders") {
  for (const std::uint64_t seed : {201u, 202u}) {
    CAPTURE(seed);
    sim_config c = with_lease(seed);
    c.broker_partitions = {{0, 5 * second, 15 * second, true}};
    const sim_result r = run_mesh(c);
    CHECK(r.leaders.size() == 1);
    CHECK(r.lease_campaigns_won == 1);  // etcd let the primary's campaign succeed, and no other
    CHECK(r.most_leaders_at_once == 1);
    CHECK(r.step_downs.empty());
    CHECK(last_close_of(r, 1) < 0);
    check_closes_in_epoch_order(r);
    check_nothing_lost(r);
    c.lease = false;
    const sim_result without = run_mesh(c);
    MESSAGE("seed " << seed << ": with the lease " << r.leaders.size() << " leader, at most " << r.most_leaders_at_once
                    << " at once; without it " << without.leaders.size() << " leaderships, at most "
                    << without.most_leaders_at_once << " at once");
    CHECK(without.leaders.size() >= 2);  // the baseline: the standby took over without a lease
  }
}

// The primary cannot reach etcd but still reaches every node, so the control lane
// never calls it dead: it stops leading before its lease can lapse at etcd, and
// the standby — seeing no leader recorded — takes the lease and leads.
TEST_CASE("sim: with a lease a primary cut from etcd alone hands over to the standby") {
  constexpr nanos cut = 5 * second;
  for (const std::uint64_t seed : {211u, 212u}) {
    CAPTURE(seed);
    sim_config c = with_lease(seed);
    c.lease_outages = {{0, cut, 25 * second}};
    const sim_result r = run_mesh(c);
    REQUIRE(r.leaders.size() >= 2);
    REQUIRE(!r.step_downs.empty());
    const auto [down_at, down_broker] = r.step_downs.front();
    const auto [led_at, led_broker, led_epoch] = r.leaders[1];
    CHECK(down_broker == 0u);
    CHECK(down_at < cut + 3 * second);  // within its lease, counted from its last renewal before the cut
    CHECK(led_broker == 1u);
    CHECK(led_at > down_at);
    CHECK(led_epoch > std::get<2>(r.leaders[0]));
    CHECK(led_at < cut + 6 * second);  // TTL 3 s + a range each second + the campaign's calls
    MESSAGE("seed " << seed << ": the primary stopped leading " << (down_at - cut) / 1e6
                    << " ms after the cut, the standby led " << (led_at - cut) / 1e6 << " ms after it");
    CHECK(r.most_leaders_at_once == 1);
    CHECK(last_close_of(r, 0) < down_at);
    check_closes_in_epoch_order(r);
    check_nothing_lost(r);
  }
}

// The primary stopped (SIGSTOP) for 6 s: its lease lapses, the standby leads;
// when it wakes it steps down before it handles anything — no round closed after
// the pause began. And with the standby unable to reach etcd (nobody to take
// over), a primary that wakes past its lease stops before it acts on what waited
// for it, then asks for the lease again.
TEST_CASE("sim: with a lease a primary stopped past its lease steps down on waking without closing a round") {
  constexpr nanos pause = 5 * second, wake = 11 * second;
  for (const std::uint64_t seed : {221u, 222u}) {
    CAPTURE(seed);
    sim_config c = with_lease(seed);
    c.broker_pauses = {{0, pause, wake - pause}};
    const sim_result r = run_mesh(c);
    REQUIRE(r.leaders.size() >= 2);
    CHECK(std::get<1>(r.leaders[1]) == 1u);
    CHECK(std::get<0>(r.leaders[1]) < wake);
    REQUIRE(!r.step_downs.empty());
    CHECK(r.step_downs.front().second == 0u);
    CHECK(r.step_downs.front().first == wake);  // the first thing it did on waking
    CHECK(last_close_of(r, 0) < pause);
    CHECK(r.most_leaders_at_once == 1);
    CHECK(r.closes_merged_by_deposed == 0);
    check_closes_in_epoch_order(r);
    check_nothing_lost(r);

    c.lease_outages = {{1, 0, c.duration_ns}};
    const sim_result alone = run_mesh(c);
    REQUIRE(alone.leaders.size() >= 2);
    CHECK(std::get<1>(alone.leaders[1]) == 0u);  // the primary again, in a new epoch
    CHECK(std::get<2>(alone.leaders[1]) > std::get<2>(alone.leaders[0]));
    REQUIRE(!alone.step_downs.empty());
    CHECK(alone.step_downs.front().first == wake);
    CHECK(alone.rounds_acted_without_lease == 0);
    MESSAGE("seed " << seed << ": nobody to take over; the primary led again " << (std::get<0>(alone.leaders[1]) - wake) / 1e6
                    << " ms after waking");
  }
}

// The primary's host is lost: the standby leads once the lease lapses. Then etcd
// is down for 4 s: the leader stops leading within its lease and nobody leads
// until etcd is back, then a broker leads again in a higher epoch.
TEST_CASE("sim: with a lease the standby follows a lost primary, and nobody leads while etcd is down") {
  constexpr nanos lost = 5 * second, etcd_down = 15 * second, etcd_back = 19 * second;
  for (const std::uint64_t seed : {231u, 232u}) {
    CAPTURE(seed);
    sim_config c = with_lease(seed);
    c.broker_crashes = {{lost, -1, false, true, 0}};
    c.lease_outages = {{-1, etcd_down, etcd_back}};
    const sim_result r = run_mesh(c);
    REQUIRE(r.leaders.size() >= 3);
    const auto [took_over_at, b1, e1] = r.leaders[1];
    CHECK(b1 == 1u);
    CHECK(took_over_at - lost <= 5 * second);  // the goal: TTL 3 s + a range each second + the campaign
    REQUIRE(!r.step_downs.empty());
    const nanos stopped = r.step_downs.back().first;
    CHECK(stopped > etcd_down);
    CHECK(stopped < etcd_down + 3 * second);
    const auto [led_again_at, b2, e2] = r.leaders[2];
    CHECK(led_again_at >= etcd_back);
    CHECK(e2 > e1);
    for (const auto& [t, b, epoch] : r.round_closes) CHECK((t < stopped || t >= led_again_at));
    MESSAGE("seed " << seed << ": standby led " << (took_over_at - lost) / 1e6 << " ms after the primary's host was lost; "
                    << "stopped " << (stopped - etcd_down) / 1e6 << " ms after etcd went down, led again "
                    << (led_again_at - etcd_back) / 1e6 << " ms after it was back");
    CHECK(r.most_leaders_at_once == 1);
    CHECK(r.rounds_acted_without_lease == 0);
    check_closes_in_epoch_order(r);
    CHECK(r.ledger.balanced());
    CHECK(r.ledger.processed == r.tokens_processed);
  }
}
