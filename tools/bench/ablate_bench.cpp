#include "bench/ablate_bench.hpp"

#include <algorithm>

#include "bench/bench_mesh.hpp"
#include "bench/bench_stats.hpp"
#include "drill/drill.hpp"

namespace archipelago {
namespace {

void add(ablate_plan& plan, std::string group, std::string name, std::string knobs, std::string paper, bool reference,
         int learners, std::int64_t steps, std::function<void(config&)> apply) {
  plan.variants.push_back({std::move(group), std::move(name), std::move(knobs), std::move(paper), reference, learners,
                           steps, std::move(apply)});
}

/// Without a variant named as the reference, the first is.
void ensure_reference(ablate_plan& plan) {
  auto& v = plan.variants;
  if (!v.empty() && std::none_of(v.begin(), v.end(), [](const ablate_variant& x) { return x.reference; }))
    v.front().reference = true;
}

void plan_merge(ablate_plan& plan, const ablate_options& o) {
  // The same tokens at every M: the smallest M runs --steps, the others proportionally fewer.
  const std::int64_t steps = o.steps > 0 ? o.steps : 600;
  const int smallest = *std::min_element(o.merge_learners.begin(), o.merge_learners.end());
  for (int m : o.merge_learners) {
    const std::string g = "M=" + std::to_string(m);
    const std::int64_t s = std::max<std::int64_t>(1, steps * smallest / m);
    add(plan, g, "mean", "--set mesh.merge=mean", m == 8 ? "eval avg 54.1" : m == 16 ? "eval avg 52.7" : "", true, m,
        s, [](config& c) { c.mesh.merge = "mean"; });
    add(plan, g, "rda", "--set mesh.merge=rda",
        m == 8 ? "eval avg 55.4 (+1.3 pt)" : m == 16 ? "eval avg 54.5 (+1.8 pt)" : "", false, m, s,
        [](config& c) { c.mesh.merge = "rda"; });
  }
}

void plan_encoding(ablate_plan& plan, const ablate_options& o) {
  const std::int64_t steps = o.steps > 0 ? o.steps : 1000;
  plan.second_reference = "bf16";
  for (const auto& e : o.encodings) {
    std::string paper = e == "bf16"   ? "paper's reference"
                        : e == "int4" ? "+0.09 % vs bf16"
                        : e == "int2" ? "+32 % vs bf16 (breaks)"
                                      : "";
    add(plan, "", e, "--set wire.encoding=" + e, paper, e == "fp32", o.learners, steps,
        [e](config& c) { c.wire.encoding = e; });
  }
  ensure_reference(plan);
}

void plan_quorum(ablate_plan& plan, const ablate_options& o) {
  const std::int64_t steps = o.steps > 0 ? o.steps : 1000;
  const int m = o.learners;
  add(plan, "", "K=1 + grace", "", "100 % goodput, dp-level quality", true, m, steps, [](config&) {});
  add(plan, "", "K=1, no grace", "--set mesh.grace=false", "loses quality", false, m, steps,
      [](config& c) { c.mesh.grace = false; });
  add(plan, "", "K=M", "--set mesh.quorum=" + std::to_string(m), "loses goodput", false, m, steps,
      [m](config& c) { c.mesh.quorum = m; });
  add(plan, "", "K=M lock-step", "--mode streaming --set mesh.inner_steps=P --set mesh.mix=0", "loses goodput", false,
      m, steps, [](config& c) {
        c.mesh.mode = "streaming";
        c.mesh.inner_steps = c.mesh.fragments;  // every fragment syncs every P steps, as decoupled's do
        c.mesh.mix = 0;
      });
  // The quality reference: synchronous dp through the whole schedule (the slow learners
  // pace every step); its curve gives dp's loss at the tokens each variant processed.
  add(plan, "", "dp", "--mode dp (every step, no time limit)", "the quality reference", false, m, steps,
      [](config& c) { c.mesh.mode = "dp"; });
  plan.variants.back().whole_schedule = true;
}

void plan_fragments(ablate_plan& plan, const ablate_options& o) {
  const std::int64_t steps = o.steps > 0 ? o.steps : 1000;
  const int reference = config{}.mesh.fragments;
  for (int p : o.fragments)
    add(plan, "", "P=" + std::to_string(p), "--set mesh.fragments=" + std::to_string(p), "", p == reference,
        o.learners, steps, [p](config& c) { c.mesh.fragments = p; });
  ensure_reference(plan);
}

void plan_robust(ablate_plan& plan, const ablate_options& o) {
  // The fault-free cost of mesh.robust: the same seeds with and without it.
  const std::int64_t steps = o.steps > 0 ? o.steps : 1000;
  add(plan, "", "robust off", "", "", true, o.learners, steps, [](config& c) { c.mesh.robust = false; });
  add(plan, "", "robust on", "--set mesh.robust=true", "", false, o.learners, steps,
      [](config& c) { c.mesh.robust = true; });
}

/// The compute budget per step for every M the variants use: given, or calibrated.
std::map<int, double> step_budgets(const ablate_plan& plan, const ablate_options& o, const config& base,
                                   const bench_hooks& hooks) {
  std::map<int, double> step_ms;
  for (const auto& v : plan.variants) {
    if (step_ms.count(v.learners)) continue;
    double ms = o.step_time_ms;
    if (ms <= 0) {
      hooks.begin("bench ablate " + o.which + ": calibrating the step budget for M=" + std::to_string(v.learners));
      config c = base;
      c.mesh.learners = v.learners;
      ms = calibrate_step_time_ms(c);
    }
    step_ms[v.learners] = ms;
  }
  return step_ms;
}

/// Adds one run's figures to its variant's outcome.
void record(ablate_outcome& r, const mesh_summary& s, double step_time_ms) {
  r.loss.push_back(s.eval_loss);
  r.bpb.push_back(s.eval_bpb);
  r.goodput.push_back(s.goodput);
  r.uptime.push_back(s.broker.uptime);
  r.bytes.push_back(static_cast<double>(s.bytes_on_wire));
  r.wall_s.push_back(s.wall_s);
  r.tokens.push_back(static_cast<double>(s.tokens));
  r.steps.push_back(static_cast<double>(s.steps));
  r.members.push_back(s.mean_members);
  r.late.push_back(static_cast<double>(s.broker.ledger.late));
  r.overruns.push_back(static_cast<double>(s.budget_overruns));
  r.step_time_ms = step_time_ms;
  r.ledger_exact = r.ledger_exact && s.ledger_exact;
  r.curves.emplace_back();
  for (const auto& [tokens, loss] : s.eval_curve) r.curves.back().emplace_back(static_cast<double>(tokens), loss);
}

/// Every variant once per seed, the variants alternating within a seed.
expected<std::vector<ablate_outcome>> run_variants(const ablate_plan& plan, const ablate_options& o,
                                                   const config& base, const bench_hooks& hooks) {
  std::vector<ablate_outcome> outcomes(plan.variants.size());
  const int runs = static_cast<int>(plan.variants.size()) * o.seeds;
  int run = 0;
  for (int seed = 1; seed <= o.seeds; ++seed) {
    for (std::size_t i = 0; i < plan.variants.size(); ++i) {
      if (hooks.stopped()) return interrupted();
      ++run;
      const ablate_variant& v = plan.variants[i];
      config c = plan.configs[i];
      c.train.seed = base.train.seed + static_cast<std::uint64_t>(seed - 1);
      const std::string label = "bench ablate " + o.which + ": run " + std::to_string(run) + "/" +
                                std::to_string(runs) + " (" + (v.group.empty() ? "" : v.group + " ") + v.name +
                                ", seed " + std::to_string(c.train.seed) + ")";
      hooks.begin(label);
      auto s = run_bench_mesh(c, hooks, label, 80, mesh_eval{o.eval_period_s});
      if (!s) return hooks.stopped() ? interrupted() : make_error(s.err().code, v.name + ": " + s.err().message);
      record(outcomes[i], *s, c.mesh.step_time_ms);
    }
  }
  return outcomes;
}

}  // namespace

ablate_plan plan_ablation(const ablate_options& o) {
  ablate_plan plan;
  if (o.which == "merge") plan_merge(plan, o);
  else if (o.which == "encoding") plan_encoding(plan, o);
  else if (o.which == "quorum") plan_quorum(plan, o);
  else if (o.which == "robust") plan_robust(plan, o);
  else plan_fragments(plan, o);
  return plan;
}

std::string heterogeneous_slowdown(int m) {
  std::string s;
  for (int i = 0; i < m; ++i) s += (i ? "," : "") + std::string(i < m / 2 ? "1" : "2");
  return s;
}

status configure_variants(ablate_plan& plan, const ablate_options& o, const config& base) {
  plan.configs.clear();
  for (const auto& v : plan.variants) {
    config c = base;
    c.mesh.learners = v.learners;
    c.train.steps = v.steps;
    v.apply(c);
    if (o.which == "quorum") c.mesh.learner_slowdown = heterogeneous_slowdown(v.learners);
    if (auto ok = validate_mesh(c); !ok)
      return make_error(errc::invalid_input, "variant " + v.name + ": " + ok.err().message);
    plan.configs.push_back(std::move(c));
  }
  return {};
}

void pace_variants(ablate_plan& plan, const ablate_options& o, const std::map<int, double>& step_ms_by_learners) {
  for (std::size_t i = 0; i < plan.variants.size(); ++i) {
    config& c = plan.configs[i];
    c.mesh.step_time_ms = step_ms_by_learners.at(plan.variants[i].learners);
    // Quorum: the same wall time for every variant, ending just before the fast learners
    // would finish their schedule, so nobody idles at the end and goodput is the mesh's.
    if (o.which == "quorum" && !plan.variants[i].whole_schedule)
      c.train.time_limit_s = 0.95 * static_cast<double>(c.train.steps) * c.mesh.step_time_ms * 1e-3;
  }
}

expected<ablate_result> run_ablate_bench(const ablate_options& o, const config& base, const bench_hooks& hooks) {
  if (o.which == "merge" && base.mesh.mode != "decoupled" && base.mesh.mode != "streaming")
    return make_error(errc::invalid_input, "bench ablate merge: mesh.mode " + base.mesh.mode +
                                               " merges gradients or one fragment; use decoupled");
  ablate_result r;
  r.plan = plan_ablation(o);
  if (auto ok = configure_variants(r.plan, o, base); !ok) return ok.err();
  pace_variants(r.plan, o, step_budgets(r.plan, o, base, hooks));

  r.load_before = load_average();
  const auto started = seconds_clock::now();
  auto outcomes = run_variants(r.plan, o, base, hooks);
  if (!outcomes) return outcomes.err();
  r.outcomes = std::move(*outcomes);
  pair_by_seed(r.plan, r.outcomes, o.seeds);
  r.wall_s = since(started);
  r.load_after = load_average();
  for (const auto& x : r.outcomes) {
    r.ledger_exact = r.ledger_exact && x.ledger_exact;
    for (double n : x.overruns) r.budget_overruns += n;
    for (double n : x.steps) r.steps_total += n;
  }
  r.claims = ablate_claims(o, r.plan, r.outcomes);
  return r;
}

}  // namespace archipelago
