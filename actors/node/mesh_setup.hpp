#pragma once
// What every node of a mesh must agree on, derived from the configuration:
// the model layout, the fragment plan, which shard owns which fragment, the
// initial parameters and where each node listens.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/ids.hpp"
#include "core/layout.hpp"
#include "sync_broker/token_ledger.hpp"

namespace zmq {
class context_t;
}

namespace archipelago {

/// The mesh has one sync broker, at this address.
inline constexpr node_address broker_address{role::sync_broker, 0};

struct mesh_setup {
  std::shared_ptr<zmq::context_t> io_context;  // one per process: inproc:// needs it shared
  config cfg;
  sync_policy policy;
  model_shape shape;
  param_layout layout;
  fragment_plan plan;
  std::vector<std::uint32_t> shard_of_fragment;
  std::string broker_endpoint;
  std::vector<std::string> shard_endpoints;
  std::vector<std::string> learner_endpoints;
  std::int64_t start_step = 0;  // a resumed run: where the learners' schedule starts
};

/// One learner incarnation as the broker saw it.
struct learner_record {
  learner_ref who;
  ledger_totals ledger;
  nanos joined_ns = -1;        // its Join arrived (broker clock)
  nanos first_merged_ns = -1;  // the first round that merged it closed; -1: never
  nanos left_ns = -1;          // Leave, or declared dead
};

struct dataset;

/// Everything a mesh agrees on but the endpoints, from the configuration and
/// its resolved policy (resolve_policy(cfg)), with a fresh I/O context.
mesh_setup make_mesh_setup(const config& cfg, const sync_policy& policy);

/// The initial global model: the seeded initialisation every shard derives alike.
std::vector<float> initial_global_params(const mesh_setup& setup, const dataset& data);

/// The broker's accounting, as of its last report.
struct broker_report {
  nanos started_ns = 0;  // the broker's start; the times below are on the same clock
  double broker_cpu_s = 0;  // the broker actor's CPU time (not its transport's I/O thread)
  ledger_totals ledger;
  std::vector<learner_record> learners;
  double uptime = 1;
  nanos first_join_ns = -1, last_leave_ns = -1;  // the learners' span, for goodput
  double xi_step_ms = 0, xi_quorum_ms = 0, last_grace_ms = 0;
  std::uint64_t closed_grace_expired = 0, closed_all_eligible = 0, closed_timeout = 0;
  /// Per published round among the broker's last broker_core::history_capacity
  /// closed ones, in closing order: close → new version published back at the
  /// broker, and open → published. Filled only by the report a report_atom asks
  /// for (the end of a run), not by the periodic ones.
  std::vector<double> round_latency_ms, round_open_to_published_ms;
};

/// Live figures the actors update and the progress line reads.
struct mesh_stats {
  std::atomic<std::uint64_t> rounds_closed{0}, published{0};
  std::atomic<std::uint64_t> steps{0}, tokens{0}, rejected{0};
  std::atomic<std::uint64_t> members{0};      // summed over closed rounds
  std::atomic<std::uint64_t> bytes_sent{0};   // contributions and fragment broadcasts
  std::atomic<std::uint64_t> wait_ns{0};      // learners' time waiting for fragments (synchronous modes)
  std::atomic<std::uint64_t> refetches{0};    // waits that ran into mesh.round_timeout_s
  std::atomic<std::uint64_t> committed{0};    // fragment versions made durable (snapshots)
  std::atomic<std::uint64_t> snapshot_errors{0};  // versions whose snapshot was refused or failed
  std::atomic<std::uint64_t> budget_overruns{0};  // steps whose compute exceeded mesh.step_time_ms
  /// Inner steps per learner index, over all its incarnations; sized by whoever
  /// wants them (drills) before the learners start, empty otherwise.
  std::vector<std::atomic<std::uint64_t>> learner_steps;
  /// Per fragment, the highest version its shard made durable (snapshots); sized like learner_steps.
  std::vector<std::atomic<std::uint64_t>> committed_version;
  std::atomic<int> learners_done{0};

  std::mutex report_mutex;
  broker_report report;  // guarded by report_mutex
  std::string refusal;   // guarded by report_mutex: why the broker refused this node's Join
};

}  // namespace archipelago
