#pragma once
// The goodput simulator: a discrete-event model of N accelerator chips grouped
// in slices, with per-chip Poisson interruptions, run under one of three
// training setups (paper Table 1, docs/design/algorithm.md §9.6):
//
//   dp          one synchronous job over all slices, not elastic: it stops while
//               any slice is down, then restarts from its last checkpoint.
//   elastic_dp  one synchronous job that drops a failed slice (a downscale
//               pause) and takes it back when it returns (an upscale pause).
//   decoupled   M learners of N/M chips, each an elastic job of its own; a
//               learner's pause never stops the others.
//
// Pure and deterministic: no clock, no globals; the seed and every constant are
// arguments. The model, its constants and how they were calibrated are
// described in docs/design/goodput-simulator.md.

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/student_t.hpp"  // t95: the intervals of simulate()

namespace archipelago::goodput {

enum class setup : std::uint8_t { dp, elastic_dp, decoupled };
const char* to_string(setup s);
/// "dp", "elastic_dp" or "decoupled"; an error naming the value otherwise.
expected<setup> parse_setup(const std::string& name);

enum class repair_law : std::uint8_t { exponential, lognormal, fixed };
const char* to_string(repair_law r);
expected<repair_law> parse_repair_law(const std::string& name);

/// How non-elastic dp gets a failed slice replaced: `spare` swaps in a spare
/// slice at once and restarts the whole job (a failure during the restart is
/// swapped in the same restart); `repair` waits until every slice of the job is
/// back from repair, then restarts (a failure during the restart aborts it).
enum class dp_recovery : std::uint8_t { spare, repair };
const char* to_string(dp_recovery r);
expected<dp_recovery> parse_dp_recovery(const std::string& name);

/// The free constants of the model. Times are seconds of wall-clock. Three are
/// calibrated on the paper's elastic_dp row (`archipelago simulate
/// --calibrate`): downscale_s, upscale_s, upscale_hold_s. The others are set
/// a priori: the elastic row cannot determine them, and the dp row is not used
/// to set any (docs/design/goodput-simulator.md).
struct constants {
  /// Chips per slice: the unit that fails and is repaired as a whole (one
  /// interrupted chip takes its slice down). A priori: 256.
  double slice_chips = 256;
  /// Mean time for an interrupted slice to come back. A priori: 600 s. Elastic
  /// goodput hardly depends on it (the calibrated pauses absorb any value from
  /// 20 s to an hour), non-elastic dp with dp_mode = repair depends on it entirely.
  double repair_mean_s = 600;
  /// Shape of the repair time: exponential, lognormal (repair_sigma is the
  /// standard deviation of its log; the mean stays repair_mean_s) or fixed.
  repair_law repair = repair_law::lognormal;
  double repair_sigma = 1.0;
  /// Calibrated. Pause of an elastic job (or learner) when a slice of its mesh
  /// fails: detection, the abandoned step, re-forming the mesh without it. A
  /// failure during a pause is folded into it (the mesh is re-formed from the
  /// slices up when the pause ends).
  double downscale_s = 0;
  /// Calibrated. Pause of an elastic job while returned slices join: they fetch
  /// the parameters and the mesh is re-formed with them.
  double upscale_s = 0;
  /// Calibrated. A slice that returns to a training job waits this long for its
  /// upscale, so that slices returning meanwhile share one pause (0: each return
  /// starts one at once). Slices that return during any pause join at its end.
  double upscale_hold_s = 0;
  /// Non-elastic dp only: how a failed slice is replaced. A priori: spare.
  dp_recovery dp_mode = dp_recovery::spare;
  // Non-elastic dp only: a restart from the last checkpoint, from first
  // principles. A failure stops the job; it pays detection, abandoning the step
  // and tearing down (downscale_s, the same events as an elastic job's shrink),
  // rescheduling onto the spare (reschedule_s), bringing every slice up and
  // forming the mesh (upscale_s, as an elastic job's growth), reading the last
  // checkpoint back (reload_s) and anything else (restart_extra_s); and it loses
  // the work since its last checkpoint. Failures during the restart are folded
  // into it. A priori values (docs/design/goodput-simulator.md): the
  // dp row does not enter them.
  /// Rescheduling the job onto a spare slice. A priori: 0 (hot spares: the spare
  /// is up and idle, so placing the job on it is part of bringing it up).
  double reschedule_s = 0;
  /// Reading the last checkpoint back: a slice host's share of the model state
  /// at the storage's read rate. A priori: see calibrated_constants().
  double reload_s = 0;
  /// What a restart costs beyond the above: nothing a priori. `--table` prints
  /// the value each cell of the paper's dp row implies.
  double restart_extra_s = 0;
  /// A checkpoint every this many seconds of training; 0: Young and Daly's
  /// optimum sqrt(2 x checkpoint_write_s x the job's mean time between failures)
  /// when checkpoint_write_s > 0, else none needed (lossless).
  double checkpoint_interval_s = 0;
  /// The training time one checkpoint blocks (the state copied out of the
  /// accelerators; the upload to storage overlaps training). A priori: see
  /// calibrated_constants().
  double checkpoint_write_s = 0;
};

/// The calibrated defaults (docs/design/goodput-simulator.md).
constants calibrated_constants();

struct params {
  setup kind = setup::elastic_dp;
  double chips = 150000;
  /// Learners (decoupled only; dp and elastic_dp are one job).
  int learners = 1;
  /// Mean time between interruptions of one chip, in years (365.25 days).
  double mtbi_years = 1.0;
  /// Simulated wall-clock horizon.
  double days = 30;
  constants k;
};

/// Every parameter in its range; the error names the first one that is not.
status validate(const params& p);

/// One run's outcome.
struct run_result {
  /// Useful chip-time / (chips × wall-clock): chip-seconds spent on steps whose
  /// work ends in the model (not paused, not stalled, not rolled back).
  double goodput = 0;
  /// Share of wall-clock in which the global model advances: at least one job
  /// or learner is training, and that training is not rolled back later.
  double uptime = 0;
  std::uint64_t interruptions = 0;  // slice failures
  std::uint64_t events = 0;         // events processed by the loop
};

/// dp's seconds of training between checkpoints: checkpoint_interval_s, or
/// Young and Daly's optimum for the job's failure rate, or 0 (lossless).
double checkpoint_interval(const params& p);

/// A non-elastic restart's fixed cost: downscale, reschedule, upscale, reload and extra.
inline double restart_s(const constants& k) {
  return k.downscale_s + k.reschedule_s + k.upscale_s + k.reload_s + k.restart_extra_s;
}

/// One seeded run. Requires validate(p).
run_result simulate_once(const params& p, std::uint64_t seed);

/// A mean with the half-width of its 95 % confidence interval (Student t over
/// the replications; 0 with one replication).
struct interval {
  double mean = 0;
  double half_width = 0;
};

using archipelago::t95;  // the quantile of the intervals below (core/student_t.hpp)

struct estimate {
  interval goodput, uptime;
  int replications = 0;
  double interruptions_per_run = 0;
  std::uint64_t events = 0;
};

/// R independent replications, replication r seeded with derive_seed(seed, r).
estimate simulate(const params& p, int replications, std::uint64_t seed);

// ---- paper Table 1 -----------------------------------------------------------

inline constexpr std::array<double, 5> table_chips{150000, 300000, 600000, 1200000, 2400000};

struct table_row {
  const char* name;  // dp, elastic_dp, decoupled_2, …
  setup kind;
  int learners;
  std::array<double, 5> paper_pct;  // goodput in %
};

/// The paper's Table 1 (docs/design/algorithm.md §9.6), chip MTBI = 1 year.
const std::array<table_row, 6>& paper_table();

struct table_cell {
  std::string row;
  double chips = 0;
  estimate ours;
  double paper_pct = 0;
  double diff_pts = 0;  // ours − paper, in percentage points
  bool within = false;  // |diff| <= tolerance
  /// dp cells: the restart_extra_s at which ours equals the paper's value (0:
  /// ours is at or below it already), and the range that puts ours within the
  /// tolerance (NaN: no cost from 0 to an hour does; the high end NaN: above an hour).
  double implied_extra_s = std::nan(""), implied_extra_lo_s = std::nan(""), implied_extra_hi_s = std::nan("");
};

/// Every cell of Table 1 simulated with `base` (its setup, chips and learners
/// replaced per cell); `within` uses tolerance_pts. dp cells also get the extra
/// restart cost the paper's value implies (by bisection over restart_extra_s,
/// the same seeds for every candidate).
std::vector<table_cell> run_table(const params& base, int replications, std::uint64_t seed,
                                  double tolerance_pts = 3.0);

/// The restart_extra_s in [0, 3600] s at which dp's mean goodput is `goodput`
/// (`p` is a dp setup; goodput falls as the cost grows): 0 when it is below
/// `goodput` already without any, NaN when it is above it even at an hour.
double implied_restart_extra(const params& p, double goodput, int replications, std::uint64_t seed);

// ---- calibration -------------------------------------------------------------

struct calibration {
  constants best;
  double rms_error_pts = 0;  // over the elastic_dp row
  double max_error_pts = 0;
  std::array<double, 5> ours_pct{};
  int candidates = 0;  // constant sets evaluated
};

/// A deterministic coordinate search over downscale_s, upscale_s and
/// upscale_hold_s (multiplicative steps from ×2 down to ×1.01), minimising the
/// RMS error against the paper's elastic_dp row only. Every candidate is simulated
/// with the same seeds (common random numbers), so the search is smooth and
/// reproducible. `start` supplies the other constants and the first point.
/// `progress`, if set, hears (candidates so far, best RMS so far) after each one.
calibration calibrate(const params& base, const constants& start, int replications, std::uint64_t seed,
                      const std::function<void(int, double)>& progress = {});

}  // namespace archipelago::goodput
