#pragma once
// archipelago bench wan: dp, diloco, streaming and decoupled race to one eval
// loss over links shaped like a 12B model's WAN, scaled to this machine; and
// archipelago bench ddp: our dp against PyTorch DDP (gloo) on the same machine
// (cmd_bench_wan.cpp).

#include <CLI/CLI.hpp>

namespace archipelago::cli {

/// Adds the `wan` and `ddp` subcommands to the `bench` subcommand.
void add_bench_wan(CLI::App& bench);

/// Runs `bench wan` or `bench ddp` if one was the subcommand parsed; otherwise
/// returns exit_bad_input, so the bench runner can chain it.
int run_bench_wan();

}  // namespace archipelago::cli
