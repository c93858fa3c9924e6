// archipelago run: a whole mesh in one process (inproc://) — the embedded default.

#include <cmath>
#include <cstdio>
#include <memory>

#include "cmd_run.hpp"
#include "commands.hpp"
#include "learner/model/checkpoint.hpp"
#include "learner/model/trainer.hpp"
#include "node/mesh_snapshots.hpp"
#include "report/run_report.hpp"

namespace archipelago::cli {

int run_mesh_command(const run_options& o, logger& log) {
  config defaults = run_defaults();
  if (!o.snapshots.resume_db.empty()) {  // the stored run's configuration, unless flags override it
    auto store = open_store_read_only(o.snapshots.resume_db);
    if (!store) return report_input(store.err());
    auto stored = config_of((*store)->info());
    if (!stored) return report_input(stored.err());
    defaults = *stored;
  }
  auto cfg = o.flags.resolve(defaults);
  if (!cfg) return report(cfg.err());
  if (auto ok = validate_mesh(*cfg); !ok) return report(ok.err());
  install_stop_handlers();
  progress_line progress(log, 4);
  std::string precision_note;
  const bool bf16 = dense_backend_for(cfg->train, precision_note) == dense_backend::bf16;
  if (!precision_note.empty()) std::printf("%s\n", precision_note.c_str());
  std::printf("mesh: mode %s, %d learners, %d shards, model %s (%s GEMMs), corpus %s\n", cfg->mesh.mode.c_str(),
              cfg->mesh.learners, cfg->mesh.shards, cfg->model.size.c_str(), bf16 ? "bf16" : "fp32",
              cfg->data.corpus.empty() ? "synthetic" : cfg->data.corpus.c_str());
  std::fflush(stdout);
  auto summary = run_local_mesh(*cfg, log, [&](const std::string& line) { progress.update(line); },
                                [] { return stop_requested.load(); }, o.snapshots, nullptr, o.metrics, o.eval,
                                o.admin_endpoint);
  progress.finish();
  if (!summary) return report(summary.err());
  const mesh_summary& s = *summary;
  if (s.resumed_from)
    std::printf("resumed from version %llu of %s (eval loss there %.4f; learners' schedule at step %lld)\n",
                static_cast<unsigned long long>(s.resumed_from), o.snapshots.resume_db.c_str(), s.start_eval_loss,
                static_cast<long long>(s.start_step));
  if (s.warm_start_steps > 0)
    std::printf("warm start: the first %llu steps per learner as dp (%llu tokens), then %s; participation, uptime "
                "and availability below are %s's\n",
                static_cast<unsigned long long>(s.warm_start_steps), static_cast<unsigned long long>(s.warm_start_tokens),
                s.mode.c_str(), s.mode.c_str());
  const ledger_totals& l = s.broker.ledger;
  std::printf("ran %.1f s: %llu steps, %llu tokens; %llu rounds (%.2f members each), %llu versions published; "
              "participation %.1f %% (members merged / live learners, mean over %llu rounds)\n",
              s.wall_s, static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.tokens),
              static_cast<unsigned long long>(s.rounds), s.mean_members,
              static_cast<unsigned long long>(s.published), 100 * s.broker.participation,
              static_cast<unsigned long long>(s.broker.participation_rounds));
  std::printf("token ledger (token-shares per fragment): merged %llu, late %llu, overwritten %llu, lost %llu, "
              "rejected %llu = %llu processed (%s)\n",
              static_cast<unsigned long long>(l.merged), static_cast<unsigned long long>(l.late),
              static_cast<unsigned long long>(l.overwritten), static_cast<unsigned long long>(l.lost),
              static_cast<unsigned long long>(l.rejected), static_cast<unsigned long long>(l.processed),
              s.ledger_exact ? "exact" : "NOT EXACT");
  std::printf("goodput %.1f %%, uptime %.1f %%, fragment availability %.1f %%, waiting %.1f %%; %.1f MB on the wire; "
              "broker CPU %.3f ms/round\n",
              100 * s.goodput, 100 * s.broker.uptime, 100 * s.broker.availability(), 100 * s.wait_share,
              static_cast<double>(s.bytes_on_wire) / 1e6,
              s.rounds ? 1e3 * s.broker.broker_cpu_s / static_cast<double>(s.rounds) : 0.0);
  std::printf("global model: eval loss %.4f nats/byte = %.4f bits/byte", s.eval_loss, s.eval_bpb);
  if (!std::isnan(s.entropy_floor_bpb)) std::printf(" (entropy floor %.4f)", s.entropy_floor_bpb);
  std::printf("\n");
  if (!o.snapshots.db.empty())
    std::printf("snapshots in %s: last version %llu, %llu fragment versions committed%s%s\n", o.snapshots.db.c_str(),
                static_cast<unsigned long long>(s.mesh_version), static_cast<unsigned long long>(s.committed),
                s.snapshot_errors ? ", NOT ALL: " : "",
                s.snapshot_errors ? (std::to_string(s.snapshot_errors) + " failed or skipped").c_str() : "");
  if (!o.out.empty()) {
    checkpoint ckpt;
    ckpt.shape = *resolve_model(cfg->model);
    ckpt.params = s.global_params;
    ckpt.steps = s.steps;
    ckpt.tokens = s.tokens;
    ckpt.train_loss = std::nan("");
    ckpt.eval_loss = s.eval_loss;
    ckpt.corpus = cfg->data.corpus.empty() ? "synthetic" : cfg->data.corpus;
    ckpt.seed = cfg->train.seed;
    if (auto ok = save_checkpoint(o.out, ckpt); !ok) return report(ok.err());
    std::printf("global model written to %s (archipelago sample --checkpoint %s)\n", o.out.c_str(), o.out.c_str());
  }
  if (!o.report.empty()) {
    if (auto ok = write_text_file("--report", o.report, run_report_html(s, *cfg)); !ok) return report(ok.err());
    std::printf("report: %s\n", o.report.c_str());
  }
  if (o.json) {
    json_line j;
    j.add("command", "run")
        .add("mode", s.mode)
        .add("learners", s.learners)
        .add("shards", s.shards)
        .add("fragments", s.fragments)
        .add("steps", static_cast<std::int64_t>(s.steps))
        .add("tokens", static_cast<std::int64_t>(s.tokens))
        .add("wall_s", s.wall_s)
        .add("eval_loss", s.eval_loss)
        .add("eval_bpb", s.eval_bpb)
        .add("entropy_floor_bpb", s.entropy_floor_bpb)
        .add("goodput", s.goodput)
        .add("uptime", s.broker.uptime)
        .add("availability", s.broker.availability())
        .add("wait_share", s.wait_share)
        .add("rounds", static_cast<std::int64_t>(s.rounds))
        .add("published", static_cast<std::int64_t>(s.published))
        .add("mean_members", s.mean_members)
        .add("participation", s.broker.participation)
        .add("participation_rounds", static_cast<std::int64_t>(s.broker.participation_rounds))
        .add_raw("ledger", ledger_json(l))
        .add("ledger_exact", s.ledger_exact)
        .add("closed_grace_expired", static_cast<std::int64_t>(s.broker.closed_grace_expired))
        .add("closed_all_eligible", static_cast<std::int64_t>(s.broker.closed_all_eligible))
        .add("closed_timeout", static_cast<std::int64_t>(s.broker.closed_timeout))
        .add("refetches", static_cast<std::int64_t>(s.refetches))
        .add("broker_cpu_ms_per_round", s.rounds ? 1e3 * s.broker.broker_cpu_s / static_cast<double>(s.rounds) : 0.0)
        .add("bytes_on_wire", static_cast<std::int64_t>(s.bytes_on_wire))
        .add("checkpoint", o.out)
        .add("report", o.report)
        .add("db", o.snapshots.db)
        .add("mesh_version", s.mesh_version)
        .add("resumed_from", s.resumed_from)
        .add("warm_start_steps", static_cast<std::int64_t>(s.warm_start_steps))
        .add("warm_start_tokens", static_cast<std::int64_t>(s.warm_start_tokens))
        .add("start_step", static_cast<std::int64_t>(s.start_step))
        .add("start_eval_loss", s.resumed_from ? s.start_eval_loss : std::nan(""))
        .add("committed", s.committed)
        .add("snapshot_errors", s.snapshot_errors);
    std::printf("%s\n", j.str().c_str());
  }
  return s.snapshot_errors ? exit_failure : exit_ok;
}

void add_run_flags(CLI::App& cmd, run_options& o) {
  o.flags.add_shortcut(cmd, "--mode", "mesh.mode", "MODE", "dp, diloco, streaming or decoupled");
  o.flags.add_shortcut(cmd, "--learners", "mesh.learners", "M", "Learners");
  o.flags.add_shortcut(cmd, "--shards", "mesh.shards", "S", "Parameter shards");
  o.flags.add_shortcut(cmd, "--model", "model.size", "SIZE", "Model size: " + model_size_choices());
  o.flags.add_shortcut(cmd, "--corpus", "data.corpus", "FILE", "Text file (default: the synthetic corpus)");
  o.flags.add_shortcut(cmd, "--steps", "train.steps", "N", "Inner steps per learner (default 1500)");
  o.flags.add_to(cmd);
  cmd.add_option("--out", o.out, "Write the global model to this checkpoint file (\"\" to skip)")->capture_default_str();
  cmd.add_option("--report", o.report, "Write an HTML report with plots to this file (\"\" to skip)")
      ->capture_default_str();
  cmd.add_flag("--json", o.json, "Print a one-line JSON summary last");
  cmd.add_option("--eval-every-s", o.eval.period_s, "Seconds between evaluations of the global model (default 20)")
      ->check(CLI::Range(0.2, 3600.0));
  cmd.add_option("--db", o.snapshots.db, "Keep versioned snapshots in this RocksDB directory (replay them later)");
  cmd.add_flag("--record-contributions", o.snapshots.record_contributions,
               "With --db: also record every merged contribution, for `replay verify`");
  add_metrics_flags(cmd, o.metrics);
}

runner add_run_command(CLI::App& app) {
  auto o = std::make_shared<run_options>();
  CLI::App* cmd = app.add_subcommand("run", "Run a whole mesh in one process (learners, shards, broker)");
  add_run_flags(*cmd, *o);
  auto* resume = cmd->add_option("--resume", o->snapshots.resume_db,
                                 "Continue the run whose snapshots are in DIR from its newest one (and keep "
                                 "snapshotting there)");
  cmd->get_option("--db")->excludes(resume);
  cmd->add_option("--admin", o->admin_endpoint,
                  "Also bind the broker on this tcp://HOST:PORT for live changes (archipelago set --broker): CURVE "
                  "with the broker's key and wire.allow as `node --role broker`; it hears Reconfigure from an admin "
                  "key only");
  return [o](logger& log) {
    if (!o->snapshots.resume_db.empty()) o->snapshots.db = o->snapshots.resume_db;
    return run_mesh_command(*o, log);
  };
}

}  // namespace archipelago::cli
