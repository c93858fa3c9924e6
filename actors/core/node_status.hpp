#pragma once
// What a node shows of itself while it runs: the same figures whether they are
// read inside its process (a status_board the roles write to) or across
// processes (GET /node of its metrics port, as JSON). Drills, the progress
// line and the run's summary read nothing else.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/ledger_totals.hpp"

namespace archipelago {

/// One learner incarnation as the broker saw it.
struct learner_record {
  learner_ref who;
  ledger_totals ledger;
  nanos joined_ns = -1;        // its Join arrived (broker clock)
  nanos first_merged_ns = -1;  // the first round that merged it closed; -1: never
  nanos left_ns = -1;          // Leave, or declared dead
};

/// The broker's accounting, as of its last report.
struct broker_report {
  nanos started_ns = 0;     // the broker's start; the times below are on the same clock
  double broker_cpu_s = 0;  // the broker actor's CPU time (not its transport's I/O thread)
  ledger_totals ledger;
  std::vector<learner_record> learners;
  std::vector<ledger_totals> fragment_ledger;  // the ledger per fragment (token-shares)
  double uptime = 1;  // share of the time in which some fragment advanced
  /// Per fragment, the share of the time in which it advanced (a silent shard's fragments lose theirs).
  std::vector<double> fragment_availability;
  /// The mean over fragments: a shard outage is partial downtime.
  double availability() const;
  nanos first_join_ns = -1, last_leave_ns = -1;  // the learners' span, for goodput
  double xi_step_ms = 0, xi_quorum_ms = 0, last_grace_ms = 0;
  std::uint64_t closed_grace_expired = 0, closed_all_eligible = 0, closed_timeout = 0;
  /// Mean over the rounds this broker saw settle of members merged / |live at close ∪
  /// members| (docs/concepts/accounting.md); 0 before any.
  double participation = 0;
  std::uint64_t participation_rounds = 0;
  /// Per published round among the broker's last closed ones (broker_core::history_capacity),
  /// in closing order: close → new version published back at the broker, and open →
  /// published. Filled only by a final report (the end of a run).
  std::vector<double> round_latency_ms, round_open_to_published_ms;
};

/// Counters of one incarnation of a node. A node's totals over its incarnations
/// add them up (status_board).
struct node_counters {
  // learner
  std::uint64_t steps = 0, tokens = 0, contributions = 0;
  std::uint64_t budget_overruns = 0;  // steps whose compute exceeded mesh.step_time_ms
  std::uint64_t refetches = 0;        // fetches again after a wait ran into mesh.round_timeout_s
  std::uint64_t wait_ns = 0;          // time waiting for fragments (synchronous modes)
  // parameter shard
  std::uint64_t published = 0;        // fragment versions merged and published
  std::uint64_t rejected = 0;         // contributions rejected
  std::uint64_t snapshot_errors = 0;  // versions whose snapshot was refused or failed
  // sync broker
  std::uint64_t rounds_closed = 0, members = 0;  // members summed over closed rounds
  std::uint64_t committed = 0;                   // fragment versions the shards reported durable
  std::uint64_t step_downs = 0;                  // it led, and stepped down for a newer epoch (standbys)
  // every node: contributions and fragment broadcasts, at their encoded size
  std::uint64_t bytes_sent = 0;
  // every node's transport: peers it declared dead; the control lane's longest round trip
  std::uint64_t peers_lost = 0;
  std::uint64_t control_rtt_max_ns = 0;  // a maximum: += keeps the larger
  /// What the node refused or cut, by reason: its transport's inbound rejections
  /// (malformed ..., impersonation, not_permitted), its role's refusals (not_owner,
  /// chaos_sender, claim_exceeds_bound), the broker's claims cut to their bound
  /// (claim_cut), the shards' robust screening (robust_reject, robust_clip).
  /// Reasons with a zero count are left out.
  std::map<std::string, std::uint64_t> refused;

  node_counters& operator+=(const node_counters& o);
};

/// The global model as one learner holds it — every fragment's last received
/// value, at its version — evaluated on the held-out text (mesh.global_eval_every).
/// `versions` names the cut (`replay eval V0,V1,...` reads the same model back).
struct global_eval {
  double loss = 0, bits_per_byte = 0;  // nats/byte, bits/byte
  std::int64_t step = 0;               // the learner's schedule step when it was taken
  std::vector<std::uint64_t> versions; // per fragment
  std::uint64_t evaluations = 0;       // by this incarnation, so far
};

struct node_status {
  node_address node;
  std::uint64_t incarnation = 0;
  node_counters counts;
  // learner
  bool left = false;    // it sent Leave: its steps are done, or it was stopped
  std::string refusal;  // the broker refused its Join (layout or policy differ)
  std::int64_t schedule_step = 0;  // where it is in the learning-rate schedule
  std::optional<global_eval> eval; // its newest evaluation of the global model (learner 0 only)
  // parameter shard: per fragment of the mesh (0 for fragments it does not own)
  std::vector<std::uint64_t> published_versions, committed_versions;
  // sync broker: its report while it leads (a standby that follows has none), and
  // the newest broker epoch it knows (its own while it leads; 0: none yet)
  std::optional<broker_report> report;
  std::uint64_t broker_epoch = 0;
};

/// One line of JSON (GET /node); node_status_from_json reads it back exactly.
std::string to_json(const node_status& s);
/// Reads a node's status; anything missing or malformed is invalid_input naming it.
expected<node_status> node_status_from_json(std::string_view text);

/// The statuses of the nodes one observer follows: the roles of this process,
/// or mirrors of other processes'. Thread-safe. A status of a newer incarnation
/// replaces the node's current one and adds that one's counters to the node's
/// earlier incarnations' (a restart keeps what the killed incarnation did); a
/// status of an older incarnation is ignored, and so is one of the same incarnation
/// whose counters are behind the current one's (taken earlier, arrived later).
class status_board {
 public:
  struct entry {
    node_status now;
    node_counters earlier;  // summed over the node's earlier incarnations
    node_counters total() const {
      node_counters t = earlier;
      t += now.counts;
      return t;
    }
  };

  void update(const node_status& s);
  std::optional<entry> find(node_address node) const;
  /// Every node, ordered by address.
  std::vector<entry> entries() const;
  /// The totals of every node of a role, over all their incarnations.
  node_counters total(role kind) const;
  /// Learners whose current incarnation left.
  int learners_left() const;
  /// The broker that leads: of those with a report (leading, as they see it), the
  /// one of the newest epoch — a deposed broker not yet told still has its older
  /// one. Without any, the primary's entry (nullopt: none known).
  std::optional<entry> leading_broker() const;

 private:
  mutable std::mutex mutex_;
  std::map<node_address, entry> entries_;  // guarded by mutex_
};

}  // namespace archipelago
