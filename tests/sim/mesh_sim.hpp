#pragma once
// A deterministic simulation of the mesh: the learner, broker and shard state
// cores on one thread, with a virtual clock and a seeded network (every
// directed link is a link_shaper: delay, jitter, loss, duplication,
// reordering), plus crashes, rejoins and partitions. One seed reproduces a run
// exactly. Learners optimise a quadratic with per-learner targets instead of
// the transformer, so thousands of rounds simulate in milliseconds.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <variant>
#include <vector>

#include "core/clock.hpp"
#include "core/layout.hpp"
#include "core/prng.hpp"
#include "learner/learner_core.hpp"
#include "parameter_shard/shard_core.hpp"
#include "sync_broker/broker_core.hpp"
#include "sync_broker/token_ledger.hpp"
#include "transport/link_shaper.hpp"

namespace archipelago::sim {

struct crash_fault {
  std::uint32_t learner;
  nanos at_ns;
  nanos rejoin_at_ns;  // < 0: never comes back
};

struct partition_fault {
  std::uint32_t learner;  // cut from the broker and every shard, both ways
  nanos from_ns, to_ns;
};

struct sim_config {
  std::uint64_t seed = 1;
  int learners = 4;
  int shards = 2;
  int fragments = 4;
  std::vector<nanos> step_ns;  // per learner; default 10 ms each
  std::uint64_t tokens_per_step = 1024;
  broker_config broker;        // fragments and shard_of_fragment are filled in
  learner_sync_config sync;    // the learners' policy (default: decoupled, never waits)
  link_profile link;           // every directed link
  nanos duration_ns = 10'000'000'000;
  nanos tick_ns = 1'000'000;
  std::vector<crash_fault> crashes;
  std::vector<partition_fault> partitions;
};

struct sim_result {
  double initial_loss = 0, final_loss = 0;   // mean squared distance of Θ to the target
  std::vector<float> final_theta;            // the global parameters, gathered from the shards
  std::vector<round_record> history;         // the broker's closed rounds
  broker_counters broker;
  std::vector<shard_ledger> shards;
  std::uint64_t published = 0;
  std::uint64_t messages_sent = 0, messages_lost = 0;
  std::vector<std::uint64_t> learner_steps;  // per learner, over all incarnations
  std::vector<std::uint64_t> contributions_sent;
  std::vector<std::vector<std::uint64_t>> member_incarnations;  // learner → incarnations seen in closed rounds
  ledger_totals ledger;                      // kept by the broker from Progress and arrival notices
  std::uint64_t tokens_processed = 0;        // counted by the learners themselves
  nanos learner_wait_ns = 0;                 // summed time learners spent waiting (synchronous policies)
};

/// Runs the mesh until config.duration_ns of virtual time.
sim_result run_mesh(const sim_config& config);

}  // namespace archipelago::sim
