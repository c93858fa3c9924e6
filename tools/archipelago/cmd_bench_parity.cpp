// archipelago bench parity: every mode against dp at the same token budget, on
// several seeds and corpora (tools/bench/parity_bench.hpp); the table, the plot,
// the --json line.

#include <cmath>
#include <utility>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.hpp"
#include "bench/parity_bench.hpp"
#include "cmd_bench.hpp"

namespace archipelago::cli {
namespace {

struct parity_flags {
  parity_options bench;
  std::string model = "nano";
  bool json = false;
  std::string plot;
  std::vector<std::string> variants;
  std::vector<std::string> sweeps;
  sweep_options sweep;
  config_flags flags;
  CLI::App* command = nullptr;
};

parity_flags& options() {
  static parity_flags o;
  return o;
}

/// "mean ± half the 95 % CI" of the finite values (just the mean for one value; "—" for none).
std::string with_ci(const std::vector<double>& all, const char* format, const char* ci_format = nullptr) {
  const std::vector<double> v = finite(all);
  return mean_pm(v, ci95(v), format, ci_format);
}

/// The final loss against dp's, "+0.25 ± 0.10 %"; "@ 20.8 M tokens" added for an arm
/// whose budget is not dp's (a variant's own train.steps), whose final loss is then not at equal tokens.
std::string versus_dp(const parity_outcome& m, const parity_outcome& dp) {
  std::string out = with_ci(gap_pct(m, dp), "%+.2f", "%.2f") + " %";
  if (std::abs(mean(m.tokens) - mean(dp.tokens)) > 0.005 * mean(dp.tokens))
    out += fmt(" @ %.2f M", mean(m.tokens) * 1e-6);
  return out;
}

/// The tokens to dp's final loss: "11.2 M (1.03 ± 0.02)", and how many seeds never reached it.
std::string reach_text(const parity_outcome& m) {
  const std::vector<double> reached = finite(m.reach_tokens);
  const std::size_t missed = m.reach_tokens.size() - reached.size();
  std::string out;
  if (!reached.empty())
    out = fmt("%.2f M", mean(reached) * 1e-6) + " (" + with_ci(m.reach_ratio, "%.3f") + "x)";
  if (missed > 0) {
    std::vector<double> gaps;
    for (std::size_t s = 0; s < m.reach_tokens.size(); ++s)
      if (std::isnan(m.reach_tokens[s])) gaps.push_back(m.gap[s]);
    out += (out.empty() ? "" : "; ") + std::string("> budget in ") + std::to_string(missed) + "/" +
           std::to_string(m.reach_tokens.size()) + " (gap " + fmt("%+.4f", mean(gaps)) + ")";
  }
  return out;
}

void print_table(const parity_flags& f, const config& base, const parity_result& r) {
  const parity_options& o = f.bench;
  const parity_outcome& any = r.corpora.front().modes.front();
  std::printf("bench parity: model %s, %d learners, batch %d, %.2f M tokens per run, %d seed%s (mean ± 95 %% CI, "
              "Student's t), %u CPUs, load average %.2f before, %.2f after, %.0f s\n",
              base.model.size.c_str(), o.learners, base.data.batch, mean(any.tokens) * 1e-6, o.seeds,
              o.seeds == 1 ? "" : "s", std::thread::hardware_concurrency(), r.load_before, r.load_after, r.wall_s);
  for (const parity_corpus& c : r.corpora) {
    std::printf("  corpus %s", c.corpus.empty() ? "synthetic" : c.corpus.c_str());
    if (!std::isnan(c.entropy_floor_bpb)) std::printf(" (entropy floor %.4f bits/byte)", c.entropy_floor_bpb);
    std::printf("\n  %-22s %-20s %-28s %-44s %-18s %-8s %s\n", "mode", "eval nats/byte", "vs dp",
                "tokens to dp's final loss (x dp's)", "excess bits/byte", "goodput", "wall s");
    const parity_outcome& dp = c.modes.front();
    for (const parity_outcome& m : c.modes) {
      const std::vector<double> goodput_pct = scaled(m.goodput, 100);
      std::printf("  %-22s %-20s %-28s %-44s %-18s %-8s %.0f%s\n", m.mode.c_str(), with_ci(m.loss, "%.4f").c_str(),
                  &m == &dp ? "reference" : versus_dp(m, dp).c_str(),
                  reach_text(m).c_str(), with_ci(m.excess_bpb, "%.4f").c_str(),
                  (fmt("%.1f", mean(goodput_pct)) + "%").c_str(), mean(m.wall_s),
                  m.ledger_exact ? "" : "  [ledger NOT exact]");
    }
  }
}

std::string mode_json(const parity_outcome& m, const parity_outcome& dp) {
  const std::vector<double> rel = gap_pct(m, dp);
  const std::vector<double> reached = finite(m.reach_tokens);
  json_line j;
  j.add("mode", m.mode)
      .add("eval_loss", mean(m.loss))
      .add("eval_loss_ci95", ci95(m.loss))
      .add_raw("eval_loss_per_seed", json_array(m.loss))
      .add("eval_bpb", mean(m.bpb))
      .add("rel_pct", mean(rel))
      .add("rel_pct_ci95", ci95(rel))
      .add_raw("reach_tokens_per_seed", json_array(m.reach_tokens))
      .add("reach_ratio", mean(finite(m.reach_ratio)))
      .add("reach_ratio_ci95", ci95(m.reach_ratio))
      .add("seeds_reached", static_cast<std::int64_t>(reached.size()))
      .add("excess_bpb", mean(finite(m.excess_bpb)))
      .add("excess_bpb_ci95", ci95(m.excess_bpb))
      .add("tokens", mean(m.tokens))
      .add("goodput", mean(m.goodput))
      .add("wall_s", mean(m.wall_s))
      .add("ledger_exact", m.ledger_exact);
  return j.str();
}

/// Stage 1 of a sweep: every grid point against dp, per sweep best first, and
/// after stage 2 the best point of each sweep on the fresh seeds.
void print_sweep(const parity_flags& f, const sweep_result& r) {
  std::printf("bench parity --sweep, stage 1: %zu grid points on %d seed%s (train.seed +0...), ranked by the final loss "
              "vs dp (paired by seed, mean over seeds and corpora); load average %.2f before, %.2f after, %.0f s\n",
              r.points.size(), f.sweep.screen_seeds, f.sweep.screen_seeds == 1 ? "" : "s", r.screen.load_before,
              r.screen.load_after, r.screen.wall_s);
  std::printf("  %-28s %-12s %-16s %s\n", "arm", "vs dp", "eval nats/byte", "settings");
  for (const sweep_point& p : r.points) {
    std::string settings;
    for (const std::string& kv : p.arm.settings) settings += (settings.empty() ? "" : ",") + kv;
    std::printf("  %-28s %-12s %-16s %s%s\n", p.arm.label.c_str(), (fmt("%+.2f", p.rel_pct) + " %").c_str(),
                fmt("%.4f", p.eval_loss).c_str(), settings.c_str(), p.chosen ? "  -> stage 2" : "");
  }
  std::printf("bench parity --sweep, stage 2: the modes, the variants and each sweep's best %d on %d fresh seed%s\n",
              f.sweep.top, f.bench.seeds, f.bench.seeds == 1 ? "" : "s");
}

/// Per sweep, its best point in stage 2 (the lowest final loss vs dp); empty label: none ran.
std::vector<std::pair<std::string, const parity_outcome*>> best_per_sweep(const parity_flags& f, const sweep_result& r,
                                                                        const parity_corpus& c) {
  std::vector<std::pair<std::string, const parity_outcome*>> out;
  for (const parity_sweep& sweep : f.sweep.sweeps) {
    const parity_outcome* best = nullptr;
    double best_rel = INFINITY;
    for (const sweep_point& p : r.points) {
      if (p.sweep != sweep.label || !p.chosen) continue;
      for (const parity_outcome& m : c.modes)
        if (m.mode == p.arm.label) {
          const double rel = mean(gap_pct(m, c.modes.front()));
          if (rel < best_rel) best_rel = rel, best = &m;
        }
    }
    out.emplace_back(sweep.label, best);
  }
  return out;
}

void print_json(const parity_flags& f, const config& base, const parity_result& r,
                const sweep_result* sweep = nullptr) {
  std::string corpora = "[";
  for (std::size_t i = 0; i < r.corpora.size(); ++i) {
    const parity_corpus& c = r.corpora[i];
    std::string modes = "[";
    for (std::size_t k = 0; k < c.modes.size(); ++k) modes += (k ? "," : "") + mode_json(c.modes[k], c.modes.front());
    json_line one;
    one.add("corpus", c.corpus.empty() ? "synthetic" : c.corpus)
        .add("entropy_floor_bpb", c.entropy_floor_bpb)
        .add_raw("modes", modes + "]");
    corpora += (i ? "," : "") + one.str();
  }
  json_line j;
  j.add("command", "bench parity")
      .add("model", base.model.size)
      .add("learners", f.bench.learners)
      .add("batch", base.data.batch)
      .add("seeds", f.bench.seeds)
      .add("cpus", static_cast<int>(std::thread::hardware_concurrency()))
      .add("load_before", r.load_before)
      .add("load_after", r.load_after)
      .add("wall_s", r.wall_s)
      .add("ledger_exact", r.ledger_exact)
      .add_raw("corpora", corpora + "]");
  if (sweep) {
    std::string points = "[";
    for (std::size_t i = 0; i < sweep->points.size(); ++i) {
      const sweep_point& p = sweep->points[i];
      std::string settings;
      for (const std::string& kv : p.arm.settings) settings += (settings.empty() ? "" : ",") + kv;
      json_line one;
      one.add("sweep", p.sweep)
          .add("label", p.arm.label)
          .add("mode", p.arm.mode)
          .add("settings", settings)
          .add("screen_rel_pct", p.rel_pct)
          .add("screen_eval_loss", p.eval_loss)
          .add("chosen", p.chosen);
      points += (i ? "," : "") + one.str();
    }
    std::string best = "[";
    for (const parity_corpus& c : r.corpora)
      for (const auto& [label, m] : best_per_sweep(f, *sweep, c)) {
        json_line one;
        one.add("corpus", c.corpus.empty() ? "synthetic" : c.corpus).add("sweep", label).add("best", m ? m->mode : "");
        best += (best.size() > 1 ? "," : "") + one.str();
      }
    j.add("screen_seeds", f.sweep.screen_seeds)
        .add("screen_wall_s", sweep->screen.wall_s)
        .add("screen_load_before", sweep->screen.load_before)
        .add("screen_load_after", sweep->screen.load_after)
        .add("screen_ledger_exact", sweep->screen.ledger_exact)
        .add_raw("sweep", points + "]")
        .add_raw("best", best + "]");
  }
  std::printf("%s\n", j.str().c_str());
}

int run_parity(logger& log) {
  parity_flags& f = options();
  install_stop_handlers();
  if (auto ok = check_output_path("--plot", f.plot); !ok) return report(ok.err());
  f.bench.variants.clear();
  for (const std::string& spec : f.variants) {
    auto v = parse_parity_variant(spec);
    if (!v) return report(v.err());
    f.bench.variants.push_back(*v);
  }
  config defaults;
  defaults.model.size = f.model;
  auto base = f.flags.resolve(defaults);
  if (!base) return report(base.err());
  f.sweep.sweeps.clear();
  for (const std::string& spec : f.sweeps) {
    auto s = parse_parity_sweep(spec);
    if (!s) return report(s.err());
    f.sweep.sweeps.push_back(*s);
  }
  if (auto ok = check_parity(f.bench, *base); !ok) return report(ok.err());
  progress_line progress(log, 20);
  if (!f.sweep.sweeps.empty()) {
    auto s = run_parity_sweep(f.bench, f.sweep, *base, progress_hooks(progress, log));
    progress.finish();
    if (!s) return report(s.err());
    print_sweep(f, *s);
    print_table(f, *base, s->final);
    for (const parity_corpus& c : s->final.corpora)
      for (const auto& [label, m] : best_per_sweep(f, *s, c))
        std::printf("  best of sweep %s on %s: %s\n", label.c_str(), c.corpus.empty() ? "synthetic" : c.corpus.c_str(),
                    m ? (m->mode + ", " + versus_dp(*m, c.modes.front()) + " vs dp").c_str() : "none ran");
    if (!f.plot.empty()) {
      if (auto ok = write_text_file("--plot", f.plot, parity_plot(s->final)); !ok) return report(ok.err());
      std::printf("plot: %s\n", f.plot.c_str());
    }
    if (f.json) print_json(f, *base, s->final, &*s);
    return s->final.ledger_exact && s->screen.ledger_exact ? exit_ok : exit_failure;
  }
  auto r = run_parity_bench(f.bench, *base, progress_hooks(progress, log));
  progress.finish();
  if (!r) return report(r.err());
  print_table(f, *base, *r);
  if (!f.plot.empty()) {
    if (auto ok = write_text_file("--plot", f.plot, parity_plot(*r)); !ok) return report(ok.err());
    std::printf("plot: %s\n", f.plot.c_str());
  }
  if (f.json) print_json(f, *base, *r);
  return r->ledger_exact ? exit_ok : exit_failure;
}

}  // namespace

void add_bench_parity(CLI::App& bench) {
  parity_flags& f = options();
  parity_options& o = f.bench;
  CLI::App* cmd = f.command = bench.add_subcommand(
      "parity", "Every mode against dp at the same token budget, over seeds and corpora: loss, tokens to dp's loss");
  cmd->add_option("--modes", o.modes, "Modes compared, dp first (default dp,diloco,streaming,decoupled)")
      ->delimiter(',')
      ->check(CLI::IsMember({"dp", "diloco", "streaming", "decoupled"}));
  cmd->add_option("--variant", f.variants,
                  "A mode with settings of its own, run beside the modes: LABEL=MODE,KEY=VALUE,... "
                  "(e.g. rebase=decoupled,mesh.rebase=true; a train.steps here overrides --steps, e.g. a 5 % longer "
                  "budget to measure tokens to dp's loss past dp's own); repeat for several");
  cmd->add_option("--sweep", f.sweeps,
                  "A grid of settings for a mode, LABEL=MODE,KEY=V1|V2|...,... (every combination is an arm; a "
                  "data.batch axis scales train.steps to keep the tokens equal); repeat for several. Staged: every "
                  "point on --sweep-seeds seeds, then each sweep's best --sweep-top beside the modes on --seeds fresh seeds");
  cmd->add_option("--sweep-top", f.sweep.top, "--sweep: points per sweep carried to stage 2 (default 2)")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--sweep-seeds", f.sweep.screen_seeds, "--sweep: seeds of stage 1, the screen (default 1)")
      ->check(CLI::Range(1, 20));
  cmd->add_option("--corpus", o.corpora,
                  "A text file to train on; repeat for several (default: the synthetic corpus; 'synthetic' names it)")
      ->transform([](std::string s) { return s == "synthetic" ? std::string() : s; });
  cmd->add_option("--model", f.model, "Model (default nano)");
  cmd->add_option("--learners", o.learners, "M (default 4)")->check(CLI::Range(1, 64));
  cmd->add_option("--seeds", o.seeds, "Seeds per mode, train.seed, +1, ... (default 3)")->check(CLI::Range(1, 20));
  cmd->add_option("--steps", o.steps, "Inner steps per learner (default: train.steps, the model's budget)")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{10000000}));
  cmd->add_option("--eval-every-s", o.eval_period_s, "Seconds between evaluations of Θ during a run (default 10)")
      ->check(CLI::Range(0.2, 3600.0));
  cmd->add_option("--plot", f.plot, "Also draw eval loss against tokens per mode (a band over seeds) as an SVG file");
  f.flags.add_to(*cmd);
  cmd->add_flag("--json", f.json, "Print a one-line JSON summary last");
}

int run_bench_parity(logger& log) {
  if (options().command == nullptr || !options().command->parsed()) return exit_bad_input;
  return run_parity(log);
}

}  // namespace archipelago::cli
