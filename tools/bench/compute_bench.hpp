#pragma once
// bench compute: the learner engine's throughput (forward + backward + AdamW)
// as tokens/s and GFLOP/s, against baselines measured in the same run: a plain
// Eigen GEMM of the model's largest matrix shape (this machine's practical
// peak) and, optionally, the PyTorch reference of the same architecture
// (tools/bench/torch_reference.py) as installed and tuned.

#include <cstddef>
#include <string>
#include <vector>

#include "bench/bench_hooks.hpp"
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
  std::string python = "/usr/bin/python3";
  std::string torch_script;  // torch_reference.py; needed with against_torch
};

/// Timed steps when compute_options::steps is 0: about as many seconds for every size.
int default_compute_steps(const std::string& model);

/// One PyTorch configuration, run once per round.
struct torch_run {
  std::string label;  // "tuned", "as_installed"
  std::string env;    // `env` arguments
  std::string args;   // extra script arguments
  std::vector<double> tokens_per_s;  // per round
  std::vector<double> ratio;         // engine / this, per round
  std::string blas;
  std::string error;  // set when a run failed; the configuration is not run again
};

/// The two PyTorch configurations: "tuned" (MACHINE.md §6) and "as_installed".
std::vector<torch_run> torch_configurations();

struct compute_result {
  std::string model;
  std::size_t params = 0;
  int context = 0;
  std::size_t tokens_per_step = 0;  // batch x context
  std::string simd;  // Eigen's instruction sets
  std::vector<double> step_s, gemm_s;  // per timed sample
  double flops_per_step = 0;
  long gemm_n = 0, gemm_k = 0, gemm_m = 0;  // the matched GEMM: [n x k] x [k x m]
  double optimizer_s = 0;  // AdamW's share of the timed steps
  step_profile profile;    // with compute_options::profile
  int rounds = 1;
  std::vector<torch_run> torch;  // empty without against_torch

  double step_median_s() const;
  double step_best_s() const;
  double gemm_median_s() const;
  double tokens_per_s() const;  // over the median step
  double gflops() const;
  double gemm_gflops() const;
  double ratio_vs_gemm() const;  // engine GFLOP/s over the GEMM's
};

/// Measures the engine, the matched GEMM and (optionally) PyTorch, in rounds;
/// errors: a bad option (invalid_input), a missing script (not_found), a stop
/// before any sample (internal). A failing PyTorch run is kept in its
/// torch_run::error, not returned.
expected<compute_result> run_compute_bench(const compute_options& o, const bench_hooks& hooks);

}  // namespace archipelago
