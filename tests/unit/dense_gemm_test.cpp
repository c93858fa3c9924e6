// The dense layers' GEMMs through oneDNN: fp32 against a double reference for
// every transposition, bf16 against fp32 within the rounding of its inputs,
// train.precision's resolution, and training in bf16.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/config.hpp"
#include "core/prng.hpp"
#include "learner/model/dense_gemm.hpp"
#include "learner/model/gpt.hpp"
#include "learner/model/trainer.hpp"

using namespace archipelago;

namespace {

std::vector<float> random_matrix(std::int64_t n, std::uint64_t seed) {
  prng rng(seed);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (auto& x : out) x = static_cast<float>(rng.normal());
  return out;
}

/// One GEMM case: op(A) [m×k], op(B) [k×n], C [m×n], each stored with padding (ld > cols).
struct gemm_case {
  bool ta, tb;
  std::int64_t m, n, k;
  std::int64_t lda() const { return (ta ? m : k) + 3; }
  std::int64_t ldb() const { return (tb ? k : n) + 5; }
  std::int64_t ldc() const { return n + 2; }
  std::int64_t a_size() const { return (ta ? k : m) * lda(); }
  std::int64_t b_size() const { return (tb ? n : k) * ldb(); }
  float a_at(const std::vector<float>& a, std::int64_t i, std::int64_t p) const {
    return ta ? a[p * lda() + i] : a[i * lda() + p];
  }
  float b_at(const std::vector<float>& b, std::int64_t p, std::int64_t j) const {
    return tb ? b[j * ldb() + p] : b[p * ldb() + j];
  }
};

/// c0 (the initial C) + op(A)·op(B) in double, and Σ|a||b| per element (the error scale).
void reference(const gemm_case& g, const std::vector<float>& a, const std::vector<float>& b, bool accumulate,
               const std::vector<float>& c0, std::vector<double>& out, std::vector<double>& scale) {
  out.assign(static_cast<std::size_t>(g.m * g.n), 0);
  scale.assign(out.size(), 0);
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      double s = accumulate ? c0[i * g.ldc() + j] : 0, abs = 0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        s += static_cast<double>(g.a_at(a, i, p)) * g.b_at(b, p, j);
        abs += std::abs(static_cast<double>(g.a_at(a, i, p)) * g.b_at(b, p, j));
      }
      out[i * g.n + j] = s;
      scale[i * g.n + j] = abs;
    }
}

std::vector<gemm_case> cases() {
  std::vector<gemm_case> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) out.push_back({ta, tb, 37, 29, 70});
  out.push_back({true, false, 24, 48, 512});  // a weight gradient: long K
  // An input gradient (B transposed) on either side of n = k, where B goes in transposed
  // or as stored; n over several of the transposing copy's 32-wide tiles, the last partial.
  out.push_back({false, true, 45, 70, 100});
  out.push_back({false, true, 40, 96, 24});
  return out;
}

std::vector<double> bf16_losses(dense_backend backend, int threads, std::uint64_t seed, int steps) {
  set_compute_threads(threads);
  const model_shape tiny{256, 16, 32, 2, 4, true};
  const param_layout layout = make_layout(tiny);
  gpt<float> model(layout, backend);
  model.init(seed);
  optimizer_config opt;
  opt.lr = 1e-2;
  opt.warmup_steps = 5;
  adamw optim(layout, opt);
  prng rng(seed);
  std::vector<std::int32_t> in(tiny.context);
  for (auto& t : in) t = static_cast<std::int32_t>(rng.below(256));
  std::vector<std::int32_t> out(in.begin() + 1, in.end());
  out.push_back(in.front());
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    losses.push_back(model.forward_backward(in.data(), out.data(), 1));
    optim.step(model.params(), model.grads(), scheduled_lr(opt, s, steps));
  }
  set_compute_threads(2);
  return losses;
}

}  // namespace

TEST_CASE("oneDNN fp32 GEMM matches a double reference for every transposition and beta") {
  auto k = dense_gemm::make(gemm_precision::fp32);
  REQUIRE(k);
  for (const gemm_case& g : cases()) {
    for (bool accumulate : {false, true}) {
      CAPTURE(g.ta);
      CAPTURE(g.tb);
      CAPTURE(g.k);
      CAPTURE(accumulate);
      const auto a = random_matrix(g.a_size(), 1), b = random_matrix(g.b_size(), 2);
      auto c = random_matrix(g.m * g.ldc(), 3);
      const auto c0 = c;
      std::vector<double> ref, scale;
      reference(g, a, b, accumulate, c0, ref, scale);
      (*k)->run(g.ta, g.tb, g.m, g.n, g.k, a.data(), g.lda(), b.data(), g.ldb(), accumulate ? 1.0f : 0.0f,
                c.data(), g.ldc());
      double worst = 0;
      for (std::int64_t i = 0; i < g.m; ++i)
        for (std::int64_t j = 0; j < g.n; ++j)
          worst = std::max(worst, std::abs(c[i * g.ldc() + j] - ref[i * g.n + j]) / (scale[i * g.n + j] + 1));
      CHECK(worst < 1e-5);
      // The padding between rows of C is not written.
      CHECK(c[g.n] == c0[g.n]);
    }
  }
}

TEST_CASE("bf16 GEMM: fp32 accumulation of bf16-rounded inputs, within 2^-7 of fp32 relative to sum |a||b|") {
  auto k = dense_gemm::make(gemm_precision::bf16);
  if (!detect_gemm_cpu().bf16) {
    // No native bf16 here: refused as unsupported, never emulated slowly.
    REQUIRE_FALSE(k);
    CHECK(k.err().code == errc::unsupported);
    return;
  }
  REQUIRE(k);
  for (const gemm_case& g : cases()) {
    for (bool accumulate : {false, true}) {
      CAPTURE(g.ta);
      CAPTURE(g.tb);
      CAPTURE(g.k);
      CAPTURE(accumulate);
      const auto a = random_matrix(g.a_size(), 4), b = random_matrix(g.b_size(), 5);
      auto c = random_matrix(g.m * g.ldc(), 6);
      const auto c0 = c;
      // The same product on inputs rounded to bf16, computed in double.
      std::vector<std::uint16_t> a16(a.size()), b16(b.size());
      round_to_bf16(a.data(), a16.data(), static_cast<std::int64_t>(a.size()));
      round_to_bf16(b.data(), b16.data(), static_cast<std::int64_t>(b.size()));
      std::vector<float> ar(a.size()), br(b.size());
      for (std::size_t i = 0; i < a.size(); ++i) ar[i] = bf16_to_float(a16[i]);
      for (std::size_t i = 0; i < b.size(); ++i) br[i] = bf16_to_float(b16[i]);
      std::vector<double> exact, rounded, scale, unused;
      reference(g, a, b, accumulate, c0, exact, scale);
      reference(g, ar, br, accumulate, c0, rounded, unused);
      (*k)->run(g.ta, g.tb, g.m, g.n, g.k, a.data(), g.lda(), b.data(), g.ldb(), accumulate ? 1.0f : 0.0f,
                c.data(), g.ldc());
      double vs_rounded = 0, vs_exact = 0;
      for (std::int64_t i = 0; i < g.m; ++i)
        for (std::int64_t j = 0; j < g.n; ++j) {
          const double s = scale[i * g.n + j] + 1, got = c[i * g.ldc() + j];
          vs_rounded = std::max(vs_rounded, std::abs(got - rounded[i * g.n + j]) / s);
          vs_exact = std::max(vs_exact, std::abs(got - exact[i * g.n + j]) / s);
        }
      CHECK(vs_rounded < 1e-5);          // fp32 accumulation, nothing rounded to bf16 but the inputs
      CHECK(vs_exact < std::ldexp(1.0, -7));  // each input within 2^-9: a product within about 2^-8
      CHECK(vs_exact > 0);                // and it really ran in bf16
    }
  }
  CHECK((*k)->fp32_fallbacks() == 0);
}

TEST_CASE("round_to_bf16 rounds to nearest, ties to even, and keeps NaN and infinities") {
  const float in[] = {1.0f, 1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -2.5f, INFINITY, NAN};
  std::uint16_t out[6];
  round_to_bf16(in, out, 6);
  CHECK(bf16_to_float(out[0]) == 1.0f);
  CHECK(bf16_to_float(out[1]) == 1.0f);                               // tie: to even (down)
  CHECK(bf16_to_float(out[2]) == 1.0f + std::ldexp(1.0f, -6));        // tie: to even (up)
  CHECK(bf16_to_float(out[3]) == -2.5f);
  CHECK(std::isinf(bf16_to_float(out[4])));
  CHECK(std::isnan(bf16_to_float(out[5])));
}

TEST_CASE("train.precision: parsed like the other knobs, resolved against the CPU") {
  config cfg;
  CHECK(cfg.train.precision == "fp32");
  for (const char* p : {"fp32", "bf16", "auto"}) {
    CAPTURE(p);
    REQUIRE(set_knob(cfg, "train.precision", p));
    CHECK(cfg.train.precision == p);
  }
  auto bad = set_knob(cfg, "train.precision", "fp16");
  REQUIRE_FALSE(bad);
  CHECK(bad.err().code == errc::invalid_input);
  CHECK(bad.err().message.find("train.precision") != std::string::npos);
  CHECK(bad.err().message.find("fp16") != std::string::npos);
  REQUIRE(apply_toml(cfg, "[train]\nprecision = \"bf16\"\n", "t"));
  CHECK(cfg.train.precision == "bf16");

  const gemm_cpu with{"avx512_core_bf16", true, true}, without{"avx2", false};
  // Native bf16 at half the fp32 rate (as on some CPUs with AVX512_BF16): auto keeps fp32, saying why.
  const gemm_cpu slow_bf16{"avx512_core_bf16", true, false};
  std::string note;
  CHECK(*resolve_precision("fp32", with, note) == gemm_precision::fp32);
  CHECK(*resolve_precision("auto", slow_bf16, note) == gemm_precision::fp32);
  CHECK(note.find("slower") != std::string::npos);
  CHECK(*resolve_precision("auto", with, note) == gemm_precision::bf16);
  CHECK(note.empty());
  // AMX: oneDNN's bf16 matmuls run on its tiles, whatever the AVX-512 dot products' peak.
  const gemm_cpu amx{"avx512_core_amx", true, false, true};
  CHECK(*resolve_precision("auto", amx, note) == gemm_precision::bf16);
  CHECK(note.empty());
  CHECK(*resolve_precision("auto", without, note) == gemm_precision::fp32);
  CHECK(note.empty());
  CHECK(*resolve_precision("bf16", with, note) == gemm_precision::bf16);
  CHECK(note.empty());
  CHECK(*resolve_precision("bf16", without, note) == gemm_precision::fp32);
  CHECK(note.find("running fp32") != std::string::npos);
  CHECK(note.find('\n') == std::string::npos);  // one line
  auto unknown = resolve_precision("half", with, note);
  REQUIRE_FALSE(unknown);
  CHECK(unknown.err().message.find("half") != std::string::npos);
}

TEST_CASE("a short training run in bf16 reduces the loss, deterministically, close to fp32") {
  const bool native = detect_gemm_cpu().bf16;
  {
    const model_shape tiny{256, 16, 32, 2, 4, true};
    gpt<float> probe(make_layout(tiny), dense_backend::bf16);
    CHECK(probe.backend() == (native ? dense_backend::bf16 : dense_backend::fp32));
  }
  const auto bf16 = bf16_losses(dense_backend::bf16, 2, 21, 60);
  const auto again = bf16_losses(dense_backend::bf16, 2, 21, 60);
  const auto fp32 = bf16_losses(dense_backend::fp32, 2, 21, 60);
  CHECK(bf16.front() > 5.0);
  CHECK(bf16.back() < 0.5 * bf16.front());
  CHECK(std::memcmp(bf16.data(), again.data(), bf16.size() * sizeof(double)) == 0);
  // Same start; bf16 inputs move the losses only slightly on the way down.
  CHECK(bf16.front() == doctest::Approx(fp32.front()).epsilon(0.01));
  CHECK(bf16.back() == doctest::Approx(fp32.back()).epsilon(0.15));
  if (native) CHECK(bf16 != fp32);
}
