#include "report/drill_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/json_line.hpp"
#include "core/refusals.hpp"
#include "report/svg_chart.hpp"

namespace archipelago {
namespace {

const char* fault_color(const std::string& what) {
  if (what.starts_with("crash")) return "#d62728";
  if (what.starts_with("pause")) return "#ff7f0e";
  if (what.starts_with("slow")) return "#bcbd22";
  if (what.starts_with("partition")) return "#9467bd";
  if (what.starts_with("link")) return "#17becf";
  if (what.starts_with("shard_crash")) return "#8c564b";
  if (what.starts_with("broker_crash")) return "#000000";
  if (what.starts_with("broker_host_lost")) return "#e377c2";
  return "#7f7f7f";
}

std::string activity_chart(const drill_report& r, const std::vector<band>& learner_faults) {
  std::vector<std::vector<std::pair<double, double>>> rates;
  for (int l = 0; l < r.learners; ++l)
    rates.push_back(rate(r.samples, 1.0, [l](const drill_sample& s) {
      return static_cast<std::size_t>(l) < s.learner_steps.size() ? static_cast<double>(s.learner_steps[static_cast<std::size_t>(l)]) : 0.0;
    }));
  return activity_strips("Per-learner activity (steps/s, darker = faster; faults on a learner marked below its strip)", rates,
                         learner_faults, r.samples.empty() ? 1.0 : r.samples.back().t_s);
}

std::string curve_json(const std::vector<std::pair<std::uint64_t, double>>& curve) {
  std::string out = "[";
  for (std::size_t i = 0; i < curve.size(); ++i)
    out += (i ? ",[" : "[") + std::to_string(curve[i].first) + "," + num(curve[i].second, "%.6g") + "]";
  return out + "]";
}

template <class T>
std::string list_json(const std::vector<T>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::string refused_json(const std::map<std::string, std::uint64_t>& refused) {
  json_line j;
  for (const auto& [reason, n] : refused) j.add(reason, n);
  return j.str();
}

double or_nan(double v) { return v >= 0 ? v : std::nan(""); }

std::string takeovers_json(const drill_report& r) {
  std::string out = "[";
  for (std::size_t i = 0; i < r.takeovers.size(); ++i) {
    const drill_takeover& t = r.takeovers[i];
    json_line j;
    j.add("fault", static_cast<std::uint64_t>(t.fault))
        .add("at_s", t.at_s)
        .add("deposed", static_cast<std::uint64_t>(t.deposed))
        .add("broker", t.broker)
        .add("epoch", t.epoch)
        .add("first_round_s", or_nan(t.first_round_s))
        .add("back_s", or_nan(t.back_s))
        .add("stepped_down_s", or_nan(t.stepped_down_s));
    out += (i ? "," : "") + j.str();
  }
  return out + "]";
}

std::string epochs_json(const drill_report& r) {
  std::string out = "[";
  for (std::size_t i = 0; i < r.epochs.size(); ++i) {
    const drill_epoch& e = r.epochs[i];
    json_line j;
    j.add("epoch", e.epoch)
        .add("broker", static_cast<std::uint64_t>(e.broker))
        .add("rounds", e.rounds)
        .add("first_closed_s", e.first_closed_s)
        .add("last_closed_s", e.last_closed_s);
    out += (i ? "," : "") + j.str();
  }
  return out + "]";
}

}  // namespace

double eval_gap(const drill_report& r) {
  if (!r.reference || r.reference->eval_loss <= 0) return std::numeric_limits<double>::quiet_NaN();
  return (r.run.eval_loss - r.reference->eval_loss) / r.reference->eval_loss;
}

std::string drill_summary_json(const drill_report& r) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  json_line j;
  j.add("plan", r.plan)
      .add("mode", r.mode)
      .add("reference_mode", r.reference_mode)
      .add("processes", r.processes)
      .add("seed", r.seed)
      .add("learners", r.learners)
      .add("shards", r.shards)
      .add("quorum", r.quorum)
      .add("safety_s", r.safety_s)
      .add("liveness_s", r.liveness_s)
      .add("step_time_ms", r.step_time_ms)
      .add("budget_overruns", r.budget_overruns)
      .add("faults_injected", static_cast<std::uint64_t>(r.faults_injected))
      .add("faults_skipped", static_cast<std::uint64_t>(r.faults_skipped))
      .add("uptime", r.uptime)
      .add("goodput", r.goodput)
      .add("reference_goodput", r.reference ? r.reference_goodput : nan)
      .add("downtime_s", r.downtime_s)
      .add("downtime_gap_s", r.downtime_gap_s)
      .add("broker_outage_s", r.broker_outage_s)
      .add("standbys", r.standbys)
      .add("takeover_bound_s", r.takeover_bound_s)
      .add_raw("takeovers", takeovers_json(r))
      .add_raw("epochs", epochs_json(r))
      .add("deposed_merges", r.deposed_merges)
      .add("epochs_interleaved", r.epochs_interleaved)
      .add_raw("step_downs", list_json(r.step_downs))
      .add("availability", r.availability)
      .add("fragment_gap_s", r.fragment_gap_s)
      .add_raw("fragment_availability", list_json(r.fragment_availability))
      .add("committed_rounds_lost", r.committed_rounds_lost)
      .add("ledger_exact", r.ledger_exact)
      .add("participation", r.run.broker.participation)
      .add("participation_rounds", r.run.broker.participation_rounds)
      .add("min_participation", r.min_participation)
      .add("unreported_tokens", r.unreported_tokens)
      .add_raw("refused", refused_json(r.run.refused))
      .add_raw("ledger", ledger_json(r.run.broker.ledger))
      .add("rounds", r.run.rounds)
      .add("rounds_per_s", r.run.wall_s > 0 ? static_cast<double>(r.run.rounds) / r.run.wall_s : 0.0)
      .add("published", r.run.published)
      .add("tokens", r.run.tokens)
      .add("reference_tokens", r.reference ? static_cast<double>(r.reference->tokens) : nan)
      .add("eval_loss", r.run.eval_loss)
      .add("reference_eval_loss", r.reference ? r.reference->eval_loss : nan)
      .add("eval_gap", eval_gap(r))
      .add("wall_s", r.run.wall_s);
  const std::string s = j.str();
  return s.substr(1, s.size() - 2);
}

std::string drill_report_json(const drill_report& r) {
  std::string out = "{" + drill_summary_json(r);
  out += ",\"faults\":[";
  for (std::size_t i = 0; i < r.faults.size(); ++i) {
    const auto& f = r.faults[i];
    json_line j;
    j.add("index", static_cast<std::uint64_t>(f.index))
        .add("what", f.what)
        .add("at_s", f.at_s)
        .add("skipped", f.skipped)
        .add("repaired_s", f.repaired_s >= 0 ? f.repaired_s : std::nan(""))
        .add("rejoin_s", f.rejoin_s >= 0 ? f.rejoin_s : std::nan(""));
    out += (i ? "," : "") + j.str();
  }
  out += "],\"samples\":[";
  for (std::size_t i = 0; i < r.samples.size(); ++i) {
    const auto& s = r.samples[i];
    json_line j;
    j.add("t_s", s.t_s)
        .add("rounds", s.rounds)
        .add("published", s.published)
        .add("tokens", s.tokens)
        .add("merged_step_time_s", s.merged_step_time_s)
        .add_raw("learner_steps", list_json(s.learner_steps))
        .add_raw("fragment_versions", list_json(s.fragment_versions))
        .add("learners_down", s.learners_down)
        .add("shards_down", s.shards_down)
        .add("broker_down", s.broker_down)
        .add("leader", static_cast<std::int64_t>(s.leader))
        .add("epoch", s.epoch)
        .add_raw("broker_epochs", list_json(s.broker_epochs))
        .add_raw("broker_leading", list_json(s.broker_leading));
    out += (i ? "," : "") + j.str();
  }
  out += "],\"fragment_ledger\":[";
  for (std::size_t p = 0; p < r.run.broker.fragment_ledger.size(); ++p)
    out += (p ? "," : "") + ledger_json(r.run.broker.fragment_ledger[p]);
  out += "],\"incarnations\":[";
  const nanos zero = r.clock_zero_ns;
  auto at = [zero](nanos t) { return t >= 0 ? static_cast<double>(t - zero) * 1e-9 : std::nan(""); };
  for (std::size_t i = 0; i < r.run.broker.learners.size(); ++i) {
    const auto& rec = r.run.broker.learners[i];
    json_line j;
    j.add("learner", static_cast<std::uint64_t>(rec.who.learner.value))
        .add("incarnation", rec.who.inc.value)
        .add("joined_s", at(rec.joined_ns))
        .add("first_merged_s", at(rec.first_merged_ns))
        .add("left_s", at(rec.left_ns))
        .add_raw("ledger", ledger_json(rec.ledger));
    out += (i ? "," : "") + j.str();
  }
  out += "],\"process_events\":[";
  for (std::size_t i = 0; i < r.process_events.size(); ++i) {
    const auto& e = r.process_events[i];
    json_line j;
    j.add("t_s", e.t_s).add("node", e.node).add("action", e.action).add("pid", static_cast<std::int64_t>(e.pid))
        .add("detail", e.detail);
    out += (i ? "," : "") + j.str();
  }
  out += "],\"eval_curve\":" + curve_json(r.run.eval_curve);
  if (r.reference) out += ",\"reference_eval_curve\":" + curve_json(r.reference->eval_curve);
  return out + "}";
}

std::string drill_report_html(const std::vector<drill_report>& drills) {
  std::string out =
      "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>archipelago drill</title><style>"
      "body{font-family:sans-serif;max-width:900px;margin:20px auto;color:#222}"
      "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
      "td.n{text-align:right}.bad{color:#c00;font-weight:bold}.ok{color:#070}</style></head><body>";
  if (!drills.empty())
    out += "<h1>Drill: " + html_escape(drills.front().plan) + "</h1><p>seed " + std::to_string(drills.front().seed) +
           ", safety phase " + num(drills.front().safety_s) + " s with faults, then " + num(drills.front().liveness_s) +
           " s healed. Generated by <code>archipelago drill</code>.</p>";
  for (const auto& r : drills) {
    out += "<h2>Mode " + html_escape(r.mode) + "</h2>";
    out += "<p>" + std::to_string(r.learners) + " learners, " + std::to_string(r.shards) + " shards, K = " +
           std::to_string(r.quorum) + ". Compute budget: every inner step paced to at least " + num(r.step_time_ms) +
           " ms (mesh.step_time_ms), so a lost learner does not give its CPU to the others; " +
           std::to_string(r.budget_overruns) + " steps overran it.</p>";
    const double gap = eval_gap(r);
    out += "<table><tr><th>figure</th><th>drill</th><th>fault-free reference (" + html_escape(r.reference_mode) +
           ")</th></tr>";
    auto row = [&](const std::string& name, const std::string& a, const std::string& b, bool bad = false) {
      out += "<tr><td>" + name + "</td><td class=\"n" + std::string(bad ? " bad" : "") + "\">" + a + "</td><td class=\"n\">" + b +
             "</td></tr>";
    };
    const mesh_summary* ref = r.reference ? &*r.reference : nullptr;
    row("faults injected (skipped)", std::to_string(r.faults_injected) + " (" + std::to_string(r.faults_skipped) + ")", "0");
    row("goodput", num(100 * r.goodput, "%.1f") + " %", ref ? num(100 * r.reference_goodput, "%.1f") + " %" : "-");
    row("uptime (no stall over " + num(r.downtime_gap_s) + " s, any cause)", num(100 * r.uptime, "%.1f") + " %", "-");
    row("global downtime while &ge; K learners live", num(r.downtime_s, "%.1f") + " s", "-", r.downtime_s > 0);
    row("broker outage (takeovers: at most " + num(r.takeover_bound_s, "%.1f") + " s each)",
        num(r.broker_outage_s, "%.1f") + " s", "-");
    if (!r.takeovers.empty() || r.standbys > 0)
      row("merges by a deposed broker; epochs interleaved", std::to_string(r.deposed_merges) + "; " +
          std::to_string(r.epochs_interleaved), "-", r.deposed_merges + r.epochs_interleaved > 0);
    row("fragment availability (mean; each fragment advancing, no gap over " + num(r.fragment_gap_s, "%.1f") + " s)",
        num(100 * r.availability, "%.1f") + " %", "-");
    row("committed rounds lost", std::to_string(r.committed_rounds_lost), "-", r.committed_rounds_lost > 0);
    row("ledger exact (tokens a killed learner never reported: " + std::to_string(r.unreported_tokens) + ")",
        r.ledger_exact ? "yes" : "NO", ref ? (ref->ledger_exact ? "yes" : "NO") : "-", !r.ledger_exact);
    row("participation (mean over rounds: members merged / live learners" +
            (r.min_participation > 0 ? ", pass at &ge; " + num(100 * r.min_participation, "%.0f") + " %" : std::string()) + ")",
        num(100 * r.run.broker.participation, "%.1f") + " %",
        ref ? num(100 * ref->broker.participation, "%.1f") + " %" : "-", r.run.broker.participation < r.min_participation);
    row("refused or cut, by reason (every node, every incarnation)", describe_refusals(r.run.refused),
        ref ? describe_refusals(ref->refused) : "-");
    row("rounds (per s)", std::to_string(r.run.rounds) + " (" + num(r.run.wall_s > 0 ? r.run.rounds / r.run.wall_s : 0, "%.2f") + ")",
        ref ? std::to_string(ref->rounds) + " (" + num(ref->wall_s > 0 ? ref->rounds / ref->wall_s : 0, "%.2f") + ")" : "-");
    row("tokens processed", std::to_string(r.run.tokens), ref ? std::to_string(ref->tokens) : "-");
    row("final eval loss (nats/byte)", num(r.run.eval_loss, "%.4f") + (std::isfinite(gap) ? " (" + num(100 * gap, "%+.2f") + " %)" : ""),
        ref ? num(ref->eval_loss, "%.4f") : "-", std::isfinite(gap) && gap > 0.03);
    out += "</table>";

    std::vector<band> bands, learner_bands;
    const double end_s = r.samples.empty() ? r.safety_s + r.liveness_s : r.samples.back().t_s;
    for (const auto& f : r.faults) {
      if (f.skipped) continue;
      const double to = f.repaired_s >= 0 ? std::max(f.repaired_s, f.at_s + 0.2) : end_s;
      bands.push_back({f.at_s, to, fault_color(f.what), f.what});
      const auto slash = f.what.find("learner/");
      if (slash != std::string::npos && f.what.find("partition") == std::string::npos)
        learner_bands.push_back({f.at_s, to, fault_color(f.what), f.what, std::atoi(f.what.c_str() + slash + 8)});
    }
    out += "<h3>Rounds and goodput over time</h3>";
    out += chart("Rounds closed per second (faults shaded; hover for the fault)", "seconds since the start", "rounds/s",
                 {{"rounds/s (1 s window)", "#1f77b4",
                   rate(r.samples, 1.0, [](const drill_sample& s) { return static_cast<double>(s.rounds); })}},
                 bands, end_s);
    // A restarted broker starts its ledger again from its last write: windows across it are not shown.
    auto goodput = rate(r.samples, 5.0, [&](const drill_sample& s) { return s.merged_step_time_s / std::max(1, r.learners); });
    for (auto& [t, g] : goodput)
      if (g < 0 || g > 1.05) g = std::numeric_limits<double>::quiet_NaN();
    out += chart("Goodput: merged compute / (M x time), 5 s window", "seconds since the start", "goodput",
                 {{"goodput", "#2ca02c", goodput}}, bands, end_s);
    std::vector<std::pair<double, double>> live;
    for (const auto& s : r.samples) live.emplace_back(s.t_s, r.learners - s.learners_down);
    out += chart("Learners live (not crashed, paused or cut off from the broker)", "seconds since the start", "learners",
                 {{"live", "#d62728", live}}, bands, end_s);
    out += activity_chart(r, learner_bands);
    std::vector<series> eval{{"drill", "#d62728", {}}};
    for (const auto& [tokens, loss] : r.run.eval_curve) eval[0].points.emplace_back(static_cast<double>(tokens), loss);
    if (ref) {
      eval.push_back({"fault-free reference (" + r.reference_mode + ")", "#1f77b4", {}});
      for (const auto& [tokens, loss] : ref->eval_curve) eval[1].points.emplace_back(static_cast<double>(tokens), loss);
    }
    out += "<h3>Eval loss of the global model</h3>" + chart("Eval loss against tokens processed", "tokens", "nats/byte", eval, {});
    if (!r.epochs.empty()) {
      out += "<h3>Brokers</h3><p>" + std::to_string(r.standbys) + " standby broker(s). Epochs on the brokers' tapes:</p>"
             "<table><tr><th>epoch</th><th>broker</th><th>merged rounds</th><th>first closed</th><th>last closed</th></tr>";
      for (const drill_epoch& e : r.epochs)
        out += "<tr><td class=\"n\">" + std::to_string(e.epoch) + "</td><td>broker/" + std::to_string(e.broker) +
               "</td><td class=\"n\">" + std::to_string(e.rounds) + "</td><td class=\"n\">" + num(e.first_closed_s, "%.2f") +
               " s</td><td class=\"n\">" + num(e.last_closed_s, "%.2f") + " s</td></tr>";
      out += "</table>";
    }
    if (!r.takeovers.empty()) {
      out += "<p>Takeovers (bound " + num(r.takeover_bound_s, "%.1f") + " s):</p><table><tr><th>fault</th><th>at</th>"
             "<th>deposed</th><th>new leader (epoch)</th><th>its first merged round after</th><th>new version after</th>"
             "<th>deposed stepped down after the heal</th></tr>";
      auto secs = [](double v) { return v >= 0 ? num(v, "%.2f") + " s" : std::string("-"); };
      for (const drill_takeover& t : r.takeovers)
        out += "<tr><td class=\"n\">" + std::to_string(t.fault) + "</td><td class=\"n\">" + num(t.at_s, "%.2f") +
               " s</td><td>broker/" + std::to_string(t.deposed) + "</td><td>" +
               (t.broker >= 0 ? "broker/" + std::to_string(t.broker) + " (" + std::to_string(t.epoch) + ")" : "<b>none</b>") +
               "</td><td class=\"n\">" + secs(t.first_round_s) + "</td><td class=\"n\">" + secs(t.back_s) +
               "</td><td class=\"n\">" + secs(t.stepped_down_s) + "</td></tr>";
      out += "</table>";
    }
    out += "<h3>Timeline</h3><table><tr><th>#</th><th>at</th><th>fault</th><th>repaired</th><th>back at work after</th></tr>";
    for (const auto& f : r.faults)
      out += "<tr><td class=\"n\">" + std::to_string(f.index) + "</td><td class=\"n\">" + num(f.at_s, "%.2f") + " s</td><td>" +
             html_escape(f.what) + (f.skipped ? " <i>(skipped: target already down)</i>" : "") + "</td><td class=\"n\">" +
             (f.repaired_s >= 0 ? num(f.repaired_s, "%.2f") + " s" : "-") + "</td><td class=\"n\">" +
             (f.rejoin_s >= 0 ? num(f.rejoin_s, "%.2f") + " s" : "-") + "</td></tr>";
    out += "</table>";
  }
  return out + "</body></html>\n";
}

}  // namespace archipelago
