// The functions behind the figures the project publishes, against values worked out by
// hand: the 95 % confidence interval over seeds (every "± x" of a bench, the goodput
// simulation's intervals), bench parity's tokens to dp's loss, its ratio to dp's own and the
// gap in percent (the headline "vs dp" figure), goodput from the ledger, and the bench
// commands' "mean ± half" text. Participation has its own file (participation_test.cpp).

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "bench/bench_stats.hpp"
#include "bench/parity_bench.hpp"
#include "core/ledger_totals.hpp"
#include "core/student_t.hpp"

using namespace archipelago;

namespace {
const double nan_ = std::numeric_limits<double>::quiet_NaN();
}

TEST_CASE("confidence interval: t95 x s / sqrt(n), NaN left out, zero below two values") {
  // {1, 2, 3}: mean 2, s = 1, t(2) = 4.303: 4.303 / sqrt(3).
  CHECK(ci95({1, 2, 3}) == doctest::Approx(4.303 / std::sqrt(3.0)));
  CHECK(ci95({1, 2, nan_, 3}) == doctest::Approx(4.303 / std::sqrt(3.0)));
  // {2, 4}: s = sqrt(2), t(1) = 12.706: 12.706 * sqrt(2) / sqrt(2).
  CHECK(ci95({2, 4}) == doctest::Approx(12.706));
  CHECK(ci95({5, 5, 5, 5}) == 0);
  CHECK(ci95({7}) == 0);
  CHECK(ci95({}) == 0);
  CHECK(ci95({nan_, 1}) == 0);
  // Wider with fewer seeds at the same spread; the table, then the expansion past 30.
  CHECK(ci95({0, 1, 0, 1}) < ci95({0, 1, 0}));
  CHECK(t95(1) == doctest::Approx(12.706));
  CHECK(t95(30) == doctest::Approx(2.042));
  CHECK(t95(31) < t95(30));
  CHECK(t95(1000) == doctest::Approx(1.96).epsilon(0.001));
}

TEST_CASE("bench parity: tokens to a target loss, interpolated between eval points") {
  const loss_curve curve{{0, 5.0}, {100, 3.0}, {200, 2.0}, {300, 2.5}};
  CHECK(tokens_to_reach(curve, 4.0) == doctest::Approx(50));   // halfway from 5 to 3
  CHECK(tokens_to_reach(curve, 3.0) == doctest::Approx(100));  // exactly at a point
  CHECK(tokens_to_reach(curve, 2.5) == doctest::Approx(150));  // the first crossing, not the later one
  CHECK(tokens_to_reach(curve, 6.0) == doctest::Approx(0));    // already below at the first point
  CHECK(std::isnan(tokens_to_reach(curve, 1.9)));              // never reached
  CHECK(std::isnan(tokens_to_reach({}, 1.0)));
  CHECK(tokens_to_reach({{10, 4.0}, {20, 4.0}, {30, 3.0}}, 4.0) == doctest::Approx(10));
  // A step up then down: the point where it first gets there, never a value from a rising segment.
  CHECK(tokens_to_reach({{0, 3.0}, {10, 3.5}, {20, 2.5}}, 3.0) == doctest::Approx(0));
  CHECK(tokens_to_reach({{0, 4.0}, {10, 4.5}, {20, 2.5}}, 3.0) == doctest::Approx(17.5));
}

TEST_CASE("bench parity: every mode against dp of the same seed — reach ratio and gap in percent") {
  parity_corpus c;
  parity_outcome dp, fast;
  dp.mode = "dp";
  dp.loss = {2.0, 3.0};
  dp.curves = {{{0, 4.0}, {100, 2.0}}, {{0, 5.0}, {100, 3.0}}};  // dp reaches its own final loss at 100
  fast.mode = "decoupled";
  fast.loss = {2.2, 2.7};
  fast.curves = {{{0, 4.0}, {100, 2.2}}, {{0, 5.0}, {50, 3.0}, {100, 2.7}}};  // seed 0 never gets to 2.0
  c.modes = {dp, fast};
  compare_with_reference(c);
  const parity_outcome& d = c.modes[0];
  const parity_outcome& m = c.modes[1];
  CHECK(d.reach_ratio == std::vector<double>{1.0, 1.0});
  CHECK(std::isnan(m.reach_tokens[0]));
  CHECK(std::isnan(m.reach_ratio[0]));
  CHECK(m.reach_tokens[1] == doctest::Approx(50));
  CHECK(m.reach_ratio[1] == doctest::Approx(0.5));
  CHECK(m.gap[0] == doctest::Approx(0.2));
  CHECK(m.gap[1] == doctest::Approx(-0.3));
  const std::vector<double> pct = gap_pct(m, d);
  REQUIRE(pct.size() == 2);
  CHECK(pct[0] == doctest::Approx(10.0));   // 0.2 over dp's 2.0
  CHECK(pct[1] == doctest::Approx(-10.0));  // 0.3 better than dp's 3.0
  CHECK(gap_pct(d, d) == std::vector<double>{0.0, 0.0});
  // Only the seeds that reached count in the ratio's mean; the interval is over them.
  CHECK(finite(m.reach_ratio) == std::vector<double>{0.5});
}

TEST_CASE("goodput: merged step time over learners x span, never from unmerged work") {
  ledger_totals l;
  l.step_time_s = 100;                               // every step the learners took
  l.merged_step_time_s = 60;                         // ... of which these steps' work was merged
  CHECK(ledger_goodput(l, 4, 25) == doctest::Approx(0.6));  // 4 learners x 25 s = 100 learner-seconds
  CHECK(ledger_goodput(l, 4, 50) == doctest::Approx(0.3));  // idle time counts against it
  CHECK(ledger_goodput(l, 0, 25) == 0);
  CHECK(ledger_goodput(l, 4, 0) == 0);
  l.merged_step_time_s = 0;
  CHECK(ledger_goodput(l, 4, 25) == 0);
}

TEST_CASE("bench figures as text: mean plus or minus a half width, the finite values, percentages") {
  CHECK(mean_pm({1, 2, 3}, 0.5, "%.1f") == "2.0 ± 0.5");
  CHECK(mean_pm({1, 3}, 1, "%+.2f", "%.2f") == "+2.00 ± 1.00");
  CHECK(mean_pm({4}, 9, "%.1f") == "4.0");
  CHECK(mean_pm({}, 0, "%.1f") == "—");
  CHECK(finite({1, nan_, 2, std::numeric_limits<double>::infinity()}) == std::vector<double>{1, 2});
  CHECK(scaled({0.5, 0.25}, 100) == std::vector<double>{50, 25});
}
