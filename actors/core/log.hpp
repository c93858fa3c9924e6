#pragma once
// The process's logger: levels, a rate limit per message kind, and plain text
// or JSON lines (one object per line, for log collectors). One is made in main
// (or in a test) and passed in, like the clock: the transport, the roles'
// shells and wire layers, storage and the commands take a `logger&`; nothing
// logs through a global.
//
// The rate limit is the logger's, not each call site's: every line names its
// kind ("transport.rejected", "shard.fenced", ...); in each interval the first
// `burst` lines of a kind are written and the rest only counted; the count
// comes out as one summary line of that kind once its interval is over (on the
// next line of any kind, or at flush()). So a kind writes at most burst + 1
// lines per interval, whatever a hostile peer sends, and a line that is cut
// costs no formatting.
//
// spdlog (and fmt) stay in log.cpp: this header is included everywhere, CAF
// translation units too, and stays cheap to parse.

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.hpp"
#include "core/error.hpp"

namespace archipelago {

enum class log_level : std::uint8_t { debug, info, warn, error, off };
enum class log_format : std::uint8_t { text, json };

/// "debug", "info", "warn", "error", "off".
const char* to_string(log_level level);
/// The names to_string gives (and "warning"); anything else is invalid_input naming the value.
expected<log_level> parse_log_level(std::string_view text);
/// "text" or "json"; anything else is invalid_input naming the value.
expected<log_format> parse_log_format(std::string_view text);

struct log_options {
  /// Lines below this level are dropped before the rate limit sees them. Default: info.
  log_level level = log_level::info;
  /// text: "<UTC time> <level> [<kind>] <message>"; json: {"ts","level","kind","msg"[,"suppressed","interval_s"]}.
  /// Default: text.
  log_format format = log_format::text;
  /// Lines of one kind written per interval before the rest are only counted. Default: 10. Bound: [1, 10000].
  int burst = 10;
  /// The rate limit's interval. Default: 10 s. Bound: [1 ms, 1 h].
  nanos interval_ns = 10'000'000'000;
  /// Distinct kinds tracked; lines of further kinds share the kind "other". Default: 256.
  std::size_t kinds_max = 256;
};

/// The per-kind rate limit, pure: time is an argument (tests pass a manual clock's).
class log_rate_limit {
 public:
  /// A kind's interval that ended with lines cut: one summary line says how many.
  struct summary {
    std::string kind;
    log_level level;          // the highest level among the lines cut
    std::uint64_t suppressed;
    nanos interval_ns;        // how long the interval lasted
  };

  log_rate_limit(int burst, nanos interval_ns, std::size_t kinds_max);
  /// Whether a line of `kind` at `now` is written. The summaries of every kind
  /// whose interval is over with lines cut are appended to `due` first.
  bool admit(std::string_view kind, log_level level, nanos now, std::vector<summary>& due);
  /// The summaries of every kind whose interval is over with lines cut.
  void expire(nanos now, std::vector<summary>& due);
  /// The summaries of every kind with lines cut, interval over or not (at exit).
  void drain(nanos now, std::vector<summary>& due);
  std::uint64_t suppressed_total() const { return suppressed_total_; }
  std::size_t kinds() const { return kinds_.size(); }

 private:
  struct window {
    nanos start = 0;
    int written = 0;
    std::uint64_t suppressed = 0;
    log_level level = log_level::debug;
  };
  void close_due(nanos now, bool all, std::vector<summary>& due);

  int burst_;
  nanos interval_ns_;
  std::size_t kinds_max_;
  std::map<std::string, window, std::less<>> kinds_;
  std::size_t pending_ = 0;  // windows with lines cut
  std::uint64_t suppressed_total_ = 0;
};

class logger {
 public:
  /// Lines go to `out` (tests) or, when null, to stderr. `clock` drives the rate
  /// limit (the time printed is the wall clock's); it and `out` outlive the logger.
  logger(log_options options, const clock_source& clock, std::ostream* out = nullptr);
  /// Writes the summaries still pending.
  ~logger();
  logger(const logger&) = delete;
  logger& operator=(const logger&) = delete;

  bool enabled(log_level level) const { return level >= options_.level && level != log_level::off; }
  const log_options& options() const { return options_; }

  /// printf-style; `kind` names what the line is about (the rate limit's key).
  void debug(std::string_view kind, const char* format, ...) __attribute__((format(printf, 3, 4)));
  void info(std::string_view kind, const char* format, ...) __attribute__((format(printf, 3, 4)));
  void warn(std::string_view kind, const char* format, ...) __attribute__((format(printf, 3, 4)));
  void error(std::string_view kind, const char* format, ...) __attribute__((format(printf, 3, 4)));
  void write(log_level level, std::string_view kind, std::string_view message);

  /// Writes the summaries of every interval that is over.
  void flush();
  /// Lines written (summaries included) and lines cut by the rate limit, so far.
  std::uint64_t lines_written() const;
  std::uint64_t lines_suppressed() const;

 private:
  void vlog(log_level level, std::string_view kind, const char* format, __builtin_va_list args);
  struct impl;
  log_options options_;
  std::unique_ptr<impl> impl_;
};

}  // namespace archipelago
