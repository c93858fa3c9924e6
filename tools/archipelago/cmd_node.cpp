// archipelago node: one mesh role per process, over tcp:// (deploy/launch.py
// starts a whole mesh of them on loopback).

#include <cstdio>
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"
#include "learner/model/trainer.hpp"
#include "node/node_process.hpp"

namespace archipelago::cli {
namespace {

struct node_cli {
  config_flags flags;
  std::string role_name;
  std::uint32_t index = 0;
  node_options options;
  bool json = false;
};

int run_node_command(node_cli& n, logger& log) {
  auto cfg = n.flags.resolve();
  if (!cfg) return report(cfg.err());
  node_options o = n.options;
  o.index = n.index;
  o.kind = n.role_name == "broker" ? role::sync_broker : n.role_name == "shard" ? role::parameter_shard : role::learner;
  if (o.kind == role::learner) {  // train.precision = bf16 on a CPU without it: one line, then fp32
    std::string note;
    (void)dense_backend_for(cfg->train, note);
    if (!note.empty()) log.warn("train.precision", "%s", note.c_str());
  }
  install_stop_handlers();
  progress_line progress(log, 4);
  auto result = run_node(*cfg, log, o, [&](const std::string& line) { progress.update(line); },
                         [] { return stop_requested.load(); });
  progress.finish();
  if (!result) return report(result.err());
  const node_result& r = *result;
  const ledger_totals& l = r.broker.ledger;
  if (o.kind == role::learner)
    std::printf("%s (incarnation %llu): %llu steps, %llu tokens in %.1f s, %.1f s waiting\n",
                r.address.to_string().c_str(), static_cast<unsigned long long>(r.inc.value),
                static_cast<unsigned long long>(r.steps), static_cast<unsigned long long>(r.tokens), r.wall_s,
                r.wait_s);
  else if (o.kind == role::sync_broker)
    std::printf("broker: %llu rounds in %.1f s, uptime %.1f %%, fragment availability %.1f %%; ledger merged %llu, "
                "late %llu, overwritten %llu, lost %llu, rejected %llu of %llu tokens\n",
                static_cast<unsigned long long>(r.rounds), r.wall_s, 100 * r.broker.uptime,
                100 * r.broker.availability(), static_cast<unsigned long long>(l.merged),
                static_cast<unsigned long long>(l.late), static_cast<unsigned long long>(l.overwritten),
                static_cast<unsigned long long>(l.lost), static_cast<unsigned long long>(l.rejected),
                static_cast<unsigned long long>(l.processed));
  else
    std::printf("%s: %llu versions published, %llu contributions rejected\n", r.address.to_string().c_str(),
                static_cast<unsigned long long>(r.published), static_cast<unsigned long long>(r.rejected));
  if (n.json) {
    json_line j;
    j.add("command", "node").add("role", n.role_name).add("index", static_cast<std::int64_t>(o.index))
        .add("incarnation", static_cast<std::int64_t>(r.inc.value)).add("wall_s", r.wall_s);
    if (o.kind == role::learner) {
      j.add("steps", static_cast<std::int64_t>(r.steps)).add("tokens", static_cast<std::int64_t>(r.tokens))
          .add("wait_s", r.wait_s).add("budget_overruns", static_cast<std::int64_t>(r.budget_overruns));
    } else if (o.kind == role::sync_broker) {
      // Times in seconds since the broker started (-1: never).
      auto since_start = [&](nanos t) { return t < 0 ? -1.0 : static_cast<double>(t - r.broker.started_ns) * 1e-9; };
      std::string learners = "[";
      for (const learner_record& rec : r.broker.learners) {
        json_line e;
        e.add("learner", static_cast<std::int64_t>(rec.who.learner.value))
            .add("incarnation", static_cast<std::int64_t>(rec.who.inc.value))
            .add("processed", static_cast<std::int64_t>(rec.ledger.processed))
            .add("merged", static_cast<std::int64_t>(rec.ledger.merged))
            .add("merged_step_time_s", rec.ledger.merged_step_time_s)
            .add("joined_s", since_start(rec.joined_ns))
            .add("first_merged_s", since_start(rec.first_merged_ns))
            .add("left_s", since_start(rec.left_ns));
        learners += (learners.size() > 1 ? "," : "") + e.str();
      }
      // The wall-clock moment the times below count from: when this broker began to lead.
      const double led_from_s =
          r.started_unix_s + (r.leading ? static_cast<double>(r.broker.started_ns - r.started_steady_ns) * 1e-9 : 0.0);
      j.add("started_unix_ms", static_cast<std::int64_t>(led_from_s * 1000)).add("rounds", static_cast<std::int64_t>(r.rounds)).add("uptime", r.broker.uptime)
          .add_raw("ledger", ledger_json(l)).add("ledger_balanced", l.balanced()).add_raw("learners", learners + "]")
          .add("committed", r.committed).add("leading", r.leading);
    } else {
      j.add("published", static_cast<std::int64_t>(r.published)).add("rejected", static_cast<std::int64_t>(r.rejected))
          .add("resumed_version", r.resumed_version).add("mesh_version", r.mesh_version);
    }
    j.add_raw("status", to_json(r.status));  // what a drill across processes reads
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_node_command(CLI::App& app) {
  auto n = std::make_shared<node_cli>();
  CLI::App* cmd = app.add_subcommand("node", "Run one mesh role in this process, over tcp://");
  cmd->add_option("--role", n->role_name, "broker, shard or learner")
      ->required()
      ->check(CLI::IsMember({"broker", "shard", "learner"}));
  cmd->add_option("--index", n->index, "Shard or learner index (from 0); a standby broker's (from 1)");
  cmd->add_option("--broker", n->options.broker_endpoints,
                  "The brokers' endpoints, tcp://HOST:PORT, comma-separated: the primary's, then each standby's")
      ->required()
      ->delimiter(',');
  cmd->add_flag("--standby", n->options.standby,
                "Broker: a standby, broker --index I of --broker (from 1): it keeps the leader's ledger and tape "
                "and takes over when the leader is declared dead");
  cmd->add_option("--shards", n->options.shard_endpoints, "Every shard's endpoint, comma-separated, in index order")
      ->required()
      ->delimiter(',');
  cmd->add_option("--listen", n->options.listen,
                  "Where to bind. Learners announce it (default tcp://127.0.0.1:0); the broker and shards bind it "
                  "instead of their own --broker / --shards entry, e.g. tcp://0.0.0.0:PORT behind a DNS name");
  cmd->add_option("--db", n->options.db,
                  "Shard: keep versioned snapshots in this RocksDB directory and resume from it after a crash; "
                  "broker: keep the round tape and the ledger there");
  cmd->add_option("--resume-from", n->options.resume_from,
                  "Start from the newest snapshot of this store (replay save, or a run --db): a shard with --db "
                  "whose store is new takes its fragments from it (a store holding versions continues its own); "
                  "a learner takes up the learning-rate schedule at its step; a broker numbers its rounds after "
                  "the snapshot's");
  cmd->add_flag("--record-contributions", n->options.record_contributions,
                "Shard with --db: also record every merged contribution (replay verify)");
  n->flags.add_shortcut(*cmd, "--mode", "mesh.mode", "MODE", "dp, diloco, streaming or decoupled");
  n->flags.add_shortcut(*cmd, "--learners", "mesh.learners", "M", "Learners in the mesh");
  n->flags.add_shortcut(*cmd, "--steps", "train.steps", "N", "Inner steps per learner");
  n->flags.add_to(*cmd);
  add_metrics_flags(*cmd, n->options.metrics);
  cmd->add_flag("--json", n->json, "Print a one-line JSON summary last");
  return [n](logger& log) { return run_node_command(*n, log); };
}

}  // namespace archipelago::cli
