// archipelago status: a live table of a running mesh, read from the broker's
// /status page (the broker's --metrics-port).

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli_common.hpp"
#include "commands.hpp"

namespace archipelago::cli {
namespace {

struct status_cli {
  std::vector<std::string> brokers;  // HOST:PORT of each broker's metrics port (primary, standbys)
  double every_s = 2;
  bool once = false;
  bool json = false;
  double timeout_s = 5;
};

/// HOST:PORT (an http:// prefix and a trailing / are accepted).
expected<std::pair<std::string, int>> parse_address(std::string a) {
  if (a.rfind("http://", 0) == 0) a = a.substr(7);
  while (!a.empty() && a.back() == '/') a.pop_back();
  const auto colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size())
    return make_error(errc::invalid_input, "--broker " + a + ": expected HOST:PORT (the broker's --metrics-port)");
  int port = 0;
  try {
    std::size_t used = 0;
    port = std::stoi(a.substr(colon + 1), &used);
    if (used != a.size() - colon - 1 || port <= 0 || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return make_error(errc::invalid_input, "--broker " + a + ": the port must be a number in 1..65535");
  }
  return std::make_pair(a.substr(0, colon), port);
}

expected<nlohmann::json> fetch(httplib::Client& client, const std::string& where) {
  auto res = client.Get("/status");
  if (!res) return make_error(errc::disconnected, "no answer from http://" + where + "/status (" + httplib::to_string(res.error()) + ")");
  if (res->status != 200)
    return make_error(errc::invalid_input, "http://" + where + "/status answered " + std::to_string(res->status) +
                                               ": is this the broker's --metrics-port?");
  auto doc = nlohmann::json::parse(res->body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return make_error(errc::invalid_input, "http://" + where + "/status: not a status document");
  return doc;
}

std::string seconds_ago(const nlohmann::json& v) {
  const double s = v.is_number() ? v.get<double>() : -1;
  if (s < 0) return "never";
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.1fs ago" : "%.0fs ago", s);
  return buf;
}

/// A count from the status document (0 when missing).
unsigned long long u64(const nlohmann::json& v) { return v.is_number() ? v.get<unsigned long long>() : 0ULL; }

/// The table, as lines.
std::string render(const nlohmann::json& d) {
  auto num = [](const nlohmann::json& v) { return v.is_number() ? v.get<double>() : 0.0; };
  char line[512];
  std::string out;
  if (!d.value("leading", true)) {  // a standby's page: who it follows
    std::snprintf(line, sizeof line, "broker/%llu is a standby: it follows broker/%llu (epoch %llu)\n", u64(d["broker"]),
                  u64(d["leader"]), u64(d["epoch"]));
    return line;
  }
  std::snprintf(line, sizeof line,
                "mesh: %s, %llu learners configured, quorum %llu; broker/%llu leads (epoch %llu, incarnation %llu), up %s\n",
                d.value("mode", "?").c_str(), u64(d["learners_configured"]), u64(d["quorum"]), u64(d["broker"]),
                u64(d["epoch"]), u64(d["incarnation"]), format_duration(num(d["uptime_s"])).c_str());
  out += line;
  const auto& l = d["ledger"];
  std::snprintf(line, sizeof line,
                "rounds: %llu opened, %llu closed, %llu open, %llu late contributions, %llu held for storage; grace %.1f ms; "
                "goodput %.1f %%\n",
                u64(d["rounds_opened"]), u64(d["rounds_closed"]), u64(d["rounds_open"]), u64(d["late"]),
                d.value("rounds_held_for_storage", 0ULL), num(d["grace_ms"]), 100 * num(d["goodput"]));
  out += line;
  std::string last;  // the newest settled rounds: merged / live
  if (d.contains("participation_recent")) {
    const auto& recent = d["participation_recent"];
    for (std::size_t i = recent.size() > 8 ? recent.size() - 8 : 0; i < recent.size(); ++i)
      last += " " + std::to_string(u64(recent[i]["merged"])) + "/" + std::to_string(u64(recent[i]["live"]));
  }
  std::snprintf(line, sizeof line, "participation: %.1f %% mean over %llu settled rounds (members merged / live learners); last:%s\n",
                100 * num(d["participation"]), u64(d["participation_rounds"]), last.empty() ? " -" : last.c_str());
  out += line;
  std::snprintf(line, sizeof line, "ledger: %llu tokens processed = %llu merged + %llu late + %llu lost + %llu rejected (%s)\n",
                u64(l["processed"]), u64(l["merged"]), u64(l["late"]), u64(l["lost"]), u64(l["rejected"]),
                d.value("ledger_balanced", false) ? "balanced" : "NOT balanced");
  out += line;
  out += "\nlearner  incarnation     state    last seen   steps  step ms  merged tokens  endpoint\n";
  for (const auto& m : d["learners"]) {
    std::snprintf(line, sizeof line, "%7llu  %-14llu  %-7s  %10s  %6llu  %7.1f  %13llu  %s\n", u64(m["learner"]),
                  u64(m["incarnation"]), m.value("state", "?").c_str(), seconds_ago(m["last_seen_s"]).c_str(),
                  u64(m["steps"]), num(m["step_ms"]), u64(m["merged_tokens"]), m.value("endpoint", "").c_str());
    out += line;
  }
  out += "\nshard  incarnation     last seen   not durable  endpoint\n";
  for (const auto& s : d["shards"]) {
    std::snprintf(line, sizeof line, "%5llu  %-14llu  %10s   %11llu  %s\n", u64(s["shard"]), u64(s["incarnation"]),
                  seconds_ago(s["last_seen_s"]).c_str(), s.value("undurable_versions", 0ULL), s.value("endpoint", "").c_str());
    out += line;
  }
  out += "\nfragment versions:";
  std::size_t p = 0;
  for (const auto& v : d["fragment_versions"]) {
    if (p % 12 == 0) out += "\n ";
    std::snprintf(line, sizeof line, " %2zu:%-6llu", p++, u64(v));
    out += line;
  }
  return out + "\n";
}

/// One broker's metrics address and what it answered.
struct broker_page {
  std::string where;
  std::unique_ptr<httplib::Client> client;
  expected<nlohmann::json> doc = nlohmann::json();
};

/// The brokers' table (with standbys): who leads, each one's epoch.
std::string render_brokers(const std::vector<broker_page>& pages) {
  std::string out = "broker  leads  epoch                 incarnation     metrics\n";
  char line[512];
  for (const broker_page& p : pages) {
    if (!p.doc) {
      std::snprintf(line, sizeof line, "     ?  -      unreachable                           %s\n", p.where.c_str());
    } else {
      const nlohmann::json& d = *p.doc;
      std::snprintf(line, sizeof line, "%6llu  %-5s  %-20llu  %-14llu  %s\n", u64(d["broker"]),
                    d.value("leading", false) ? "yes" : "no", u64(d["epoch"]), u64(d["incarnation"]), p.where.c_str());
    }
    out += line;
  }
  return out + "\n";
}

/// Asks every broker; the leader is the one that says it leads in the newest epoch. With one
/// broker, its answer (or its error).
expected<nlohmann::json> fetch_all(std::vector<broker_page>& pages) {
  const nlohmann::json* leader = nullptr;
  for (broker_page& p : pages) {
    p.doc = fetch(*p.client, p.where);
    if (p.doc && p.doc->value("leading", true) &&
        (!leader || p.doc->value("epoch", std::uint64_t{0}) > leader->value("epoch", std::uint64_t{0})))
      leader = &*p.doc;
  }
  if (pages.size() == 1) return pages.front().doc;
  if (!leader) {
    std::string why = "no broker leads";
    for (const broker_page& p : pages) why += p.doc ? "" : "; " + p.doc.err().message;
    return make_error(errc::disconnected, why + " (a takeover under way, or none reachable)");
  }
  nlohmann::json out = *leader;
  out["brokers"] = nlohmann::json::array();
  for (const broker_page& p : pages) {
    nlohmann::json b = p.doc ? *p.doc : nlohmann::json{{"error", p.doc.err().message}};
    nlohmann::json row = {{"metrics", p.where}};
    for (const char* key : {"broker", "leading", "epoch", "incarnation", "error"})
      if (b.contains(key)) row[key] = b[key];
    out["brokers"].push_back(row);
  }
  return out;
}

int run_status(const status_cli& o) {
  std::vector<broker_page> pages;
  const auto timeout = std::chrono::microseconds(static_cast<long long>(o.timeout_s * 1e6));
  for (const std::string& b : o.brokers) {
    auto address = parse_address(b);
    if (!address) return report(address.err());
    broker_page p;
    p.where = address->first + ":" + std::to_string(address->second);
    p.client = std::make_unique<httplib::Client>(address->first, address->second);
    p.client->set_connection_timeout(timeout);
    p.client->set_read_timeout(timeout);
    pages.push_back(std::move(p));
  }
  const std::string where = pages.front().where;
  // Live on a terminal until Ctrl-C; once when asked, for --json, or into a pipe.
  const bool live = !o.once && !o.json && isatty(STDOUT_FILENO);
  install_stop_handlers();
  for (bool first = true;; first = false) {
    auto doc = fetch_all(pages);
    if (!doc) {
      if (first || !live) return report(doc.err());
      std::printf("\033[2J\033[H%s\n(retrying every %.0f s; Ctrl-C to quit)\n", doc.err().message.c_str(), o.every_s);
    } else if (o.json) {
      std::printf("%s\n", doc->dump().c_str());
      return exit_ok;
    } else {
      if (live) std::printf("\033[2J\033[H");  // clear and home: the table redrawn in place
      if (pages.size() > 1) std::fputs(render_brokers(pages).c_str(), stdout);
      std::fputs(render(*doc).c_str(), stdout);
      if (!live) return exit_ok;
      std::printf("\n(every %.0f s from http://%s/status; Ctrl-C to quit)\n", o.every_s, where.c_str());
    }
    std::fflush(stdout);
    for (double waited = 0; waited < o.every_s && !stop_requested.load(); waited += 0.1)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (stop_requested.load()) return exit_ok;
  }
}

}  // namespace

runner add_status_command(CLI::App& app) {
  auto o = std::make_shared<status_cli>();
  CLI::App* cmd = app.add_subcommand("status", "A live table of a running mesh: members, incarnations, last seen, rounds, versions");
  cmd->add_option("--broker", o->brokers,
                  "The broker's metrics address HOST:PORT (its --metrics-port); with standbys, every broker's, "
                  "comma-separated: the table is the leader's")
      ->required()
      ->delimiter(',');
  cmd->add_option("--every", o->every_s, "Seconds between refreshes of the live table")->check(CLI::Range(0.2, 3600.0))
      ->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "Seconds to wait for the broker's answer")->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  cmd->add_flag("--once", o->once, "Print the table once and exit (also when stdout is not a terminal)");
  cmd->add_flag("--json", o->json, "Print the broker's status document as one JSON line and exit");
  return [o](logger&) { return run_status(*o); };
}

}  // namespace archipelago::cli
