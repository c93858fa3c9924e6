#include "drill_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "cli_common.hpp"

namespace archipelago::cli {
namespace {

std::string num(double v, const char* format = "%.4g") {
  if (!std::isfinite(v)) return "null";
  char text[48];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

/// Rate of a counter over a sliding window of `window_s`, per sample.
template <class F>
std::vector<std::pair<double, double>> rate(const std::vector<drill_sample>& samples, double window_s, F value) {
  std::vector<std::pair<double, double>> out;
  std::size_t j = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    while (j < i && samples[i].t_s - samples[j].t_s > window_s) ++j;
    const double dt = samples[i].t_s - samples[j].t_s;
    if (dt <= 0) continue;
    out.emplace_back(samples[i].t_s, (value(samples[i]) - value(samples[j])) / dt);
  }
  return out;
}

struct series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;
};
struct band {
  double from, to;
  std::string color, label;
  int row = -1;  // -1: the whole height; otherwise the row of a strip chart
};

const char* fault_color(const std::string& what) {
  if (what.starts_with("crash")) return "#d62728";
  if (what.starts_with("pause")) return "#ff7f0e";
  if (what.starts_with("slow")) return "#bcbd22";
  if (what.starts_with("partition")) return "#9467bd";
  if (what.starts_with("link")) return "#17becf";
  if (what.starts_with("shard_crash")) return "#8c564b";
  if (what.starts_with("broker_crash")) return "#000000";
  return "#7f7f7f";
}

/// A line chart; bands shade time ranges (the faults).
std::string chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                  const std::vector<series>& lines, const std::vector<band>& bands, double x_max = -1) {
  constexpr double w = 860, h = 260, left = 60, right = 20, top = 28, bottom = 40;
  double x0 = 0, x1 = x_max, y0 = 0, y1 = 0;
  for (const auto& s : lines)
    for (const auto& [x, y] : s.points) {
      if (x_max < 0) x1 = std::max(x1, x);
      if (std::isfinite(y)) y1 = std::max(y1, y);
    }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  y1 *= 1.08;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * (w - left - right); };
  auto Y = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * (h - top - bottom); };
  std::string out = "<svg width=\"" + num(w) + "\" height=\"" + num(h) + "\" xmlns=\"http://www.w3.org/2000/svg\">";
  out += "<text x=\"" + num(left) + "\" y=\"18\" font-weight=\"bold\" font-size=\"13\">" + html_escape(title) + "</text>";
  for (const auto& b : bands)
    out += "<rect x=\"" + num(X(b.from)) + "\" y=\"" + num(top) + "\" width=\"" + num(std::max(1.0, X(b.to) - X(b.from))) +
           "\" height=\"" + num(h - top - bottom) + "\" fill=\"" + b.color + "\" opacity=\"0.15\"><title>" +
           html_escape(b.label) + "</title></rect>";
  out += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(w - left - right) + "\" height=\"" +
         num(h - top - bottom) + "\" fill=\"none\" stroke=\"#999\"/>";
  for (int i = 0; i <= 4; ++i) {
    const double yv = y0 + (y1 - y0) * i / 4, xv = x0 + (x1 - x0) * i / 4;
    out += "<text x=\"" + num(left - 6) + "\" y=\"" + num(Y(yv) + 4) + "\" font-size=\"11\" text-anchor=\"end\">" +
           num(yv, "%.3g") + "</text>";
    out += "<text x=\"" + num(X(xv)) + "\" y=\"" + num(h - bottom + 16) + "\" font-size=\"11\" text-anchor=\"middle\">" +
           num(xv, xv >= 100 ? "%.0f" : "%.3g") + "</text>";
  }
  out += "<text x=\"" + num((left + w - right) / 2) + "\" y=\"" + num(h - 6) +
         "\" font-size=\"12\" text-anchor=\"middle\">" + html_escape(x_label) + "</text>";
  out += "<text x=\"14\" y=\"" + num((top + h - bottom) / 2) + "\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 14 " +
         num((top + h - bottom) / 2) + ")\">" + html_escape(y_label) + "</text>";
  // The legend right-aligned on the title's line.
  double legend_width = 0;
  for (const auto& s : lines) legend_width += 12 + 7.0 * static_cast<double>(s.name.size());
  double legend_x = w - right - legend_width;
  for (const auto& s : lines) {
    std::string path;
    bool pen_down = false;  // a non-finite value breaks the line
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) {
        pen_down = false;
        continue;
      }
      path += (pen_down ? " L" : " M") + num(X(x), "%.1f") + "," + num(Y(y), "%.1f");
      pen_down = true;
    }
    out += "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.5\"/>";
    out += "<text x=\"" + num(legend_x) + "\" y=\"18\" font-size=\"12\" fill=\"" + s.color + "\">" + html_escape(s.name) + "</text>";
    legend_x += 12 + 7.0 * static_cast<double>(s.name.size());
  }
  return out + "</svg>";
}

/// Per-learner activity: one strip per learner, shaded by its step rate, faults on it marked.
std::string activity_chart(const drill_report& r, const std::vector<band>& learner_faults) {
  const int rows = r.learners;
  constexpr double w = 860, left = 80, right = 20, top = 28, row_h = 22;
  const double h = top + rows * row_h + 30;
  const double x1 = std::max(1.0, r.samples.empty() ? 1.0 : r.samples.back().t_s);
  auto X = [&](double x) { return left + x / x1 * (w - left - right); };
  std::string out = "<svg width=\"" + num(w) + "\" height=\"" + num(h) + "\" xmlns=\"http://www.w3.org/2000/svg\">";
  out += "<text x=\"" + num(left) + "\" y=\"18\" font-weight=\"bold\">Per-learner activity (steps/s, darker = faster; "
         "faults on a learner marked below its strip)</text>";
  double peak = 0;
  std::vector<std::vector<std::pair<double, double>>> rates(static_cast<std::size_t>(rows));
  for (int l = 0; l < rows; ++l) {
    rates[static_cast<std::size_t>(l)] = rate(r.samples, 1.0, [l](const drill_sample& s) {
      return static_cast<std::size_t>(l) < s.learner_steps.size() ? static_cast<double>(s.learner_steps[static_cast<std::size_t>(l)]) : 0.0;
    });
    for (const auto& [t, v] : rates[static_cast<std::size_t>(l)]) peak = std::max(peak, v);
  }
  for (int l = 0; l < rows; ++l) {
    const double y = top + l * row_h;
    out += "<text x=\"" + num(left - 6) + "\" y=\"" + num(y + 13) + "\" font-size=\"11\" text-anchor=\"end\">learner/" +
           std::to_string(l) + "</text>";
    double prev_t = 0;
    for (const auto& [t, v] : rates[static_cast<std::size_t>(l)]) {
      const double shade = peak > 0 ? v / peak : 0;
      out += "<rect x=\"" + num(X(prev_t), "%.1f") + "\" y=\"" + num(y) + "\" width=\"" +
             num(std::max(0.5, X(t) - X(prev_t)), "%.1f") + "\" height=\"" + num(row_h - 8) + "\" fill=\"#1f77b4\" opacity=\"" +
             num(shade, "%.2f") + "\"/>";
      prev_t = t;
    }
  }
  for (const auto& b : learner_faults) {
    if (b.row < 0 || b.row >= rows) continue;
    const double y = top + b.row * row_h + row_h - 7;
    out += "<rect x=\"" + num(X(b.from), "%.1f") + "\" y=\"" + num(y) + "\" width=\"" +
           num(std::max(1.5, X(b.to) - X(b.from)), "%.1f") + "\" height=\"4\" fill=\"" + b.color + "\"><title>" +
           html_escape(b.label) + "</title></rect>";
  }
  for (int i = 0; i <= 4; ++i)
    out += "<text x=\"" + num(X(x1 * i / 4)) + "\" y=\"" + num(h - 12) + "\" font-size=\"11\" text-anchor=\"middle\">" +
           num(x1 * i / 4, "%.4g") + " s</text>";
  return out + "</svg>";
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
      .add("committed_rounds_lost", r.committed_rounds_lost)
      .add("ledger_exact", r.ledger_exact)
      .add("unreported_tokens", r.unreported_tokens)
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
        .add("learners_down", s.learners_down)
        .add("shards_down", s.shards_down)
        .add("broker_down", s.broker_down);
    out += (i ? "," : "") + j.str();
  }
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
    out += "<table><tr><th>figure</th><th>drill</th><th>fault-free reference</th></tr>";
    auto row = [&](const std::string& name, const std::string& a, const std::string& b, bool bad = false) {
      out += "<tr><td>" + name + "</td><td class=\"n" + std::string(bad ? " bad" : "") + "\">" + a + "</td><td class=\"n\">" + b +
             "</td></tr>";
    };
    const mesh_summary* ref = r.reference ? &*r.reference : nullptr;
    row("faults injected (skipped)", std::to_string(r.faults_injected) + " (" + std::to_string(r.faults_skipped) + ")", "0");
    row("goodput", num(100 * r.goodput, "%.1f") + " %", ref ? num(100 * r.reference_goodput, "%.1f") + " %" : "-");
    row("uptime (no stall over " + num(r.downtime_gap_s) + " s, any cause)", num(100 * r.uptime, "%.1f") + " %", "-");
    row("global downtime while &ge; K learners live", num(r.downtime_s, "%.1f") + " s", "-", r.downtime_s > 0);
    row("broker outage", num(r.broker_outage_s, "%.1f") + " s", "-");
    row("committed rounds lost", std::to_string(r.committed_rounds_lost), "-", r.committed_rounds_lost > 0);
    row("ledger exact (tokens a killed learner never reported: " + std::to_string(r.unreported_tokens) + ")",
        r.ledger_exact ? "yes" : "NO", ref ? (ref->ledger_exact ? "yes" : "NO") : "-", !r.ledger_exact);
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
      eval.push_back({"fault-free reference", "#1f77b4", {}});
      for (const auto& [tokens, loss] : ref->eval_curve) eval[1].points.emplace_back(static_cast<double>(tokens), loss);
    }
    out += "<h3>Eval loss of the global model</h3>" + chart("Eval loss against tokens processed", "tokens", "nats/byte", eval, {});
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

}  // namespace archipelago::cli
