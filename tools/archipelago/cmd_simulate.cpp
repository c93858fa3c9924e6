// archipelago simulate: goodput at scale by discrete-event simulation (paper
// Table 1). One setup, the whole table beside the paper's values, or the
// calibration of the model's free constants on the elastic_dp row. The model is
// in goodput_sim.hpp; this file parses flags and prints. `simulate wan` (the
// paper's 12B over 2-5 Gbit/s on paper) is in cmd_simulate_wan.cpp.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "bench/bench_stats.hpp"
#include "cli_common.hpp"
#include "commands.hpp"
#include "report/svg_chart.hpp"
#include "simulate/goodput_sim.hpp"

namespace archipelago::cli {
namespace {

using namespace archipelago::goodput;

struct simulate_options {
  std::string policy = "decoupled";
  double chips = 150000;
  int learners = 8;
  CLI::Option* learners_flag = nullptr;
  double mtbi_years = 1.0;
  double days = 30;
  int replications = 10;
  std::uint64_t seed = 1;
  std::string repair_law_name = to_string(calibrated_constants().repair);
  std::string dp_recovery_name = to_string(calibrated_constants().dp_mode);
  constants k = calibrated_constants();
  bool table = false, calibrate = false, json = false;
  double tolerance_pts = 3.0;
  std::string plot;  // --table: an SVG of ours beside the paper's
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string chips_label(double chips) {
  char buf[32];
  if (chips >= 1e6) std::snprintf(buf, sizeof buf, "%gM", chips / 1e6);
  else if (chips >= 1e3) std::snprintf(buf, sizeof buf, "%gk", chips / 1e3);
  else std::snprintf(buf, sizeof buf, "%g", chips);
  return buf;
}

std::string constants_json(const constants& k) {
  json_line j;
  j.add("slice_chips", k.slice_chips)
      .add("repair_mean_s", k.repair_mean_s)
      .add("repair_law", to_string(k.repair))
      .add("repair_sigma", k.repair_sigma)
      .add("downscale_s", k.downscale_s)
      .add("upscale_s", k.upscale_s)
      .add("upscale_hold_s", k.upscale_hold_s)
      .add("dp_recovery", to_string(k.dp_mode))
      .add("reschedule_s", k.reschedule_s)
      .add("reload_s", k.reload_s)
      .add("restart_extra_s", k.restart_extra_s)
      .add("checkpoint_interval_s", k.checkpoint_interval_s)
      .add("checkpoint_write_s", k.checkpoint_write_s);
  return j.str();
}

void print_constants(const constants& k) {
  std::printf("constants: slice %g chips; repair %s, mean %g s (sigma %g); downscale %g s, upscale %g s, "
              "upscale hold %g s; dp: %s, reschedule %g s, reload %g s, restart extra %g s, checkpoint ",
              k.slice_chips, to_string(k.repair), k.repair_mean_s, k.repair_sigma, k.downscale_s, k.upscale_s,
              k.upscale_hold_s, to_string(k.dp_mode), k.reschedule_s, k.reload_s, k.restart_extra_s);
  if (k.checkpoint_interval_s > 0) std::printf("every %g s", k.checkpoint_interval_s);
  else if (k.checkpoint_write_s > 0) std::printf("at Young-Daly's interval");
  else std::printf("lossless");
  std::printf(", blocking %g s\n", k.checkpoint_write_s);
}

std::string pct_ci(const interval& i) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%5.1f ± %.1f", 100 * i.mean, 100 * i.half_width);
  return buf;
}

int run_one(const simulate_options& o, const params& p) {
  const double slices = std::max(1.0, std::round(p.chips / p.k.slice_chips));
  const double mtbf_s = p.mtbi_years * 365.25 * 86400 / p.chips;
  std::printf("simulate %s", to_string(p.kind));
  if (p.kind == setup::decoupled) std::printf(", %d learners", p.learners);
  std::printf(": %.0f chips in %.0f slices; chip MTBI %g years, so an interruption every %.1f s; "
              "%g days, %d replications, seed %llu\n",
              p.chips, slices, p.mtbi_years, mtbf_s, p.days, o.replications,
              static_cast<unsigned long long>(o.seed));
  print_constants(p.k);
  const auto start = std::chrono::steady_clock::now();
  const estimate e = simulate(p, o.replications, o.seed);
  const double wall = seconds_since(start);
  std::printf("goodput %s %% (95 %% CI)   uptime %s %%\n", pct_ci(e.goodput).c_str(), pct_ci(e.uptime).c_str());
  std::printf("%.0f interruptions per run, %llu events in all; simulated in %.2f s\n", e.interruptions_per_run,
              static_cast<unsigned long long>(e.events), wall);
  if (o.json) {
    json_line j;
    j.add("command", "simulate")
        .add("policy", to_string(p.kind))
        .add("chips", static_cast<std::int64_t>(std::llround(p.chips)))
        .add("learners", p.learners)
        .add("mtbi_years", p.mtbi_years)
        .add("days", p.days)
        .add("replications", o.replications)
        .add("seed", o.seed)
        .add("goodput", e.goodput.mean)
        .add("goodput_ci95", e.goodput.half_width)
        .add("uptime", e.uptime.mean)
        .add("uptime_ci95", e.uptime.half_width)
        .add("interruptions_per_run", e.interruptions_per_run)
        .add("events", e.events)
        .add("wall_s", wall)
        .add_raw("constants", constants_json(p.k));
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

/// Goodput against chips, one colour per row: ours solid, the paper's dashed.
std::string table_plot(const std::vector<table_cell>& cells) {
  std::vector<series> lines;
  std::vector<std::pair<double, std::string>> ticks;
  for (std::size_t i = 0; i < table_chips.size(); ++i) ticks.emplace_back(static_cast<double>(i), chips_label(table_chips[i]));
  for (std::size_t r = 0; r < paper_table().size(); ++r) {
    const std::string row = paper_table()[r].name;
    series ours{row, series_color(r), {}}, paper{"", series_color(r), {}, true};
    for (const auto& c : cells) {
      if (c.row != row) continue;
      const double x = std::log2(c.chips / table_chips.front());  // the table doubles the chips per column
      ours.points.emplace_back(x, 100 * c.ours.goodput.mean);
      paper.points.emplace_back(x, c.paper_pct);
    }
    lines.push_back(std::move(ours));
    lines.push_back(std::move(paper));
  }
  return chart("Table 1: goodput, ours (solid) vs the paper (dashed)", "chips", "goodput %", lines, {},
               static_cast<double>(table_chips.size() - 1), ticks);
}

int run_table_cmd(const simulate_options& o, const params& base) {
  std::printf("Table 1: goodput (%%), chip MTBI %g years; ours = mean ± 95 %% CI over %d replications of %g days, "
              "seed %llu\n",
              base.mtbi_years, o.replications, base.days, static_cast<unsigned long long>(o.seed));
  print_constants(base.k);
  const auto start = std::chrono::steady_clock::now();
  const auto cells = run_table(base, o.replications, o.seed, o.tolerance_pts);
  const double wall = seconds_since(start);
  std::printf("\n%-13s %6s  %-12s %6s %7s  %s\n", "setup", "chips", "ours", "paper", "diff", "within");
  int within = 0;
  for (const auto& c : cells) {
    std::printf("%-13s %6s  %-12s %6.0f %+7.1f  %s\n", c.row.c_str(), chips_label(c.chips).c_str(),
                pct_ci(c.ours.goodput).c_str(), c.paper_pct, c.diff_pts, c.within ? "yes" : "NO");
    within += c.within ? 1 : 0;
  }
  std::printf("\n%d of %zu cells within %g points (simulated in %.1f s)\n", within, cells.size(), o.tolerance_pts,
              wall);
  for (const auto& c : cells)
    if (!c.within)
      std::printf("not reproduced: %s at %s chips: ours %.1f %%, paper %.0f %% (%+.1f points)\n", c.row.c_str(),
                  chips_label(c.chips).c_str(), 100 * c.ours.goodput.mean, c.paper_pct, c.diff_pts);
  // What the paper's dp row implies beyond the restart modelled, and whether one
  // value could serve every cell.
  const constants& k = base.k;
  std::printf("\ndp, not elastic: a restart costs detection and tear-down %.1f s + rescheduling %.1f s + bring-up "
              "%.1f s + reload %.1f s + extra %.1f s = %.1f s, and the work since the last checkpoint (each blocks "
              "%.2f s). The "
              "paper's dp row implies a restart this much longer (--restart-extra-s; the range: within %g points):\n",
              k.downscale_s, k.reschedule_s, k.upscale_s, k.reload_s, k.restart_extra_s, restart_s(k),
              k.checkpoint_write_s, o.tolerance_pts);
  std::printf("  %-5s %16s %10s %26s %16s\n", "chips", "checkpoint every", "implied", "range", "restart in all");
  double lo = 0, hi = std::numeric_limits<double>::infinity();
  bool reachable = true;
  for (const auto& c : cells) {
    if (c.row != "dp") continue;
    params p = base;
    p.kind = setup::dp;
    p.chips = c.chips;
    const double every = checkpoint_interval(p);
    const std::string range = std::isnan(c.implied_extra_lo_s)
                                  ? "none: below without any"
                                  : fmt("%.1f to ", c.implied_extra_lo_s) + fmt("%.1f s", c.implied_extra_hi_s);
    std::printf("  %-5s %16s %8.1f s %26s %14.1f s\n", chips_label(c.chips).c_str(),
                every > 0 ? fmt("%.1f s", every).c_str() : "lossless", c.implied_extra_s, range.c_str(),
                restart_s(k) - k.restart_extra_s + c.implied_extra_s);
    if (std::isnan(c.implied_extra_lo_s)) {
      reachable = false;
      continue;
    }
    lo = std::max(lo, c.implied_extra_lo_s);
    if (!std::isnan(c.implied_extra_hi_s)) hi = std::min(hi, c.implied_extra_hi_s);
  }
  if (reachable && lo <= hi)
    std::printf("one extra cost from %.1f to %.1f s puts every dp cell within %g points\n", lo, hi, o.tolerance_pts);
  else if (reachable)
    std::printf("no one extra cost puts every dp cell within %g points (the cells need at least %.1f s and at "
                "most %.1f s)\n",
                o.tolerance_pts, lo, hi);
  else
    std::printf("no extra cost puts every dp cell within %g points: the modelled costs are already too high\n",
                o.tolerance_pts);
  if (!o.plot.empty()) {
    if (auto ok = write_text_file("--plot", o.plot, table_plot(cells)); !ok) return report(ok.err());
    std::printf("plot: %s\n", o.plot.c_str());
  }
  if (o.json) {
    std::string arr = "[";
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const auto& c = cells[i];
      json_line j;
      j.add("row", c.row)
          .add("chips", static_cast<std::int64_t>(std::llround(c.chips)))
          .add("ours", c.ours.goodput.mean)
          .add("ours_ci95", c.ours.goodput.half_width)
          .add("uptime", c.ours.uptime.mean)
          .add("paper", c.paper_pct / 100)
          .add("diff_pts", c.diff_pts)
          .add("within", c.within);
      if (c.row == "dp")
        j.add("implied_extra_s", c.implied_extra_s)
            .add("implied_extra_lo_s", c.implied_extra_lo_s)
            .add("implied_extra_hi_s", c.implied_extra_hi_s);
      arr += (i ? "," : "") + j.str();
    }
    arr += "]";
    json_line j;
    j.add("command", "simulate")
        .add("mode", "table")
        .add("mtbi_years", base.mtbi_years)
        .add("days", base.days)
        .add("replications", o.replications)
        .add("seed", o.seed)
        .add("tolerance_pts", o.tolerance_pts)
        .add("within", within)
        .add("cells_total", static_cast<int>(cells.size()))
        .add("wall_s", wall)
        .add_raw("constants", constants_json(base.k))
        .add_raw("cells", arr);
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

int run_calibrate(const simulate_options& o, const params& base, logger& log) {
  std::printf("calibrating downscale_s, upscale_s, upscale_hold_s on the elastic_dp row only "
              "(%d replications of %g days, seed %llu), starting from:\n",
              o.replications, base.days, static_cast<unsigned long long>(o.seed));
  print_constants(base.k);
  progress_line progress(log, 25);
  const auto start = std::chrono::steady_clock::now();
  const calibration c = calibrate(base, base.k, o.replications, o.seed, [&](int n, double rms) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "candidate %d, best RMS error %.2f points", n, rms);
    progress.update(buf);
  });
  progress.finish();
  const double wall = seconds_since(start);
  std::printf("best after %d candidates (%.1f s):\n", c.candidates, wall);
  print_constants(c.best);
  std::printf("elastic_dp row:");
  for (std::size_t i = 0; i < table_chips.size(); ++i)
    std::printf("  %s %.1f (paper %.0f)", chips_label(table_chips[i]).c_str(), c.ours_pct[i],
                paper_table()[1].paper_pct[i]);
  std::printf("\nRMS error %.2f points, largest %.2f points\n", c.rms_error_pts, c.max_error_pts);
  std::printf("flags: --downscale-s %.4g --upscale-s %.4g --upscale-hold-s %.4g\n", c.best.downscale_s,
              c.best.upscale_s, c.best.upscale_hold_s);
  if (o.json) {
    std::string row = "[";
    for (std::size_t i = 0; i < c.ours_pct.size(); ++i) row += (i ? "," : "") + std::to_string(c.ours_pct[i] / 100);
    row += "]";
    json_line j;
    j.add("command", "simulate")
        .add("mode", "calibrate")
        .add("days", base.days)
        .add("replications", o.replications)
        .add("seed", o.seed)
        .add("candidates", c.candidates)
        .add("rms_error_pts", c.rms_error_pts)
        .add("max_error_pts", c.max_error_pts)
        .add_raw("elastic_dp", row)
        .add("wall_s", wall)
        .add_raw("constants", constants_json(c.best));
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

int run_simulate(simulate_options& o, logger& log) {
  if (o.table && o.calibrate) return report(make_error(errc::invalid_input, "--table and --calibrate exclude each other"));
  if (!o.plot.empty() && !o.table) return report(make_error(errc::invalid_input, "--plot draws the table: add --table"));
  if (auto ok = check_output_path("--plot", o.plot); !ok) return report(ok.err());
  auto kind = parse_setup(o.policy);
  if (!kind) return report(kind.err());
  auto law = parse_repair_law(o.repair_law_name);
  if (!law) return report(law.err());
  auto recovery = parse_dp_recovery(o.dp_recovery_name);
  if (!recovery) return report(recovery.err());
  if (o.replications < 1 || o.replications > 100000)
    return report(make_error(errc::invalid_input, "replications must be in [1, 100000]"));
  if (!(o.tolerance_pts >= 0)) return report(make_error(errc::invalid_input, "tolerance must be >= 0"));
  params p;
  p.kind = *kind;
  p.chips = o.chips;
  const bool learners_given = o.learners_flag->count() > 0;
  if (*kind != setup::decoupled && learners_given && !o.table && !o.calibrate)
    return report(make_error(errc::invalid_input,
                             "--learners applies to --policy decoupled only; " + o.policy + " is one job"));
  p.learners = *kind == setup::decoupled ? o.learners : 1;
  p.mtbi_years = o.mtbi_years;
  p.days = o.days;
  p.k = o.k;
  p.k.repair = *law;
  p.k.dp_mode = *recovery;
  if (o.table || o.calibrate) {
    // Every cell's chips are at least the table's smallest: check the constants against it.
    params check = p;
    check.kind = setup::decoupled;
    check.learners = 16;
    check.chips = table_chips.front();
    if (auto ok = validate(check); !ok) return report(ok.err());
    return o.table ? run_table_cmd(o, p) : run_calibrate(o, p, log);
  }
  if (auto ok = validate(p); !ok) return report(ok.err());
  return run_one(o, p);
}

}  // namespace

runner add_simulate_command(CLI::App& app) {
  auto o = std::make_shared<simulate_options>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Goodput at scale: a discrete-event simulation of chips, slices and failures (paper Table 1)");
  cmd->add_option("--policy", o->policy, "Setup: dp (not elastic), elastic_dp or decoupled")->capture_default_str();
  cmd->add_option("--chips", o->chips, "Chips in all")->capture_default_str();
  o->learners_flag =
      cmd->add_option("--learners", o->learners, "Learners M (decoupled; each has chips / M)")->capture_default_str();
  cmd->add_option("--mtbi-years", o->mtbi_years, "Mean time between interruptions of one chip, in years")
      ->capture_default_str();
  cmd->add_option("--days", o->days, "Simulated wall-clock per replication, in days")->capture_default_str();
  cmd->add_option("--replications", o->replications, "Independent seeded runs per estimate (95 % CI over them)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of replication 0 (replication r uses a seed derived from it)")
      ->capture_default_str();
  cmd->add_option("--slice-chips", o->k.slice_chips, "Chips per slice, the unit that fails and is repaired")
      ->capture_default_str();
  cmd->add_option("--repair-mean-s", o->k.repair_mean_s, "Mean time for a failed slice to come back")
      ->capture_default_str();
  cmd->add_option("--repair-law", o->repair_law_name, "Repair time law: lognormal, exponential or fixed")
      ->capture_default_str();
  cmd->add_option("--repair-sigma", o->k.repair_sigma, "Lognormal repair: standard deviation of the log")
      ->capture_default_str();
  cmd->add_option("--downscale-s", o->k.downscale_s, "Elastic: pause to drop a failed slice (calibrated)")
      ->capture_default_str();
  cmd->add_option("--upscale-s", o->k.upscale_s, "Elastic: pause to take returned slices back (calibrated)")
      ->capture_default_str();
  cmd->add_option("--upscale-hold-s", o->k.upscale_hold_s,
                  "Elastic: a returned slice waits this long so that returns share one upscale (calibrated)")
      ->capture_default_str();
  cmd->add_option("--dp-recovery", o->dp_recovery_name,
                  "Non-elastic dp: spare (swap a spare, restart) or repair (wait until every slice is back)")
      ->capture_default_str();
  cmd->add_option("--reschedule-s", o->k.reschedule_s, "Non-elastic dp: rescheduling the job onto a spare slice")
      ->capture_default_str();
  cmd->add_option("--reload-s", o->k.reload_s, "Non-elastic dp: reading the last checkpoint back")
      ->capture_default_str();
  cmd->add_option("--restart-extra-s", o->k.restart_extra_s,
                  "Non-elastic dp: restart cost beyond detection, rescheduling, bring-up and reload")
      ->capture_default_str();
  cmd->add_option("--checkpoint-interval-s", o->k.checkpoint_interval_s,
                  "Non-elastic dp: seconds of training between checkpoints, the work since the last lost at a "
                  "failure (0: Young-Daly's optimum from --checkpoint-write-s, or lossless)")
      ->capture_default_str();
  cmd->add_option("--checkpoint-write-s", o->k.checkpoint_write_s,
                  "Non-elastic dp: training time one checkpoint blocks")
      ->capture_default_str();
  cmd->add_flag("--table", o->table, "Simulate all 30 cells of Table 1 and compare each with the paper");
  cmd->add_option("--tolerance", o->tolerance_pts, "--table: a cell within this many points is reproduced")
      ->capture_default_str();
  cmd->add_flag("--calibrate", o->calibrate,
                "Fit downscale-s, upscale-s, upscale-hold-s to the paper's elastic_dp row only");
  cmd->add_option("--plot", o->plot, "--table: also draw ours beside the paper's as an SVG file");
  cmd->add_flag("--json", o->json, "Print a one-line JSON summary last");
  runner wan = add_simulate_wan(*cmd);
  return [o, wan, cmd](logger& log) { return cmd->get_subcommand("wan")->parsed() ? wan(log) : run_simulate(*o, log); };
}

}  // namespace archipelago::cli
