#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/clock.hpp"
#include "core/ids.hpp"
#include "core/prng.hpp"
#include "transport/reliability.hpp"

using namespace archipelago;
using verdict = dedup_window::verdict;

namespace doctest {
template <>
struct StringMaker<verdict> {
  static String convert(verdict v) { return archipelago::to_string(v); }
};
template <>
struct StringMaker<node_address> {
  static String convert(const node_address& a) { return a.to_string().c_str(); }
};
}  // namespace doctest

namespace {

constexpr nanos ms = 1'000'000;
constexpr nanos sec = 1'000'000'000;

node_address learner(std::uint32_t i) { return {role::learner, i}; }
node_address shard(std::uint32_t i) { return {role::parameter_shard, i}; }
incarnation inc_of(std::uint64_t v) { return incarnation{v}; }

}  // namespace

// ---- configs --------------------------------------------------------------

TEST_CASE("reliability configs validate their ranges") {
  CHECK(validate(heartbeat_config{}).has_value());
  CHECK_FALSE(validate(heartbeat_config{0, 3}).has_value());
  CHECK_FALSE(validate(heartbeat_config{-1, 3}).has_value());
  CHECK_FALSE(validate(heartbeat_config{sec, 0}).has_value());
  CHECK_FALSE(validate(heartbeat_config{sec, 101}).has_value());
  CHECK(validate(heartbeat_config{sec, 100}).has_value());
  CHECK(validate(heartbeat_config{1, 1}).has_value());
  const status overflow = validate(heartbeat_config{INT64_MAX / 2, 3});
  REQUIRE_FALSE(overflow.has_value());
  CHECK(overflow.err().code == errc::invalid_input);

  CHECK(validate(backoff_config{}).has_value());
  CHECK_FALSE(validate(backoff_config{0, 5 * sec, 2.0, 0.2}).has_value());
  CHECK_FALSE(validate(backoff_config{2 * sec, sec, 2.0, 0.2}).has_value());
  CHECK_FALSE(validate(backoff_config{ms, INT64_MAX, 2.0, 0.2}).has_value());
  CHECK_FALSE(validate(backoff_config{ms, sec, 0.5, 0.2}).has_value());
  CHECK_FALSE(validate(backoff_config{ms, sec, 2.0, -0.1}).has_value());
  CHECK_FALSE(validate(backoff_config{ms, sec, 2.0, 1.5}).has_value());
  CHECK(validate(backoff_config{ms, ms, 1.0, 0.0}).has_value());
  CHECK(validate(backoff_config{ms, sec, 2.0, 1.0}).has_value());
}

// ---- peer liveness --------------------------------------------------------

TEST_CASE("a peer dies after exactly interval x liveness of silence") {
  manual_clock clock(7 * sec);  // not zero: times are relative to the last message
  peer_liveness live(heartbeat_config{sec, 3});
  CHECK(live.timeout_ns() == 3 * sec);
  const node_address a = learner(0);
  CHECK_FALSE(live.alive(a, clock.now()));  // never heard from
  CHECK(live.live_count(clock.now()) == 0);

  live.heard_from(a, clock.now());
  CHECK(live.alive(a, clock.now()));
  CHECK(live.tracked() == 1);
  clock.advance(3 * sec);
  CHECK(live.alive(a, clock.now()));  // exactly interval x liveness: still alive
  CHECK(live.expire(clock.now()).empty());
  clock.advance(1);
  CHECK_FALSE(live.alive(a, clock.now()));
  CHECK(live.live_count(clock.now()) == 0);
  CHECK(live.tracked() == 1);

  // Any message counts: hearing from it at 2.5 s moves the deadline.
  peer_liveness other(heartbeat_config{sec, 3});
  other.heard_from(a, 0);
  other.heard_from(a, 2500 * ms);
  CHECK(other.alive(a, 5500 * ms));
  CHECK_FALSE(other.alive(a, 5500 * ms + 1));
  // A late-delivered older timestamp does not age the peer.
  other.heard_from(a, 1 * sec);
  CHECK(other.alive(a, 5500 * ms));
}

TEST_CASE("expire reports each death once, and a revived peer can die again") {
  peer_liveness live(heartbeat_config{100 * ms, 3});
  const node_address a = learner(1), b = shard(0), c = learner(0);
  live.heard_from(a, 0);
  live.heard_from(b, 100 * ms);
  live.heard_from(c, 200 * ms);
  CHECK(live.live_count(300 * ms) == 3);

  CHECK(live.expire(300 * ms).empty());
  CHECK(live.expire(300 * ms + 1) == std::vector<node_address>{a});
  CHECK(live.expire(300 * ms + 1).empty());  // reported once
  CHECK(live.expire(350 * ms).empty());
  // b and c die together: reported in address order.
  CHECK(live.expire(600 * ms) == std::vector<node_address>{c, b});
  CHECK(live.expire(10 * sec).empty());
  CHECK(live.live_count(10 * sec) == 0);

  // Revival: heard again, alive again, and its next death is reported again.
  live.heard_from(a, 10 * sec);
  CHECK(live.alive(a, 10 * sec));
  CHECK(live.live_count(10 * sec) == 1);
  CHECK(live.expire(10 * sec + 300 * ms).empty());
  CHECK(live.expire(10 * sec + 300 * ms + 1) == std::vector<node_address>{a});

  // A dead peer heard from before expire() runs is never reported.
  live.heard_from(b, 11 * sec);
  CHECK(live.expire(20 * sec) == std::vector<node_address>{b});
  live.heard_from(c, 20 * sec);
  CHECK(live.expire(20 * sec).empty());

  // forget stops tracking, dead or alive.
  live.forget(c);
  live.forget(c);  // idempotent
  live.forget(learner(99));
  CHECK_FALSE(live.alive(c, 20 * sec));
  CHECK(live.tracked() == 2);
  CHECK(live.expire(100 * sec).empty());  // a and b were already reported
}

TEST_CASE("our own heartbeat is due every interval from the last send") {
  manual_clock clock(5 * sec);
  peer_liveness live(heartbeat_config{sec, 3});
  // Never sent: due now.
  CHECK(live.next_heartbeat_due(clock.now()) == clock.now());
  CHECK(live.heartbeat_due(clock.now()));

  live.heartbeat_sent(clock.now());
  CHECK(live.next_heartbeat_due(clock.now()) == 6 * sec);
  CHECK_FALSE(live.heartbeat_due(clock.now()));
  clock.advance(sec - 1);
  CHECK_FALSE(live.heartbeat_due(clock.now()));
  clock.advance(1);
  CHECK(live.heartbeat_due(clock.now()));

  // Sent late (the I/O thread was busy): the schedule restarts from the send,
  // with no burst of catch-up heartbeats.
  clock.set(8500 * ms);
  CHECK(live.heartbeat_due(clock.now()));
  live.heartbeat_sent(clock.now());
  CHECK(live.next_heartbeat_due(clock.now()) == 9500 * ms);
  CHECK_FALSE(live.heartbeat_due(9 * sec));

  // Hearing from peers does not affect our outgoing schedule.
  live.heard_from(learner(0), 9 * sec);
  CHECK(live.next_heartbeat_due(9 * sec) == 9500 * ms);
}

// ---- reconnect backoff ----------------------------------------------------

TEST_CASE("backoff doubles from initial and caps at max") {
  reconnect_backoff backoff(backoff_config{100 * ms, 5 * sec, 2.0, 0.0}, 1);
  CHECK(backoff.attempts() == 0);
  const std::vector<nanos> expected_ns = {100 * ms,  200 * ms,  400 * ms, 800 * ms, 1600 * ms,
                                          3200 * ms, 5000 * ms, 5000 * ms, 5000 * ms};
  for (std::size_t i = 0; i < expected_ns.size(); ++i) {
    CAPTURE(i);
    CHECK(backoff.next_delay() == expected_ns[i]);
    CHECK(backoff.attempts() == static_cast<int>(i + 1));
  }
  backoff.reset();
  CHECK(backoff.attempts() == 0);
  CHECK(backoff.next_delay() == 100 * ms);
  CHECK(backoff.next_delay() == 200 * ms);

  reconnect_backoff constant(backoff_config{50 * ms, 50 * ms, 1.0, 0.0}, 1);
  for (int i = 0; i < 5; ++i) CHECK(constant.next_delay() == 50 * ms);

  reconnect_backoff slow(backoff_config{100 * ms, sec, 1.5, 0.0}, 1);
  CHECK(slow.next_delay() == 100 * ms);
  CHECK(slow.next_delay() == 150 * ms);
  CHECK(slow.next_delay() == 225 * ms);
}

TEST_CASE("backoff jitter stays within bounds and is deterministic per seed") {
  const backoff_config cfg{100 * ms, 5 * sec, 2.0, 0.2};
  for (std::uint64_t seed : {1ULL, 2ULL, 42ULL, 0xdeadbeefULL}) {
    CAPTURE(seed);
    reconnect_backoff backoff(cfg, seed);
    double base_ns = static_cast<double>(cfg.initial_ns);
    bool below = false, above = false;
    bool capped_below = false, capped_above = false;  // jitter still spreads capped delays
    for (int i = 0; i < 200; ++i) {
      CAPTURE(i);
      const nanos d = backoff.next_delay();
      REQUIRE(d >= 0);
      REQUIRE(static_cast<double>(d) <= static_cast<double>(cfg.max_ns) * (1.0 + cfg.jitter));
      REQUIRE(static_cast<double>(d) >= base_ns * (1.0 - cfg.jitter) - 1.0);
      REQUIRE(static_cast<double>(d) <= base_ns * (1.0 + cfg.jitter));
      below |= static_cast<double>(d) < base_ns;
      above |= static_cast<double>(d) > base_ns;
      if (base_ns == static_cast<double>(cfg.max_ns)) {
        capped_below |= d < cfg.max_ns;
        capped_above |= d > cfg.max_ns;
      }
      base_ns = std::min(base_ns * cfg.multiplier, static_cast<double>(cfg.max_ns));
      if (i == 100) {
        backoff.reset();
        base_ns = static_cast<double>(cfg.initial_ns);
      }
    }
    CHECK(below);
    CHECK(above);
    CHECK(capped_below);
    CHECK(capped_above);
  }

  reconnect_backoff a(cfg, 7), b(cfg, 7), c(cfg, 8);
  bool differs = false;
  for (int i = 0; i < 20; ++i) {
    const nanos x = a.next_delay();
    CHECK(x == b.next_delay());
    differs |= x != c.next_delay();
  }
  CHECK(differs);

  // Full jitter: never negative, never above 2 x max.
  reconnect_backoff full(backoff_config{ms, 10 * ms, 3.0, 1.0}, 3);
  for (int i = 0; i < 1000; ++i) {
    const nanos d = full.next_delay();
    REQUIRE(d >= 0);
    REQUIRE(d <= 20 * ms);
  }
}

// ---- duplicate suppression ------------------------------------------------

TEST_CASE("dedup accepts in-order and reordered messages once") {
  dedup_window dedup(64);
  const node_address a = learner(0);
  const incarnation i1 = inc_of(1);
  for (std::uint64_t seq = 0; seq < 200; ++seq) REQUIRE(dedup.check(a, i1, seq) == verdict::fresh);
  CHECK(dedup.check(a, i1, 199) == verdict::duplicate);  // the highest
  CHECK(dedup.check(a, i1, 150) == verdict::duplicate);
  CHECK(dedup.senders() == 1);

  // Reordering: 210 arrives before 200..209.
  CHECK(dedup.check(a, i1, 210) == verdict::fresh);
  for (std::uint64_t seq = 209; seq >= 200; --seq) CHECK(dedup.check(a, i1, seq) == verdict::fresh);
  for (std::uint64_t seq = 200; seq <= 210; ++seq) CHECK(dedup.check(a, i1, seq) == verdict::duplicate);

  // Senders are independent, and the first message of a sender may have any seq.
  CHECK(dedup.check(shard(0), i1, 5) == verdict::fresh);
  CHECK(dedup.check(shard(0), i1, 4) == verdict::fresh);
  CHECK(dedup.check(shard(0), i1, 5) == verdict::duplicate);
  CHECK(dedup.check(a, i1, 5) == verdict::too_old);
  CHECK(dedup.senders() == 2);
}

TEST_CASE("dedup window edge: exactly window below the highest is still judged") {
  for (std::uint32_t window : {1u, 8u, 64u, 100u, 1024u}) {
    CAPTURE(window);
    dedup_window dedup(window);
    const node_address a = learner(3);
    const incarnation i1 = inc_of(1);
    const std::uint64_t top = 5000;
    REQUIRE(dedup.check(a, i1, top) == verdict::fresh);
    CHECK(dedup.check(a, i1, top - window - 1) == verdict::too_old);
    CHECK(dedup.check(a, i1, top - window) == verdict::fresh);
    CHECK(dedup.check(a, i1, top - window) == verdict::duplicate);
    if (window > 1) CHECK(dedup.check(a, i1, top - 1) == verdict::fresh);
    CHECK(dedup.check(a, i1, top - 1) == verdict::duplicate);
    // Advancing by one pushes the old edge out.
    CHECK(dedup.check(a, i1, top + 1) == verdict::fresh);
    CHECK(dedup.check(a, i1, top - window) == verdict::too_old);
    CHECK(dedup.check(a, i1, top + 1 - window) == (window == 1 ? verdict::duplicate : verdict::fresh));
    CHECK(dedup.check(a, i1, top) == verdict::duplicate);  // the old highest stays accepted
  }

  // window 0: only new highs are fresh.
  dedup_window strict(0);
  CHECK(strict.check(learner(0), inc_of(1), 10) == verdict::fresh);
  CHECK(strict.check(learner(0), inc_of(1), 10) == verdict::duplicate);
  CHECK(strict.check(learner(0), inc_of(1), 9) == verdict::too_old);
  CHECK(strict.check(learner(0), inc_of(1), 12) == verdict::fresh);
  CHECK(strict.check(learner(0), inc_of(1), 11) == verdict::too_old);
}

TEST_CASE("dedup forgets seqs that a jump pushes out and keeps the rest") {
  dedup_window dedup(100);  // ring of 128 bits: jumps exercise wrap-around
  const node_address a = learner(0);
  const incarnation i1 = inc_of(1);
  for (std::uint64_t seq = 0; seq < 100; seq += 2) REQUIRE(dedup.check(a, i1, seq) == verdict::fresh);
  CHECK(dedup.check(a, i1, 150) == verdict::fresh);  // highest 150: [50, 150] judged
  for (std::uint64_t seq = 50; seq < 100; ++seq) {
    CAPTURE(seq);
    CHECK(dedup.check(a, i1, seq) == (seq % 2 == 0 ? verdict::duplicate : verdict::fresh));
  }
  for (std::uint64_t seq = 100; seq < 150; ++seq) CHECK(dedup.check(a, i1, seq) == verdict::fresh);
  CHECK(dedup.check(a, i1, 49) == verdict::too_old);

  // A jump beyond the ring clears everything.
  CHECK(dedup.check(a, i1, 10'000) == verdict::fresh);
  for (std::uint64_t seq = 9'900; seq < 10'000; ++seq) REQUIRE(dedup.check(a, i1, seq) == verdict::fresh);
  CHECK(dedup.check(a, i1, 9'899) == verdict::too_old);

  // Extreme seqs do not overflow.
  CHECK(dedup.check(a, i1, UINT64_MAX) == verdict::fresh);
  CHECK(dedup.check(a, i1, UINT64_MAX - 100) == verdict::fresh);
  CHECK(dedup.check(a, i1, UINT64_MAX - 100) == verdict::duplicate);
  CHECK(dedup.check(a, i1, UINT64_MAX - 101) == verdict::too_old);
  CHECK(dedup.check(a, i1, 0) == verdict::too_old);
}

TEST_CASE("dedup: a higher incarnation resets the window, a lower one is stale") {
  dedup_window dedup(64);
  const node_address a = shard(2);
  for (std::uint64_t seq = 0; seq < 50; ++seq) REQUIRE(dedup.check(a, inc_of(3), seq) == verdict::fresh);
  CHECK(dedup.check(a, inc_of(2), 1000) == verdict::stale_incarnation);
  CHECK(dedup.check(a, inc_of(0), 0) == verdict::stale_incarnation);

  // The peer restarted: its seqs begin again and are all new.
  CHECK(dedup.check(a, inc_of(4), 0) == verdict::fresh);
  CHECK(dedup.check(a, inc_of(4), 0) == verdict::duplicate);
  CHECK(dedup.check(a, inc_of(4), 2) == verdict::fresh);
  CHECK(dedup.check(a, inc_of(4), 1) == verdict::fresh);
  CHECK(dedup.check(a, inc_of(4), 40) == verdict::fresh);
  CHECK(dedup.check(a, inc_of(4), 30) == verdict::fresh);  // accepted under 3, new under 4
  // Retransmissions from before the restart are dropped.
  CHECK(dedup.check(a, inc_of(3), 49) == verdict::stale_incarnation);
  CHECK(dedup.check(a, inc_of(3), 60) == verdict::stale_incarnation);
  // An incarnation may skip values.
  CHECK(dedup.check(a, inc_of(100), 7) == verdict::fresh);
  CHECK(dedup.check(a, inc_of(4), 41) == verdict::stale_incarnation);
  CHECK(dedup.senders() == 1);

  dedup.forget(a);
  CHECK(dedup.senders() == 0);
  CHECK(dedup.check(a, inc_of(1), 0) == verdict::fresh);  // forgotten: anything goes again
}

TEST_CASE("dedup tracks at most max_senders, evicting the least recently used") {
  dedup_window dedup(1024, 16);
  CHECK(dedup.max_senders() == 16);
  const node_address busy = shard(0);
  const incarnation i1 = inc_of(1);
  std::uint64_t busy_seq = 0;
  REQUIRE(dedup.check(busy, i1, busy_seq++) == verdict::fresh);
  // A flood of forged senders, while the busy sender keeps talking.
  for (std::uint32_t i = 0; i < 100'000; ++i) {
    REQUIRE(dedup.check(learner(i), i1, 7) == verdict::fresh);
    REQUIRE(dedup.senders() <= 16);
    if (i % 8 == 0) REQUIRE(dedup.check(busy, i1, busy_seq++) == verdict::fresh);
  }
  CHECK(dedup.senders() == 16);
  // The busy sender survived: its history is intact.
  REQUIRE(busy_seq > 1024);
  CHECK(dedup.check(busy, i1, busy_seq - 1024) == verdict::duplicate);
  CHECK(dedup.check(busy, i1, busy_seq - 1) == verdict::duplicate);
  CHECK(dedup.check(busy, i1, 0) == verdict::too_old);
  // The most recent forged senders are tracked; early ones were evicted, so a
  // repeat from them is (unavoidably) fresh again.
  CHECK(dedup.check(learner(99'999), i1, 7) == verdict::duplicate);
  CHECK(dedup.check(learner(0), i1, 7) == verdict::fresh);
  CHECK(dedup.senders() == 16);

  // Exact LRU order: any verdict counts as use.
  dedup_window small(8, 2);
  const node_address a = learner(0), b = learner(1), c = learner(2);
  CHECK(small.check(a, i1, 1) == verdict::fresh);
  CHECK(small.check(b, i1, 1) == verdict::fresh);
  CHECK(small.check(a, inc_of(0), 1) == verdict::stale_incarnation);  // touches a
  CHECK(small.check(c, i1, 1) == verdict::fresh);                    // evicts b
  CHECK(small.check(a, i1, 1) == verdict::duplicate);
  CHECK(small.check(c, i1, 1) == verdict::duplicate);
  CHECK(small.check(b, i1, 1) == verdict::fresh);  // b was forgotten; evicts a
  CHECK(small.check(a, i1, 1) == verdict::fresh);
  CHECK(small.senders() == 2);
}

// ---- randomized comparison with a reference model ---------------------------

namespace {

/// The obvious implementation: a set of every accepted (sender, inc, seq),
/// plus the same per-sender highest/incarnation and LRU eviction rules.
class reference_dedup {
 public:
  reference_dedup(std::uint64_t window, std::size_t max_senders)
      : window_(window), max_senders_(max_senders) {}

  verdict check(node_address a, std::uint64_t inc, std::uint64_t seq) {
    auto it = senders_.find(a);
    if (it == senders_.end()) {
      if (senders_.size() == max_senders_) {
        const node_address victim = lru_.front();
        lru_.erase(lru_.begin());
        senders_.erase(victim);
        accepted_.erase(accepted_.lower_bound({victim, 0, 0}),
                        accepted_.upper_bound({victim, UINT64_MAX, UINT64_MAX}));
      }
      senders_[a] = {inc, seq};
      lru_.push_back(a);
      accepted_.insert({a, inc, seq});
      return verdict::fresh;
    }
    lru_.erase(std::find(lru_.begin(), lru_.end(), a));
    lru_.push_back(a);
    auto& [cur_inc, highest] = it->second;
    if (inc < cur_inc) return verdict::stale_incarnation;
    if (inc > cur_inc || seq > highest) {
      cur_inc = inc;
      highest = seq;
      accepted_.insert({a, inc, seq});
      return verdict::fresh;
    }
    if (highest - seq > window_) return verdict::too_old;
    if (!accepted_.insert({a, inc, seq}).second) return verdict::duplicate;
    ++fresh_reordered;
    return verdict::fresh;
  }

  std::size_t senders() const { return senders_.size(); }
  std::size_t fresh_reordered = 0;

 private:
  std::uint64_t window_;
  std::size_t max_senders_;
  std::map<node_address, std::pair<std::uint64_t, std::uint64_t>> senders_;  // inc, highest
  std::set<std::tuple<node_address, std::uint64_t, std::uint64_t>> accepted_;
  std::vector<node_address> lru_;  // back = most recent
};

struct message {
  std::uint64_t inc;
  std::uint64_t seq;
};

/// One sender's stream: in-order seqs, occasional gaps and restarts; delivery
/// picks a random in-flight message (reordering) or replays a recent one.
struct sender_stream {
  std::uint64_t inc = 1;
  std::uint64_t next_seq = 0;
  std::vector<message> in_flight;
  std::deque<message> delivered;
};

std::uint64_t test_seed() {
  if (const char* env = std::getenv("ARCHIPELAGO_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return 20240611;
}

}  // namespace

TEST_CASE("dedup_window matches a reference model on reordered, duplicated streams") {
  const std::uint64_t seed = test_seed();
  MESSAGE("seed = " << seed << " (override with ARCHIPELAGO_TEST_SEED)");
  CAPTURE(seed);
  prng rng(seed);

  std::map<verdict, std::size_t> counts;
  std::size_t reordered = 0;
  const std::vector<node_address> addresses = {learner(0), learner(1), learner(2), learner(3),
                                               shard(0),   shard(1),   shard(2),
                                               {role::sync_broker, 0}};
  for (std::uint32_t window : {0u, 1u, 7u, 64u, 100u, 1024u}) {
    for (std::size_t max_senders : {std::size_t{4096}, std::size_t{3}}) {
      CAPTURE(window);
      CAPTURE(max_senders);
      dedup_window dedup(window, max_senders);
      reference_dedup reference(window, max_senders);
      std::map<node_address, sender_stream> streams;
      for (int step = 0; step < 20'000; ++step) {
        const node_address a = addresses[rng.below(addresses.size())];
        sender_stream& s = streams[a];
        const double r = rng.uniform();
        if (r < 0.01) {
          ++s.inc;  // restart; older in-flight messages become stale
          s.next_seq = rng.below(4);
        } else if (r < 0.04) {
          s.next_seq += 1 + rng.below(3 * std::uint64_t{window} + 3);  // lost messages
        }
        if (rng.uniform() < 0.75) s.in_flight.push_back({s.inc, s.next_seq++});

        message m;
        if (rng.uniform() < 0.2 && !s.delivered.empty()) {
          m = s.delivered[rng.below(s.delivered.size())];
        } else if (!s.in_flight.empty()) {
          const std::size_t k = rng.below(s.in_flight.size());
          m = s.in_flight[k];
          s.in_flight[k] = s.in_flight.back();
          s.in_flight.pop_back();
        } else {
          continue;
        }
        s.delivered.push_back(m);
        if (s.delivered.size() > 48) s.delivered.pop_front();

        const verdict want = reference.check(a, m.inc, m.seq);
        const verdict got = dedup.check(a, inc_of(m.inc), m.seq);
        if (got != want) {
          CAPTURE(step);
          CAPTURE(a);
          CAPTURE(m.inc);
          CAPTURE(m.seq);
          REQUIRE(got == want);
        }
        ++counts[got];
        REQUIRE(dedup.senders() == reference.senders());
      }
      reordered += reference.fresh_reordered;
    }
  }
  // The streams exercised every verdict, including fresh out-of-order arrivals.
  CHECK(counts[verdict::fresh] > 1000);
  CHECK(counts[verdict::duplicate] > 1000);
  CHECK(counts[verdict::stale_incarnation] > 100);
  CHECK(counts[verdict::too_old] > 100);
  CHECK(reordered > 1000);
}
