// The inner optimizers of optimizer.kind: Newton–Schulz against an SVD on random
// matrices, Muon's update rule on the matrices and AdamW's on the rest, the two
// GEMMs it runs on, and a training run whose loss falls.

#include <doctest/doctest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/inner_optimizer.hpp"
#include "core/newton_schulz.hpp"
#include "core/prng.hpp"
#include "learner/model/gpt.hpp"
#include "learner/model/trainer.hpp"

using namespace archipelago;

namespace {

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

row_matrix gaussian(int rows, int cols, std::uint64_t seed) {
  prng rng(seed);
  row_matrix m(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) m(r, c) = static_cast<float>(rng.normal());
  return m;
}

row_matrix orthogonalised(const row_matrix& g, int steps, newton_schulz_coefficients k,
                          gemm_function gemm = eigen_gemm()) {
  row_matrix out(g.rows(), g.cols());
  newton_schulz(std::move(gemm)).run(g.data(), static_cast<int>(g.rows()), static_cast<int>(g.cols()), steps,
                                     out.data(), k);
  return out;
}

struct shape_case {
  int rows, cols;
};
const shape_case shapes[] = {{16, 48}, {48, 16}, {24, 24}, {64, 256}, {7, 3}};

}  // namespace

TEST_CASE("newton_schulz: the cubic iteration converges to the SVD's U·Vᵀ on random matrices") {
  for (const shape_case s : shapes) {
    const std::uint64_t seed = 100 + static_cast<std::uint64_t>(s.rows * 1000 + s.cols);
    CAPTURE(seed);
    CAPTURE(s.rows);
    CAPTURE(s.cols);
    const row_matrix g = gaussian(s.rows, s.cols, seed);
    const Eigen::JacobiSVD<Eigen::MatrixXd> svd(g.cast<double>(), Eigen::ComputeThinU | Eigen::ComputeThinV);
    const Eigen::MatrixXd polar = svd.matrixU() * svd.matrixV().transpose();
    // From ‖g‖_F a singular value σ starts at σ/‖g‖_F and grows about 1.5x a step
    // until it nears 1: enough steps for the smallest of these matrices' (printed).
    const auto& sv = svd.singularValues();
    CAPTURE(sv(sv.size() - 1) / sv.norm());
    const row_matrix o = orthogonalised(g, 60, newton_schulz_cubic);
    CHECK((o.cast<double>() - polar).cwiseAbs().maxCoeff() < 2e-4);
  }
}

TEST_CASE("newton_schulz: Muon's quintic keeps the singular vectors and brings the singular values near 1") {
  for (const shape_case s : shapes) {
    const std::uint64_t seed = 200 + static_cast<std::uint64_t>(s.rows * 1000 + s.cols);
    CAPTURE(seed);
    CAPTURE(s.rows);
    CAPTURE(s.cols);
    const row_matrix g = gaussian(s.rows, s.cols, seed);
    const Eigen::JacobiSVD<Eigen::MatrixXd> svd(g.cast<double>(), Eigen::ComputeThinU | Eigen::ComputeThinV);
    const row_matrix o = orthogonalised(g, 5, muon_quintic);
    // O = U·f(S)·Vᵀ: in the SVD's bases it is diagonal, f(σ) on the diagonal.
    const Eigen::MatrixXd d = svd.matrixU().transpose() * o.cast<double>() * svd.matrixV();
    const Eigen::MatrixXd off = d - Eigen::MatrixXd(d.diagonal().asDiagonal());
    CHECK(off.cwiseAbs().maxCoeff() < 1e-3);
    const auto& sv = svd.singularValues();
    for (Eigen::Index i = 0; i < sv.size(); ++i) {
      CAPTURE(i);
      CAPTURE(sv(i) / sv(0));
      CHECK(d(i, i) > 0);
      CHECK(d(i, i) < 1.25);
      // Five steps lift every singular value above a tenth of the largest into Muon's band.
      if (sv(i) > 0.1 * sv(0)) CHECK(d(i, i) > 0.6);
    }
  }
}

TEST_CASE("newton_schulz: a tall matrix is the transpose of the wide one, zero stays zero, oneDNN agrees with Eigen") {
  const row_matrix g = gaussian(40, 12, 7);
  const row_matrix gt = g.transpose();
  const row_matrix tall = orthogonalised(g, 5, muon_quintic), wide = orthogonalised(gt, 5, muon_quintic);
  CHECK((tall - row_matrix(wide.transpose())).cwiseAbs().maxCoeff() < 1e-5);
  const row_matrix onednn = orthogonalised(g, 5, muon_quintic, onednn_gemm());
  CHECK((tall - onednn).cwiseAbs().maxCoeff() < 1e-4);
  const row_matrix zero = row_matrix::Zero(5, 9);
  CHECK(orthogonalised(zero, 5, muon_quintic).cwiseAbs().maxCoeff() == 0);
  // In place (g and out the same buffer).
  row_matrix in_place = g;
  newton_schulz().run(in_place.data(), 40, 12, 5, in_place.data());
  CHECK((in_place - tall).cwiseAbs().maxCoeff() == 0);
}

TEST_CASE("inner_optimizer muon: matrices take the orthogonalised momentum, every other tensor AdamW's update") {
  const param_layout layout = make_layout(model_shape{256, 8, 16, 1, 2, true});
  std::vector<float> params(layout.total_floats), grads(layout.total_floats);
  prng rng(9);
  for (const tensor_spec& t : layout.tensors)
    for (std::size_t i = 0; i < t.size(); ++i) {
      params[t.offset + i] = static_cast<float>(0.02 * rng.normal());
      grads[t.offset + i] = static_cast<float>(rng.normal());
    }
  optimizer_config opt;
  opt.clip_norm = 0;
  std::vector<float> with_adamw = params, with_muon = params;
  inner_optimizer adam(layout, opt);
  opt.kind = "muon";
  inner_optimizer muon(layout, opt);
  CHECK_FALSE(adam.muon());
  CHECK(muon.muon());
  const double lr = 1e-2;
  adam.step(with_adamw.data(), grads.data(), lr);
  muon.step(with_muon.data(), grads.data(), lr);
  for (const tensor_spec& t : layout.tensors) {
    CAPTURE(t.name);
    if (t.kind != tensor_kind::matrix) {
      CHECK(std::memcmp(with_adamw.data() + t.offset, with_muon.data() + t.offset, t.size() * sizeof(float)) == 0);
      continue;
    }
    // W ← W·(1 − lr·wd) − lr·0.2·sqrt(max(rows, cols))·NS(U), U = (1−μ)·G + μ·B, B = (1−μ)·G after one step.
    const float mu = static_cast<float>(opt.muon_momentum);
    std::vector<float> u(t.size());
    for (std::size_t i = 0; i < t.size(); ++i) {
      const float b = (1 - mu) * grads[t.offset + i];
      CHECK(muon.first_moment()[t.offset + i] == b);
      CHECK(muon.second_moment()[t.offset + i] == 0);
      u[i] = (1 - mu) * grads[t.offset + i] + mu * b;
    }
    newton_schulz().run(u.data(), t.rows, t.cols, opt.muon_ns_steps, u.data());
    const double scale = lr * 0.2 * std::sqrt(static_cast<double>(std::max(t.rows, t.cols)));
    const double decay = 1 - lr * opt.weight_decay;
    double worst = 0, rms = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
      const double want = params[t.offset + i] * decay - scale * u[i];
      worst = std::max(worst, std::abs(want - with_muon[t.offset + i]));
      const double step = with_muon[t.offset + i] - params[t.offset + i] * decay;
      rms += step * step;
    }
    CHECK(worst < 1e-6);
    // The update's RMS is about AdamW's (0.2·lr for an exactly orthogonal NS(U)).
    rms = std::sqrt(rms / static_cast<double>(t.size()));
    CHECK(rms > 0.1 * lr);
    CHECK(rms < 0.3 * lr);
  }
}

TEST_CASE("engine with optimizer.kind = muon: a short training run's loss falls, on oneDNN's GEMM") {
  set_compute_threads(2);
  config cfg;
  cfg.model.size = "nano";
  cfg.optimizer.kind = "muon";
  cfg.optimizer.warmup_steps = 5;
  cfg.train.steps = 60;
  cfg.data.batch = 8;
  cfg.data.synthetic_bytes = 1 << 20;
  cfg.data.eval_tokens = 8192;
  const model_shape shape = *model_preset("nano");
  auto data = load_dataset(cfg.data, 1, shape.context, cfg.train.seed);
  REQUIRE(data);
  engine e(cfg, shape, *data, 0);
  REQUIRE(e.optimizer().muon());
  const double before = e.evaluate().loss;
  double first = 0, last = 0;
  for (int s = 0; s < cfg.train.steps; ++s) {
    const double loss = e.step();
    REQUIRE(std::isfinite(loss));
    if (s < 5) first += loss / 5;
    if (s >= cfg.train.steps - 5) last += loss / 5;
  }
  const double after = e.evaluate().loss;
  CAPTURE(before);
  CAPTURE(after);
  CHECK(last < first - 1.0);      // from about ln 256 = 5.5 nats
  CHECK(after < before - 1.0);    // on held-out text too
}
