// The float engine: determinism, agreement with the double build, learning,
// and AdamW against a direct transcription of its update rule.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/prng.hpp"
#include "core/adamw.hpp"
#include "learner/model/attention_avx512.hpp"
#include "learner/model/dense_gemm.hpp"
#include "learner/model/gpt.hpp"
#include "learner/model/trainer.hpp"

using namespace archipelago;

namespace {

const model_shape tiny{256, 16, 32, 2, 4, true};

std::vector<std::int32_t> random_tokens(std::size_t n, std::uint64_t seed) {
  prng rng(seed);
  std::vector<std::int32_t> out(n);
  for (auto& t : out) t = static_cast<std::int32_t>(rng.below(256));
  return out;
}

std::vector<double> train_losses(int threads, std::uint64_t seed, int steps) {
  set_compute_threads(threads);
  const param_layout layout = make_layout(tiny);
  gpt<float> model(layout);
  model.init(seed);
  optimizer_config opt;
  opt.warmup_steps = 2;
  adamw optim(layout, opt);
  const int batch = 4;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    const auto in = random_tokens(batch * tiny.context, derive_seed(seed, s));
    const auto out = random_tokens(batch * tiny.context, derive_seed(seed, 1000 + s));
    losses.push_back(model.forward_backward(in.data(), out.data(), batch));
    optim.step(model.params(), model.grads(), scheduled_lr(opt, s, steps));
  }
  set_compute_threads(2);
  return losses;
}

}  // namespace

TEST_CASE("same seed and thread count give bit-identical losses") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    const auto a = train_losses(threads, 5, 6);
    const auto b = train_losses(threads, 5, 6);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
  }
  CHECK(train_losses(2, 5, 3) != train_losses(2, 6, 3));
}

TEST_CASE("initial loss is near ln(256) and the float engine agrees with double") {
  const param_layout layout = make_layout(tiny);
  gpt<float> f(layout);
  gpt<double> d(layout);
  f.init(3);
  d.init(3);
  const auto in = random_tokens(2 * tiny.context, 77), out = random_tokens(2 * tiny.context, 78);
  const double lf = f.forward_backward(in.data(), out.data(), 2);
  const double ld = d.forward_backward(in.data(), out.data(), 2);
  CHECK(ld == doctest::Approx(std::log(256.0)).epsilon(0.01));
  CHECK(lf == doctest::Approx(ld).epsilon(1e-5));
  for (std::size_t i = 0; i < layout.total_floats; i += 97)
    CHECK(f.grads()[i] == doctest::Approx(d.grads()[i]).epsilon(1e-3).scale(1e-6));
}

TEST_CASE("the model memorises a fixed sequence") {
  const std::uint64_t seed = 21;
  CAPTURE(seed);
  const param_layout layout = make_layout(tiny);
  gpt<float> model(layout);
  model.init(seed);
  optimizer_config opt;
  opt.lr = 1e-2;
  opt.warmup_steps = 5;
  adamw optim(layout, opt);
  const auto in = random_tokens(tiny.context, seed);
  std::vector<std::int32_t> out(in.begin() + 1, in.end());
  out.push_back(in.front());
  double first = 0, last = 0;
  for (int s = 0; s < 150; ++s) {
    last = model.forward_backward(in.data(), out.data(), 1);
    if (s == 0) first = last;
    optim.step(model.params(), model.grads(), scheduled_lr(opt, s, 150));
  }
  CHECK(first > 5.0);
  CHECK(last < 0.1);
}

TEST_CASE("forward_scored scores exactly the requested positions") {
  const param_layout layout = make_layout(tiny);
  gpt<float> model(layout);
  model.init(4);
  const auto in = random_tokens(2 * tiny.context, 5), out = random_tokens(2 * tiny.context, 6);
  const int all[2] = {0, 0}, half[2] = {8, 15};
  double full_sum = 0, part_sum = 0;
  std::int64_t full_n = 0, part_n = 0;
  model.forward_scored(in.data(), out.data(), 2, tiny.context, all, full_sum, full_n);
  model.forward_scored(in.data(), out.data(), 2, tiny.context, half, part_sum, part_n);
  CHECK(full_n == 32);
  CHECK(part_n == 8 + 1);
  CHECK(part_sum < full_sum);
  // The training loss on the same batch is the mean of the scored losses.
  const double mean = model.forward_backward(in.data(), out.data(), 2);
  CHECK(full_sum / full_n == doctest::Approx(mean).epsilon(1e-6));
}

TEST_CASE("AdamW matches its update rule, clipping bounds the step") {
  model_shape s{256, 4, 4, 1, 1, true};
  const param_layout layout = make_layout(s);
  optimizer_config opt;
  opt.clip_norm = 0;
  adamw optim(layout, opt);
  std::vector<float> p(layout.total_floats), g(layout.total_floats), p0;
  prng rng(8);
  for (const auto& t : layout.tensors)
    for (std::size_t k = 0; k < t.size(); ++k) {
      p[t.offset + k] = static_cast<float>(rng.normal());
      g[t.offset + k] = static_cast<float>(rng.normal());
    }
  p0 = p;
  const double lr = 0.01;
  optim.step(p.data(), g.data(), lr);
  for (const auto& t : layout.tensors) {
    CAPTURE(t.name);
    const std::size_t i = t.offset;
    // Step 1: m̂ = g, v̂ = g², update = g/(|g|+eps) ≈ sign(g).
    const double decay = t.decays() ? 1.0 - lr * opt.weight_decay : 1.0;
    const double expect = p0[i] * decay - lr * g[i] / (std::abs(g[i]) + opt.eps);
    CHECK(p[i] == doctest::Approx(expect).epsilon(1e-5));
  }
  const double norm = global_norm(g.data(), g.size());
  double direct = 0;
  for (float x : g) direct += static_cast<double>(x) * x;
  CHECK(norm == doctest::Approx(std::sqrt(direct)).epsilon(1e-9));

  opt.clip_norm = 1e-3;
  adamw clipped(layout, opt);
  std::vector<float> q = p0;
  const double reported = clipped.step(q.data(), g.data(), lr);
  CHECK(reported == doctest::Approx(norm));
}

TEST_CASE("the schedule warms up linearly and decays by cosine to the floor") {
  optimizer_config opt;
  opt.lr = 1.0;
  opt.warmup_steps = 10;
  opt.min_lr_ratio = 0.1;
  CHECK(scheduled_lr(opt, 0, 100) == doctest::Approx(0.1));
  CHECK(scheduled_lr(opt, 9, 100) == doctest::Approx(1.0));
  CHECK(scheduled_lr(opt, 55, 100) == doctest::Approx(0.55));
  CHECK(scheduled_lr(opt, 100, 100) == doctest::Approx(0.1));
  CHECK(scheduled_lr(opt, 500, 100) == doctest::Approx(0.1));
}

namespace {

/// The fp32 backend's attention (oneDNN's batched, or the fused AVX-512 kernels)
/// against Eigen's per-head attention, on full-length sequences: the loss and
/// every tensor's gradient. Biases and LayerNorm parameters are perturbed so every
/// fused bias and residual path carries a gradient.
void check_attention_against_eigen(const model_shape& shape, int batch, std::uint64_t seed) {
  CAPTURE(seed);
  const param_layout layout = make_layout(shape);
  gpt<float> fast(layout, dense_backend::fp32), eigen(layout, dense_backend::eigen);
  REQUIRE(fast.backend() == dense_backend::fp32);
  CHECK(std::string(eigen.attention_kernel()) == "eigen per head");
  CHECK(std::string(eigen.gelu_kernel()) == "eigen");
  MESSAGE("attention kernels: " << std::string(fast.attention_kernel()) << " (T " << shape.context << ", head dim "
                                << shape.head_dim() << ")");
  fast.init(seed);
  prng rng(derive_seed(seed, 1));
  for (const auto& t : layout.tensors)
    if (t.kind == tensor_kind::vector)
      for (std::size_t k = 0; k < t.size(); ++k) fast.params()[t.offset + k] += 0.1f * static_cast<float>(rng.normal());
  std::memcpy(eigen.params(), fast.params(), layout.total_floats * sizeof(float));
  const auto in = random_tokens(batch * shape.context, derive_seed(seed, 2));
  const auto out = random_tokens(batch * shape.context, derive_seed(seed, 3));
  const double la = fast.forward_backward(in.data(), out.data(), batch);
  const std::vector<float> first(fast.grads(), fast.grads() + layout.total_floats);
  // Deterministic: the same batch again gives the same loss and gradients, bit for bit.
  CHECK(fast.forward_backward(in.data(), out.data(), batch) == la);
  CHECK(std::memcmp(first.data(), fast.grads(), layout.total_floats * sizeof(float)) == 0);
  const double lb = eigen.forward_backward(in.data(), out.data(), batch);
  CHECK(la == doctest::Approx(lb).epsilon(1e-5));
  for (const auto& t : layout.tensors) {
    CAPTURE(t.name);
    double diff = 0, norm = 0;
    for (std::size_t k = 0; k < t.size(); ++k) {
      const double a = fast.grads()[t.offset + k], b = eigen.grads()[t.offset + k];
      diff += (a - b) * (a - b);
      norm += b * b;
    }
    CHECK(norm > 0);
    CHECK(std::sqrt(diff) <= 1e-4 * std::sqrt(norm));
  }
  // A shorter batch (evaluation, sampling) runs Eigen's attention in both models;
  // beside the kernels its probabilities live in per-thread tiles, not in the workspace.
  const int short_len = shape.context / 2 + 3;
  const std::vector<int> from(batch, 0);
  double sum_fast = 0, sum_eigen = 0;
  std::int64_t n_fast = 0, n_eigen = 0;
  fast.forward_scored(in.data(), out.data(), batch, short_len, from.data(), sum_fast, n_fast);
  eigen.forward_scored(in.data(), out.data(), batch, short_len, from.data(), sum_eigen, n_eigen);
  CHECK(n_fast == std::int64_t{batch} * short_len);
  CHECK(n_fast == n_eigen);
  CHECK(sum_fast == doctest::Approx(sum_eigen).epsilon(1e-5));
  // ...and the full-length pass after it still gives the first gradients, bit for bit.
  CHECK(fast.forward_backward(in.data(), out.data(), batch) == la);
  CHECK(std::memcmp(first.data(), fast.grads(), layout.total_floats * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("oneDNN's batched attention and Eigen's per-head attention give the same gradients") {
  // Head dimension 8: not a multiple of 16, so oneDNN's batched attention on every CPU.
  check_attention_against_eigen(tiny, 3, 11);
}

TEST_CASE("the AVX-512 GELU and Eigen's give the same gradients, a partial vector of columns too") {
  // d_model 42: the MLP's 168 columns are ten whole vectors and a tail of 8 lanes.
  const model_shape shape{256, 16, 42, 1, 6, true};
  CHECK(std::string(gpt<float>(make_layout(shape), dense_backend::fp32).gelu_kernel()) ==
        (detect_gemm_cpu().isa.starts_with("avx512") ? "avx512" : "eigen"));
  check_attention_against_eigen(shape, 3, 13);
}

TEST_CASE("the fused AVX-512 attention and Eigen's per-head attention give the same gradients") {
  // Head dimensions 16, 32, 48 and 64 (every register blocking of the kernels) and
  // T = 48 (an odd number of 16-wide score tiles). On a CPU without AVX-512 these
  // run oneDNN's batched attention, which the same check covers.
  for (const model_shape& shape : {model_shape{256, 48, 32, 1, 2, true}, model_shape{256, 48, 64, 2, 2, true},
                                   model_shape{256, 32, 96, 1, 2, true}, model_shape{256, 32, 128, 1, 2, false}}) {
    CAPTURE(shape.head_dim());
    const param_layout layout = make_layout(shape);
    if (fused_attention_fits(shape.context, shape.head_dim()) && detect_gemm_cpu().isa.starts_with("avx512"))
      CHECK(std::string(gpt<float>(layout, dense_backend::fp32).attention_kernel()) == "fused avx512");
    check_attention_against_eigen(shape, 3, 12);
  }
}
