#pragma once
// `simulate wan`: the paper's WAN claim (a 12B model over 2-5 Gbit/s) worked
// out on paper from our own costs. Pure: every figure is an argument.
//
// The setting: M learners, each at a site of its own with one WAN link to the
// synchronizer (full duplex, B bit/s each way, one-way latency L); a model of N
// parameters in P equal fragments; the mesh's pace, one round per learner step,
// so each fragment is synchronised every H = P steps; τ rounds in flight.
// A round's path, from the end of the step at which it opened:
//
//   after_step  the learner encodes its outer gradient of the fragment (part of
//               after_step, which every step pays: a tax, never hidden);
//   up          N/P × up bytes per parameter × wire ratio at B, then L
//               (the M learners send at once, each on its own link);
//   merge       the owning shard decodes and merges the M contributions and takes
//               the outer step: merge_s_per_gb × M × N/P × 4 bytes;
//   commit      durable before visible: the shard writes the version (Θ and the
//               outer momentum, 8 bytes per parameter): commit_s_per_gb × N/P × 8;
//   down        the new Θ_p to every learner: N/P × down bytes × wire ratio at B,
//               then L; the learner installs it between two steps.
//
// Hidden: the path fits in τ steps (the fragment is back before the learner
// needs it) and each link carries one fragment per step each way (utilisation at
// most 1; arrivals are periodic, so below 1 nothing queues). The bandwidth floor
// is the least B for which both hold. Conventional synchronisation (dp) beside
// it: every step every site exchanges the whole gradient in a bandwidth-optimal
// all-reduce (ring: 2(M−1)/M × N × dp bytes per parameter each way), not
// overlapped with the step; its speed-up figure is at equal tokens.

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace archipelago::wan {

/// The measured costs, each per GB (1e9 bytes) of what it handles.
struct costs {
  /// A shard: decode, merge and outer step, per GB of fp32 contributions merged
  /// (members × fragment parameters × 4 bytes).
  double merge_s_per_gb = 0;
  /// A shard: committing a version, per GB written (Θ and momentum, 8 bytes per
  /// fragment parameter).
  double commit_s_per_gb = 0;
  /// A learner: its after_step time per step, per GB of its model (parameters × 4
  /// bytes): encoding the due contribution and installing what arrived.
  double after_step_s_per_gb = 0;
  /// Bytes on the wire per round over the ideal (the encoded payloads): framing,
  /// envelopes, retransmissions. At least 1.
  double wire_ratio = 1;
};

/// What `simulate wan --measure` measures (tools/bench/kernel_costs.hpp), one
/// core each, and what the default costs are derived from.
struct kernel_figures {
  // Memory bandwidth: bytes copied per second (each read once, written once).
  double copy_gb_per_s = 0;
  double merge_s_per_gb = 0;    // decode + merge + outer step, per GB of fp32 contributions
  double encode_s_per_gb = 0;   // the contribution's encoding, per GB of fp32 input
  double install_s_per_gb = 0;  // a received fragment copied into the model, per GB
  double disk_s_per_gb = 0;     // a plain file write with fdatasync, per GB
};

/// The figures measured on the project machine and recorded with the command
/// that measured them (docs/benchmarks/results/2026-12-07-simulate-12b.md).
kernel_figures recorded_kernels();

/// The costs the kernels imply at P fragments: merge as measured; commit at
/// the disk's rate (a floor: the store writes at least the version's bytes);
/// after_step = encoding one fragment and installing one per step, per GB of
/// the model ((encode + install) / P); wire ratio = wire_framing_ratio.
costs costs_from(const kernel_figures& k, int fragments);

/// Bytes on a link per payload byte at MTU 1500: each 1448-byte TCP segment
/// carries 52 bytes of IPv4 and TCP headers (with timestamps) and 38 of
/// Ethernet framing (header, FCS, preamble, gap). The transport's own frames
/// add under 0.01 % at a fragment of megabytes.
inline constexpr double wire_framing_ratio = 1538.0 / 1448.0;

/// The fields of `bench scale --json` this reads, by name: the last line of the
/// file that is a JSON object holds them at its top level, or in its "sizes"
/// array (the entry with the most "params" is taken). A missing or non-numeric
/// field is an error naming it and the file.
inline constexpr const char* cost_fields[] = {"merge_s_per_gb", "commit_s_per_gb",
                                              "after_step_s_per_gb", "wire_ratio"};
expected<costs> read_costs_file(const std::string& path);

struct inputs {
  double params = 12e9;            // N
  int fragments = 24;              // P
  int tau = 2;                     // rounds in flight
  int learners = 4;                // M: sites, one learner each
  std::vector<double> gbit{2, 5};  // link bandwidths to evaluate, Gbit/s each way
  double latency_ms = 20;          // one way
  double step_s = 0;               // a learner's step; 0: from the reference below
  // The reference step: 6 × N × tokens FLOP on chips × chip_tflops (sustained).
  double tokens_per_step = 1 << 20;
  double chips = 256;
  double chip_tflops = 200;
  double up_bytes_per_param = 4;    // the contribution's encoding (wire.encoding): fp32
  double down_bytes_per_param = 4;  // the shards' broadcast of Θ_p: fp32
  double dp_bytes_per_param = 2;    // dp's gradient exchange: bf16
  costs c;
};

/// Every input in its range; the error names the first that is not.
status validate(const inputs& in);

/// The round's path at one link bandwidth.
struct link_result {
  double gbit = 0;
  double up_s = 0, down_s = 0;                      // transfer of one fragment each way at B
  double latency_s = 0;                             // 2 × L
  double merge_s = 0, commit_s = 0;                 // on the owning shard
  double path_s = 0;                                // up + merge + commit + down + 2L
  double budget_s = 0;                              // τ × step
  double slack_s = 0;                               // budget − path
  double utilisation_up = 0, utilisation_down = 0;  // link busy share per step, each way
  bool hidden = false;                              // path ≤ budget and both utilisations ≤ 1
  int fragments_needed = 0;  // the least P that hides at this B (0: none up to 1e6)
  /// Steps between two syncs of a fragment: P when hidden; when not, the link or the
  /// path paces the rounds and each fragment waits longer (the learners never wait).
  double sync_every_steps = 0;
  double dp_comm_s = 0;  // dp's all-reduce per step at B
  double dp_step_s = 0;  // compute + dp_comm: dp waits for its exchange
  // dp_step over the decoupled learner's step (compute + after_step), at equal tokens.
  double speedup = 0;
};

struct result {
  double step_s = 0;  // the learners' compute per step
  bool step_from_reference = false;
  double ref_flops = 0;  // 6 N tokens, when step_from_reference
  double fragment_params = 0;
  double up_bytes = 0, down_bytes = 0;  // one fragment on the wire, each way (wire ratio included)
  double merged_gb = 0, committed_gb = 0;
  double after_step_s = 0;          // per step, on the learner
  double period_s = 0;              // a learner's step with after_step: the rounds' pace
  double syncer_gbit_per_step = 0;  // what the shards' site receives: M × up bytes per step
  // The least B that hides every round (inf: none, the fixed part exceeds τ steps).
  double floor_gbit = 0;
  double floor_throughput_gbit = 0, floor_path_gbit = 0;  // the two bounds it is the larger of
  double fixed_path_s = 0;   // merge + commit + 2L: what no bandwidth shortens
  double dp_floor_gbit = 0;  // the B at which dp's exchange takes one step's compute
  double dp_bytes_per_step = 0;
  std::vector<link_result> links;
};

/// Requires validate(in).
result plan(const inputs& in);

/// The paper's claims the result is printed beside (the blog's figures).
inline constexpr const char* paper_claim =
    "Decoupled DiLoCo trained a 12B model across four regions over 2-5 Gbit/s links, more than 20x "
    "faster "
    "than conventional synchronization; cross-site bandwidth 0.84 Gbit/s where data-parallel "
    "needed 198 "
    "(eight datacenters)";
inline constexpr double paper_speedup = 20;
inline constexpr double paper_decoupled_gbit = 0.84, paper_dp_gbit = 198;

}  // namespace archipelago::wan
