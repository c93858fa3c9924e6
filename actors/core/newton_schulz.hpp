#pragma once
// Muon's orthogonalisation (K. Jordan et al., 2024): the Newton–Schulz iteration
// X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ, which maps a matrix G = U·S·Vᵀ towards
// U·Vᵀ (every singular value towards 1) with matrix products alone. The products
// go through a GEMM the caller passes in: the learner's engine hands it oneDNN's
// (the model's own dense layers), the parameter shard Eigen's.

#include <cstdint>
#include <functional>
#include <vector>

namespace archipelago {

/// C[m×n] = beta·C + op(A)·op(B), all row-major (dense_gemm::run's contract):
/// op(A) is [m×k], stored [m×k] with leading dimension lda, or [k×m] when trans_a;
/// likewise op(B) [k×n]. beta is 0 or 1.
using gemm_function =
    std::function<void(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc)>;

/// Eigen's GEMM (multi-threaded by OpenMP as the caller's thread count says).
gemm_function eigen_gemm();

/// The polynomial's coefficients (a, b, c): f(σ) = a·σ + b·σ³ + c·σ⁵ per step.
struct newton_schulz_coefficients {
  float a, b, c;
};
/// Muon's quintic (3.4445, −4.7750, 2.0315): fast but not convergent, it leaves
/// the singular values spread over about [0.7, 1.2] after 5 steps, which is all
/// the update needs (its direction, not exact orthogonality).
inline constexpr newton_schulz_coefficients muon_quintic{3.4445f, -4.7750f, 2.0315f};
/// The classic cubic (1.5, −0.5, 0): converges to U·Vᵀ (quadratically near it,
/// slowly from a small σ); for checking the iteration against an SVD.
inline constexpr newton_schulz_coefficients newton_schulz_cubic{1.5f, -0.5f, 0.f};

/// Scratch and GEMM for repeated orthogonalisations of matrices of any shape.
class newton_schulz {
 public:
  explicit newton_schulz(gemm_function gemm = eigen_gemm());

  /// out[rows×cols] (row-major) = `steps` iterations from g / ‖g‖_F (so every
  /// singular value starts at ≤ 1). A wide orientation is used internally (the
  /// transpose of a tall g), so A is min(rows, cols) square. A zero g (‖g‖_F
  /// below 1e-30) gives zeros. g and out may be the same buffer.
  void run(const float* g, int rows, int cols, int steps, float* out,
           newton_schulz_coefficients k = muon_quintic);

 private:
  gemm_function gemm_;
  std::vector<float> x_, a_, b_, y_;
};

/// Floating-point operations of one run (3 GEMMs per step) on a rows×cols matrix.
double newton_schulz_flops(int rows, int cols, int steps);

}  // namespace archipelago
