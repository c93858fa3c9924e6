#include "learner/model/cpu_peak.hpp"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "learner/model/avx512_lanes.hpp"

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

// AMX: 8 tiles of 16 rows × 64 bytes. One TDPBF16PS multiplies a 16×32 bf16 tile by
// a 32×16 one into a 16×16 fp32 tile: 16·16·32 multiply-adds, 16,384 FLOPs.
constexpr int amx_accumulators = 4;
constexpr long amx_iterations_divisor = 16;  // an AMX iteration is ~16× a vector one

struct alignas(64) amx_tile_config {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

/// The CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7), and Linux lets this process
/// use the tile state (it must be asked for, once per process: ARCH_REQ_XCOMP_PERM).
bool amx_usable() {
  static const bool usable = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx = (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return amx && syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return usable;
}

__attribute__((target("amx-tile,amx-bf16"))) float loop_amx(long n) {
  amx_tile_config config;
  for (int t = 0; t < amx_accumulators + 2; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
  alignas(64) std::uint16_t operand[16 * 32];
  std::fill(std::begin(operand), std::end(operand), std::uint16_t{0x3c00});  // bf16 2^-7: no overflow
  alignas(64) float out[16 * 16];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  for (long it = 0; it < n; ++it) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
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
  if (amx_usable())
    p.amx_bf16_gflops = measure([](long n) { return loop_amx(n / amx_iterations_divisor); },
                                16384.0 * amx_accumulators / amx_iterations_divisor, threads, seconds);
  p.fp32_isa = p.fp32_avx512_gflops > p.fp32_avx2_gflops ? "avx512f" : "avx2+fma";
  return p;
}

}  // namespace archipelago
