#include "core/inner_optimizer.hpp"

#include <algorithm>
#include <cmath>

namespace archipelago {

inner_optimizer::inner_optimizer(const param_layout& layout, const optimizer_config& opt, gemm_function gemm)
    : opt_(opt), adamw_(layout, opt, opt.kind != "muon"), orthogonalise_(std::move(gemm)) {
  if (opt.kind != "muon") return;
  std::size_t largest = 0;
  for (const tensor_spec& t : layout.tensors)
    if (t.kind == tensor_kind::matrix) {
      matrices_.push_back({t.offset, t.rows, t.cols});
      largest = std::max(largest, t.size());
    }
  update_.resize(largest);
}

double inner_optimizer::step(float* params, const float* grads, double lr) {
  const double norm = adamw_.step(params, grads, lr);
  if (matrices_.empty()) return norm;
  const auto clip = static_cast<float>(opt_.clip_norm > 0 && norm > opt_.clip_norm ? opt_.clip_norm / norm : 1.0);
  const auto mu = static_cast<float>(opt_.muon_momentum);
  const auto decay = static_cast<float>(1.0 - lr * opt_.weight_decay);
  float* momentum = adamw_.first_moment();
  for (const matrix& w : matrices_) {
    const std::size_t n = static_cast<std::size_t>(w.rows) * w.cols;
    float* b = momentum + w.offset;
    const float* g = grads + w.offset;
    float* u = update_.data();
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i] * clip;
      b[i] = mu * b[i] + (1 - mu) * gi;
      u[i] = (1 - mu) * gi + mu * b[i];
    }
    orthogonalise_.run(u, w.rows, w.cols, opt_.muon_ns_steps, u);
    const auto scale = static_cast<float>(lr * 0.2 * std::sqrt(static_cast<double>(std::max(w.rows, w.cols))));
    float* p = params + w.offset;
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < n; ++i) p[i] = p[i] * decay - scale * u[i];
  }
  return norm;
}

}  // namespace archipelago
