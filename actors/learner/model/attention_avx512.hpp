#pragma once
// Causal self-attention fused per (sequence, head) in AVX-512: the scores, the
// softmax and the weighted sum of one head stay in L1/L2 while they are used,
// and only the causal half of every product is computed. oneDNN's batched
// attention (dense_gemm.hpp) computes the full T×T at a time and goes through
// memory between its steps; on micro that made attention a fifth of a step.
// The probabilities never leave the cache: the forward pass keeps each row's
// log-sum-exp, and the backward pass recomputes them from Q·Kᵀ, which costs less
// than writing them out and reading them back.
//
// Behind target attributes, so the portable build (-march=x86-64-v3) carries it
// and runs it only where the CPU has AVX-512F (fused_attention_fits). Layouts
// are causal_attention's: qkv [B·T, 3C], y and dy [B·T, C]; in place of the
// probabilities, lse [B·H, T]: each softmax row's log-sum-exp.
// Deterministic: each (sequence, head) pair is one task with a fixed summation
// order, whatever the threads.

namespace archipelago {

/// The CPU has AVX-512F, and the shape suits the kernels: T a multiple of 16,
/// the head dimension a multiple of 16 up to 64.
bool fused_attention_fits(int len, int head_dim);

/// Floats of scratch the kernels need, per OpenMP thread: Kᵀ and Vᵀ of a head, and
/// two T×T tiles (probabilities and their gradient).
inline long fused_attention_scratch(int threads, int len, int head_dim) {
  return long{threads} * 2 * len * (head_dim + len);
}

/// qkv += qkv_bias [3C] on every row (in place, kept for the backward pass); then
/// y = softmax(mask(scale·Q·Kᵀ))·V, and the softmax rows' log-sum-exps in lse
/// [B·H, T]. scratch: 64-byte aligned,
/// fused_attention_scratch(omp_get_max_threads(), len, head_dim) floats.
void fused_attention_forward(int batch, int len, int heads, int head_dim, float scale, const float* qkv_bias,
                             float* qkv, float* lse, float* y, float* scratch);

/// dqkv (overwritten) = the gradient of qkv from dy, with lse as the forward pass
/// left it; dqkv_bias_part [B × 3C] (overwritten) = dqkv's column sums per sequence.
void fused_attention_backward(int batch, int len, int heads, int head_dim, float scale, const float* qkv,
                              const float* lse, const float* dy, float* dqkv, float* dqkv_bias_part, float* scratch);

}  // namespace archipelago
