// The figures of an ablation once its runs are in: losses relative to the
// references, the paper's claims judged on them, and the plot.

#include <cmath>
#include <cstdio>

#include "bench/ablate_bench.hpp"
#include "bench/bench_stats.hpp"
#include "report/svg_chart.hpp"

namespace archipelago {
namespace {

const ablate_outcome* find(const ablate_plan& plan, const std::vector<ablate_outcome>& outcomes,
                           const std::string& group, const std::string& name) {
  for (std::size_t i = 0; i < plan.variants.size(); ++i)
    if (plan.variants[i].group == group && plan.variants[i].name == name) return &outcomes[i];
  return nullptr;
}

/// A claim's text: `format` with one or two numbers.
std::string said(const char* format, double a, double b = 0) {
  char text[200];
  std::snprintf(text, sizeof text, format, a, b);
  return text;
}

void merge_claims(std::vector<ablate_claim>& out, const ablate_options& o, const ablate_plan& plan,
                  const std::vector<ablate_outcome>& outcomes) {
  for (int m : o.merge_learners) {
    const std::string g = "M=" + std::to_string(m);
    const ablate_outcome* rda = find(plan, outcomes, g, "rda");
    if (rda == nullptr) continue;
    out.push_back({"RDA beats the weighted mean at " + g + said(": eval loss %+.2f %% vs mean", mean(rda->rel)),
                   mean(rda->rel) < 0});
  }
}

void encoding_claims(std::vector<ablate_claim>& out, const ablate_plan& plan,
                     const std::vector<ablate_outcome>& outcomes) {
  if (const ablate_outcome* int4 = find(plan, outcomes, "", "int4"); int4 && !int4->rel_second.empty())
    out.push_back({said("int4 ≈ bf16 (within 1 %%): %+.2f %% vs bf16", mean(int4->rel_second)),
                   std::abs(mean(int4->rel_second)) <= 1});
  if (const ablate_outcome* int2 = find(plan, outcomes, "", "int2"); int2 && !int2->rel_second.empty())
    out.push_back({said("2-bit breaks (worse than bf16 by more than 5 %%): %+.2f %% vs bf16", mean(int2->rel_second)),
                   mean(int2->rel_second) > 5});
}

void robust_claims(std::vector<ablate_claim>& out, const ablate_plan& plan, const std::vector<ablate_outcome>& outcomes) {
  const ablate_outcome* on = find(plan, outcomes, "", "robust on");
  if (!on || on->rel.empty()) return;
  // Paired by seed: rel is robust-on's loss vs the same seed's robust-off run, in %.
  const double m = mean(on->rel);
  const std::size_t n = on->rel.size();
  const double half = n >= 2 ? ci95(on->rel) : NAN;  // one seed shows nothing
  // Shown only when the whole interval is inside the bar: a mean inside it with an interval
  // reaching past it has not shown the cost is that small.
  out.push_back({said("mesh.robust costs at most 0.5 %% eval loss fault-free: %+.3f %% ", m) +
                     said("(95 %% CI %+.3f to ", m - half) + said("%+.3f %%, paired over ", m + half) +
                     std::to_string(n) + " seeds)",
                 m + half <= 0.5});
}

void quorum_claims(std::vector<ablate_claim>& out, const ablate_plan& plan,
                   const std::vector<ablate_outcome>& outcomes) {
  const ablate_outcome* grace = find(plan, outcomes, "", "K=1 + grace");
  const ablate_outcome* none = find(plan, outcomes, "", "K=1, no grace");
  const ablate_outcome* all = find(plan, outcomes, "", "K=M");
  const ablate_outcome* lock = find(plan, outcomes, "", "K=M lock-step");
  const ablate_outcome* dp = find(plan, outcomes, "", "dp");
  if (!grace || !none || !all || !lock || !dp) return;
  // dp-level quality: K=1 + grace's loss against dp's at the same tokens, seed by seed.
  std::vector<double> vs_dp;
  for (std::size_t k = 0; k < grace->curves.size() && k < dp->curves.size(); ++k)
    vs_dp.push_back(100 * (grace->loss[k] / loss_at(dp->curves[k], grace->tokens[k]) - 1));
  const double g = mean(grace->goodput);
  out.push_back({said("K=1 + grace keeps goodput (>= 98 %%): %.1f %%", 100 * g), g >= 0.98});
  out.push_back({said("K=1 without grace loses quality (loss above K=1 + grace): %+.2f %%", mean(none->rel)),
                 mean(none->rel) > 0});
  out.push_back({said("K=M loses goodput (below K=1 + grace by > 1 point): %.1f %% vs %.1f %%",
                      100 * mean(all->goodput), 100 * g),
                 mean(all->goodput) < g - 0.01});
  out.push_back({said("K=M lock-step loses goodput (below K=1 + grace by > 1 point): %.1f %%", 100 * mean(lock->goodput)),
                 mean(lock->goodput) < g - 0.01});
  out.push_back({said("K=1 + grace at dp-level quality (loss within 2 %% of dp's at the same tokens): %+.2f %% vs dp",
                      mean(vs_dp)),
                 std::abs(mean(vs_dp)) <= 2 || mean(vs_dp) < 0});
}

}  // namespace

double loss_at(const std::vector<std::pair<double, double>>& curve, double tokens) {
  for (std::size_t i = 1; i < curve.size(); ++i)
    if (curve[i].first >= tokens && curve[i - 1].first <= tokens) {
      const auto [t0, l0] = curve[i - 1];
      const auto [t1, l1] = curve[i];
      return t1 > t0 ? l0 + (l1 - l0) * (tokens - t0) / (t1 - t0) : l1;
    }
  return std::nan("");
}

void pair_by_seed(const ablate_plan& plan, std::vector<ablate_outcome>& outcomes, int seeds) {
  const auto& v = plan.variants;
  for (std::size_t i = 0; i < v.size(); ++i) {
    outcomes[i].rel.clear();
    outcomes[i].rel_second.clear();
    for (std::size_t j = 0; j < v.size(); ++j) {
      if (v[j].group != v[i].group) continue;
      for (int k = 0; k < seeds; ++k) {
        const double rel = 100 * (outcomes[i].loss[k] / outcomes[j].loss[k] - 1);
        if (v[j].reference) outcomes[i].rel.push_back(rel);
        if (!plan.second_reference.empty() && v[j].name == plan.second_reference) outcomes[i].rel_second.push_back(rel);
      }
    }
  }
}

std::vector<ablate_claim> ablate_claims(const ablate_options& o, const ablate_plan& plan,
                                        const std::vector<ablate_outcome>& outcomes) {
  std::vector<ablate_claim> out;
  if (o.which == "merge") merge_claims(out, o, plan, outcomes);
  else if (o.which == "encoding") encoding_claims(out, plan, outcomes);
  else if (o.which == "quorum") quorum_claims(out, plan, outcomes);
  else if (o.which == "robust") robust_claims(out, plan, outcomes);
  return out;
}

std::string ablation_plot(const std::string& which, const std::vector<ablate_variant>& variants,
                          const std::vector<ablate_outcome>& outcomes) {
  std::vector<std::string> charts;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const std::string& group = variants[i].group;
    if (i > 0 && variants[i - 1].group == group) continue;
    std::vector<series> lines;
    for (std::size_t j = i; j < variants.size() && variants[j].group == group; ++j)
      lines.push_back(
          series{variants[j].name, series_color(lines.size()),
                 outcomes[j].curves.empty() ? std::vector<std::pair<double, double>>{} : outcomes[j].curves.front(),
                 variants[j].reference});
    charts.push_back(chart("bench ablate " + which + (group.empty() ? "" : ", " + group) +
                               ": eval loss (the reference dashed)",
                           "tokens", "eval loss, nats/byte", lines, {}));
  }
  return stack_charts(charts);
}

}  // namespace archipelago
