#pragma once
// A deterministic simulation of the mesh: every learner, the sync broker and
// every parameter shard run their real wire layer and state core
// (learner_wire, broker_wire, shard_wire) on one thread, with a virtual clock
// and a seeded network. What the shells do around them — send and receive
// through the transport, tell a peer's silence from its heartbeats, keep a
// broker's and a shard's store, step a model — the simulation does in virtual
// time:
//  - every message is a real envelope: encoded by the wire layer, carried over
//    a directed link_shaper (delay, jitter, loss, duplication, reordering,
//    corruption), and decoded by the real codec at the receiver (a corrupted
//    one fails its checksum and is dropped, as the transport drops it);
//    duplicates reach the wire layers (the transport's de-duplication is left
//    out: the cores must be idempotent on their own); a message of an older
//    incarnation than one the receiver heard from is dropped, as the transport does;
//  - liveness is the transport's: every node sends heartbeats over the same
//    links every broker_silence_ns / 3, and a peer_liveness per node declares a
//    peer dead after broker_silence_ns of silence (and alive again when heard);
//  - the broker's store (round lease, ledger) and each shard's durable copies
//    are kept in memory across their restarts; a shard's merged version becomes
//    durable commit_delay_ns later, and only then visible (durable before visible);
//  - learners optimise a quadratic with per-learner targets instead of the
//    transformer, so thousands of rounds simulate in seconds.
// Crashes, rejoins and partitions, and the fault drills of deploy/drills run by
// the real chaos monkey's wire layer in virtual time: its ChaosCommands travel
// the sim's links and the nodes' wire layers obey them; its process faults go
// to the sim's launcher. One seed reproduces a run exactly.

#include <cstdint>
#include <map>
#include <utility>
#include <tuple>
#include <vector>

#include "chaos_monkey/chaos_core.hpp"
#include "core/clock.hpp"
#include "core/live_settings.hpp"
#include "core/ledger_totals.hpp"
#include "learner/learner_core.hpp"
#include "parameter_shard/shard_core.hpp"
#include "storage/snapshot_store.hpp"
#include "sync_broker/broker_core.hpp"
#include "transport/link_shaper.hpp"

namespace archipelago::sim {

struct crash_fault {
  std::uint32_t learner;
  nanos at_ns;
  nanos rejoin_at_ns;  // < 0: never comes back
};

/// The sync broker's process dies at at_ns and a new one (the next incarnation)
/// starts at restart_at_ns, as `node --role broker` restarted by its supervisor:
///  - while down it receives nothing and opens nothing; the learners go on
///    stepping (their Progress and the shards' notices to it are lost);
///  - the learners and shards find it silent broker_silence_ns after the crash
///    (their transport's liveness) and the learners send Join again each
///    fetch period until a broker answers; with_store, the new broker greets the
///    learners its predecessor knew at once (their endpoints are stored with
///    the ledger) and they re-join without waiting;
///  - the new broker knows no learner and no shard; it greets every shard
///    (Welcome) until it hears from it; a shard that sees the higher incarnation
///    drops the rounds it buffered for the old one and announces itself, a
///    learner drops its pending rounds; contributions and arrival notices carry
///    the incarnation of the broker whose round they answer, so nothing of an
///    old round enters a new one;
///  - with_store (`--db`): the new broker numbers its rounds after every round
///    the old one opened (its round lease) and restores the token ledger as the
///    old one last wrote it (every broker_ledger_write_ns), each learner
///    incarnation continued from its stored step count; without: rounds start
///    again at 0 and the ledger from the learners' cumulative Progress alone.
/// A crash while the broker is down is ignored; so is a restart_at_ns before at_ns.
/// With standbys (sim_config::standbys) a standby takes over while it is down
/// (broker_seat); store_lost: its host is gone — a restart, if any, starts from
/// an empty store (and follows the standby that leads).
struct broker_crash_fault {
  nanos at_ns;
  nanos restart_at_ns;
  bool with_store = true;
  bool store_lost = false;
  std::uint32_t broker = 0;  // 0: the primary; 1, 2, ...: a standby
};

/// Broker `broker` (0: the primary) cut from every other node, both ways; with
/// from_brokers_only, only from the other brokers (a split brain: the standby
/// takes over while the primary still reaches the learners and shards).
struct broker_partition_fault {
  std::uint32_t broker;
  nanos from_ns, to_ns;
  bool from_brokers_only = false;
};

/// The lease service (mesh.etcd) unreachable from broker `broker` (-1: down for
/// everyone) between from_ns and to_ns: its calls get no answer within their bound.
struct lease_outage_fault {
  int broker = -1;
  nanos from_ns, to_ns;
};

/// Broker `broker`'s process stopped (SIGSTOP) at at_ns for for_ns: it handles
/// nothing, sends nothing (no heartbeats), and what arrives meanwhile waits.
struct broker_pause_fault {
  std::uint32_t broker;
  nanos at_ns, for_ns;
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
  /// The learners' quadratic: each inner step moves θ this fraction of the way to
  /// the learner's target; the targets spread around the common one by this
  /// standard deviation (non-IID data). A small rate keeps learners far from
  /// their targets for thousands of steps, as a language model's are.
  float inner_rate = 0.05f;
  float target_spread = 0.3f;
  broker_config broker;        // fragments and shard_of_fragment are filled in
  learner_sync_config sync;    // the learners' policy (default: decoupled, never waits)
  link_profile link;           // every directed link
  std::size_t bulk_piece_bytes = 64 * 1024;  // the transport's bulk lane: pieces on a shaped link (bulk_pacer)
  nanos duration_ns = 10'000'000'000;
  /// As train.steps: each learner incarnation leaves after this many steps (with
  /// `flush`, as mesh.flush, once its work is merged). 0: they step until duration_ns.
  std::uint64_t steps_per_learner = 0;
  bool flush = false;
  nanos tick_ns = 1'000'000;   // the broker's tick
  std::vector<crash_fault> crashes;
  std::vector<partition_fault> partitions;
  /// Broker process crashes and restarts (broker_crash_fault says what the sim does).
  std::vector<broker_crash_fault> broker_crashes;
  /// Standby brokers beside the primary (node --role broker --standby), each a broker_seat.
  int standbys = 0;
  std::vector<broker_partition_fault> broker_partitions;
  std::vector<broker_pause_fault> broker_pauses;
  /// The brokers lead only while holding a lease (mesh.etcd): each broker's real
  /// lease_keeper, its calls carried lease_rtt_ns there and back to a model of
  /// etcd (sim_lease_service); a call without an answer fails after its bound.
  bool lease = false;
  nanos lease_rtt_ns = 2'000'000;
  std::vector<lease_outage_fault> lease_outages;
  /// The transport's liveness: a peer silent this long is dead (heartbeats go
  /// every third of it). A learner finds a crashed broker silent this much later.
  nanos broker_silence_ns = 300'000'000;
  nanos broker_ledger_write_ns = 1'000'000'000;  // the broker writes its ledger to its store this often
  /// A fault drill's timeline (expand_fault_plan of a deploy/drills plan): the
  /// chaos monkey's wire layer walks it in virtual time (mesh_sim.cpp, "fault
  /// drills", says what each kind does here).
  /// Every fault is repaired by safety_ns at the latest (the plan's duration).
  std::vector<planned_fault> timeline;
  nanos safety_ns = 0;
  /// A killed shard (or broker) stays down at least this long: plans give
  /// those crashes no `for`, and a process restart is never instant.
  nanos restart_ns = 500'000'000;
  /// A shard's merged version becomes durable this long after the merge (the
  /// snapshot writer works on its own thread); only then do learners see it. Default: 0.
  nanos commit_delay_ns = 0;
  /// Each shard's writer commits one version at a time, each taking commit_delay_ns
  /// (a disk of bounded bandwidth): versions queue behind each other. Default: each
  /// commit takes commit_delay_ns however many are in flight.
  bool serial_commits = false;
  /// A joining learner fetches the fragments it still misses again after this
  /// (a fetch or its reply was lost, or its shard was down); a learner whose
  /// broker fell silent sends Join again this often.
  nanos fetch_retry_ns = 1'000'000'000;
  /// After duration_ns the learners stop stepping and the mesh runs this much
  /// longer, so that every message in flight is delivered. Default: 0.
  nanos drain_ns = 0;
  /// The shards' robust merge (mesh.robust): off by default, as in the product.
  robust_config robust;
  /// The shards' outer step (default: DiLoCo's 0.7 and 0.9; the mesh's are mesh.outer_lr and
  /// mesh.outer_momentum).
  nesterov_config outer;
  /// The learners' wire.encoding and wire.error_feedback.
  std::string encoding = "fp32";
  bool error_feedback = false;
  /// An operator's live changes (`archipelago set`): at each time, a Reconfigure from
  /// an admin straight to the primary broker's wire; its answer lands in sim_result::admin_replies.
  std::vector<std::pair<nanos, std::vector<live_setting>>> reconfigures;
  /// Sample the global model's loss this often (sim_result::loss_curve); 0: never.
  nanos loss_every_ns = 0;
};

/// A shard's fragment version as it changes: merged (handed to the store),
/// made durable (committed), then visible to the learners (published:
/// broadcast), or restored from the newest durable copy on a restart.
struct version_event {
  enum class what : std::uint8_t { merged, published, committed, restored };
  what kind = what::published;
  nanos at_ns = 0;
  std::uint32_t shard = 0;
  fragment_index fragment;
  std::uint64_t version = 0;
};

struct sim_result {
  double initial_loss = 0, final_loss = 0;   // mean squared distance of Θ to the target
  std::vector<std::pair<nanos, double>> loss_curve;  // (time, loss of Θ) every sim_config::loss_every_ns
  std::vector<float> final_theta;            // the global parameters, gathered from the shards
  std::vector<round_record> history;         // the broker's closed rounds, every broker incarnation's in turn
  broker_counters broker;                    // the last broker incarnation's
  std::uint64_t broker_restarts = 0;
  std::vector<std::uint64_t> broker_first_rounds;  // per broker incarnation: the round it numbered from
  /// Each time a broker began to lead: (time, broker index, epoch); and when one stepped down.
  std::vector<std::tuple<nanos, std::uint32_t, std::uint64_t>> leaders;
  std::vector<std::pair<nanos, std::uint32_t>> step_downs;
  /// Every RoundClose a broker sent: (time, broker index, its epoch), in time order.
  std::vector<std::tuple<nanos, std::uint32_t, std::uint64_t>> round_closes;
  /// The most brokers that led at once (running, not stopped), sampled every tick_ns.
  int most_leaders_at_once = 0;
  std::uint64_t lease_campaigns_won = 0;  // transactions the lease service let succeed (cfg.lease)
  /// RoundOpens and RoundCloses a broker sent while it did not hold a valid lease (cfg.lease; must be 0).
  std::uint64_t rounds_acted_without_lease = 0;
  /// Each broker's stored tape at the end (index: broker), and the tapes of stores lost with their host.
  std::vector<std::vector<storage::tape_record>> broker_tapes;
  std::vector<std::pair<std::uint32_t, std::vector<storage::tape_record>>> lost_broker_tapes;
  /// Round closes of a broker whose epoch a newer one had already replaced that a shard
  /// took all the same (must be 0: fencing), and the broker messages shards refused.
  std::uint64_t closes_merged_by_deposed = 0, fenced_at_shards = 0;
  std::vector<shard_ledger> shards;
  /// The shards' (their last incarnations') rounds closed while their fragment's last
  /// version was not durable yet (held, merged once it was), and those dropped unmerged (the bound).
  std::uint64_t shard_deferred_rounds = 0, shard_deferred_dropped = 0;
  std::uint64_t published = 0;
  std::uint64_t messages_sent = 0, messages_lost = 0;
  std::uint64_t peers_declared_dead = 0;     // liveness verdicts of every node's transport, true or false
  std::uint64_t messages_corrupted = 0;      // deliveries the codec rejected (a checksum): dropped
  std::vector<std::uint64_t> learner_steps;  // per learner, over all incarnations
  std::vector<std::uint64_t> contributions_sent;
  std::vector<std::vector<std::uint64_t>> member_incarnations;  // learner → incarnations seen in closed rounds
  ledger_totals ledger;                      // kept by the (last) broker from Progress and arrival notices
  std::vector<ledger_totals> fragment_ledger;  // the same per fragment
  ledger_totals ledger_restored;             // what the last broker restored from its store (broker_crashes)
  std::uint64_t tokens_processed = 0;        // counted by the learners themselves
  nanos learner_wait_ns = 0;                 // summed time learners spent waiting (synchronous policies)
  /// (time, shard) of every Welcome the broker sent a shard: its greeting until
  /// it hears from the shard, and its answer to a shard's Join (a restart).
  std::vector<std::pair<nanos, std::uint32_t>> welcomes_to_shards;
  /// The broker's answers to reconfigures: (accepted, the first round under the new values or why not).
  std::vector<std::pair<bool, std::string>> admin_replies;
  /// The (last) leading broker's participation: mean over settled rounds of members merged / live learners.
  double participation = 0;
  std::uint64_t participation_rounds = 0;

  // -- fault drills ------------------------------------------------------------
  std::vector<version_event> versions;       // every shard's versions, in time order
  std::vector<std::vector<nanos>> merged_at;  // learner → when rounds it was a member of closed with a merge
  /// (time, n) whenever n changes: learners alive, not paused, joined, and able
  /// to reach the broker and every shard that is up (0 while every shard is
  /// down: one shard down pauses only its fragments). Sampled every tick_ns.
  std::vector<std::pair<nanos, int>> healthy_learners;
  std::map<learner_ref, std::uint64_t> steps_by_incarnation;     // the learners' own count
  std::map<learner_ref, std::uint64_t> progress_delivered;       // highest Progress step the broker received
  std::map<learner_ref, ledger_totals> ledger_by_incarnation;
  std::vector<std::uint64_t> learner_incarnations;               // per learner, at the end
  std::vector<std::vector<std::uint64_t>> learner_versions;      // at the end: learner → fragment → version held
  std::vector<std::uint64_t> shard_versions;                     // at the end: fragment → version
  std::uint64_t shard_restarts = 0;
  std::vector<chaos_action> chaos_record;    // what the chaos monkey did, in time order
  std::size_t faults_injected = 0;
  bool chaos_healed = false;                 // every fault repaired and every node told to heal, at the end
  /// Fault effects still in force at the end (should be 0): nodes down or paused,
  /// slowed learners, shaped links, failing disks.
  int faults_in_place = 0;
};

/// Runs the mesh until config.duration_ns of virtual time.
sim_result run_mesh(const sim_config& config);

}  // namespace archipelago::sim
