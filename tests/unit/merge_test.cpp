#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/prng.hpp"
#include "parameter_shard/merge.hpp"

using namespace archipelago;

namespace {

// Contributions built from outer gradients v (the merge takes deltas d = −v).
struct learner_input {
  std::vector<float> v;
  double tokens = 1;
  double steps = 1;
};

struct merged {
  status result;
  std::vector<float> delta;
};

merged run_merge(const std::vector<fragment_tensor>& tensors, std::vector<learner_input> inputs,
                 std::size_t fragment_size, float fill = 0.0f) {
  std::vector<std::vector<float>> deltas;
  for (const auto& in : inputs) {
    std::vector<float> d(in.v.size());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = -in.v[i];
    deltas.push_back(std::move(d));
  }
  std::vector<contribution_view> views;
  for (std::size_t m = 0; m < inputs.size(); ++m) {
    views.push_back({deltas[m].data(), inputs[m].tokens, inputs[m].steps});
  }
  merged out{status::ok(), std::vector<float>(fragment_size, fill)};
  out.result = merge_outer_gradient(tensors, views, fragment_size, out.delta.data());
  return out;
}

double norm(const float* x, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

std::vector<float> unit(std::size_t n, std::size_t k, float scale = 1.0f) {
  std::vector<float> e(n, 0.0f);
  e[k] = scale;
  return e;
}

// Straightforward double-precision reference of docs/design/algorithm.md §6 for one tensor.
std::vector<double> reference_merge(const std::vector<std::vector<double>>& v,
                                    const std::vector<double>& w, bool embedding) {
  const std::size_t n = v[0].size();
  double total = 0;
  for (double x : w) total += x;
  std::vector<double> mean(n, 0.0);
  for (std::size_t m = 0; m < v.size(); ++m)
    for (std::size_t i = 0; i < n; ++i) mean[i] += w[m] * v[m][i] / total;
  if (embedding) return mean;
  double radius = 0;
  std::vector<double> dir(n, 0.0);
  for (std::size_t m = 0; m < v.size(); ++m) {
    double nm = 0;
    for (double x : v[m]) nm += x * x;
    nm = std::sqrt(nm);
    radius += w[m] * nm / total;
    if (nm == 0) continue;
    for (std::size_t i = 0; i < n; ++i) dir[i] += w[m] * (v[m][i] / nm) / total;
  }
  double dn = 0;
  for (double x : dir) dn += x * x;
  dn = std::sqrt(dn);
  if (dn < 1e-6) return mean;  // random inputs never come close to cancelling
  for (auto& x : dir) x *= radius / dn;
  return dir;
}

}  // namespace

TEST_CASE("merge_weight is tokens squared over steps") {
  CHECK(merge_weight(100, 1) == 10000.0);
  CHECK(merge_weight(100, 4) == 2500.0);
  CHECK(merge_weight(0, 3) == 0.0);
  // Same steps, half the tokens per step: a quarter of the weight, i.e. half
  // the weight per token.
  CHECK(merge_weight(50, 10) == doctest::Approx(merge_weight(100, 10) / 4));
}

TEST_CASE("embedding tensors take the exact weighted mean") {
  const std::vector<fragment_tensor> tensors{{0, 3, true, "tok_emb"}};
  // w = 1 and w = 3 (tokens 3, steps 3).
  auto out = run_merge(tensors, {{{1, 2, 3}, 1, 1}, {{3, 0, -1}, 3, 3}}, 3);
  REQUIRE(out.result);
  CHECK(out.delta[0] == 2.5f);
  CHECK(out.delta[1] == 0.5f);
  CHECK(out.delta[2] == 0.0f);

  // A single learner's update comes through unchanged.
  out = run_merge(tensors, {{{0.25f, -1.5f, 8}, 7, 2}}, 3);
  REQUIRE(out.result);
  CHECK(out.delta == std::vector<float>{0.25f, -1.5f, 8});
}

TEST_CASE("RDA keeps the norm of one learner's update whatever M is") {
  const std::vector<float> v{0.3f, -1.25f, 2.0f, 0.0f, -0.7f};
  const std::vector<fragment_tensor> tensors{{0, v.size(), false, "h0.mlp.w1"}};
  for (int M = 1; M <= 8; ++M) {
    CAPTURE(M);
    std::vector<learner_input> inputs(M, {v, 64, 2});
    const auto out = run_merge(tensors, inputs, v.size());
    REQUIRE(out.result);
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(out.delta[i] == doctest::Approx(v[i]).epsilon(1e-6));
  }

  for (int M = 1; M <= 8; ++M) {
    CAPTURE(M);
    std::vector<learner_input> inputs;
    for (int m = 0; m < M; ++m) inputs.push_back({unit(8, m), 10, 1});
    const auto rda = run_merge({{0, 8, false}}, inputs, 8);
    const auto mean = run_merge({{0, 8, true}}, inputs, 8);
    REQUIRE(rda.result);
    REQUIRE(mean.result);
    CHECK(norm(rda.delta.data(), 8) == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(norm(mean.delta.data(), 8) == doctest::Approx(1.0 / std::sqrt(M)).epsilon(1e-6));
    // Same direction: RDA only rescales the mean here.
    for (int k = 0; k < 8; ++k) {
      CHECK(rda.delta[k] == doctest::Approx(k < M ? 1.0 / std::sqrt(M) : 0.0).epsilon(1e-6));
    }
  }
}

TEST_CASE("RDA weights follow tokens squared over steps") {
  // A: 10 tokens/step over 10 steps (w = 1000); B: 5 tokens/step (w = 250).
  const std::vector<fragment_tensor> tensors{{0, 2, false}};
  const auto out = run_merge(tensors, {{{1, 0}, 100, 10}, {{0, 2}, 50, 10}}, 2);
  REQUIRE(out.result);
  const double radius = (1000.0 * 1 + 250.0 * 2) / 1250.0;  // 1.2
  const double dx = 0.8, dy = 0.2, dn = std::sqrt(dx * dx + dy * dy);
  CHECK(out.delta[0] == doctest::Approx(radius * dx / dn).epsilon(1e-6));
  CHECK(out.delta[1] == doctest::Approx(radius * dy / dn).epsilon(1e-6));
  CHECK(out.delta[0] > out.delta[1]);  // the heavier learner dominates the direction

  // Equal work in tokens and steps: equal weights whatever the order.
  const auto even = run_merge(tensors, {{{1, 0}, 80, 8}, {{0, 1}, 80, 8}}, 2);
  REQUIRE(even.result);
  CHECK(even.delta[0] == even.delta[1]);
}

TEST_CASE("RDA falls back to the weighted mean when directions cancel") {
  const std::vector<fragment_tensor> tensors{{0, 3, false}};
  // v and −v: both the direction and the mean vanish.
  auto out = run_merge(tensors, {{{1, -2, 3}, 5, 1}, {{-1, 2, -3}, 5, 1}}, 3, 9.0f);
  REQUIRE(out.result);
  CHECK(out.delta == std::vector<float>{0, 0, 0});

  // v and −2v with equal weights: the direction vanishes, the mean is −v/2.
  out = run_merge(tensors, {{{1, 0, 0}, 5, 1}, {{-2, 0, 0}, 5, 1}}, 3);
  REQUIRE(out.result);
  CHECK(out.delta == std::vector<float>{-0.5f, 0, 0});

  // All contributions zero: zero update, no NaN from 0/0.
  out = run_merge(tensors, {{{0, 0, 0}, 5, 1}, {{0, 0, 0}, 7, 2}}, 3, 9.0f);
  REQUIRE(out.result);
  CHECK(out.delta == std::vector<float>{0, 0, 0});
}

TEST_CASE("a zero contribution adds no direction but keeps its weight") {
  const std::vector<fragment_tensor> tensors{{0, 2, false}};
  // Equal weights: radius ‖v‖/2, direction u(v): Δ = v/2.
  auto out = run_merge(tensors, {{{3, 4}, 2, 1}, {{0, 0}, 2, 1}}, 2);
  REQUIRE(out.result);
  CHECK(out.delta[0] == doctest::Approx(1.5).epsilon(1e-6));
  CHECK(out.delta[1] == doctest::Approx(2.0).epsilon(1e-6));

  // A zero-weight contribution (no tokens) changes nothing at all.
  const auto alone = run_merge(tensors, {{{3, 4}, 2, 1}}, 2);
  out = run_merge(tensors, {{{3, 4}, 2, 1}, {{-100, 7}, 0, 1}}, 2);
  REQUIRE(out.result);
  CHECK(out.delta == alone.delta);
}

TEST_CASE("embedding and RDA tensors coexist in one fragment, padding gets zero") {
  // [emb 0..3] [pad 4..7] [matrix 8..11] [pad 12]
  const std::vector<fragment_tensor> tensors{{8, 4, false, "h0.attn.wo"}, {0, 4, true, "wpe"}};
  std::vector<learner_input> inputs;
  for (int m = 0; m < 4; ++m) {
    std::vector<float> v(13, 0.0f);
    v[m] = 1;      // embedding part
    v[8 + m] = 1;  // matrix part
    v[5] = 1000;   // padding content is ignored
    inputs.push_back({v, 32, 4});
  }
  const auto out = run_merge(tensors, inputs, 13, 9.0f);
  REQUIRE(out.result);
  for (int k = 0; k < 4; ++k) {
    CHECK(out.delta[k] == 0.25f);                                             // plain mean
    CHECK(out.delta[8 + k] == doctest::Approx(0.5).epsilon(1e-6));  // RDA: norm 1
  }
  for (int k : {4, 5, 6, 7, 12}) CHECK(out.delta[k] == 0.0f);
}

TEST_CASE("Nesterov outer step matches a hand computation over 3 steps") {
  const outer_optimizer opt(nesterov_config{});  // lr 0.7, momentum 0.9
  CHECK(opt.config().lr == 0.7);
  CHECK(opt.config().momentum == 0.9);
  std::vector<float> theta{1.0f, -2.0f}, b{0.0f, 0.0f};
  const std::vector<std::vector<float>> deltas{{1.0f, 0.5f}, {-0.5f, 0.5f}, {0.0f, 0.0f}};
  // By hand: b ← 0.9 b + Δ; Θ ← Θ − 0.7 (Δ + 0.9 b).
  const double want_b[3][2] = {{1, 0.5}, {0.4, 0.95}, {0.36, 0.855}};
  const double want_theta[3][2] = {{-0.33, -2.665}, {-0.232, -3.6135}, {-0.4588, -4.15215}};
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    opt.step(theta.data(), b.data(), deltas[s].data(), 2, static_cast<std::uint64_t>(s));
    for (int i = 0; i < 2; ++i) {
      CHECK(b[i] == doctest::Approx(want_b[s][i]).epsilon(1e-6));
      CHECK(theta[i] == doctest::Approx(want_theta[s][i]).epsilon(1e-6));
    }
  }

  // Momentum 0, lr 1: plain Θ − Δ.
  const outer_optimizer sgd(nesterov_config{1.0, 0.0});
  std::vector<float> t2{1.0f}, b2{0.0f};
  const float d2 = 0.25f;
  sgd.step(t2.data(), b2.data(), &d2, 1, 0);
  CHECK(t2[0] == 0.75f);
  CHECK(b2[0] == 0.25f);
}

TEST_CASE("the outer warm-up ramps eta linearly over the fragment's first outer steps") {
  const outer_optimizer opt(nesterov_config{0.6, 0.0, 4});
  CHECK(opt.lr_at(0) == doctest::Approx(0.15));
  CHECK(opt.lr_at(1) == doctest::Approx(0.3));
  CHECK(opt.lr_at(2) == doctest::Approx(0.45));
  CHECK(opt.lr_at(3) == 0.6);
  CHECK(opt.lr_at(1000) == 0.6);  // a fragment resumed past the warm-up takes the full step
  std::vector<float> theta{1.0f}, b{0.0f};
  const float delta = 1.0f;
  opt.step(theta.data(), b.data(), &delta, 1, 1);  // version 1: η = 0.3, μ = 0 → Θ − 0.3 Δ
  CHECK(theta[0] == doctest::Approx(0.7));
  CHECK(outer_optimizer(nesterov_config{0.6, 0.6}).lr_at(0) == 0.6);  // no warm-up: the full step at once
}

TEST_CASE("nesterov_config validation") {
  CHECK(validate(nesterov_config{}));
  CHECK(validate(nesterov_config{0.0, 0.0}));
  for (const auto& bad : {nesterov_config{-0.1, 0.9}, nesterov_config{NAN, 0.9},
                          nesterov_config{0.7, 1.0}, nesterov_config{0.7, -0.5},
                          nesterov_config{INFINITY, 0.9}, nesterov_config{0.7, 0.9, -1}}) {
    const auto st = validate(bad);
    REQUIRE_FALSE(st);
    CHECK(st.err().code == errc::invalid_input);
  }
}

TEST_CASE("merge rejects invalid input and leaves the output untouched") {
  const std::vector<fragment_tensor> tensors{{0, 2, true, "tok_emb"}, {2, 3, false, "h0.attn"}};
  const std::vector<float> good{1, 2, 3, 4, 5};
  auto expect_error = [&](const std::vector<fragment_tensor>& ts, std::vector<learner_input> in,
                          const std::vector<std::string>& needles) {
    const auto out = run_merge(ts, std::move(in), 5, 9.0f);
    REQUIRE_FALSE(out.result);
    CHECK(out.result.err().code == errc::invalid_input);
    for (const auto& needle : needles) {
      CAPTURE(out.result.err().message);
      CHECK(out.result.err().message.find(needle) != std::string::npos);
    }
    CHECK(out.delta == std::vector<float>(5, 9.0f));
  };

  expect_error(tensors, {}, {"no contributions"});

  auto nan = good;
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  expect_error(tensors, {{good, 1, 1}, {nan, 1, 1}}, {"contribution 1", "h0.attn", "element 1"});
  auto inf = good;
  inf[0] = -std::numeric_limits<float>::infinity();
  expect_error(tensors, {{inf, 1, 1}}, {"contribution 0", "tok_emb", "element 0"});

  expect_error(tensors, {{good, 1, 1}, {good, 1, 0}}, {"contribution 1", "steps"});
  expect_error(tensors, {{good, 1, 0.5}}, {"steps"});
  expect_error(tensors, {{good, 1, NAN}}, {"steps"});
  expect_error(tensors, {{good, 1, INFINITY}}, {"steps"});
  expect_error(tensors, {{good, INFINITY, 1}}, {"tokens"});
  expect_error(tensors, {{good, NAN, 1}}, {"tokens"});
  expect_error(tensors, {{good, -1, 1}}, {"tokens"});
  expect_error(tensors, {{good, 0, 1}, {good, 0, 5}}, {"total weight"});

  expect_error({{0, 2, true, "a"}, {3, 3, false, "b"}}, {{good, 1, 1}}, {"'b'", "exceeds"});
  expect_error({{0, 3, true, "a"}, {2, 3, false, "b"}}, {{good, 1, 1}}, {"overlaps"});

  // A missing delta pointer.
  std::vector<float> out(5, 9.0f);
  const contribution_view missing{nullptr, 1, 1};
  const auto st = merge_outer_gradient(tensors, {&missing, 1}, 5, out.data());
  REQUIRE_FALSE(st);
  CHECK(st.err().code == errc::invalid_input);
  CHECK(out == std::vector<float>(5, 9.0f));
}

TEST_CASE("merge is bit-identical over repeated runs") {
  const std::uint64_t seed = 7;
  CAPTURE(seed);
  prng rng(seed);
  const std::vector<fragment_tensor> tensors{{0, 300, true}, {304, 500, false}, {804, 7, false}};
  std::vector<learner_input> inputs;
  for (int m = 0; m < 5; ++m) {
    std::vector<float> v(811);
    for (auto& x : v) x = static_cast<float>(rng.normal() * 1e-3);
    inputs.push_back({v, static_cast<double>(1 + rng.below(5000)), static_cast<double>(1 + rng.below(30))});
  }
  const auto first = run_merge(tensors, inputs, 811);
  REQUIRE(first.result);
  for (int rep = 0; rep < 3; ++rep) {
    const auto again = run_merge(tensors, inputs, 811);
    REQUIRE(again.result);
    CHECK(std::memcmp(first.delta.data(), again.delta.data(), 811 * sizeof(float)) == 0);
  }
}

TEST_CASE("merge matches a double-precision reference on random fragments") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    CAPTURE(seed);
    prng rng(seed);
    // A random fragment: tensors with random sizes, kinds and padding gaps.
    std::vector<fragment_tensor> tensors;
    std::size_t size = 0;
    const auto n_tensors = 1 + rng.below(5);
    for (std::uint64_t t = 0; t < n_tensors; ++t) {
      size += rng.below(4);  // padding
      const std::size_t len = rng.below(60);
      tensors.push_back({size, len, rng.below(3) == 0});
      size += len;
    }
    const auto M = 1 + rng.below(6);
    std::vector<learner_input> inputs;
    for (std::uint64_t m = 0; m < M; ++m) {
      std::vector<float> v(size);
      const double scale = std::pow(10.0, -4.0 + 4.0 * rng.uniform());
      for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
      if (rng.below(5) == 0 && !tensors.empty()) {  // a learner with no progress on one tensor
        const auto& t = tensors[rng.below(tensors.size())];
        for (std::size_t i = 0; i < t.size; ++i) v[t.offset + i] = 0.0f;
      }
      inputs.push_back({v, static_cast<double>(1 + rng.below(100000)), static_cast<double>(1 + rng.below(48))});
    }
    const auto out = run_merge(tensors, inputs, size, 9.0f);
    REQUIRE(out.result);

    std::vector<double> w;
    for (const auto& in : inputs) w.push_back(in.tokens * in.tokens / in.steps);
    std::vector<bool> covered(size, false);
    for (const auto& t : tensors) {
      if (t.size == 0) continue;
      std::vector<std::vector<double>> v;
      for (const auto& in : inputs) v.emplace_back(in.v.begin() + t.offset, in.v.begin() + t.offset + t.size);
      const auto ref = reference_merge(v, w, t.embedding);
      double largest = 0;
      for (double x : ref) largest = std::max(largest, std::abs(x));
      for (std::size_t i = 0; i < t.size; ++i) {
        CHECK(std::abs(out.delta[t.offset + i] - ref[i]) <= 1e-6 * (std::abs(ref[i]) + largest));
        covered[t.offset + i] = true;
      }
    }
    for (std::size_t i = 0; i < size; ++i)
      if (!covered[i]) CHECK(out.delta[i] == 0.0f);
  }
}

TEST_CASE("the outer step into the merge's own buffer equals the step in place, bit for bit") {
  // The shard writes Δ into the buffer that becomes the next Θ (step_into with
  // theta_out == delta); the in-place step is the reference.
  const std::uint64_t seed = 77;
  CAPTURE(seed);
  prng rng(seed);
  const std::size_t n = 4099;
  std::vector<float> theta(n), momentum(n), delta(n);
  for (std::size_t i = 0; i < n; ++i) {
    theta[i] = static_cast<float>(rng.normal());
    momentum[i] = static_cast<float>(0.1 * rng.normal());
    delta[i] = static_cast<float>(1e-3 * rng.normal());
  }
  const outer_optimizer opt(nesterov_config{0.6, 0.6, 3});
  for (std::uint64_t version : {0, 1, 5}) {
    CAPTURE(version);
    std::vector<float> in_place = theta, m_in_place = momentum;
    opt.step(in_place.data(), m_in_place.data(), delta.data(), n, version);
    std::vector<float> out = delta, m_out = momentum;
    opt.step_into(out.data(), theta.data(), m_out.data(), out.data(), n, version);
    CHECK(std::memcmp(out.data(), in_place.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(m_out.data(), m_in_place.data(), n * sizeof(float)) == 0);
  }
}
