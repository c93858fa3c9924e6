// archipelago train: one learner, no mesh. Trains a model on a text file or on
// the built-in synthetic corpus, shows a live progress line, evaluates on the
// held-out part and optionally writes a checkpoint.

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"
#include "core/clock.hpp"
#include "learner/model/checkpoint.hpp"
#include "learner/model/sampler.hpp"
#include "learner/model/trainer.hpp"

namespace archipelago::cli {
namespace {

struct train_options {
  config_flags flags;
  std::string out;
  bool json = false;
  int sample_bytes = 240;
};

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

int run_train(const train_options& opts, logger& log) {
  auto cfg = opts.flags.resolve();
  if (!cfg) return report(cfg.err());
  const model_shape shape = *resolve_model(cfg->model);
  set_compute_threads(cfg->train.threads);

  auto data = load_dataset(cfg->data, 1, shape.context, cfg->train.seed);
  if (!data) return report(data.err());
  const std::string corpus_name = cfg->data.corpus.empty() ? "synthetic" : cfg->data.corpus;

  install_stop_handlers();
  engine eng(*cfg, shape, *data, 0);
  const param_layout& layout = eng.model().layout();
  if (!eng.precision_note().empty()) std::printf("%s\n", eng.precision_note().c_str());
  std::printf("model %s: %zu parameters (L=%d, C=%d, H=%d, T=%d%s), batch %d, %d threads, %s GEMMs (oneDNN %s)\n",
              cfg->model.size.c_str(), layout.param_count, shape.n_layer, shape.d_model,
              shape.n_head, shape.context, shape.tied ? ", tied" : "", cfg->data.batch,
              cfg->train.threads, eng.precision(), detect_gemm_cpu().isa.c_str());
  std::printf("corpus %s: %zu bytes (held out %.1f%%)", corpus_name.c_str(), data->text.size(),
              100.0 * cfg->data.heldout_fraction);
  if (!std::isnan(data->entropy_floor_bpb))
    std::printf(", entropy floor %.4f bits/byte", data->entropy_floor_bpb);
  std::printf("\n");
  std::fflush(stdout);

  steady_clock_source clock;
  const nanos start = clock.now();
  const std::int64_t steps = cfg->train.steps;
  const double time_limit = cfg->train.time_limit_s;
  double loss_ema = std::nan(""), last_eval = std::nan(""), last_eval_bpb = std::nan("");
  std::string stopped_by = "steps";
  progress_line progress(log, 50);
  auto elapsed = [&] { return to_seconds(clock.now() - start); };

  auto evaluate = [&] {
    const eval_result r = eng.evaluate();
    last_eval = r.loss;
    last_eval_bpb = r.bits_per_byte;
  };

  std::int64_t step = 0;
  for (; step < steps; ++step) {
    if (stop_requested.load()) {
      stopped_by = "signal";
      break;
    }
    if (time_limit > 0 && elapsed() >= time_limit) {
      stopped_by = "time_limit";
      break;
    }
    const double loss = eng.step();
    if (!std::isfinite(loss)) {
      progress.finish();
      return report(make_error(errc::internal, "training diverged: loss is " + std::to_string(loss) +
                                                   " at step " + std::to_string(step + 1) +
                                                   " (lower --lr?)"));
    }
    loss_ema = std::isnan(loss_ema) ? loss : 0.95 * loss_ema + 0.05 * loss;
    const bool eval_now = cfg->train.eval_every > 0 && (step + 1) % cfg->train.eval_every == 0 &&
                          step + 1 < steps;
    if (eval_now) evaluate();
    const double t = elapsed();
    const double tokens_per_s = static_cast<double>((step + 1) * eng.tokens_per_step()) / t;
    double eta_s = t / static_cast<double>(step + 1) * static_cast<double>(steps - step - 1);
    if (time_limit > 0) eta_s = std::min(eta_s, time_limit - t);
    const std::string eta = format_duration(eta_s);
    std::string line = "step " + std::to_string(step + 1) + "/" + std::to_string(steps) +
                       "  " + fmt("%.0f tok/s", tokens_per_s) + "  loss " + fmt("%.4f", loss_ema);
    if (!std::isnan(last_eval))
      line += "  eval " + fmt("%.4f", last_eval) + " (" + fmt("%.3f", last_eval_bpb) + " bpb)";
    line += "  lr " + fmt("%.2e", eng.last_lr()) + "  ETA " + eta;
    progress.update(line, eval_now);
  }
  progress.finish();
  const double train_wall = elapsed();
  evaluate();
  const std::int64_t tokens = step * eng.tokens_per_step();
  const double tokens_per_s = train_wall > 0 ? static_cast<double>(tokens) / train_wall : 0;

  std::printf("trained %lld steps, %lld tokens in %.1f s (%.0f tokens/s), stopped by %s\n",
              static_cast<long long>(step), static_cast<long long>(tokens), train_wall,
              tokens_per_s, stopped_by.c_str());
  std::printf("train loss %.4f nats/token, eval loss %.4f nats/token = %.4f bits/byte",
              loss_ema, last_eval, last_eval_bpb);
  if (!std::isnan(data->entropy_floor_bpb))
    std::printf(" (entropy floor %.4f, gap %.4f bits/byte)", data->entropy_floor_bpb,
                last_eval_bpb - data->entropy_floor_bpb);
  std::printf("\n");

  if (opts.sample_bytes > 0) {
    sample_options so;
    so.bytes = opts.sample_bytes;
    so.seed = cfg->train.seed;
    std::printf("sample: %s\n", sample_text(eng.model(), so).c_str());
  }

  if (!opts.out.empty()) {
    checkpoint ckpt;
    ckpt.shape = shape;
    ckpt.params.assign(eng.model().params(), eng.model().params() + eng.model().buffer_size());
    ckpt.steps = static_cast<std::uint64_t>(step);
    ckpt.tokens = static_cast<std::uint64_t>(tokens);
    ckpt.train_loss = loss_ema;
    ckpt.eval_loss = last_eval;
    ckpt.corpus = corpus_name;
    ckpt.seed = cfg->train.seed;
    if (auto ok = save_checkpoint(opts.out, ckpt); !ok) return report(ok.err());
    std::printf("checkpoint written to %s\n", opts.out.c_str());
  }

  if (opts.json) {
    json_line j;
    j.add("command", "train")
        .add("model", cfg->model.size)
        .add("params", static_cast<std::int64_t>(layout.param_count))
        .add("steps", step)
        .add("tokens", tokens)
        .add("wall_s", train_wall)
        .add("tokens_per_s", tokens_per_s)
        .add("train_loss", loss_ema)
        .add("eval_loss", last_eval)
        .add("eval_bpb", last_eval_bpb)
        .add("entropy_floor_bpb", data->entropy_floor_bpb)
        .add("gap_bpb", last_eval_bpb - data->entropy_floor_bpb)
        .add("corpus", corpus_name)
        .add("threads", cfg->train.threads)
        .add("precision", eng.precision())
        .add("batch", cfg->data.batch)
        .add("seed", cfg->train.seed)
        .add("stopped_by", stopped_by);
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_train_command(CLI::App& app) {
  auto opts = std::make_shared<train_options>();
  CLI::App* cmd = app.add_subcommand("train", "Train one learner (no mesh) and evaluate it");
  opts->flags.add_shortcut(*cmd, "--model", "model.size", "SIZE", "Model size: " + model_size_choices());
  opts->flags.add_shortcut(*cmd, "--corpus", "data.corpus", "FILE",
                           "Text file to train on (default: the built-in synthetic corpus)");
  opts->flags.add_shortcut(*cmd, "--steps", "train.steps", "N", "Optimizer steps");
  opts->flags.add_shortcut(*cmd, "--threads", "train.threads", "N", "Compute threads");
  opts->flags.add_shortcut(*cmd, "--precision", "train.precision", "P", "Dense GEMM inputs: fp32, bf16 or auto");
  opts->flags.add_shortcut(*cmd, "--lr", "optimizer.lr", "RATE", "Peak learning rate");
  opts->flags.add_shortcut(*cmd, "--batch", "data.batch", "B", "Sequences per step");
  opts->flags.add_shortcut(*cmd, "--seed", "train.seed", "SEED", "Run seed");
  opts->flags.add_shortcut(*cmd, "--time-limit", "train.time_limit_s", "SECONDS", "Stop after this many seconds");
  opts->flags.add_to(*cmd);
  cmd->add_option("--out", opts->out, "Write the trained model to this checkpoint file");
  cmd->add_option("--sample-bytes", opts->sample_bytes, "Bytes of sample text to print at the end (0: none)")
      ->check(CLI::Range(0, 100000));
  cmd->add_flag("--json", opts->json, "Print a one-line JSON summary last");
  return [opts](logger& log) { return run_train(*opts, log); };
}

}  // namespace archipelago::cli
