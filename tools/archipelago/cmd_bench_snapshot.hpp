#pragma once
// archipelago bench snapshot: what versioned snapshots (storage/) cost — round
// latency with snapshots on vs off, commit throughput vs a plain RocksDB write
// loop, restore time vs a plain RocksDB read — measured in the same run
// (cmd_bench_snapshot.cpp).

#include <CLI/CLI.hpp>

namespace archipelago::cli {

/// Adds the `snapshot` subcommand to the `bench` subcommand.
void add_bench_snapshot(CLI::App& bench);

/// Runs `bench snapshot` if it was the subcommand parsed; otherwise returns
/// exit_bad_input, so the bench runner can chain it like run_bench_wire().
int run_bench_snapshot();

}  // namespace archipelago::cli
