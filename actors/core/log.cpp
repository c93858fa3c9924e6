#include "core/log.hpp"

#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>


namespace archipelago {

const char* to_string(log_level level) {
  switch (level) {
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
    case log_level::off: return "off";
  }
  return "?";
}

expected<log_level> parse_log_level(std::string_view text) {
  for (log_level l : {log_level::debug, log_level::info, log_level::warn, log_level::error, log_level::off})
    if (text == to_string(l)) return l;
  if (text == "warning") return log_level::warn;
  return make_error(errc::invalid_input,
                    "log level '" + std::string(text) + "': expected debug, info, warn, error or off");
}

expected<log_format> parse_log_format(std::string_view text) {
  if (text == "text") return log_format::text;
  if (text == "json") return log_format::json;
  return make_error(errc::invalid_input, "log format '" + std::string(text) + "': expected text or json");
}

// ---- the rate limit ------------------------------------------------------------

log_rate_limit::log_rate_limit(int burst, nanos interval_ns, std::size_t kinds_max)
    : burst_(burst < 1 ? 1 : burst), interval_ns_(interval_ns < 1 ? 1 : interval_ns),
      kinds_max_(kinds_max < 1 ? 1 : kinds_max) {}

void log_rate_limit::close_due(nanos now, bool all, std::vector<summary>& due) {
  if (pending_ == 0) return;
  for (auto& [kind, w] : kinds_) {
    if (w.suppressed == 0 || (!all && now - w.start < interval_ns_)) continue;
    due.push_back({kind, w.level, w.suppressed, now - w.start});
    // The summary is the interval's last line: the next line of the kind opens a new one.
    w = window{now, 0, 0, log_level::debug};
    --pending_;
  }
}

bool log_rate_limit::admit(std::string_view kind, log_level level, nanos now, std::vector<summary>& due) {
  close_due(now, false, due);
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) {
    // A bounded table: kinds are names written at call sites, but a limit on everything.
    const std::string_view key = kinds_.size() + 1 < kinds_max_ ? kind : std::string_view("other");
    it = kinds_.find(key);
    if (it == kinds_.end()) it = kinds_.emplace(std::string(key), window{now, 0, 0, log_level::debug}).first;
  }
  window& w = it->second;
  if (w.suppressed == 0 && now - w.start >= interval_ns_) w = window{now, 0, 0, log_level::debug};
  if (w.written < burst_) {
    ++w.written;
    return true;
  }
  if (w.suppressed++ == 0) ++pending_;
  if (level > w.level) w.level = level;
  ++suppressed_total_;
  return false;
}

void log_rate_limit::expire(nanos now, std::vector<summary>& due) { close_due(now, false, due); }

void log_rate_limit::drain(nanos now, std::vector<summary>& due) { close_due(now, true, due); }

// ---- the logger ------------------------------------------------------------------

namespace {

spdlog::level::level_enum to_spdlog(log_level level) {
  switch (level) {
    case log_level::debug: return spdlog::level::debug;
    case log_level::info: return spdlog::level::info;
    case log_level::warn: return spdlog::level::warn;
    case log_level::error: return spdlog::level::err;
    case log_level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

/// The level's name as this logger prints it (spdlog's own says "warning", "critical").
class level_flag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const char* name = msg.level == spdlog::level::warn  ? "warn"
                       : msg.level == spdlog::level::err ? "error"
                       : msg.level == spdlog::level::debug ? "debug"
                                                           : "info";
    dest.append(name, name + std::char_traits<char>::length(name));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<level_flag>(); }
};

/// The length of the well-formed UTF-8 sequence at s[i], or 0.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  if (n == 2 && c < 0xc2) return 0;                      // overlong
  if (n == 3 && c == 0xe0 && b(i + 1) < 0xa0) return 0;  // overlong
  if (n == 3 && c == 0xed && b(i + 1) >= 0xa0) return 0; // surrogates
  if (n == 4 && (c > 0xf4 || (c == 0xf0 && b(i + 1) < 0x90) || (c == 0xf4 && b(i + 1) >= 0x90))) return 0;
  return n;
}

/// A message made safe for one line: peers' bytes (a routing id, a path) end up
/// in messages, and must not forge a line or break a collector's JSON. Control
/// characters become escapes; in JSON, bytes that are not UTF-8 become U+FFFD.
std::string one_line(std::string_view s, bool json) {
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' && json) out += "\\\"";
    else if (c == '\\' && json) out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, json ? "\\u%04x" : "\\x%02x", c);
      out += buf;
    } else if (c >= 0x80 && json) {
      const std::size_t n = utf8_length(s, i);
      if (n == 0) {
        out += "\xef\xbf\xbd";
        ++i;
        continue;
      }
      out.append(s.substr(i, n));
      i += n;
      continue;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

}  // namespace

struct logger::impl {
  const clock_source& clock;
  log_rate_limit limit;
  log_format format;
  std::mutex mutex;  // the transport's I/O thread and the actors log at once
  std::shared_ptr<spdlog::logger> out;
  std::uint64_t written = 0;
  std::vector<log_rate_limit::summary> due;  // scratch

  impl(const log_options& o, const clock_source& c, std::ostream* stream)
      : clock(c), limit(o.burst, o.interval_ns, o.kinds_max), format(o.format) {
    spdlog::sink_ptr sink;
    if (stream) sink = std::make_shared<spdlog::sinks::ostream_sink_st>(*stream, true);
    else sink = std::make_shared<spdlog::sinks::stderr_sink_st>();
    out = std::make_shared<spdlog::logger>("archipelago", std::move(sink));
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<level_flag>('*');
    // The message part (%v) is the kind and the text, already in the line's format.
    formatter->set_pattern(o.format == log_format::json ? R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%*",%v})"
                                                        : "%Y-%m-%dT%H:%M:%S.%eZ %* %v");
    out->set_formatter(std::move(formatter));
    out->set_level(spdlog::level::trace);  // levels are checked before the rate limit, in logger
    out->flush_on(spdlog::level::trace);
  }

  void emit(log_level level, std::string_view kind, std::string_view message, const log_rate_limit::summary* cut) {
    std::string body;
    if (format == log_format::json) {
      body = "\"kind\":\"" + one_line(kind, true) + "\"";
      if (cut)
        body += ",\"suppressed\":" + std::to_string(cut->suppressed) +
                ",\"interval_s\":" + std::to_string(to_seconds(cut->interval_ns));
      body += ",\"msg\":\"" + one_line(message, true) + "\"";
    } else {
      body = "[" + one_line(kind, false) + "] " + one_line(message, false);
    }
    out->log(to_spdlog(level), std::string_view(body));
    ++written;
  }

  void emit_summaries() {
    for (const auto& s : due) {
      char text[160];
      std::snprintf(text, sizeof text, "%llu more line(s) of this kind not written in the last %.1f s (rate limit)",
                    static_cast<unsigned long long>(s.suppressed), to_seconds(s.interval_ns));
      emit(s.level, s.kind, text, &s);
    }
    due.clear();
  }
};

logger::logger(log_options options, const clock_source& clock, std::ostream* out)
    : options_(options), impl_(std::make_unique<impl>(options, clock, out)) {}

logger::~logger() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->limit.drain(impl_->clock.now(), impl_->due);
  impl_->emit_summaries();
}

void logger::write(log_level level, std::string_view kind, std::string_view message) {
  if (!enabled(level)) return;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const bool admitted = impl_->limit.admit(kind, level, impl_->clock.now(), impl_->due);
  impl_->emit_summaries();
  if (admitted) impl_->emit(level, kind, message, nullptr);
}

void logger::vlog(log_level level, std::string_view kind, const char* format, __builtin_va_list args) {
  if (!enabled(level)) return;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const bool admitted = impl_->limit.admit(kind, level, impl_->clock.now(), impl_->due);
  impl_->emit_summaries();
  if (!admitted) return;  // a line cut costs no formatting
  char small[512];
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(small, sizeof small, format, copy);
  va_end(copy);
  if (n < 0) return impl_->emit(level, kind, format, nullptr);
  if (static_cast<std::size_t>(n) < sizeof small) return impl_->emit(level, kind, std::string_view(small, n), nullptr);
  std::string big(static_cast<std::size_t>(n) + 1, '\0');
  std::vsnprintf(big.data(), big.size(), format, args);
  big.resize(static_cast<std::size_t>(n));
  impl_->emit(level, kind, big, nullptr);
}

#define ARCHIPELAGO_LOG_AT(name, level)                                 \
  void logger::name(std::string_view kind, const char* format, ...) {  \
    va_list args;                                                       \
    va_start(args, format);                                             \
    vlog(level, kind, format, args);                                    \
    va_end(args);                                                       \
  }
ARCHIPELAGO_LOG_AT(debug, log_level::debug)
ARCHIPELAGO_LOG_AT(info, log_level::info)
ARCHIPELAGO_LOG_AT(warn, log_level::warn)
ARCHIPELAGO_LOG_AT(error, log_level::error)
#undef ARCHIPELAGO_LOG_AT

void logger::flush() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->limit.expire(impl_->clock.now(), impl_->due);
  impl_->emit_summaries();
  impl_->out->flush();
}

std::uint64_t logger::lines_written() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->written;
}

std::uint64_t logger::lines_suppressed() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->limit.suppressed_total();
}

}  // namespace archipelago
