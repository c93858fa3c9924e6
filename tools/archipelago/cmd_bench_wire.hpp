#pragma once
// archipelago bench wire: the node transport against raw ZeroMQ, measured in
// the same run (cmd_bench_wire.cpp).

#include <CLI/CLI.hpp>

namespace archipelago::cli {

/// Adds the `wire` subcommand to the `bench` subcommand.
void add_bench_wire(CLI::App& bench);

/// Runs `bench wire` if it was the subcommand parsed; otherwise returns
/// exit_bad_input, so the bench runner can end with `return run_bench_wire();`.
int run_bench_wire();

}  // namespace archipelago::cli
