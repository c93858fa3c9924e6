#pragma once
// The per-GB costs of a round's kernels on this machine, for `simulate wan
// --measure`: the memory bandwidth, the shard's decode + merge + outer step,
// the learner's encode and install, and the disk's write with fdatasync, each
// on one core, each the median of its rounds, measured in one run so their
// ratios to the memory bandwidth compare like with like. Kernels alone: no
// sockets, no actor, no store (bench scale measures the real mesh).

#include <string>

#include "core/error.hpp"

namespace archipelago {

struct kernel_cost_options {
  std::string encoding = "fp32";  // the contributions' (wire.encoding)
  int block_size = 64;
  int members = 4;           // contributions per merge
  double fragment_mib = 32;  // per contribution: well beyond the caches
  int rounds = 5;
  std::string disk_dir = ".";  // where the fdatasync'd write goes (a file removed after)
};

/// Each the median of its rounds; `simulate wan` derives its costs from them
/// (wan::kernel_figures, the same fields).
struct kernel_costs_result {
  // Memory bandwidth: GB copied per second (each byte read once, written once).
  double copy_gb_per_s = 0;
  double merge_s_per_gb = 0;    // decode + merge + outer step, per GB of fp32 contributions
  double encode_s_per_gb = 0;   // the contribution's encoding, per GB of fp32 input
  double install_s_per_gb = 0;  // a received fragment copied into the model: the copy, per GB
  double disk_s_per_gb = 0;     // Θ and momentum written to a file and fdatasync'd, per GB
  double merge_vs_copy = 0;     // the merge's GB per second over the copy's
  double load_before = 0, load_after = 0;
};

expected<kernel_costs_result> measure_kernel_costs(const kernel_cost_options& o);

}  // namespace archipelago
