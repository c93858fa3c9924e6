#pragma once
// bench compute: the learner engine's throughput (forward + backward + AdamW)
// as tokens/s and GFLOP/s, against baselines measured in the same run, in
// interleaved rounds:
//   - the engine's other dense backends: Eigen (the engine before oneDNN) and
//     oneDNN bf16 where the CPU has native bf16;
//   - the model's largest matrix product, [N, C] x [C, 4C], through Eigen and
//     through oneDNN (fp32, and bf16 where native): the best single GEMM;
//   - the CPU's fp32 FMA and bf16 dot-product peaks (cpu_peak.hpp);
//   - the engine on one thread, for the 1 -> N thread efficiency;
//   - Muon (optimizer.kind = muon) in AdamW's place, timed on the engine's
//     gradients after each of its steps;
//   - optionally, the PyTorch reference of the same architecture
//     (tools/bench/torch_reference.py): tuned, as installed, and bf16 autocast.

#include <cstddef>
#include <string>
#include <vector>

#include "bench/bench_hooks.hpp"
#include "learner/model/cpu_peak.hpp"
#include "core/error.hpp"
#include "learner/model/gpt.hpp"

namespace archipelago {

struct compute_options {
  std::string model = "nano";
  int threads = 2;
  int batch = 32;
  int steps = 0;   // timed steps; 0 picks by model size (default_compute_steps)
  int warmup = 3;  // untimed steps (and GEMM samples) first
  bool against_torch = false;
  bool profile = false;  // time a step phase by phase (adds timer reads)
  int rounds = 3;        // rounds of (engine, PyTorch) with against_torch
  bool backends = true;  // also time the Eigen and bf16 backends and the 1-thread engine
  double peak_s = 0.2;   // seconds per peak loop per round; 0 skips the peaks
  std::string python = "/usr/bin/python3";
  std::string torch_script;  // torch_reference.py; needed with against_torch
  // The OpenMP OpenBLAS the tuned PyTorch runs on; needed with against_torch:
  // without OpenBLAS, Debian's PyTorch runs the reference BLAS, tens of times slower.
  std::string tuned_blas_dir = "/usr/lib/x86_64-linux-gnu/openblas-openmp";
};

/// Timed steps when compute_options::steps is 0: about as many seconds for every size.
int default_compute_steps(const std::string& model);

/// One PyTorch configuration, run once per round.
struct torch_run {
  std::string label;  // "tuned", "as_installed", "bf16_autocast"
  std::string env;    // `env` arguments
  std::string args;   // extra script arguments
  std::vector<double> tokens_per_s;  // per round
  std::vector<double> ratio;         // engine (fp32) / this, per round
  std::vector<double> ratio_bf16;    // engine (bf16) / this, per round; empty without native bf16
  std::string blas;
  std::string error;  // set when a run failed; the configuration is not run again
};

/// The PyTorch configurations: "tuned" (docs/design/baselines.md §1), "as_installed" and
/// "bf16_autocast" (tuned, with torch.autocast("cpu", bfloat16)).
std::vector<torch_run> torch_configurations(const compute_options& o);

/// The engine timed with one dense backend.
struct backend_run {
  dense_backend backend = dense_backend::fp32;
  std::vector<double> step_s;      // per timed step
  std::vector<double> round_tps;   // tokens/s per round (median step of the round)
  std::vector<double> ratio;       // this / the fp32 engine, per round
};

struct compute_result {
  std::string model;
  std::size_t params = 0;
  int context = 0;
  int threads = 0;
  std::size_t tokens_per_step = 0;  // batch x context
  std::string simd;  // Eigen's instruction sets
  std::string onednn_isa;  // what oneDNN dispatches to here
  std::string attention_kernel;  // the engine's (gpt::attention_kernel)
  std::string gelu_kernel;       // the engine's (gpt::gelu_kernel)
  std::vector<double> step_s, gemm_s;  // the engine (oneDNN fp32) and the Eigen GEMM, per timed sample
  std::vector<double> sgemm_s, bf16_gemm_s;  // the same GEMM through oneDNN fp32 / bf16 (empty: not native)
  std::vector<double> round_tps;  // the engine's tokens/s per round
  std::vector<double> round_vs_best_sgemm;  // the engine's GFLOP/s over the best fp32 GEMM's, per round
  double flops_per_step = 0;
  long gemm_n = 0, gemm_k = 0, gemm_m = 0;  // the matched GEMM: [n x k] x [k x m]
  double optimizer_s = 0;  // AdamW's share of the timed steps
  /// Per timed step of the engine: its AdamW update, and a Muon update
  /// (optimizer.kind = muon) on the same gradients, timed right after it.
  std::vector<double> adamw_s, muon_s;
  double muon_flops_per_step = 0;  // Newton–Schulz's FLOPs per Muon update
  /// Per round: the engine's step time with Muon in place of AdamW (the step's
  /// median, minus AdamW's median, plus Muon's) over its time with AdamW: Muon's cost.
  std::vector<double> round_muon_vs_adamw;
  step_profile profile;    // with compute_options::profile
  int rounds = 1;
  std::vector<backend_run> others;     // eigen, then bf16 where native (with compute_options::backends)
  std::vector<double> one_thread_step_s;  // the engine on one thread (threads > 1 and backends)
  std::vector<cpu_peak> peaks;         // per round
  std::vector<torch_run> torch;  // empty without against_torch

  double step_median_s() const;
  double step_best_s() const;
  double tokens_per_s() const;  // over the median step
  double gflops() const;
  double gflops_at(double tokens_per_s) const;  // the step's FLOPs at that rate
  double gemm_gflops() const;    // Eigen
  double sgemm_gflops() const;   // oneDNN fp32; NaN if not measured
  double bf16_gemm_gflops() const;  // oneDNN bf16; NaN if not measured
  /// The faster fp32 GEMM, over the samples from `first` on (a round's: its first sample).
  double best_sgemm_gflops(std::size_t first = 0) const;
  double ratio_vs_gemm() const;  // engine GFLOP/s over the Eigen GEMM's
  double ratio_vs_best_sgemm() const;
  const backend_run* other(dense_backend b) const;  // null if not timed
  double backend_tokens_per_s(dense_backend b) const;  // NaN if not timed
  double backend_gflops(dense_backend b) const;
  double fp32_peak_gflops() const;  // best over rounds; NaN if not measured
  double bf16_peak_gflops() const;  // NaN if not measured or not native
  /// tokens/s of the engine with Muon in place of AdamW (medians).
  double muon_tokens_per_s() const;
  /// Newton–Schulz's GFLOP/s over the median Muon update (its element-wise part included).
  double newton_schulz_gflops() const;
  /// tokens/s on `threads` threads over (threads x tokens/s on one); NaN if not measured.
  double thread_efficiency() const;
};

/// Measures the engine and its baselines in rounds; errors: a bad option
/// (invalid_input), a missing script (not_found), a stop before any sample
/// (internal). A failing PyTorch run is kept in its torch_run::error, not returned.
expected<compute_result> run_compute_bench(const compute_options& o, const bench_hooks& hooks);

}  // namespace archipelago
