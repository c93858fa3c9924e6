#include "bench/wan_bench.hpp"

#include <algorithm>

#include "bench/bench_mesh.hpp"
#include "bench/bench_stats.hpp"
#include "learner/model/gpt.hpp"
#include "report/svg_chart.hpp"

namespace archipelago {
namespace {

expected<mesh_summary> run_labelled(const config& cfg, const mesh_eval& eval, const bench_hooks& hooks,
                                    const std::string& label) {
  hooks.begin("bench: " + label);
  return run_bench_mesh(cfg, hooks, label, 100, eval);
}

/// 1. dp without a cap: the target (its final loss, unless given), its steps to
/// it, its bytes and time per step.
status run_dp_uncapped(wan_result& r, const wan_options& o, const config& cfg, const bench_hooks& hooks) {
  config dp_cfg = cfg;
  dp_cfg.mesh.mode = "dp";
  mesh_eval stop{10, 0, static_cast<std::uint64_t>(static_cast<double>(o.dp_steps) * r.tokens_per_step)};
  if (o.target > 0) stop = mesh_eval{o.eval_period_s, o.target, 0};
  auto dp = run_labelled(dp_cfg, stop, hooks, "dp, no cap (its steps to the target)");
  if (!dp) return dp.err();
  r.target_given = o.target > 0;
  r.target = r.target_given ? o.target : dp->eval_loss;
  double dp_tokens = std::nan("");
  if (!r.target_given) {
    dp_tokens = static_cast<double>(dp->tokens);  // the final evaluation is of Θ after these
  } else {
    for (const auto& [tokens, loss] : dp->eval_curve)
      if (loss <= r.target) {
        dp_tokens = static_cast<double>(tokens);
        break;
      }
  }
  if (std::isnan(dp_tokens))
    return make_error(errc::invalid_input, "dp did not reach the target " + fmt("%.4f", r.target) + " in " +
                                               std::to_string(o.steps) + " steps (its final loss " +
                                               fmt("%.4f", dp->eval_loss) + "): raise --steps or --target");
  r.dp_uncapped_curve = dp->eval_curve;
  r.dp_uncapped_loss = dp->eval_loss;
  r.dp_tokens = dp_tokens;
  r.dp_steps = dp_tokens / r.tokens_per_step;
  r.dp_bytes_per_step =
      static_cast<double>(dp->bytes_on_wire) / static_cast<double>(std::max<std::uint64_t>(1, dp->rounds));
  r.dp_uncapped_step_s = seconds_per_round(*dp, 1);
  if (std::isnan(r.dp_uncapped_step_s))
    return make_error(errc::internal, "dp without a cap closed too few rounds to time");
  set_step_time(r.scale, o, r.dp_uncapped_step_s);
  return {};
}

/// 2. dp under the cap, for its time per step; its time to the target projected.
status run_dp_capped(wan_result& r, const wan_options& o, const config& capped, const bench_hooks& hooks) {
  config dp_cfg = capped;
  dp_cfg.mesh.mode = "dp";
  dp_cfg.train.time_limit_s = o.dp_seconds;
  auto dp_capped = run_labelled(dp_cfg, mesh_eval{1e9, 0}, hooks, "dp, capped (its time per step)");
  if (!dp_capped) return dp_capped.err();
  r.dp_step_s = seconds_per_round(*dp_capped, 1);
  if (std::isnan(r.dp_step_s))
    return make_error(errc::internal, "dp closed fewer than 3 rounds in " + fmt("%.0f", o.dp_seconds) +
                                          " s under the cap: raise --dp-seconds");
  race_result dp;
  dp.mode = "dp";
  dp.reached = dp.projected = true;
  dp.steps_per_learner = r.dp_steps;
  dp.time_s = r.dp_steps * r.dp_step_s;
  dp.bytes = r.dp_steps * r.dp_bytes_per_step;
  dp.tokens = r.dp_tokens;
  dp.final_loss = r.target;
  dp.wall_s = dp_capped->wall_s;
  dp.speedup = 1;
  for (const auto& [tokens, loss] : r.dp_uncapped_curve)
    dp.curve.emplace_back(static_cast<double>(tokens) / r.tokens_per_step * r.dp_step_s, loss);
  dp.note = fmt("%.0f steps", r.dp_steps) + " x " + fmt("%.2f s", r.dp_step_s) + " per step under the cap (" +
            std::to_string(dp_capped->rounds) + " rounds in " + fmt("%.0f s", dp_capped->wall_s) + ")";
  // dp as a bandwidth-optimal exchange would make it: both directions at once.
  const wan_scale& sc = r.scale;
  r.dp_full_duplex_s =
      r.dp_steps * (r.dp_uncapped_step_s + sc.ours_bytes / (sc.race.cap_mbit * 1e6 / 8) + 2 * sc.latency_ms * 1e-3);
  r.results = {std::move(dp)};
  return {};
}

/// 3. One mode under the cap until an evaluation reaches the target (or its time is up).
expected<race_result> race_mode(const wan_result& r, const wan_options& o, const config& capped,
                                const std::string& mode, const bench_hooks& hooks) {
  config c = capped;
  c.mesh.mode = mode;
  c.train.time_limit_s = o.mode_seconds;
  auto s = run_labelled(c, mesh_eval{o.eval_period_s, r.target}, hooks, mode + ", capped");
  if (!s) return s.err();
  race_result out;
  out.mode = mode;
  out.final_loss = s->eval_loss;
  out.wall_s = s->wall_s;
  out.bytes = static_cast<double>(s->bytes_on_wire);
  out.tokens = static_cast<double>(s->tokens);
  for (std::size_t i = 0; i < s->eval_curve.size() && i < s->eval_times_s.size(); ++i)
    out.curve.emplace_back(s->eval_times_s[i], s->eval_curve[i].second);
  if (s->target_reached_s >= 0) {
    out.reached = true;
    out.time_s = s->target_reached_s;
    for (const auto& [tokens, loss] : s->eval_curve)
      if (loss <= r.target) {
        out.tokens = static_cast<double>(tokens);
        break;
      }
  } else if (s->eval_loss <= r.target) {  // the schedule ended between evaluations
    out.reached = true;
    out.time_s = s->wall_s;
  }
  out.steps_per_learner = out.tokens / r.tokens_per_step;
  if (out.reached) out.speedup = r.results.front().time_s / out.time_s;
  else
    out.note = "did not reach the target in " + fmt("%.0f s", s->wall_s) + " (final loss " +
               fmt("%.4f", s->eval_loss) + ")";
  return out;
}

/// A projection far beyond the race is cut where the race ends.
std::vector<std::pair<double, double>> cut_at(const std::vector<std::pair<double, double>>& curve, double x_max) {
  std::vector<std::pair<double, double>> out;
  for (std::size_t k = 0; k < curve.size(); ++k) {
    const auto [t, loss] = curve[k];
    if (t <= x_max) {
      out.emplace_back(t, loss);
      continue;
    }
    if (k > 0 && curve[k - 1].first < x_max) {
      const auto [t0, l0] = curve[k - 1];
      out.emplace_back(x_max, l0 + (loss - l0) * (x_max - t0) / (t - t0));
    }
    break;
  }
  return out;
}

}  // namespace

status check_wan_options(const wan_options& o) {
  if (o.learners < 1) return make_error(errc::invalid_input, "--learners must be at least 1");
  if (o.steps < 2) return make_error(errc::invalid_input, "--steps must be at least 2");
  if (o.dp_steps < 1 || o.dp_steps > o.steps)
    return make_error(errc::invalid_input, "--dp-steps must be in [1, --steps]");
  for (const auto& m : o.modes)
    if (m != "diloco" && m != "streaming" && m != "decoupled")
      return make_error(errc::invalid_input,
                        "--modes: '" + m + "' is not one of diloco, streaming, decoupled (dp always runs)");
  if (!(o.ref_gbit > 0 && o.ref_params > 0 && o.ref_bytes_per_param > 0 && o.ref_tokens > 0 && o.ref_chips > 0 &&
        o.ref_chip_tflops > 0))
    return make_error(errc::invalid_input, "the --ref-* figures must be positive");
  return {};
}

config wan_defaults(const wan_options& o) {
  config d;
  d.model.size = o.model;
  d.mesh.learners = o.learners;
  d.train.steps = o.steps;
  d.train.threads = o.learners;  // one compute thread per learner
  d.data.eval_tokens = o.eval_tokens;
  // One shard: every learner has one capped link up and one down, as a site has one WAN
  // link; with S shards each learner would have S links, S times the capacity.
  d.mesh.shards = 1;
  // A frame of a whole model takes seconds on a capped link. Heartbeats travel on the control
  // lane and no longer queue behind it, but a round may stay open that long: the generous
  // liveness (kept so that these numbers compare with the recorded ones) and round timeout.
  d.wire.heartbeat_interval_ms = 2000;
  d.wire.liveness = 100;
  d.mesh.round_timeout_s = 3600;
  return d;
}

wan_scale::link scale_link(const wan_scale& s, double gbit) {
  wan_scale::link l;
  l.gbit = gbit;
  l.comm_s = s.ref_bytes / (gbit * 1e9 / 8);
  l.ratio = l.comm_s / s.ref_compute_s;
  // Our cap: dp's bytes per direction per step take `ratio` times our step's compute time.
  l.cap_mbit = s.ours_bytes / (l.ratio * s.ours_step_s) * 8 / 1e6;
  return l;
}

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

void set_step_time(wan_scale& s, const wan_options& o, double step_s) {
  s.ours_step_s = step_s;
  s.links.clear();
  for (double gbit : {2.0, 5.0}) s.links.push_back(scale_link(s, gbit));
  s.race = scale_link(s, o.ref_gbit);
  s.latency_ms = o.ref_latency_ms * s.ours_step_s / s.ref_compute_s;
}

expected<wan_result> run_wan_bench(const wan_options& o, const config& cfg, const bench_hooks& hooks,
                                   const std::function<void(wan_stage, const wan_result&)>& on_stage) {
  if (auto ok = check_wan_options(o); !ok) return ok.err();
  auto notify = [&](wan_stage stage, const wan_result& so_far) {
    if (on_stage) on_stage(stage, so_far);
  };
  config uncapped = cfg;
  uncapped.link.bandwidth_mbit = 0;
  uncapped.link.latency_ms = 0;
  wan_result r;
  r.load_before = load_average();
  auto scale = measure_scale(o, uncapped);
  if (!scale) return scale.err();
  r.scale = std::move(*scale);
  r.tokens_per_step = static_cast<double>(o.learners) * r.scale.ours_batch * r.scale.ours_context;
  if (auto ok = run_dp_uncapped(r, o, uncapped, hooks); !ok) return ok.err();
  notify(wan_stage::dp_uncapped, r);

  config capped = uncapped;
  capped.link.bandwidth_mbit = r.scale.race.cap_mbit;
  capped.link.latency_ms = r.scale.latency_ms;
  if (auto ok = run_dp_capped(r, o, capped, hooks); !ok) return ok.err();
  notify(wan_stage::dp_capped, r);

  for (const auto& mode : o.modes) {
    auto raced = race_mode(r, o, capped, mode, hooks);
    if (!raced) return raced.err();
    r.results.push_back(std::move(*raced));
    notify(wan_stage::mode_raced, r);
  }
  return r;
}

std::string race_plot(const std::vector<race_result>& results, double target) {
  double x_max = 0;
  for (const auto& r : results)
    if (!r.projected)
      for (const auto& [t, loss] : r.curve) x_max = std::max(x_max, t);
  std::vector<series> lines;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    lines.push_back(
        series{r.mode + (r.projected ? " (projected)" : ""), series_color(i), cut_at(r.curve, x_max), r.projected});
  }
  lines.push_back(series{"target", "#777", {{0, target}, {x_max, target}}, true});
  return chart("WAN race: eval loss under the capped links", "seconds", "eval loss, nats/byte", lines, {}, x_max);
}

}  // namespace archipelago
