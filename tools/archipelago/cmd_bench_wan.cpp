// archipelago bench wan: dp, diloco, streaming and decoupled race to one eval
// loss over links capped like a 12B model's WAN (tools/bench/wan_bench.hpp),
// each stage printed as it ends; and archipelago bench ddp: our dp against
// PyTorch DDP over gloo (tools/bench/ddp_bench.hpp).

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_stats.hpp"
#include "bench/ddp_bench.hpp"
#include "bench/wan_bench.hpp"
#include "cmd_bench.hpp"

namespace archipelago::cli {
namespace {

// ---- bench wan ----------------------------------------------------------------------

struct wan_flags {
  wan_options bench;
  bool json = false;
  std::string plot;  // an SVG of eval loss against wall-clock per mode
  config_flags flags;
  CLI::App* command = nullptr;
};

wan_flags& wan() {
  static wan_flags o;
  return o;
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
}

void print_dp_uncapped(const wan_options& o, const wan_result& r) {
  if (!r.target_given && r.dp_uncapped_curve.size() > 1)  // dp's own curve shows where it was on the way
    for (std::size_t i = 0; i + 1 < r.dp_uncapped_curve.size(); ++i)
      std::printf("  dp uncapped: %.0f steps, eval loss %.4f\n",
                  static_cast<double>(r.dp_uncapped_curve[i].first) / r.tokens_per_step, r.dp_uncapped_curve[i].second);
  print_scale(o, r.scale);
  std::printf("dp without a cap: %.0f steps per learner, eval loss %.4f -> target %.4f%s; %.1f ms per step, %s per step on the wire\n",
              r.dp_steps, r.dp_uncapped_loss, r.target, r.target_given ? " (--target)" : " (dp's final loss)",
              r.dp_uncapped_step_s * 1e3, human_bytes(r.dp_bytes_per_step).c_str());
}

/// What a stage adds to the report, printed as soon as it ends.
void print_stage(const wan_options& o, wan_stage stage, const wan_result& r) {
  if (stage == wan_stage::dp_uncapped) {
    print_dp_uncapped(o, r);
  } else if (stage == wan_stage::dp_capped) {
    std::printf("dp under the cap: %.2f s per step (%.1f x its uncapped step) -> %.0f s to the target (projected)\n",
                r.dp_step_s, r.dp_step_s / r.dp_uncapped_step_s, r.results.front().time_s);
  } else {
    const race_result& m = r.results.back();
    std::printf("%s: %s\n", m.mode.c_str(),
                m.reached ? (fmt("%.1f s", m.time_s) + " to the target, " + human_bytes(m.bytes) + " on the wire, " +
                             fmt("%.1f x", m.speedup) + " faster than dp").c_str()
                          : m.note.c_str());
  }
  std::fflush(stdout);
}

void print_race_table(const wan_options& o, const wan_result& r) {
  std::printf("\nbench wan: model %s, %d learners, every link %.3f Mbit/s + %.2f ms (= %.0f Gbit/s for the 12B "
              "reference), target eval loss %.4f nats/byte\n",
              o.model.c_str(), o.learners, r.scale.race.cap_mbit, r.scale.latency_ms, o.ref_gbit, r.target);
  std::printf("  %-10s %12s %12s %12s %10s %10s %9s\n", "mode", "to target s", "on the wire", "tokens", "steps/lrn",
              "final loss", "speed-up");
  for (const auto& m : r.results)
    std::printf("  %-10s %12s %12s %12.0f %10.0f %10.4f %9s%s\n", m.mode.c_str(),
                m.reached ? (fmt("%.1f", m.time_s) + (m.projected ? "*" : "")).c_str() : "not reached",
                human_bytes(m.bytes).c_str(), m.tokens, m.steps_per_learner, m.final_loss,
                m.reached ? fmt("%.1fx", m.speedup).c_str() : "-", m.note.empty() ? "" : ("  " + m.note).c_str());
  std::printf("  * projected: dp's loss after n steps does not depend on the link; its steps come from the uncapped run\n");
  std::printf("  dp with both directions at once (a bandwidth-optimal exchange) would take %.0f s; "
              "speed-ups against that: ",
              r.dp_full_duplex_s);
  for (const auto& m : r.results)
    if (m.mode != "dp")
      std::printf("%s %s  ", m.mode.c_str(), m.reached ? fmt("%.1fx", r.dp_full_duplex_s / m.time_s).c_str() : "-");
  std::printf("\n  paper (Decoupled DiLoCo): more than 20x over data-parallel training on 2-5 Gbit/s WAN links\n");
  std::printf("  load average before the run: %.2f (the cores are shared with whatever else runs)\n", r.load_before);
}

void print_wan_json(const wan_options& o, const wan_result& r) {
  std::string modes = "[";
  for (const auto& m : r.results) {
    json_line j;
    j.add("mode", m.mode)
        .add("reached", m.reached)
        .add("projected", m.projected)
        .add("time_to_target_s", m.time_s)
        .add("bytes", m.bytes)
        .add("tokens", m.tokens)
        .add("steps_per_learner", m.steps_per_learner)
        .add("final_loss", m.final_loss)
        .add("wall_s", m.wall_s)
        .add("speedup_vs_dp", m.speedup);
    if (m.mode != "dp") j.add("speedup_vs_dp_full_duplex", m.reached ? r.dp_full_duplex_s / m.time_s : std::nan(""));
    modes += (modes.size() > 1 ? "," : "") + j.str();
  }
  modes += "]";
  const wan_scale& sc = r.scale;
  json_line j;
  j.add("command", "bench wan")
      .add("model", o.model)
      .add("learners", o.learners)
      .add("steps", static_cast<std::int64_t>(o.steps))
      .add("dp_steps", r.dp_steps)
      .add("target_loss", r.target)
      .add("cap_mbit", sc.race.cap_mbit)
      .add("latency_ms", sc.latency_ms)
      .add("ref_gbit", o.ref_gbit)
      .add("comm_compute_ratio", sc.race.ratio)
      .add("ref_compute_s", sc.ref_compute_s)
      .add("ours_step_ms", sc.ours_step_s * 1e3)
      .add("ours_step_flops", sc.ours_flops)
      .add("dp_step_s_capped", r.dp_step_s)
      .add("dp_step_s_uncapped", r.dp_uncapped_step_s)
      .add("dp_full_duplex_s", r.dp_full_duplex_s)
      .add("paper_speedup", "> 20x")
      .add("loadavg", r.load_before)
      .add_raw("modes", modes);
  std::printf("%s\n", j.str().c_str());
}

int run_wan(const wan_flags& f, logger& log) {
  const wan_options& o = f.bench;
  if (auto ok = check_wan_options(o); !ok) return report(ok.err());
  if (auto ok = check_output_path("--plot", f.plot); !ok) return report(ok.err());
  auto cfg = f.flags.resolve(wan_defaults(o));
  if (!cfg) return report(cfg.err());
  install_stop_handlers();
  progress_line progress(log, 4);
  auto r = run_wan_bench(o, *cfg, progress_hooks(progress, log), [&](wan_stage stage, const wan_result& so_far) {
    progress.finish();
    print_stage(o, stage, so_far);
  });
  progress.finish();
  if (!r) return report(r.err());
  print_race_table(o, *r);
  if (!f.plot.empty()) {
    if (auto ok = write_text_file("--plot", f.plot, race_plot(r->results, r->target)); !ok) return report(ok.err());
    std::printf("plot: %s\n", f.plot.c_str());
  }
  if (f.json) print_wan_json(o, *r);
  return exit_ok;
}

// ---- bench ddp ------------------------------------------------------------------------

struct ddp_flags {
  ddp_options bench;
  bool json = false;
  CLI::App* command = nullptr;
};

ddp_flags& ddp() {
  static ddp_flags o;
  return o;
}

void print_ddp(const ddp_options& o, const ddp_result& r) {
  std::string per_round;
  for (double x : r.ratio) per_round += (per_round.empty() ? "" : " ") + fmt("%.2f", x);
  std::printf("bench ddp: model %s, %d learners/ranks x 1 thread, batch %d each (global %d), %d timed steps after %d, "
              "%d rounds\n",
              o.model.c_str(), o.ranks, o.batch, o.ranks * o.batch, o.steps, o.warmup, o.rounds);
  std::printf("  %-22s %14s %22s\n", "", "step ms", "bytes sent per step");
  std::printf("  %-22s %14.1f %22s\n", "archipelago dp", median(r.ours_ms), human_bytes(median(r.ours_bytes)).c_str());
  std::printf("  %-22s %14.1f %22s\n", "PyTorch DDP (gloo)", median(r.torch_ms),
              human_bytes(median(r.torch_bytes)).c_str());
  std::printf("  step time archipelago / DDP = %.2f (per round: %s); DDP's median step %.1f ms\n", median(r.ratio),
              per_round.c_str(), median(r.torch_median_ms));
  std::printf("  bytes: ours are learners' fp32 gradients up plus fp32 parameters down (parameter server), "
              "DDP's a ring all-reduce (%s for %d ranks)\n",
              human_bytes(r.torch_ring).c_str(), o.ranks);
  std::printf("  DDP BLAS: %s\n", r.blas.c_str());
}

void print_ddp_json(const ddp_options& o, const ddp_result& r) {
  json_line j;
  j.add("command", "bench ddp")
      .add("model", o.model)
      .add("ranks", o.ranks)
      .add("batch", o.batch)
      .add("steps", o.steps)
      .add("rounds", o.rounds)
      .add("ours_step_ms", median(r.ours_ms))
      .add("ddp_step_ms", median(r.torch_ms))
      .add("ddp_step_ms_median", median(r.torch_median_ms))
      .add("ratio_step_time", median(r.ratio))
      .add("ours_bytes_per_step", median(r.ours_bytes))
      .add("ddp_bytes_per_step", median(r.torch_bytes))
      .add("ddp_ring_bytes_per_step", r.torch_ring);
  std::printf("%s\n", j.str().c_str());
}

int run_ddp(const ddp_flags& f, logger& log) {
  install_stop_handlers();
  progress_line progress(log, 4);
  auto r = run_ddp_bench(f.bench, progress_hooks(progress, log));
  progress.finish();
  if (!r) return report(r.err());
  print_ddp(f.bench, *r);
  if (f.json) print_ddp_json(f.bench, *r);
  return exit_ok;
}

void add_ddp(CLI::App& bench) {
  ddp_flags& f = ddp();
  ddp_options& d = f.bench;
  d.script = shipped_file("tools/bench/ddp_reference.py");
  CLI::App* p = bench.add_subcommand("ddp", "Our dp against PyTorch DDP (gloo) on the local machine: step time "
                                               "and bytes per step");
  f.command = p;
  p->add_option("--model", d.model, model_size_choices() + " (default nano)");
  p->add_option("--ranks", d.ranks, "Learners, and DDP ranks (default 2)")->check(CLI::Range(1, 16));
  p->add_option("--batch", d.batch, "Sequences per step per learner/rank (default 32)");
  p->add_option("--steps", d.steps, "Timed steps per side and round (default 100)");
  p->add_option("--warmup", d.warmup, "Untimed steps first (default 5)");
  p->add_option("--rounds", d.rounds, "Rounds of (ours, DDP), alternating order (default 3)")->check(CLI::Range(1, 100));
  p->add_option("--python", d.python, "Python interpreter with torch (default /usr/bin/python3)");
  p->add_option("--script", d.script, "Path of ddp_reference.py");
  p->add_flag("--json", f.json, "Print a one-line JSON summary last");
}

}  // namespace

void add_bench_wan(CLI::App& bench) {
  wan_flags& f = wan();
  wan_options& o = f.bench;
  CLI::App* w = bench.add_subcommand(
      "wan", "dp, diloco, streaming and decoupled race to one eval loss over links capped like a 12B model's WAN");
  f.command = w;
  w->add_option("--model", o.model, model_size_choices() + " (default nano)");
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
  w->add_option("--plot", f.plot, "Also draw eval loss against wall-clock per mode as an SVG file");
  f.flags.add_to(*w);
  w->add_flag("--json", f.json, "Print a one-line JSON summary last");
  add_ddp(bench);
}

int run_bench_wan(logger& log) {
  if (wan().command != nullptr && wan().command->parsed()) return run_wan(wan(), log);
  if (ddp().command != nullptr && ddp().command->parsed()) return run_ddp(ddp(), log);
  return exit_bad_input;
}

}  // namespace archipelago::cli
