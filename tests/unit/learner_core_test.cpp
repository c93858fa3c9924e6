// The learner's synchronisation core: counters, anchor-relative deltas,
// overwrite or mixing on receipt, stale updates, bounded pending rounds.

#include <doctest/doctest.h>

#include <vector>

#include "learner/learner_core.hpp"

using namespace archipelago;

namespace {

struct fixture {
  param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  std::vector<float> params = std::vector<float>(layout.total_floats, 0.f);
  learner_core core;

  explicit fixture(double mix = 0, bool rebase = false, bool catch_up = false)
      : core(layout, *make_fragment_plan(layout, 4), {mix, 3, 1, -1, rebase, catch_up}) {}

  std::vector<float> global(fragment_index p, float value) const {
    return std::vector<float>(core.fragment_floats(p), value);
  }
  void install_all(float value) {
    for (std::uint32_t p = 0; p < core.fragments(); ++p)
      REQUIRE(core.install({p}, 1, global({p}, value), params.data()));
  }
  /// Simulates inner steps: every parameter of fragment p moves by `by`.
  void move(fragment_index p, float by) {
    std::vector<float> f(core.fragment_floats(p));
    core.gather(p, params.data(), f.data());
    for (auto& x : f) x += by;
    core.scatter(p, f.data(), params.data());
  }
};

}  // namespace

TEST_CASE("learner core: counters grow per step and reset when the fragment is replaced") {
  fixture f;
  f.install_all(1.0f);
  f.core.on_step(128);
  f.core.on_step(128);
  CHECK(f.core.steps_since_anchor({0}) == 2);
  CHECK(f.core.tokens_since_anchor({3}) == 256);
  REQUIRE(f.core.on_fragment_update({0}, 2, f.global({0}, 5.0f), f.params.data()));
  CHECK(f.core.steps_since_anchor({0}) == 0);
  CHECK(f.core.tokens_since_anchor({0}) == 0);
  CHECK(f.core.steps_since_anchor({1}) == 2);  // other fragments keep counting
  CHECK(f.core.version({0}) == 2);
}

TEST_CASE("learner core: contributions are anchor-relative deltas, exact after missed broadcasts") {
  fixture f;
  f.install_all(1.0f);
  f.core.on_step(64);
  f.move({2}, 0.25f);
  f.core.on_round_open(round_number{10}, {2});
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->round == round_number{10});
  CHECK(c->anchor_version == 1);
  CHECK(c->steps == 1);
  CHECK(c->tokens == 64);
  for (float d : c->delta) CHECK(d == doctest::Approx(0.25f));
  // Versions 2 and 3 are missed; the next contribution is still against anchor v1.
  f.core.on_step(64);
  f.move({2}, 0.5f);
  f.core.on_round_open(round_number{14}, {2});
  c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->anchor_version == 1);
  CHECK(c->steps == 2);
  for (float d : c->delta) CHECK(d == doctest::Approx(0.75f));
  CHECK_FALSE(f.core.next_contribution(f.params.data()));
}

TEST_CASE("learner core: rounds wait for new work, duplicates and the pending bound") {
  fixture f;
  f.install_all(0.0f);
  f.core.on_round_open(round_number{1}, {0});  // no step yet: nothing to send, the round stays pending
  CHECK_FALSE(f.core.next_contribution(f.params.data()));
  CHECK(f.core.pending_rounds() == 1);
  f.core.on_step(10);
  f.core.on_round_open(round_number{2}, {1});
  f.core.on_round_open(round_number{2}, {1});  // duplicate RoundOpen
  CHECK(f.core.pending_rounds() == 2);
  f.core.on_round_open(round_number{3}, {2});
  f.core.on_round_open(round_number{4}, {3});  // bound is 3: round 1 is dropped
  CHECK(f.core.pending_rounds() == 3);
  CHECK(f.core.dropped_rounds() == 1);
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->round == round_number{2});
  CHECK(c->step == 1);
}

TEST_CASE("learner core: the same work is never contributed twice") {
  fixture f;
  f.install_all(0.0f);
  f.core.on_step(10);
  f.core.on_round_open(round_number{1}, {0});
  REQUIRE(f.core.next_contribution(f.params.data()));
  // The next round of fragment 0 opens before round 1's result arrived.
  f.core.on_round_open(round_number{5}, {0});
  CHECK_FALSE(f.core.next_contribution(f.params.data()));
  f.core.on_step(10);  // new work: now it answers, with everything since the anchor
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->round == round_number{5});
  CHECK(c->steps == 2);
}

TEST_CASE("learner core: the synchronous policies wait, decoupled never does") {
  const param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  std::vector<float> params(layout.total_floats, 0.f);
  auto install = [&](learner_core& core) {
    for (std::uint32_t p = 0; p < core.fragments(); ++p)
      REQUIRE(core.install({p}, 1, std::vector<float>(core.fragment_floats({p}), 0.f), params.data()));
  };
  // diloco: answer after H = 3 steps, wait at once for the result.
  learner_core diloco(layout, *make_fragment_plan(layout, 1), {0, 8, 3, 0});
  install(diloco);
  diloco.on_round_open(round_number{0}, {0});
  for (int k = 0; k < 2; ++k) {
    diloco.on_step(16);
    CHECK_FALSE(diloco.must_wait());
    CHECK_FALSE(diloco.next_contribution(params.data()));
  }
  diloco.on_step(16);
  CHECK(diloco.must_wait());
  REQUIRE(diloco.next_contribution(params.data()));
  CHECK(diloco.must_wait());  // until the merged model arrives
  REQUIRE(diloco.on_fragment_update({0}, 2, std::vector<float>(diloco.fragment_floats({0}), 0.f), params.data()));
  CHECK_FALSE(diloco.must_wait());

  // streaming: H = 2, τ = 2: waits only once a fragment is 4 steps without a result.
  learner_core streaming(layout, *make_fragment_plan(layout, 4), {0.5, 8, 2, 2});
  install(streaming);
  for (int k = 0; k < 3; ++k) {
    streaming.on_step(16);
    CHECK_FALSE(streaming.must_wait());
  }
  streaming.on_step(16);
  CHECK(streaming.must_wait());

  // decoupled never waits.
  learner_core decoupled(layout, *make_fragment_plan(layout, 4), {});
  install(decoupled);
  for (int k = 0; k < 100; ++k) decoupled.on_step(16);
  CHECK_FALSE(decoupled.must_wait());
}

TEST_CASE("learner core: dp sends the negated gradient, so the shard's outer gradient is the gradient") {
  fixture f;
  f.install_all(2.0f);
  std::vector<float> gradient(f.layout.total_floats, 0.f);
  for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = static_cast<float>(i % 7) - 3.f;
  f.core.on_step(32);
  f.core.on_round_open(round_number{0}, {1});
  auto c = f.core.next_contribution(f.params.data(), gradient.data());
  REQUIRE(c);
  std::vector<float> expected(f.core.fragment_floats({1}));
  f.core.gather({1}, gradient.data(), expected.data());
  REQUIRE(c->delta.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(c->delta[i] == -expected[i]);
}

TEST_CASE("learner core: overwrite by default, mixing on request, stale versions ignored") {
  fixture over;
  over.install_all(1.0f);
  over.move({1}, 1.0f);  // local θ_1 = 2
  REQUIRE(over.core.on_fragment_update({1}, 2, over.global({1}, 4.0f), over.params.data()));
  std::vector<float> got(over.core.fragment_floats({1}));
  over.core.gather({1}, over.params.data(), got.data());
  for (float x : got) CHECK(x == 4.0f);
  CHECK_FALSE(over.core.on_fragment_update({1}, 2, over.global({1}, 9.0f), over.params.data()));
  CHECK_FALSE(over.core.on_fragment_update({1}, 1, over.global({1}, 9.0f), over.params.data()));
  over.core.gather({1}, over.params.data(), got.data());
  for (float x : got) CHECK(x == 4.0f);

  fixture mixed(0.5);
  mixed.install_all(1.0f);
  mixed.move({1}, 1.0f);  // local 2, global 4 → 3
  REQUIRE(mixed.core.on_fragment_update({1}, 2, mixed.global({1}, 4.0f), mixed.params.data()));
  mixed.core.gather({1}, mixed.params.data(), got.data());
  for (float x : got) CHECK(x == doctest::Approx(3.0f));
  // The anchor is the global value, so the next delta is θ − Θ = −1.
  mixed.core.on_step(1);
  mixed.core.on_round_open(round_number{7}, {1});
  auto c = mixed.core.next_contribution(mixed.params.data());
  REQUIRE(c);
  for (float d : c->delta) CHECK(d == doctest::Approx(-1.0f));
}

TEST_CASE("learner core: rebase keeps the progress made since the contribution, and contributes it next") {
  fixture f(0, true);
  f.install_all(1.0f);
  std::vector<float> got(f.core.fragment_floats({1}));
  for (int k = 0; k < 3; ++k) f.core.on_step(64);
  f.move({1}, 0.5f);  // θ = 1.5 after 3 steps
  f.core.on_round_open(round_number{5}, {1});
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->steps == 3);
  for (float d : c->delta) CHECK(d == doctest::Approx(0.5f));
  // Two more steps while round 5 merges: θ = 1.75.
  f.core.on_step(64);
  f.core.on_step(64);
  f.move({1}, 0.25f);
  REQUIRE(f.core.on_fragment_update({1}, 2, f.global({1}, 3.0f), f.params.data(), round_number{5}));
  f.core.gather({1}, f.params.data(), got.data());
  for (float x : got) CHECK(x == doctest::Approx(3.25f));  // Θ + the 0.25 made since the contribution
  CHECK(f.core.steps_since_anchor({1}) == 2);
  CHECK(f.core.tokens_since_anchor({1}) == 128);
  f.core.on_round_open(round_number{29}, {1});
  c = f.core.next_contribution(f.params.data());
  REQUIRE(c);  // those two steps go out in the next round, against the new anchor
  CHECK(c->steps == 2);
  CHECK(c->tokens == 128);
  CHECK(c->anchor_version == 2);
  for (float d : c->delta) CHECK(d == doctest::Approx(0.25f));

  // A fragment never contributed since its anchor keeps all its progress.
  f.move({2}, -0.5f);  // θ_2 = 0.5 after 5 steps
  REQUIRE(f.core.on_fragment_update({2}, 4, f.global({2}, 2.0f), f.params.data()));
  got.resize(f.core.fragment_floats({2}));
  f.core.gather({2}, f.params.data(), got.data());
  for (float x : got) CHECK(x == doctest::Approx(1.5f));
  CHECK(f.core.steps_since_anchor({2}) == 5);
  // Stale versions are still ignored.
  CHECK_FALSE(f.core.on_fragment_update({2}, 4, f.global({2}, 9.0f), f.params.data()));

  // A broker restart: what went to its rounds may be gone, so all the work since the anchor is kept.
  f.core.on_round_open(round_number{30}, {3});
  f.move({3}, 1.0f);
  REQUIRE(f.core.next_contribution(f.params.data()));
  f.core.on_broker_restarted();
  REQUIRE(f.core.on_fragment_update({3}, 2, f.global({3}, 0.0f), f.params.data()));
  got.resize(f.core.fragment_floats({3}));
  f.core.gather({3}, f.params.data(), got.data());
  for (float x : got) CHECK(x == doctest::Approx(1.0f));
  CHECK(f.core.steps_since_anchor({3}) == 5);
}

TEST_CASE("learner core: work not yet in a received version, per fragment (what a flush waits for)") {
  for (const bool rebase : {false, true}) {
    CAPTURE(rebase);
    fixture f(0, rebase);
    f.install_all(1.0f);
    CHECK(f.core.fragments_with_unmerged_work() == 0);
    for (int k = 0; k < 3; ++k) f.core.on_step(64);
    CHECK(f.core.fragments_with_unmerged_work() == f.core.fragments());
    f.core.on_round_open(round_number{5}, {1});
    REQUIRE(f.core.next_contribution(f.params.data()));
    // Contributed, not merged yet: still waited for.
    CHECK(f.core.fragments_with_unmerged_work() == f.core.fragments());
    REQUIRE(f.core.on_fragment_update({1}, 2, f.global({1}, 3.0f), f.params.data(), round_number{5}));
    CHECK(f.core.fragments_with_unmerged_work() == f.core.fragments() - 1);
    // Under rebase a step after the contribution is work still to merge.
    f.core.on_round_open(round_number{6}, {2});
    REQUIRE(f.core.next_contribution(f.params.data()));
    f.core.on_step(64);
    REQUIRE(f.core.on_fragment_update({2}, 2, f.global({2}, 3.0f), f.params.data(), round_number{6}));
    CHECK(f.core.fragments_with_unmerged_work() == f.core.fragments() - (rebase ? 0 : 1));
    // Two rounds of fragment 3 in flight: its contribution to round 8 carries steps the
    // version of round 7 does not hold, so that version alone does not end the wait.
    f.core.on_round_open(round_number{7}, {3});
    REQUIRE(f.core.next_contribution(f.params.data()));
    f.core.on_step(64);
    f.core.on_round_open(round_number{8}, {3});
    REQUIRE(f.core.next_contribution(f.params.data()));
    const std::size_t before = f.core.fragments_with_unmerged_work();
    REQUIRE(f.core.on_fragment_update({3}, 2, f.global({3}, 3.0f), f.params.data(), round_number{7}));
    CHECK(f.core.fragments_with_unmerged_work() == before);
    REQUIRE(f.core.on_fragment_update({3}, 3, f.global({3}, 4.0f), f.params.data(), round_number{8}));
    CHECK(f.core.fragments_with_unmerged_work() == before - 1);
  }
  // diloco's H: fewer steps than contribute_after wait for more, unless no step follows.
  const param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  std::vector<float> params(layout.total_floats, 0.f);
  learner_core core(layout, *make_fragment_plan(layout, 4), {0, 8, 5, 0, false});
  for (std::uint32_t p = 0; p < core.fragments(); ++p)
    REQUIRE(core.install({p}, 1, std::vector<float>(core.fragment_floats({p}), 1.f), params.data()));
  core.on_step(64);
  core.on_step(64);
  core.on_round_open(round_number{3}, {0});
  CHECK_FALSE(core.next_contribution(params.data()));
  core.on_last_step();
  const auto c = core.next_contribution(params.data());
  REQUIRE(c);
  CHECK(c->steps == 2);
  CHECK(c->round == round_number{3});
}

TEST_CASE("learner core: gather and scatter cover exactly the fragment's tensors") {
  fixture f;
  for (std::size_t i = 0; i < f.params.size(); ++i) f.params[i] = static_cast<float>(i);
  std::size_t total = 0;
  for (std::uint32_t p = 0; p < f.core.fragments(); ++p) {
    std::vector<float> frag(f.core.fragment_floats({p}));
    f.core.gather({p}, f.params.data(), frag.data());
    std::size_t k = 0;
    for (std::size_t t : f.core.plan().fragments[p].tensors)
      for (std::size_t e = 0; e < f.layout.tensors[t].size(); ++e)
        CHECK(frag[k++] == static_cast<float>(f.layout.tensors[t].offset + e));
    total += frag.size();
  }
  CHECK(total == f.layout.param_count);
}

TEST_CASE("learner core: a fragment update drops that fragment's rounds it proves closed") {
  fixture f;
  f.install_all(0.0f);
  f.core.on_round_open(round_number{4}, {1});
  f.core.on_round_open(round_number{8}, {1});
  f.core.on_round_open(round_number{5}, {2});
  // Round 4 of fragment 1 published version 2 before this learner answered it.
  REQUIRE(f.core.on_fragment_update({1}, 2, f.global({1}, 1.0f), f.params.data(), round_number{4}));
  CHECK(f.core.pending_rounds() == 2);  // rounds 8 (fragment 1) and 5 (fragment 2) stay
  f.core.on_step(16);
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->round == round_number{8});  // the work since the new anchor goes to a round still open
  CHECK(c->anchor_version == 2);
}

TEST_CASE("learner core: a broker restart drops pending rounds and lets contributed work go again") {
  fixture f;
  f.install_all(1.0f);
  f.core.on_step(64);
  f.core.on_round_open(round_number{30}, {1});
  REQUIRE(f.core.next_contribution(f.params.data()));  // round 30 answered
  f.core.on_round_open(round_number{32}, {1});  // fragment 1 again: no new work since round 30
  CHECK_FALSE(f.core.next_contribution(f.params.data()));
  CHECK(f.core.pending_rounds() == 1);
  CHECK(f.core.on_broker_restarted() == 1);
  CHECK(f.core.pending_rounds() == 0);
  // The new broker numbers from 0: its round 0 of fragment 1 gets the work round 30
  // got (the old broker never closed 30; the shard dropped it), steps and all.
  f.core.on_round_open(round_number{0}, {1});
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->round.value == 0);
  CHECK(c->steps == 1);
  CHECK(c->tokens == 64);
}

// A shard restarted from its snapshot: the learner re-anchors on the recovered
// value, whatever its version (0 included: a shard restored from its initial
// snapshot), and keeps its local progress — θ_p and the counters — so its next
// contribution carries the work since its last merge: nothing thrown away.
TEST_CASE("learner core: a re-anchor keeps the local progress and contributes it against the recovered value") {
  fixture f;
  f.install_all(1.0f);
  REQUIRE(f.core.on_fragment_update({2}, 7, f.global({2}, 2.0f), f.params.data()));
  for (int k = 0; k < 4; ++k) f.core.on_step(64);
  f.move({2}, 0.25f);  // local progress since version 7: θ = 2.25
  f.core.on_round_open(round_number{40}, {2});
  REQUIRE(f.core.next_contribution(f.params.data()));  // contributed to a round the dead shard held

  f.core.reanchor({2}, 0, f.global({2}, 0.5f));
  CHECK(f.core.version({2}) == 0);
  CHECK(f.core.steps_since_anchor({2}) == 4);  // counters kept
  std::vector<float> fragment(f.core.fragment_floats({2}));
  f.core.gather({2}, f.params.data(), fragment.data());
  CHECK(fragment == f.global({2}, 2.25f));  // θ kept
  f.core.on_round_open(round_number{41}, {2});
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);  // the same work may go out again: its first contribution died with the shard
  CHECK(c->steps == 4);
  CHECK(c->tokens == 256);
  CHECK(c->anchor_version == 0);
  for (float d : c->delta) CHECK(d == doctest::Approx(1.75f));  // θ_local − Θ_recovered
  // From there on, versions are ordered again: a duplicate 0 is ignored, 1 is installed.
  CHECK_FALSE(f.core.on_fragment_update({2}, 0, f.global({2}, 9.0f), f.params.data()));
  CHECK(f.core.on_fragment_update({2}, 1, f.global({2}, 3.0f), f.params.data()));
}

// A learner back from a partition held deltas from an anchor the mesh had moved on from,
// over all its steps since: merged as they were, they added its progress on top of the
// mesh's over the same stretch, weighted by all those steps (the partition drill: eval
// +32 %). It catches up first, and weighs like a learner with one round's work.
TEST_CASE("learner core: a learner that missed versions catches up before it contributes") {
  fixture f(0, false, true);
  f.install_all(1.0f);
  for (int k = 0; k < 6; ++k) f.core.on_step(64);
  f.move({2}, 0.6f);  // θ_2 = 1.6 after 6 steps; versions 2 and 3 of it never arrived
  CHECK(f.core.on_round_open(round_number{20}, {2}, 3));  // behind: fetch version 3
  CHECK_FALSE(f.core.next_contribution(f.params.data()));  // nothing from the old anchor
  CHECK(f.core.pending_rounds() == 1);
  REQUIRE(f.core.on_fragment_update({2}, 3, f.global({2}, 1.4f), f.params.data()));
  std::vector<float> got(f.core.fragment_floats({2}));
  f.core.gather({2}, f.params.data(), got.data());
  for (float x : got) CHECK(x == doctest::Approx(1.6f));  // its progress stays
  CHECK(f.core.version({2}) == 3);
  CHECK(f.core.steps_since_anchor({2}) == 2);    // 6 / (1 + 2 versions missed)
  CHECK(f.core.tokens_since_anchor({2}) == 128);  // 384 / 3
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->round == round_number{20});
  CHECK(c->anchor_version == 3);
  CHECK(c->steps == 2);
  for (float d : c->delta) CHECK(d == doctest::Approx(0.2f));  // θ_local − Θ_now

  // One version missed, with nothing of its own in it: behind too.
  f.move({1}, 0.3f);
  CHECK(f.core.on_round_open(round_number{21}, {1}, 2));
  CHECK_FALSE(f.core.next_contribution(f.params.data()));
  REQUIRE(f.core.on_fragment_update({1}, 2, f.global({1}, 1.1f), f.params.data()));
  CHECK(f.core.steps_since_anchor({1}) == 3);  // 6 / 2
  got.resize(f.core.fragment_floats({1}));
  f.core.gather({1}, f.params.data(), got.data());
  for (float x : got) CHECK(x == doctest::Approx(1.3f));
  // One version past a contribution of its own is on its way, not missed: no hold.
  f.core.on_step(64);
  f.core.on_round_open(round_number{22}, {0});
  while (f.core.next_contribution(f.params.data())) {}  // rounds 21 (fragment 1) and 22 (fragment 0)
  CHECK_FALSE(f.core.on_round_open(round_number{26}, {0}, 2));
  // A broadcast that skips versions (the one between was lost) catches up as well.
  f.move({3}, 0.5f);
  REQUIRE(f.core.on_fragment_update({3}, 4, f.global({3}, 0.0f), f.params.data()));
  got.resize(f.core.fragment_floats({3}));
  f.core.gather({3}, f.params.data(), got.data());
  for (float x : got) CHECK(x == doctest::Approx(1.5f));
  CHECK(f.core.steps_since_anchor({3}) == 2);  // 7 / (1 + 3), rounded up

  // Without mesh.catch_up (and in the synchronous policies) every version is taken as it is.
  learner_core strict(f.layout, *make_fragment_plan(f.layout, 4), {0, 3, 1, 0, false});
  std::vector<float> params(f.layout.total_floats, 0.f);
  REQUIRE(strict.install({2}, 1, f.global({2}, 1.0f), params.data()));
  strict.on_step(64);
  CHECK_FALSE(strict.on_round_open(round_number{5}, {2}, 3));
  REQUIRE(strict.on_fragment_update({2}, 3, f.global({2}, 2.0f), params.data()));
  CHECK(strict.steps_since_anchor({2}) == 0);
}

TEST_CASE("learner core: a fragment not installed from the mesh is never contributed, the others are") {
  fixture f;
  // A rejoin while fragment 2's shard is down: every fragment but 2 installed from the mesh.
  for (std::uint32_t p = 0; p < f.core.fragments(); ++p)
    if (p != 2) REQUIRE(f.core.install({p}, 1, f.global({p}, 1.0f), f.params.data()));
  CHECK_FALSE(f.core.installed({2}));
  f.core.on_step(64);
  f.core.on_round_open(round_number{1}, {2});
  f.core.on_round_open(round_number{2}, {0});
  auto c = f.core.next_contribution(f.params.data());
  REQUIRE(c);
  CHECK(c->fragment == fragment_index{0});             // the installed one goes out
  CHECK_FALSE(f.core.next_contribution(f.params.data()));  // fragment 2's round waits
  CHECK(f.core.pending_rounds() == 1);
  // A shard restart's reanchor does not count as an install either.
  f.core.reanchor({2}, 5, f.global({2}, 3.0f));
  CHECK_FALSE(f.core.installed({2}));
  CHECK_FALSE(f.core.next_contribution(f.params.data()));
  // Its shard back: the value it publishes is installed, and work after it is contributed.
  REQUIRE(f.core.on_fragment_update({2}, 6, f.global({2}, 3.0f), f.params.data()));
  f.core.on_step(64);
  f.core.on_round_open(round_number{3}, {2});
  auto c2 = f.core.next_contribution(f.params.data());
  REQUIRE(c2);
  CHECK(c2->fragment == fragment_index{2});
  CHECK(c2->anchor_version == 6);
}
