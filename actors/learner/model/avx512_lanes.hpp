#pragma once
// Horizontal reductions of one AVX-512 vector for the kernels behind target
// attributes (cpu_peak.cpp, attention_avx512.cpp): through memory, because GCC
// 12's _mm512_reduce_* warn (-Wuninitialized) in their own header, and over the
// lanes in a fixed order, so results are deterministic.

#include <immintrin.h>

namespace archipelago {

__attribute__((target("avx512f"), always_inline)) inline float sum_lanes(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}

__attribute__((target("avx512f"), always_inline)) inline float max_lanes(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float m = lanes[0];
  for (float x : lanes) m = x > m ? x : m;
  return m;
}

}  // namespace archipelago
