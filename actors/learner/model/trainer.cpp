#include "learner/model/trainer.hpp"

#include <omp.h>

#include <Eigen/Core>
#include <cmath>
#include <numbers>

#include "core/prng.hpp"
#include "learner/model/cpu_peak.hpp"
#include "learner/model/synthetic.hpp"

namespace archipelago {

void set_compute_threads(int threads) {
  // Per calling thread: OpenMP's thread count is a per-thread setting, and
  // Eigen follows it when its own global count is 0. Several learners in one
  // process can so each have their own.
  omp_set_num_threads(threads);
  Eigen::setNbThreads(0);
}

gemm_function onednn_gemm() {
  auto made = dense_gemm::make(gemm_precision::fp32);
  if (!made) return eigen_gemm();  // fp32 needs nothing of the CPU; kept for a oneDNN that refuses anyway
  std::shared_ptr<dense_gemm> kernel = std::move(*made);
  return [kernel](bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
    kernel->run(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
  };
}

dense_backend dense_backend_for(const train_config& train, std::string& note) {
  gemm_cpu cpu = detect_gemm_cpu();
  if (train.precision == "auto" && cpu.bf16 && !cpu.amx) {
    // One pass of each peak loop on one thread (some 30 ms), once per process: every
    // engine of it (learners, restarts, the evaluator) then makes the same choice.
    static const bool bf16_faster = [] {
      const cpu_peak peak = measure_cpu_peak(1, 0);
      return peak.bf16_gflops > peak.fp32_gflops();
    }();
    cpu.bf16_faster = bf16_faster;
  }
  auto p = resolve_precision(train.precision, cpu, note);
  if (!p) {  // the knob is checked when parsed; a config built in code may still carry anything
    note = p.err().message + "; running fp32";
    return dense_backend::fp32;
  }
  return *p == gemm_precision::bf16 ? dense_backend::bf16 : dense_backend::fp32;
}

expected<dataset> load_dataset(const data_config& data, int shards, int context, std::uint64_t seed) {
  double floor_bpb = std::numeric_limits<double>::quiet_NaN();
  auto text = [&]() -> expected<corpus> {
    if (!data.corpus.empty()) return corpus::from_file(data.corpus);
    auto source = synthetic_source::make({data.synthetic_seed, data.synthetic_words});
    if (!source) return source.err();
    floor_bpb = source->entropy_rate_bits_per_byte();
    return corpus::from_bytes(source->generate(static_cast<std::size_t>(data.synthetic_bytes),
                                               derive_seed(data.synthetic_seed, 1)),
                              "synthetic");
  }();
  if (!text) return text.err();
  auto split = split_corpus(*text, shards, data.heldout_fraction, context, derive_seed(seed, 2));
  if (!split) return split.err();
  return dataset{std::move(*text), std::move(*split), floor_bpb};
}

engine::engine(const config& cfg, const model_shape& shape, const dataset& data, int shard)
    : cfg_(cfg),
      data_(data),
      model_(make_layout(shape), dense_backend_for(cfg.train, precision_note_)),
      optimizer_(model_.layout(), cfg.optimizer, onednn_gemm()),
      sampler_(data.text, data.split.shards.at(shard), shape.context,
               derive_seed(cfg.train.seed, 100 + static_cast<std::uint64_t>(shard))),
      eval_windows_(make_eval_windows(data.split.heldout, shape.context, cfg.data.eval_tokens)),
      batch_(cfg.data.batch) {
  if (cfg.train.precision == "bf16" && model_.backend() != dense_backend::bf16 && precision_note_.empty())
    precision_note_ = "train.precision = bf16: oneDNN built no bf16 matmul here; running fp32";
  model_.init(derive_seed(cfg.train.seed, 3));
  inputs_.resize(static_cast<std::size_t>(batch_) * shape.context);
  targets_.resize(inputs_.size());
}

double engine::step() {
  sampler_.next(batch_, inputs_.data(), targets_.data());
  const double loss = model_.forward_backward(inputs_.data(), targets_.data(), batch_);
  last_lr_ = scheduled_lr(cfg_.optimizer, steps_, cfg_.train.steps);
  optimizer_.step(model_.params(), model_.grads(), last_lr_);
  ++steps_;
  return loss;
}

double engine::compute_gradient() {
  sampler_.next(batch_, inputs_.data(), targets_.data());
  const double loss = model_.forward_backward(inputs_.data(), targets_.data(), batch_);
  ++steps_;
  return loss;
}

eval_result engine::evaluate() {
  const int t = model_.shape().context;
  const std::uint8_t* bytes = data_.text.data();
  std::vector<std::int32_t> in(static_cast<std::size_t>(batch_) * t), out(in.size());
  std::vector<int> first(batch_);
  double loss_sum = 0;
  std::int64_t scored = 0;
  for (std::size_t w = 0; w < eval_windows_.size(); w += batch_) {
    const int b = static_cast<int>(std::min<std::size_t>(batch_, eval_windows_.size() - w));
    for (int i = 0; i < b; ++i) {
      const eval_window& win = eval_windows_[w + i];
      for (int k = 0; k < t; ++k) {
        in[i * t + k] = bytes[win.offset + k];
        out[i * t + k] = bytes[win.offset + k + 1];
      }
      first[i] = win.first_scored;
    }
    model_.forward_scored(in.data(), out.data(), b, t, first.data(), loss_sum, scored);
  }
  eval_result r;
  r.scored = scored;
  r.loss = scored > 0 ? loss_sum / static_cast<double>(scored) : std::nan("");
  r.bits_per_byte = r.loss / std::numbers::ln2;
  return r;
}

std::vector<float> initial_global_params(const config& cfg, const model_shape& shape, const dataset& data) {
  if (!cfg.model.layout.empty()) return initial_layout_params(*resolve_layout(cfg), derive_seed(cfg.train.seed, 3));
  engine init(cfg, shape, data, 0);
  return {init.model().params(), init.model().params() + init.model().buffer_size()};
}

}  // namespace archipelago
