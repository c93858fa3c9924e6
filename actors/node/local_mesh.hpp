#pragma once
// A whole mesh in one process over inproc:// — M learners, S shards, one
// broker — as `archipelago run` starts it.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "node/mesh_setup.hpp"

namespace archipelago {

struct mesh_summary {
  std::string mode;
  int learners = 0, shards = 0, fragments = 0;
  std::uint64_t steps = 0, tokens = 0;
  std::uint64_t rounds = 0, published = 0, bytes_on_wire = 0, refetches = 0;
  double mean_members = 0;
  double wall_s = 0;
  double eval_loss = 0, eval_bpb = 0, entropy_floor_bpb = 0;
  broker_report broker;     // ledger, uptime, timing figures
  double goodput = 0;       // merged learner step time / (M × the learners' span)
  double wait_share = 0;    // learner time spent waiting for fragments / (M × span)
  bool ledger_exact = false;  // buckets sum to the tokens processed, which equal the learners' count
  std::vector<float> global_params;  // Θ at the end, laid out like a learner's buffer
  /// The global model's eval loss during the run: (tokens, nats/byte).
  std::vector<std::pair<std::uint64_t, double>> eval_curve;
  // snapshots
  std::uint64_t resumed_from = 0;   // mesh version the run started from; 0: a fresh model
  std::int64_t start_step = 0;      // the learners' schedule started there
  double start_eval_loss = 0;       // the eval loss of that snapshot
  std::uint64_t mesh_version = 0;   // the last snapshot committed
  std::uint64_t committed = 0, snapshot_errors = 0;
};

/// Snapshots of a run (storage/): where they go and where the run starts from.
struct mesh_snapshots {
  std::string db;                   // keep snapshots in this directory; empty: none
  bool record_contributions = false;  // also record what every merge merged (replay verify)
  std::string resume_db;            // start from a snapshot of this store (may equal db)
  std::optional<std::uint64_t> resume_version;  // that mesh version; nullopt: the newest valid one
};

/// Called about twice a second with a one-line status.
using mesh_progress = std::function<void(const std::string&)>;

expected<mesh_summary> run_local_mesh(const config& cfg, const mesh_progress& progress,
                                      const std::function<bool()>& stop_requested,
                                      const mesh_snapshots& snapshots = {});

}  // namespace archipelago
