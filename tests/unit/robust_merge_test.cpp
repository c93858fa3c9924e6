// The robust merge (mesh.robust): norm screening against the lower median of
// recent norms, the coordinate-wise trimmed merge, and the shard core that
// rejects (ledger: rejected) or clips a poisoned member at its round's close.
// Randomised cases print their seed (ROBUST_SEED=<seed> replays one).

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
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

namespace {

/// A round's members for fragment_screen, each delta of `steps` steps, anchored on `anchor` (none: not known).
std::vector<screen_member> members_of(const std::vector<std::vector<float>>& deltas, std::uint64_t steps = 1,
                                      std::optional<std::uint64_t> anchor = std::nullopt) {
  std::vector<screen_member> out;
  for (const auto& d : deltas) out.push_back({d, steps, anchor});
  return out;
}

/// A delta of `n` values whose norm is exactly `norm` (random direction).
std::vector<float> delta_of_norm(prng& rng, std::size_t n, double norm) {
  std::vector<float> d(n);
  for (auto& x : d) x = static_cast<float>(rng.normal());
  const double scale = norm / norm_of(d);
  for (auto& x : d) x = static_cast<float>(x * scale);
  return d;
}

robust_config norm_only() {
  robust_config c;
  c.enabled = true;
  c.min_cosine = -1;  // the direction screen off: these cases are about norms
  return c;
}

}  // namespace

TEST_CASE("robust: a x1000 member is rejected against honest norms, and never becomes a trusted figure") {
  fragment_screen screen(norm_only());
  prng rng(1);
  std::vector<std::vector<float>> round1;
  for (double norm : {1.0, 1.1, 0.9, 1000.0}) round1.push_back(delta_of_norm(rng, 64, norm));
  auto d = screen.screen(members_of(round1), 0, {});
  REQUIRE(d.size() == 4);
  CHECK(d[0].what == screen_decision::action::accept);
  CHECK(d[3].what == screen_decision::action::reject);
  CHECK(d[3].why == screen_decision::cause::norm);
  CHECK(d[3].norm_bound == doctest::Approx(3.0));  // 3 x the lower median 1.0
  CHECK(screen.trusted_norms() == 3);
  // Alone in a later round, against the trusted figures: still rejected.
  CHECK(screen.screen(members_of({delta_of_norm(rng, 64, 1000)}), 1, {})[0].what == screen_decision::action::reject);
  CHECK(screen.trusted_norms() == 3);
}

TEST_CASE("robust: clip scales to the bound, the trusted figures stay bounded") {
  robust_config c = norm_only();
  c.clip = true;
  c.window = 4;
  fragment_screen screen(c);
  prng rng(2);
  for (std::uint64_t r = 0; r < 5; ++r)
    (void)screen.screen(members_of({delta_of_norm(rng, 64, 1), delta_of_norm(rng, 64, 2), delta_of_norm(rng, 64, 1.5)}),
                        r, {});
  CHECK(screen.trusted_norms() == 4);
  const auto d = screen.screen(members_of({delta_of_norm(rng, 64, 30)}), 5, {});
  CHECK(d[0].what == screen_decision::action::clip);
  CHECK(d[0].norm * d[0].scale() == doctest::Approx(d[0].norm_bound));
}

TEST_CASE("robust: one member and nothing trusted is accepted (nothing to compare with)") {
  fragment_screen screen(norm_only());
  prng rng(3);
  CHECK(screen.screen(members_of({delta_of_norm(rng, 64, 1e9)}), 0, {})[0].what == screen_decision::action::accept);
}

// The learning-rate warm-up makes honest norms per sqrt(step) grow round after round.
// A small round compared with the fragment's newest trusted figures (its latest round
// of 3 or more) keeps up with them; the old window, the lower median of the last 32
// accepted, lagged several rounds behind and rejected honest members.
TEST_CASE("robust: through a warm-up, small rounds follow the trusted figures and no honest member is rejected") {
  for (std::uint64_t seed : seeds(500, 5)) {
    CAPTURE(seed);
    fragment_screen screen(norm_only());
    prng rng(seed);
    double level = 0.01;
    std::size_t rejected = 0;
    for (std::uint64_t r = 0; r < 40; ++r, level *= 1.5) {  // ×1.5 per round: a fast warm-up
      const int members = r % 2 == 0 ? 4 : r % 4 == 1 ? 1 : 2;  // every other round small
      std::vector<std::vector<float>> deltas;
      for (int m = 0; m < members; ++m) deltas.push_back(delta_of_norm(rng, 64, level * (0.8 + 0.4 * rng.uniform())));
      for (const auto& d : screen.screen(members_of(deltas), r, {})) rejected += d.what != screen_decision::action::accept;
    }
    CHECK(rejected == 0);
  }
}

// A stale or shrunken attacker of small norm, accepted in a small round, must not
// become the reference: the honest member of the next small round would be rejected.
TEST_CASE("robust: a small attacker accepted in a small round never drags the reference down") {
  fragment_screen screen(norm_only());
  prng rng(4);
  (void)screen.screen(members_of({delta_of_norm(rng, 64, 1), delta_of_norm(rng, 64, 1.1), delta_of_norm(rng, 64, 0.9)}),
                      0, {});
  for (std::uint64_t r = 1; r < 10; ++r) {
    const auto d = screen.screen(members_of({delta_of_norm(rng, 64, 0.001), delta_of_norm(rng, 64, 1.2)}), r, {});
    CHECK(d[1].what == screen_decision::action::accept);
  }
  CHECK(screen.trusted_norms() == 3);
}

TEST_CASE("robust: a contribution anchored too far behind, or on a version not yet published, is stale") {
  robust_config c = norm_only();
  c.max_anchor_lag = 8;
  fragment_screen screen(c);
  prng rng(5);
  std::vector<screen_member> members;
  std::vector<std::vector<float>> deltas;
  for (int m = 0; m < 4; ++m) deltas.push_back(delta_of_norm(rng, 64, 1));
  const std::uint64_t anchors[] = {20, 12, 11, 21};  // the fragment is at version 20
  for (int m = 0; m < 4; ++m) members.push_back({deltas[m], 1, anchors[m]});
  const auto d = screen.screen(members, 20, {});
  CHECK(d[0].what == screen_decision::action::accept);
  CHECK(d[1].what == screen_decision::action::accept);  // 8 behind: the bound itself
  CHECK(d[2].what == screen_decision::action::reject);
  CHECK(d[2].why == screen_decision::cause::stale_anchor);
  CHECK(d[2].anchor_lag == 9);
  CHECK(d[3].why == screen_decision::cause::stale_anchor);
  CHECK(d[3].anchor_lag == -1);
}

TEST_CASE("robust: a delta the fragment merged before is a replay, a zero delta and an unmerged one are not") {
  fragment_screen screen(norm_only());
  prng rng(6);
  std::vector<std::vector<float>> first;
  for (int m = 0; m < 3; ++m) first.push_back(delta_of_norm(rng, 64, 1));
  first.push_back(std::vector<float>(64, 0.f));
  first.push_back(delta_of_norm(rng, 64, 5000));  // rejected by norm: never merged
  auto d = screen.screen(members_of(first), 0, {});
  CHECK(d[4].why == screen_decision::cause::norm);
  CHECK(screen.digests() == 3);
  // Round 2: learner 0's first delta again (the stale attacker), twice in one round,
  // the zero delta again, the norm-rejected one again (not a replay: never merged), a fresh one.
  std::vector<std::vector<float>> second{first[0], first[0], first[3], first[4], delta_of_norm(rng, 64, 1)};
  d = screen.screen(members_of(second), 1, {});
  CHECK(d[0].why == screen_decision::cause::replay);
  CHECK(d[0].what == screen_decision::action::reject);
  CHECK(d[1].why == screen_decision::cause::replay);
  CHECK(d[2].what == screen_decision::action::accept);
  CHECK(d[3].why == screen_decision::cause::norm);
  CHECK(d[4].what == screen_decision::action::accept);
  // A delta that was itself screened out as a replay is still one next time.
  d = screen.screen(members_of({first[1], delta_of_norm(rng, 64, 1), delta_of_norm(rng, 64, 1)}), 2, {});
  CHECK(d[0].why == screen_decision::cause::replay);
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
    std::vector<float> descent(plan.fragments[1].floats);  // honest learners agree in direction
    for (auto& x : descent) x = static_cast<float>(rng.normal());
    auto delta = [&](double scale) {
      std::vector<float> d(descent.size());
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<float>(0.01 * scale * (descent[i] + rng.normal()));
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
  std::vector<float> descent(plan.fragments[0].floats);  // honest learners agree in direction
  for (auto& x : descent) x = static_cast<float>(rng.normal());
  std::vector<learner_ref> members;
  for (std::uint32_t m = 0; m < 4; ++m) {
    std::vector<float> d(descent.size());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<float>((m == 0 ? 500.0 : 0.01) * (descent[i] + rng.normal()));
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
    REQUIRE(f.has_median);
    CHECK_FALSE(f.has_descent);
    REQUIRE(f.with_median.size() == 4);
    for (int m = 0; m < 3; ++m) CHECK(f.with_median[static_cast<std::size_t>(m)] > 0.3);
    CHECK(f.with_median[3] < -0.3);
  }
}

TEST_CASE("robust: a small round is compared with the descent, and without one nothing is screened") {
  prng rng(17);
  auto deltas = correlated_deltas(rng, 2048, 2, 0.5);
  std::vector<float> momentum(2048);  // the outer momentum points against the descent
  for (std::size_t i = 0; i < momentum.size(); ++i) momentum[i] = -(deltas[0][i] + deltas[1][i]);
  for (auto& x : deltas[1]) x = -x;
  const direction_figures with = direction_cosines(spans_of(deltas), momentum);
  CHECK_FALSE(with.has_median);
  REQUIRE(with.has_descent);
  CHECK(with.with_descent[0] > 0.3);
  CHECK(with.with_descent[1] < -0.3);
  const direction_figures without = direction_cosines(spans_of(deltas), {});
  CHECK_FALSE(without.has_descent);
  CHECK(without.with_descent == std::vector<double>{0, 0});
  const std::vector<float> zero(2048, 0.f);
  CHECK_FALSE(direction_cosines(spans_of(deltas), zero).has_descent);
  // The screen: nothing to compare with in a fragment's first round of 2, alone.
  robust_config c;
  c.enabled = true;
  fragment_screen screen(c);
  for (const auto& d : screen.screen(members_of(deltas), 0, zero)) CHECK(d.what == screen_decision::action::accept);
}

namespace {

/// Sideways: `honest`'s norm along a fixed direction `w`, at cosine `c` with `honest`
/// (what contribution_attack's sideways kind sends).
std::vector<float> sideways_of(const std::vector<float>& honest, const std::vector<float>& fixed, double c) {
  const double norm = norm_of(honest);
  double along = 0;
  for (std::size_t i = 0; i < honest.size(); ++i) along += fixed[i] * honest[i] / norm;
  std::vector<double> w(honest.size());
  double w_squares = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    w[i] = fixed[i] - along * honest[i] / norm;
    w_squares += w[i] * w[i];
  }
  std::vector<float> out(honest.size());
  for (std::size_t i = 0; i < w.size(); ++i)
    out[i] = static_cast<float>(c * honest[i] + std::sqrt(1 - c * c) * norm * w[i] / std::sqrt(w_squares));
  return out;
}

}  // namespace

// The direction screen's bound, max(min_cosine, cosine_ratio × the honest level):
// honest members whose agreement varies from strong (early in training) to weak
// (late, noise-dominated deltas) pass it; a sign-flipped, a random and a steady
// sideways member (cosine 0.1 with its own honest delta, a fixed direction) do not,
// in rounds of 4 (against the median) and of 2 (against the descent and the
// fragment's trusted cosines with it).
TEST_CASE("robust: the direction bound passes honest members at every agreement level and rejects the attackers") {
  for (std::uint64_t seed : seeds(600, 4)) {
    for (double noise : {0.3, 1.0, 2.0}) {  // honest cosines with the median about 0.95, 0.7, 0.45
      CAPTURE(seed);
      CAPTURE(noise);
      robust_config c;
      c.enabled = true;
      fragment_screen screen(c);
      prng rng(seed);
      const std::size_t n = 4096;
      std::vector<float> fixed(n);
      for (auto& x : fixed) x = static_cast<float>(rng.normal());
      std::vector<float> momentum(n, 0.f), descent(n);  // the loss's descent: it drifts slowly
      for (auto& x : descent) x = static_cast<float>(rng.normal());
      std::size_t honest_rejected = 0, honest_seen = 0;
      std::map<std::string, std::pair<int, int>> attackers;  // kind → (rejected, seen)
      const char* kinds[] = {"sign_flip", "random", "sideways"};
      for (std::uint64_t r = 0; r < 30; ++r) {
        for (auto& x : descent) x = static_cast<float>(0.95 * x + 0.31 * rng.normal());
        std::vector<std::vector<float>> deltas(4, std::vector<float>(n));
        for (auto& d : deltas)
          for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<float>(0.01 * (descent[i] + noise * rng.normal()));
        const std::string kind = kinds[r % 3];
        auto& attacker = deltas[3];
        if (kind == "sign_flip") {
          for (auto& x : attacker) x = -x;
        } else if (kind == "random") {
          attacker = delta_of_norm(rng, n, norm_of(attacker));
        } else {
          attacker = sideways_of(attacker, fixed, 0.1);
        }
        const bool small = r % 2 == 1 && r > 4;  // the attacker and one honest member
        if (small) deltas.erase(deltas.begin() + 1, deltas.begin() + 3);
        const auto d = screen.screen(members_of(deltas), r, momentum);
        for (std::size_t m = 0; m + 1 < d.size(); ++m) {
          ++honest_seen;
          honest_rejected += d[m].what != screen_decision::action::accept;
        }
        attackers[kind].second += 1;
        attackers[kind].first += d.back().what == screen_decision::action::reject;
        // The outer step: the momentum follows the honest members' mean delta.
        for (std::size_t i = 0; i < n; ++i) {
          double mean = 0;
          for (std::size_t m = 0; m + 1 < deltas.size(); ++m) mean += deltas[m][i];
          momentum[i] = static_cast<float>(0.9 * momentum[i] - mean / static_cast<double>(deltas.size() - 1));
        }
      }
      CHECK(honest_rejected == 0);
      CHECK(honest_seen > 60);
      for (const auto& [kind, counts] : attackers) {
        CAPTURE(kind);
        CHECK(counts.first == counts.second);
      }
    }
  }
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
      CHECK(screened[0].decision.why == screen_decision::cause::direction);
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

// Non-IID learners near their common optimum each pull towards their own target,
// against the others: no direction is shared, so the direction screen holds no one
// to one (with min_cosine 0 it would otherwise reject every member).
TEST_CASE("robust: members that share no direction are not screened by direction") {
  for (std::uint64_t seed : seeds(700, 3)) {
    CAPTURE(seed);
    robust_config c;
    c.enabled = true;
    fragment_screen screen(c);
    prng rng(seed);
    const std::size_t n = 2048;
    std::vector<std::vector<float>> deltas(4, std::vector<float>(n));
    for (auto& d : deltas)
      for (auto& x : d) x = static_cast<float>(rng.normal());
    for (std::size_t i = 0; i < n; ++i) {  // the pulls cancel: their sum is zero
      double mean = 0;
      for (const auto& d : deltas) mean += d[i] / 4.0;
      for (auto& d : deltas) d[i] = static_cast<float>(d[i] - mean);
    }
    for (const auto& d : screen.screen(members_of(deltas), 0, {})) {
      CHECK(d.cosine < 0);
      CHECK(d.what == screen_decision::action::accept);
      CHECK(d.min_cosine == -1);
    }
  }
}
