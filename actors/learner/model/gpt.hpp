#pragma once
// A byte-level decoder-only transformer (GPT-style) with a hand-written forward
// and backward pass in Eigen.
//
//   x = wte[tokens] + wpe[positions]
//   per block:  x += attn(LN1(x)) ;  x += W2·gelu(W1·LN2(x))
//   logits = LNf(x) · wteᵀ   (or · lm_head when untied);  loss = mean cross-entropy
//
// Parameters and gradients each live in one contiguous 64-byte aligned buffer
// laid out by core/layout.hpp. Matrices are row-major, activations are [N, C]
// row-major with N = batch · positions, so every dense layer is one GEMM.
//
// Templated on the scalar: float is the engine, double exists for the gradient
// checks against finite differences.
//
// The dense layers (QKV, output projection, MLP, unembedding; forward and
// backward) go through oneDNN (dense_gemm.hpp), fp32 or bf16; attention,
// LayerNorm, GELU and the loss stay Eigen. gpt<double> always uses Eigen.
//
// Determinism: every reduction is split into a fixed number of chunks summed in
// order, so the same seed and thread count give bit-identical losses.

#include <cstdint>
#include <memory>

#include "core/layout.hpp"
#include "core/aligned_buffer.hpp"
#include "learner/model/dense_gemm.hpp"

namespace archipelago {

/// Where a step's time goes, for `bench compute --profile`. Bias and residual
/// adds and bias gradients are fused into the pass after their GEMM, so they
/// count in that phase (layernorm, attention, gelu).
struct step_profile {
  enum phase : int { embedding, layernorm, dense, attention, gelu, loss, phase_count };
  static const char* name(int p);
  double seconds[phase_count] = {};
};

/// How the dense layers multiply. eigen: Eigen's GEMM, its ISA fixed at compile
/// time (the engine before oneDNN, kept as `bench compute`'s comparison);
/// fp32 / bf16: oneDNN, dispatched at run time (dense_gemm.hpp).
enum class dense_backend : std::uint8_t { eigen, fp32, bf16 };
const char* backend_name(dense_backend b);

template <class S>
class gpt {
 public:
  /// bf16 on a CPU without native bf16 runs fp32: backend() says which is in use.
  explicit gpt(const param_layout& layout, dense_backend backend = dense_backend::fp32);
  ~gpt();
  gpt(const gpt&) = delete;
  gpt& operator=(const gpt&) = delete;

  const param_layout& layout() const { return layout_; }
  const model_shape& shape() const { return layout_.shape; }

  dense_backend backend() const { return backend_; }
  /// The attention kernels of a full-length batch: "fused avx512", "onednn batched" or "eigen per head".
  const char* attention_kernel() const;
  /// The GELU's kernel: "avx512" (gelu_avx512.hpp) or "eigen".
  const char* gelu_kernel() const { return gelu_avx512_ ? "avx512" : "eigen"; }

  S* params() { return params_.data(); }
  const S* params() const { return params_.data(); }
  S* grads() { return grads_.data(); }
  const S* grads() const { return grads_.data(); }
  std::size_t buffer_size() const { return params_.size(); }

  /// GPT-2 style initialisation from a seed: N(0, 0.02), residual projections
  /// scaled by 1/sqrt(2L), biases 0, LayerNorm gains 1.
  void init(std::uint64_t seed);

  /// Forward and backward over `batch` sequences of `context` tokens
  /// (inputs/targets row-major [batch][context], values 0..255). Overwrites the
  /// gradient buffer and returns the mean loss in nats per token.
  double forward_backward(const std::int32_t* inputs, const std::int32_t* targets, int batch);

  /// Forward only. Adds to `loss_sum` the loss (nats) of positions
  /// [first_scored[b], len) of each sequence and to `scored` their count.
  void forward_scored(const std::int32_t* inputs, const std::int32_t* targets, int batch, int len,
                      const int* first_scored, double& loss_sum, std::int64_t& scored);

  /// Next-byte logits after a single sequence of `len` tokens (1 ≤ len ≤ context).
  void next_logits(const std::int32_t* tokens, int len, S* logits_out);

  /// Matrix-multiply FLOPs of one forward+backward over `batch` full sequences:
  /// 3× the forward GEMMs, attention counted over its causal half.
  double flops_per_step(int batch) const;

  /// Accumulate per-phase wall time into `profile` (nullptr: off, the default).
  void set_profile(step_profile* profile) { profile_ = profile; }

 private:
  struct workspace;
  void forward(const std::int32_t* inputs, int batch, int len);

  param_layout layout_;
  aligned_buffer<S> params_;
  aligned_buffer<S> grads_;
  std::unique_ptr<workspace> ws_;
  std::unique_ptr<dense_gemm> kernels_;  // null: Eigen
  std::unique_ptr<causal_attention> attention_;  // with kernels_; full-length sequences only
  bool gelu_avx512_ = false;                     // with kernels_, where oneDNN dispatches to AVX-512
  dense_backend backend_ = dense_backend::eigen;
  step_profile* profile_ = nullptr;
};

extern template class gpt<float>;
extern template class gpt<double>;

}  // namespace archipelago
