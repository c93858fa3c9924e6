#include "cli_common.hpp"

#include "core/layout.hpp"

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace archipelago::cli {

std::atomic<bool> stop_requested{false};

namespace {
extern "C" void on_stop_signal(int) { stop_requested.store(true); }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int report(const error& err) {
  std::cerr << "archipelago: " << err.message << "\n";
  return err.how() == reaction::fix_input ? exit_bad_input : exit_failure;
}

int report_input(const error& err) {
  report(err);
  return err.code == errc::internal ? exit_failure : exit_bad_input;
}

void config_flags::add_to(CLI::App& app) {
  app.add_option("--config", config_file, "TOML configuration file (knobs: archipelago config --knobs)");
  app.add_option("--set", assignments, "Override one knob: --set section.key=value (repeatable)");
}

void config_flags::add_shortcut(CLI::App& app, const std::string& flag, const std::string& key,
                                const std::string& value_name, const std::string& help) {
  shortcut_values_.push_back(std::make_unique<std::string>());
  shortcut_keys_.emplace_back(flag, key);
  app.add_option(flag, *shortcut_values_.back(), help + " (knob " + key + ")")->type_name(value_name);
}

expected<config> config_flags::resolve(const config& defaults) const {
  config cfg = defaults;
  if (!config_file.empty())
    if (auto ok = apply_toml_file(cfg, config_file); !ok) return ok.err();
  for (std::size_t i = 0; i < shortcut_keys_.size(); ++i) {
    const std::string& value = *shortcut_values_[i];
    if (value.empty()) continue;
    if (auto ok = set_knob(cfg, shortcut_keys_[i].second, value); !ok)
      return make_error(errc::invalid_input, shortcut_keys_[i].first + ": " + ok.err().message);
  }
  for (const auto& a : assignments)
    if (auto ok = set_knob_assignment(cfg, a); !ok) return make_error(errc::invalid_input, "--set " + ok.err().message);
  if (auto ok = validate(cfg); !ok) return ok.err();
  return cfg;
}

progress_line::progress_line(logger& log, int plain_every)
    : log_(log), tty_(isatty(STDERR_FILENO) != 0 && log.options().format == log_format::text && log.enabled(log_level::info)),
      plain_every_(plain_every) {}

void progress_line::update(const std::string& text, bool force_plain) {
  if (tty_) {  // a terminal's live line, not a log line: it is rewritten in place
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
    dirty_ = true;
  } else if (force_plain || (plain_every_ > 0 && (count_ + 1) % plain_every_ == 0)) {
    log_.info("progress", "%s", text.c_str());
  }
  ++count_;
}

void progress_line::finish() {
  if (tty_ && dirty_) std::fprintf(stderr, "\n");
  dirty_ = false;
}

void log_flags::add_to(CLI::App& app) {
  app.add_option("--log-level", level, "Lines below this level are not written: debug, info, warn, error or off")
      ->capture_default_str();
  app.add_option("--log-format", format, "text, or json: one JSON object per line (ts, level, kind, msg)")
      ->capture_default_str();
  app.add_option("--log-burst", burst, "Lines of one kind written per interval; the rest are counted in one summary line")
      ->check(CLI::Range(1, 10000))->capture_default_str();
  app.add_option("--log-interval-s", interval_s, "The rate limit's interval, seconds")
      ->check(CLI::Range(0.001, 3600.0))->capture_default_str();
}

expected<log_options> log_flags::resolve() const {
  log_options o;
  auto l = parse_log_level(level);
  if (!l) return make_error(errc::invalid_input, "--log-level: " + l.err().message);
  auto f = parse_log_format(format);
  if (!f) return make_error(errc::invalid_input, "--log-format: " + f.err().message);
  o.level = *l;
  o.format = *f;
  o.burst = burst;
  o.interval_ns = static_cast<nanos>(interval_s * 1e9);
  return o;
}

void add_metrics_flags(CLI::App& app, metrics_endpoint& where) {
  app.add_option("--metrics-port", where.port,
                 "Serve Prometheus metrics at http://HOST:PORT/metrics (and the broker's /status); 0: any free port")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-host", where.host, "The address the metrics port listens on")->capture_default_str();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char buf[32];
  const auto s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}


status check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) return {};
  const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return make_error(errc::invalid_input, flag + " " + path + ": no directory " + dir.string());
  if (std::filesystem::is_directory(path, ec))
    return make_error(errc::invalid_input, flag + " " + path + ": is a directory, not a file");
  return {};
}

status write_text_file(const std::string& flag, const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  if (!f.flush()) return make_error(errc::io_error, flag + " " + path + ": cannot write the file");
  return {};
}

std::string model_size_choices() {
  const auto& names = model_preset_names();
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

std::string shipped_file(const std::string& relative) {
  namespace fs = std::filesystem;
  const fs::path in_tree = fs::path(ARCHIPELAGO_SOURCE_DIR) / relative;
  std::error_code ec;
  if (fs::exists(in_tree, ec)) return in_tree.string();
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path file(relative);
  return (exe.parent_path().parent_path() / "share/archipelago" / file.parent_path().filename() / file.filename())
      .string();
}

}  // namespace archipelago::cli
