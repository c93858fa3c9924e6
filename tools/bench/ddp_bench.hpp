#pragma once
// bench ddp: our dp (2 learners, unshaped) against PyTorch DDP over gloo
// (tools/bench/ddp_reference.py, the same model and global batch), in
// interleaved rounds, each ratio taken within a round: step time and bytes per step.

#include <string>
#include <vector>

#include "bench/bench_hooks.hpp"
#include "core/config.hpp"
#include "core/error.hpp"

namespace archipelago {

struct ddp_options {
  std::string model = "nano";
  int ranks = 2;    // our learners, and DDP's ranks
  int batch = 32;   // per learner/rank
  int steps = 100;  // timed, per side and round
  int warmup = 5;   // untimed steps first
  int rounds = 3;
  std::string python = "/usr/bin/python3";
  std::string script;  // ddp_reference.py
  // The BLAS the DDP reference loads (no LD_LIBRARY_PATH: Debian's alternative); must be OpenBLAS.
  std::string blas_library = "/usr/lib/x86_64-linux-gnu/libblas.so.3";
};

struct ddp_result {
  std::vector<double> ours_ms, torch_ms, torch_median_ms, ratio;  // per round; ratio: ours / DDP's
  std::vector<double> ours_bytes, torch_bytes;                     // bytes sent per step, per round
  double torch_ring = 0;  // what a ring all-reduce sends per step, all ranks
  std::string blas;       // DDP's
};

/// Our dp's configuration for the options: dp, one compute thread per learner,
/// long enough for the warm-up and the timed steps.
config ddp_mesh_config(const ddp_options& o);

/// Rounds of (ours, DDP), the order alternating round by round.
expected<ddp_result> run_ddp_bench(const ddp_options& o, const bench_hooks& hooks);

}  // namespace archipelago
