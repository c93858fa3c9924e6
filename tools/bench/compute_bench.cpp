#include "bench/compute_bench.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "bench/bench_stats.hpp"
#include "bench/reference_script.hpp"
#include "core/inner_optimizer.hpp"
#include "core/prng.hpp"
#include "learner/model/dense_gemm.hpp"
#include "learner/model/trainer.hpp"

namespace archipelago {
namespace {

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

optimizer_config muon_config() {
  optimizer_config opt;
  opt.kind = "muon";
  return opt;
}

/// One model and its optimizer, timed step by step.
struct timed_model {
  timed_model(const param_layout& layout, dense_backend backend)
      : model(layout, backend), optim(layout, optimizer_config{}) {
    model.init(1);
  }
  gpt<float> model;
  inner_optimizer optim;  // AdamW
  double last_optimizer_s = 0;
};

/// The model on a fixed random batch, once per dense backend, and the matched
/// GEMM: the model's largest product, [N, C] x [C, 4C], on the same N tokens,
/// through Eigen and through oneDNN.
class compute_engine {
 public:
  compute_engine(const model_shape& shape, int batch, bool backends)
      : layout_(make_layout(shape)), batch_(batch) {
    models_.push_back(std::make_unique<timed_model>(layout_, dense_backend::fp32));
    if (backends) {
      models_.push_back(std::make_unique<timed_model>(layout_, dense_backend::eigen));
      auto bf16 = std::make_unique<timed_model>(layout_, dense_backend::bf16);
      if (bf16->model.backend() == dense_backend::bf16) models_.push_back(std::move(bf16));
    }
    const std::size_t n_tokens = static_cast<std::size_t>(batch) * shape.context;
    in_.resize(n_tokens);
    out_.resize(n_tokens);
    prng rng(1);
    for (std::size_t i = 0; i < n_tokens; ++i) {
      in_[i] = static_cast<std::int32_t>(rng.below(256));
      out_[i] = static_cast<std::int32_t>(rng.below(256));
    }
    const Eigen::Index gn = static_cast<Eigen::Index>(n_tokens), gk = shape.d_model, gm = 4 * shape.d_model;
    a_ = row_matrix::Random(gn, gk);
    b_ = row_matrix::Random(gk, gm);
    c_.resize(gn, gm);
    gemm_flops_ = 2.0 * static_cast<double>(gn) * gk * gm;
    if (auto k = dense_gemm::make(gemm_precision::fp32)) sgemm_ = std::move(*k);
    if (auto k = dense_gemm::make(gemm_precision::bf16)) bf16_ = std::move(*k);
    for (const tensor_spec& t : layout_.tensors)
      if (t.kind == tensor_kind::matrix) muon_flops_ += newton_schulz_flops(t.rows, t.cols, muon_config().muon_ns_steps);
  }

  /// The timed backends: the engine (oneDNN fp32) first.
  std::size_t backends() const { return models_.size(); }
  dense_backend backend(std::size_t i) const { return models_[i]->model.backend(); }

  /// Seconds of one step of backend i; AdamW's part is added to `optimizer_s`.
  double step(std::size_t i, double& optimizer_s) {
    timed_model& m = *models_[i];
    const auto t0 = seconds_clock::now();
    m.model.forward_backward(in_.data(), out_.data(), batch_);
    const auto t1 = seconds_clock::now();
    m.optim.step(m.model.params(), m.model.grads(), 1e-3);
    m.last_optimizer_s = since(t1);
    optimizer_s += m.last_optimizer_s;
    return since(t0);
  }
  /// The AdamW update of the engine's last step, in seconds.
  double last_adamw_s() const { return models_[0]->last_optimizer_s; }
  /// Seconds of one Muon update (optimizer.kind = muon, its Newton–Schulz on
  /// oneDNN as in the engine) on the engine's last gradients, applied to a copy
  /// of its parameters so that the timed AdamW trajectory is not disturbed.
  double muon_sample() {
    gpt<float>& m = models_[0]->model;
    if (!muon_) {
      muon_ = std::make_unique<inner_optimizer>(layout_, muon_config(), onednn_gemm());
      muon_params_.resize(m.buffer_size());
    }
    std::copy(m.params(), m.params() + m.buffer_size(), muon_params_.begin());
    const auto t0 = seconds_clock::now();
    muon_->step(muon_params_.data(), m.grads(), 1e-3);
    return since(t0);
  }
  double muon_flops() const { return muon_flops_; }

  /// Seconds of one GEMM, repeated so that a sample lasts a few milliseconds at least.
  double gemm_sample() {
    return timed([&] { c_.noalias() = a_ * b_; });
  }
  bool has_sgemm() const { return sgemm_ != nullptr; }
  bool has_bf16_gemm() const { return bf16_ != nullptr; }
  double sgemm_sample() { return kernel_sample(*sgemm_); }
  double bf16_gemm_sample() { return kernel_sample(*bf16_); }

  void describe(compute_result& r) const {
    r.params = layout_.param_count;
    r.flops_per_step = models_[0]->model.flops_per_step(batch_);
    r.attention_kernel = models_[0]->model.attention_kernel();
    r.gelu_kernel = models_[0]->model.gelu_kernel();
    r.gemm_n = static_cast<long>(a_.rows());
    r.gemm_k = static_cast<long>(a_.cols());
    r.gemm_m = static_cast<long>(b_.cols());
  }
  void set_profile(step_profile* p) { models_[0]->model.set_profile(p); }

 private:
  template <class F>
  double timed(F f) {
    const int reps = std::max(1, static_cast<int>(2e8 / gemm_flops_));
    const auto t0 = seconds_clock::now();
    for (int r = 0; r < reps; ++r) f();
    return since(t0) / reps;
  }
  double kernel_sample(dense_gemm& k) {
    return timed([&] {
      k.run(false, false, a_.rows(), b_.cols(), a_.cols(), a_.data(), a_.cols(), b_.data(), b_.cols(), 0.0f,
            c_.data(), c_.cols());
    });
  }

  param_layout layout_;
  std::vector<std::unique_ptr<timed_model>> models_;
  int batch_;
  std::vector<std::int32_t> in_, out_;
  row_matrix a_, b_, c_;
  double gemm_flops_ = 0;
  std::unique_ptr<dense_gemm> sgemm_, bf16_;
  std::unique_ptr<inner_optimizer> muon_;
  std::vector<float> muon_params_;
  double muon_flops_ = 0;  // Newton–Schulz's per update
};

/// Runs the PyTorch reference once under its configuration; the last stdout line is JSON.
void run_torch(torch_run& run, const compute_options& o, int steps) {
  const std::string cmd = "env " + run.env + " " + o.python + " " + o.torch_script + " --model " + o.model +
                          " --threads " + std::to_string(o.threads) + " --batch " + std::to_string(o.batch) +
                          " --steps " + std::to_string(steps) + " --warmup " + std::to_string(o.warmup) + run.args +
                          " --json";
  auto line = last_json_line(cmd, o.python, "PyTorch reference", 400);
  if (!line) {
    run.error = line.err().message;
    return;
  }
  run.tokens_per_s.push_back(json_number(*line, "tokens_per_s"));
  run.blas = json_string(*line, "blas");
}

status check_options(const compute_options& o) {
  if (auto shape = model_preset(o.model); !shape) return shape.err();
  if (o.threads < 1) return make_error(errc::invalid_input, "--threads must be at least 1");
  if (o.batch < 1) return make_error(errc::invalid_input, "--batch must be at least 1");
  if (o.against_torch && !std::filesystem::exists(o.torch_script))
    return make_error(errc::not_found, "PyTorch reference '" + o.torch_script + "' not found (--torch-script)");
  if (o.against_torch) return require_openblas(o.tuned_blas_dir, "the tuned PyTorch reference");
  return {};
}

/// Median tokens/s of the steps from `first` on.
double round_tokens_per_s(const compute_result& r, const std::vector<double>& steps, std::size_t first) {
  if (steps.size() == first) return std::nan("");
  return static_cast<double>(r.tokens_per_step) /
         median(std::vector<double>(steps.begin() + static_cast<std::ptrdiff_t>(first), steps.end()));
}

/// One round: the CPU's peaks, the engine's steps (with GEMM samples after
/// each), the other backends, the engine on one thread, then every PyTorch
/// configuration still working; each ratio is taken against this round's engine.
void run_round(compute_engine& engine, compute_result& r, const compute_options& o, int steps, int round,
               const bench_hooks& hooks) {
  if (o.peak_s > 0 && !hooks.stopped()) r.peaks.push_back(measure_cpu_peak(o.threads, o.peak_s));
  const std::size_t first = r.step_s.size();
  for (int i = 0; i < steps && !hooks.stopped(); ++i) {
    r.step_s.push_back(engine.step(0, r.optimizer_s));
    r.adamw_s.push_back(engine.last_adamw_s());
    r.muon_s.push_back(engine.muon_sample());
    r.gemm_s.push_back(engine.gemm_sample());
    if (engine.has_sgemm()) r.sgemm_s.push_back(engine.sgemm_sample());
    if (engine.has_bf16_gemm()) r.bf16_gemm_s.push_back(engine.bf16_gemm_sample());
    hooks.update("bench compute " + o.model + ": sample " + std::to_string(r.step_s.size()));
  }
  if (r.step_s.size() == first) return;
  const double ours = round_tokens_per_s(r, r.step_s, first);
  r.round_tps.push_back(ours);
  {
    auto from = [first](const std::vector<double>& v) {
      return median(std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(first), v.end()));
    };
    const double step = from(r.step_s);
    r.round_muon_vs_adamw.push_back((step - from(r.adamw_s) + from(r.muon_s)) / step);
  }
  r.round_vs_best_sgemm.push_back(r.gflops_at(ours) / r.best_sgemm_gflops(first));
  double ours_bf16 = std::nan("");
  double unused = 0;
  for (std::size_t b = 1; b < engine.backends(); ++b) {
    backend_run& run = r.others[b - 1];
    const std::size_t from = run.step_s.size();
    for (int i = 0; i < steps && !hooks.stopped(); ++i) {
      run.step_s.push_back(engine.step(b, unused));
      hooks.update("bench compute " + o.model + " (" + backend_name(run.backend) + "): sample " +
                   std::to_string(run.step_s.size()));
    }
    if (run.step_s.size() == from) continue;
    run.round_tps.push_back(round_tokens_per_s(r, run.step_s, from));
    run.ratio.push_back(run.round_tps.back() / ours);
    if (run.backend == dense_backend::bf16) ours_bf16 = run.round_tps.back();
  }
  if (o.backends && o.threads > 1 && !hooks.stopped()) {
    set_compute_threads(1);
    engine.set_profile(nullptr);  // the profile is of the timed thread count only
    const int one_steps = std::max(2, steps / 3);
    engine.step(0, unused);  // warm-up at this thread count
    for (int i = 0; i < one_steps && !hooks.stopped(); ++i) {
      r.one_thread_step_s.push_back(engine.step(0, unused));
      hooks.update("bench compute " + o.model + " (1 thread): sample " + std::to_string(r.one_thread_step_s.size()));
    }
    set_compute_threads(o.threads);
    if (o.profile) engine.set_profile(&r.profile);
  }
  for (auto& run : r.torch) {
    if (!run.error.empty() || hooks.stopped()) continue;
    hooks.begin("round " + std::to_string(round + 1) + "/" + std::to_string(r.rounds) + ": PyTorch reference (" +
                run.label + ")...");
    run_torch(run, o, steps);
    if (!run.error.empty()) continue;
    run.ratio.push_back(ours / run.tokens_per_s.back());
    if (!std::isnan(ours_bf16)) run.ratio_bf16.push_back(ours_bf16 / run.tokens_per_s.back());
  }
}

}  // namespace

int default_compute_steps(const std::string& model) {
  // About the same timed work per preset: fewer steps as the model grows.
  if (model == "small") return 2;
  if (model == "mini") return 6;
  if (model == "micro") return 15;
  return 40;
}

std::vector<torch_run> torch_configurations(const compute_options& o) {
  // "as installed": the pthread OpenBLAS where present, core type auto-detected
  // (what Debian links when it is installed beside python3-torch); "tuned" follows docs/design/baselines.md §1 (the
  // OpenMP OpenBLAS with its AVX-512 kernels forced) and keeps freed buffers
  // in the heap (--mallopt), the best tuning found here.
  const std::string pthread_dir = "/usr/lib/x86_64-linux-gnu/openblas-pthread";
  const std::string clean_env = "-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_NUM_THREADS";
  std::vector<torch_run> runs(3);
  runs[0].label = "tuned";
  runs[0].env = clean_env + " LD_LIBRARY_PATH=" + o.tuned_blas_dir + " OPENBLAS_CORETYPE=SkylakeX";
  runs[0].args = " --mallopt";  // heap-served buffers, as archipelago's own main does
  runs[1].label = "as_installed";
  runs[1].env = std::filesystem::exists(pthread_dir) ? clean_env + " LD_LIBRARY_PATH=" + pthread_dir : clean_env;
  // The tuned setup with bf16 autocast: PyTorch 1.13 sends bf16 matmuls to
  // oneDNN (mkldnn) where the CPU has AVX-512 BF16, and keeps softmax, LayerNorm
  // and the loss in fp32.
  runs[2] = runs[0];
  runs[2].label = "bf16_autocast";
  runs[2].args += " --autocast-bf16";
  return runs;
}

expected<compute_result> run_compute_bench(const compute_options& o, const bench_hooks& hooks) {
  if (auto ok = check_options(o); !ok) return ok.err();
  const model_shape shape = *model_preset(o.model);
  const int steps = o.steps > 0 ? o.steps : default_compute_steps(o.model);
  set_compute_threads(o.threads);
  compute_engine engine(shape, o.batch, o.backends);
  compute_result r;
  r.model = o.model;
  r.threads = o.threads;
  r.onednn_isa = detect_gemm_cpu().isa;
  for (std::size_t b = 1; b < engine.backends(); ++b) r.others.push_back(backend_run{engine.backend(b), {}, {}, {}});
  r.context = shape.context;
  r.tokens_per_step = static_cast<std::size_t>(o.batch) * shape.context;
  r.simd = Eigen::SimdInstructionSetsInUse();
  engine.describe(r);
  r.muon_flops_per_step = engine.muon_flops();
  for (int i = 0; i < o.warmup; ++i) {
    for (std::size_t b = 0; b < engine.backends(); ++b) engine.step(b, r.optimizer_s);
    engine.muon_sample();
    engine.gemm_sample();
    if (engine.has_sgemm()) engine.sgemm_sample();
    if (engine.has_bf16_gemm()) engine.bf16_gemm_sample();
  }
  r.optimizer_s = 0;
  if (o.profile) engine.set_profile(&r.profile);
  if (o.against_torch) r.torch = torch_configurations(o);
  // Rounds of (ours, then each PyTorch configuration); a ratio is taken within
  // each round and the median ratio reported, so a drift in the load of this
  // shared machine affects both sides of a ratio alike.
  r.rounds = o.rounds;
  for (int round = 0; round < r.rounds && !hooks.stopped(); ++round) run_round(engine, r, o, steps, round, hooks);
  engine.set_profile(nullptr);
  if (r.step_s.empty()) return make_error(errc::internal, "interrupted before any sample");
  return r;
}

double compute_result::step_median_s() const { return median(step_s); }
double compute_result::step_best_s() const {
  return step_s.empty() ? std::nan("") : *std::min_element(step_s.begin(), step_s.end());
}
double compute_result::tokens_per_s() const { return static_cast<double>(tokens_per_step) / step_median_s(); }
double compute_result::gflops() const { return flops_per_step / step_median_s() * 1e-9; }
double compute_result::gflops_at(double tokens_per_s) const {
  return tokens_per_s / static_cast<double>(tokens_per_step) * flops_per_step * 1e-9;
}

namespace {
/// GFLOP/s of the matched GEMM over its median sample from `first` on (NaN: none).
double gemm_gflops_of(const compute_result& r, const std::vector<double>& samples, std::size_t first = 0) {
  if (samples.size() <= first) return std::nan("");
  return 2.0 * static_cast<double>(r.gemm_n) * static_cast<double>(r.gemm_k) * static_cast<double>(r.gemm_m) /
         median(std::vector<double>(samples.begin() + static_cast<std::ptrdiff_t>(first), samples.end())) * 1e-9;
}
}  // namespace

double compute_result::gemm_gflops() const { return gemm_gflops_of(*this, gemm_s); }
double compute_result::ratio_vs_gemm() const { return gflops() / gemm_gflops(); }

double compute_result::sgemm_gflops() const { return gemm_gflops_of(*this, sgemm_s); }
double compute_result::bf16_gemm_gflops() const { return gemm_gflops_of(*this, bf16_gemm_s); }
double compute_result::best_sgemm_gflops(std::size_t first) const {
  const double s = gemm_gflops_of(*this, sgemm_s, first), e = gemm_gflops_of(*this, gemm_s, first);
  return std::isnan(s) ? e : std::max(s, e);
}
double compute_result::ratio_vs_best_sgemm() const { return gflops() / best_sgemm_gflops(); }

const backend_run* compute_result::other(dense_backend b) const {
  for (const auto& run : others)
    if (run.backend == b && !run.step_s.empty()) return &run;
  return nullptr;
}
double compute_result::backend_tokens_per_s(dense_backend b) const {
  if (b == dense_backend::fp32) return tokens_per_s();
  const backend_run* run = other(b);
  return run ? static_cast<double>(tokens_per_step) / median(run->step_s) : std::nan("");
}
double compute_result::backend_gflops(dense_backend b) const { return gflops_at(backend_tokens_per_s(b)); }
double compute_result::fp32_peak_gflops() const {
  double best = std::nan("");
  for (const auto& p : peaks)
    if (p.fp32_gflops() > 0 && !(p.fp32_gflops() <= best)) best = p.fp32_gflops();
  return best;
}
double compute_result::bf16_peak_gflops() const {
  double best = std::nan("");
  for (const auto& p : peaks)
    if (p.bf16_best_gflops() > 0 && !(p.bf16_best_gflops() <= best)) best = p.bf16_best_gflops();
  return best;
}
double compute_result::muon_tokens_per_s() const {
  return static_cast<double>(tokens_per_step) / (step_median_s() - median(adamw_s) + median(muon_s));
}
double compute_result::newton_schulz_gflops() const { return muon_flops_per_step / median(muon_s) * 1e-9; }
double compute_result::thread_efficiency() const {
  if (one_thread_step_s.empty() || threads < 1) return std::nan("");
  return median(one_thread_step_s) / (step_median_s() * threads);
}

}  // namespace archipelago
