#pragma once
// archipelago bench ablate: the paper's ablations on the one-process mesh —
// merge (RDA vs weighted mean), encoding (outer-gradient precision), quorum
// (K and grace under heterogeneous learner speeds), fragments (P) — each
// variant on the same seeds and budget, against a reference variant measured
// in the same run (cmd_bench_ablate.cpp).

#include <CLI/CLI.hpp>

namespace archipelago::cli {

/// Adds the `ablate` subcommand to the `bench` subcommand.
void add_bench_ablate(CLI::App& bench);

/// Runs `bench ablate` if it was the subcommand parsed; otherwise returns
/// exit_bad_input, so the bench runner can chain it like run_bench_wire().
int run_bench_ablate();

}  // namespace archipelago::cli
