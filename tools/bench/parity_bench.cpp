#include "bench/parity_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

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

namespace {

/// LABEL=MODE,KEY=VALUE,...: --variant's form, and --sweep's with VALUE = V1|V2|....
expected<parity_variant> parse_arm(std::string_view spec, const char* flag, const char* form) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_input, std::string("bench parity: ") + flag + " '" + std::string(spec) + "': " +
                                               why + " (expected " + form + ")");
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
  for (const std::string& setting : v.settings) {
    const std::size_t at = setting.find('=');
    if (at == std::string::npos) return bad("setting '" + setting + "' has no =");
    if (at + 1 == setting.size() || setting.find("||") != std::string::npos || setting.back() == '|' ||
        setting[at + 1] == '|')
      return bad("an empty value in '" + setting + "'");
  }
  return v;
}

}  // namespace

expected<parity_variant> parse_parity_variant(std::string_view spec) {
  return parse_arm(spec, "--variant", "LABEL=MODE,KEY=VALUE,...");
}

expected<parity_sweep> parse_parity_sweep(std::string_view spec) {
  auto arm = parse_arm(spec, "--sweep", "LABEL=MODE,KEY=V1|V2|...,...");
  if (!arm) return arm.err();
  if (arm->settings.empty())
    return make_error(errc::invalid_input, "bench parity: --sweep '" + std::string(spec) + "': no KEY=V1|V2|... axis");
  parity_sweep out{arm->label, arm->mode, {}};
  for (const std::string& setting : arm->settings) {
    const std::size_t eq = setting.find('=');
    std::vector<std::string> values;
    for (std::string_view rest = std::string_view(setting).substr(eq + 1);;) {
      const std::size_t bar = rest.find('|');
      values.emplace_back(rest.substr(0, bar));
      if (bar == std::string_view::npos) break;
      rest = rest.substr(bar + 1);
    }
    out.axes.emplace_back(setting.substr(0, eq), std::move(values));
  }
  return out;
}

std::vector<parity_variant> expand_sweep(const parity_sweep& sweep, std::int64_t steps, int batch) {
  std::vector<parity_variant> arms{{sweep.label, sweep.mode, {}}};
  for (const auto& [key, values] : sweep.axes) {
    std::vector<parity_variant> next;
    for (const parity_variant& arm : arms)
      for (const std::string& value : values) {
        parity_variant v = arm;
        v.label += ":" + value;
        v.settings.push_back(key + "=" + value);
        if (key == "data.batch") {  // equal tokens: steps × batch stays the base's
          const std::int64_t b = std::max<std::int64_t>(1, std::atoll(value.c_str()));
          v.settings.push_back("train.steps=" + std::to_string(std::max<std::int64_t>(2, steps * batch / b)));
        }
        next.push_back(std::move(v));
      }
    arms = std::move(next);
  }
  return arms;
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

std::vector<double> gap_pct(const parity_outcome& m, const parity_outcome& dp) {
  std::vector<double> out;
  for (std::size_t s = 0; s < m.gap.size() && s < dp.loss.size(); ++s) out.push_back(100 * m.gap[s] / dp.loss[s]);
  return out;
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

namespace {

/// Paired by seed against dp, in %, averaged over seeds and corpora.
double mean_rel_pct(const parity_result& r, const std::string& label) {
  std::vector<double> rel;
  for (const parity_corpus& c : r.corpora) {
    const parity_outcome& dp = c.modes.front();
    for (const parity_outcome& m : c.modes)
      if (m.mode == label)
        for (double x : gap_pct(m, dp)) rel.push_back(x);
  }
  return mean(rel);
}

double mean_loss(const parity_result& r, const std::string& label) {
  std::vector<double> loss;
  for (const parity_corpus& c : r.corpora)
    for (const parity_outcome& m : c.modes)
      if (m.mode == label) loss.insert(loss.end(), m.loss.begin(), m.loss.end());
  return mean(loss);
}

}  // namespace

expected<sweep_result> run_parity_sweep(const parity_options& o, const sweep_options& s, const config& base,
                                        const bench_hooks& hooks) {
  const std::int64_t steps = o.steps > 0 ? o.steps : base.train.steps;
  sweep_result out;
  parity_options screen = o;
  screen.seeds = s.screen_seeds;
  for (const parity_sweep& sweep : s.sweeps)
    for (parity_variant& arm : expand_sweep(sweep, steps, base.data.batch)) {
      out.points.push_back({sweep.label, arm, 0, 0, false});
      screen.variants.push_back(std::move(arm));
    }
  if (auto ok = check_parity(screen, base); !ok) return ok.err();
  auto first = run_parity_bench(screen, base, hooks);
  if (!first) return first.err();
  out.screen = std::move(*first);
  for (sweep_point& p : out.points) {
    p.rel_pct = mean_rel_pct(out.screen, p.arm.label);
    p.eval_loss = mean_loss(out.screen, p.arm.label);
  }
  // Per sweep, best first (a NaN, e.g. a diverged run, last).
  std::stable_sort(out.points.begin(), out.points.end(), [&](const sweep_point& a, const sweep_point& b) {
    if (a.sweep != b.sweep) {
      auto order = [&](const std::string& label) {
        return std::find_if(s.sweeps.begin(), s.sweeps.end(), [&](const parity_sweep& w) { return w.label == label; });
      };
      return order(a.sweep) < order(b.sweep);
    }
    return !std::isnan(a.rel_pct) && (std::isnan(b.rel_pct) || a.rel_pct < b.rel_pct);
  });
  parity_options final_stage = o;
  std::map<std::string, int> taken;
  for (sweep_point& p : out.points)
    if (taken[p.sweep] < s.top && !std::isnan(p.rel_pct)) {
      ++taken[p.sweep];
      p.chosen = true;
      final_stage.variants.push_back(p.arm);
    }
  config fresh = base;  // stage 2's seeds follow the screen's
  fresh.train.seed = base.train.seed + static_cast<std::uint64_t>(s.screen_seeds);
  auto second = run_parity_bench(final_stage, fresh, hooks);
  if (!second) return second.err();
  out.final = std::move(*second);
  return out;
}

std::string parity_plot(const parity_result& r) {
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
      series band_of_seeds{"", series_color(i), {}, false};
      band_of_seeds.area = high;
      band_of_seeds.area.insert(band_of_seeds.area.end(), low.rbegin(), low.rend());
      lines.push_back(std::move(band_of_seeds));
      lines.push_back(series{m.mode, series_color(i), std::move(mean_line), false});
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
