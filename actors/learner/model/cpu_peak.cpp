#include "learner/model/cpu_peak.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

namespace archipelago {
namespace {

// Enough independent accumulators to cover the FMA latency (4-5 cycles) on two
// ports; every iteration is one instruction per accumulator, nothing else.
constexpr int acc_avx2 = 10, acc_avx512 = 12;
constexpr long iterations = 1L << 20;

__attribute__((target("avx2,fma"))) float loop_avx2(long n) {
  __m256 acc[acc_avx2];
  for (int i = 0; i < acc_avx2; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < n; ++it)
    for (int i = 0; i < acc_avx2; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < acc_avx2; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
}

// Through memory: GCC 12's _mm512_reduce_add_ps warns (-Wuninitialized) in its own header.
__attribute__((target("avx512f"))) float sum_lanes(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}

__attribute__((target("avx512f"))) float loop_avx512(long n) {
  __m512 acc[acc_avx512];
  for (int i = 0; i < acc_avx512; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < n; ++it)
    for (int i = 0; i < acc_avx512; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < acc_avx512; ++i) s = _mm512_add_ps(s, acc[i]);
  return sum_lanes(s);
}

__attribute__((target("avx512f,avx512bf16"))) float loop_bf16(long n) {
  __m512 acc[acc_avx512];
  for (int i = 0; i < acc_avx512; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(-1e-3f), _mm512_set1_ps(1e-3f));
  for (long it = 0; it < n; ++it)
    for (int i = 0; i < acc_avx512; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < acc_avx512; ++i) s = _mm512_add_ps(s, acc[i]);
  return sum_lanes(s);
}

/// GFLOP/s of `loop` on every thread at once: total FLOPs over the slowest thread's time.
template <class Loop>
double measure(Loop loop, double flops_per_iteration, int threads, double seconds) {
  double best = 0;
  volatile float sink = 0;
  const auto start = std::chrono::steady_clock::now();
  do {
    double slowest = 0;
#pragma omp parallel num_threads(threads) reduction(max : slowest)
    {
      const auto t0 = std::chrono::steady_clock::now();
      const float r = loop(iterations);
      slowest = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#pragma omp critical
      sink = sink + r;
    }
    best = std::max(best, flops_per_iteration * static_cast<double>(iterations) * threads / slowest * 1e-9);
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds);
  return best;
}

}  // namespace

cpu_peak measure_cpu_peak(int threads, double seconds) {
  cpu_peak p;
  p.threads = threads;
  __builtin_cpu_init();
  // One FMA on 8 (16) lanes is 16 (32) FLOPs; one VDPBF16PS on 16 lanes is 2 multiply-adds each: 64.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    p.fp32_avx2_gflops = measure(loop_avx2, 16.0 * acc_avx2, threads, seconds);
  if (__builtin_cpu_supports("avx512f"))
    p.fp32_avx512_gflops = measure(loop_avx512, 32.0 * acc_avx512, threads, seconds);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
    p.bf16_gflops = measure(loop_bf16, 64.0 * acc_avx512, threads, seconds);
  p.fp32_isa = p.fp32_avx512_gflops > p.fp32_avx2_gflops ? "avx512f" : "avx2+fma";
  return p;
}

}  // namespace archipelago
