#pragma once
// A whole mesh in one process over inproc:// — M learners, S shards, one
// broker (a drill's: and its standbys) — as `archipelago run` starts it.

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chaos_monkey/chaos_wire.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "node/metrics_server.hpp"

namespace archipelago {

/// The mesh every half second of a run (not a drill, which samples on its own).
struct run_sample {
  double t_s = 0;  // since the learners started
  std::uint64_t tokens = 0, rounds = 0;
  double merged_step_time_s = 0;  // the broker's ledger, as of its last report
  double uptime = 1;              // the broker's, so far
  std::vector<std::uint64_t> learner_steps;
};

struct mesh_summary {
  std::string mode;
  int learners = 0, shards = 0, fragments = 0;
  std::uint64_t steps = 0, tokens = 0;
  std::uint64_t rounds = 0, published = 0, bytes_on_wire = 0, refetches = 0;
  double mean_members = 0;
  double wall_s = 0;
  double eval_loss = 0, eval_bpb = 0, entropy_floor_bpb = 0;
  broker_report broker;     // ledger, uptime, timing figures: the leading broker's (the last to lead)
  std::vector<std::uint64_t> broker_step_downs;  // per broker (the primary, then standbys): times it stepped down
  double goodput = 0;       // merged learner step time / (M × the learners' span)
  double wait_share = 0;    // learner time spent waiting for fragments / (M × span)
  bool ledger_exact = false;  // buckets sum to the tokens processed, which equal the learners' count
  double span_s = 0;          // the learners' span: the first Join to the last Leave (or the stop)
  /// mesh.warm_start: the steps per learner and the tokens the dp phase ran (0: none).
  std::uint64_t warm_start_steps = 0, warm_start_tokens = 0;
  std::vector<float> global_params;  // Θ at the end, laid out like a learner's buffer
  /// The global model's eval loss during the run: (tokens, nats/byte).
  std::vector<std::pair<std::uint64_t, double>> eval_curve;
  std::vector<double> eval_times_s;  // when each point of eval_curve was taken (seconds since the start)
  double target_reached_s = -1;      // mesh_eval::target_loss: the time of the evaluation that reached it; -1: never
  std::vector<run_sample> timeline;  // a run's (empty in a drill)
  // snapshots
  std::uint64_t resumed_from = 0;   // mesh version the run started from; 0: a fresh model
  std::int64_t start_step = 0;      // the learners' schedule started there
  double start_eval_loss = 0;       // the eval loss of that snapshot
  std::uint64_t mesh_version = 0;   // the last snapshot committed
  std::uint64_t committed = 0, snapshot_errors = 0;
  std::uint64_t budget_overruns = 0;  // steps whose compute exceeded mesh.step_time_ms
  /// Every node's refusals by reason, over all incarnations (node_counters::refused).
  std::map<std::string, std::uint64_t> refused;
};

/// Snapshots of a run (storage/): where they go and where the run starts from.
struct mesh_snapshots {
  std::string db;                   // keep snapshots in this directory; empty: none
  bool record_contributions = false;  // also record what every merge merged (replay verify)
  std::string resume_db;            // start from a snapshot of this store (may equal db)
  std::optional<std::uint64_t> resume_version;  // that mesh version; nullopt: the newest valid one
  /// Brokers with a store of their own, the primary's first, as `node --role broker
  /// --db` each; every one after the first is a standby (broker 1, 2, ...) that takes
  /// over when the primary is lost. Empty: one broker, writing to `db`. At most max_brokers.
  std::vector<std::string> broker_dbs;
};

/// Called about twice a second with a one-line status.
using mesh_progress = std::function<void(const std::string&)>;

/// A fault drill on the one-process mesh: the chaos monkey walks the timeline;
/// a crash kills the actor (the transport closes, nothing more is sent) and a
/// restart starts a new incarnation of it — a shard from its snapshots, a
/// learner at the mesh's schedule step; a pause freezes a learner and its wire;
/// a broker's lost host kills it and removes its store (mesh_snapshots::broker_dbs).
/// Needs snapshots (mesh_snapshots::db): its disk can be made to fail.
struct mesh_drill {
  std::vector<planned_fault> timeline;
  nanos safety_ns = 0;
  chaos_log log;
  /// Called about four times a second with the time since the chaos monkey started.
  std::function<void(nanos since_start, const status_board&)> sample;

  struct restart {
    fault_target target;
    std::uint64_t incarnation = 0;
    nanos at_ns = 0;                  // since the chaos monkey started
    std::uint64_t restored_version = 0;  // shard: the manifest it restarted from
    std::uint64_t versions_lost = 0;     // shard: committed fragment versions newer than it restored
  };
  /// A learner incarnation killed: the steps it took, as it counted them (some
  /// may never have been reported: their Progress died with it).
  struct killed_learner {
    std::uint32_t learner = 0;
    std::uint64_t incarnation = 0, steps = 0;
  };
  std::mutex mutex;
  std::vector<restart> restarts;       // guarded by mutex
  std::vector<killed_learner> killed;  // guarded by mutex
};

/// How often a run evaluates the global model as it goes, and whether it stops
/// at a target loss (a race to a loss, as `bench wan` runs).
struct mesh_eval {
  double period_s = 20;    // seconds between evaluations of Θ
  double target_loss = 0;  // stop once an evaluation is at or below it (nats/byte); 0: never
  std::uint64_t stop_tokens = 0;  // stop once the learners processed this many tokens; 0: never
};

/// The counts of a mesh's summary from its nodes' statuses, over every
/// incarnation: the broker's report, the learners' steps and tokens, rounds,
/// versions, bytes on the wire, refetches, committed versions, budget overruns,
/// members per round. The same for a mesh in one process and across processes.
void fill_mesh_counts(const status_board& board, int learners, mesh_summary& out);

/// Its lines (and its roles', transports', stores') go to `log`. `admin_endpoint`
/// (tcp://HOST:PORT): the broker also listens there for `archipelago set`
/// (mesh_setup::admin_endpoint); empty: the mesh stays in-process.
expected<mesh_summary> run_local_mesh(const config& cfg, logger& log, const mesh_progress& progress,
                                      const std::function<bool()>& stop_requested,
                                      const mesh_snapshots& snapshots = {}, mesh_drill* drill = nullptr,
                                      const metrics_endpoint& metrics = {}, const mesh_eval& eval = {},
                                      const std::string& admin_endpoint = {});

}  // namespace archipelago
