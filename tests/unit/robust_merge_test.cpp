// The robust merge (mesh.robust): norm screening against the lower median of
// recent norms, the coordinate-wise trimmed merge, and the shard core that
// rejects (ledger: rejected) or clips a poisoned member at its round's close.
// Randomised cases print their seed (ROBUST_SEED=<seed> replays one).

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <span>
#include <vector>

#include "core/prng.hpp"
#include "parameter_shard/merge.hpp"
#include "parameter_shard/robust_merge.hpp"
#include "parameter_shard/shard_core.hpp"

using namespace archipelago;

namespace {

std::vector<std::uint64_t> seeds(std::uint64_t first, int n) {
  if (const char* s = std::getenv("ROBUST_SEED")) return {std::strtoull(s, nullptr, 10)};
  std::vector<std::uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(first + static_cast<std::uint64_t>(i));
  return out;
}

double norm_of(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("robust: lower median") {
  CHECK(lower_median({}) == 0);
  CHECK(lower_median({5}) == 5);
  CHECK(lower_median({1, 1000}) == 1);  // one honest, one huge: the honest one
  CHECK(lower_median({3, 1, 2}) == 2);
  CHECK(lower_median({4, 1, 3, 2}) == 2);
}

TEST_CASE("robust: validate names the bad field") {
  robust_config c;
  CHECK(validate(c));
  c.norm_factor = 0.5;
  CHECK_FALSE(validate(c));
  c.norm_factor = 3;
  c.window = 0;
  CHECK_FALSE(validate(c));
  c.window = 32;
  c.min_cosine = 1.5;
  CHECK_FALSE(validate(c));
  c.min_cosine = -1;
  CHECK(validate(c));
}

TEST_CASE("robust: a x1000 member is rejected against honest norms, and never enters the window") {
  robust_config c;
  c.enabled = true;
  norm_screen screen(c);
  const std::vector<double> round1{1.0, 1.1, 0.9, 1000.0};
  auto d = screen.screen(round1);
  REQUIRE(d.size() == 4);
  CHECK(d[0].what == screen_decision::action::accept);
  CHECK(d[3].what == screen_decision::action::reject);
  CHECK(d[3].bound == doctest::Approx(3.0));  // 3 x the lower median 1.0
  CHECK(screen.remembered() == 3);
  // Alone in a later round, against the window: still rejected.
  const std::vector<double> alone{1000.0};
  CHECK(screen.screen(alone)[0].what == screen_decision::action::reject);
  CHECK(screen.remembered() == 3);
}

TEST_CASE("robust: clip scales to the bound, the window stays bounded") {
  robust_config c;
  c.enabled = true;
  c.clip = true;
  c.window = 4;
  norm_screen screen(c);
  for (int r = 0; r < 5; ++r) (void)screen.screen(std::vector<double>{1.0, 2.0});
  CHECK(screen.remembered() == 4);
  const auto d = screen.screen(std::vector<double>{30.0});
  CHECK(d[0].what == screen_decision::action::clip);
  CHECK(d[0].norm * d[0].scale() == doctest::Approx(d[0].bound));
}

TEST_CASE("robust: one member and nothing remembered is accepted (nothing to compare with)") {
  robust_config c;
  c.enabled = true;
  norm_screen screen(c);
  CHECK(screen.screen(std::vector<double>{1e9})[0].what == screen_decision::action::accept);
}

TEST_CASE("robust: trimmed merge keeps every coordinate inside the honest range, whatever one attacker sends") {
  for (std::uint64_t seed : seeds(100, 20)) {
    CAPTURE(seed);  // ROBUST_SEED=<seed> replays this case
    prng rng(seed);
    const std::size_t n = 64;
    // One embedding tensor (weighted mean) and one RDA tensor.
    const std::vector<fragment_tensor> tensors{{0, n, true, "emb"}, {n, n, false, "w"}};
    std::vector<std::vector<float>> deltas(4, std::vector<float>(2 * n));
    for (std::size_t m = 0; m < 3; ++m)
      for (auto& x : deltas[m]) x = static_cast<float>(rng.normal());
    for (auto& x : deltas[3]) x = static_cast<float>(1000 * rng.normal());  // the attacker
    std::vector<contribution_view> views;
    for (std::size_t m = 0; m < 4; ++m) views.push_back({deltas[m].data(), 100.0 + static_cast<double>(rng.below(50)), 10});
    std::vector<float> out(2 * n);
    merge_options options;
    options.trim = 1;
    REQUIRE(merge_outer_gradient(tensors, views, 2 * n, out.data(), options));
    for (std::size_t i = 0; i < n; ++i) {  // embedding: Δ_i within the honest −d values
      double lo = 1e300, hi = -1e300;
      for (std::size_t m = 0; m < 3; ++m) {
        lo = std::min(lo, -static_cast<double>(deltas[m][i]));
        hi = std::max(hi, -static_cast<double>(deltas[m][i]));
      }
      CHECK(out[i] >= lo - 1e-5);
      CHECK(out[i] <= hi + 1e-5);
    }
    // RDA: the radius is a trimmed mean of norms, so no larger than the largest honest norm.
    double honest_max = 0;
    for (std::size_t m = 0; m < 3; ++m)
      honest_max = std::max(honest_max, norm_of(std::vector<float>(deltas[m].begin() + n, deltas[m].end())));
    CHECK(norm_of(std::vector<float>(out.begin() + n, out.end())) <= honest_max * (1 + 1e-6));
    // Untrimmed, the attacker dominates.
    std::vector<float> plain(2 * n);
    REQUIRE(merge_outer_gradient(tensors, views, 2 * n, plain.data()));
    CHECK(norm_of(std::vector<float>(plain.begin() + n, plain.end())) > 10 * honest_max);
  }
}

TEST_CASE("robust: trim is capped, two contributions merge as without it") {
  prng rng(7);
  const std::vector<fragment_tensor> tensors{{0, 8, false, "w"}};
  std::vector<float> a(8), b(8);
  for (auto& x : a) x = static_cast<float>(rng.normal());
  for (auto& x : b) x = static_cast<float>(rng.normal());
  const std::vector<contribution_view> views{{a.data(), 10, 1}, {b.data(), 20, 2}};
  std::vector<float> plain(8), trimmed(8);
  REQUIRE(merge_outer_gradient(tensors, views, 8, plain.data()));
  merge_options options;
  options.trim = 5;
  REQUIRE(merge_outer_gradient(tensors, views, 8, trimmed.data(), options));
  CHECK(plain == trimmed);
}

TEST_CASE("robust: the shard rejects a x1000 member at close, counts it rejected with a reason, merges the rest") {
  for (std::uint64_t seed : seeds(40, 5)) {
    CAPTURE(seed);
    const param_layout layout = make_layout({256, 4, 8, 1, 2, true});
    const fragment_plan plan = *make_fragment_plan(layout, 4);
    std::vector<float> init(layout.total_floats, 0.f);
    shard_config config;
    config.robust.enabled = true;
    shard_core shard(layout, plan, {{1}}, config, init.data());
    const fragment_index p{1};
    prng rng(seed);
    auto delta = [&](double scale) {
      std::vector<float> d(plan.fragments[1].floats);
      for (auto& x : d) x = static_cast<float>(0.01 * scale * rng.normal());
      return d;
    };
    std::uint64_t r = 0;
    for (; r < 3; ++r) {  // honest rounds fill the window
      std::vector<learner_ref> members;
      for (std::uint32_t m = 0; m < 4; ++m) {
        REQUIRE(shard.on_contribution(round_number{r}, p, {{m}, {1}}, 4, 400, delta(1)) == contribution_verdict::buffered);
        members.push_back({{m}, {1}});
      }
      REQUIRE(shard.on_round_close(round_number{r}, p, members));
    }
    CHECK(shard.take_screened().empty());
    const std::vector<float> before = shard.value(p);
    std::vector<learner_ref> members;
    for (std::uint32_t m = 0; m < 4; ++m) {
      REQUIRE(shard.on_contribution(round_number{r}, p, {{m}, {1}}, 4, 400, delta(m == 3 ? 1000 : 1), nullptr, 77) ==
              contribution_verdict::buffered);
      members.push_back({{m}, {1}});
    }
    auto published = shard.on_round_close(round_number{r}, p, members);
    REQUIRE(published);
    REQUIRE(published->has_value());
    CHECK((*published)->members == 3);
    CHECK((*published)->merged_tokens == 1200);
    const auto screened = shard.take_screened();
    REQUIRE(screened.size() == 1);
    CHECK(screened[0].from.learner.value == 3);
    CHECK(screened[0].learner_step == 77);
    CHECK(screened[0].decision.what == screen_decision::action::reject);
    CHECK(screened[0].reason().find("above the robust bound") != std::string::npos);
    const shard_ledger& l = shard.ledger();
    CHECK(l.rejected == 1);
    CHECK(l.rejected_tokens == 400);
    CHECK(l.screened_out == 1);
    CHECK(l.merged == 15);
    // The fragment moved like an honest round, not a thousand times further.
    std::vector<float> step(before.size());
    for (std::size_t i = 0; i < step.size(); ++i) step[i] = shard.value(p)[i] - before[i];
    CHECK(norm_of(step) < 0.1 * std::sqrt(static_cast<double>(step.size())));
  }
}

TEST_CASE("robust: with robust_screen = clip the member is merged scaled to the bound") {
  const param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  const fragment_plan plan = *make_fragment_plan(layout, 4);
  std::vector<float> init(layout.total_floats, 0.f);
  shard_config config;
  config.robust.enabled = true;
  config.robust.clip = true;
  shard_core shard(layout, plan, {{0}}, config, init.data());
  const fragment_index p{0};
  prng rng(5);
  std::vector<learner_ref> members;
  for (std::uint32_t m = 0; m < 4; ++m) {
    std::vector<float> d(plan.fragments[0].floats);
    for (auto& x : d) x = static_cast<float>((m == 0 ? 500.0 : 0.01) * rng.normal());
    REQUIRE(shard.on_contribution(round_number{0}, p, {{m}, {1}}, 4, 400, d) == contribution_verdict::buffered);
    members.push_back({{m}, {1}});
  }
  auto published = shard.on_round_close(round_number{0}, p, members);
  REQUIRE(published);
  REQUIRE(published->has_value());
  CHECK((*published)->members == 4);
  const auto screened = shard.take_screened();
  REQUIRE(screened.size() == 1);
  CHECK(screened[0].decision.what == screen_decision::action::clip);
  CHECK(shard.ledger().clipped == 1);
  CHECK(shard.ledger().rejected == 0);
}

// -- the direction screen (mesh.robust_min_cosine) ------------------------------------

namespace {

/// Honest deltas: a shared descent direction plus each learner's own noise, as
/// learners training the same model from the same anchor produce.
std::vector<std::vector<float>> correlated_deltas(prng& rng, std::size_t n, int members, double noise) {
  std::vector<float> shared(n);
  for (auto& x : shared) x = static_cast<float>(rng.normal());
  std::vector<std::vector<float>> out;
  for (int m = 0; m < members; ++m) {
    std::vector<float> d(n);
    for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<float>(0.01 * (shared[i] + noise * rng.normal()));
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<std::span<const float>> spans_of(const std::vector<std::vector<float>>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("robust: direction cosines against the round's median direction") {
  for (std::uint64_t seed : seeds(300, 5)) {
    CAPTURE(seed);
    prng rng(seed);
    auto deltas = correlated_deltas(rng, 4096, 4, 1.0);
    for (auto& x : deltas[3]) x = -x;  // the sign-flipped attacker
    const direction_figures f = direction_cosines(spans_of(deltas), {});
    REQUIRE(f.has_reference);
    REQUIRE(f.cosines.size() == 4);
    for (int m = 0; m < 3; ++m) CHECK(f.cosines[static_cast<std::size_t>(m)] > 0.3);
    CHECK(f.cosines[3] < -0.3);
  }
}

TEST_CASE("robust: a small round is compared with the descent, and without one nothing is screened") {
  prng rng(17);
  auto deltas = correlated_deltas(rng, 2048, 2, 0.5);
  std::vector<float> momentum(2048);  // the outer momentum points against the descent
  for (std::size_t i = 0; i < momentum.size(); ++i) momentum[i] = -(deltas[0][i] + deltas[1][i]);
  for (auto& x : deltas[1]) x = -x;
  const direction_figures with = direction_cosines(spans_of(deltas), momentum);
  REQUIRE(with.has_reference);
  CHECK(with.cosines[0] > 0.3);
  CHECK(with.cosines[1] < -0.3);
  const direction_figures without = direction_cosines(spans_of(deltas), {});
  CHECK_FALSE(without.has_reference);
  CHECK(without.cosines == std::vector<double>{0, 0});
  const std::vector<float> zero(2048, 0.f);
  CHECK_FALSE(direction_cosines(spans_of(deltas), zero).has_reference);
}

TEST_CASE("robust: the shard rejects a sign-flipped member of honest norm by its direction") {
  const param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  const fragment_plan plan = *make_fragment_plan(layout, 4);
  std::vector<float> init(layout.total_floats, 0.f);
  for (double min_cosine : {0.0, -1.0}) {
    CAPTURE(min_cosine);
    shard_config config;
    config.robust.enabled = true;
    config.robust.min_cosine = min_cosine;
    shard_core shard(layout, plan, {{0}}, config, init.data());
    const fragment_index p{0};
    prng rng(23);
    auto deltas = correlated_deltas(rng, plan.fragments[0].floats, 4, 1.0);
    for (auto& x : deltas[2]) x = -x;
    std::vector<learner_ref> members;
    for (std::uint32_t m = 0; m < 4; ++m) {
      REQUIRE(shard.on_contribution(round_number{0}, p, {{m}, {1}}, 4, 400, deltas[m]) == contribution_verdict::buffered);
      members.push_back({{m}, {1}});
    }
    auto published = shard.on_round_close(round_number{0}, p, members);
    REQUIRE(published);
    REQUIRE(published->has_value());
    const auto screened = shard.take_screened();
    if (min_cosine > -1) {  // on: learner/2 is rejected, by its direction (its norm is honest)
      CHECK((*published)->members == 3);
      REQUIRE(screened.size() == 1);
      CHECK(screened[0].from.learner.value == 2);
      CHECK(screened[0].rejected());
      CHECK(screened[0].decision.by_direction);
      CHECK(screened[0].reason().find("delta direction: cosine -") != std::string::npos);
      CHECK(shard.ledger().screened_by_direction == 1);
      CHECK(shard.ledger().screened_out == 1);
      CHECK(shard.ledger().rejected_tokens == 400);
    } else {  // off: the norm screen cannot tell it apart
      CHECK((*published)->members == 4);
      CHECK(screened.empty());
    }
  }
}
