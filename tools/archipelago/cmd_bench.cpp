// archipelago bench: the benchmarks' parent command, and `bench compute`: the
// learner engine's throughput against its other dense backends, the matched
// GEMM (Eigen, oneDNN), the CPU's fp32 and bf16 peaks and, with
// --against-torch, the PyTorch reference (tools/bench/compute_bench.hpp).

#include "cmd_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

/// The ratios to two decimals, rounded (0.899 is 0.90).
std::string per_round(const std::vector<double>& ratios) { return listed(ratios, "%.2f"); }

/// The PyTorch lines.
void print_torch(const compute_result& r) {
  for (const auto& run : r.torch) {
    if (run.ratio.empty()) continue;
    std::printf("  PyTorch  %-13s %.0f tokens/s median of %zu rounds (BLAS %s)\n"
                "           engine fp32 / PyTorch = %.2f (per round: %s)\n",
                run.label.c_str(), median(run.tokens_per_s), run.tokens_per_s.size(), run.blas.c_str(),
                median(run.ratio), per_round(run.ratio).c_str());
    if (!run.ratio_bf16.empty())
      std::printf("           engine bf16 / PyTorch = %.2f (per round: %s)\n", median(run.ratio_bf16),
                  per_round(run.ratio_bf16).c_str());
  }
}

double torch_ratio(const compute_result& r, const std::string& label, bool bf16) {
  for (const auto& run : r.torch)
    if (run.label == label) return median(bf16 ? run.ratio_bf16 : run.ratio);
  return std::nan("");
}

void print_json(const compute_flags& f, const compute_result& r) {
  const compute_options& o = f.bench;
  const backend_run* eigen = r.other(dense_backend::eigen);
  const backend_run* bf16 = r.other(dense_backend::bf16);
  json_line j;
  j.add("command", "bench compute")
      .add("model", o.model)
      .add("params", static_cast<std::int64_t>(r.params))
      .add("threads", o.threads)
      .add("batch", o.batch)
      .add("context", r.context)
      .add("march", ARCHIPELAGO_BUILD_MARCH)
      .add("simd", r.simd)
      .add("onednn_isa", r.onednn_isa)
      .add("attention_kernel", r.attention_kernel)
      .add("gelu_kernel", r.gelu_kernel)
      .add("rounds", r.rounds)
      .add("steps", static_cast<std::int64_t>(r.step_s.size()))
      .add("step_ms_median", r.step_median_s() * 1e3)
      .add("tokens_per_s", r.tokens_per_s())
      .add("gflops", r.gflops())
      .add("gemm_gflops", r.gemm_gflops())
      .add("sgemm_gflops", r.sgemm_gflops())
      .add("bf16_gemm_gflops", r.bf16_gemm_gflops())
      .add("ratio_vs_gemm", r.ratio_vs_gemm())
      .add("ratio_vs_best_sgemm", r.ratio_vs_best_sgemm())
      .add_raw("ratio_vs_best_sgemm_per_round", json_array(r.round_vs_best_sgemm))
      .add("eigen_tokens_per_s", r.backend_tokens_per_s(dense_backend::eigen))
      .add("ratio_vs_eigen_engine", eigen ? 1.0 / median(eigen->ratio) : std::nan(""))
      .add("bf16_tokens_per_s", r.backend_tokens_per_s(dense_backend::bf16))
      .add("bf16_gflops", r.backend_gflops(dense_backend::bf16))
      .add("bf16_vs_fp32", bf16 ? median(bf16->ratio) : std::nan(""))
      .add("fp32_peak_gflops", r.fp32_peak_gflops())
      .add("bf16_peak_gflops", r.bf16_peak_gflops())
      .add("share_of_fp32_peak", r.gflops() / r.fp32_peak_gflops())
      .add("bf16_share_of_bf16_peak", r.backend_gflops(dense_backend::bf16) / r.bf16_peak_gflops())
      .add("thread_efficiency", r.thread_efficiency())
      .add("adamw_ms_median", median(r.adamw_s) * 1e3)
      .add("muon_ms_median", median(r.muon_s) * 1e3)
      .add("newton_schulz_gflops", r.newton_schulz_gflops())
      .add("muon_tokens_per_s", r.muon_tokens_per_s())
      .add("muon_step_vs_adamw", median(r.round_muon_vs_adamw))
      .add_raw("muon_step_vs_adamw_per_round", json_array(r.round_muon_vs_adamw));
  if (o.against_torch) {
    for (const auto& run : r.torch) j.add("torch_" + run.label + "_tokens_per_s", median(run.tokens_per_s));
    j.add("ratio_vs_torch", torch_ratio(r, "tuned", false))
        .add("ratio_vs_torch_as_installed", torch_ratio(r, "as_installed", false))
        .add("ratio_vs_torch_bf16_autocast", torch_ratio(r, "bf16_autocast", false))
        .add("bf16_ratio_vs_torch", torch_ratio(r, "tuned", true))
        .add("bf16_ratio_vs_torch_bf16_autocast", torch_ratio(r, "bf16_autocast", true));
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
  std::printf("bench compute: model %s (%zu parameters), batch %d x %d tokens, %d threads, %d rounds, -march=%s "
              "(Eigen: %s; oneDNN: %s; attention: %s; GELU: %s)\n",
              o.model.c_str(), r->params, o.batch, r->context, o.threads, r->rounds, ARCHIPELAGO_BUILD_MARCH,
              r->simd.c_str(), r->onednn_isa.c_str(), r->attention_kernel.c_str(), r->gelu_kernel.c_str());
  std::printf("  engine   oneDNN fp32: step %.2f ms median (best %.2f) over %zu steps: %.0f tokens/s, %.1f GFLOP/s\n",
              r->step_median_s() * 1e3, r->step_best_s() * 1e3, r->step_s.size(), r->tokens_per_s(), r->gflops());
  for (const auto& run : r->others) {
    if (run.step_s.empty()) continue;
    std::printf("  engine   %-12s %.0f tokens/s, %.1f GFLOP/s; / oneDNN fp32 = %.2f (per round: %s)\n",
                run.backend == dense_backend::eigen ? "Eigen fp32:" : "oneDNN bf16:",
                r->backend_tokens_per_s(run.backend), r->backend_gflops(run.backend), median(run.ratio),
                per_round(run.ratio).c_str());
  }
  std::printf("  GEMM     [%ld x %ld] x [%ld x %ld]: Eigen %.1f GFLOP/s", r->gemm_n, r->gemm_k, r->gemm_k, r->gemm_m,
              r->gemm_gflops());
  if (!r->sgemm_s.empty()) std::printf(", oneDNN fp32 %.1f", r->sgemm_gflops());
  if (!r->bf16_gemm_s.empty()) std::printf(", oneDNN bf16 %.1f (inputs rounded on the way in)", r->bf16_gemm_gflops());
  std::printf("\n  ratio    engine / Eigen GEMM = %.2f; engine / best fp32 GEMM = %.2f (per round: %s)\n",
              r->ratio_vs_gemm(), r->ratio_vs_best_sgemm(), per_round(r->round_vs_best_sgemm).c_str());
  if (!r->peaks.empty()) {
    const auto best = std::max_element(r->peaks.begin(), r->peaks.end(), [](const cpu_peak& a, const cpu_peak& b) {
      return a.fp32_gflops() < b.fp32_gflops();
    });  // the round whose loop set the peak names its ISA
    std::printf("  peak     fp32 FMA %.1f GFLOP/s (%s)", r->fp32_peak_gflops(), best->fp32_isa.c_str());
    if (!std::isnan(r->bf16_peak_gflops()))
      std::printf(", bf16 dot product %.1f GFLOP/s (%s)", r->bf16_peak_gflops(), best->bf16_isa());
    std::printf(" on %d threads\n           engine fp32 = %.1f%% of the fp32 peak", o.threads,
                100 * r->gflops() / r->fp32_peak_gflops());
    if (r->other(dense_backend::bf16))
      std::printf(", engine bf16 = %.1f%% of the bf16 peak",
                  100 * r->backend_gflops(dense_backend::bf16) / r->bf16_peak_gflops());
    std::printf("\n");
  }
  std::printf("  optimizer AdamW %.2f ms, Muon %.2f ms per update (median; Newton-Schulz %.1f GFLOP/s on oneDNN); "
              "engine with Muon %.0f tokens/s, step / with AdamW = %.3f (per round: %s)\n",
              median(r->adamw_s) * 1e3, median(r->muon_s) * 1e3, r->newton_schulz_gflops(), r->muon_tokens_per_s(),
              median(r->round_muon_vs_adamw), listed(r->round_muon_vs_adamw, "%.3f").c_str());
  if (!r->one_thread_step_s.empty())
    std::printf("  threads  1 -> %d: %.2f efficiency (%.0f tokens/s on one thread)\n", o.threads,
                r->thread_efficiency(), static_cast<double>(r->tokens_per_step) / median(r->one_thread_step_s));
  if (o.profile) print_profile(*r);
  print_torch(*r);
  if (f.json) print_json(f, *r);
  return exit_ok;
}

}  // namespace

runner add_bench_command(CLI::App& app) {
  auto f = std::make_shared<compute_flags>();
  compute_options& o = f->bench;
  o.torch_script = shipped_file("tools/bench/torch_reference.py");
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks, each a ratio against a baseline measured in the same run");
  bench->require_subcommand(1);
  add_bench_wire(*bench);
  add_bench_snapshot(*bench);
  add_bench_wan(*bench);
  add_bench_ablate(*bench);
  add_bench_parity(*bench);
  CLI::App* compute = bench->add_subcommand(
      "compute", "Learner engine throughput vs its backends, matched GEMMs, the CPU's peaks (and PyTorch)");
  compute->add_option("--model", o.model, model_size_choices())->required();
  compute->add_option("--threads", o.threads, "Compute threads (default 2)");
  compute->add_option("--batch", o.batch, "Sequences per step (default 32)");
  compute->add_option("--steps", o.steps, "Timed steps (default: 40 nano, 15 micro, 6 mini, 2 small)");
  compute->add_option("--warmup", o.warmup, "Untimed warm-up steps (default 3)");
  compute->add_flag("--against-torch", o.against_torch, "Also run the PyTorch reference, as installed and tuned");
  compute->add_option("--rounds", o.rounds, "Interleaved rounds of every measurement (default 3)")
      ->check(CLI::Range(1, 100));
  compute->add_flag("!--no-backends", o.backends,
                    "Time only the engine (oneDNN fp32): not Eigen, bf16 nor the 1-thread run");
  compute->add_option("--peak-seconds", o.peak_s, "Seconds per CPU peak loop per round; 0 skips them (default 0.2)")
      ->check(CLI::Range(0.0, 10.0));
  compute->add_flag("--profile", o.profile, "Show where a step's time goes, phase by phase");
  compute->add_option("--python", o.python, "Python interpreter with torch (default /usr/bin/python3)");
  compute->add_option("--torch-script", o.torch_script, "Path of torch_reference.py");
  compute->add_option("--tuned-blas-dir", o.tuned_blas_dir, "The OpenMP OpenBLAS the tuned PyTorch runs on");
  compute->add_flag("--json", f->json, "Print a one-line JSON summary last");
  return [f, compute, bench](logger& log) {
    if (compute->parsed()) return run_compute(*f, log);
    if (bench->get_subcommand("snapshot")->parsed()) return run_bench_snapshot(log);
    if (bench->get_subcommand("wan")->parsed() || bench->get_subcommand("ddp")->parsed()) return run_bench_wan(log);
    if (bench->get_subcommand("ablate")->parsed()) return run_bench_ablate(log);
    if (bench->get_subcommand("parity")->parsed()) return run_bench_parity(log);
    return run_bench_wire(log);
  };
}

}  // namespace archipelago::cli
