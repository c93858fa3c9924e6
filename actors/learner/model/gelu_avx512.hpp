#pragma once
// The GELU's forward pass in AVX-512, one row per call (gpt.cpp keeps the loop and
// its threads): the tanh approximation as a sigmoid, e^x by a polynomial, one
// reciprocal. Eigen's version is compiled for the portable build's ISA (AVX2) and
// computed tanh and the derivative in two passes: a third slower on micro.
//
// Behind target attributes like attention_avx512.cpp: the portable build carries it
// and gpt<float> runs it, with oneDNN's kernels, where oneDNN dispatches to AVX-512
// (so ONEDNN_MAX_CPU_ISA=AVX2 shows the AVX2-only path). Elementwise: deterministic.

namespace archipelago {

/// GELU's tanh approximation (as GPT-2): 0.5·x·(1 + tanh(k0·(x + k1·x³))).
constexpr double gelu_tanh_k0 = 0.7978845608028654;  // sqrt(2/pi)
constexpr double gelu_tanh_k1 = 0.044715;

/// With x = pre + bias: y = gelu(x) (tanh approximation) and pre ← gelu'(x), in place.
void gelu_forward_avx512(float* pre, const float* bias, float* y, long cols);

}  // namespace archipelago
