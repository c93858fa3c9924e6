#pragma once
// Shared plumbing of the archipelago subcommands: configuration flags, exit
// codes, signal handling, the live progress line and the --json summary line.

#include <CLI/CLI.hpp>

#include "core/json_line.hpp"
#include "node/metrics_server.hpp"

#include <atomic>
#include <memory>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/ledger_totals.hpp"
#include "core/log.hpp"

namespace archipelago::cli {

/// Exit codes: 0 success, 1 failure at run time, 2 bad input (flag, config, file).
inline constexpr int exit_ok = 0;
inline constexpr int exit_failure = 1;
inline constexpr int exit_bad_input = 2;

/// Prints "archipelago: <message>" on stderr and returns the exit code for it.
int report(const error& err);
/// The same, for errors in a file or store the user named as input: a missing,
/// foreign, unreadable or corrupt one is bad input (exit 2), like a bad flag.
int report_input(const error& err);

/// --config FILE, --set key=value and the shortcut flags every training command takes.
struct config_flags {
  std::string config_file;
  std::vector<std::string> assignments;

  /// Registers --config and --set on `app`.
  void add_to(CLI::App& app);
  /// Registers a flag `--name VALUE` that sets knob `key`.
  void add_shortcut(CLI::App& app, const std::string& flag, const std::string& key,
                    const std::string& value_name, const std::string& help);
  /// Defaults (the command's), then the TOML file, then shortcut flags, then --set, then validation.
  expected<config> resolve(const config& defaults = config{}) const;

 private:
  std::vector<std::pair<std::string, std::string>> shortcut_keys_;  // flag storage → key
  std::vector<std::unique_ptr<std::string>> shortcut_values_;
};

/// An output file named by `flag` (--plot, --report): refused before any work starts when
/// its directory does not exist or it is a directory (invalid_input); empty: none asked for.
status check_output_path(const std::string& flag, const std::string& path);
/// Writes `text` to the file `flag` named; an error names both.
status write_text_file(const std::string& flag, const std::string& path, const std::string& text);

/// --log-level, --log-format, --log-burst and --log-interval-s: the process's logger,
/// made in main from these and handed to the command (options of the top-level
/// command, accepted before or after the subcommand's name).
struct log_flags {
  std::string level = "info";
  std::string format = "text";
  int burst = log_options{}.burst;
  double interval_s = static_cast<double>(log_options{}.interval_ns) * 1e-9;

  void add_to(CLI::App& app);
  /// A bad level or format is invalid_input naming the flag and the value.
  expected<log_options> resolve() const;
};

/// --metrics-port PORT and --metrics-host HOST: where a node serves /metrics and /status.
void add_metrics_flags(CLI::App& app, metrics_endpoint& where);

/// Set by SIGINT/SIGTERM; long-running commands poll it and stop cleanly.
extern std::atomic<bool> stop_requested;
void install_stop_handlers();

/// A status line rewritten in place on a terminal (text logs only), otherwise
/// an info line of kind "progress" on `log` every `plain_every` updates (so logs
/// get some progress without flooding).
class progress_line {
 public:
  explicit progress_line(logger& log, int plain_every = 0);
  void update(const std::string& text, bool force_plain = false);
  void finish();

 private:
  logger& log_;
  bool tty_;
  int plain_every_;
  int count_ = 0;
  bool dirty_ = false;
};

using archipelago::json_escape;
using archipelago::json_line;
std::string format_duration(double seconds);

/// The model presets for a flag's help, from the preset table: "nano, micro, mini or small".
std::string model_size_choices();

/// A file shipped with the binary, named by its path in the source tree (e.g.
/// "tools/bench/torch_reference.py"): there, while the tree this binary was built from
/// exists; else where `cmake --install` and the package put it, under the prefix the binary
/// runs from (bin/..): share/archipelago/bench/torch_reference.py.
std::string shipped_file(const std::string& relative);

}  // namespace archipelago::cli
