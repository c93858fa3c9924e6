#pragma once
// The learner's engine: one model replica, its optimizer and its data shard,
// advanced one step at a time. `archipelago train` drives it directly; the
// learner role drives the same engine inside the mesh.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/inner_optimizer.hpp"
#include "learner/model/corpus.hpp"
#include "learner/model/gpt.hpp"

namespace archipelago {

/// The corpus, split into a held-out part and `shards` learner shards.
struct dataset {
  corpus text;
  corpus_split split;
  /// Exact entropy rate of the synthetic source; NaN for a real corpus.
  double entropy_floor_bpb = std::numeric_limits<double>::quiet_NaN();
};

/// Loads data.corpus (or generates the synthetic corpus) and splits it.
expected<dataset> load_dataset(const data_config& data, int shards, int context, std::uint64_t seed);

struct eval_result {
  double loss = 0;          // nats per byte (= per token)
  double bits_per_byte = 0;
  std::int64_t scored = 0;  // tokens scored
};

class engine {
 public:
  /// `shard` selects the learner's part of `data`; `data` must outlive the engine.
  engine(const config& cfg, const model_shape& shape, const dataset& data, int shard);

  /// One inner step: sample a batch, forward, backward, the inner optimizer
  /// (optimizer.kind) at the scheduled learning rate. Returns the batch's mean loss (nats/token).
  double step();

  /// The dp policy's step: sample a batch, forward and backward, no update; the
  /// gradient stays in model().grads() until the next step. Returns the loss.
  double compute_gradient();

  /// Loss on the held-out windows (data.eval_tokens of them at most).
  eval_result evaluate();

  gpt<float>& model() { return model_; }
  inner_optimizer& optimizer() { return optimizer_; }
  std::int64_t steps_done() const { return steps_; }
  /// Resuming a run: the schedule (and the step budget) continue from `step`.
  void start_at_step(std::int64_t step) { steps_ = step; }
  std::int64_t tokens_per_step() const { return static_cast<std::int64_t>(batch_) * model_.shape().context; }
  double last_lr() const { return last_lr_; }
  /// The dense layers' precision in use ("fp32" or "bf16"), and the one line
  /// saying why it differs from train.precision = bf16 (empty when it does not).
  const char* precision() const { return model_.backend() == dense_backend::bf16 ? "bf16" : "fp32"; }
  const std::string& precision_note() const { return precision_note_; }

 private:
  config cfg_;
  const dataset& data_;
  std::string precision_note_;  // before model_: its constructor fills it
  gpt<float> model_;
  inner_optimizer optimizer_;
  batch_sampler sampler_;
  std::vector<eval_window> eval_windows_;
  int batch_;
  std::vector<std::int32_t> inputs_, targets_;
  std::int64_t steps_ = 0;
  double last_lr_ = 0;
};

/// The initial global model: the seeded initialisation every shard derives alike
/// (learner shard 0's engine, before any step).
std::vector<float> initial_global_params(const config& cfg, const model_shape& shape, const dataset& data);

/// The dense backend for train.precision on this CPU (dense_gemm.hpp's
/// resolve_precision); `note` gets the one line of a fallback to fp32.
dense_backend dense_backend_for(const train_config& train, std::string& note);

/// oneDNN's fp32 GEMM (the dense layers' own) as a gemm_function: what Muon's
/// Newton–Schulz iterations run on in the engine.
gemm_function onednn_gemm();

/// Applies the thread count to OpenMP and Eigen, for the calling thread.
void set_compute_threads(int threads);

}  // namespace archipelago
