#pragma once
// The model's dense layers (and its attention, causal_attention below):
// row-major GEMMs through oneDNN, which picks its kernels for the CPU it runs
// on (AVX2, AVX-512, AVX512_BF16, AMX) at run time, so one portable build
// (-march=x86-64-v3) uses the best kernels of every node. Only dense_gemm.cpp
// sees oneDNN's headers.
//
// Two paths:
//   fp32  dnnl_sgemm.
//   bf16  both inputs rounded to bfloat16 (nearest even) into scratch owned by
//         the object, one oneDNN matmul primitive per shape with fp32
//         accumulation and fp32 output; the caller's buffers (master weights,
//         gradients, optimizer state) stay fp32.
//
// Determinism: on one CPU, with the same thread count, the same inputs give
// bit-identical outputs (oneDNN's partitioning depends only on the shape, the
// thread count and the ISA it dispatches to). Across CPUs that dispatch to
// different ISAs the results differ in the last bits.
//
// Threads: oneDNN's OpenMP runtime follows the calling thread's
// omp_get_max_threads() (set_compute_threads).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace archipelago {

/// Precision of the dense layers' GEMM inputs (train.precision, resolved).
enum class gemm_precision : std::uint8_t { fp32, bf16 };

const char* precision_name(gemm_precision p);

/// What oneDNN dispatches to on this CPU, read at run time (it honours
/// ONEDNN_MAX_CPU_ISA, so `ONEDNN_MAX_CPU_ISA=AVX2` shows the AVX2-only path).
struct gemm_cpu {
  std::string isa;    // oneDNN's name of the ISA, e.g. "avx512_core_bf16", "avx2"
  bool bf16 = false;  // native bf16 dot products: AVX512_BF16 or AMX
  /// Its measured bf16 dot-product peak beats its fp32 FMA peak (some CPUs with
  /// AVX512_BF16 run it at half the fp32 rate); measured only for auto (dense_backend_for).
  bool bf16_faster = false;
  /// AMX tiles (oneDNN's avx512_core_amx): oneDNN's bf16 matmuls run on them, far
  /// above the AVX-512 dot products' peak, whatever that peak is.
  bool amx = false;
  /// oneDNN dispatches to AVX-512 here: the model's own AVX-512 kernels run too.
  bool avx512() const { return isa.starts_with("avx512"); }
};
gemm_cpu detect_gemm_cpu();

/// Resolves train.precision ("fp32" | "bf16" | "auto") on `cpu`: auto is bf16
/// where the CPU has AMX, or native bf16 that outpaces fp32 (bf16_faster), fp32
/// elsewhere; bf16 on a CPU without it falls back to fp32. `note` gets one line
/// when bf16 is asked for or present and fp32 is what runs (empty otherwise).
/// An unknown value is invalid_input naming it.
expected<gemm_precision> resolve_precision(std::string_view knob, const gemm_cpu& cpu, std::string& note);

/// C[m×n] = beta·C + op(A)·op(B), all row-major. op(A) is [m×k]: A is stored
/// [m×k] with leading dimension lda, or [k×m] when trans_a. Likewise B ([k×n],
/// or [n×k] when trans_b). beta is 0 or 1.
class dense_gemm {
 public:
  /// bf16 needs a CPU whose oneDNN builds a bf16 matmul; otherwise unsupported.
  static expected<std::unique_ptr<dense_gemm>> make(gemm_precision precision);
  ~dense_gemm();
  dense_gemm(const dense_gemm&) = delete;
  dense_gemm& operator=(const dense_gemm&) = delete;

  gemm_precision precision() const { return precision_; }
  /// bf16 calls that ran in fp32 because oneDNN built no bf16 matmul for their shape.
  std::int64_t fp32_fallbacks() const { return fp32_fallbacks_; }

  void run(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

 private:
  struct impl;
  dense_gemm(gemm_precision precision, std::unique_ptr<impl> state);
  gemm_precision precision_;
  std::unique_ptr<impl> impl_;
  std::int64_t fp32_fallbacks_ = 0;
};

/// Causal self-attention of a whole batch, fp32 in every precision. Where oneDNN
/// dispatches to AVX-512 and the shape suits (fused_attention_fits), the fused
/// per-head kernels of attention_avx512.hpp. Elsewhere oneDNN's batched matmuls over
/// every (sequence, head) pair and its softmax, dispatched to the CPU's ISA at run
/// time (Eigen's per-head attention, used without oneDNN, is fixed at compile time:
/// AVX2 in the portable build): the scores over the full T×T, the upper triangle
/// masked to −inf (exactly 0 after the softmax), twice the causal work at the wide
/// vectors' speed. Row-major layouts: qkv [B·T, 3C] (Q, K, V side by side, the heads
/// contiguous within each), y and dy [B·T, C], prob and dprob [B·H, T, T] (oneDNN's).
/// Deterministic as dense_gemm is.
class causal_attention {
 public:
  static expected<std::unique_ptr<causal_attention>> make();
  ~causal_attention();
  /// Which kernels a batch of this shape runs: "fused avx512" or "onednn batched".
  const char* kernel(int len, int head_dim) const;
  causal_attention(const causal_attention&) = delete;
  causal_attention& operator=(const causal_attention&) = delete;

  /// Floats of `prob` that forward keeps per (sequence, head) for backward: each
  /// row's log-sum-exp for the fused kernels (T), the probabilities for oneDNN's (T·T).
  long prob_floats(int len, int head_dim) const;
  /// Floats of `dprob` scratch that backward needs per (sequence, head): none for
  /// the fused kernels, T·T for oneDNN's.
  long dprob_floats(int len, int head_dim) const;

  /// qkv += qkv_bias [3C] on every row (in place: the backward pass reads it);
  /// then prob = softmax(mask(scale·Q·Kᵀ)), y = prob·V. prob [B·H, prob_floats] is
  /// for the backward pass only: the fused kernels keep just each row's log-sum-exp.
  void forward(int batch, int len, int heads, int head_dim, float scale, const float* qkv_bias, float* qkv,
               float* prob, float* y);
  /// dqkv (overwritten) = the gradient of qkv from dy, and dqkv_bias_part [B × 3C]
  /// (overwritten) its column sums per sequence; prob as forward left it; dprob is
  /// scratch [B·H, dprob_floats].
  void backward(int batch, int len, int heads, int head_dim, float scale, const float* qkv, const float* prob,
                const float* dy, float* dprob, float* dqkv, float* dqkv_bias_part);

 private:
  struct impl;
  explicit causal_attention(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

/// Rounds n floats to bfloat16 (nearest even), as the bf16 path does: for tests
/// and the bench's error figures.
void round_to_bf16(const float* in, std::uint16_t* out, std::int64_t n);
float bf16_to_float(std::uint16_t v);

}  // namespace archipelago
