// The logger: its per-kind rate limit on a manual clock, levels, and the JSON
// lines a collector parses.

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "core/log.hpp"

using namespace archipelago;

namespace {

constexpr nanos second = 1'000'000'000;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("log rate limit: the first burst lines of a kind, then one summary per interval") {
  log_rate_limit limit(3, 10 * second, 16);
  std::vector<log_rate_limit::summary> due;
  int admitted = 0;
  for (int i = 0; i < 1000; ++i) admitted += limit.admit("flood", log_level::warn, 0, due) ? 1 : 0;
  CHECK(admitted == 3);
  CHECK(due.empty());
  CHECK(limit.suppressed_total() == 997);
  // Another kind has its own budget.
  CHECK(limit.admit("other.kind", log_level::info, 1, due));
  CHECK(due.empty());
  // Before the interval is over nothing is summarised.
  limit.expire(10 * second - 1, due);
  CHECK(due.empty());
  // Once it is over, any line (of any kind) brings the summary out first.
  CHECK(limit.admit("other.kind", log_level::info, 10 * second, due));
  REQUIRE(due.size() == 1);
  CHECK(due[0].kind == "flood");
  CHECK(due[0].suppressed == 997);
  CHECK(due[0].level == log_level::warn);
  CHECK(due[0].interval_ns == 10 * second);
  due.clear();
  // The kind starts a fresh interval with a full burst.
  admitted = 0;
  for (int i = 0; i < 5; ++i) admitted += limit.admit("flood", log_level::warn, 11 * second, due) ? 1 : 0;
  CHECK(admitted == 3);
  limit.drain(12 * second, due);  // at exit: pending counts come out even before the interval ends
  REQUIRE(due.size() == 1);
  CHECK(due[0].suppressed == 2);
  due.clear();
  limit.drain(13 * second, due);
  CHECK(due.empty());
}

TEST_CASE("log rate limit: a steady trickle below the burst is never cut") {
  log_rate_limit limit(10, 10 * second, 16);
  std::vector<log_rate_limit::summary> due;
  for (int i = 0; i < 1000; ++i) CHECK(limit.admit("trickle", log_level::info, i * second, due));
  CHECK(limit.suppressed_total() == 0);
  CHECK(due.empty());
}

TEST_CASE("log rate limit: at most burst + 1 lines per kind per interval, whatever the traffic") {
  const int burst = 5;
  log_rate_limit limit(burst, second, 16);
  std::vector<log_rate_limit::summary> due;
  std::uint64_t lines = 0;
  // 100,000 lines over 10 s, one every 100 µs: 10 intervals.
  for (int i = 0; i < 100000; ++i) {
    lines += limit.admit("flood", log_level::warn, static_cast<nanos>(i) * 100'000, due) ? 1 : 0;
    lines += due.size();
    due.clear();
  }
  limit.drain(10 * second, due);
  lines += due.size();
  CHECK(lines <= static_cast<std::uint64_t>((burst + 1) * 11));
  CHECK(lines >= static_cast<std::uint64_t>(burst * 10));
}

TEST_CASE("log rate limit: the table of kinds is bounded") {
  log_rate_limit limit(1, second, 4);
  std::vector<log_rate_limit::summary> due;
  for (int i = 0; i < 100; ++i) (void)limit.admit("kind-" + std::to_string(i), log_level::info, 0, due);
  CHECK(limit.kinds() == 4);  // three named kinds, then "other"
  CHECK(limit.suppressed_total() == 100 - 4);
}

TEST_CASE("logger: levels, text lines and the summary line") {
  manual_clock clock;
  std::ostringstream out;
  {
    log_options o;
    o.level = log_level::info;
    o.burst = 2;
    o.interval_ns = second;
    logger log(o, clock, &out);
    log.debug("quiet", "not written: below the level");
    for (int i = 0; i < 50; ++i) log.warn("transport.rejected", "rejected message %d from '%s'", i, "learner/4");
    CHECK(log.lines_written() == 2);
    CHECK(log.lines_suppressed() == 48);
    clock.advance(second);
    log.flush();
    CHECK(log.lines_written() == 3);
    log.info("node.start", "a %s line of %zu bytes", "long", std::string(1000, 'x').size());
    log.warn("forged", "a peer's name\n2026-01-01T00:00:00.000Z info [fake] forged");  // stays one line
  }
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() == 5);
  CHECK(lines[4].find("a peer's name\\n2026") != std::string::npos);
  CHECK(lines[0].find(" warn [transport.rejected] rejected message 0 from 'learner/4'") != std::string::npos);
  CHECK(lines[1].find("rejected message 1 ") != std::string::npos);
  CHECK(lines[2].find("[transport.rejected] 48 more line(s)") != std::string::npos);
  CHECK(lines[3].find(" info [node.start] a long line of 1000 bytes") != std::string::npos);
}

TEST_CASE("logger: a message longer than the stack buffer is written whole") {
  manual_clock clock;
  std::ostringstream out;
  {
    logger log({}, clock, &out);
    log.error("long", "%s|end", std::string(5000, 'y').c_str());
  }
  CHECK(out.str().find(std::string(5000, 'y') + "|end") != std::string::npos);
}

TEST_CASE("logger: JSON lines parse, with the kind, level, message and summary counts") {
  manual_clock clock;
  std::ostringstream out;
  {
    log_options o;
    o.format = log_format::json;
    o.burst = 1;
    o.interval_ns = second;
    logger log(o, clock, &out);
    // Quotes, backslashes, control characters and non-ASCII bytes in a message.
    log.warn("shard.rejected", "a \"quoted\" path C:\\x, a tab\t, a newline\n and \xc3\xa9");
    log.warn("shard.rejected", "cut");
    log.info("broker.\"odd\" kind", "plain");
    log.warn("transport.rejected", "from '%s'", "\xff\xfe\xc3");  // a peer's routing id: not UTF-8
  }  // the destructor writes the pending summary
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() == 4);
  std::vector<nlohmann::json> parsed;
  for (const auto& line : lines) {
    CAPTURE(line);
    auto j = nlohmann::json::parse(line, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    REQUIRE(j.is_object());
    CHECK(j.contains("ts"));
    CHECK(j["ts"].get<std::string>().back() == 'Z');
    parsed.push_back(std::move(j));
  }
  CHECK(parsed[0]["level"] == "warn");
  CHECK(parsed[0]["kind"] == "shard.rejected");
  CHECK(parsed[0]["msg"] == "a \"quoted\" path C:\\x, a tab\t, a newline\n and \xc3\xa9");
  CHECK(parsed[1]["kind"] == "broker.\"odd\" kind");
  CHECK(parsed[1]["level"] == "info");
  CHECK(parsed[2]["msg"] == "from '\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd'");
  CHECK(parsed[3]["kind"] == "shard.rejected");
  CHECK(parsed[3]["suppressed"] == 1);
  CHECK(parsed[3]["level"] == "warn");
}

TEST_CASE("logger: levels and formats parse, bad names are refused by name") {
  CHECK(parse_log_level("debug").value() == log_level::debug);
  CHECK(parse_log_level("warning").value() == log_level::warn);
  CHECK(parse_log_level("off").value() == log_level::off);
  auto bad = parse_log_level("loud");
  REQUIRE_FALSE(bad);
  CHECK(bad.err().code == errc::invalid_input);
  CHECK(bad.err().message.find("'loud'") != std::string::npos);
  CHECK(parse_log_format("json").value() == log_format::json);
  auto bad_format = parse_log_format("xml");
  REQUIRE_FALSE(bad_format);
  CHECK(bad_format.err().message.find("'xml'") != std::string::npos);
}
