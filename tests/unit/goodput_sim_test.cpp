// The goodput simulator's core: closed forms it must meet, determinism, and
// the relations between the setups that the model implies.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

#include "core/prng.hpp"
#include "simulate/goodput_sim.hpp"

using namespace archipelago::goodput;

namespace {

constexpr double seconds_per_year = 365.25 * 86400;

// A chip MTBI that gives each slice of `slice_chips` this mean time between failures.
double mtbi_years_for_slice_mtbf(double slice_mtbf_s, double slice_chips) {
  return slice_mtbf_s * slice_chips / seconds_per_year;
}

params small(setup kind, double chips) {
  params p;
  p.kind = kind;
  p.chips = chips;
  p.k = calibrated_constants();
  return p;
}

// `got` within its confidence interval (widened by `slack` for the bias of a
// finite horizon) of `want`; prints the seed and numbers when not.
void check_close(const estimate& got, double want, double slack, std::uint64_t seed) {
  const double tol = 3 * got.goodput.half_width + slack;
  INFO("seed " << seed << ": goodput " << got.goodput.mean << " ± " << got.goodput.half_width << ", closed form "
               << want);
  CHECK(std::abs(got.goodput.mean - want) <= tol);
}

}  // namespace

TEST_CASE("goodput sim: without failures every setup keeps 100 percent goodput and uptime") {
  for (setup kind : {setup::dp, setup::elastic_dp, setup::decoupled}) {
    params p = small(kind, 150000);
    p.learners = kind == setup::decoupled ? 4 : 1;
    p.mtbi_years = 1e6;  // 150k chips: one interruption in ~7 years; this run lasts 2.4 hours
    p.days = 0.1;
    REQUIRE(validate(p));
    const run_result r = simulate_once(p, 7);
    INFO(to_string(kind));
    CHECK(r.interruptions == 0);
    CHECK(r.goodput == doctest::Approx(1.0).epsilon(1e-12));
    CHECK(r.uptime == doctest::Approx(1.0).epsilon(1e-12));
  }
}

TEST_CASE("goodput sim: one seed reproduces a run and another seed changes it") {
  params p = small(setup::decoupled, 300000);
  p.learners = 4;
  p.days = 2;
  const run_result a = simulate_once(p, 42), b = simulate_once(p, 42), c = simulate_once(p, 43);
  CHECK(a.goodput == b.goodput);
  CHECK(a.uptime == b.uptime);
  CHECK(a.interruptions == b.interruptions);
  CHECK(a.events == b.events);
  CHECK(a.goodput != c.goodput);
  const estimate e1 = simulate(p, 3, 9), e2 = simulate(p, 3, 9);
  CHECK(e1.goodput.mean == e2.goodput.mean);
  CHECK(e1.goodput.half_width == e2.goodput.half_width);
}

TEST_CASE("goodput sim: non-elastic dp waiting for exponential repairs is up with probability A to the n") {
  // n independent slices alternating Exp(MTBF) up and Exp(MTTR) down; the job
  // trains only when all are up: availability (MTBF / (MTBF + MTTR))^n.
  params p = small(setup::dp, 2560);
  p.k.slice_chips = 256;  // 10 slices
  p.k.dp_mode = dp_recovery::repair;
  p.k.repair = repair_law::exponential;
  p.k.repair_mean_s = 100;
  p.k.upscale_s = 0;  // no restart cost: the closed form has none
  p.k.reschedule_s = p.k.reload_s = p.k.restart_extra_s = 0;
  p.k.checkpoint_interval_s = p.k.checkpoint_write_s = 0;
  p.mtbi_years = mtbi_years_for_slice_mtbf(1000, 256);
  p.days = 20;
  const double want = std::pow(1000.0 / 1100.0, 10);
  const std::uint64_t seed = 11;
  const estimate e = simulate(p, 12, seed);
  check_close(e, want, 0.003, seed);
  CHECK(e.uptime.mean == doctest::Approx(e.goodput.mean).epsilon(1e-9));  // one job: trains = advances
}

TEST_CASE("goodput sim: elastic dp without pauses keeps the up share of its chips") {
  params p = small(setup::elastic_dp, 25600);
  p.k.slice_chips = 256;
  p.k.repair = repair_law::lognormal;  // any law: availability depends on the mean only
  p.k.repair_mean_s = 300;
  p.k.downscale_s = p.k.upscale_s = p.k.upscale_hold_s = 0;
  p.mtbi_years = mtbi_years_for_slice_mtbf(2000, 256);
  p.days = 10;
  const std::uint64_t seed = 5;
  const estimate e = simulate(p, 8, seed);
  check_close(e, 2000.0 / 2300.0, 0.002, seed);
  CHECK(e.uptime.mean > 0.999);  // 100 slices are never all down
}

TEST_CASE("goodput sim: non-elastic dp with spares loses one restart per failure, 1 over 1 plus lambda T") {
  // Up time Exp(1/λ), then a restart of fixed T (detection and tear-down,
  // rescheduling, bring-up, reload, the rest) that folds in failures during it:
  // an alternating renewal process with availability 1 / (1 + λT).
  params p = small(setup::dp, 600000);
  p.k.dp_mode = dp_recovery::spare;
  p.k.downscale_s = 10;
  p.k.reschedule_s = 5;
  p.k.upscale_s = 20;
  p.k.reload_s = 7;
  p.k.restart_extra_s = 18;
  p.k.checkpoint_interval_s = p.k.checkpoint_write_s = 0;
  p.days = 10;
  const double lambda = p.chips / (p.mtbi_years * seconds_per_year);
  const std::uint64_t seed = 3;
  const estimate e = simulate(p, 8, seed);
  check_close(e, 1 / (1 + lambda * 60), 0.002, seed);
  // The inverse: the extra cost at which goodput is a given value, T = (1/g - 1)/λ less what is modelled.
  p.k.restart_extra_s = 0;
  const double want_extra = (1 / 0.4 - 1) / lambda - 42;
  INFO("seed " << seed << ": closed form " << want_extra << " s");
  CHECK(implied_restart_extra(p, 0.4, 8, seed) == doctest::Approx(want_extra).epsilon(0.03));
  CHECK(implied_restart_extra(p, 0.999, 8, seed) == 0);  // the modelled costs alone are too high already
  CHECK(std::isnan(implied_restart_extra(p, 1e-4, 8, seed)));  // not even an hour's restart goes that low
}

TEST_CASE("goodput sim: checkpoints lose the work since the last one") {
  params p = small(setup::dp, 150000);
  p.days = 5;
  p.k.checkpoint_write_s = 0;
  const double lossless = simulate(p, 4, 1).goodput.mean;
  p.k.checkpoint_interval_s = 1;  // about nothing lost: failures are minutes apart
  const double often = simulate(p, 4, 1).goodput.mean;
  p.k.checkpoint_interval_s = 600;  // longer than the mean time between failures
  const double rarely = simulate(p, 4, 1).goodput.mean;
  CHECK(often == doctest::Approx(lossless).epsilon(0.01));
  CHECK(rarely < often - 0.1);
}

TEST_CASE("goodput sim: checkpoints that block cost their time, and Young-Daly's interval is the best one") {
  // Lossless restarts aside, each failure loses the work since the last
  // checkpoint and each checkpoint blocks delta: the waste per unit time is about
  // delta / C + lambda C / 2, least at C = sqrt(2 delta / lambda), where it is
  // sqrt(2 delta lambda) (Young, Daly).
  params p = small(setup::dp, 150000);
  p.k.downscale_s = p.k.upscale_s = p.k.reschedule_s = p.k.reload_s = p.k.restart_extra_s = 0;
  p.k.checkpoint_write_s = 2;
  p.days = 10;
  const double lambda = p.chips / (p.mtbi_years * seconds_per_year);
  const std::uint64_t seed = 21;
  const estimate young_daly = simulate(p, 8, seed);
  check_close(young_daly, 1 - std::sqrt(2 * 2 * lambda), 0.01, seed);
  const double c = std::sqrt(2 * 2 / lambda);
  for (double factor : {0.3, 3.0}) {
    p.k.checkpoint_interval_s = factor * c;
    INFO("interval " << p.k.checkpoint_interval_s << " s against Young-Daly's " << c << " s");
    CHECK(simulate(p, 8, seed).goodput.mean < young_daly.goodput.mean - 0.01);
  }
}

TEST_CASE("goodput sim: decoupled with one learner is elastic dp") {
  params e = small(setup::elastic_dp, 300000);
  e.days = 3;
  params d = e;
  d.kind = setup::decoupled;
  d.learners = 1;
  const run_result a = simulate_once(e, 8), b = simulate_once(d, 8);
  CHECK(a.goodput == b.goodput);
  CHECK(a.uptime == b.uptime);
  CHECK(a.interruptions == b.interruptions);
}

TEST_CASE("goodput sim: goodput falls with chips and rises with learners") {
  double last = 1.0;
  for (double chips : {150000.0, 600000.0, 2400000.0}) {
    params p = small(setup::elastic_dp, chips);
    p.days = 3;
    const double g = simulate(p, 3, 2).goodput.mean;
    INFO("elastic_dp at " << chips << " chips: " << g);
    CHECK(g < last);
    last = g;
  }
  last = 0.0;
  for (int m : {1, 2, 4, 8, 16}) {
    params p = small(setup::decoupled, 1200000);
    p.learners = m;
    p.days = 3;
    const estimate e = simulate(p, 3, 2);
    INFO("decoupled M=" << m << ": " << e.goodput.mean);
    CHECK(e.goodput.mean > last);
    // The global model stops only while every learner pauses at once.
    if (m >= 8) CHECK(e.uptime.mean > 0.9999);
    last = e.goodput.mean;
  }
  // The rule of thumb the model embodies: M learners at N chips ≈ one elastic job at N/M.
  params d = small(setup::decoupled, 1200000);
  d.learners = 4;
  d.days = 5;
  params e = small(setup::elastic_dp, 300000);
  e.days = 5;
  CHECK(simulate(d, 4, 3).goodput.mean == doctest::Approx(simulate(e, 4, 3).goodput.mean).epsilon(0.02));
}

TEST_CASE("goodput sim: bad parameters are refused with the parameter named") {
  auto refused = [](params p, const char* word) {
    const auto st = validate(p);
    REQUIRE_FALSE(st);
    INFO(st.err().message);
    CHECK(st.err().message.find(word) != std::string::npos);
  };
  params p = small(setup::decoupled, 1024);
  p.learners = 8;  // 1024 / 256 = 4 slices
  refused(p, "learners");
  p = small(setup::dp, 150000);
  p.learners = 2;
  refused(p, "learners");
  p = small(setup::elastic_dp, 0);
  refused(p, "chips");
  p = small(setup::elastic_dp, 150000);
  p.mtbi_years = -1;
  refused(p, "mtbi");
  p = small(setup::elastic_dp, 150000);
  p.k.downscale_s = std::nan("");
  refused(p, "downscale");
  p = small(setup::elastic_dp, 150000);
  p.k.slice_chips = 0;
  refused(p, "slice");
  CHECK_FALSE(parse_setup("elastic"));
  CHECK(*parse_setup("elastic_dp") == setup::elastic_dp);
  CHECK_FALSE(parse_repair_law("weibull"));
  CHECK_FALSE(parse_dp_recovery("hope"));
}

TEST_CASE("goodput sim: Student t quantiles") {
  CHECK(t95(1) == doctest::Approx(12.706));
  CHECK(t95(9) == doctest::Approx(2.262));
  CHECK(t95(1000) == doctest::Approx(1.962).epsilon(0.001));
}

TEST_CASE("goodput sim: the table has the paper's 30 cells and calibration improves the elastic row") {
  params base = small(setup::elastic_dp, 150000);
  base.days = 0.5;
  const auto cells = run_table(base, 2, 1, 3.0);
  REQUIRE(cells.size() == 30);
  CHECK(cells.front().row == "dp");
  CHECK(cells.front().chips == 150000);
  CHECK(cells.back().row == "decoupled_16");
  CHECK(cells.back().chips == 2400000);
  CHECK(cells.back().paper_pct == 86);
  for (const auto& c : cells) {
    CHECK(c.diff_pts == doctest::Approx(100 * c.ours.goodput.mean - c.paper_pct));
    CHECK(c.within == (std::abs(c.diff_pts) <= 3.0));
    // dp cells carry what the paper's value implies, a range around it; the others do not.
    CHECK(std::isnan(c.implied_extra_s) == (c.row != "dp"));
    if (c.row == "dp") {  // ours is above the paper's dp row: the band is reached by some extra cost
      REQUIRE_FALSE(std::isnan(c.implied_extra_lo_s));
      CHECK(c.implied_extra_lo_s <= c.implied_extra_s);
      CHECK(c.implied_extra_s <= c.implied_extra_hi_s);
    }
  }
  constants start = calibrated_constants();
  start.downscale_s = 60;  // far off: the search must come back
  start.upscale_s = 60;
  base.days = 0.3;
  const calibration cal = calibrate(base, start, 1, 1);
  params far = base;
  far.k = start;
  double far_ss = 0;
  for (std::size_t i = 0; i < table_chips.size(); ++i) {
    far.chips = table_chips[i];
    const double d = 100 * simulate(far, 1, archipelago::derive_seed(1, i)).goodput.mean - paper_table()[1].paper_pct[i];
    far_ss += d * d;
  }
  CHECK(cal.rms_error_pts < std::sqrt(far_ss / 5) / 2);
  CHECK(cal.best.downscale_s < 60);
  CHECK(cal.candidates > 10);
}
