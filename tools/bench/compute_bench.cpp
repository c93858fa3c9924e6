#include "bench/compute_bench.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <filesystem>

#include "bench/bench_stats.hpp"
#include "bench/reference_script.hpp"
#include "core/adamw.hpp"
#include "core/prng.hpp"
#include "learner/model/trainer.hpp"

namespace archipelago {
namespace {

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The model on a fixed random batch, and the matched GEMM: the model's largest
/// product, [N, C] x [C, 4C], on the same N tokens.
class compute_engine {
 public:
  compute_engine(const model_shape& shape, int batch)
      : layout_(make_layout(shape)), model_(layout_), optim_(layout_, optimizer_config{}), batch_(batch) {
    model_.init(1);
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
  }

  /// Seconds of one step; AdamW's part is added to `optimizer_s`.
  double step(double& optimizer_s) {
    const auto t0 = seconds_clock::now();
    model_.forward_backward(in_.data(), out_.data(), batch_);
    const auto t1 = seconds_clock::now();
    optim_.step(model_.params(), model_.grads(), 1e-3);
    optimizer_s += since(t1);
    return since(t0);
  }

  /// Seconds of one GEMM, repeated so that a sample lasts a few milliseconds at least.
  double gemm_sample() {
    const int reps = std::max(1, static_cast<int>(2e8 / gemm_flops_));
    const auto t0 = seconds_clock::now();
    for (int r = 0; r < reps; ++r) c_.noalias() = a_ * b_;
    return since(t0) / reps;
  }

  void describe(compute_result& r) const {
    r.params = layout_.param_count;
    r.flops_per_step = model_.flops_per_step(batch_);
    r.gemm_n = static_cast<long>(a_.rows());
    r.gemm_k = static_cast<long>(a_.cols());
    r.gemm_m = static_cast<long>(b_.cols());
  }
  void set_profile(step_profile* p) { model_.set_profile(p); }

 private:
  param_layout layout_;
  gpt<float> model_;
  adamw optim_;
  int batch_;
  std::vector<std::int32_t> in_, out_;
  row_matrix a_, b_, c_;
  double gemm_flops_ = 0;
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
  return {};
}

/// One round: the engine's steps (with a GEMM sample after each), then every
/// PyTorch configuration still working, each ratio taken against this round's engine.
void run_round(compute_engine& engine, compute_result& r, const compute_options& o, int steps, int round,
               const bench_hooks& hooks) {
  const std::size_t first = r.step_s.size();
  for (int i = 0; i < steps && !hooks.stopped(); ++i) {
    r.step_s.push_back(engine.step(r.optimizer_s));
    r.gemm_s.push_back(engine.gemm_sample());
    hooks.update("bench compute " + o.model + ": sample " + std::to_string(r.step_s.size()));
  }
  if (r.step_s.size() == first) return;
  const double ours = static_cast<double>(r.tokens_per_step) /
                      median(std::vector<double>(r.step_s.begin() + static_cast<std::ptrdiff_t>(first), r.step_s.end()));
  for (auto& run : r.torch) {
    if (!run.error.empty() || hooks.stopped()) continue;
    hooks.begin("round " + std::to_string(round + 1) + "/" + std::to_string(r.rounds) + ": PyTorch reference (" +
                run.label + ")...");
    run_torch(run, o, steps);
    if (run.error.empty()) run.ratio.push_back(ours / run.tokens_per_s.back());
  }
}

}  // namespace

int default_compute_steps(const std::string& model) { return model == "mini" ? 6 : model == "micro" ? 15 : 40; }

std::vector<torch_run> torch_configurations() {
  // "as installed" is what `apt-get install python3-torch` gives (the pthread
  // OpenBLAS, core type auto-detected); "tuned" follows MACHINE.md §6 (the
  // OpenMP OpenBLAS with its AVX-512 kernels forced) and keeps freed buffers
  // in the heap (--mallopt), the best tuning found here.
  const std::string blas_dir = "/usr/lib/x86_64-linux-gnu/openblas-";
  const std::string clean_env = "-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_NUM_THREADS";
  std::vector<torch_run> runs(2);
  runs[0].label = "tuned";
  runs[0].env = std::filesystem::exists(blas_dir + "openmp")
                    ? clean_env + " LD_LIBRARY_PATH=" + blas_dir + "openmp OPENBLAS_CORETYPE=SkylakeX"
                    : clean_env + " OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1";
  runs[0].args = " --mallopt";  // heap-served buffers, as archipelago's own main does
  runs[1].label = "as_installed";
  runs[1].env = std::filesystem::exists(blas_dir + "pthread") ? clean_env + " LD_LIBRARY_PATH=" + blas_dir + "pthread"
                                                              : clean_env;
  return runs;
}

expected<compute_result> run_compute_bench(const compute_options& o, const bench_hooks& hooks) {
  if (auto ok = check_options(o); !ok) return ok.err();
  const model_shape shape = *model_preset(o.model);
  const int steps = o.steps > 0 ? o.steps : default_compute_steps(o.model);
  set_compute_threads(o.threads);
  compute_engine engine(shape, o.batch);
  compute_result r;
  r.model = o.model;
  r.context = shape.context;
  r.tokens_per_step = static_cast<std::size_t>(o.batch) * shape.context;
  r.simd = Eigen::SimdInstructionSetsInUse();
  engine.describe(r);
  for (int i = 0; i < o.warmup; ++i) {
    engine.step(r.optimizer_s);
    engine.gemm_sample();
  }
  r.optimizer_s = 0;
  if (o.profile) engine.set_profile(&r.profile);
  if (o.against_torch) r.torch = torch_configurations();
  // Rounds of (ours, then each PyTorch configuration); a ratio is taken within
  // each round and the median ratio reported, so a drift in the load of this
  // shared machine affects both sides of a ratio alike.
  r.rounds = o.against_torch ? o.rounds : 1;
  for (int round = 0; round < r.rounds && !hooks.stopped(); ++round) run_round(engine, r, o, steps, round, hooks);
  engine.set_profile(nullptr);
  if (r.step_s.empty()) return make_error(errc::internal, "interrupted before any sample");
  return r;
}

double compute_result::step_median_s() const { return median(step_s); }
double compute_result::step_best_s() const {
  return step_s.empty() ? std::nan("") : *std::min_element(step_s.begin(), step_s.end());
}
double compute_result::gemm_median_s() const { return median(gemm_s); }
double compute_result::tokens_per_s() const { return static_cast<double>(tokens_per_step) / step_median_s(); }
double compute_result::gflops() const { return flops_per_step / step_median_s() * 1e-9; }
double compute_result::gemm_gflops() const {
  return 2.0 * static_cast<double>(gemm_n) * static_cast<double>(gemm_k) * static_cast<double>(gemm_m) /
         gemm_median_s() * 1e-9;
}
double compute_result::ratio_vs_gemm() const { return gflops() / gemm_gflops(); }

}  // namespace archipelago
