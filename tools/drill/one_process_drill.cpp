// The drill's mesh in this process: run_local_mesh with the chaos monkey, its
// "processes" the actors.

#include "drill/drill.hpp"
#include "drill/process_drill.hpp"

namespace archipelago {

expected<drill_report> run_drill(const config& base, logger& log, const drill_options& o, const mesh_progress& progress,
                                 const std::function<bool()>& stop_requested) {
  if (!o.binary.empty()) return run_process_drill(base, log, o, progress, stop_requested);
  auto prepared = prepare_drill(base, o);
  if (!prepared) return prepared.err();
  const config& cfg = prepared->cfg;
  const mesh_setup& layout = prepared->layout;
  drill_work_area& area = *prepared->area;
  drill_report& r = prepared->report;
  auto db = area.fresh("drill.db");
  if (!db) return db.err();
  mesh_snapshots snaps;
  snaps.db = db->string();
  // With standbys every broker keeps a store of its own, as across processes (a lost
  // host takes its store along); without, the broker writes to the run's store.
  std::vector<std::string> broker_dbs{snaps.db};
  if (prepared->plan.standbys > 0) {
    broker_dbs.clear();
    for (int b = 0; b <= prepared->plan.standbys; ++b) {
      auto dir = area.fresh("broker-" + std::to_string(b) + ".db");
      if (!dir) return dir.err();
      broker_dbs.push_back(dir->string());
    }
    snaps.broker_dbs = broker_dbs;
  }
  mesh_drill drill;
  drill.timeline = expand_fault_plan(prepared->plan, cfg.mesh.learners);
  drill.safety_ns = prepared->plan.duration_ns;
  first_merges merges;
  drill.sample = [&](nanos since_start, const status_board& board) {
    r.samples.push_back(sample_of(board, drill.log, layout, static_cast<double>(since_start) * 1e-9));
    if (const auto b = board.leading_broker(); b && b->now.report) {
      std::lock_guard lock(drill.log.mutex);  // the report's times are on the mesh's clock
      merges.observe(*b->now.report, drill.log.started_ns + since_start);
    }
  };
  auto run = run_local_mesh(cfg, log, phase_progress(progress, "drill"), stop_requested, snaps, &drill);
  if (!run) return make_error(run.err().code, "the drill: " + run.err().message);
  r.run = std::move(*run);
  merges.apply(r.run.broker);
  r.chaos_commands = drill.log.commands_sent.load();
  r.chaos_commands_failed = drill.log.commands_failed.load();
  // The reference runs after the drill, fault-free, until it has processed the
  // drill's tokens (or for as long): eval loss is compared at equal tokens.
  if (o.reference) {
    auto ref_db = area.fresh("reference.db");
    if (!ref_db) return ref_db.err();
    mesh_snapshots ref_snaps;
    ref_snaps.db = ref_db->string();
    mesh_eval equal_tokens;
    equal_tokens.stop_tokens = r.run.tokens;
    auto ref = run_local_mesh(prepared->reference_cfg, log, phase_progress(progress, reference_phase(r)), stop_requested, ref_snaps,
                              nullptr, {}, equal_tokens);
    if (!ref) return make_error(ref.err().code, "the fault-free reference run: " + ref.err().message);
    r.reference = std::move(*ref);
    if (stop_requested()) return make_error(errc::timeout, "stopped by a signal during the reference run");
  }
  finish_drill_report(r, drill, cfg, layout, broker_dbs, log);
  return std::move(r);
}

}  // namespace archipelago
