// archipelago bench ablate WHICH: the paper's ablations (ALGORITHM.md §9) on the
// one-process mesh (run_local_mesh), every variant on the same seeds and the same
// budget, against a reference variant run in the same invocation:
//   merge      RDA vs the token-weighted mean (mesh.merge), at M = 8 and M = 16,
//              the same tokens at both M; reference: mean
//   encoding   fp32, bf16, int8, int4, int2 outer gradients (wire.encoding); reference: fp32
//   quorum     half the learners paced 2x slower; K=1 + grace, K=1 without grace, K=M,
//              and K=M lock-step (streaming, H = P), for the same wall time; reference: K=1 + grace
//   fragments  P in {2, 6, 12, 24}; reference: the default, 24
// Learners are paced (mesh.step_time_ms, calibrated like a drill's budget unless
// given): on two cores, 8 or 16 unpaced learners would measure CPU contention,
// not the algorithm. Variants alternate within each seed, so a drift in the load
// of this shared machine falls on all of them alike. Goodput and uptime come from
// the broker's ledger, which pacing makes robust to that load.

#include "cmd_bench_ablate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_stats.hpp"
#include "cli_common.hpp"
#include "drill/drill.hpp"
#include "node/local_mesh.hpp"
#include "report/svg_chart.hpp"

namespace archipelago::cli {
namespace {

struct ablate_options {
  std::string which;
  std::string model = "nano";
  int batch = 8;
  std::int64_t steps = 0;   // 0: the ablation's default
  int learners = 4;         // encoding, quorum, fragments
  std::vector<int> merge_learners{8, 16};
  std::vector<int> fragments{2, 6, 12, 24};
  std::vector<std::string> encodings{"fp32", "bf16", "int8", "int4", "int2"};
  int seeds = 1;
  double step_time_ms = 0;  // 0: calibrated per M
  double eval_period_s = 10;  // evaluations of Θ during a run (the plot's points)
  bool json = false;
  std::string plot;  // an SVG of eval loss against tokens per variant (the first seed's runs)
  config_flags flags;
  CLI::App* command = nullptr;
};

ablate_options& options() {
  static ablate_options o;
  return o;
}

/// One configuration of an ablation.
struct variant {
  std::string group;  // variants are compared within a group ("M=8"); empty: one group
  std::string name;
  std::string knobs;  // what makes it, as --set flags
  std::string paper;  // the paper's figure for it, or "" when it gives none
  bool reference = false;
  int learners = 4;
  std::int64_t steps = 0;
  std::function<void(config&)> apply;
  bool whole_schedule = false;  // quorum: runs every step instead of the common wall time
};

/// A variant's runs, one per seed.
struct outcome {
  std::vector<double> loss, bpb, goodput, uptime, bytes, wall_s, tokens, steps, members, late, overruns;
  std::vector<double> rel;         // loss vs the group's reference, same seed, in %
  std::vector<double> rel_second;  // vs the second reference (encoding: bf16), in %
  double step_time_ms = 0;
  bool ledger_exact = true;
  std::vector<std::vector<std::pair<double, double>>> curves;  // per seed: (tokens, eval loss)
};

/// The eval loss of a curve at `tokens`, linearly between its points; NaN outside it.
double loss_at(const std::vector<std::pair<double, double>>& curve, double tokens) {
  for (std::size_t i = 1; i < curve.size(); ++i)
    if (curve[i].first >= tokens && curve[i - 1].first <= tokens) {
      const auto [t0, l0] = curve[i - 1];
      const auto [t1, l1] = curve[i];
      return t1 > t0 ? l0 + (l1 - l0) * (tokens - t0) / (t1 - t0) : l1;
    }
  return std::nan("");
}

/// Eval loss against tokens, one chart per group, one line per variant (the reference dashed).
std::string ablation_plot(const std::string& which, const std::vector<variant>& variants,
                          const std::vector<outcome>& results) {
  static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  std::vector<std::string> charts;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const std::string& group = variants[i].group;
    if (i > 0 && variants[i - 1].group == group) continue;
    std::vector<series> lines;
    for (std::size_t j = i; j < variants.size() && variants[j].group == group; ++j)
      lines.push_back(series{variants[j].name, colors[lines.size() % 6],
                             results[j].curves.empty() ? std::vector<std::pair<double, double>>{} : results[j].curves.front(),
                             variants[j].reference});
    charts.push_back(chart("bench ablate " + which + (group.empty() ? "" : ", " + group) +
                               ": eval loss (the reference dashed)",
                           "tokens", "eval loss, nats/byte", lines, {}));
  }
  return stack_charts(charts);
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return std::nan("");
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
/// Half the range: with 1-3 seeds an honest spread, unlike a standard deviation.
double spread(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return (*hi - *lo) / 2;
}
std::string with_spread(const std::vector<double>& v, const char* format) {
  char a[48], b[48];
  std::snprintf(a, sizeof a, format, mean(v));
  if (v.size() < 2) return a;
  std::snprintf(b, sizeof b, format, spread(v));
  return std::string(a) + " ± " + b;
}
std::string signed_pct(const std::vector<double>& v) {
  if (v.empty()) return "—";
  char a[48], b[48];
  std::snprintf(a, sizeof a, "%+.2f %%", mean(v));
  if (v.size() < 2) return a;
  std::snprintf(b, sizeof b, " ± %.2f", spread(v));
  return a + std::string(b);
}

std::vector<variant> variants_of(const ablate_options& o, std::string& second_reference) {
  std::vector<variant> out;
  auto base = [&](std::string group, std::string name, std::string knobs, std::string paper, bool reference,
                  int learners, std::int64_t steps, std::function<void(config&)> apply) {
    out.push_back({std::move(group), std::move(name), std::move(knobs), std::move(paper), reference, learners, steps,
                   std::move(apply)});
  };
  if (o.which == "merge") {
    // The same tokens at every M: the smallest M runs --steps, the others proportionally fewer.
    const std::int64_t steps = o.steps > 0 ? o.steps : 600;
    const int smallest = *std::min_element(o.merge_learners.begin(), o.merge_learners.end());
    for (int m : o.merge_learners) {
      const std::string g = "M=" + std::to_string(m);
      const std::int64_t s = std::max<std::int64_t>(1, steps * smallest / m);
      base(g, "mean", "--set mesh.merge=mean", m == 8 ? "eval avg 54.1" : m == 16 ? "eval avg 52.7" : "", true, m,
           s, [](config& c) { c.mesh.merge = "mean"; });
      base(g, "rda", "--set mesh.merge=rda", m == 8 ? "eval avg 55.4 (+1.3 pt)" : m == 16 ? "eval avg 54.5 (+1.8 pt)" : "",
           false, m, s, [](config& c) { c.mesh.merge = "rda"; });
    }
  } else if (o.which == "encoding") {
    const std::int64_t steps = o.steps > 0 ? o.steps : 1000;
    second_reference = "bf16";
    for (const auto& e : o.encodings) {
      std::string paper = e == "bf16" ? "paper's reference" : e == "int4" ? "+0.09 % vs bf16" : e == "int2" ? "+32 % vs bf16 (breaks)" : "";
      base("", e, "--set wire.encoding=" + e, paper, e == "fp32", o.learners, steps,
           [e](config& c) { c.wire.encoding = e; });
    }
    if (std::none_of(out.begin(), out.end(), [](const variant& v) { return v.reference; })) out.front().reference = true;
  } else if (o.which == "quorum") {
    const std::int64_t steps = o.steps > 0 ? o.steps : 1000;
    const int m = o.learners;
    base("", "K=1 + grace", "", "100 % goodput, dp-level quality", true, m, steps, [](config&) {});
    base("", "K=1, no grace", "--set mesh.grace=false", "loses quality", false, m, steps,
         [](config& c) { c.mesh.grace = false; });
    base("", "K=M", "--set mesh.quorum=" + std::to_string(m), "loses goodput", false, m, steps,
         [m](config& c) { c.mesh.quorum = m; });
    base("", "K=M lock-step", "--mode streaming --set mesh.inner_steps=P --set mesh.mix=0", "loses goodput", false, m,
         steps, [](config& c) {
           c.mesh.mode = "streaming";
           c.mesh.inner_steps = c.mesh.fragments;  // every fragment syncs every P steps, as decoupled's do
           c.mesh.mix = 0;
         });
    // The quality reference: synchronous dp through the whole schedule (the slow learners
    // pace every step); its curve gives dp's loss at the tokens each variant processed.
    base("", "dp", "--mode dp (every step, no time limit)", "the quality reference", false, m, steps,
         [](config& c) { c.mesh.mode = "dp"; });
    out.back().whole_schedule = true;
  } else {  // fragments
    const std::int64_t steps = o.steps > 0 ? o.steps : 1000;
    const int reference = config{}.mesh.fragments;
    for (int p : o.fragments)
      base("", "P=" + std::to_string(p), "--set mesh.fragments=" + std::to_string(p), "", p == reference, o.learners,
           steps, [p](config& c) { c.mesh.fragments = p; });
    if (std::none_of(out.begin(), out.end(), [](const variant& v) { return v.reference; })) out.front().reference = true;
  }
  return out;
}

std::string heterogeneous_slowdown(int m) {
  // The first half at full speed, the second half 2x slower (the README's 1,1,2,2 at M = 4).
  std::string s;
  for (int i = 0; i < m; ++i) s += (i ? "," : "") + std::string(i < m / 2 ? "1" : "2");
  return s;
}

int run_ablate() {
  const ablate_options& o = options();
  install_stop_handlers();
  progress_line progress(20);
  auto fail = [&](const error& e) {
    progress.finish();
    return report(e);
  };
  if (auto ok = check_output_path("--plot", o.plot); !ok) return fail(ok.err());
  config defaults;
  defaults.model.size = o.model;
  defaults.data.batch = o.batch;
  auto resolved = o.flags.resolve(defaults);
  if (!resolved) return fail(resolved.err());
  const config base_cfg = *resolved;
  if (o.which == "merge" && base_cfg.mesh.mode != "decoupled" && base_cfg.mesh.mode != "streaming")
    return fail(make_error(errc::invalid_input, "bench ablate merge: mesh.mode " + base_cfg.mesh.mode +
                                                    " merges gradients or one fragment; use decoupled"));

  std::string second_reference;
  const std::vector<variant> variants = variants_of(o, second_reference);
  // Every variant's configuration is checked before the first run starts.
  std::vector<config> configs;
  std::map<int, double> step_ms;  // per M
  for (const auto& v : variants) {
    config c = base_cfg;
    c.mesh.learners = v.learners;
    c.train.steps = v.steps;
    v.apply(c);
    if (o.which == "quorum") c.mesh.learner_slowdown = heterogeneous_slowdown(v.learners);
    if (auto ok = validate_mesh(c); !ok)
      return fail(make_error(errc::invalid_input, "variant " + v.name + ": " + ok.err().message));
    configs.push_back(std::move(c));
  }
  for (const auto& v : variants)
    if (!step_ms.count(v.learners)) {
      double ms = o.step_time_ms;
      if (ms <= 0) {
        progress.update("bench ablate " + o.which + ": calibrating the step budget for M=" + std::to_string(v.learners),
                        true);
        config c = base_cfg;
        c.mesh.learners = v.learners;
        ms = calibrate_step_time_ms(c);
      }
      step_ms[v.learners] = ms;
    }
  for (std::size_t i = 0; i < variants.size(); ++i) {
    config& c = configs[i];
    c.mesh.step_time_ms = step_ms[variants[i].learners];
    // Quorum: the same wall time for every variant, ending just before the fast learners
    // would finish their schedule, so nobody idles at the end and goodput is the mesh's.
    if (o.which == "quorum" && !variants[i].whole_schedule)
      c.train.time_limit_s = 0.95 * static_cast<double>(c.train.steps) * c.mesh.step_time_ms * 1e-3;
  }

  const double load_before = load_average();
  const auto started = seconds_clock::now();
  std::vector<outcome> results(variants.size());
  const int runs = static_cast<int>(variants.size()) * o.seeds;
  int run = 0;
  for (int seed = 1; seed <= o.seeds; ++seed) {
    for (std::size_t i = 0; i < variants.size(); ++i) {
      if (stop_requested.load()) return fail(make_error(errc::internal, "interrupted"));
      ++run;
      const variant& v = variants[i];
      config c = configs[i];
      c.train.seed = base_cfg.train.seed + static_cast<std::uint64_t>(seed - 1);
      const std::string label = "bench ablate " + o.which + ": run " + std::to_string(run) + "/" +
                                std::to_string(runs) + " (" + (v.group.empty() ? "" : v.group + " ") + v.name +
                                ", seed " + std::to_string(c.train.seed) + ")";
      progress.update(label, true);
      auto s = run_local_mesh(
          c, [&](const std::string& line) { progress.update(label + ": " + line.substr(0, std::min<std::size_t>(line.size(), 80))); },
          [] { return stop_requested.load(); }, {}, nullptr, {}, mesh_eval{o.eval_period_s});
      if (!s) return fail(make_error(s.err().code, v.name + ": " + s.err().message));
      if (stop_requested.load()) return fail(make_error(errc::internal, "interrupted"));
      outcome& r = results[i];
      r.loss.push_back(s->eval_loss);
      r.bpb.push_back(s->eval_bpb);
      r.goodput.push_back(s->goodput);
      r.uptime.push_back(s->broker.uptime);
      r.bytes.push_back(static_cast<double>(s->bytes_on_wire));
      r.wall_s.push_back(s->wall_s);
      r.tokens.push_back(static_cast<double>(s->tokens));
      r.steps.push_back(static_cast<double>(s->steps));
      r.members.push_back(s->mean_members);
      r.late.push_back(static_cast<double>(s->broker.ledger.late));
      r.overruns.push_back(static_cast<double>(s->budget_overruns));
      r.step_time_ms = c.mesh.step_time_ms;
      r.ledger_exact = r.ledger_exact && s->ledger_exact;
      r.curves.emplace_back();
      for (const auto& [tokens, loss] : s->eval_curve) r.curves.back().emplace_back(static_cast<double>(tokens), loss);
    }
  }
  progress.finish();
  // Relative differences are paired by seed: the same seed's reference run.
  for (std::size_t i = 0; i < variants.size(); ++i) {
    for (std::size_t j = 0; j < variants.size(); ++j) {
      if (variants[j].group != variants[i].group) continue;
      for (int k = 0; k < o.seeds; ++k) {
        if (variants[j].reference) results[i].rel.push_back(100 * (results[i].loss[k] / results[j].loss[k] - 1));
        if (!second_reference.empty() && variants[j].name == second_reference)
          results[i].rel_second.push_back(100 * (results[i].loss[k] / results[j].loss[k] - 1));
      }
    }
  }
  const double total_s = since(started);
  const double load_after = load_average();

  // -- the table ----------------------------------------------------------------------------
  std::printf("bench ablate %s: model %s, batch %d, %d seed%s (%s), %u CPUs, load average %.2f before, %.2f after, "
              "%.0f s\n",
              o.which.c_str(), base_cfg.model.size.c_str(), base_cfg.data.batch, o.seeds, o.seeds == 1 ? "" : "s",
              o.seeds == 1 ? "one seed: no spread measured" : "mean ± half the range over seeds",
              std::thread::hardware_concurrency(), load_before, load_after, total_s);
  if (o.which == "quorum")
    std::printf("  learners %s paced (mesh.learner_slowdown); every variant runs the same wall time\n",
                heterogeneous_slowdown(variants.front().learners).c_str());
  std::string last_group = "?";
  bool all_exact = true;
  double overruns = 0, steps_total = 0;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const variant& v = variants[i];
    const outcome& r = results[i];
    if (v.group != last_group) {
      last_group = v.group;
      std::printf("  %s%d learners x %lld steps, %.0f ms per step (paced), %.2f M tokens per run\n",
                  v.group.empty() ? "" : (v.group + ": ").c_str(), v.learners, static_cast<long long>(v.steps),
                  r.step_time_ms, mean(r.tokens) * 1e-6);
      std::printf("  %-15s %-18s %-7s %-16s %-15s %-8s %-7s %-9s %-7s %s\n", "variant", "eval nats/byte", "bits/b",
                  "vs reference", second_reference.empty() ? "" : ("vs " + second_reference).c_str(), "goodput",
                  "uptime", "wire GB", "wall s", "paper");
    }
    all_exact = all_exact && r.ledger_exact;
    for (double x : r.overruns) overruns += x;
    for (double x : r.steps) steps_total += x;
    std::printf("  %-15s %-18s %-7.4f %-16s %-15s %-8s %-7s %-9.3f %-7.0f %s%s\n", v.name.c_str(),
                with_spread(r.loss, "%.4f").c_str(), mean(r.bpb),
                v.reference ? "reference" : signed_pct(r.rel).c_str(),
                second_reference.empty() ? "" : (v.name == second_reference ? "—" : signed_pct(r.rel_second).c_str()),
                (with_spread([&] { auto g = r.goodput; for (auto& x : g) x *= 100; return g; }(), "%.1f") + "%").c_str(),
                (std::to_string(static_cast<int>(std::lround(100 * mean(r.uptime)))) + "%").c_str(), mean(r.bytes) * 1e-9,
                mean(r.wall_s), v.paper.empty() ? "—" : v.paper.c_str(), r.ledger_exact ? "" : "  [ledger NOT exact]");
  }
  // What the paper claims, judged on our numbers (criteria stated beside each).
  auto find = [&](const std::string& group, const std::string& name) -> const outcome* {
    for (std::size_t i = 0; i < variants.size(); ++i)
      if (variants[i].group == group && variants[i].name == name) return &results[i];
    return nullptr;
  };
  std::vector<std::pair<std::string, bool>> claims;
  if (o.which == "merge") {
    for (int m : o.merge_learners) {
      const std::string g = "M=" + std::to_string(m);
      const outcome* rda = find(g, "rda");
      char text[160];
      std::snprintf(text, sizeof text, "RDA beats the weighted mean at %s: eval loss %+.2f %% vs mean", g.c_str(),
                    mean(rda->rel));
      claims.emplace_back(text, mean(rda->rel) < 0);
    }
  } else if (o.which == "encoding") {
    if (const outcome* int4 = find("", "int4"); int4 && !int4->rel_second.empty()) {
      char text[160];
      std::snprintf(text, sizeof text, "int4 ≈ bf16 (within 1 %%): %+.2f %% vs bf16", mean(int4->rel_second));
      claims.emplace_back(text, std::abs(mean(int4->rel_second)) <= 1);
    }
    if (const outcome* int2 = find("", "int2"); int2 && !int2->rel_second.empty()) {
      char text[160];
      std::snprintf(text, sizeof text, "2-bit breaks (worse than bf16 by more than 5 %%): %+.2f %% vs bf16",
                    mean(int2->rel_second));
      claims.emplace_back(text, mean(int2->rel_second) > 5);
    }
  } else if (o.which == "quorum") {
    const outcome* grace = find("", "K=1 + grace");
    const outcome* none = find("", "K=1, no grace");
    const outcome* all = find("", "K=M");
    const outcome* lock = find("", "K=M lock-step");
    const outcome* dp = find("", "dp");
    // dp-level quality: K=1 + grace's loss against dp's at the same tokens, seed by seed.
    std::vector<double> vs_dp;
    for (std::size_t k = 0; k < grace->curves.size() && k < dp->curves.size(); ++k)
      vs_dp.push_back(100 * (grace->loss[k] / loss_at(dp->curves[k], grace->tokens[k]) - 1));
    char text[200];
    std::snprintf(text, sizeof text, "K=1 + grace keeps goodput (>= 98 %%): %.1f %%", 100 * mean(grace->goodput));
    claims.emplace_back(text, mean(grace->goodput) >= 0.98);
    std::snprintf(text, sizeof text, "K=1 without grace loses quality (loss above K=1 + grace): %+.2f %%",
                  mean(none->rel));
    claims.emplace_back(text, mean(none->rel) > 0);
    std::snprintf(text, sizeof text, "K=M loses goodput (below K=1 + grace by > 1 point): %.1f %% vs %.1f %%",
                  100 * mean(all->goodput), 100 * mean(grace->goodput));
    claims.emplace_back(text, mean(all->goodput) < mean(grace->goodput) - 0.01);
    std::snprintf(text, sizeof text, "K=M lock-step loses goodput (below K=1 + grace by > 1 point): %.1f %%",
                  100 * mean(lock->goodput));
    claims.emplace_back(text, mean(lock->goodput) < mean(grace->goodput) - 0.01);
    std::snprintf(text, sizeof text,
                  "K=1 + grace at dp-level quality (loss within 2 %% of dp's at the same tokens): %+.2f %% vs dp",
                  mean(vs_dp));
    claims.emplace_back(text, std::abs(mean(vs_dp)) <= 2 || mean(vs_dp) < 0);
  }
  for (const auto& [text, held] : claims)
    std::printf("  paper: %s — %s\n", text.c_str(), held ? "reproduced" : "NOT reproduced");
  if (o.which == "fragments") std::printf("  paper: no figure for P in ALGORITHM.md §9\n");
  std::printf("  ledger exact in every run: %s; paced steps over budget: %.0f of %.0f (%.1f %%)\n",
              all_exact ? "yes" : "NO", overruns, steps_total, steps_total > 0 ? 100 * overruns / steps_total : 0.0);

  if (!o.plot.empty()) {
    if (auto ok = write_text_file("--plot", o.plot, ablation_plot(o.which, variants, results)); !ok) return report(ok.err());
    std::printf("plot: %s\n", o.plot.c_str());
  }
  if (o.json) {
    std::string list = "[";
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const variant& v = variants[i];
      const outcome& r = results[i];
      json_line one;
      one.add("name", v.name)
          .add("group", v.group)
          .add("reference", v.reference)
          .add("knobs", v.knobs)
          .add("paper", v.paper)
          .add("learners", v.learners)
          .add("steps", static_cast<std::int64_t>(v.steps))
          .add("step_time_ms", r.step_time_ms)
          .add("eval_loss", mean(r.loss))
          .add("eval_loss_spread", spread(r.loss))
          .add_raw("eval_loss_per_seed", json_array(r.loss))
          .add("eval_bpb", mean(r.bpb))
          .add("rel_pct", v.reference ? 0.0 : mean(r.rel))
          .add("rel_pct_spread", spread(r.rel))
          .add("goodput", mean(r.goodput))
          .add("uptime", mean(r.uptime))
          .add("bytes_on_wire", mean(r.bytes))
          .add("tokens", mean(r.tokens))
          .add("late_tokens", mean(r.late))
          .add("members_per_round", mean(r.members))
          .add("wall_s", mean(r.wall_s))
          .add("budget_overruns", mean(r.overruns))
          .add("ledger_exact", r.ledger_exact);
      if (!second_reference.empty()) one.add("rel_pct_vs_" + second_reference, mean(r.rel_second));
      list += (i ? "," : "") + one.str();
    }
    list += "]";
    std::string verdicts = "[";
    for (std::size_t i = 0; i < claims.size(); ++i)
      verdicts += (i ? "," : "") + json_line().add("claim", claims[i].first).add("reproduced", claims[i].second).str();
    verdicts += "]";
    json_line j;
    j.add("command", "bench ablate")
        .add("which", o.which)
        .add("model", base_cfg.model.size)
        .add("batch", base_cfg.data.batch)
        .add("seeds", o.seeds)
        .add("cpus", static_cast<int>(std::thread::hardware_concurrency()))
        .add("load_before", load_before)
        .add("load_after", load_after)
        .add("wall_s", total_s)
        .add("ledger_exact", all_exact)
        .add("budget_overruns", overruns)
        .add_raw("variants", list)
        .add_raw("claims", verdicts);
    std::printf("%s\n", j.str().c_str());
  }
  return all_exact ? exit_ok : exit_failure;
}

}  // namespace

void add_bench_ablate(CLI::App& bench) {
  ablate_options& o = options();
  CLI::App* cmd = o.command = bench.add_subcommand(
      "ablate", "The paper's ablations on the one-process mesh: merge, encoding, quorum or fragments");
  cmd->add_option("which", o.which, "merge (RDA vs mean), encoding (fp32..int2), quorum (K, grace), fragments (P)")
      ->required()
      ->check(CLI::IsMember({"merge", "encoding", "quorum", "fragments"}));
  cmd->add_option("--model", o.model, "Model (default nano)");
  cmd->add_option("--batch", o.batch, "Sequences per step (default 8)")->check(CLI::Range(1, 4096));
  cmd->add_option("--steps", o.steps,
                  "Inner steps per learner (default: merge 600 at the smallest M, the others 1000)")
      ->check(CLI::Range(std::int64_t{5}, std::int64_t{1000000}));
  cmd->add_option("--learners", o.learners, "M for encoding, quorum and fragments (default 4)")->check(CLI::Range(2, 64));
  cmd->add_option("--merge-learners", o.merge_learners, "The M of the merge ablation, comma-separated (default 8,16)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  cmd->add_option("--fragments", o.fragments, "The P of the fragments ablation, comma-separated (default 2,6,12,24)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--encodings", o.encodings, "The encodings compared, comma-separated (default fp32,bf16,int8,int4,int2)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "int4", "int2"}));
  cmd->add_option("--seeds", o.seeds, "Seeds per variant, train.seed, +1, ... (default 1)")->check(CLI::Range(1, 20));
  cmd->add_option("--step-time-ms", o.step_time_ms, "Paced compute budget per step (default: calibrated per M)")
      ->check(CLI::Range(0.0, 3.6e6));
  cmd->add_option("--eval-every-s", o.eval_period_s, "Seconds between evaluations of Θ during a run (default 10)")
      ->check(CLI::Range(0.2, 3600.0));
  cmd->add_option("--plot", o.plot, "Also draw eval loss against tokens per variant (first seed) as an SVG file");
  o.flags.add_to(*cmd);
  cmd->add_flag("--json", o.json, "Print a one-line JSON summary last");
}

int run_bench_ablate() {
  if (options().command == nullptr || !options().command->parsed()) return exit_bad_input;
  return run_ablate();
}

}  // namespace archipelago::cli
