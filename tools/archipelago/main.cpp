// archipelago: one executable with git-like subcommands.

#include <CLI/CLI.hpp>

#include <malloc.h>

#include <iostream>
#include <map>

#include "cli_common.hpp"
#include "cmd_keygen.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
  using namespace archipelago::cli;
  // Fragments of megabytes are received and freed continuously; served from
  // mmap they cost a fresh zeroed page fault per 4 KiB every time. Keeping them
  // in the heap makes the memory reusable (measured in bench wire).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  CLI::App app{"archipelago: Decoupled DiLoCo training on unreliable, mixed, far-apart machines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "archipelago 0.1.0");
  app.fallthrough();  // the top level's options (--log-*) may follow the subcommand's name
  log_flags log_cli;
  log_cli.add_to(app);

  std::map<CLI::App*, runner> runners;
  auto add = [&](runner (*adder)(CLI::App&)) {
    runner r = adder(app);
    runners[app.get_subcommands({}).back()] = std::move(r);
  };
  add(add_run_command);
  add(add_node_command);
  add(add_replay_command);
  add(add_drill_command);
  add(add_status_command);
  add(add_set_command);
  add(add_simulate_command);
  add(add_train_command);
  add(add_sample_command);
  add(add_bench_command);
  add(add_config_command);
  add(add_keygen_command);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "archipelago: " << e.what() << " (see --help)\n";
    return exit_bad_input;
  }
  auto log_settings = log_cli.resolve();
  if (!log_settings) return report(log_settings.err());
  // The process's one logger: every command, role, transport and store logs
  // through it (handed down, never global); its clock drives the rate limit.
  archipelago::steady_clock_source clock;
  archipelago::logger log(*log_settings, clock);
  for (auto& [sub, run] : runners)
    if (sub->parsed()) return run(log);
  return exit_bad_input;
}
