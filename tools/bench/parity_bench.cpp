#include "bench/parity_bench.hpp"

#include <algorithm>
#include <cmath>

#include "bench/ablate_bench.hpp"
#include "bench/bench_mesh.hpp"
#include "bench/bench_stats.hpp"
#include "report/svg_chart.hpp"

namespace archipelago {
namespace {

/// The modes, then the variants: what one seed runs, in order.
std::vector<parity_variant> arms_of(const parity_options& o) {
  std::vector<parity_variant> arms;
  for (const std::string& mode : o.modes) arms.push_back({mode, mode, {}});
  arms.insert(arms.end(), o.variants.begin(), o.variants.end());
  return arms;
}

std::string corpus_name(const std::string& corpus) { return corpus.empty() ? "synthetic" : corpus; }

void record(parity_outcome& r, const mesh_summary& s) {
  r.loss.push_back(s.eval_loss);
  r.bpb.push_back(s.eval_bpb);
  r.excess_bpb.push_back(std::isnan(s.entropy_floor_bpb) ? std::nan("") : s.eval_bpb - s.entropy_floor_bpb);
  r.tokens.push_back(static_cast<double>(s.tokens));
  r.goodput.push_back(s.goodput);
  r.wall_s.push_back(s.wall_s);
  r.ledger_exact = r.ledger_exact && s.ledger_exact;
  r.curves.emplace_back();
  for (const auto& [tokens, loss] : s.eval_curve) r.curves.back().emplace_back(static_cast<double>(tokens), loss);
}

}  // namespace

expected<config> parity_arm_config(const parity_options& o, const config& base, const parity_variant& arm,
                                   const std::string& corpus) {
  config c = base;
  c.mesh.mode = arm.mode;
  if (o.steps > 0) c.train.steps = o.steps;
  // After --steps: a variant's own train.steps is a longer (or shorter) schedule, how
  // tokens to dp's final loss are measured past dp's budget.
  for (const std::string& setting : arm.settings)
    if (auto ok = set_knob_assignment(c, setting); !ok) return ok.err();
  c.mesh.learners = o.learners;
  c.data.corpus = corpus;
  return c;
}

double tokens_to_reach(const loss_curve& curve, double target) {
  for (std::size_t i = 0; i < curve.size(); ++i) {
    if (!(curve[i].second <= target)) continue;
    if (i == 0) return curve[0].first;
    const auto [t0, l0] = curve[i - 1];
    const auto [t1, l1] = curve[i];
    return l0 > l1 ? t0 + (l0 - target) / (l0 - l1) * (t1 - t0) : t1;
  }
  return std::nan("");
}

expected<parity_variant> parse_parity_variant(std::string_view spec) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_input, "bench parity: --variant '" + std::string(spec) + "': " + why +
                                               " (expected LABEL=MODE,KEY=VALUE,...)");
  };
  const std::size_t eq = spec.find('=');
  if (eq == std::string_view::npos || eq == 0) return bad("no LABEL=");
  std::vector<std::string> parts;  // MODE, then the settings
  for (std::string_view rest = spec.substr(eq + 1);;) {
    const std::size_t comma = rest.find(',');
    parts.emplace_back(rest.substr(0, comma));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  parity_variant v{std::string(spec.substr(0, eq)), parts.front(), {parts.begin() + 1, parts.end()}};
  if (v.mode != "dp" && v.mode != "diloco" && v.mode != "streaming" && v.mode != "decoupled")
    return bad("mode '" + v.mode + "' is none of dp, diloco, streaming, decoupled");
  for (const std::string& setting : v.settings)
    if (setting.find('=') == std::string::npos) return bad("setting '" + setting + "' has no =");
  return v;
}

status check_parity(const parity_options& o, const config& base) {
  if (o.modes.empty() || o.modes.front() != "dp")
    return make_error(errc::invalid_input, "bench parity: --modes must start with dp (the reference)");
  const std::vector<parity_variant> arms = arms_of(o);
  for (const parity_variant& arm : arms)
    if (std::count_if(arms.begin(), arms.end(), [&](const parity_variant& a) { return a.label == arm.label; }) > 1)
      return make_error(errc::invalid_input, "bench parity: " + arm.label + " given twice (a mode or a variant's label)");
  for (const std::string& corpus : o.corpora)
    for (const parity_variant& arm : arms) {
      auto c = parity_arm_config(o, base, arm, corpus);
      status ok = c ? validate_mesh(*c) : status(c.err());
      if (!ok)
        return make_error(errc::invalid_input,
                          "bench parity: " + arm.label + " on " + corpus_name(corpus) + ": " + ok.err().message);
    }
  return {};
}

void compare_with_reference(parity_corpus& c) {
  if (c.modes.empty()) return;
  const parity_outcome& dp = c.modes.front();
  std::vector<double> dp_reach;
  for (std::size_t s = 0; s < dp.curves.size(); ++s) dp_reach.push_back(tokens_to_reach(dp.curves[s], dp.loss[s]));
  for (parity_outcome& m : c.modes) {
    m.reach_tokens.clear();
    m.reach_ratio.clear();
    m.gap.clear();
    for (std::size_t s = 0; s < m.curves.size() && s < dp.loss.size(); ++s) {
      const double reach = tokens_to_reach(m.curves[s], dp.loss[s]);
      m.reach_tokens.push_back(reach);
      m.reach_ratio.push_back(reach / dp_reach[s]);
      m.gap.push_back(m.loss[s] - dp.loss[s]);
    }
  }
}

expected<parity_result> run_parity_bench(const parity_options& o, const config& base, const bench_hooks& hooks) {
  if (auto ok = check_parity(o, base); !ok) return ok.err();
  parity_result r;
  r.load_before = load_average();
  const auto started = seconds_clock::now();
  const std::vector<parity_variant> arms = arms_of(o);
  const int runs = static_cast<int>(o.corpora.size() * arms.size()) * o.seeds;
  int run = 0;
  for (const std::string& corpus : o.corpora) {
    parity_corpus pc;
    pc.corpus = corpus;
    pc.entropy_floor_bpb = std::nan("");
    for (const parity_variant& arm : arms) pc.modes.push_back(parity_outcome{arm.label, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}});
    for (int seed = 1; seed <= o.seeds; ++seed) {
      for (std::size_t i = 0; i < arms.size(); ++i) {
        if (hooks.stopped()) return interrupted();
        auto configured = parity_arm_config(o, base, arms[i], corpus);
        if (!configured) return configured.err();  // check_parity saw it valid
        config c = *configured;
        c.train.seed = base.train.seed + static_cast<std::uint64_t>(seed - 1);
        const std::string label = "bench parity: run " + std::to_string(++run) + "/" + std::to_string(runs) + " (" +
                                  corpus_name(corpus) + ", " + arms[i].label + ", seed " + std::to_string(c.train.seed) + ")";
        hooks.begin(label);
        auto s = run_bench_mesh(c, hooks, label, 80, mesh_eval{o.eval_period_s});
        if (!s) return hooks.stopped() ? interrupted() : make_error(s.err().code, arms[i].label + ": " + s.err().message);
        record(pc.modes[i], *s);
        pc.entropy_floor_bpb = s->entropy_floor_bpb;
      }
    }
    compare_with_reference(pc);
    for (const auto& m : pc.modes) r.ledger_exact = r.ledger_exact && m.ledger_exact;
    r.corpora.push_back(std::move(pc));
  }
  r.wall_s = since(started);
  r.load_after = load_average();
  return r;
}

std::string parity_plot(const parity_result& r) {
  static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  std::vector<std::string> charts;
  for (const parity_corpus& c : r.corpora) {
    std::vector<series> lines;
    double budget = 0;
    for (const auto& m : c.modes)
      for (const auto& curve : m.curves)
        if (!curve.empty()) budget = std::max(budget, curve.back().first);
    for (std::size_t i = 0; i < c.modes.size(); ++i) {
      const parity_outcome& m = c.modes[i];
      // Every seed's curve on a common grid of 60 token counts: the mean, the lowest and the highest.
      loss_curve mean_line, low, high;
      for (int k = 0; k <= 60; ++k) {
        const double tokens = budget * k / 60;
        std::vector<double> at;
        for (const auto& curve : m.curves)
          if (const double y = loss_at(curve, tokens); !std::isnan(y)) at.push_back(y);
        if (at.empty()) continue;
        mean_line.emplace_back(tokens, mean(at));
        low.emplace_back(tokens, *std::min_element(at.begin(), at.end()));
        high.emplace_back(tokens, *std::max_element(at.begin(), at.end()));
      }
      series band_of_seeds{"", colors[i % 6], {}, false};
      band_of_seeds.area = high;
      band_of_seeds.area.insert(band_of_seeds.area.end(), low.rbegin(), low.rend());
      lines.push_back(std::move(band_of_seeds));
      lines.push_back(series{m.mode, colors[i % 6], std::move(mean_line), false});
    }
    const double dp_final = c.modes.empty() ? std::nan("") : mean(c.modes.front().loss);
    auto dp_line = [&](double from) { return series{"dp final", "#555555", {{from, dp_final}, {budget, dp_final}}, true}; };
    if (!std::isnan(dp_final)) lines.push_back(dp_line(0));
    const std::string title = "bench parity, " + corpus_name(c.corpus) + ": eval loss against tokens (mean over seeds, band: lowest to highest)";
    charts.push_back(chart(title, "tokens", "eval loss, nats/byte", lines, {}));
    // The end of the budget, where the modes part: the second half, the y axis fitted to it.
    std::vector<series> tail;
    for (const series& s : lines) {
      if (s.dashed) {
        tail.push_back(dp_line(budget / 2));
        continue;
      }
      series t{s.name, s.color, {}, s.dashed};
      for (const auto& p : s.points)
        if (p.first >= budget / 2) t.points.push_back(p);
      for (const auto& p : s.area)
        if (p.first >= budget / 2) t.area.push_back(p);
      tail.push_back(std::move(t));
    }
    double lowest = INFINITY;
    for (const series& s : tail)
      for (const auto& p : s.area.empty() ? s.points : s.area) lowest = std::min(lowest, p.second);
    charts.push_back(chart("the second half of the budget", "tokens", "eval loss, nats/byte", tail, {}, -1, {},
                           budget / 2, std::isfinite(lowest) ? lowest * 0.98 : 0));
  }
  return stack_charts(charts);
}

}  // namespace archipelago
