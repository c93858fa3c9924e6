#pragma once
// archipelago run, shared with `replay resume` (a run started from a snapshot).

#include <CLI/CLI.hpp>

#include <string>

#include "cli_common.hpp"
#include "node/local_mesh.hpp"

namespace archipelago::cli {

struct run_options {
  config_flags flags;
  std::string out = "archipelago-run.ckpt";
  std::string report = "archipelago-run.html";
  bool json = false;
  mesh_snapshots snapshots;
  metrics_endpoint metrics;
  std::string admin_endpoint;  // --admin: the broker also listens there for `archipelago set`
  mesh_eval eval;              // --eval-every-s: seconds between evaluations of Θ
};

/// The training flags of `run` (mode, learners, steps, config, --out, --json, --db, ...).
void add_run_flags(CLI::App& cmd, run_options& o);
/// Runs the mesh; with snapshots.resume_db set, the store's configuration is the default.
int run_mesh_command(const run_options& o, logger& log);

}  // namespace archipelago::cli
