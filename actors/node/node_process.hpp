#pragma once
// One mesh role in this process (`archipelago node`): the broker, one parameter
// shard or one learner, talking to the others over tcp://. Every process of a
// mesh gets the same configuration and the same list of endpoints; learners
// announce their own (any free port) when they join.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/log.hpp"
#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "node/metrics_server.hpp"

namespace archipelago {

struct node_options {
  role kind = role::learner;
  std::uint32_t index = 0;                   // shard or learner index
  std::vector<std::string> broker_endpoints; // tcp://HOST:PORT of the primary broker, then of each standby
  bool standby = false;                      // broker: a standby (broker --index, from 1), leading only on a takeover
  std::vector<std::string> shard_endpoints;  // where shard i listens
  std::string listen;                        // where to bind: a learner announces it (default: a free loopback
                                             // port); broker, shard: instead of their own --broker / --shards entry
  std::string db;                            // broker, shard: keep snapshots (shard) or the tape (broker) here
  bool record_contributions = false;         // shard: record merged contributions (replay verify)
  std::string resume_from;                   // start from this store's newest snapshot (shard: into a new db)
  metrics_endpoint metrics;                  // serve /metrics (and the broker /status) here
};

struct node_result {
  node_address address;
  incarnation inc;
  double started_unix_s = 0;  // wall-clock start, to line up with other processes' clocks
  nanos started_steady_ns = 0;  // the same moment on the process's steady clock (what reports' times use)
  double wall_s = 0;
  // learner
  std::uint64_t steps = 0, tokens = 0;
  std::uint64_t budget_overruns = 0;  // steps whose compute exceeded mesh.step_time_ms
  double wait_s = 0;
  // broker
  broker_report broker;
  bool leading = false;  // it led at its end (a standby that never took over, or a deposed one: false)
  std::uint64_t rounds = 0;
  // shard
  std::uint64_t published = 0, rejected = 0;
  std::uint64_t resumed_version = 0;  // the fragment versions' manifest it restarted from; 0: fresh
  std::uint64_t mesh_version = 0;     // the last snapshot committed
  std::uint64_t committed = 0;        // broker: fragment versions the shards reported durable
  /// The role's last status: what a drill across processes reads from the summary.
  node_status status;
};

/// Runs the role until it is done (a learner: its steps) or `stop_requested`.
/// `progress` is called about twice a second with a status line.
/// Its lines (and its roles', transport's, store's) go to `log`.
expected<node_result> run_node(const config& cfg, logger& log, const node_options& options,
                               const std::function<void(const std::string&)>& progress,
                               const std::function<bool()>& stop_requested);

}  // namespace archipelago
