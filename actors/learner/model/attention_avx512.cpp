#include "learner/model/attention_avx512.hpp"

#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstdint>

#include "core/invariant.hpp"
#include "learner/model/avx512_lanes.hpp"

namespace archipelago {
namespace {

using index = std::int64_t;
constexpr int lanes = 16;
constexpr int score_rows = 8;  // query rows per block of the score and softmax passes

/// Lanes [0, count − 16·chunk) of chunk `chunk` of a row of `count` valid entries.
ARCHIPELAGO_AVX512_INLINE __mmask16 valid_lanes(index count, index chunk) {
  const index left = count - chunk * lanes;
  return left >= lanes ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

/// r[0..16) ← its transpose, in registers: four rounds of lane shuffles, half the
/// distance each time (gathering a column at a time took over a quarter of the backward pass on AMD).
ARCHIPELAGO_AVX512_INLINE void transpose_16x16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // 2×2 blocks of single floats
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 2×2 blocks of float pairs
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 8; ++i) {  // 2×2 blocks of 128-bit quarters, rows 4 apart
    const int a = (i / 4) * 8 + i % 4;
    t[a] = _mm512_shuffle_f32x4(r[a], r[a + 4], _MM_SHUFFLE(2, 0, 2, 0));
    t[a + 4] = _mm512_shuffle_f32x4(r[a], r[a + 4], _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 8; ++i) {  // and rows 8 apart
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], _MM_SHUFFLE(2, 0, 2, 0));
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

/// out[d × len] = in[len × d]ᵀ (in's rows `ld` apart; len and d multiples of 16, out aligned),
/// 16×16 blocks at a time.
ARCHIPELAGO_AVX512_INLINE void transpose_into(const float* in, index ld, index len, index d, float* out) {
  for (index j = 0; j < len; j += lanes)
    for (index k = 0; k < d; k += lanes) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + (j + i) * ld + k);
      transpose_16x16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_ps(out + (k + i) * len + j, r[i]);
    }
}

/// c[R × 16·NT] = a[R × k]·bt[k × 16·NT]: a's rows lda apart, bt's rows ldb apart (aligned).
template <int R, int NT>
ARCHIPELAGO_AVX512_INLINE void rows_by_columns(const float* a, index lda, const float* bt, index ldb, index k,
                                               float* c, index ldc) {
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (index kk = 0; kk < k; ++kk) {
    __m512 b[NT];
    for (int t = 0; t < NT; ++t) b[t] = _mm512_load_ps(bt + kk * ldb + t * lanes);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + kk]);
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_fmadd_ps(av, b[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) _mm512_store_ps(c + r * ldc + t * lanes, acc[r][t]);
}

/// Columns [0, scored_columns(r0)) of query rows [r0, r0 + score_rows) are written: their
/// causal extent rounded up to whole tiles of 16. Past the diagonal they hold zeros, which is
/// all the weighted sums read (a row block never reads beyond its last row's extent); the rest
/// of a row is never written nor read.
constexpr index scored_columns(index r0) { return (r0 + score_rows + lanes - 1) / lanes * lanes; }

/// The causal scores of query rows [r0, r0 + score_rows), columns [0, scored_columns(r0))
/// (the entries past the diagonal are overwritten by the softmax).
ARCHIPELAGO_AVX512_INLINE void causal_scores(const float* a, index lda, const float* bt, index len, index d,
                                             index r0, float* s) {
  const index tiles = scored_columns(r0) / lanes;
  index t = 0;
  for (; t + 2 <= tiles; t += 2)
    rows_by_columns<score_rows, 2>(a + r0 * lda, lda, bt + t * lanes, len, d, s + r0 * len + t * lanes, len);
  if (t < tiles)
    rows_by_columns<score_rows, 1>(a + r0 * lda, lda, bt + t * lanes, len, d, s + r0 * len + t * lanes, len);
}

/// out[R × 16·ND] = alpha · Σ_{j ∈ [from, to)} p(r, j)·m[j, 16·ND], with p(r, j) at
/// p[r·stride_r + j·stride_j]: the rows of p times m (stride_j 1), or, read down p's
/// columns, its transpose times m (stride_r 1).
template <int R, int ND>
ARCHIPELAGO_AVX512_INLINE void weighted_sum(const float* p, index stride_r, index stride_j, index from, index to,
                                            const float* m, index ldm, float alpha, float* out, index ldo) {
  __m512 acc[R][ND];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < ND; ++n) acc[r][n] = _mm512_setzero_ps();
  for (index j = from; j < to; ++j) {
    __m512 mv[ND];
    for (int n = 0; n < ND; ++n) mv[n] = _mm512_loadu_ps(m + j * ldm + n * lanes);
    for (int r = 0; r < R; ++r) {
      const __m512 pv = _mm512_set1_ps(p[r * stride_r + j * stride_j]);
      for (int n = 0; n < ND; ++n) acc[r][n] = _mm512_fmadd_ps(pv, mv[n], acc[r][n]);
    }
  }
  const __m512 a = _mm512_set1_ps(alpha);
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < ND; ++n) _mm512_storeu_ps(out + r * ldo + n * lanes, _mm512_mul_ps(a, acc[r][n]));
}

/// row[0, count) ← softmax(scale·row[0, count)); row[count, end) ← 0. Returns the
/// row's log-sum-exp, log Σ e^(scale·row[j]), from which the backward pass recomputes it.
ARCHIPELAGO_AVX512_INLINE float softmax_row(float* row, index count, index end, float scale) {
  const index chunks = (count + lanes - 1) / lanes;
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 vmax = neg_inf;
  for (index ch = 0; ch < chunks; ++ch)
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(neg_inf, valid_lanes(count, ch), row + ch * lanes));
  const float row_max = max_lanes(vmax);
  const __m512 mx = _mm512_set1_ps(row_max), sc = _mm512_set1_ps(scale);
  __m512 vsum = _mm512_setzero_ps();
  for (index ch = 0; ch < chunks; ++ch) {
    const __mmask16 m = valid_lanes(count, ch);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + ch * lanes), mx), sc)));
    vsum = _mm512_add_ps(vsum, e);
    _mm512_store_ps(row + ch * lanes, e);
  }
  const float sum = sum_lanes(vsum);
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (index ch = 0; ch < chunks; ++ch)
    _mm512_store_ps(row + ch * lanes, _mm512_mul_ps(inv, _mm512_load_ps(row + ch * lanes)));
  for (index ch = chunks; ch < end / lanes; ++ch) _mm512_store_ps(row + ch * lanes, _mm512_setzero_ps());
  return scale * row_max + std::log(sum);
}

/// row[0, count) ← e^(scale·row[j] − lse): the softmax again from the scores and the
/// forward pass's log-sum-exp; row[count, end) ← 0.
ARCHIPELAGO_AVX512_INLINE void probabilities_row(float* row, index count, index end, float scale, float lse) {
  const index chunks = (count + lanes - 1) / lanes;
  const __m512 sc = _mm512_set1_ps(scale), shift = _mm512_set1_ps(lse);
  for (index ch = 0; ch < chunks; ++ch) {
    const __m512 e = exp_ps(_mm512_fmsub_ps(_mm512_loadu_ps(row + ch * lanes), sc, shift));
    _mm512_store_ps(row + ch * lanes, _mm512_maskz_mov_ps(valid_lanes(count, ch), e));
  }
  for (index ch = chunks; ch < end / lanes; ++ch) _mm512_store_ps(row + ch * lanes, _mm512_setzero_ps());
}

/// ds[0, count) ← p·(ds − Σ p·ds) (the softmax's backward, ds holding dP on entry);
/// ds[count, end) ← 0.
ARCHIPELAGO_AVX512_INLINE void softmax_backward_row(const float* p, float* ds, index count, index end) {
  const index chunks = (count + lanes - 1) / lanes;
  __m512 vdot = _mm512_setzero_ps();
  for (index ch = 0; ch < chunks; ++ch) {
    const __mmask16 m = valid_lanes(count, ch);
    vdot = _mm512_fmadd_ps(_mm512_maskz_load_ps(m, p + ch * lanes), _mm512_maskz_load_ps(m, ds + ch * lanes), vdot);
  }
  const __m512 dot = _mm512_set1_ps(sum_lanes(vdot));
  for (index ch = 0; ch < chunks; ++ch) {
    const __mmask16 m = valid_lanes(count, ch);
    const __m512 pv = _mm512_maskz_load_ps(m, p + ch * lanes);
    _mm512_store_ps(ds + ch * lanes, _mm512_mul_ps(pv, _mm512_sub_ps(_mm512_load_ps(ds + ch * lanes), dot)));
  }
  for (index ch = chunks; ch < end / lanes; ++ch) _mm512_store_ps(ds + ch * lanes, _mm512_setzero_ps());
}

/// Rows of the weighted sums per block: enough accumulators to hide the FMA latency, few enough for the registers.
template <int ND>
constexpr int sum_rows = ND <= 2 ? 8 : 4;

/// rows[len × 16·ND] (rows ld apart) += bias, every row.
template <int ND>
ARCHIPELAGO_AVX512_INLINE void add_bias(float* rows, index ld, index len, const float* bias) {
  __m512 b[ND];
  for (int n = 0; n < ND; ++n) b[n] = _mm512_loadu_ps(bias + n * lanes);
  for (index i = 0; i < len; ++i)
    for (int n = 0; n < ND; ++n)
      _mm512_storeu_ps(rows + i * ld + n * lanes, _mm512_add_ps(b[n], _mm512_loadu_ps(rows + i * ld + n * lanes)));
}

/// sum[16·ND] = the column sums of rows[len × 16·ND] (rows ld apart), in row order.
template <int ND>
ARCHIPELAGO_AVX512_INLINE void column_sums(const float* rows, index ld, index len, float* sum) {
  __m512 acc[ND];
  for (int n = 0; n < ND; ++n) acc[n] = _mm512_setzero_ps();
  for (index i = 0; i < len; ++i)
    for (int n = 0; n < ND; ++n) acc[n] = _mm512_add_ps(acc[n], _mm512_loadu_ps(rows + i * ld + n * lanes));
  for (int n = 0; n < ND; ++n) _mm512_storeu_ps(sum + n * lanes, acc[n]);
}

/// One (sequence, head): the QKV bias added to its slices of qkv, its scores and
/// probabilities in the tile s (scratch), its output in y, each row's log-sum-exp in lse.
template <int ND>
ARCHIPELAGO_AVX512 void forward_head(float* q, float* k, float* v, index ld3, const float* bias, index c, index len,
                                     float scale, float* s, float* lse, float* y, index ldy, float* kt) {
  constexpr index d = ND * lanes;
  constexpr int R = sum_rows<ND>;
  add_bias<ND>(q, ld3, len, bias);
  add_bias<ND>(k, ld3, len, bias + c);
  add_bias<ND>(v, ld3, len, bias + 2 * c);
  transpose_into(k, ld3, len, d, kt);
  for (index r0 = 0; r0 < len; r0 += score_rows) {
    causal_scores(q, ld3, kt, len, d, r0, s);
    const index end = scored_columns(r0);
    for (index i = r0; i < r0 + score_rows; ++i) lse[i] = softmax_row(s + i * len, i + 1, end, scale);
    // The rows' weighted sums while their probabilities are in cache; row i needs values [0, i].
    for (index b0 = r0; b0 < r0 + score_rows; b0 += R)
      weighted_sum<R, ND>(s + b0 * len, len, 1, 0, b0 + R, v, ld3, 1.0f, y + b0 * ldy, ldy);
  }
}

/// One (sequence, head): its probabilities recomputed into the tile p from Q·Kᵀ and
/// the forward pass's lse (cheaper than reading them back from memory), dS in the
/// tile ds; kt and vt are scratch for Kᵀ and Vᵀ.
template <int ND>
ARCHIPELAGO_AVX512 void backward_head(const float* q, const float* k, const float* v, index ld3, const float* lse,
                                      const float* dy, index ldy, index len, float scale, float* p, float* ds,
                                      float* dq, float* dk, float* dv, index c, float* dbias, float* kt, float* vt) {
  constexpr index d = ND * lanes;
  constexpr int R = sum_rows<ND>;
  transpose_into(k, ld3, len, d, kt);
  transpose_into(v, ld3, len, d, vt);
  for (index r0 = 0; r0 < len; r0 += score_rows) {
    causal_scores(q, ld3, kt, len, d, r0, p);
    const index end = scored_columns(r0);
    for (index i = r0; i < r0 + score_rows; ++i) probabilities_row(p + i * len, i + 1, end, scale, lse[i]);
    causal_scores(dy, ldy, vt, len, d, r0, ds);  // dP = dY·Vᵀ
    for (index i = r0; i < r0 + score_rows; ++i) softmax_backward_row(p + i * len, ds + i * len, i + 1, end);
    for (index b0 = r0; b0 < r0 + score_rows; b0 += R)  // dQ = scale·dS·K
      weighted_sum<R, ND>(ds + b0 * len, len, 1, 0, b0 + R, k, ld3, scale, dq + b0 * ld3, ld3);
  }
  // Key j is seen by queries [j, len): dK = scale·dSᵀ·Q, dV = Pᵀ·dY.
  for (index j0 = 0; j0 < len; j0 += R) {
    weighted_sum<R, ND>(ds + j0, 1, len, j0, len, q, ld3, scale, dk + j0 * ld3, ld3);
    weighted_sum<R, ND>(p + j0, 1, len, j0, len, dy, ldy, 1.0f, dv + j0 * ld3, ld3);
  }
  column_sums<ND>(dq, ld3, len, dbias);
  column_sums<ND>(dk, ld3, len, dbias + c);
  column_sums<ND>(dv, ld3, len, dbias + 2 * c);
}

template <int ND>
void forward_all(int batch, int len, int heads, float scale, const float* bias, float* qkv, float* lse, float* y,
                 float* scratch) {
  const index c = index{heads} * ND * lanes, ld3 = 3 * c, t = len;
#pragma omp parallel
  {
    float* kt = scratch + omp_get_thread_num() * fused_attention_scratch(1, len, ND * lanes);
    float* s = kt + 2 * ND * lanes * t;
#pragma omp for schedule(static)
    for (index bh = 0; bh < index{batch} * heads; ++bh) {
      const index b = bh / heads, h = bh % heads;
      const index col = h * ND * lanes;
      float* q = qkv + b * t * ld3 + col;
      forward_head<ND>(q, q + c, q + 2 * c, ld3, bias + col, c, t, scale, s, lse + bh * t, y + b * t * c + col,
                       c, kt);
    }
  }
}

template <int ND>
void backward_all(int batch, int len, int heads, float scale, const float* qkv, const float* lse, const float* dy,
                  float* dqkv, float* dbias_part, float* scratch) {
  const index c = index{heads} * ND * lanes, ld3 = 3 * c, t = len;
#pragma omp parallel
  {
    float* kt = scratch + omp_get_thread_num() * fused_attention_scratch(1, len, ND * lanes);
    float* vt = kt + ND * lanes * t;
    float* p = vt + ND * lanes * t;
    float* ds = p + t * t;
#pragma omp for schedule(static)
    for (index bh = 0; bh < index{batch} * heads; ++bh) {
      const index b = bh / heads, h = bh % heads, col = h * ND * lanes;
      const float* q = qkv + b * t * ld3 + col;
      float* dq = dqkv + b * t * ld3 + col;
      backward_head<ND>(q, q + c, q + 2 * c, ld3, lse + bh * t, dy + b * t * c + col, c, t, scale, p, ds, dq,
                        dq + c, dq + 2 * c, c, dbias_part + b * ld3 + col, kt, vt);
    }
  }
}

bool cpu_has_avx512f() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

}  // namespace

bool fused_attention_fits(int len, int head_dim) {
  static const bool avx512 = cpu_has_avx512f();
  return avx512 && len > 0 && len % lanes == 0 && head_dim > 0 && head_dim % lanes == 0 && head_dim <= 4 * lanes;
}

void fused_attention_forward(int batch, int len, int heads, int head_dim, float scale, const float* qkv_bias,
                             float* qkv, float* lse, float* y, float* scratch) {
  ARCHIPELAGO_INVARIANT(fused_attention_fits(len, head_dim), "fused attention: the shape fits its kernel");
  switch (head_dim / lanes) {
    case 1: return forward_all<1>(batch, len, heads, scale, qkv_bias, qkv, lse, y, scratch);
    case 2: return forward_all<2>(batch, len, heads, scale, qkv_bias, qkv, lse, y, scratch);
    case 3: return forward_all<3>(batch, len, heads, scale, qkv_bias, qkv, lse, y, scratch);
    default: return forward_all<4>(batch, len, heads, scale, qkv_bias, qkv, lse, y, scratch);
  }
}

void fused_attention_backward(int batch, int len, int heads, int head_dim, float scale, const float* qkv,
                              const float* lse, const float* dy, float* dqkv, float* dqkv_bias_part,
                              float* scratch) {
  ARCHIPELAGO_INVARIANT(fused_attention_fits(len, head_dim), "fused attention: the shape fits its kernel");
  switch (head_dim / lanes) {
    case 1: return backward_all<1>(batch, len, heads, scale, qkv, lse, dy, dqkv, dqkv_bias_part, scratch);
    case 2: return backward_all<2>(batch, len, heads, scale, qkv, lse, dy, dqkv, dqkv_bias_part, scratch);
    case 3: return backward_all<3>(batch, len, heads, scale, qkv, lse, dy, dqkv, dqkv_bias_part, scratch);
    default: return backward_all<4>(batch, len, heads, scale, qkv, lse, dy, dqkv, dqkv_bias_part, scratch);
  }
}

}  // namespace archipelago
