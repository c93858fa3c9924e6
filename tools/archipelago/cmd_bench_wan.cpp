// archipelago bench wan: the four modes race to one eval loss with every link
// of the one-process mesh (run_local_mesh) shaped by the transport — each
// node's transport caps every link it sends on, so a learner's uplink and the
// shards' links down to it are both capped, every frame queued FIFO behind the
// previous ones at the capped rate (link_shaper) — at a cap scaled so that dp's
// communication time per step, relative to its compute time, is what a 12B
// model's is on 2-5 Gbit/s links (the arithmetic is printed). dp is
// synchronous, its loss after n steps does not depend on the link; so its
// steps to the target are measured unshaped and its time per step under the
// cap, and its time to the target is their product (stated as projected). The
// other modes run under the cap until an evaluation of the global model reaches
// the target.
//
// archipelago bench ddp: our dp (2 learners, unshaped) against PyTorch DDP over
// gloo (tools/bench/ddp_reference.py, the same model and global batch), in
// interleaved rounds, each ratio taken within a round: step time and bytes per step.

#include "cmd_bench_wan.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_stats.hpp"
#include "cli_common.hpp"
#include "report/svg_chart.hpp"
#include "learner/model/gpt.hpp"
#include "node/local_mesh.hpp"

namespace archipelago::cli {
namespace {

// ---- shared ---------------------------------------------------------------------

error interrupted() { return make_error(errc::internal, "interrupted"); }

/// Seconds per round in the steady part of a run, from its half-second timeline:
/// from the first sample with at least `from_rounds` rounds closed to the last
/// sample. NaN when fewer than two rounds closed in between.
double seconds_per_round(const mesh_summary& s, std::uint64_t from_rounds) {
  const run_sample* first = nullptr;
  const run_sample* last = nullptr;
  for (const auto& x : s.timeline) {
    if (x.rounds >= from_rounds && first == nullptr) first = &x;
    last = &x;
  }
  if (first == nullptr || last == nullptr || last->rounds < first->rounds + 2) return std::nan("");
  return (last->t_s - first->t_s) / static_cast<double>(last->rounds - first->rounds);
}

/// Runs the mesh with a labelled progress line.
expected<mesh_summary> run_mesh(const config& cfg, const mesh_eval& eval, progress_line& progress,
                                const std::string& label) {
  progress.update("bench: " + label, true);
  auto s = run_local_mesh(
      cfg,
      [&](const std::string& line) {
        progress.update(label + ": " + line.substr(0, std::min<std::size_t>(line.size(), 100)));
      },
      [] { return stop_requested.load(); }, {}, nullptr, {}, eval);
  if (!s) return s.err();
  if (stop_requested.load()) return interrupted();
  return s;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string human_bytes(double b) {
  if (b >= 1e9) return fmt("%.2f GB", b / 1e9);
  if (b >= 1e6) return fmt("%.1f MB", b / 1e6);
  if (b >= 1e3) return fmt("%.1f kB", b / 1e3);
  return fmt("%.0f B", b);
}

// ---- bench wan ----------------------------------------------------------------------

struct wan_options {
  bool json = false;
  std::string model = "nano";
  int learners = 2;
  std::int64_t steps = 800;     // every mode's schedule (warm-up, cosine), steps per learner
  std::int64_t dp_steps = 250;  // dp's uncapped run stops here; its loss there is the target
  double target = 0;            // instead: this loss (dp's uncapped run stops at it)
  double mode_seconds = 180; // bound on each raced mode's run
  double dp_seconds = 40;    // dp's run under the cap, for its step time
  double eval_period_s = 2;
  std::int64_t eval_tokens = 16384;
  std::vector<std::string> modes{"diloco", "streaming", "decoupled"};
  // The reference: a 12B model, dp between learners that are slices of accelerators.
  double ref_params = 12e9;
  double ref_bytes_per_param = 2;  // bf16 gradients up, bf16 parameters down
  double ref_tokens = 1 << 20;     // per learner step
  double ref_chips = 256;
  double ref_chip_tflops = 200;    // sustained, per chip
  double ref_gbit = 5;             // the link the race reproduces
  double ref_latency_ms = 20;      // one way
  std::string plot;  // an SVG of eval loss against wall-clock per mode
  config_flags flags;
  CLI::App* command = nullptr;
};

wan_options& wan() {
  static wan_options o;
  return o;
}

/// The communication/compute arithmetic: the 12B reference and our scaled cap.
struct wan_scale {
  double ref_step_flops = 0, ref_rate = 0, ref_compute_s = 0, ref_bytes = 0;
  double ours_flops = 0, ours_step_s = 0, ours_bytes = 0;  // one learner step; one direction of dp's exchange
  std::size_t ours_params = 0;
  int ours_batch = 0, ours_context = 0, ours_threads = 0;
  struct link {
    double gbit = 0, comm_s = 0, ratio = 0, cap_mbit = 0;
  };
  std::vector<link> links;  // 2, 5 Gbit/s and the race's
  link race;
  double latency_ms = 0;
};

wan_scale::link scale_link(const wan_scale& s, double gbit) {
  wan_scale::link l;
  l.gbit = gbit;
  l.comm_s = s.ref_bytes / (gbit * 1e9 / 8);
  l.ratio = l.comm_s / s.ref_compute_s;
  // Our cap: dp's bytes per direction per step take `ratio` times our step's compute time.
  l.cap_mbit = s.ours_bytes / (l.ratio * s.ours_step_s) * 8 / 1e6;
  return l;
}

/// The reference's figures and our model's; our step time comes later (set_step_time).
expected<wan_scale> measure_scale(const wan_options& o, const config& cfg) {
  auto shape = resolve_model(cfg.model);
  if (!shape) return shape.err();
  const learner_profile lp = learner_profile_of(cfg, 0);
  wan_scale s;
  s.ref_step_flops = 6 * o.ref_params * o.ref_tokens;
  s.ref_rate = o.ref_chips * o.ref_chip_tflops * 1e12;
  s.ref_compute_s = s.ref_step_flops / s.ref_rate;
  s.ref_bytes = o.ref_params * o.ref_bytes_per_param;

  const param_layout layout = make_layout(*shape);
  gpt<float> model(layout);
  model.init(1);
  s.ours_flops = model.flops_per_step(lp.batch);
  s.ours_params = layout.param_count;
  s.ours_bytes = static_cast<double>(layout.param_count) * sizeof(float);  // fp32 gradients up, parameters down
  s.ours_batch = lp.batch;
  s.ours_context = shape->context;
  s.ours_threads = lp.threads;
  return s;
}

/// Our step's time — dp's step without a cap in this mesh, the learners computing at
/// once, averaged over its whole run: an engine step timed alone swings with this shared
/// machine's load — and the caps that follow from it.
void set_step_time(wan_scale& s, const wan_options& o, double step_s) {
  s.ours_step_s = step_s;
  s.links.clear();
  for (double gbit : {2.0, 5.0}) s.links.push_back(scale_link(s, gbit));
  s.race = scale_link(s, o.ref_gbit);
  s.latency_ms = o.ref_latency_ms * s.ours_step_s / s.ref_compute_s;
}

void print_scale(const wan_options& o, const wan_scale& s) {
  std::printf("The arithmetic: dp's communication time per step over its compute time, on the 12B reference and here\n");
  std::printf("  12B reference: %.3g params x %.0f B = %s of gradients up and as many parameter bytes down per learner step\n",
              o.ref_params, o.ref_bytes_per_param, human_bytes(s.ref_bytes).c_str());
  std::printf("    a learner = %.0f chips x %.0f TFLOP/s sustained = %.1f PFLOP/s; a step of %.0f tokens = 6 x %.3g x %.0f = %.3g FLOP = %.2f s\n",
              o.ref_chips, o.ref_chip_tflops, s.ref_rate / 1e15, o.ref_tokens, o.ref_params, o.ref_tokens,
              s.ref_step_flops, s.ref_compute_s);
  for (const auto& l : s.links)
    std::printf("    at %.0f Gbit/s: %s / %.3g GB/s = %.1f s per direction = %.1f x the compute time\n", l.gbit,
                human_bytes(s.ref_bytes).c_str(), l.gbit / 8, l.comm_s, l.ratio);
  std::printf("  ours: %s, %zu params x 4 B (fp32) = %s per direction per step; a learner step (%d x %d tokens, %d thread%s) "
              "= %.3g FLOP in %.1f ms (dp's step without a cap, all learners at once: %.2f GFLOP/s each)\n",
              o.model.c_str(), s.ours_params, human_bytes(s.ours_bytes).c_str(), s.ours_batch, s.ours_context,
              s.ours_threads, s.ours_threads == 1 ? "" : "s", s.ours_flops, s.ours_step_s * 1e3,
              s.ours_flops / s.ours_step_s * 1e-9);
  for (const auto& l : s.links)
    std::printf("    cap for %.0f Gbit/s: %s / (%.1f x %.1f ms) = %.3f Mbit/s per link\n", l.gbit,
                human_bytes(s.ours_bytes).c_str(), l.ratio, s.ours_step_s * 1e3, l.cap_mbit);
  std::printf("  race: every link capped at %.3f Mbit/s (the %.0f Gbit/s equivalent), latency %.0f ms x %.1f ms / %.2f s = %.2f ms one way\n",
              s.race.cap_mbit, o.ref_gbit, o.ref_latency_ms, s.ours_step_s * 1e3, s.ref_compute_s, s.latency_ms);
  std::fflush(stdout);
}

struct race_result {
  std::string mode;
  bool reached = false, projected = false;
  double time_s = std::nan(""), final_loss = std::nan(""), wall_s = 0, speedup = std::nan("");
  double bytes = 0, tokens = 0;  // to the target (dp: projected)
  double steps_per_learner = 0;  // to the target
  std::string note;
  std::vector<std::pair<double, double>> curve;  // (seconds, eval loss); dp: projected from its uncapped run
};

/// Eval loss against wall-clock: each racing mode as measured, dp projected
/// (dashed: its uncapped curve at its capped step time), the target across.
std::string race_plot(const std::vector<race_result>& results, double target) {
  static const char* colors[] = {"#d62728", "#ff7f0e", "#9467bd", "#1f77b4", "#2ca02c", "#8c564b"};
  double x_max = 0;
  for (const auto& r : results)
    if (!r.projected)
      for (const auto& [t, loss] : r.curve) x_max = std::max(x_max, t);
  std::vector<series> lines;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    series s{r.mode + (r.projected ? " (projected)" : ""), colors[i % 6], {}, r.projected};
    // A projection far beyond the race is cut where the race ends.
    for (std::size_t k = 0; k < r.curve.size(); ++k) {
      const auto [t, loss] = r.curve[k];
      if (t <= x_max) {
        s.points.emplace_back(t, loss);
      } else {
        if (k > 0 && r.curve[k - 1].first < x_max) {
          const auto [t0, l0] = r.curve[k - 1];
          s.points.emplace_back(x_max, l0 + (loss - l0) * (x_max - t0) / (t - t0));
        }
        break;
      }
    }
    lines.push_back(std::move(s));
  }
  lines.push_back(series{"target", "#777", {{0, target}, {x_max, target}}, true});
  return chart("WAN race: eval loss under the capped links", "seconds", "eval loss, nats/byte", lines, {}, x_max);
}

int run_wan(wan_options& o) {
  if (o.learners < 1) return report(make_error(errc::invalid_input, "--learners must be at least 1"));
  if (o.steps < 2) return report(make_error(errc::invalid_input, "--steps must be at least 2"));
  if (o.dp_steps < 1 || o.dp_steps > o.steps)
    return report(make_error(errc::invalid_input, "--dp-steps must be in [1, --steps]"));
  for (const auto& m : o.modes)
    if (m != "diloco" && m != "streaming" && m != "decoupled")
      return report(make_error(errc::invalid_input,
                               "--modes: '" + m + "' is not one of diloco, streaming, decoupled (dp always runs)"));
  if (!(o.ref_gbit > 0 && o.ref_params > 0 && o.ref_bytes_per_param > 0 && o.ref_tokens > 0 && o.ref_chips > 0 &&
        o.ref_chip_tflops > 0))
    return report(make_error(errc::invalid_input, "the --ref-* figures must be positive"));
  if (auto ok = check_output_path("--plot", o.plot); !ok) return report(ok.err());
  config defaults;
  defaults.model.size = o.model;
  defaults.mesh.learners = o.learners;
  defaults.train.steps = o.steps;
  defaults.train.threads = o.learners;  // one compute thread per learner
  defaults.data.eval_tokens = o.eval_tokens;
  // One shard: every learner has one capped link up and one down, as a site has one WAN
  // link; with S shards each learner would have S links, S times the capacity.
  defaults.mesh.shards = 1;
  // A frame of a whole model takes seconds on a capped link and heartbeats queue behind it:
  // a silent peer is only dead after minutes, and a round may stay open as long.
  defaults.wire.heartbeat_interval_ms = 2000;
  defaults.wire.liveness = 100;
  defaults.mesh.round_timeout_s = 3600;
  auto resolved = o.flags.resolve(defaults);
  if (!resolved) return report(resolved.err());
  config cfg = *resolved;
  cfg.link.bandwidth_mbit = 0;
  cfg.link.latency_ms = 0;
  install_stop_handlers();
  const double load_before = [] {
    double l[1] = {0};
    return getloadavg(l, 1) == 1 ? l[0] : std::nan("");
  }();

  auto scale = measure_scale(o, cfg);
  if (!scale) return report(scale.err());
  wan_scale& sc = *scale;

  progress_line progress(4);
  // 1. dp without a cap: its steps to the target (and the target itself).
  config dp_cfg = cfg;
  dp_cfg.mesh.mode = "dp";
  const double tokens_per_step = static_cast<double>(o.learners) * sc.ours_batch * sc.ours_context;
  mesh_eval dp_stop{10, 0, static_cast<std::uint64_t>(static_cast<double>(o.dp_steps) * tokens_per_step)};
  if (o.target > 0) dp_stop = mesh_eval{o.eval_period_s, o.target, 0};
  auto dp_free = run_mesh(dp_cfg, dp_stop, progress, "dp, no cap (its steps to the target)");
  if (!dp_free) return report(dp_free.err());
  progress.finish();
  const double target = o.target > 0 ? o.target : dp_free->eval_loss;
  double dp_tokens = std::nan("");
  if (o.target <= 0) {
    dp_tokens = static_cast<double>(dp_free->tokens);  // the final evaluation is of Θ after these
  } else {
    for (const auto& [tokens, loss] : dp_free->eval_curve)
      if (loss <= target) {
        dp_tokens = static_cast<double>(tokens);
        break;
      }
  }
  if (std::isnan(dp_tokens))
    return report(make_error(errc::invalid_input, "dp did not reach the target " + fmt("%.4f", target) + " in " +
                                                      std::to_string(o.steps) + " steps (its final loss " +
                                                      fmt("%.4f", dp_free->eval_loss) + "): raise --steps or --target"));
  const double dp_steps = dp_tokens / tokens_per_step;
  if (o.target <= 0 && dp_free->eval_curve.size() > 1)  // dp's own curve shows where it was on the way
    for (std::size_t i = 0; i + 1 < dp_free->eval_curve.size(); ++i)
      std::printf("  dp uncapped: %.0f steps, eval loss %.4f\n",
                  static_cast<double>(dp_free->eval_curve[i].first) / tokens_per_step, dp_free->eval_curve[i].second);
  const double dp_bytes_per_step = static_cast<double>(dp_free->bytes_on_wire) / static_cast<double>(std::max<std::uint64_t>(1, dp_free->rounds));
  const double dp_free_step_s = seconds_per_round(*dp_free, 1);
  if (std::isnan(dp_free_step_s)) return report(make_error(errc::internal, "dp without a cap closed too few rounds to time"));
  set_step_time(sc, o, dp_free_step_s);
  print_scale(o, sc);
  std::printf("dp without a cap: %.0f steps per learner, eval loss %.4f -> target %.4f%s; %.1f ms per step, %s per step on the wire\n",
              dp_steps, dp_free->eval_loss, target,
              o.target > 0 ? " (--target)" : " (dp's final loss)", dp_free_step_s * 1e3,
              human_bytes(dp_bytes_per_step).c_str());
  std::fflush(stdout);

  // 2. dp under the cap, for its time per step.
  cfg.link.bandwidth_mbit = sc.race.cap_mbit;
  cfg.link.latency_ms = sc.latency_ms;
  dp_cfg.link = cfg.link;
  dp_cfg.train.time_limit_s = o.dp_seconds;
  auto dp_capped = run_mesh(dp_cfg, mesh_eval{1e9, 0}, progress, "dp, capped (its time per step)");
  if (!dp_capped) return report(dp_capped.err());
  progress.finish();
  const double dp_step_s = seconds_per_round(*dp_capped, 1);
  if (std::isnan(dp_step_s))
    return report(make_error(errc::internal, "dp closed fewer than 3 rounds in " + fmt("%.0f", o.dp_seconds) +
                                                 " s under the cap: raise --dp-seconds"));
  race_result dp;
  dp.mode = "dp";
  dp.reached = dp.projected = true;
  dp.steps_per_learner = dp_steps;
  dp.time_s = dp_steps * dp_step_s;
  dp.bytes = dp_steps * dp_bytes_per_step;
  dp.tokens = dp_tokens;
  dp.final_loss = target;
  dp.wall_s = dp_capped->wall_s;
  dp.speedup = 1;
  for (const auto& [tokens, loss] : dp_free->eval_curve)
    dp.curve.emplace_back(static_cast<double>(tokens) / tokens_per_step * dp_step_s, loss);
  dp.note = fmt("%.0f steps", dp_steps) + " x " + fmt("%.2f s", dp_step_s) + " per step under the cap (" +
            std::to_string(dp_capped->rounds) + " rounds in " + fmt("%.0f s", dp_capped->wall_s) + ")";
  // dp as a bandwidth-optimal exchange would make it: both directions at once.
  const double dp_duplex_s = dp_steps * (dp_free_step_s + sc.ours_bytes / (sc.race.cap_mbit * 1e6 / 8) + 2 * sc.latency_ms * 1e-3);
  std::printf("dp under the cap: %.2f s per step (%.1f x its uncapped step) -> %.0f s to the target (projected)\n",
              dp_step_s, dp_step_s / dp_free_step_s, dp.time_s);
  std::fflush(stdout);

  // 3. The other modes race to the target under the cap.
  std::vector<race_result> results{dp};
  for (const auto& mode : o.modes) {
    config c = cfg;
    c.mesh.mode = mode;
    c.train.time_limit_s = o.mode_seconds;
    auto s = run_mesh(c, mesh_eval{o.eval_period_s, target}, progress, mode + ", capped");
    if (!s) return report(s.err());
    progress.finish();
    race_result r;
    r.mode = mode;
    r.final_loss = s->eval_loss;
    r.wall_s = s->wall_s;
    r.bytes = static_cast<double>(s->bytes_on_wire);
    r.tokens = static_cast<double>(s->tokens);
    for (std::size_t i = 0; i < s->eval_curve.size() && i < s->eval_times_s.size(); ++i)
      r.curve.emplace_back(s->eval_times_s[i], s->eval_curve[i].second);
    if (s->target_reached_s >= 0) {
      r.reached = true;
      r.time_s = s->target_reached_s;
      for (std::size_t i = 0; i < s->eval_curve.size(); ++i)
        if (s->eval_curve[i].second <= target) {
          r.tokens = static_cast<double>(s->eval_curve[i].first);
          break;
        }
    } else if (s->eval_loss <= target) {  // the schedule ended between evaluations
      r.reached = true;
      r.time_s = s->wall_s;
    }
    r.steps_per_learner = r.tokens / tokens_per_step;
    if (r.reached) r.speedup = dp.time_s / r.time_s;
    else r.note = "did not reach the target in " + fmt("%.0f s", s->wall_s) + " (final loss " + fmt("%.4f", s->eval_loss) + ")";
    std::printf("%s: %s\n", mode.c_str(),
                r.reached ? (fmt("%.1f s", r.time_s) + " to the target, " + human_bytes(r.bytes) + " on the wire, " +
                             fmt("%.1f x", r.speedup) + " faster than dp").c_str()
                          : r.note.c_str());
    std::fflush(stdout);
    results.push_back(std::move(r));
  }

  std::printf("\nbench wan: model %s, %d learners, every link %.3f Mbit/s + %.2f ms (= %.0f Gbit/s for the 12B "
              "reference), target eval loss %.4f nats/byte\n",
              o.model.c_str(), o.learners, sc.race.cap_mbit, sc.latency_ms, o.ref_gbit, target);
  std::printf("  %-10s %12s %12s %12s %10s %10s %9s\n", "mode", "to target s", "on the wire", "tokens", "steps/lrn",
              "final loss", "speed-up");
  for (const auto& r : results)
    std::printf("  %-10s %12s %12s %12.0f %10.0f %10.4f %9s%s\n", r.mode.c_str(),
                r.reached ? (fmt("%.1f", r.time_s) + (r.projected ? "*" : "")).c_str() : "not reached",
                human_bytes(r.bytes).c_str(), r.tokens, r.steps_per_learner, r.final_loss,
                r.reached ? fmt("%.1fx", r.speedup).c_str() : "-", r.note.empty() ? "" : ("  " + r.note).c_str());
  std::printf("  * projected: dp's loss after n steps does not depend on the link; its steps come from the uncapped run\n");
  std::printf("  dp with both directions at once (a bandwidth-optimal exchange) would take %.0f s; "
              "speed-ups against that: ", dp_duplex_s);
  for (const auto& r : results)
    if (r.mode != "dp") std::printf("%s %s  ", r.mode.c_str(), r.reached ? fmt("%.1fx", dp_duplex_s / r.time_s).c_str() : "-");
  std::printf("\n  paper (Decoupled DiLoCo): more than 20x over data-parallel training on 2-5 Gbit/s WAN links\n");
  std::printf("  load average before the run: %.2f (this machine's 2 cores are shared)\n", load_before);
  if (!o.plot.empty()) {
    if (auto ok = write_text_file("--plot", o.plot, race_plot(results, target)); !ok) return report(ok.err());
    std::printf("plot: %s\n", o.plot.c_str());
  }

  if (o.json) {
    std::string modes = "[";
    for (const auto& r : results) {
      json_line j;
      j.add("mode", r.mode)
          .add("reached", r.reached)
          .add("projected", r.projected)
          .add("time_to_target_s", r.time_s)
          .add("bytes", r.bytes)
          .add("tokens", r.tokens)
          .add("steps_per_learner", r.steps_per_learner)
          .add("final_loss", r.final_loss)
          .add("wall_s", r.wall_s)
          .add("speedup_vs_dp", r.speedup);
      if (r.mode != "dp") j.add("speedup_vs_dp_full_duplex", r.reached ? dp_duplex_s / r.time_s : std::nan(""));
      modes += (modes.size() > 1 ? "," : "") + j.str();
    }
    modes += "]";
    json_line j;
    j.add("command", "bench wan")
        .add("model", o.model)
        .add("learners", o.learners)
        .add("steps", static_cast<std::int64_t>(o.steps))
        .add("dp_steps", dp_steps)
        .add("target_loss", target)
        .add("cap_mbit", sc.race.cap_mbit)
        .add("latency_ms", sc.latency_ms)
        .add("ref_gbit", o.ref_gbit)
        .add("comm_compute_ratio", sc.race.ratio)
        .add("ref_compute_s", sc.ref_compute_s)
        .add("ours_step_ms", sc.ours_step_s * 1e3)
        .add("ours_step_flops", sc.ours_flops)
        .add("dp_step_s_capped", dp_step_s)
        .add("dp_step_s_uncapped", dp_free_step_s)
        .add("dp_full_duplex_s", dp_duplex_s)
        .add("paper_speedup", "> 20x")
        .add("loadavg", load_before)
        .add_raw("modes", modes);
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

// ---- bench ddp ------------------------------------------------------------------------

struct ddp_options {
  bool json = false;
  std::string model = "nano";
  int ranks = 2;
  int batch = 32;
  int steps = 100;
  int warmup = 5;
  int rounds = 3;
  std::string python = "/usr/bin/python3";
  std::string script = ARCHIPELAGO_SOURCE_DIR "/tools/bench/ddp_reference.py";
  CLI::App* command = nullptr;
};

ddp_options& ddp() {
  static ddp_options o;
  return o;
}

/// Runs the DDP reference once; its last stdout line is JSON.
expected<nlohmann::json> run_ddp_reference(const ddp_options& o) {
  // MACHINE.md §6: one OpenBLAS thread per rank, its AVX-512 kernels forced.
  const std::string cmd = "env -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=SkylakeX " + o.python + " " +
                          o.script + " --model " + o.model + " --ranks " + std::to_string(o.ranks) +
                          " --threads 1 --batch " + std::to_string(o.batch) + " --steps " + std::to_string(o.steps) +
                          " --warmup " + std::to_string(o.warmup) + " --mallopt --json 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return make_error(errc::internal, "cannot start " + o.python);
  std::string output, last;
  std::array<char, 8192> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) {
    output += buf.data();
    std::string line(buf.data());
    if (!line.empty() && line.front() == '{') last = line;
  }
  const int rc = pclose(pipe);
  if (rc != 0 || last.empty())
    return make_error(errc::internal, "the DDP reference failed (exit " + std::to_string(rc) + "): " +
                                          output.substr(output.size() > 600 ? output.size() - 600 : 0));
  try {
    return nlohmann::json::parse(last);
  } catch (const std::exception& e) {
    return make_error(errc::internal, std::string("the DDP reference printed bad JSON: ") + e.what());
  }
}

int run_ddp(const ddp_options& o) {
  if (o.ranks < 1 || o.batch < 1 || o.steps < 10 || o.warmup < 1 || o.rounds < 1)
    return report(make_error(errc::invalid_input,
                             "--ranks, --batch and --rounds must be at least 1, --steps at least 10, --warmup at least 1"));
  if (!std::filesystem::exists(o.script))
    return report(make_error(errc::not_found, "DDP reference '" + o.script + "' not found (--script)"));
  config cfg;
  cfg.model.size = o.model;
  cfg.mesh.mode = "dp";
  cfg.mesh.learners = o.ranks;
  cfg.train.threads = o.ranks;  // one compute thread per learner, as one per rank
  cfg.data.batch = o.batch;
  cfg.train.steps = o.warmup + o.steps;
  cfg.data.eval_tokens = 4096;  // only the final evaluation, after the timing
  if (auto ok = validate_mesh(cfg); !ok) return report(ok.err());
  install_stop_handlers();
  progress_line progress(4);
  std::vector<double> ours_ms, torch_ms, torch_median_ms, ratio, ours_bytes, torch_bytes;
  double torch_ring = 0;
  std::string blas;
  for (int r = 0; r < o.rounds; ++r) {
    const std::string round = "round " + std::to_string(r + 1) + "/" + std::to_string(o.rounds);
    // The order alternates, so a drift in this shared machine's load favours neither side.
    double ours = 0, theirs = 0;
    for (int k = 0; k < 2; ++k) {
      if ((k == 0) == (r % 2 == 0)) {
        auto s = run_mesh(cfg, mesh_eval{1e9, 0}, progress, round + ": archipelago dp");
        if (!s) return report(s.err());
        progress.finish();
        ours = seconds_per_round(*s, static_cast<std::uint64_t>(o.warmup)) * 1e3;
        if (std::isnan(ours)) return report(make_error(errc::internal, "our dp closed too few rounds to time"));
        ours_ms.push_back(ours);
        ours_bytes.push_back(static_cast<double>(s->bytes_on_wire) / static_cast<double>(std::max<std::uint64_t>(1, s->rounds)));
      } else {
        progress.update("bench ddp: " + round + ": PyTorch DDP (gloo)", true);
        auto j = run_ddp_reference(o);
        if (!j) return report(j.err());
        if (stop_requested.load()) return report(interrupted());
        theirs = (*j)["step_ms_mean_wall"].get<double>();
        torch_ms.push_back(theirs);
        torch_median_ms.push_back((*j)["step_ms_median"].get<double>());
        const auto& sent = (*j)["bytes_sent_per_step"];
        torch_bytes.push_back(sent.is_number() ? sent.get<double>() : std::nan(""));
        torch_ring = (*j)["ring_bytes_per_step_per_rank"].get<double>() * o.ranks;
        blas = (*j)["blas"].get<std::string>();
      }
    }
    ratio.push_back(ours / theirs);
  }
  progress.finish();
  std::string per_round;
  for (double x : ratio) per_round += (per_round.empty() ? "" : " ") + fmt("%.2f", x);
  std::printf("bench ddp: model %s, %d learners/ranks x 1 thread, batch %d each (global %d), %d timed steps after %d, "
              "%d rounds\n",
              o.model.c_str(), o.ranks, o.batch, o.ranks * o.batch, o.steps, o.warmup, o.rounds);
  std::printf("  %-22s %14s %22s\n", "", "step ms", "bytes sent per step");
  std::printf("  %-22s %14.1f %22s\n", "archipelago dp", median(ours_ms), human_bytes(median(ours_bytes)).c_str());
  std::printf("  %-22s %14.1f %22s\n", "PyTorch DDP (gloo)", median(torch_ms), human_bytes(median(torch_bytes)).c_str());
  std::printf("  step time archipelago / DDP = %.2f (per round: %s); DDP's median step %.1f ms\n", median(ratio),
              per_round.c_str(), median(torch_median_ms));
  std::printf("  bytes: ours are learners' fp32 gradients up plus fp32 parameters down (parameter server), "
              "DDP's a ring all-reduce (%s for %d ranks)\n",
              human_bytes(torch_ring).c_str(), o.ranks);
  std::printf("  DDP BLAS: %s\n", blas.c_str());
  if (o.json) {
    json_line j;
    j.add("command", "bench ddp")
        .add("model", o.model)
        .add("ranks", o.ranks)
        .add("batch", o.batch)
        .add("steps", o.steps)
        .add("rounds", o.rounds)
        .add("ours_step_ms", median(ours_ms))
        .add("ddp_step_ms", median(torch_ms))
        .add("ddp_step_ms_median", median(torch_median_ms))
        .add("ratio_step_time", median(ratio))
        .add("ours_bytes_per_step", median(ours_bytes))
        .add("ddp_bytes_per_step", median(torch_bytes))
        .add("ddp_ring_bytes_per_step", torch_ring);
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

void add_bench_wan(CLI::App& bench) {
  wan_options& o = wan();
  CLI::App* w = bench.add_subcommand(
      "wan", "dp, diloco, streaming and decoupled race to one eval loss over links capped like a 12B model's WAN");
  o.command = w;
  w->add_option("--model", o.model, "nano, micro or mini (default nano)");
  w->add_option("--learners", o.learners, "Learners M (default 2)")->check(CLI::Range(1, 16));
  w->add_option("--steps", o.steps, "Every mode's schedule (warm-up, cosine decay), steps per learner (default 800)");
  w->add_option("--dp-steps", o.dp_steps, "dp's uncapped run stops after this many steps per learner; its loss is the target (default 250)");
  w->add_option("--target", o.target, "Target eval loss, nats/byte, instead of dp's after --dp-steps");
  w->add_option("--modes", o.modes, "Modes racing dp (default diloco streaming decoupled)");
  w->add_option("--mode-seconds", o.mode_seconds, "Bound on each racing mode's run (default 180)");
  w->add_option("--dp-seconds", o.dp_seconds, "dp's run under the cap, timing its steps (default 40)");
  w->add_option("--eval-every-s", o.eval_period_s, "Seconds between evaluations of the racing models (default 2)")
      ->check(CLI::Range(0.5, 600.0));
  w->add_option("--eval-tokens", o.eval_tokens, "Held-out tokens per evaluation (default 16384)")->check(CLI::Range(256, 1 << 24));
  w->add_option("--ref-params", o.ref_params, "Reference model's parameters (default 12e9)");
  w->add_option("--ref-bytes-per-param", o.ref_bytes_per_param, "Reference's bytes per gradient value (default 2, bf16)");
  w->add_option("--ref-tokens", o.ref_tokens, "Reference's tokens per learner step (default 1048576)");
  w->add_option("--ref-chips", o.ref_chips, "Reference learner's accelerators (default 256)");
  w->add_option("--ref-chip-tflops", o.ref_chip_tflops, "Sustained TFLOP/s per accelerator (default 200)");
  w->add_option("--ref-gbit", o.ref_gbit, "The reference link the race reproduces, Gbit/s (default 5)");
  w->add_option("--ref-latency-ms", o.ref_latency_ms, "Reference one-way latency, ms (default 20)");
  w->add_option("--plot", o.plot, "Also draw eval loss against wall-clock per mode as an SVG file");
  o.flags.add_to(*w);
  w->add_flag("--json", o.json, "Print a one-line JSON summary last");

  ddp_options& d = ddp();
  CLI::App* p = bench.add_subcommand("ddp", "Our dp against PyTorch DDP (gloo) on this machine: step time and bytes per step");
  d.command = p;
  p->add_option("--model", d.model, "nano, micro or mini (default nano)");
  p->add_option("--ranks", d.ranks, "Learners, and DDP ranks (default 2)")->check(CLI::Range(1, 16));
  p->add_option("--batch", d.batch, "Sequences per step per learner/rank (default 32)");
  p->add_option("--steps", d.steps, "Timed steps per side and round (default 100)");
  p->add_option("--warmup", d.warmup, "Untimed steps first (default 5)");
  p->add_option("--rounds", d.rounds, "Rounds of (ours, DDP), alternating order (default 3)")->check(CLI::Range(1, 100));
  p->add_option("--python", d.python, "Python interpreter with torch (default /usr/bin/python3)");
  p->add_option("--script", d.script, "Path of ddp_reference.py");
  p->add_flag("--json", d.json, "Print a one-line JSON summary last");
}

int run_bench_wan() {
  if (wan().command != nullptr && wan().command->parsed()) return run_wan(wan());
  if (ddp().command != nullptr && ddp().command->parsed()) return run_ddp(ddp());
  return exit_bad_input;
}

}  // namespace archipelago::cli
