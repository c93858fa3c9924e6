#pragma once
// bench wan: the four modes race to one eval loss with every link of the
// one-process mesh (run_local_mesh) shaped by the transport — each node's
// transport caps every link it sends on, so a learner's uplink and the shards'
// links down to it are both capped, every frame queued FIFO behind the previous
// ones at the capped rate (link_shaper) — at a cap scaled so that dp's
// communication time per step, relative to its compute time, is what a 12B
// model's is on 2-5 Gbit/s links (wan_scale: the arithmetic). dp is
// synchronous, its loss after n steps does not depend on the link; so its steps
// to the target are measured unshaped and its time per step under the cap, and
// its time to the target is their product (stated as projected). The other
// modes run under the cap until an evaluation of the global model reaches the
// target.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_hooks.hpp"
#include "core/config.hpp"
#include "core/error.hpp"

namespace archipelago {

struct wan_options {
  std::string model = "nano";
  int learners = 2;
  std::int64_t steps = 800;     // every mode's schedule (warm-up, cosine), steps per learner
  std::int64_t dp_steps = 250;  // dp's uncapped run stops here; its loss there is the target
  double target = 0;            // instead: this loss (dp's uncapped run stops at it)
  double mode_seconds = 180;    // bound on each raced mode's run
  double dp_seconds = 40;       // dp's run under the cap, for its step time
  double eval_period_s = 2;
  std::int64_t eval_tokens = 16384;
  std::vector<std::string> modes{"diloco", "streaming", "decoupled"};
  // The reference: a 12B model, dp between learners that are slices of accelerators.
  double ref_params = 12e9;
  double ref_bytes_per_param = 2;  // bf16 gradients up, bf16 parameters down
  double ref_tokens = 1 << 20;     // per learner step
  double ref_chips = 256;
  double ref_chip_tflops = 200;  // sustained, per chip
  double ref_gbit = 5;           // the link the race reproduces
  double ref_latency_ms = 20;    // one way
};

/// The options' own bounds (before any configuration is read).
status check_wan_options(const wan_options& o);

/// The configuration the race starts from, before --config and --set: one
/// shard, one compute thread per learner, liveness bounds for capped links.
config wan_defaults(const wan_options& o);

/// The communication/compute arithmetic: the 12B reference and our scaled cap.
struct wan_scale {
  double ref_step_flops = 0, ref_rate = 0, ref_compute_s = 0, ref_bytes = 0;
  double ours_flops = 0, ours_step_s = 0, ours_bytes = 0;  // one learner step; one direction of dp's exchange
  std::size_t ours_params = 0;
  int ours_batch = 0, ours_context = 0, ours_threads = 0;
  struct link {
    double gbit = 0, comm_s = 0, ratio = 0, cap_mbit = 0;
  };
  std::vector<link> links;  // 2, 5 Gbit/s
  link race;                // the race's, at ref_gbit
  double latency_ms = 0;    // the race's one-way latency, scaled like the cap
};

/// The reference's figures and our model's; our step time comes later (set_step_time).
expected<wan_scale> measure_scale(const wan_options& o, const config& cfg);

/// A link of `gbit` for the reference, and the cap that gives our dp the same
/// communication/compute ratio.
wan_scale::link scale_link(const wan_scale& s, double gbit);

/// Our step's time — dp's step without a cap in this mesh, the learners computing at
/// once, averaged over its whole run: an engine step timed alone swings with this shared
/// machine's load — and the caps that follow from it.
void set_step_time(wan_scale& s, const wan_options& o, double step_s);

struct race_result {
  std::string mode;
  bool reached = false, projected = false;
  double time_s = std::nan(""), final_loss = std::nan(""), wall_s = 0, speedup = std::nan("");
  double bytes = 0, tokens = 0;  // to the target (dp: projected)
  double steps_per_learner = 0;  // to the target
  std::string note;
  std::vector<std::pair<double, double>> curve;  // (seconds, eval loss); dp: projected from its uncapped run
};

struct wan_result {
  wan_scale scale;
  double load_before = 0;
  double tokens_per_step = 0;  // all learners together
  double target = 0;           // eval loss, nats/byte
  bool target_given = false;   // wan_options::target, not dp's final loss
  // dp without a cap
  std::vector<std::pair<std::uint64_t, double>> dp_uncapped_curve;  // (tokens, eval loss)
  double dp_uncapped_loss = 0, dp_tokens = 0, dp_steps = 0, dp_bytes_per_step = 0, dp_uncapped_step_s = 0;
  // dp under the cap
  double dp_step_s = 0;
  double dp_full_duplex_s = 0;  // dp's time to the target with both directions at once
  std::vector<race_result> results;  // dp first, then the racing modes as they finished
};

/// The stages of a race, reported as each is done (with the result so far).
enum class wan_stage { dp_uncapped, dp_capped, mode_raced };

/// The race: dp without a cap (its steps to the target), dp under the cap (its
/// time per step), then every other mode under the cap to the target. `cfg` is
/// wan_defaults() with the user's configuration applied.
expected<wan_result> run_wan_bench(const wan_options& o, const config& cfg, const bench_hooks& hooks,
                                   const std::function<void(wan_stage, const wan_result&)>& on_stage = {});

/// Eval loss against wall-clock: each racing mode as measured, dp projected
/// (dashed: its uncapped curve at its capped step time), the target across.
std::string race_plot(const std::vector<race_result>& results, double target);

}  // namespace archipelago
