#pragma once
// Each subcommand registers itself on the CLI11 app and returns a runner that
// yields the process exit code, given the process's logger (made in main).

#include <CLI/CLI.hpp>

#include <functional>

#include "core/log.hpp"

namespace archipelago::cli {

using runner = std::function<int(logger& log)>;

runner add_train_command(CLI::App& app);
runner add_sample_command(CLI::App& app);
runner add_bench_command(CLI::App& app);
runner add_config_command(CLI::App& app);
runner add_run_command(CLI::App& app);
runner add_node_command(CLI::App& app);
runner add_replay_command(CLI::App& app);
runner add_drill_command(CLI::App& app);
runner add_status_command(CLI::App& app);
runner add_set_command(CLI::App& app);
runner add_simulate_command(CLI::App& app);
/// `simulate wan` on the simulate command (cmd_simulate_wan.cpp).
runner add_simulate_wan(CLI::App& simulate);

}  // namespace archipelago::cli
