#pragma once
// AVX-512 helpers for the kernels behind target attributes (cpu_peak.cpp,
// attention_avx512.cpp, gelu_avx512.cpp): the target attribute the model's kernels
// share; horizontal reductions of one vector, a tree of halvings in a fixed order
// (so results are deterministic), in registers (GCC 12's _mm512_reduce_* warn,
// -Wuninitialized, in their own header); and e^x.
// Only the AVX-512 kernels' translation units include it.

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as their merge source and then
// warn about it where they are inlined (max, min, scalef, roundscale, the 256-bit
// halves); nothing reads those lanes. For the rest of the including file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

/// The ISA of the model's AVX-512 kernels, so the portable build carries them; the
/// inline form for their helpers (a lambda takes ARCHIPELAGO_AVX512 with always_inline).
#define ARCHIPELAGO_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))
#define ARCHIPELAGO_AVX512_INLINE ARCHIPELAGO_AVX512 __attribute__((always_inline)) inline

namespace archipelago {

/// v's 16 lanes folded to one with op, in halves: 8 + 8, 4 + 4, 2 + 2, 1 + 1.
template <class Op8, class Op4>
__attribute__((target("avx512f"), always_inline)) inline float fold_lanes(__m512 v, Op8 op8, Op4 op4) {
  const __m256 h = op8(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 q = op4(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = op4(q, _mm_movehl_ps(q, q));
  q = op4(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

__attribute__((target("avx512f"), always_inline)) inline float sum_lanes(__m512 v) {
  return fold_lanes(
      v, [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); }, [](__m128 a, __m128 b) { return _mm_add_ps(a, b); });
}

__attribute__((target("avx512f"), always_inline)) inline float max_lanes(__m512 v) {
  return fold_lanes(
      v, [](__m256 a, __m256 b) { return _mm256_max_ps(a, b); }, [](__m128 a, __m128 b) { return _mm_max_ps(a, b); });
}

/// e^x, Cephes' polynomial (relative error ~2e-7 on the range), 2^n by VSCALEFPS.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

}  // namespace archipelago
