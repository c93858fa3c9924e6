#pragma once
// A fault drill (`archipelago drill`): a mesh with snapshots runs a fault plan
// — the safety phase with its faults, then the liveness phase healed — beside
// an optional fault-free reference run of the same length, and the report
// measures what happened: a timeline of faults and recoveries, per-learner
// activity, rounds, uptime, goodput, the ledger, time to rejoin, committed
// versions lost, eval loss against the reference.
//
// The mesh runs in this process (its "processes" are actors) or as separate
// `archipelago node` processes on loopback (drill_options::binary). Either way
// the drill observes it one way: the nodes' statuses (core/node_status.hpp) on
// a status board — written by the actors in one process, mirrored from every
// node's GET /node across processes — turned into samples by one function.
//
// Learners run on a fixed compute budget (mesh.step_time_ms): on a small
// machine a killed learner would otherwise hand its CPU to the others and
// flatter goodput. The report says which budget was used.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chaos_monkey/fault_plan.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "node/local_mesh.hpp"

namespace archipelago {

struct drill_options {
  std::string plan_origin;   // the plan's file name, for errors and the report
  std::string plan_text;     // its TOML
  bool reference = true;     // also run the mesh fault-free, to the drill's tokens
  /// The reference's mesh.mode; empty: the drill's own. "dp" compares a mode under
  /// faults with fault-free synchronous training at equal tokens.
  std::string reference_mode;
  std::string work_dir;      // snapshot stores go below it; empty: a temporary directory, removed after
  /// Every time of the plan (phases, fault times and lengths, MTBF, repair
  /// times) multiplied by this: a short form of the same drill (CI uses 0.2).
  double time_scale = 1;
  /// The mesh as separate processes of this `archipelago` executable; empty: in this process.
  std::string binary;
  /// With binary: learner I runs this command (its words split at spaces) instead of
  /// `archipelago node`, given the same arguments after it (--role learner --index I
  /// --config ... --listen ...): e.g. a PyTorch learner (tools/python/examples/torch_gpt.py).
  std::map<std::uint32_t, std::string> learner_commands;
};

/// Parses and checks the plan for the mesh `cfg` describes — before anything starts.
expected<fault_plan_spec> load_drill_plan(const config& cfg, const drill_options& options);

struct drill_fault_row {
  std::size_t index = 0;
  std::string what;             // describe(fault)
  double at_s = 0;
  bool skipped = false;         // a process fault on a target already down
  double repaired_s = -1;       // when it was repaired (restart, link healed); -1: not within the run
  double rejoin_s = -1;         // restart → the new incarnation's first merged work (learner), first
                                // committed version (shard), the mesh's first new version (broker); -1: n/a
};

struct drill_sample {
  double t_s = 0;  // since the chaos monkey started
  std::uint64_t rounds = 0, published = 0, tokens = 0;
  double merged_step_time_s = 0;  // the broker's ledger, as of its last report
  std::vector<std::uint64_t> learner_steps;
  std::vector<std::uint64_t> shard_committed;  // per shard, the sum of its fragments' committed versions
  std::vector<std::uint64_t> fragment_versions;  // per fragment, the version its shard publishes
  int learners_down = 0, shards_down = 0;
  bool broker_down = false;
  // The brokers (the primary, then the standbys): who leads, in which epoch, as their statuses say.
  std::int32_t leader = -1;                   // the broker leading in the newest epoch; -1: none known
  std::uint64_t epoch = 0;                    // that epoch
  std::vector<std::uint64_t> broker_epochs;   // per broker: the newest epoch it knows (its own while it leads)
  std::vector<int> broker_leading;            // per broker: 1 while it leads (as it sees it; a killed one: as it last said)
};

/// One broker epoch as the brokers' tapes show it (`replay tape`): who led in it
/// and the merged rounds it closed.
struct drill_epoch {
  std::uint64_t epoch = 0;
  std::uint32_t broker = 0;                       // leader_of_epoch(epoch)
  std::uint64_t rounds = 0;                       // merged rounds (fragment versions) it closed
  double first_closed_s = 0, last_closed_s = 0;   // on the drill's clock
};

/// A fault that took the leading broker away — its host lost, or a partition that
/// left it no shard — and the standby that took over.
struct drill_takeover {
  std::size_t fault = 0;         // the fault's row
  double at_s = 0;
  std::uint32_t deposed = 0;     // the broker that led before
  std::int64_t broker = -1;      // the broker leading next; -1: nobody took over
  std::uint64_t epoch = 0;       // its epoch
  double first_round_s = -1;     // the fault → the new epoch's first merged round closed (tapes); -1: none
  double back_s = -1;            // the fault → the first new fragment version under the new leader (samples)
  /// A partition: its heal → the first sample in which the deposed broker no longer
  /// leads and knows the newer epoch (it stepped down); -1: never seen, or its host is lost.
  double stepped_down_s = -1;
};

/// What the launcher of a many-process drill did to a node's process: start,
/// kill (SIGKILL), stop (SIGSTOP), cont (SIGCONT), exit; with the pid and what
/// was seen of it (e.g. /proc state "T" after a stop).
struct drill_process_event {
  double t_s = 0;  // on the drill's clock (negative: before the chaos monkey started)
  std::string node, action, detail;
  int pid = 0;
};

struct drill_report {
  bool processes = false;  // the mesh ran as separate `archipelago node` processes
  std::vector<drill_process_event> process_events;
  std::string plan, mode;
  std::string reference_mode;  // the fault-free reference's mesh.mode
  int standbys = 0;  // standby brokers beside the primary (the plan's `standbys`)
  std::uint64_t seed = 0;
  int learners = 0, shards = 0, quorum = 1;
  double safety_s = 0, liveness_s = 0;
  double step_time_ms = 0;        // the compute budget per inner step
  std::uint64_t budget_overruns = 0;  // steps whose compute took longer than the budget
  mesh_summary run;
  std::optional<mesh_summary> reference;
  std::vector<drill_fault_row> faults;
  std::vector<drill_sample> samples;
  std::size_t faults_injected = 0, faults_skipped = 0;
  double downtime_s = 0;          // no new version of any fragment for > downtime_gap_s while >= K learners were live, broker up
  /// The broker down, until its first round after a restart; a leader taken away
  /// (drill_takeover), until the first version under its successor — for at most
  /// takeover_bound_s: a stall beyond the bound is global downtime.
  double broker_outage_s = 0;
  /// The liveness verdict (wire.heartbeat_interval_ms × wire.liveness), the last
  /// standby's stagger ((standbys − 1) heartbeats), and twice downtime_gap_s — what
  /// any stall may last — for the successor's first round and its publication:
  /// 7 s by default with one standby.
  double takeover_bound_s = 0;
  std::vector<drill_takeover> takeovers;
  /// Every epoch on the brokers' tapes (a lost host's store is gone; the standby kept
  /// a copy of its tape), in order; a merged round is counted once however many tapes hold it.
  std::vector<drill_epoch> epochs;
  /// Must be 0: merged rounds whose fragment version follows one of a newer epoch (a
  /// deposed broker merged after its successor), or closed under two epochs.
  std::uint64_t deposed_merges = 0;
  /// Must be 0: merged rounds of an epoch closed after a newer epoch's first one (two
  /// brokers leading at once).
  std::uint64_t epochs_interleaved = 0;
  std::vector<std::uint64_t> step_downs;  // per broker: times it stepped down for a newer epoch
  double downtime_gap_s = 2;
  /// Merged compute / (M × the run's wall time), the same for the reference; and
  /// the share of the run without a stall longer than the gap, whatever its cause.
  double goodput = 0, reference_goodput = 0, uptime = 1;
  /// Per fragment, the share of the run in which it advanced (no gap longer than
  /// fragment_gap_s: a few of its turns); their mean: a shard outage is partial downtime.
  std::vector<double> fragment_availability;
  double availability = 1, fragment_gap_s = 2;
  /// Committed (durable, and so visible: a learner may have installed them)
  /// fragment versions a restarted shard did not restore.
  std::uint64_t committed_rounds_lost = 0;
  /// Tokens of steps a killed learner took whose Progress died with it: no broker
  /// can count them. The ledger is exact when it is balanced and its processed
  /// tokens plus these equal the tokens the learners processed.
  std::uint64_t unreported_tokens = 0;
  bool ledger_exact = false;
  /// The plan's [pass] participation: the least mean participation (the last leading
  /// broker's, run.broker.participation) that passes; 0: no such criterion.
  double min_participation = 0;
  std::uint64_t chaos_commands = 0, chaos_commands_failed = 0;
  nanos clock_zero_ns = 0;  // the chaos monkey's start on the mesh's clock (broker records use that clock)
};

/// The compute budget a drill uses when mesh.step_time_ms is 0: measured here
/// from a few steps of the model, scaled so every learner of the mesh fits on
/// the machine's cores with headroom.
double calibrate_step_time_ms(const config& cfg);

/// Runs the plan of `options` (and its fault-free reference, unless turned off).
/// The meshes' lines (and the drill's own) go to `log`.
expected<drill_report> run_drill(const config& cfg, logger& log, const drill_options& options,
                                 const mesh_progress& progress, const std::function<bool()>& stop_requested);

/// The configuration a drill's mesh runs with: time-bounded by the plan's phases,
/// paced at `step_time_ms`, obeying the chaos monkey.
config drill_config(const config& base, const fault_plan_spec& plan, double step_time_ms);

/// What the drill sees of a mesh at one moment, from its nodes' statuses: the
/// one way both kinds of drill observe a mesh. `t_s` is on the drill's clock.
drill_sample sample_of(const status_board& board, const chaos_log& log, const mesh_setup& setup, double t_s);

/// When each learner incarnation was first merged, as seen while the drill runs:
/// a restarted broker restores its ledger but not these times.
class first_merges {
 public:
  /// Takes the earliest time any broker report gives, or `now` for a learner the
  /// report shows merged without a time.
  void observe(const broker_report& report, nanos now);
  /// Applies the earliest times to `report`'s records.
  void apply(broker_report& report) const;

 private:
  std::map<learner_ref, nanos> first_;
};

/// A directory for a drill's stores (and logs): removed at the end when the drill
/// made it (no --work-dir) unless `keep` is set (a failed run keeps its logs).
struct drill_work_area {
  std::filesystem::path dir;
  bool owned = false, keep = false;
  drill_work_area() = default;
  drill_work_area(const drill_work_area&) = delete;
  drill_work_area& operator=(const drill_work_area&) = delete;
  ~drill_work_area();
  /// `work_dir`, created if missing; empty: a new temporary directory.
  static expected<std::unique_ptr<drill_work_area>> open(const std::string& work_dir);
  /// The path `name` inside it, cleared of what an earlier drill left there.
  expected<std::filesystem::path> fresh(const std::string& name) const;
};

/// A drill before its runs: its plan checked and scaled, its mesh's
/// configuration (time-bounded, paced), layout and policy, the work area for
/// its stores, and the report's header (plan, mode, seed, shape, phases, pace).
struct prepared_drill {
  fault_plan_spec plan;
  sync_policy policy;
  config cfg;
  sync_policy reference_policy;  // the reference's mode (drill_options::reference_mode)
  config reference_cfg;
  mesh_setup layout;
  std::unique_ptr<drill_work_area> area;
  drill_report report;
};
expected<prepared_drill> prepare_drill(const config& base, const drill_options& o);

/// `progress` with every line prefixed by the phase's name.
mesh_progress phase_progress(const mesh_progress& progress, std::string name);
/// `base` with mesh.mode = `mode` (drill_options::reference_mode; empty: unchanged), checked.
expected<config> with_reference_mode(const config& base, const std::string& mode);
/// The reference run's phase name; it names the reference's mode when it is not the drill's.
std::string reference_phase(const drill_report& r);

/// The figures of a drill once its run (r.run, r.samples) is in: the timeline's
/// rows and rejoin times, tokens killed learners never reported, the brokers'
/// epochs from their tapes (`broker_dbs`: the brokers' stores after the run, one
/// missing if its host was lost) and the takeovers, downtime, goodput and the
/// ledger's exactness. Shared by the one-process and the many-process drill.
void finish_drill_report(drill_report& r, mesh_drill& drill, const config& cfg, const mesh_setup& layout,
                         const std::vector<std::string>& broker_dbs, logger& log);

}  // namespace archipelago
