#pragma once
// bench ablate WHICH: the paper's ablations (docs/design/algorithm.md §9) on the
// one-process mesh (run_local_mesh), every variant on the same seeds and the
// same budget, against a reference variant run in the same invocation:
//   merge      RDA vs the token-weighted mean (mesh.merge), at M = 8 and M = 16,
//              the same tokens at both M; reference: mean
//   encoding   fp32, bf16, int8, int4, int2 outer gradients (wire.encoding); reference: fp32
//   quorum     half the learners paced 2x slower; K=1 + grace, K=1 without grace, K=M,
//              and K=M lock-step (streaming, H = P), for the same wall time; reference: K=1 + grace
//   fragments  P in {2, 6, 12, 24}; reference: the default, 24
// Learners are paced (mesh.step_time_ms, calibrated like a drill's budget unless
// given): on two cores, 8 or 16 unpaced learners would measure CPU contention,
// not the algorithm. Variants alternate within each seed, so a drift in the load
// of this shared machine falls on all of them alike. Goodput and uptime come from
// the broker's ledger, which pacing makes robust to that load.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_hooks.hpp"
#include "core/config.hpp"
#include "core/error.hpp"

namespace archipelago {

struct ablate_options {
  std::string which;        // merge, encoding, quorum, fragments or robust (mesh.robust off vs on)
  std::int64_t steps = 0;   // 0: the ablation's default (merge 600 at the smallest M, the others 1000)
  int learners = 4;         // encoding, quorum, fragments
  std::vector<int> merge_learners{8, 16};
  std::vector<int> fragments{2, 6, 12, 24};
  std::vector<std::string> encodings{"fp32", "bf16", "int8", "int4", "int2"};
  int seeds = 1;              // train.seed, +1, ...
  double step_time_ms = 0;    // 0: calibrated per M
  double eval_period_s = 10;  // evaluations of Θ during a run (the plot's points)
};

/// One configuration of an ablation.
struct ablate_variant {
  std::string group;  // variants are compared within a group ("M=8"); empty: one group
  std::string name;
  std::string knobs;  // what makes it, as --set flags
  std::string paper;  // the paper's figure for it, or "" when it gives none
  bool reference = false;
  int learners = 4;
  std::int64_t steps = 0;
  std::function<void(config&)> apply;
  bool whole_schedule = false;  // quorum: runs every step instead of the common wall time
};

/// The variants of one ablation and the configuration each runs with.
struct ablate_plan {
  std::vector<ablate_variant> variants;
  std::string second_reference;  // a second baseline (encoding: bf16, the paper's); empty: none
  std::vector<config> configs;   // one per variant, once configure_variants() ran
};

/// A variant's runs, one per seed.
struct ablate_outcome {
  std::vector<double> loss, bpb, goodput, uptime, bytes, wall_s, tokens, steps, members, late, overruns;
  std::vector<double> rel;         // loss vs the group's reference, same seed, in %
  std::vector<double> rel_second;  // vs the second reference (encoding: bf16), in %
  double step_time_ms = 0;
  bool ledger_exact = true;
  std::vector<std::vector<std::pair<double, double>>> curves;  // per seed: (tokens, eval loss)
};

/// What the paper claims, judged on our numbers (the criterion is in the text).
struct ablate_claim {
  std::string text;
  bool reproduced = false;
};

struct ablate_result {
  ablate_plan plan;
  std::vector<ablate_outcome> outcomes;  // one per variant
  std::vector<ablate_claim> claims;
  double load_before = 0, load_after = 0, wall_s = 0;
  bool ledger_exact = true;                      // in every run
  double budget_overruns = 0, steps_total = 0;  // paced steps over budget, of all steps
};

/// The variants of o.which, in the order they run and print.
ablate_plan plan_ablation(const ablate_options& o);

/// The learners' pace of the quorum ablation: the first half at full speed, the
/// second half 2x slower ("1,1,2,2" at M = 4).
std::string heterogeneous_slowdown(int m);

/// Every variant's configuration from `base`, checked before the first run
/// starts; an invalid one is named ("variant P=4000: ...").
status configure_variants(ablate_plan& plan, const ablate_options& o, const config& base);

/// Paces every variant at its M's budget (step_ms_by_learners); the quorum
/// ablation's variants also get a common wall time.
void pace_variants(ablate_plan& plan, const ablate_options& o, const std::map<int, double>& step_ms_by_learners);

/// The eval loss of a curve at `tokens`, linearly between its points; NaN outside it.
double loss_at(const std::vector<std::pair<double, double>>& curve, double tokens);

/// Each variant's loss relative to its group's reference (and to the second
/// reference), paired by seed: the same seed's reference run.
void pair_by_seed(const ablate_plan& plan, std::vector<ablate_outcome>& outcomes, int seeds);

/// The paper's claims for o.which, judged on the outcomes; none for fragments.
std::vector<ablate_claim> ablate_claims(const ablate_options& o, const ablate_plan& plan,
                                        const std::vector<ablate_outcome>& outcomes);

/// Eval loss against tokens, one chart per group, one line per variant (the
/// reference dashed), from each variant's first seed; an SVG document.
std::string ablation_plot(const std::string& which, const std::vector<ablate_variant>& variants,
                          const std::vector<ablate_outcome>& outcomes);

/// The whole ablation: plan, configure, calibrate, run every seed of every
/// variant, compare, judge.
expected<ablate_result> run_ablate_bench(const ablate_options& o, const config& base, const bench_hooks& hooks);

}  // namespace archipelago
