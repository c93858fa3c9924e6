#include "core/newton_schulz.hpp"

#include <Eigen/Core>
#include <cmath>

#include "core/adamw.hpp"
#include "core/invariant.hpp"

namespace archipelago {
namespace {

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using const_view = Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using view = Eigen::Map<row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

}  // namespace

gemm_function eigen_gemm() {
  return [](bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
            std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
    const const_view av(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
    const const_view bv(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
    view cv(c, m, n, Eigen::OuterStride<>(ldc));
    if (beta == 0) cv.setZero();
    if (trans_a && trans_b) cv.noalias() += av.transpose() * bv.transpose();
    else if (trans_a) cv.noalias() += av.transpose() * bv;
    else if (trans_b) cv.noalias() += av * bv.transpose();
    else cv.noalias() += av * bv;
  };
}

newton_schulz::newton_schulz(gemm_function gemm) : gemm_(std::move(gemm)) {}

void newton_schulz::run(const float* g, int rows, int cols, int steps, float* out, newton_schulz_coefficients k) {
  ARCHIPELAGO_INVARIANT(rows > 0 && cols > 0 && steps >= 0, "newton-schulz: a non-empty matrix, steps >= 0");
  const bool tall = rows > cols;
  const std::int64_t m = tall ? cols : rows, n = tall ? rows : cols;  // X is m×n, m ≤ n
  const std::size_t count = static_cast<std::size_t>(m) * n;
  x_.resize(count);
  y_.resize(count);
  a_.resize(static_cast<std::size_t>(m) * m);
  b_.resize(a_.size());
  const double norm = global_norm(g, count);
  if (!(norm > 1e-30)) {
    std::fill(out, out + count, 0.f);
    return;
  }
  const auto inv = static_cast<float>(1.0 / norm);
  if (tall) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) x_[c * n + r] = g[r * cols + c] * inv;
  } else {
    for (std::size_t i = 0; i < count; ++i) x_[i] = g[i] * inv;
  }
  for (int s = 0; s < steps; ++s) {
    gemm_(false, true, m, m, n, x_.data(), n, x_.data(), n, 0.f, a_.data(), m);  // A = X·Xᵀ
    if (k.c != 0) {
      gemm_(false, false, m, m, m, a_.data(), m, a_.data(), m, 0.f, b_.data(), m);  // A²
      for (std::size_t i = 0; i < b_.size(); ++i) b_[i] = k.b * a_[i] + k.c * b_[i];
    } else {
      for (std::size_t i = 0; i < b_.size(); ++i) b_[i] = k.b * a_[i];
    }
    for (std::size_t i = 0; i < count; ++i) y_[i] = k.a * x_[i];
    gemm_(false, false, m, n, m, b_.data(), m, x_.data(), n, 1.f, y_.data(), n);  // Y = a·X + B·X
    x_.swap(y_);
  }
  if (tall) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = x_[c * n + r];
  } else {
    std::copy(x_.begin(), x_.end(), out);
  }
}

double newton_schulz_flops(int rows, int cols, int steps) {
  const double m = std::min(rows, cols), n = std::max(rows, cols);
  return steps * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n);
}

}  // namespace archipelago
