// archipelago bench ablate WHICH: the paper's ablations on the one-process mesh,
// every variant against a reference run in the same invocation
// (tools/bench/ablate_bench.hpp); the table, the paper's claims judged, the plot.

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/ablate_bench.hpp"
#include "bench/bench_stats.hpp"
#include "cmd_bench.hpp"

namespace archipelago::cli {
namespace {

struct ablate_flags {
  ablate_options bench;
  std::string model = "nano";
  int batch = 8;
  bool json = false;
  std::string plot;  // an SVG of eval loss against tokens per variant (the first seed's runs)
  config_flags flags;
  CLI::App* command = nullptr;
};

ablate_flags& options() {
  static ablate_flags o;
  return o;
}

std::string with_spread(const std::vector<double>& v, const char* format) { return mean_pm(v, spread(v), format); }

std::string signed_pct(const std::vector<double>& v) {
  return v.empty() ? "—" : mean_pm(v, spread(v), "%+.2f", "%.2f") + " %";
}

void print_group_header(const ablate_variant& v, const ablate_outcome& r, const std::string& second_reference) {
  std::printf("  %s%d learners x %lld steps, %.0f ms per step (paced), %.2f M tokens per run\n",
              v.group.empty() ? "" : (v.group + ": ").c_str(), v.learners, static_cast<long long>(v.steps),
              r.step_time_ms, mean(r.tokens) * 1e-6);
  std::printf("  %-15s %-18s %-7s %-16s %-15s %-8s %-7s %-9s %-7s %s\n", "variant", "eval nats/byte", "bits/b",
              "vs reference", second_reference.empty() ? "" : ("vs " + second_reference).c_str(), "goodput", "uptime",
              "wire GB", "wall s", "paper");
}

void print_row(const ablate_variant& v, const ablate_outcome& r, const std::string& second_reference) {
  const std::vector<double> goodput_pct = scaled(r.goodput, 100);
  std::printf("  %-15s %-18s %-7.4f %-16s %-15s %-8s %-7s %-9.3f %-7.0f %s%s\n", v.name.c_str(),
              with_spread(r.loss, "%.4f").c_str(), mean(r.bpb), v.reference ? "reference" : signed_pct(r.rel).c_str(),
              second_reference.empty() ? "" : (v.name == second_reference ? "—" : signed_pct(r.rel_second).c_str()),
              (with_spread(goodput_pct, "%.1f") + "%").c_str(),
              (std::to_string(static_cast<int>(std::lround(100 * mean(r.uptime)))) + "%").c_str(),
              mean(r.bytes) * 1e-9, mean(r.wall_s), v.paper.empty() ? "—" : v.paper.c_str(),
              r.ledger_exact ? "" : "  [ledger NOT exact]");
}

void print_table(const ablate_flags& f, const config& base, const ablate_result& r) {
  const ablate_options& o = f.bench;
  const auto& variants = r.plan.variants;
  std::printf("bench ablate %s: model %s, batch %d, %d seed%s (%s), %u CPUs, load average %.2f before, %.2f after, "
              "%.0f s\n",
              o.which.c_str(), base.model.size.c_str(), base.data.batch, o.seeds, o.seeds == 1 ? "" : "s",
              o.seeds == 1 ? "one seed: no spread measured" : "mean ± half the range over seeds",
              std::thread::hardware_concurrency(), r.load_before, r.load_after, r.wall_s);
  if (o.which == "quorum")
    std::printf("  learners %s paced (mesh.learner_slowdown); every variant runs the same wall time\n",
                heterogeneous_slowdown(variants.front().learners).c_str());
  for (std::size_t i = 0; i < variants.size(); ++i) {
    if (i == 0 || variants[i].group != variants[i - 1].group)
      print_group_header(variants[i], r.outcomes[i], r.plan.second_reference);
    print_row(variants[i], r.outcomes[i], r.plan.second_reference);
  }
  for (const auto& c : r.claims)
    std::printf("  paper: %s — %s\n", c.text.c_str(), c.reproduced ? "reproduced" : "NOT reproduced");
  if (o.which == "fragments") std::printf("  paper: no figure for P in docs/design/algorithm.md §9\n");
  std::printf("  ledger exact in every run: %s; paced steps over budget: %.0f of %.0f (%.1f %%)\n",
              r.ledger_exact ? "yes" : "NO", r.budget_overruns, r.steps_total,
              r.steps_total > 0 ? 100 * r.budget_overruns / r.steps_total : 0.0);
}

std::string variant_json(const ablate_variant& v, const ablate_outcome& r, const std::string& second_reference) {
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
  return one.str();
}

void print_json(const ablate_flags& f, const config& base, const ablate_result& r) {
  std::string list = "[";
  for (std::size_t i = 0; i < r.plan.variants.size(); ++i)
    list += (i ? "," : "") + variant_json(r.plan.variants[i], r.outcomes[i], r.plan.second_reference);
  list += "]";
  std::string verdicts = "[";
  for (std::size_t i = 0; i < r.claims.size(); ++i)
    verdicts +=
        (i ? "," : "") + json_line().add("claim", r.claims[i].text).add("reproduced", r.claims[i].reproduced).str();
  verdicts += "]";
  json_line j;
  j.add("command", "bench ablate")
      .add("which", f.bench.which)
      .add("model", base.model.size)
      .add("batch", base.data.batch)
      .add("seeds", f.bench.seeds)
      .add("cpus", static_cast<int>(std::thread::hardware_concurrency()))
      .add("load_before", r.load_before)
      .add("load_after", r.load_after)
      .add("wall_s", r.wall_s)
      .add("ledger_exact", r.ledger_exact)
      .add("budget_overruns", r.budget_overruns)
      .add_raw("variants", list)
      .add_raw("claims", verdicts);
  std::printf("%s\n", j.str().c_str());
}

int run_ablate(logger& log) {
  const ablate_flags& f = options();
  install_stop_handlers();
  if (auto ok = check_output_path("--plot", f.plot); !ok) return report(ok.err());
  config defaults;
  defaults.model.size = f.model;
  defaults.data.batch = f.batch;
  auto base = f.flags.resolve(defaults);
  if (!base) return report(base.err());
  progress_line progress(log, 20);
  auto r = run_ablate_bench(f.bench, *base, progress_hooks(progress, log));
  progress.finish();
  if (!r) return report(r.err());
  print_table(f, *base, *r);
  if (!f.plot.empty()) {
    if (auto ok = write_text_file("--plot", f.plot, ablation_plot(f.bench.which, r->plan.variants, r->outcomes)); !ok)
      return report(ok.err());
    std::printf("plot: %s\n", f.plot.c_str());
  }
  if (f.json) print_json(f, *base, *r);
  return r->ledger_exact ? exit_ok : exit_failure;
}

}  // namespace

void add_bench_ablate(CLI::App& bench) {
  ablate_flags& f = options();
  ablate_options& o = f.bench;
  CLI::App* cmd = f.command = bench.add_subcommand(
      "ablate", "The paper's ablations on the one-process mesh: merge, encoding, quorum or fragments; and "
                "robust (mesh.robust's fault-free cost)");
  cmd->add_option("which", o.which,
                  "merge (RDA vs mean), encoding (fp32..int2), quorum (K, grace), fragments (P), robust (mesh.robust "
                  "off vs on)")
      ->required()
      ->check(CLI::IsMember({"merge", "encoding", "quorum", "fragments", "robust"}));
  cmd->add_option("--model", f.model, "Model (default nano)");
  cmd->add_option("--batch", f.batch, "Sequences per step (default 8)")->check(CLI::Range(1, 4096));
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
  cmd->add_option("--plot", f.plot, "Also draw eval loss against tokens per variant (first seed) as an SVG file");
  f.flags.add_to(*cmd);
  cmd->add_flag("--json", f.json, "Print a one-line JSON summary last");
}

int run_bench_ablate(logger& log) {
  if (options().command == nullptr || !options().command->parsed()) return exit_bad_input;
  return run_ablate(log);
}

}  // namespace archipelago::cli
