#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/mesh_setup.hpp"
#include "core/prng.hpp"
#include "sync_broker/broker_core.hpp"
#include "sync_broker/broker_wire.hpp"

using namespace archipelago;

namespace {

constexpr nanos ms = 1'000'000;

learner_index L(std::uint32_t i) { return learner_index{i}; }
incarnation I(std::uint64_t i) { return incarnation{i}; }
round_number R(std::uint64_t r) { return round_number{r}; }

broker_config make_config(int fragments = 3, int tau = 2, int quorum = 1) {
  broker_config cfg;
  cfg.fragments = fragments;
  cfg.rounds_in_flight = tau;
  cfg.quorum = quorum;
  cfg.shard_of_fragment = round_robin_shards(fragments, 2);
  return cfg;
}

// A broker driven by a manual clock, with every effect kept in order.
struct harness {
  explicit harness(broker_config cfg) : core(std::move(cfg)) {}

  broker_core core;
  manual_clock clock;
  std::vector<broker_effect> log;

  nanos now() const { return clock.now(); }
  void at(nanos t) { clock.set(t); }
  void drain() {
    for (auto& e : core.take_effects()) log.push_back(std::move(e));
  }
  void tick(nanos t) { at(t); core.tick(t); drain(); }
  void join(std::uint32_t l, std::uint64_t inc = 1) { core.on_join(L(l), I(inc), now()); drain(); }
  void step(std::uint32_t l, std::uint64_t steps, nanos step_time, std::uint64_t inc = 1) {
    core.on_progress(L(l), I(inc), steps, step_time, now());
    drain();
  }
  void contribute(std::uint64_t r, std::uint32_t l, std::uint64_t tokens = 100, std::uint64_t steps = 1,
                  std::uint64_t inc = 1) {
    core.on_contribution(R(r), L(l), I(inc), tokens, steps, now());
    drain();
  }

  template <class T>
  std::vector<T> all() const {
    std::vector<T> out;
    for (const auto& e : log) {
      if (const T* x = std::get_if<T>(&e)) out.push_back(*x);
    }
    return out;
  }
  std::vector<close_round> closes_of(std::uint64_t r) const {
    std::vector<close_round> out;
    for (const auto& c : all<close_round>()) {
      if (c.round.value == r) out.push_back(c);
    }
    return out;
  }
};

// Two learners joined at t = 0 with one step done each; round 0 opened at t = 0.
harness two_learners(broker_config cfg, nanos fast_step = 10 * ms, nanos slow_step = 30 * ms) {
  harness h(std::move(cfg));
  h.join(0);
  h.join(1);
  h.step(0, 1, fast_step);
  h.step(1, 1, slow_step);
  h.tick(0);
  return h;
}

std::string describe(const broker_effect& e) {
  std::string s;
  if (const auto* o = std::get_if<open_round>(&e)) {
    s = "open r" + std::to_string(o->round.value) + " p" + std::to_string(o->fragment.value) + " s" +
        std::to_string(o->shard) + " [";
    for (const auto& l : o->eligible) s += std::to_string(l.learner.value) + "." + std::to_string(l.inc.value) + " ";
    s += "]";
  } else if (const auto* c = std::get_if<close_round>(&e)) {
    s = "close r" + std::to_string(c->round.value) + " " + to_string(c->reason) + " q" +
        std::to_string(c->quorum_ns) + " g" + std::to_string(c->grace_ns) + " [";
    for (const auto& m : c->members) {
      s += std::to_string(m.learner.value) + "." + std::to_string(m.inc.value) + ":" +
           std::to_string(m.tokens) + "/" + std::to_string(m.steps) + "=" + std::to_string(m.weight) + " ";
    }
    s += "]";
  } else if (const auto* l = std::get_if<late_contribution>(&e)) {
    s = "late r" + std::to_string(l->round.value) + " " + std::to_string(l->learner.value) + "." +
        std::to_string(l->inc.value) + " t" + std::to_string(l->tokens);
  } else if (const auto* d = std::get_if<learner_dead>(&e)) {
    s = "dead " + std::to_string(d->learner.value) + "." + std::to_string(d->inc.value);
  }
  return s;
}

}  // namespace

TEST_CASE("broker config validation names the field") {
  CHECK(validate(make_config()).has_value());
  auto expect_error = [](broker_config cfg, const std::string& field) {
    const status st = validate(cfg);
    REQUIRE_FALSE(st.has_value());
    CHECK(st.err().code == errc::invalid_input);
    CHECK(st.err().message.find(field) != std::string::npos);
  };
  auto cfg = make_config();
  cfg.quorum = 0;
  expect_error(cfg, "quorum");
  cfg = make_config();
  cfg.fragments = 0;
  expect_error(cfg, "fragments");
  cfg = make_config();
  cfg.rounds_in_flight = 0;
  expect_error(cfg, "rounds_in_flight");
  cfg = make_config();
  cfg.grace_factor = -0.1;
  expect_error(cfg, "grace_factor");
  cfg = make_config();
  cfg.ema_alpha = 0;
  expect_error(cfg, "ema_alpha");
  cfg = make_config();
  cfg.liveness_timeout_ns = 0;
  expect_error(cfg, "liveness_timeout_ns");
  cfg = make_config();
  cfg.round_timeout_ns = -1;
  expect_error(cfg, "round_timeout_ns");
  cfg = make_config();
  cfg.shard_of_fragment.pop_back();
  expect_error(cfg, "shard_of_fragment");
  CHECK_FALSE(broker_core::create(cfg).has_value());
  CHECK(broker_core::create(make_config()).has_value());
}

TEST_CASE("first round opens on the first tick with K eligible learners") {
  harness h(make_config(3, 2, 2));
  h.join(0);
  h.join(1);
  h.tick(0);
  CHECK(h.all<open_round>().empty());  // joined, no step yet: not eligible
  h.step(0, 1, 10 * ms);
  h.tick(1 * ms);
  CHECK(h.all<open_round>().empty());  // one eligible < K = 2
  h.step(1, 1, 20 * ms);
  h.tick(2 * ms);
  const auto opens = h.all<open_round>();
  REQUIRE(opens.size() == 1);
  CHECK(opens[0].round.value == 0);
  CHECK(opens[0].fragment.value == 0);
  CHECK(opens[0].eligible.size() == 2);
  CHECK(h.core.xi_step_ns() == 10 * ms);  // fastest learner before any quorum
}

TEST_CASE("K=1 without grace closes on the first arrival, later arrivals are late") {
  auto cfg = make_config();
  cfg.adaptive_grace = false;
  auto h = two_learners(cfg);
  h.at(3 * ms);
  h.contribute(0, 0, 400, 4);
  const auto closes = h.closes_of(0);
  REQUIRE(closes.size() == 1);
  CHECK(closes[0].reason == close_reason::grace_expired);
  CHECK(closes[0].grace_ns == 0);
  CHECK(closes[0].quorum_ns == 3 * ms);
  CHECK(closes[0].merge());
  REQUIRE(closes[0].members.size() == 1);
  CHECK(closes[0].members[0].learner == L(0));

  h.at(5 * ms);
  h.contribute(0, 1, 300, 3);
  const auto late = h.all<late_contribution>();
  REQUIRE(late.size() == 1);
  CHECK(late[0].round == R(0));
  CHECK(late[0].learner == L(1));
  CHECK(late[0].tokens == 300);
  CHECK(h.core.counters().late == 1);
  const round_record* rec = h.core.find_record(R(0));
  REQUIRE(rec != nullptr);
  REQUIRE(rec->late.size() == 1);
  CHECK(rec->late[0].learner == L(1));
  CHECK(rec->closed_ns == 3 * ms);
  CHECK(rec->opened_ns == 0);

  // The same late contribution again, or a member repeating itself, is a duplicate.
  h.contribute(0, 1, 300, 3);
  h.contribute(0, 0, 400, 4);
  CHECK(h.core.counters().late == 1);
  CHECK(h.core.counters().duplicates == 2);
  CHECK(h.all<late_contribution>().size() == 1);
}

TEST_CASE("a member a shard rejected at the close moves to the record's screened_out") {
  auto cfg = make_config();
  cfg.adaptive_grace = false;
  cfg.quorum = 2;
  auto h = two_learners(cfg);
  h.at(3 * ms);
  h.contribute(0, 0, 400, 4);
  h.contribute(0, 1, 300, 3);
  const round_record* rec = h.core.find_record(R(0));
  REQUIRE(rec != nullptr);
  REQUIRE(rec->members.size() == 2);
  const fragment_index p = rec->fragment;
  h.core.on_member_rejected(R(0), fragment_index{p.value + 1}, {L(1), I(1)});  // another fragment: nothing
  h.core.on_member_rejected(R(0), p, {L(1), I(2)});                          // another incarnation: nothing
  CHECK(rec->members.size() == 2);
  h.core.on_member_rejected(R(0), p, {L(1), I(1)});
  REQUIRE(rec->members.size() == 1);
  CHECK(rec->members[0].learner == L(0));
  REQUIRE(rec->screened_out.size() == 1);
  CHECK(rec->screened_out[0].learner == L(1));
  CHECK(rec->screened_out[0].tokens == 300);
  h.core.on_member_rejected(R(0), p, {L(1), I(1)});  // a repeated notice changes nothing
  CHECK(rec->members.size() == 1);
  CHECK(rec->screened_out.size() == 1);
}

TEST_CASE("adaptive grace waits the computed window") {
  auto cfg = make_config(3, 2, 1);
  cfg.grace_factor = 0.5;
  auto h = two_learners(cfg);  // ξ_step = 10 ms (fastest learner)
  h.at(2 * ms);
  h.contribute(0, 0);
  // ξ_quorum = 2 ms, ξ_sync = 0: grace = 0.5 · (2 · 10 − 2 − 0) = 9 ms, below the ξ_step cap.
  CHECK(h.core.xi_quorum_ns() == doctest::Approx(2.0 * ms));
  CHECK(h.closes_of(0).empty());
  h.tick(10 * ms);  // also opens round 1 (one ξ_step after round 0)
  CHECK(h.closes_of(0).empty());
  h.tick(11 * ms - 1);
  CHECK(h.closes_of(0).empty());
  h.tick(11 * ms);
  auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  CHECK(c0[0].reason == close_reason::grace_expired);
  CHECK(c0[0].grace_ns == 9 * ms);
  CHECK(c0[0].quorum_ns == 2 * ms);

  // ξ_sync from the publication, then a second round folds both into its grace.
  h.at(12 * ms);
  h.core.on_published(R(0), fragment_index{0}, 1, h.now());
  CHECK(h.core.xi_sync_ns() == doctest::Approx(1.0 * ms));
  CHECK(h.core.find_record(R(0))->published_version == 1);
  h.at(13 * ms);
  h.contribute(1, 0);  // round 1 opened at 10 ms: quorum after 3 ms
  const double xi_quorum = 0.5 * 3 * ms + 0.5 * 2 * ms;
  CHECK(h.core.xi_quorum_ns() == doctest::Approx(xi_quorum));
  const double step = static_cast<double>(*h.core.xi_step_ns());
  CHECK(step == doctest::Approx(10.0 * ms));
  const double expected = std::clamp(0.5 * (2 * step - xi_quorum - 1.0 * ms), 0.0, step);
  CHECK(expected == doctest::Approx(8.25 * ms));
  h.tick(13 * ms + std::llround(expected));
  auto c1 = h.closes_of(1);
  REQUIRE(c1.size() == 1);
  CHECK(c1[0].grace_ns == std::llround(expected));
  CHECK(c1[0].reason == close_reason::grace_expired);
}

TEST_CASE("grace is capped at one step time") {
  auto cfg = make_config(3, 4, 1);
  cfg.grace_factor = 0.8;
  auto h = two_learners(cfg);
  h.at(1 * ms);
  h.contribute(0, 0);  // 0.8 · (4 · 10 − 1) = 31.2 ms > ξ_step = 10 ms
  h.tick(11 * ms);
  auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  CHECK(c0[0].grace_ns == 10 * ms);
}

TEST_CASE("a round closes early when every eligible learner has contributed") {
  auto h = two_learners(make_config());
  h.at(2 * ms);
  h.contribute(0, 0);
  CHECK(h.closes_of(0).empty());
  h.at(3 * ms);
  h.contribute(0, 1);
  auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  CHECK(c0[0].reason == close_reason::all_eligible);
  CHECK(c0[0].members.size() == 2);
  CHECK(h.core.counters().closed_all_eligible == 1);
}

TEST_CASE("wait_for_all waits for the slow learner") {
  auto cfg = make_config(3, 2, 1);
  cfg.wait_for_all = true;
  auto h = two_learners(cfg);
  h.at(2 * ms);
  h.contribute(0, 0);
  for (nanos t = 3 * ms; t < 500 * ms; t += 7 * ms) h.tick(t);
  CHECK(h.closes_of(0).empty());
  h.at(500 * ms);
  h.contribute(0, 1);
  auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  CHECK(c0[0].reason == close_reason::all_eligible);
  CHECK(c0[0].members.size() == 2);
  CHECK(c0[0].quorum_ns == 2 * ms);
}

TEST_CASE("tau bounds the rounds in flight per shard, a full shard's or an undurable fragment's turn passes") {
  auto cfg = make_config(3, 2, 1);  // fragments 0 and 2 on shard 0, fragment 1 on shard 1
  cfg.adaptive_grace = false;
  harness h(cfg);
  h.join(0);
  h.step(0, 1, 10 * ms);
  for (nanos t = 0; t <= 50 * ms; t += 1 * ms) h.tick(t);
  auto opens = h.all<open_round>();
  // Nothing closes. Turns come 10 ms apart: rounds 0, 1, 2 and 4 open; turns 3
  // and 5 (shard 0 holds its τ = 2) pass without a round, and shard 1 is not held back.
  REQUIRE(opens.size() == 4);
  const std::uint64_t expected[] = {0, 1, 2, 4};
  for (std::size_t k = 0; k < opens.size(); ++k) {
    CAPTURE(k);
    CHECK(opens[k].round.value == expected[k]);
    CHECK(opens[k].fragment.value == expected[k] % 3);
    CHECK(opens[k].shard == (expected[k] % 3) % 2);
  }
  CHECK(h.core.counters().rounds_skipped == 2);
  CHECK(h.core.rounds_open() == 4);
  // Round 0 merges; until its version is durable (published), fragment 0's turn
  // passes although shard 0 has a free slot.
  h.at(51 * ms);
  h.contribute(0, 0);
  REQUIRE(h.closes_of(0).size() == 1);
  h.tick(60 * ms);  // turn 6: fragment 0
  CHECK(h.all<open_round>().size() == 4);
  CHECK(h.core.counters().rounds_skipped == 3);
  h.at(61 * ms);
  h.core.on_published(R(0), fragment_index{0}, 1, h.now());
  h.tick(70 * ms);  // turn 7: fragment 1, shard 1 full
  h.tick(80 * ms);  // turn 8: fragment 2, shard 0 has a slot
  opens = h.all<open_round>();
  REQUIRE(opens.size() == 5);
  CHECK(opens.back().round.value == 8);
  CHECK(opens.back().fragment.value == 2);
  CHECK(opens.back().eligible.size() == 1);
  CHECK(h.core.counters().rounds_opened == 5);
  CHECK(h.core.counters().rounds_skipped == 4);
}

TEST_CASE("back-pressure: a shard with storage_backlog versions not yet durable has its turns held, counted once each") {
  // Two shards (fragments 0 and 2 on shard 0, 1 and 3 on shard 1), one version each may wait for storage.
  auto cfg = make_config(4, 2, 1);
  cfg.adaptive_grace = false;
  cfg.storage_backlog = 1;
  harness h(cfg);
  h.join(0);
  h.step(0, 1, 10 * ms);
  h.tick(0);  // round 0: fragment 0
  h.contribute(0, 0);
  h.tick(10 * ms);  // round 1: fragment 1
  h.contribute(1, 0);
  REQUIRE(h.all<close_round>().size() == 2);
  CHECK(h.core.undurable_versions(0, h.now()) == 1);
  CHECK(h.core.undurable_versions(1, h.now()) == 1);
  h.tick(20 * ms);  // turn 2 (fragment 2, shard 0) and turn 3 (fragment 3, shard 1): held, passed
  h.tick(30 * ms);
  h.tick(35 * ms);  // looked at again: counted once per turn
  CHECK(h.all<open_round>().size() == 2);
  CHECK(h.core.counters().rounds_held_for_storage == 2);
  h.at(41 * ms);
  h.core.on_published(R(0), fragment_index{0}, 1, h.now());  // shard 0's version durable
  CHECK(h.core.undurable_versions(0, h.now()) == 0);
  h.tick(40 * ms + 2 * ms);  // turn 4: fragment 0 itself, free again
  h.tick(52 * ms);           // turn 5: fragment 1, not durable yet: passes (not a storage hold)
  h.tick(62 * ms);           // turn 6: fragment 2, shard 0 free
  const auto opens = h.all<open_round>();
  REQUIRE(opens.size() == 4);
  CHECK(opens[2].fragment.value == 0);
  CHECK(opens[3].fragment.value == 2);
  CHECK(h.core.counters().rounds_held_for_storage == 2);

  // One shard: its held turn is waited for, not passed; counted once however long it waits.
  auto one = make_config(2, 2, 1);
  one.adaptive_grace = false;
  one.shard_of_fragment = round_robin_shards(2, 1);
  one.storage_backlog = 1;
  harness h1(one);
  h1.join(0);
  h1.step(0, 1, 10 * ms);
  h1.tick(0);
  h1.contribute(0, 0);
  for (nanos t = 1 * ms; t <= 40 * ms; t += 1 * ms) h1.tick(t);
  CHECK(h1.all<open_round>().size() == 1);
  CHECK(h1.core.counters().rounds_held_for_storage == 1);
  CHECK(h1.core.counters().rounds_skipped == 0);
  h1.at(41 * ms);
  h1.core.on_published(R(0), fragment_index{0}, 1, h1.now());
  h1.tick(42 * ms);
  REQUIRE(h1.all<open_round>().size() == 2);
  CHECK(h1.all<open_round>().back().round.value == 1);  // the waiting turn

  // storage_backlog 0: never held.
  auto off = make_config(4, 2, 1);
  off.adaptive_grace = false;
  harness h0(off);
  h0.join(0);
  h0.step(0, 1, 10 * ms);
  h0.tick(0);
  h0.contribute(0, 0);
  h0.tick(10 * ms);
  h0.tick(20 * ms);  // fragment 2 on shard 0 opens although fragment 0's version is not durable
  CHECK(h0.all<open_round>().size() == 3);
  CHECK(h0.core.counters().rounds_held_for_storage == 0);
  auto bad = make_config();
  bad.storage_backlog = -1;
  CHECK_FALSE(broker_core::create(bad).has_value());
}

TEST_CASE("one shard's turns wait for its slot, a silent shard's fragments pause while the others keep their pace") {
  // One shard: a full τ holds its next turn (it holds nobody else back).
  auto one = make_config(2, 1, 1);
  one.adaptive_grace = false;
  one.shard_of_fragment = round_robin_shards(2, 1);
  harness h1(one);
  h1.join(0);
  h1.step(0, 1, 10 * ms);
  for (nanos t = 0; t <= 30 * ms; t += 1 * ms) h1.tick(t);
  CHECK(h1.all<open_round>().size() == 1);
  CHECK(h1.core.counters().rounds_skipped == 0);
  h1.at(31 * ms);
  h1.contribute(0, 0);
  h1.core.on_published(R(0), fragment_index{0}, 1, h1.now());
  h1.tick(32 * ms);
  REQUIRE(h1.all<open_round>().size() == 2);
  CHECK(h1.all<open_round>().back().round.value == 1);  // the waiting turn, not a later one

  // Two shards, shard 1 silent: its fragments' turns pass, shard 0's open every other turn as before.
  auto two = make_config(4, 2, 1);
  two.adaptive_grace = false;
  harness h(two);
  h.join(0);
  h.step(0, 1, 10 * ms);
  h.tick(0);
  h.core.on_shard_lost(1, h.now());
  h.drain();
  CHECK(h.core.counters().shards_lost == 1);
  CHECK_FALSE(h.core.is_shard_live(1));
  for (nanos t = 1 * ms; t <= 200 * ms; t += 1 * ms) {
    h.tick(t);
    for (const open_round& o : h.all<open_round>())  // shard 0's rounds merge and publish at once
      if (h.closes_of(o.round.value).empty()) {
        h.contribute(o.round.value, 0);
        h.core.on_published(o.round, o.fragment, o.round.value + 1, h.now());
      }
  }
  std::vector<std::uint64_t> opened;
  for (const open_round& o : h.all<open_round>()) {
    CHECK(o.shard == 0);
    opened.push_back(o.round.value);
  }
  // Turns 0..20 came 10 ms apart; shard 0's are the even ones (fragments 0 and 2).
  CHECK(opened == std::vector<std::uint64_t>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20});
  CHECK(h.core.counters().rounds_skipped == 10);
  // Heard again: its fragments' turns open rounds again.
  h.core.on_shard_alive(1, h.now());
  h.tick(210 * ms);
  CHECK(h.all<open_round>().back().round.value == 21);
  CHECK(h.all<open_round>().back().shard == 1);
}

TEST_CASE("rounds are paced one xi_step apart") {
  auto cfg = make_config(24, 8, 1);
  cfg.adaptive_grace = false;
  harness h(cfg);
  h.join(0);
  h.step(0, 1, 10 * ms);
  for (nanos t = 0; t <= 25 * ms; t += 1 * ms) h.tick(t);
  auto opens = h.all<open_round>();
  REQUIRE(opens.size() == 3);  // at 0, 10 and 20 ms
  CHECK(h.core.find_record(R(0)) == nullptr);

  // Once learner 0 is the quorum, its reports feed the pooled estimate.
  h.contribute(0, 0);
  h.step(0, 2, 30 * ms);
  CHECK(h.core.xi_step_ns() == 30 * ms);  // first pooled sample
  for (nanos t = 26 * ms; t <= 49 * ms; t += 1 * ms) h.tick(t);
  CHECK(h.all<open_round>().size() == 3);
  h.tick(50 * ms);  // 20 ms + 30 ms
  CHECK(h.all<open_round>().size() == 4);
  h.step(0, 3, 10 * ms);  // pooled EMA: 0.5 · 10 + 0.5 · 30 = 20 ms
  CHECK(h.core.xi_step_ns() == 20 * ms);
  h.tick(69 * ms);
  CHECK(h.all<open_round>().size() == 4);
  h.tick(70 * ms);
  CHECK(h.all<open_round>().size() == 5);
}

TEST_CASE("a dead learner is no longer waited for and the round closes") {
  auto cfg = make_config(3, 2, 1);
  cfg.wait_for_all = true;
  auto h = two_learners(cfg);
  h.at(100 * ms);
  h.contribute(0, 0);
  nanos t = 100 * ms;
  for (; t < 3000 * ms; t += 250 * ms) {
    h.at(t);
    h.step(0, 2, 10 * ms);  // learner 0 keeps talking, learner 1 is silent
    h.tick(t);
  }
  CHECK(h.closes_of(0).empty());
  CHECK(h.all<learner_dead>().empty());
  h.tick(3000 * ms);
  auto dead = h.all<learner_dead>();
  REQUIRE(dead.size() == 1);
  CHECK(dead[0].learner == L(1));
  CHECK(dead[0].inc == I(1));
  CHECK_FALSE(h.core.is_live(L(1)));
  auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  CHECK(c0[0].reason == close_reason::all_eligible);
  CHECK(c0[0].members.size() == 1);
  // New rounds no longer list it.
  const auto opens = h.all<open_round>();
  CHECK(opens.back().eligible.size() == 1);
  CHECK(h.core.counters().learners_dead == 1);
}

TEST_CASE("a learner still fetching the model is left to the transport's verdict, not the message timeout") {
  auto cfg = make_config(3, 2, 1);
  harness h(cfg);
  h.join(0);  // joined, downloading: no Progress for minutes over a slow link
  h.join(1);
  for (nanos t = 0; t <= 20 * cfg.liveness_timeout_ns; t += cfg.liveness_timeout_ns / 2) h.tick(t);
  CHECK(h.all<learner_dead>().empty());
  CHECK(h.core.is_live(L(0)));
  h.core.on_peer_lost(L(1), h.now());  // the transport's verdict still counts
  CHECK_FALSE(h.core.is_live(L(1)));
  h.step(0, 1, 10 * ms);  // it stepped: from now on silence is judged by the timeout too
  h.tick(21 * cfg.liveness_timeout_ns);
  const auto dead = h.all<learner_dead>();
  REQUIRE_FALSE(dead.empty());
  CHECK(dead.back().learner == L(0));
  CHECK_FALSE(h.core.is_live(L(0)));
}

TEST_CASE("rejoin with a higher incarnation resets counters, stale incarnations are ignored") {
  auto cfg = make_config(3, 2, 1);
  cfg.wait_for_all = true;
  auto h = two_learners(cfg);
  h.step(1, 50, 30 * ms);
  CHECK(h.core.is_eligible(L(1)));
  h.at(5 * ms);
  h.join(1, 2);  // restarted process
  CHECK(h.core.is_live(L(1)));
  CHECK_FALSE(h.core.is_eligible(L(1)));  // no step since it joined
  // Round 0 was opened for incarnation 1: it no longer waits for learner 1.
  h.contribute(0, 0);
  auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  CHECK(c0[0].reason == close_reason::all_eligible);

  // Messages of the old incarnation are stale.
  h.step(1, 51, 30 * ms, 1);
  h.core.on_join(L(1), I(1), h.now());
  h.tick(10 * ms);  // opens round 1
  h.contribute(1, 1, 100, 1, 1);
  CHECK(h.core.counters().stale == 3);
  CHECK(h.closes_of(1).empty());
  CHECK_FALSE(h.core.is_eligible(L(1)));
  auto opens = h.all<open_round>();
  REQUIRE(opens.size() == 2);
  CHECK(opens[1].eligible.size() == 1);

  h.step(1, 1, 30 * ms, 2);
  CHECK(h.core.is_eligible(L(1)));
  h.contribute(1, 0);  // round 1 closes: learner 1 was not eligible at open
  h.tick(20 * ms);
  opens = h.all<open_round>();
  REQUIRE(opens.size() == 3);
  REQUIRE(opens[2].eligible.size() == 2);
  CHECK(opens[2].eligible[1].learner == L(1));
  CHECK(opens[2].eligible[1].inc == I(2));
}

TEST_CASE("a departed learner is not waited for, its incarnation stays closed") {
  auto cfg = make_config(3, 2, 1);
  cfg.wait_for_all = true;
  auto h = two_learners(cfg);
  h.at(2 * ms);
  h.contribute(0, 0);
  CHECK(h.closes_of(0).empty());
  h.core.on_leave(L(1), I(1), h.now());
  h.drain();
  REQUIRE(h.closes_of(0).size() == 1);
  h.step(1, 2, 30 * ms, 1);
  CHECK(h.core.counters().stale == 1);
  CHECK_FALSE(h.core.is_live(L(1)));
  CHECK(h.core.has_departed(L(1)));
  CHECK_FALSE(h.core.has_departed(L(0)));
  h.core.on_peer_lost(L(0), h.now());  // a crash is not a departure
  CHECK_FALSE(h.core.has_departed(L(0)));
  h.core.on_join(L(1), I(2), h.now());  // a restart is back
  CHECK_FALSE(h.core.has_departed(L(1)));
}

TEST_CASE("timeout closes a round without quorum") {
  auto cfg = make_config(3, 2, 2);
  cfg.round_timeout_ns = 100 * ms;
  auto h = two_learners(cfg);
  h.at(5 * ms);
  h.contribute(0, 0);
  for (nanos t = 10 * ms; t < 100 * ms; t += 10 * ms) {
    h.at(t);
    h.step(0, 2, 10 * ms);
    h.step(1, 2, 30 * ms);
    h.tick(t);
  }
  CHECK(h.closes_of(0).empty());
  h.tick(100 * ms);
  auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  CHECK(c0[0].reason == close_reason::timeout);
  CHECK(c0[0].quorum_ns == -1);
  CHECK_FALSE(c0[0].merge());
  CHECK(c0[0].members.size() == 1);
  CHECK(h.core.counters().closed_timeout >= 1);
  CHECK(h.core.find_record(R(0))->reason == close_reason::timeout);
}

TEST_CASE("weights are tokens squared over steps, duplicates and bad input ignored") {
  auto cfg = make_config(3, 2, 1);
  cfg.wait_for_all = true;
  harness h(cfg);
  for (std::uint32_t l = 0; l < 3; ++l) {
    h.join(l);
    h.step(l, 1, 10 * ms);
  }
  h.tick(0);
  h.at(1 * ms);
  h.contribute(0, 0, 1000, 4);
  h.contribute(0, 0, 1000, 4);  // duplicate
  h.contribute(0, 1, 300, 0);   // zero steps: rejected
  h.contribute(7, 1, 300, 3);   // never opened
  CHECK(h.core.counters().duplicates == 1);
  CHECK(h.core.counters().rejected == 1);
  CHECK(h.core.counters().unknown_round == 1);
  h.contribute(0, 1, 300, 3);
  h.contribute(0, 2, 512, 8);
  auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  REQUIRE(c0[0].members.size() == 3);
  CHECK(c0[0].members[0].weight == doctest::Approx(250000.0));
  CHECK(c0[0].members[1].weight == doctest::Approx(30000.0));
  CHECK(c0[0].members[2].weight == doctest::Approx(32768.0));
  CHECK(c0[0].members[0].tokens == 1000);
  CHECK(c0[0].members[0].steps == 4);
}

TEST_CASE("history is bounded") {
  auto cfg = make_config(24, 1, 1);
  cfg.adaptive_grace = false;
  cfg.shard_of_fragment = round_robin_shards(24, 1);  // one shard: its turn waits for its τ = 1 slot
  harness h(cfg);
  h.join(0);
  h.step(0, 1, 0);  // ξ_step = 0: a new round on every tick
  const std::uint64_t total = broker_core::history_capacity + 10;
  for (std::uint64_t r = 0; r < total; ++r) {
    h.core.tick(static_cast<nanos>(r));
    h.core.on_contribution(R(r), L(0), I(1), 10, 1, static_cast<nanos>(r));
    (void)h.core.take_effects();
    h.core.on_published(R(r), fragment_index{static_cast<std::uint32_t>(r % 24)}, r / 24 + 1, static_cast<nanos>(r));  // durable: the fragment's next turn may open
    h.core.on_progress(L(0), I(1), r + 1, 0, static_cast<nanos>(r));
  }
  CHECK(h.core.counters().rounds_closed() == total);
  CHECK(h.core.history().size() == broker_core::history_capacity);
  CHECK(h.core.history().front().round.value == 10);
  CHECK(h.core.find_record(R(5)) == nullptr);
  CHECK(h.core.find_record(R(total - 1)) != nullptr);
  // A contribution for an evicted round is still late.
  h.core.on_contribution(R(3), L(0), I(1), 10, 1, static_cast<nanos>(total));
  CHECK(h.core.counters().late == 1);
}

namespace {

// Several learners of different speeds, one dying and rejoining, publications
// after each merge; everything random comes from one seed.
std::vector<std::string> run_scenario(std::uint64_t seed, broker_counters* counters_out) {
  prng rng(seed);
  auto cfg = make_config(6, 2, 1);
  cfg.liveness_timeout_ns = 200 * ms;
  harness h(cfg);
  struct sim_learner {
    explicit sim_learner(nanos step) : step_ns(step) {}
    nanos step_ns;
    nanos next_step_ns = 0;
    std::uint64_t inc = 1;
    std::uint64_t steps = 0;
    std::uint64_t c_steps = 0;
    bool alive = true;
    std::set<std::uint64_t> answered;
  };
  std::vector<sim_learner> learners = {sim_learner(5 * ms), sim_learner(8 * ms), sim_learner(13 * ms),
                                       sim_learner(21 * ms)};
  std::vector<std::pair<nanos, close_round>> to_publish;
  std::set<std::uint64_t> open_rounds;
  std::size_t seen = 0;
  const nanos crash_at = static_cast<nanos>(300 + rng.below(200)) * ms;
  const nanos rejoin_at = crash_at + static_cast<nanos>(300 + rng.below(200)) * ms;

  for (nanos t = 0; t <= 2000 * ms; t += 1 * ms) {
    h.at(t);
    if (t == crash_at) learners[3].alive = false;
    if (t == rejoin_at) {
      learners[3].alive = true;
      learners[3].inc = 2;
      learners[3].steps = learners[3].c_steps = 0;
      learners[3].answered.clear();
      learners[3].next_step_ns = t;
      h.join(3, 2);
    }
    for (std::uint32_t l = 0; l < learners.size(); ++l) {
      auto& sl = learners[l];
      if (!sl.alive || t < sl.next_step_ns) continue;
      const auto jitter = static_cast<nanos>(rng.below(static_cast<std::uint64_t>(sl.step_ns / 4)));
      const nanos took = sl.step_ns + jitter;
      sl.next_step_ns = t + took;
      ++sl.steps;
      ++sl.c_steps;
      h.step(l, sl.steps, took, sl.inc);
      for (std::uint64_t r : open_rounds) {
        if (sl.answered.insert(r).second) {
          h.contribute(r, l, sl.c_steps * (l == 2 ? 64 : 128), sl.c_steps, sl.inc);
        }
      }
    }
    while (!to_publish.empty() && to_publish.front().first <= t) {
      const close_round& c = to_publish.front().second;
      h.core.on_published(c.round, c.fragment, c.round.value + 1, t);
      to_publish.erase(to_publish.begin());
    }
    h.tick(t);
    for (; seen < h.log.size(); ++seen) {
      if (const auto* o = std::get_if<open_round>(&h.log[seen])) open_rounds.insert(o->round.value);
      if (const auto* c = std::get_if<close_round>(&h.log[seen])) {
        open_rounds.erase(c->round.value);
        if (c->merge()) {
          to_publish.push_back({t + static_cast<nanos>(1 + rng.below(3)) * ms, *c});
          for (const auto& m : c->members) learners[m.learner.value].c_steps = 0;
        }
      }
    }
  }
  std::vector<std::string> out;
  for (const auto& e : h.log) out.push_back(describe(e));
  if (counters_out != nullptr) *counters_out = h.core.counters();
  return out;
}

}  // namespace

TEST_CASE("a seeded randomized scenario is deterministic") {
  for (std::uint64_t seed : {1ULL, 42ULL, 20260429ULL}) {
    CAPTURE(seed);
    broker_counters first_counters;
    broker_counters second_counters;
    const auto first = run_scenario(seed, &first_counters);
    const auto second = run_scenario(seed, &second_counters);
    CHECK(first == second);
    CHECK(first_counters.rounds_opened > 50);
    CHECK(first_counters.rounds_closed() + 2 >= first_counters.rounds_opened);
    CHECK(first_counters.learners_dead == 1);
    CHECK(first_counters.stale == 0);
    CHECK(first_counters.late > 0);  // slow learners miss K=1 rounds
    CHECK(first_counters.rounds_opened == second_counters.rounds_opened);
    CHECK(first_counters.late == second_counters.late);
  }
  CHECK(run_scenario(1, nullptr) != run_scenario(42, nullptr));  // the seed matters
}

TEST_CASE("the transport's liveness: a silent learner is dead at once, a heartbeat revives it") {
  auto cfg = make_config(3, 1, 1);
  cfg.wait_for_all = true;
  auto h = two_learners(cfg);
  REQUIRE(h.closes_of(0).empty());  // round 0 waits for learner 1
  h.at(20 * ms);
  h.core.on_peer_lost(L(1), h.now());  // no message and no heartbeat for the transport's timeout
  h.drain();
  CHECK_FALSE(h.core.is_live(L(1)));
  REQUIRE(h.all<learner_dead>().size() == 1);
  h.contribute(0, 0);  // round 0 no longer waits for it
  REQUIRE(h.closes_of(0).size() == 1);
  CHECK(h.closes_of(0)[0].reason == close_reason::all_eligible);
  // A learner waiting for parameters sends nothing but heartbeats; they keep it a member.
  h.at(30 * ms);
  h.core.on_peer_alive(L(1), h.now());
  h.drain();
  CHECK(h.core.is_live(L(1)));
  CHECK(h.core.is_eligible(L(1)));
  h.core.on_peer_lost(L(1), h.now());  // reported once per death
  h.core.on_peer_lost(L(1), h.now());
  h.drain();
  CHECK(h.all<learner_dead>().size() == 2);
  h.core.on_peer_alive(L(7), h.now());  // never joined: nothing to revive
  CHECK_FALSE(h.core.is_live(L(7)));
}

TEST_CASE("a restarted shard's open rounds close without a merge, rounds go on, a resumed broker numbers on") {
  // Three fragments on two shards: rounds 0 and 1 are open (τ = 2), fragment 0 on shard 0, 1 on shard 1.
  harness h = two_learners(make_config(3, 2, 1));
  h.tick(20 * ms);
  REQUIRE(h.core.rounds_open() == 2);
  h.core.on_shard_restarted(0, h.now());  // shard 0 lost whatever round 0 held
  h.drain();
  const auto closed = h.closes_of(0);
  REQUIRE(closed.size() == 1);
  CHECK_FALSE(closed[0].merge());
  CHECK(h.core.counters().rounds_aborted == 1);
  CHECK(h.closes_of(1).empty());  // shard 1's round is untouched
  h.tick(200 * ms);
  CHECK(h.core.rounds_open() == 2);  // a new round took the aborted one's place
  CHECK(h.all<open_round>().back().round.value == 2);

  broker_config resumed = make_config();
  resumed.first_round = 500;
  harness r = two_learners(resumed);
  REQUIRE(!r.all<open_round>().empty());
  CHECK(r.all<open_round>().front().round.value == 500);
}

// Regression (the corruption drill in the simulation): a round that lost its
// RoundOpen or contributions used to hold one of the τ slots until its timeout
// (60 s by default); two such rounds stopped the mesh.
TEST_CASE("a round without quorum closes once a younger round of its fragment merged, not at its timeout") {
  // Two fragments, τ = 2, K = 2: round 0 (fragment 0) never gets learner 1's contribution.
  auto cfg = make_config(2, 2, 2);
  cfg.adaptive_grace = false;
  harness h = two_learners(cfg, 10 * ms, 10 * ms);
  h.contribute(0, 0);
  h.tick(10 * ms);  // round 1 (fragment 1) opens
  REQUIRE(h.all<open_round>().size() == 2);
  h.contribute(1, 0);
  h.contribute(1, 1);
  REQUIRE(h.closes_of(1).size() == 1);
  h.core.on_published(R(1), fragment_index{1}, 1, h.now());
  h.tick(11 * ms);
  CHECK(h.closes_of(0).empty());  // another fragment's merge says nothing about round 0
  h.tick(20 * ms);  // round 2 (fragment 0) takes round 1's slot
  REQUIRE(h.all<open_round>().size() == 3);
  h.contribute(2, 0, 100, 2);
  h.contribute(2, 1, 100, 2);
  REQUIRE(h.closes_of(2).size() == 1);
  CHECK(h.closes_of(2)[0].merge());
  h.core.on_published(R(2), fragment_index{0}, 1, h.now());
  h.tick(21 * ms);
  const auto c0 = h.closes_of(0);
  REQUIRE(c0.size() == 1);
  CHECK_FALSE(c0[0].merge());
  CHECK(c0[0].members.size() == 1);
  CHECK(h.core.counters().rounds_superseded == 1);
  h.tick(30 * ms);
  h.tick(40 * ms);
  CHECK(h.core.rounds_open() == 2);  // round 0's slot went to a new round (rounds are paced one step apart)
}

// mesh.flush: a learner done with its steps (Progress.finished) stays only to have its
// last work merged. A round of a fragment it holds no work on (it contributed at its
// last step) can never hear from it: held to its timeout, it kept the shard's slots
// from the fragment whose last steps it still had to send, until its flush gave up
// and those steps were lost (CI's python_learner_train).
TEST_CASE("a finished learner is waited for only in rounds of fragments it holds work on") {
  auto cfg = make_config(4, 2, 1);  // fragments 0 and 2 on shard 0, 1 and 3 on shard 1; tau = 2 per shard
  cfg.adaptive_grace = false;
  cfg.round_timeout_ns = 1000 * ms;
  harness h(cfg);
  h.join(0);
  h.step(0, 10, 10 * ms);
  for (nanos t = 0; t <= 30 * ms; t += 10 * ms) h.tick(t);
  REQUIRE(h.all<open_round>().size() == 4);
  auto contribute_at = [&](std::uint64_t r, std::uint32_t p, std::uint64_t step) {
    h.contribute(r, 0, 100, 1);
    h.core.on_contributed(L(0), I(1), fragment_index{p}, step, h.now());
    h.core.on_published(R(r), fragment_index{p}, 1, h.now());
    h.drain();
  };
  // Its last contributions: fragments 0, 2 and 3 at its last step (10), fragment 1 at step 8.
  contribute_at(0, 0, 10);
  contribute_at(1, 1, 8);
  contribute_at(2, 2, 10);
  contribute_at(3, 3, 10);
  for (nanos t = 40 * ms; t <= 70 * ms; t += 10 * ms) h.tick(t);  // before it says it finished: every turn opens
  REQUIRE(h.all<open_round>().size() == 8);
  h.core.on_progress(L(0), I(1), 10, 10 * ms, h.now(), 0, true);
  h.drain();
  for (std::uint64_t r : {4u, 6u, 7u}) {  // fragments 0, 2, 3: nobody can answer them
    CAPTURE(r);
    REQUIRE(h.closes_of(r).size() == 1);
    CHECK_FALSE(h.closes_of(r)[0].merge());
  }
  CHECK(h.closes_of(5).empty());  // fragment 1: its last two steps are still to come
  CHECK(h.core.counters().rounds_unanswerable == 3);
  const std::uint64_t skipped = h.core.counters().rounds_skipped;
  for (nanos t = 80 * ms; t <= 150 * ms; t += 10 * ms) h.tick(t);
  const auto opened = h.all<open_round>();
  REQUIRE(opened.size() == 9);  // one more round of fragment 1 (its shard's second slot), no other
  CHECK(opened.back().fragment.value == 1);
  CHECK(h.core.counters().rounds_skipped > skipped);
  contribute_at(5, 1, 10);
  REQUIRE(h.closes_of(5).size() == 1);
  CHECK(h.closes_of(5)[0].merge());
  CHECK(h.closes_of(5)[0].reason == close_reason::all_eligible);
  const std::uint64_t spare = opened.back().round.value;  // answered nowhere now: it closes too
  REQUIRE(h.closes_of(spare).size() == 1);
  CHECK_FALSE(h.closes_of(spare)[0].merge());
  // A learner that still steps is awaited in every round, with or without new steps since it contributed.
  harness g(cfg);
  g.join(0);
  g.step(0, 10, 10 * ms);
  g.tick(0);
  g.contribute(0, 0);
  g.core.on_contributed(L(0), I(1), fragment_index{0}, 10, g.now());
  g.core.on_published(R(0), fragment_index{0}, 1, g.now());  // durable: fragment 0's next turn may open
  g.tick(10 * ms);
  g.tick(20 * ms);
  g.tick(30 * ms);
  g.tick(40 * ms);  // fragment 0's second round
  REQUIRE(g.all<open_round>().size() == 5);
  CHECK(g.closes_of(4).empty());
  CHECK(g.core.counters().rounds_unanswerable == 0);
}

TEST_CASE("a restarted broker numbers after its predecessor and takes in learners it never saw join") {
  // The old broker ran a few rounds with learners 0 and 1 (incarnation 1 each), then died.
  harness old = two_learners(make_config(3, 2, 1));
  old.contribute(0, 0);
  old.tick(50 * ms);
  REQUIRE(old.core.next_round().value >= 2);

  // The new broker starts after every round the old one opened (its tape and round lease).
  broker_config cfg = make_config(3, 2, 1);
  cfg.first_round = old.core.next_round().value;
  harness h(cfg);
  h.tick(0);
  CHECK(h.all<open_round>().empty());  // nobody known yet
  // Learner 1's Progress arrives before its Join: cumulative, its incarnation never joined here.
  h.at(1 * ms);
  h.step(1, 40, 10 * ms);
  CHECK(h.core.is_live(L(1)));
  CHECK(h.core.is_eligible(L(1)));  // 40 steps of this incarnation: eligible at once
  h.join(1);                        // the Join that follows changes nothing
  CHECK(h.core.is_eligible(L(1)));
  h.tick(2 * ms);
  auto opens = h.all<open_round>();
  REQUIRE(opens.size() == 1);  // the next one a step time later
  CHECK(opens[0].round.value == cfg.first_round);
  CHECK(opens[0].fragment.value == cfg.first_round % 3);  // the round-robin goes on from there
  REQUIRE(opens[0].eligible.size() == 1);
  CHECK(opens[0].eligible[0] == learner_ref{L(1), I(1)});

  // A contribution to a round of the old broker (its shard had not heard of the
  // restart yet) is late: never admitted to a new round.
  h.contribute(cfg.first_round - 1, 1, 500, 5);
  CHECK(h.core.counters().previous_broker == 1);
  CHECK(h.core.counters().late == 1);
  REQUIRE(h.all<late_contribution>().size() == 1);
  CHECK(h.closes_of(cfg.first_round - 1).empty());
  // Learner 0 re-joins with the incarnation it had, then contributes to the new round: it merges.
  h.join(0);
  h.step(0, 55, 10 * ms);
  h.contribute(cfg.first_round, 0, 300, 3);
  h.tick(30 * ms);  // past the grace window (learner 1 was the one eligible)
  const auto closes = h.closes_of(cfg.first_round);
  REQUIRE(closes.size() == 1);
  CHECK(closes[0].merge());
  REQUIRE(closes[0].members.size() == 1);
  CHECK(closes[0].members[0].learner == L(0));
  CHECK(closes[0].members[0].inc == I(1));
  // A contribution for a round not opened yet by anyone (above next_round) is unknown, not late.
  h.contribute(cfg.first_round + 100, 1, 100, 1);
  CHECK(h.core.counters().unknown_round == 1);
  CHECK(h.core.counters().late == 1);
}

TEST_CASE("members() shows each learner's newest incarnation, liveness and pace") {
  harness h(make_config());
  h.join(0);
  h.join(1);
  h.step(0, 3, 10 * ms);
  h.at(5 * ms);
  h.join(1, 2);  // learner 1 restarted
  h.core.on_peer_lost(L(0), 6 * ms);
  h.drain();
  const auto m = h.core.members();
  REQUIRE(m.size() == 2);
  CHECK(m[0].learner == L(0));
  CHECK(m[0].inc == I(1));
  CHECK_FALSE(m[0].live);
  CHECK_FALSE(m[0].eligible);
  CHECK(m[0].steps_done == 3);
  CHECK(m[0].step_ema_ns == doctest::Approx(10.0 * ms));
  CHECK(m[1].inc == I(2));
  CHECK(m[1].live);
  CHECK_FALSE(m[1].eligible);  // no step of the new incarnation yet
  CHECK(m[1].steps_done == 0);
  CHECK(m[1].last_heard_ns == 5 * ms);
  CHECK(m[1].step_ema_ns == 0);
}

TEST_CASE("fragment order: stalest is round-robin in steady state, and serves a paused shard's fragments first") {
  // The same mesh under both orders: 4 fragments on 2 shards (fragments 0, 2 on
  // shard 0; 1, 3 on shard 1), every round merged and published at once.
  auto run = [](fragment_order order, nanos silent_from, nanos silent_to, nanos until) {
    auto cfg = make_config(4, 2, 1);
    cfg.adaptive_grace = false;
    cfg.order = order;
    harness h(cfg);
    h.join(0);
    h.step(0, 1, 10 * ms);
    for (nanos t = 0; t <= until; t += 1 * ms) {
      if (t == silent_from) h.core.on_shard_lost(1, t);
      if (t == silent_to) h.core.on_shard_alive(1, t);
      h.tick(t);
      for (const open_round& o : h.all<open_round>())
        if (h.closes_of(o.round.value).empty()) {
          h.contribute(o.round.value, 0);
          h.core.on_published(o.round, o.fragment, o.round.value + 1, h.now());
        }
    }
    std::vector<std::uint32_t> fragments;
    for (const open_round& o : h.all<open_round>()) fragments.push_back(o.fragment.value);
    return std::pair{fragments, h.core.counters()};
  };
  // No fault: the same sequence, one round per 10 ms turn.
  const auto [rr, rr_counters] = run(fragment_order::round_robin, -1, -1, 115 * ms);
  const auto [st, st_counters] = run(fragment_order::stalest, -1, -1, 115 * ms);
  CHECK(rr == std::vector<std::uint32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
  CHECK(st == rr);
  CHECK(st_counters.rounds_skipped == 0);

  // Shard 1 silent from 25 to 85 ms. Round-robin passes its fragments' turns
  // unused; stalest gives them to shard 0's fragments, then syncs 1 and 3 first.
  const auto [rr_fault, rr_fault_counters] = run(fragment_order::round_robin, 25 * ms, 85 * ms, 115 * ms);
  const auto [st_fault, st_fault_counters] = run(fragment_order::stalest, 25 * ms, 85 * ms, 115 * ms);
  // Turns at 0, 10, ..., 110 ms. Round-robin: 3 at 30, 1 at 50, 3 at 70 pass.
  CHECK(rr_fault == std::vector<std::uint32_t>{0, 1, 2, 0, 2, 0, 1, 2, 3});
  CHECK(rr_fault_counters.rounds_skipped == 3);
  // Stalest: every turn opens a round; back at 90 ms, 3 (never synced) then 1 go first.
  CHECK(st_fault == std::vector<std::uint32_t>{0, 1, 2, 0, 2, 0, 2, 0, 2, 3, 1, 0});
  CHECK(st_fault_counters.rounds_skipped == 0);
  CHECK(st_fault_counters.rounds_opened == 12);
}

TEST_CASE("fragment order: shuffled visits every fragment once per cycle, in an order the seed and round decide") {
  auto run = [](std::uint64_t seed, std::uint64_t first_round) {
    auto cfg = make_config(6, 64, 1);
    cfg.adaptive_grace = false;
    cfg.order = fragment_order::shuffled;
    cfg.order_seed = seed;
    cfg.first_round = first_round;
    harness h(cfg);
    h.join(0);
    h.step(0, 1, 10 * ms);
    for (nanos t = 0; t < 180 * ms; t += 10 * ms) h.tick(t);  // 18 turns: three cycles
    std::vector<std::uint32_t> fragments;
    for (const open_round& o : h.all<open_round>()) fragments.push_back(o.fragment.value);
    return fragments;
  };
  const auto a = run(7, 0);
  REQUIRE(a.size() == 18);
  for (std::size_t cycle = 0; cycle < 3; ++cycle) {
    CAPTURE(cycle);
    std::set<std::uint32_t> seen(a.begin() + 6 * cycle, a.begin() + 6 * cycle + 6);
    CHECK(seen.size() == 6);
  }
  CHECK(run(7, 0) == a);  // deterministic
  CHECK(run(8, 0) != a);  // another seed, another order
  CHECK(!std::equal(a.begin(), a.begin() + 6, a.begin() + 6));  // a new order each cycle
  // A broker that starts at round 6 (a restart) continues the same order.
  const auto resumed = run(7, 6);
  CHECK(std::equal(resumed.begin(), resumed.begin() + 12, a.begin() + 6));
  CHECK(parse_fragment_order("stalest") == fragment_order::stalest);
  CHECK_FALSE(parse_fragment_order("oldest").has_value());
}

TEST_CASE("fragment order: the mesh's broker takes mesh.fragment_order, seeded by train.seed") {
  auto settings = [](const std::string& order, const std::string& seed) {
    config cfg;
    REQUIRE(set_knob(cfg, "model.size", "nano"));
    if (!order.empty()) REQUIRE(set_knob(cfg, "mesh.fragment_order", order));
    REQUIRE(set_knob(cfg, "train.seed", seed));
    auto policy = resolve_policy(cfg);
    REQUIRE(policy);
    return broker_settings(make_mesh_setup(cfg, *policy));
  };
  CHECK(settings("", "1").order == fragment_order::round_robin);
  CHECK(settings("stalest", "1").order == fragment_order::stalest);
  CHECK(settings("shuffled", "1").order == fragment_order::shuffled);
  CHECK(settings("shuffled", "1").order_seed == settings("shuffled", "1").order_seed);
  CHECK(settings("shuffled", "1").order_seed != settings("shuffled", "2").order_seed);
}
