#pragma once
// bench parity: does asynchrony cost quality? Every mode (dp, diloco, streaming,
// decoupled) trains the same model on the same corpus for the same token budget,
// on N seeds each, unpaced on the one-process mesh; dp is the reference. Per mode:
// the final eval loss at equal tokens (mean and 95 % confidence interval over
// seeds), the tokens it needed to reach dp's final loss of the same seed
// (interpolated on its eval curve; the ratio to dp's own, paired by seed), the
// excess over the corpus's entropy floor when it has one (the synthetic corpus),
// goodput. Modes alternate within each seed, so a drift in the load of this
// shared machine falls on all of them alike.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_hooks.hpp"
#include "core/config.hpp"
#include "core/error.hpp"

namespace archipelago {

/// A mode run with settings of its own (an algorithmic knob's ablation beside
/// the plain modes): "LABEL=MODE,KEY=VALUE,...".
struct parity_variant {
  std::string label, mode;
  std::vector<std::string> settings;  // KEY=VALUE, applied over the base configuration
};
expected<parity_variant> parse_parity_variant(std::string_view spec);

struct parity_options {
  std::vector<std::string> modes{"dp", "diloco", "streaming", "decoupled"};  // dp runs first: the reference
  std::vector<parity_variant> variants;  // run after the modes, within each seed
  std::vector<std::string> corpora{""};  // "" is the built-in synthetic corpus
  int learners = 4;
  int seeds = 3;                // train.seed, +1, ...
  std::int64_t steps = 0;       // inner steps per learner; 0: the configuration's train.steps
  double eval_period_s = 10;    // evaluations of Θ during a run (the curve's points)
};

/// A grid of settings for one mode (bench parity --sweep): "LABEL=MODE,KEY=V1|V2|...,...".
/// Every combination of the axes' values is one arm. An axis on data.batch keeps the
/// tokens equal: each of its values also sets train.steps to the base steps × base
/// batch / that batch.
struct parity_sweep {
  std::string label, mode;
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;  // KEY, its values
};
expected<parity_sweep> parse_parity_sweep(std::string_view spec);

/// The grid's arms, in order (the last axis varies fastest), labelled
/// "LABEL:V1:V2:..." (the values in axis order). `steps` and `batch` are the base
/// budget's (for a data.batch axis).
std::vector<parity_variant> expand_sweep(const parity_sweep& sweep, std::int64_t steps, int batch);

/// One curve: (tokens, eval loss), tokens ascending.
using loss_curve = std::vector<std::pair<double, double>>;

/// The tokens at which `curve` first reaches `target` (loss ≤ target), linearly
/// between its points; NaN when it never does.
double tokens_to_reach(const loss_curve& curve, double target);

/// A mode's runs on one corpus, one entry per seed.
struct parity_outcome {
  std::string mode;  // or a variant's label
  std::vector<double> loss, bpb, excess_bpb, tokens, goodput, wall_s;
  std::vector<double> reach_tokens;  // to the same seed's dp final loss; NaN: never reached
  std::vector<double> reach_ratio;   // reach_tokens / dp's own, per seed (NaN where not reached)
  std::vector<double> gap;           // final loss − dp's final loss, per seed
  std::vector<loss_curve> curves;
  bool ledger_exact = true;
};

struct parity_corpus {
  std::string corpus;  // "" : synthetic
  double entropy_floor_bpb = 0;  // NaN: unknown (a real text)
  std::vector<parity_outcome> modes;  // parity_options::modes, then its variants; the first is dp
};

struct parity_result {
  std::vector<parity_corpus> corpora;
  double load_before = 0, load_after = 0, wall_s = 0;
  bool ledger_exact = true;
};

/// One arm's configuration: `base` with the arm's mode, --steps, then the arm's own
/// settings (so a variant's train.steps overrides --steps), M and the corpus.
expected<config> parity_arm_config(const parity_options& o, const config& base, const parity_variant& arm,
                                   const std::string& corpus);

/// Checks the options and every mode's configuration from `base` before any run.
status check_parity(const parity_options& o, const config& base);

/// Every seed of every mode on every corpus; then the comparisons with dp.
expected<parity_result> run_parity_bench(const parity_options& o, const config& base, const bench_hooks& hooks);

/// Fills reach_tokens, reach_ratio and gap of every mode against the corpus's first (dp):
/// per seed, the tokens to dp's final loss of the same seed, their ratio to dp's own
/// (NaN where either never reached it) and the final loss minus dp's.
void compare_with_reference(parity_corpus& c);

/// The final loss against dp's of the same seed, in percent: 100 × gap / dp's loss, one per
/// seed (the "vs dp" figure, +2.74 means 2.74 % worse than dp).
std::vector<double> gap_pct(const parity_outcome& m, const parity_outcome& dp);

/// A staged sweep: stage 1 runs every grid point (with the modes and variants of
/// `o`) on `screen_seeds` seeds; each sweep's points are ranked by their final loss
/// against dp's, paired by seed and averaged over seeds and corpora; stage 2 runs the
/// modes, the variants and each sweep's best `top` points on o.seeds fresh seeds
/// (after the screen's), so the winners' figures carry no selection bias.
struct sweep_options {
  std::vector<parity_sweep> sweeps;
  int top = 2;
  int screen_seeds = 1;
};

struct sweep_point {
  std::string sweep;  // the sweep's label
  parity_variant arm;
  double rel_pct = 0;  // stage 1: vs dp, mean over seeds and corpora
  double eval_loss = 0;  // stage 1: mean over seeds and corpora
  bool chosen = false;   // among its sweep's best `top`: run in stage 2
};

struct sweep_result {
  parity_result screen, final;
  std::vector<sweep_point> points;  // every grid point, per sweep, best first
};

/// Stage 1, the ranking, stage 2. With top = 0 stage 2 runs the modes and variants only.
expected<sweep_result> run_parity_sweep(const parity_options& o, const sweep_options& s, const config& base,
                                        const bench_hooks& hooks);

/// Eval loss against tokens, one chart per corpus: per mode the mean over seeds and
/// a band from the lowest to the highest seed, dp's final loss as a dashed line.
std::string parity_plot(const parity_result& r);

}  // namespace archipelago
