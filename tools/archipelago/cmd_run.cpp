// archipelago run: a whole mesh in one process (inproc://) — the embedded default.

#include <cmath>
#include <cstdio>
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"
#include "node/local_mesh.hpp"

namespace archipelago::cli {
namespace {

struct run_options {
  config_flags flags;
  bool json = false;
};

int run_mesh_command(const run_options& o) {
  auto cfg = o.flags.resolve();
  if (!cfg) return report(cfg.err());
  if (auto ok = validate_mesh(*cfg); !ok) return report(ok.err());
  install_stop_handlers();
  progress_line progress(4);
  std::printf("mesh: mode %s, %d learners, %d shards, model %s, corpus %s\n", cfg->mesh.mode.c_str(),
              cfg->mesh.learners, cfg->mesh.shards, cfg->model.size.c_str(),
              cfg->data.corpus.empty() ? "synthetic" : cfg->data.corpus.c_str());
  std::fflush(stdout);
  auto summary = run_local_mesh(*cfg, [&](const std::string& line) { progress.update(line); },
                                [] { return stop_requested.load(); });
  progress.finish();
  if (!summary) return report(summary.err());
  const mesh_summary& s = *summary;
  std::printf("ran %.1f s: %llu steps, %llu tokens; %llu rounds (%.2f members each), %llu versions published\n",
              s.wall_s, static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.tokens),
              static_cast<unsigned long long>(s.rounds), s.mean_members,
              static_cast<unsigned long long>(s.published));
  std::printf("global model: eval loss %.4f nats/byte = %.4f bits/byte", s.eval_loss, s.eval_bpb);
  if (!std::isnan(s.entropy_floor_bpb)) std::printf(" (entropy floor %.4f)", s.entropy_floor_bpb);
  std::printf("\n");
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
        .add("rounds", static_cast<std::int64_t>(s.rounds))
        .add("mean_members", s.mean_members)
        .add("merged_tokens_fragment_sum", static_cast<std::int64_t>(s.merged_tokens))
        .add("late", static_cast<std::int64_t>(s.late))
        .add("rejected", static_cast<std::int64_t>(s.rejected))
        .add("bytes_on_wire", static_cast<std::int64_t>(s.bytes_on_wire));
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_run_command(CLI::App& app) {
  auto o = std::make_shared<run_options>();
  CLI::App* cmd = app.add_subcommand("run", "Run a whole mesh in one process (learners, shards, broker)");
  o->flags.add_shortcut(*cmd, "--mode", "mesh.mode", "MODE", "dp, diloco, streaming or decoupled");
  o->flags.add_shortcut(*cmd, "--learners", "mesh.learners", "M", "Learners");
  o->flags.add_shortcut(*cmd, "--shards", "mesh.shards", "S", "Parameter shards");
  o->flags.add_shortcut(*cmd, "--model", "model.size", "SIZE", "Model size: nano, micro or mini");
  o->flags.add_shortcut(*cmd, "--corpus", "data.corpus", "FILE", "Text file (default: the synthetic corpus)");
  o->flags.add_shortcut(*cmd, "--steps", "train.steps", "N", "Inner steps per learner");
  o->flags.add_to(*cmd);
  cmd->add_flag("--json", o->json, "Print a one-line JSON summary last");
  return [o] { return run_mesh_command(*o); };
}

}  // namespace archipelago::cli
