#pragma once
// The inner optimizer of optimizer.kind: AdamW on every tensor, or Muon (K. Jordan
// et al., 2024; the scaling of Moonlight, arXiv 2502.16982) on the 2-D weight
// matrices and AdamW on the rest (embeddings, the unembedding, biases, norms).
// A learner's engine steps it on its gradients; under dp the parameter shards step
// it on the merged gradient.
//
// Muon, per matrix W [rows×cols] with gradient G (clipped with the rest):
//   B ← μ·B + (1−μ)·G;  U = (1−μ)·G + μ·B                    (Nesterov)
//   O = newton_schulz(U)                                      (≈ U's polar factor)
//   W ← W·(1 − lr·wd) − lr·0.2·sqrt(max(rows, cols))·O
// The factor makes O's RMS 0.2, about AdamW's, so optimizer.lr, its schedule and
// weight_decay mean the same for both kinds.
//
// State: Muon's B lives in AdamW's first-moment buffer at the matrices' offsets
// (their second moment stays 0), so a snapshot of first_moment()/second_moment()
// holds either kind's state in the same two buffers.

#include <cstdint>
#include <vector>

#include "core/adamw.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/newton_schulz.hpp"

namespace archipelago {

class inner_optimizer {
 public:
  /// `gemm`: Newton–Schulz's matrix products (Muon only).
  inner_optimizer(const param_layout& layout, const optimizer_config& opt, gemm_function gemm = eigen_gemm());

  /// One update of `params` from `grads` at learning rate `lr`. Clips the gradient
  /// to opt.clip_norm first (its norm over every tensor); returns that norm before clipping.
  double step(float* params, const float* grads, double lr);

  bool muon() const { return !matrices_.empty(); }
  std::int64_t steps_taken() const { return adamw_.steps_taken(); }
  void set_steps_taken(std::int64_t t) { adamw_.set_steps_taken(t); }
  float* first_moment() { return adamw_.first_moment(); }
  float* second_moment() { return adamw_.second_moment(); }

 private:
  struct matrix {
    std::size_t offset;
    int rows, cols;
  };
  optimizer_config opt_;
  adamw adamw_;
  std::vector<matrix> matrices_;  // Muon's; empty for AdamW
  newton_schulz orthogonalise_;
  std::vector<float> update_;
};

}  // namespace archipelago
