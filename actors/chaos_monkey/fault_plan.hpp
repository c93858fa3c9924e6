#pragma once
// A fault drill's plan (pure, deterministic): parsed from TOML and checked
// before anything starts — an unknown fault, an unknown target, a negative
// duration or a malformed time is an error naming the line — then expanded,
// from its seed, into the timeline of faults the chaos monkey executes.
//
//   seed = 7
//   duration = "120s"          # the safety phase: faults happen in it
//   liveness = "30s"           # then everything is healed and the mesh must converge
//   standbys = 1               # standby brokers beside the primary (broker/1, ...); default 0, at most 7
//
//   [[fault]]                  # a scheduled fault
//   at = "10s"                 # from the start: "500ms", "10s", "1.5m"
//   kind = "crash"             # see fault_kind
//   target = "learner/1"       # learner/N, shard/N, broker (the primary), broker/N (a standby),
//                              # learners (each one), storage/N
//   for = "5s"                 # until it is repaired (the process restarted, the link healed)
//   every = "60s"              # optional: again every 60 s until the safety phase ends
//   factor = 2.0               # slow: step time × factor; attack_scaled: the delta × factor (default 1000);
//                              # attack_sideways: its cosine with the honest delta, in [0, 1) (default 0.1)
//   loss = 0.1                 # link: loss, duplicate, reorder, corrupt (probabilities),
//                              #       delay_ms, bandwidth_mbit
//   groups = [["learner/0", "learner/1"], ["learner/2", "shard/0"]]   # partition
//   as = "broker"              # impersonate: the learner claims to be broker, shard/N or learner/N
//   factor = 100.0             # lie_tokens: contributions claim tokens × factor
//
//   [[fault]]                  # the primary broker's host is lost: its process killed,
//   at = "20s"                 # its store removed, never restarted; a standby takes over
//   kind = "broker_host_lost"  # (needs standbys >= 1; no for, no every; no broker_crash
//   target = "broker"          #  or broker_host_lost of the primary after it)
//
//   [pass]                     # criteria beyond the drill's own (no downtime, exact ledger, ...)
//   participation = 0.8        # mean members merged / live learners per round at least this
//
//   [rates]                    # faults drawn at random instead of (or besides) a schedule
//   kinds = ["crash", "pause"]
//   learner_mtbf = "60s"       # mean time between faults per learner (exponential)
//   repair_min = "2s"          # repair time, uniform in [min, max]
//   repair_max = "10s"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/ids.hpp"

namespace archipelago {

enum class fault_kind : std::uint8_t {
  crash,           // SIGKILL of a learner's process (an actor kill in one process), restarted after `for`
  pause,           // SIGSTOP, SIGCONT after `for`
  slow,            // step time × factor
  partition,       // no messages between the groups
  link,            // loss / duplication / reordering / delay / bandwidth cap / corruption on the target's links
  shard_crash,     // SIGKILL of a parameter shard, restarted from its snapshots
  broker_crash,    // SIGKILL of the sync broker, restarted
  storage_errors,  // the target shard's snapshot store fails its writes
  // SIGKILL of the primary broker's process and its store removed — its host is
  // gone. Never restarted (no `for`): a standby takes over. Needs standbys >= 1.
  broker_host_lost,
  // Attackers, learners only, carried out by the learner itself (wire.accept_chaos):
  impersonate,     // it forges envelopes claiming to be `as` (broker, shard/N, learner/N) with its own key
  lie_tokens,      // its contributions claim factor × their tokens
  // A malicious learner (mesh.robust's drills): its contributions, for `for`, are
  // scaled by `factor` (default 1000), sign-flipped, replaced by Gaussian noise of
  // the same RMS, replays of its first contribution to each fragment (stale), or
  // of the honest norm along a fixed direction per fragment, at cosine `factor`
  // (default 0.1) with the honest delta (sideways: compounds through momentum).
  attack_scaled,
  attack_sign_flip,
  attack_random,
  attack_stale,
  attack_sideways,
};
const char* to_string(fault_kind k);
/// The attacker kinds of a learner that poisons its own contributions.
inline bool is_attack(fault_kind k) {
  return k == fault_kind::attack_scaled || k == fault_kind::attack_sign_flip || k == fault_kind::attack_random ||
         k == fault_kind::attack_stale || k == fault_kind::attack_sideways;
}

struct fault_target {
  role kind = role::learner;
  std::uint32_t index = 0;  // a broker's: 0 the primary ("broker"), 1, 2, ... a standby ("broker/N")
  bool every_learner = false;  // "learners": one fault per learner
  std::string to_string() const;
};

struct link_fault {
  double loss = 0, duplicate = 0, reorder = 0, corrupt = 0;
  double delay_ms = 0, bandwidth_mbit = 0;  // 0: unchanged / unlimited
};

struct planned_fault {
  nanos at_ns = 0;
  fault_kind kind = fault_kind::crash;
  std::vector<fault_target> targets;              // one, except a partition's first group
  std::vector<std::vector<fault_target>> groups;  // partition
  nanos for_ns = 0;
  nanos every_ns = 0;  // > 0: repeats at at + k × every within the safety phase
  double factor = 1;
  link_fault link;
  fault_target as;  // impersonate: whom the learner claims to be
  int line = 0;  // where the plan says it (0: drawn from [rates])
};

struct fault_rates {
  std::vector<fault_kind> kinds;
  nanos learner_mtbf_ns = 0;  // 0: no random faults
  nanos repair_min_ns = 0, repair_max_ns = 0;
};

/// The most standby brokers a plan may ask for.
inline constexpr int max_plan_standbys = 7;
/// The most faults a plan's timeline may hold: its repeating faults over the duration,
/// per learner where they target every learner, plus twice the faults [rates] draws on
/// average (duration / learner_mtbf per learner). A bound on the chaos monkey's work
/// and memory; a plan past it is refused when parsed (fuzzing found a 124-byte plan
/// whose timeline held millions).
inline constexpr std::size_t max_plan_faults = 100000;

struct fault_plan_spec {
  std::uint64_t seed = 1;
  nanos duration_ns = 0;
  nanos liveness_ns = 0;
  int standbys = 0;  // standby brokers the drill's mesh runs beside the primary (broker/1, ...)
  double min_participation = 0;  // [pass] participation; 0: no criterion
  std::vector<planned_fault> schedule;
  fault_rates rates;
};

/// Parses and checks a plan against a mesh of `learners` learners and `shards` shards.
/// `origin` names the file in errors ("plan.toml:12: unknown fault kind 'explode'").
expected<fault_plan_spec> parse_fault_plan(std::string_view toml_text, const std::string& origin, int learners,
                                           int shards);

/// "500ms", "10s", "1.5m", "2h" → nanoseconds; nullopt-like error when malformed or negative.
expected<nanos> parse_duration(std::string_view text);

/// The plan's timeline: the schedule plus, from the seed, the faults `rates` draws for
/// each learner within the safety phase, sorted by time (ties by line, then learner).
/// "learners" targets are expanded into one fault per learner. Deterministic. At most
/// max_plan_faults faults: draws past it are not made (a plan parse_fault_plan accepted
/// reaches it with a probability below 10^-6).
std::vector<planned_fault> expand_fault_plan(const fault_plan_spec& plan, int learners);

}  // namespace archipelago
