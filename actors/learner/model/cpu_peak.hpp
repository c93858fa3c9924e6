#pragma once
// The CPU's own limits — what `bench compute` reports the engine against, and
// what train.precision = auto compares (bf16 only where it outpaces fp32):
// fp32 FMA and bf16 dot-product peaks (AVX-512 VDPBF16PS, and AMX's TDPBF16PS
// where the CPU has AMX), each a short register-resident loop on every thread
// (independent accumulators, no memory traffic). The loops are
// compiled in cpu_peak.cpp with per-function target attributes and run only
// where the CPU has the instructions, so the build stays -march=x86-64-v3.

#include <string>

namespace archipelago {

struct cpu_peak {
  int threads = 0;
  double fp32_avx2_gflops = 0;    // 256-bit FMA (AVX2 + FMA)
  double fp32_avx512_gflops = 0;  // 512-bit FMA; 0 without AVX-512F
  double bf16_gflops = 0;         // 512-bit VDPBF16PS, 2 multiply-adds per lane; 0 without AVX512_BF16
  double amx_bf16_gflops = 0;     // AMX TDPBF16PS, tile-resident; 0 without AMX (or if Linux refuses its state)
  std::string fp32_isa;           // the faster fp32 loop: "avx512f" or "avx2+fma"

  double fp32_gflops() const { return fp32_avx512_gflops > fp32_avx2_gflops ? fp32_avx512_gflops : fp32_avx2_gflops; }
  /// The CPU's bf16 limit: AMX's where it has AMX, else the vector dot products'.
  double bf16_best_gflops() const { return amx_bf16_gflops > bf16_gflops ? amx_bf16_gflops : bf16_gflops; }
  const char* bf16_isa() const { return amx_bf16_gflops > bf16_gflops ? "amx" : "avx512_bf16"; }
};

/// Runs each loop the CPU supports on `threads` OpenMP threads for about
/// `seconds` each (the best of a few repetitions).
cpu_peak measure_cpu_peak(int threads, double seconds);

}  // namespace archipelago
