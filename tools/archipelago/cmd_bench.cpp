// archipelago bench: the benchmarks' parent command, and `bench compute`: the
// learner engine's throughput against a matched Eigen GEMM and, with
// --against-torch, the PyTorch reference (tools/bench/compute_bench.hpp).

#include "cmd_bench.hpp"

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "bench/bench_stats.hpp"
#include "bench/compute_bench.hpp"
#include "commands.hpp"

namespace archipelago::cli {
namespace {

struct compute_flags {
  compute_options bench;
  bool json = false;
};

void print_profile(const compute_result& r) {
  double total = 0;
  for (double x : r.step_s) total += x;
  const auto n = static_cast<double>(r.step_s.size());
  std::printf("  profile  (share of %.2f ms per step; profiling adds timer reads)\n", total / n * 1e3);
  auto row = [&](const char* name, double seconds) {
    std::printf("    %-12s %8.2f ms  %5.1f%%\n", name, seconds / n * 1e3, 100 * seconds / total);
  };
  double covered = r.optimizer_s;
  for (int p = 0; p < step_profile::phase_count; ++p) {
    row(step_profile::name(p), r.profile.seconds[p]);
    covered += r.profile.seconds[p];
  }
  row("AdamW", r.optimizer_s);
  row("other", total - covered);
}

/// The PyTorch lines; the tuned and as-installed ratios for the JSON.
std::pair<double, double> print_torch(const compute_result& r) {
  double ratio_torch = std::nan(""), ratio_installed = std::nan("");
  for (const auto& run : r.torch) {
    if (run.ratio.empty()) continue;
    const double ratio = median(run.ratio);
    std::string per_round;
    for (double x : run.ratio) per_round += (per_round.empty() ? "" : " ") + std::to_string(x).substr(0, 4);
    std::printf("  PyTorch  %-12s %.0f tokens/s median of %zu rounds (BLAS %s)\n"
                "           engine / PyTorch = %.2f (per round: %s)\n",
                run.label.c_str(), median(run.tokens_per_s), run.tokens_per_s.size(), run.blas.c_str(), ratio,
                per_round.c_str());
    if (run.label == "tuned") ratio_torch = ratio;
    else ratio_installed = ratio;
  }
  return {ratio_torch, ratio_installed};
}

void print_json(const compute_flags& f, const compute_result& r, std::pair<double, double> torch_ratios) {
  const compute_options& o = f.bench;
  json_line j;
  j.add("command", "bench compute")
      .add("model", o.model)
      .add("params", static_cast<std::int64_t>(r.params))
      .add("threads", o.threads)
      .add("batch", o.batch)
      .add("context", r.context)
      .add("march", ARCHIPELAGO_BUILD_MARCH)
      .add("simd", r.simd)
      .add("steps", static_cast<std::int64_t>(r.step_s.size()))
      .add("step_ms_median", r.step_median_s() * 1e3)
      .add("tokens_per_s", r.tokens_per_s())
      .add("gflops", r.gflops())
      .add("gemm_gflops", r.gemm_gflops())
      .add("ratio_vs_gemm", r.ratio_vs_gemm());
  if (o.against_torch) {
    for (const auto& run : r.torch) j.add("torch_" + run.label + "_tokens_per_s", median(run.tokens_per_s));
    j.add("rounds", r.rounds);
    j.add("ratio_vs_torch", torch_ratios.first).add("ratio_vs_torch_as_installed", torch_ratios.second);
  }
  std::printf("%s\n", j.str().c_str());
}

int run_compute(const compute_flags& f, logger& log) {
  const compute_options& o = f.bench;
  install_stop_handlers();
  progress_line progress(log);
  auto r = run_compute_bench(o, progress_hooks(progress, log));
  progress.finish();
  if (!r) return report(r.err());
  for (const auto& run : r->torch)
    if (!run.error.empty()) log.warn("bench.torch", "archipelago: %s", run.error.c_str());
  std::printf("bench compute: model %s (%zu parameters), batch %d x %d tokens, %d threads, -march=%s (Eigen: %s)\n",
              o.model.c_str(), r->params, o.batch, r->context, o.threads, ARCHIPELAGO_BUILD_MARCH, r->simd.c_str());
  std::printf("  engine   step %.2f ms median (best %.2f) over %zu steps: %.0f tokens/s, %.1f GFLOP/s\n",
              r->step_median_s() * 1e3, r->step_best_s() * 1e3, r->step_s.size(), r->tokens_per_s(), r->gflops());
  std::printf("  GEMM     [%ld x %ld] x [%ld x %ld] %.3f ms median: %.1f GFLOP/s\n", r->gemm_n, r->gemm_k, r->gemm_k,
              r->gemm_m, r->gemm_median_s() * 1e3, r->gemm_gflops());
  std::printf("  ratio    engine / matched GEMM = %.2f\n", r->ratio_vs_gemm());
  if (o.profile) print_profile(*r);
  const auto torch_ratios = print_torch(*r);
  if (f.json) print_json(f, *r, torch_ratios);
  return exit_ok;
}

}  // namespace

runner add_bench_command(CLI::App& app) {
  auto f = std::make_shared<compute_flags>();
  compute_options& o = f->bench;
  o.torch_script = ARCHIPELAGO_SOURCE_DIR "/tools/bench/torch_reference.py";
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks, each a ratio against a baseline measured in the same run");
  bench->require_subcommand(1);
  add_bench_wire(*bench);
  add_bench_snapshot(*bench);
  add_bench_wan(*bench);
  add_bench_ablate(*bench);
  CLI::App* compute = bench->add_subcommand("compute", "Learner engine throughput vs a matched GEMM (and PyTorch)");
  compute->add_option("--model", o.model, "nano, micro or mini")->required();
  compute->add_option("--threads", o.threads, "Compute threads (default 2)");
  compute->add_option("--batch", o.batch, "Sequences per step (default 32)");
  compute->add_option("--steps", o.steps, "Timed steps (default: 40 nano, 15 micro, 6 mini)");
  compute->add_option("--warmup", o.warmup, "Untimed warm-up steps (default 3)");
  compute->add_flag("--against-torch", o.against_torch, "Also run the PyTorch reference, as installed and tuned");
  compute->add_option("--rounds", o.rounds, "Rounds of (engine, PyTorch) with --against-torch (default 3)")
      ->check(CLI::Range(1, 100));
  compute->add_flag("--profile", o.profile, "Show where a step's time goes, phase by phase");
  compute->add_option("--python", o.python, "Python interpreter with torch (default /usr/bin/python3)");
  compute->add_option("--torch-script", o.torch_script, "Path of torch_reference.py");
  compute->add_flag("--json", f->json, "Print a one-line JSON summary last");
  return [f, compute, bench](logger& log) {
    if (compute->parsed()) return run_compute(*f, log);
    if (bench->get_subcommand("snapshot")->parsed()) return run_bench_snapshot(log);
    if (bench->get_subcommand("wan")->parsed() || bench->get_subcommand("ddp")->parsed()) return run_bench_wan(log);
    if (bench->get_subcommand("ablate")->parsed()) return run_bench_ablate(log);
    return run_bench_wire(log);
  };
}

}  // namespace archipelago::cli
