#include "learner/model/gelu_avx512.hpp"

#include <immintrin.h>

#include "learner/model/avx512_lanes.hpp"

namespace archipelago {
namespace {

constexpr long lanes = 16;

/// body(j, mask) for every chunk of 16 columns of [0, cols): the whole chunks with a
/// constant full mask, which the compiler turns into plain loads and stores (masked
/// stores are slower), then the tail, masked.
template <class Body>
ARCHIPELAGO_AVX512_INLINE void over_chunks(long cols, Body body) {
  long j = 0;
  for (; j + lanes <= cols; j += lanes) body(j, __mmask16(0xFFFF));
  if (j < cols) body(j, __mmask16((1u << (cols - j)) - 1));
}

// GELU's tanh approximation, as gpt.cpp's Eigen version: gelu(x) = x·σ(2u) with
// u = k0·(x + k1·x³), since 0.5·(1 + tanh(u)) = σ(2u); gelu'(x) = σ + x·σ·(1 − σ)·2u'.
constexpr auto gelu_k0 = static_cast<float>(gelu_tanh_k0);
constexpr auto gelu_k1 = static_cast<float>(gelu_tanh_k1);

}  // namespace

ARCHIPELAGO_AVX512 void gelu_forward_avx512(float* pre, const float* bias, float* y, long cols) {
  const __m512 one = _mm512_set1_ps(1.0f);
  over_chunks(cols, [&](long j, __mmask16 m) ARCHIPELAGO_AVX512 __attribute__((always_inline)) {
    const __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(m, pre + j), _mm512_maskz_loadu_ps(m, bias + j));
    const __m512 x2 = _mm512_mul_ps(x, x);
    // 2u, clamped where σ is 0 or 1 in floats, so e^(−2u) stays finite.
    __m512 u2 = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(2 * gelu_k0)),
                              _mm512_fmadd_ps(x2, _mm512_set1_ps(gelu_k1), one));
    u2 = _mm512_min_ps(_mm512_max_ps(u2, _mm512_set1_ps(-30.0f)), _mm512_set1_ps(30.0f));
    const __m512 den = _mm512_add_ps(exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), u2)), one);
    __m512 s = _mm512_rcp14_ps(den);
    s = _mm512_mul_ps(s, _mm512_fnmadd_ps(den, s, _mm512_set1_ps(2.0f)));  // one Newton step: to float precision
    const __m512 out = _mm512_mul_ps(x, s);
    _mm512_mask_storeu_ps(y + j, m, out);
    const __m512 du2 = _mm512_fmadd_ps(x2, _mm512_set1_ps(6 * gelu_k0 * gelu_k1), _mm512_set1_ps(2 * gelu_k0));
    _mm512_mask_storeu_ps(pre + j, m, _mm512_fmadd_ps(_mm512_fnmadd_ps(out, s, out), du2, s));
  });
}

}  // namespace archipelago
