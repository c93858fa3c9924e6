#pragma once
// archipelago bench: each benchmark's command (flags, then a call into the
// bench library, tools/bench, then its report and --json line). `bench
// compute` lives in cmd_bench.cpp with the `bench` command itself; the others
// register on it from their own files.

#include <CLI/CLI.hpp>

#include <string>

#include "bench/bench_hooks.hpp"
#include "cli_common.hpp"

namespace archipelago::cli {

/// Each adds its subcommand(s) to the `bench` subcommand.
void add_bench_wire(CLI::App& bench);
void add_bench_snapshot(CLI::App& bench);
void add_bench_wan(CLI::App& bench);  // `wan` and `ddp`
void add_bench_ablate(CLI::App& bench);
void add_bench_parity(CLI::App& bench);

/// Each runs its subcommand if it was the one parsed; otherwise returns
/// exit_bad_input, so the bench runner can chain them.
int run_bench_wire(logger& log);
int run_bench_snapshot(logger& log);
int run_bench_wan(logger& log);  // `wan` or `ddp`
int run_bench_ablate(logger& log);
int run_bench_parity(logger& log);

/// A bench's hooks on the command line: its status on `progress` (a stage's
/// first line also in a log), its meshes' lines on `log`, stopped by SIGINT or SIGTERM.
inline bench_hooks progress_hooks(progress_line& progress, logger& log) {
  bench_hooks h;
  h.log = &log;
  h.progress = [&progress](const std::string& text) { progress.update(text); };
  h.stage = [&progress](const std::string& text) { progress.update(text, true); };
  h.stop = [] { return stop_requested.load(); };
  return h;
}

}  // namespace archipelago::cli
