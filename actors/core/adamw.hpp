#pragma once
// Inner optimizer: AdamW (decoupled weight decay, bias correction) with global
// gradient-norm clipping, and the learning-rate schedule (linear warm-up, then
// cosine decay). Moments live in buffers laid out like the parameters, so they
// survive fragment overwrites in a learner unchanged.

#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/aligned_buffer.hpp"

namespace archipelago {

/// Linear warm-up: lr·(step + 1)/warmup while step + 1 < warmup, else lr (step 0-based).
double warmed_up_lr(double lr, std::int64_t step, std::int64_t warmup);

/// Learning rate at `step` (0-based) of `total_steps`.
double scheduled_lr(const optimizer_config& opt, std::int64_t step, std::int64_t total_steps);

/// Euclidean norm of a buffer, summed in a fixed order (deterministic).
double global_norm(const float* data, std::size_t count);

class adamw {
 public:
  /// `matrices` false: the matrix tensors (and their moments) are left alone, for
  /// Muon (inner_optimizer) to update; the gradient norm still covers every tensor.
  adamw(const param_layout& layout, const optimizer_config& opt, bool matrices = true);

  /// One update of `params` from `grads` at learning rate `lr`. Clips the
  /// gradient to opt.clip_norm first; returns the gradient norm before clipping.
  double step(float* params, const float* grads, double lr);

  std::int64_t steps_taken() const { return t_; }
  void set_steps_taken(std::int64_t t) { t_ = t; }  // resuming from a snapshot
  float* first_moment() { return m_.data(); }
  float* second_moment() { return v_.data(); }

 private:
  struct segment {
    std::size_t begin, end;
    bool decay;
  };
  optimizer_config opt_;
  std::vector<segment> segments_;
  aligned_buffer<float> m_, v_;
  std::int64_t t_ = 0;
};

}  // namespace archipelago
