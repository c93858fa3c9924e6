#include "core/node_status.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace archipelago {
namespace {

using json = nlohmann::json;

json ledger_object(const ledger_totals& l) {
  return {{"processed", l.processed}, {"merged", l.merged},     {"late", l.late},
          {"overwritten", l.overwritten}, {"lost", l.lost}, {"rejected", l.rejected}, {"steps", l.steps},
          {"step_time_s", l.step_time_s}, {"merged_step_time_s", l.merged_step_time_s}};
}

ledger_totals ledger_of(const json& j) {
  ledger_totals l;
  l.processed = j.at("processed").get<std::uint64_t>();
  l.merged = j.at("merged").get<std::uint64_t>();
  l.late = j.at("late").get<std::uint64_t>();
  l.overwritten = j.at("overwritten").get<std::uint64_t>();
  l.lost = j.at("lost").get<std::uint64_t>();
  l.rejected = j.at("rejected").get<std::uint64_t>();
  l.steps = j.at("steps").get<std::uint64_t>();
  l.step_time_s = j.at("step_time_s").get<double>();
  l.merged_step_time_s = j.at("merged_step_time_s").get<double>();
  return l;
}

json report_json(const broker_report& r) {
  json learners = json::array();
  for (const learner_record& rec : r.learners)
    learners.push_back({{"learner", rec.who.learner.value},
                        {"incarnation", rec.who.inc.value},
                        {"ledger", ledger_object(rec.ledger)},
                        {"joined_ns", rec.joined_ns},
                        {"first_merged_ns", rec.first_merged_ns},
                        {"left_ns", rec.left_ns}});
  json fragments = json::array();
  for (const ledger_totals& f : r.fragment_ledger) fragments.push_back(ledger_object(f));
  return {{"started_ns", r.started_ns},
          {"fragment_ledger", fragments},
          {"fragment_availability", r.fragment_availability},
          {"broker_cpu_s", r.broker_cpu_s},
          {"ledger", ledger_object(r.ledger)},
          {"learners", learners},
          {"uptime", r.uptime},
          {"first_join_ns", r.first_join_ns},
          {"last_leave_ns", r.last_leave_ns},
          {"xi_step_ms", r.xi_step_ms},
          {"xi_quorum_ms", r.xi_quorum_ms},
          {"last_grace_ms", r.last_grace_ms},
          {"closed_grace_expired", r.closed_grace_expired},
          {"closed_all_eligible", r.closed_all_eligible},
          {"closed_timeout", r.closed_timeout},
          {"participation", r.participation},
          {"participation_rounds", r.participation_rounds},
          {"round_latency_ms", r.round_latency_ms},
          {"round_open_to_published_ms", r.round_open_to_published_ms}};
}

broker_report report_of(const json& j) {
  broker_report r;
  r.started_ns = j.at("started_ns").get<nanos>();
  r.broker_cpu_s = j.at("broker_cpu_s").get<double>();
  r.ledger = ledger_of(j.at("ledger"));
  for (const json& f : j.at("fragment_ledger")) r.fragment_ledger.push_back(ledger_of(f));
  r.fragment_availability = j.at("fragment_availability").get<std::vector<double>>();
  for (const json& rec : j.at("learners"))
    r.learners.push_back({{{rec.at("learner").get<std::uint32_t>()}, incarnation{rec.at("incarnation").get<std::uint64_t>()}},
                          ledger_of(rec.at("ledger")),
                          rec.at("joined_ns").get<nanos>(),
                          rec.at("first_merged_ns").get<nanos>(),
                          rec.at("left_ns").get<nanos>()});
  r.uptime = j.at("uptime").get<double>();
  r.first_join_ns = j.at("first_join_ns").get<nanos>();
  r.last_leave_ns = j.at("last_leave_ns").get<nanos>();
  r.xi_step_ms = j.at("xi_step_ms").get<double>();
  r.xi_quorum_ms = j.at("xi_quorum_ms").get<double>();
  r.last_grace_ms = j.at("last_grace_ms").get<double>();
  r.closed_grace_expired = j.at("closed_grace_expired").get<std::uint64_t>();
  r.closed_all_eligible = j.at("closed_all_eligible").get<std::uint64_t>();
  r.closed_timeout = j.at("closed_timeout").get<std::uint64_t>();
  r.participation = j.value("participation", 0.0);
  r.participation_rounds = j.value("participation_rounds", std::uint64_t{0});
  r.round_latency_ms = j.at("round_latency_ms").get<std::vector<double>>();
  r.round_open_to_published_ms = j.at("round_open_to_published_ms").get<std::vector<double>>();
  return r;
}

// The counters, one name each: written and read by the same table.
#define ARCHIPELAGO_NODE_COUNTERS(X)                                                                        \
  X(steps) X(tokens) X(contributions) X(budget_overruns) X(refetches) X(wait_ns) X(published) X(rejected) \
  X(snapshot_errors) X(rounds_closed) X(members) X(committed) X(bytes_sent) X(peers_lost) X(step_downs)

}  // namespace

double broker_report::availability() const {
  if (fragment_availability.empty()) return uptime;
  double sum = 0;
  for (double a : fragment_availability) sum += a;
  return sum / static_cast<double>(fragment_availability.size());
}

node_counters& node_counters::operator+=(const node_counters& o) {
#define ARCHIPELAGO_ADD(name) name += o.name;
  ARCHIPELAGO_NODE_COUNTERS(ARCHIPELAGO_ADD)
#undef ARCHIPELAGO_ADD
  control_rtt_max_ns = std::max(control_rtt_max_ns, o.control_rtt_max_ns);
  for (const auto& [reason, n] : o.refused) refused[reason] += n;
  return *this;
}

std::string to_json(const node_status& s) {
  json counts = json::object();
#define ARCHIPELAGO_WRITE(name) counts[#name] = s.counts.name;
  ARCHIPELAGO_NODE_COUNTERS(ARCHIPELAGO_WRITE)
#undef ARCHIPELAGO_WRITE
  counts["control_rtt_max_ns"] = s.counts.control_rtt_max_ns;
  counts["refused"] = s.counts.refused;
  json j = {{"role", to_string(s.node.kind)},
            {"index", s.node.index},
            {"incarnation", s.incarnation},
            {"counts", counts},
            {"left", s.left},
            {"refusal", s.refusal},
            {"schedule_step", s.schedule_step},
            {"published_versions", s.published_versions},
            {"committed_versions", s.committed_versions},
            {"broker_epoch", s.broker_epoch}};
  if (s.report) j["report"] = report_json(*s.report);
  if (s.eval)
    j["global_eval"] = {{"loss", s.eval->loss}, {"bits_per_byte", s.eval->bits_per_byte}, {"step", s.eval->step},
                        {"versions", s.eval->versions}, {"evaluations", s.eval->evaluations}};
  return j.dump();
}

expected<node_status> node_status_from_json(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_input, "a node status is not a JSON object");
  try {
    node_status s;
    const std::string kind = j.at("role").get<std::string>();
    bool known = false;
    for (role r : {role::learner, role::sync_broker, role::parameter_shard, role::chaos_monkey})
      if (kind == to_string(r)) {
        s.node.kind = r;
        known = true;
      }
    if (!known) return make_error(errc::invalid_input, "a node status names an unknown role '" + kind + "'");
    s.node.index = j.at("index").get<std::uint32_t>();
    s.incarnation = j.at("incarnation").get<std::uint64_t>();
    const json& counts = j.at("counts");
#define ARCHIPELAGO_READ(name) s.counts.name = counts.at(#name).get<std::uint64_t>();
    ARCHIPELAGO_NODE_COUNTERS(ARCHIPELAGO_READ)
#undef ARCHIPELAGO_READ
    s.counts.control_rtt_max_ns = counts.at("control_rtt_max_ns").get<std::uint64_t>();
    s.counts.refused = counts.at("refused").get<std::map<std::string, std::uint64_t>>();
    s.left = j.at("left").get<bool>();
    s.refusal = j.at("refusal").get<std::string>();
    s.schedule_step = j.at("schedule_step").get<std::int64_t>();
    s.published_versions = j.at("published_versions").get<std::vector<std::uint64_t>>();
    s.committed_versions = j.at("committed_versions").get<std::vector<std::uint64_t>>();
    s.broker_epoch = j.at("broker_epoch").get<std::uint64_t>();
    if (j.contains("report")) s.report = report_of(j.at("report"));
    if (j.contains("global_eval")) {
      const json& e = j.at("global_eval");
      s.eval = global_eval{e.at("loss").get<double>(), e.at("bits_per_byte").get<double>(), e.at("step").get<std::int64_t>(),
                           e.at("versions").get<std::vector<std::uint64_t>>(), e.at("evaluations").get<std::uint64_t>()};
    }
    return s;
  } catch (const json::exception& e) {
    return make_error(errc::invalid_input, std::string("a node status is malformed: ") + e.what());
  }
}

namespace {

/// A status of one incarnation taken before `than`: its counters only grow.
bool taken_before(const node_counters& s, const node_counters& than) {
  return s.steps < than.steps || s.tokens < than.tokens || s.published < than.published ||
         s.rounds_closed < than.rounds_closed || s.committed < than.committed;
}

}  // namespace

void status_board::update(const node_status& s) {
  std::lock_guard lock(mutex_);
  auto [it, fresh] = entries_.try_emplace(s.node);
  entry& e = it->second;
  if (!fresh && s.incarnation < e.now.incarnation) return;  // an older incarnation's late word
  // The same incarnation's older word: a poll answered before another that landed first
  // (a drill's periodic mirror and its mirror right before a kill race).
  if (!fresh && s.incarnation == e.now.incarnation && taken_before(s.counts, e.now.counts)) return;
  if (!fresh && s.incarnation > e.now.incarnation) e.earlier += e.now.counts;
  e.now = s;
}

std::optional<status_board::entry> status_board::find(node_address node) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(node);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::vector<status_board::entry> status_board::entries() const {
  std::lock_guard lock(mutex_);
  std::vector<entry> out;
  for (const auto& [node, e] : entries_) out.push_back(e);
  return out;
}

node_counters status_board::total(role kind) const {
  std::lock_guard lock(mutex_);
  node_counters sum;
  for (const auto& [node, e] : entries_)
    if (node.kind == kind) sum += e.total();
  return sum;
}

std::optional<status_board::entry> status_board::leading_broker() const {
  std::lock_guard lock(mutex_);
  const entry* best = nullptr;
  for (const auto& [node, e] : entries_)
    if (node.kind == role::sync_broker && e.now.report && (!best || e.now.broker_epoch > best->now.broker_epoch))
      best = &e;
  if (best) return *best;
  if (auto it = entries_.find({role::sync_broker, 0}); it != entries_.end()) return it->second;
  return std::nullopt;
}

int status_board::learners_left() const {
  std::lock_guard lock(mutex_);
  int n = 0;
  for (const auto& [node, e] : entries_) n += node.kind == role::learner && e.now.left;
  return n;
}

}  // namespace archipelago
