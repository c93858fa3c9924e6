#include "learner/model/gpt.hpp"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/invariant.hpp"
#include "core/prng.hpp"
#include "learner/model/gelu_avx512.hpp"

namespace archipelago {
namespace {

using Eigen::Index;

template <class S>
using row_matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using matrix_view = Eigen::Map<row_matrix<S>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class S>
using const_matrix_view = Eigen::Map<const row_matrix<S>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class S>
using array_view = Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>;
template <class S>
using const_array_view = Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>;

template <class S>
using row_view = Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>>;
template <class S>
using const_row_view = Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>;

template <class S>
matrix_view<S> view(S* p, Index rows, Index cols, Index stride) {
  return matrix_view<S>(p, rows, cols, Eigen::OuterStride<>(stride));
}
template <class S>
const_matrix_view<S> view(const S* p, Index rows, Index cols, Index stride) {
  return const_matrix_view<S>(p, rows, cols, Eigen::OuterStride<>(stride));
}
template <class S>
matrix_view<S> view(S* p, Index rows, Index cols) {
  return view(p, rows, cols, cols);
}
template <class S>
const_matrix_view<S> view(const S* p, Index rows, Index cols) {
  return view(p, rows, cols, cols);
}

constexpr double layernorm_eps = 1e-5;
constexpr int reduce_chunks = 32;          // fixed, so sums do not depend on thread count
constexpr Index elementwise_block = 16384;  // elements per parallel block
constexpr Index attention_row_block = 32;   // causal blocking: skips most of the upper triangle

/// Adds chunk partial sums [chunks × cols] to out in chunk order (deterministic).
template <class S>
void add_partials(const S* partials, int chunks, Index cols, S* out) {
  array_view<S> total(out, cols);
  for (int c = 0; c < chunks; ++c) total += const_array_view<S>(partials + c * cols, cols);
}

/// Rows [begin, end) of reduction chunk c: the rows are cut into a fixed number of
/// chunks, so sums do not depend on the thread count.
inline Index chunk_begin(Index rows, int chunks, int c) { return rows * c / chunks; }
inline int chunk_count(Index rows) { return static_cast<int>(std::min<Index>(reduce_chunks, rows)); }

/// out[m×k] += Aᵀ·B for A [rows×m], B [rows×k]: a weight gradient, a reduction
/// over all tokens into a small matrix. Eigen parallelises a GEMM over its
/// output, which is too small here to keep every thread busy, so the token
/// dimension is split into one slice per thread instead; the partial products
/// are then added in slice order (deterministic for a given thread count).
template <class S>
void add_weight_grad(const_matrix_view<S> a, const_matrix_view<S> b, S* out, S* scratch,
                     int threads) {
  const Index m = a.cols(), k = b.cols(), rows = a.rows();
  auto result = view(out, m, k);
  if (threads <= 1 || m * k >= (Index{1} << 18) || rows < 64 * threads) {
    result.noalias() += a.transpose() * b;
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int t = 0; t < threads; ++t) {
    const Index r0 = rows * t / threads, r1 = rows * (t + 1) / threads;
    view(scratch + t * m * k, m, k).noalias() =
        a.middleRows(r0, r1 - r0).transpose() * b.middleRows(r0, r1 - r0);
  }
  const Index total = m * k;
#pragma omp parallel for schedule(static)
  for (Index e = 0; e < total; e += elementwise_block) {
    const Index len = std::min(elementwise_block, total - e);
    array_view<S> dst(out + e, len);
    for (int t = 0; t < threads; ++t) dst += array_view<S>(scratch + t * m * k + e, len);
  }
}

/// C[m×n] = op(A)·op(B), row-major, for a dense layer: oneDNN when the model
/// has kernels (float), else Eigen (the double gradient checks, the eigen backend).
/// A is stored [m×k], or [k×m] when ta; B [k×n], or [n×k] when tb.
template <class S>
void dense(dense_gemm* kernels, bool ta, bool tb, Index m, Index n, Index k, const S* a, Index lda, const S* b,
           Index ldb, S* c, Index ldc) {
  if constexpr (std::is_same_v<S, float>) {
    if (kernels) {
      kernels->run(ta, tb, m, n, k, a, lda, b, ldb, 0.0f, c, ldc);
      return;
    }
  }
  auto cv = view(c, m, n, ldc);
  const auto av = view(a, ta ? k : m, ta ? m : k, lda);
  const auto bv = view(b, tb ? n : k, tb ? k : n, ldb);
  auto apply = [&](const auto& pa, const auto& pb) { cv.noalias() = pa * pb; };
  if (ta && tb) apply(av.transpose(), bv.transpose());
  else if (ta) apply(av.transpose(), bv);
  else if (tb) apply(av, bv.transpose());
  else apply(av, bv);
}

/// out[m×k] += Aᵀ·B for A [rows×m], B [rows×k]: oneDNN splits the token
/// dimension itself; Eigen goes through add_weight_grad.
template <class S>
void weight_grad(dense_gemm* kernels, const S* a, Index m, const S* b, Index k, Index rows, S* out, S* scratch) {
  if constexpr (std::is_same_v<S, float>) {
    if (kernels) {
      kernels->run(true, false, m, k, rows, a, m, b, k, 1.0f, out, k);
      return;
    }
  }
  add_weight_grad(view(a, rows, m), view(b, rows, k), out, scratch, omp_get_max_threads());
}

/// y = LayerNorm(x). If `residual` is given, x ← x + residual + bias first, in
/// place: the residual add of the block whose GEMM wrote x (with beta 0), fused
/// into the one pass that reads x anyway.
template <class S>
void layernorm_forward(S* x, const S* residual, const S* bias, S* y, S* stats, const S* gain,
                       const S* shift, Index rows, Index cols) {
  const_array_view<S> g(gain, cols), b(shift, cols);
#pragma omp parallel for schedule(static)
  for (Index r = 0; r < rows; ++r) {
    array_view<S> in(x + r * cols, cols);
    if (residual) in += const_array_view<S>(residual + r * cols, cols) + const_array_view<S>(bias, cols);
    const S mean = in.sum() / static_cast<S>(cols);
    const S var = (in - mean).square().sum() / static_cast<S>(cols);
    const S rstd = S(1) / std::sqrt(var + static_cast<S>(layernorm_eps));
    array_view<S>(y + r * cols, cols) = (in - mean) * rstd * g + b;
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

/// dx += LayerNorm backward of dy; dgain/dshift accumulate, and so does dsum (if
/// given) with the column sums of dx as updated: the gradient of the bias added
/// to the residual stream there, read while the rows are in cache.
/// scratch: reduce_chunks·3·cols.
template <class S>
void layernorm_backward(const S* dy, const S* x, const S* stats, const S* gain, S* dx, S* dgain,
                        S* dshift, S* dsum, Index rows, Index cols, S* scratch) {
  const int chunks = chunk_count(rows);
  const_array_view<S> g(gain, cols);
  S* part_g = scratch;
  S* part_b = scratch + chunks * cols;
  S* part_s = scratch + 2 * chunks * cols;
#pragma omp parallel for schedule(static)
  for (int c = 0; c < chunks; ++c) {
    array_view<S> pg(part_g + c * cols, cols), pb(part_b + c * cols, cols), ps(part_s + c * cols, cols);
    pg.setZero();
    pb.setZero();
    if (dsum) ps.setZero();
    for (Index r = chunk_begin(rows, chunks, c); r < chunk_begin(rows, chunks, c + 1); ++r) {
      const S mean = stats[2 * r], rstd = stats[2 * r + 1];
      const_array_view<S> in(x + r * cols, cols), d(dy + r * cols, cols);
      const auto xhat = (in - mean) * rstd;
      pg += d * xhat;
      pb += d;
      const auto dxhat = d * g;
      const S m1 = dxhat.sum() / static_cast<S>(cols);
      const S m2 = (dxhat * xhat).sum() / static_cast<S>(cols);
      array_view<S> out(dx + r * cols, cols);
      out += rstd * (dxhat - m1 - xhat * m2);
      if (dsum) ps += out;
    }
  }
  add_partials(part_g, chunks, cols, dgain);
  add_partials(part_b, chunks, cols, dshift);
  if (dsum) add_partials(part_s, chunks, cols, dsum);
}

// GELU's constants (gelu_avx512.hpp) in S.
template <class S>
constexpr S gelu_k0 = static_cast<S>(gelu_tanh_k0);
template <class S>
constexpr S gelu_k1 = static_cast<S>(gelu_tanh_k1);

/// With x = pre + bias (every row): y = gelu(x), and pre ← gelu'(x) in place.
/// The backward pass needs only the derivative, so it is computed here, where
/// tanh(·) already is, and the backward becomes one multiply per element.
/// avx512: gelu_avx512.hpp's row kernel (float only).
template <class S>
void gelu_forward(S* pre, const S* bias, S* y, Index rows, Index cols, bool avx512) {
  const_array_view<S> b(bias, cols);
#pragma omp parallel for schedule(static)
  for (Index r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<S, float>)
      if (avx512) {
        gelu_forward_avx512(pre + r * cols, bias, y + r * cols, cols);
        continue;
      }
    array_view<S> io(pre + r * cols, cols), out(y + r * cols, cols);
    io += b;
    out = (gelu_k0<S> * (io + gelu_k1<S> * io.cube())).tanh();  // t, until the loop below
    for (Index j = 0; j < cols; ++j) {
      const S x = io[j], t = out[j];
      out[j] = S(0.5) * x * (S(1) + t);
      io[j] = S(0.5) * (S(1) + t) + S(0.5) * x * (S(1) - t * t) * gelu_k0<S> * (S(1) + S(3) * gelu_k1<S> * x * x);
    }
  }
}

/// dy ← dy · gelu'(x) in place (derivative from gelu_forward), and dbias += its
/// column sums. scratch: reduce_chunks·cols.
template <class S>
void gelu_backward(const S* derivative, S* dy, S* dbias, Index rows, Index cols, S* scratch) {
  const int chunks = chunk_count(rows);
#pragma omp parallel for schedule(static)
  for (int c = 0; c < chunks; ++c) {
    array_view<S> part(scratch + c * cols, cols);
    part.setZero();
    for (Index r = chunk_begin(rows, chunks, c); r < chunk_begin(rows, chunks, c + 1); ++r) {
      array_view<S> d(dy + r * cols, cols);
      d *= const_array_view<S>(derivative + r * cols, cols);
      part += d;
    }
  }
  add_partials(scratch, chunks, cols, dbias);
}

/// Adds the scope's wall time to one phase of a profile, if profiling is on.
class phase_timer {
 public:
  phase_timer(step_profile* profile, int phase) : profile_(profile), phase_(phase) {
    if (profile_) start_ = std::chrono::steady_clock::now();
  }
  ~phase_timer() { stop(); }
  /// Ends this phase and starts `next`.
  void next(int phase) {
    stop();
    phase_ = phase;
    if (profile_) start_ = std::chrono::steady_clock::now();
  }

 private:
  void stop() {
    if (profile_ && phase_ >= 0)
      profile_->seconds[phase_] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    phase_ = -1;
  }
  step_profile* profile_;
  int phase_;
  std::chrono::steady_clock::time_point start_;
};

using phase = step_profile::phase;

}  // namespace

const char* step_profile::name(int p) {
  static const char* const names[] = {"embedding", "layernorm", "dense GEMMs", "attention", "gelu", "loss"};
  return p >= 0 && p < phase_count ? names[p] : "?";
}

// ---------------------------------------------------------------------------

template <class S>
struct gpt<S>::workspace {
  struct layer_offsets {
    std::size_t ln1g, ln1b, wqkv, bqkv, wo, bo, ln2g, ln2b, w1, b1, w2, b2;
  };
  std::size_t wte = 0, wpe = 0, lnfg = 0, lnfb = 0, lm_head = 0;
  std::vector<layer_offsets> layers;

  // Capacity, and the shape of the batch currently held.
  Index cap_tokens = 0, cap_batch = 0;
  int threads = 0;
  int batch = 0, len = 0;

  // Activations kept for the backward pass (per layer, [N, ·] row-major).
  aligned_buffer<S> x;                   // (L+1)·N·C residual stream; x[L] feeds LNf
  aligned_buffer<S> ln1, ln2, atty, xm;  // L·N·C
  aligned_buffer<S> qkv;                 // L·N·3C
  aligned_buffer<S> hgrad, hact;         // L·N·4C: gelu'(pre-activation), gelu(pre-activation)
  aligned_buffer<S> att;                 // L·B·H·att_pair: what the backward pass's attention reads
  Index att_pair = 0;                    // T·T probabilities, or T log-sum-exps (fused kernels)
  aligned_buffer<S> ln1_stats, ln2_stats;  // L·N·2 (mean, rstd)
  aligned_buffer<S> lnf, lnf_stats;
  aligned_buffer<S> logits;              // N·V; holds dlogits after backward starts
  aligned_buffer<double> row_loss;       // N
  std::vector<std::int32_t> tokens;      // N inputs of the held batch

  // Backward scratch.
  aligned_buffer<S> dx, dln, dqkv, dh, datty;
  aligned_buffer<S> dprob;               // B·H·T·T (oneDNN's attention), ≥ threads·T·T (Eigen's tiles)
  aligned_buffer<S> dqkv_bias_part;      // B·3C: the QKV bias gradient, per sequence
  aligned_buffer<S> reduce;              // reduce_chunks · max(4C, V) ≥ LayerNorm's 3C
  aligned_buffer<S> wgrad;               // threads · max(4C·C, V·C): split weight gradients

  /// prob_pair, dprob_pair: the floats the attention kernels keep and use as scratch
  /// per (sequence, head) at full length (causal_attention), T·T each for Eigen's.
  void ensure(const model_shape& s, int want_batch, Index prob_pair, Index dprob_pair) {
    const Index tokens_needed = static_cast<Index>(want_batch) * s.context;
    const int t = omp_get_max_threads();
    if (tokens_needed <= cap_tokens && want_batch <= cap_batch && t <= threads) return;
    cap_batch = std::max<Index>(cap_batch, want_batch);
    cap_tokens = cap_batch * s.context;
    threads = std::max(threads, t);
    const Index n = cap_tokens, c = s.d_model, l = s.n_layer, tt = s.context;
    x.resize((l + 1) * n * c);
    ln1.resize(l * n * c);
    ln2.resize(l * n * c);
    atty.resize(l * n * c);
    xm.resize(l * n * c);
    qkv.resize(l * n * 3 * c);
    hgrad.resize(l * n * 4 * c);
    hact.resize(l * n * 4 * c);
    att_pair = prob_pair;
    att.resize(l * cap_batch * s.n_head * att_pair);
    ln1_stats.resize(l * n * 2);
    ln2_stats.resize(l * n * 2);
    lnf.resize(n * c);
    lnf_stats.resize(n * 2);
    logits.resize(n * s.vocab);
    row_loss.resize(n);
    tokens.resize(n);
    dx.resize(n * c);
    dln.resize(n * c);
    datty.resize(n * c);
    dqkv.resize(n * 3 * c);
    dh.resize(n * 4 * c);
    dprob.resize(std::max<Index>(threads * tt * tt, cap_batch * s.n_head * dprob_pair));
    dqkv_bias_part.resize(cap_batch * 3 * c);
    reduce.resize(reduce_chunks * std::max<Index>(4 * c, s.vocab));
    wgrad.resize(static_cast<Index>(threads) * std::max<Index>(4 * c, s.vocab) * c);
  }
};

const char* backend_name(dense_backend b) {
  switch (b) {
    case dense_backend::eigen: return "eigen";
    case dense_backend::fp32: return "onednn_fp32";
    case dense_backend::bf16: return "onednn_bf16";
  }
  return "?";
}

template <class S>
gpt<S>::gpt(const param_layout& layout, dense_backend backend)
    : layout_(layout),
      params_(layout.total_floats),
      grads_(layout.total_floats),
      ws_(std::make_unique<workspace>()) {
  if constexpr (std::is_same_v<S, float>) {
    if (backend == dense_backend::bf16) {
      if (auto k = dense_gemm::make(gemm_precision::bf16)) {
        kernels_ = std::move(*k);
        backend_ = dense_backend::bf16;
      } else {
        backend = dense_backend::fp32;  // no native bf16 here
      }
    }
    if (backend == dense_backend::fp32) {
      if (auto k = dense_gemm::make(gemm_precision::fp32)) {
        kernels_ = std::move(*k);
        backend_ = dense_backend::fp32;
      }
    }
    if (kernels_) {
      if (auto a = causal_attention::make()) attention_ = std::move(*a);
      gelu_avx512_ = detect_gemm_cpu().avx512();  // as the fused attention: ONEDNN_MAX_CPU_ISA caps it
    }
  }
  auto at = [&](const std::string& name) {
    const tensor_spec* t = layout_.find(name);
    ARCHIPELAGO_INVARIANT(t != nullptr, "gpt: every tensor of the shape is in its layout");
    return t->offset;
  };
  ws_->wte = at("wte");
  ws_->wpe = at("wpe");
  ws_->lnfg = at("lnf.g");
  ws_->lnfb = at("lnf.b");
  if (!layout_.shape.tied) ws_->lm_head = at("lm_head");
  for (int l = 0; l < layout_.shape.n_layer; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    ws_->layers.push_back({at(p + "ln1.g"), at(p + "ln1.b"), at(p + "attn.wqkv"),
                           at(p + "attn.bqkv"), at(p + "attn.wo"), at(p + "attn.bo"),
                           at(p + "ln2.g"), at(p + "ln2.b"), at(p + "mlp.w1"), at(p + "mlp.b1"),
                           at(p + "mlp.w2"), at(p + "mlp.b2")});
  }
}

template <class S>
gpt<S>::~gpt() = default;

template <class S>
const char* gpt<S>::attention_kernel() const {
  return attention_ ? attention_->kernel(layout_.shape.context, layout_.shape.head_dim()) : "eigen per head";
}

template <class S>
void gpt<S>::init(std::uint64_t seed) {
  params_.zero();
  const double residual_scale = 1.0 / std::sqrt(2.0 * layout_.shape.n_layer);
  for (std::size_t i = 0; i < layout_.tensors.size(); ++i) {
    const tensor_spec& t = layout_.tensors[i];
    S* p = params_.data() + t.offset;
    const bool is_gain = t.name.ends_with(".g");
    if (t.kind == tensor_kind::vector) {
      std::fill(p, p + t.size(), is_gain ? S(1) : S(0));
      continue;
    }
    const bool residual = t.name.ends_with("attn.wo") || t.name.ends_with("mlp.w2");
    const double stddev = 0.02 * (residual ? residual_scale : 1.0);
    prng rng(derive_seed(seed, i));
    for (std::size_t k = 0; k < t.size(); ++k) p[k] = static_cast<S>(stddev * rng.normal());
  }
}

template <class S>
void gpt<S>::forward(const std::int32_t* inputs, int batch, int len) {
  const model_shape& s = layout_.shape;
  ARCHIPELAGO_INVARIANT(len >= 1 && len <= s.context && batch >= 1, "gpt forward: 1 <= len <= context, batch >= 1");
  workspace& w = *ws_;
  const Index pair = Index{s.context} * s.context;  // Eigen's T×T per (sequence, head)
  w.ensure(s, batch, attention_ ? attention_->prob_floats(s.context, s.head_dim()) : pair,
           attention_ ? attention_->dprob_floats(s.context, s.head_dim()) : pair);
  w.batch = batch;
  w.len = len;
  const Index n = static_cast<Index>(batch) * len, c = s.d_model, v = s.vocab, h = s.n_head,
              hd = s.head_dim();
  const S* p = params_.data();
  dense_gemm* kern = kernels_.get();
  std::copy(inputs, inputs + n, w.tokens.begin());
  phase_timer timer(profile_, phase::embedding);

  // Embeddings.
  {
    S* x0 = w.x.data();
#pragma omp parallel for schedule(static)
    for (Index r = 0; r < n; ++r) {
      const std::int32_t tok = inputs[r];
      ARCHIPELAGO_INVARIANT(tok >= 0 && tok < v, "gpt forward: input token within the vocabulary");
      array_view<S>(x0 + r * c, c) = const_array_view<S>(p + w.wte + tok * c, c) +
                                     const_array_view<S>(p + w.wpe + (r % len) * c, c);
    }
  }

  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  const bool full_length_attention = attention_ && len == s.context;
  for (int l = 0; l < s.n_layer; ++l) {
    const auto& o = w.layers[l];
    S* xl = w.x.data() + l * n * c;
    S* ln1 = w.ln1.data() + l * n * c;
    S* qkv = w.qkv.data() + l * n * 3 * c;
    S* att = w.att.data() + l * w.cap_batch * h * w.att_pair;
    S* atty = w.atty.data() + l * n * c;
    S* xm = w.xm.data() + l * n * c;
    S* ln2 = w.ln2.data() + l * n * c;
    S* hgrad = w.hgrad.data() + l * n * 4 * c;
    S* hact = w.hact.data() + l * n * 4 * c;
    S* xnext = w.x.data() + (l + 1) * n * c;

    // Every GEMM below writes its output with beta 0; the bias (and the
    // residual) is added by the next pass over that output.
    timer.next(phase::layernorm);
    // x_l = xm_{l-1} + b2_{l-1} + (the MLP's output, in x_l); x_0 is the embedding as is.
    const S* residual = l > 0 ? w.xm.data() + (l - 1) * n * c : nullptr;
    const S* residual_bias = l > 0 ? p + w.layers[l - 1].b2 : nullptr;
    layernorm_forward(xl, residual, residual_bias, ln1, w.ln1_stats.data() + l * n * 2, p + o.ln1g, p + o.ln1b, n, c);
    timer.next(phase::dense);
    dense(kern, false, false, n, 3 * c, c, static_cast<const S*>(ln1), c, p + o.wqkv, 3 * c, qkv, 3 * c);

    // Causal self-attention: oneDNN's over the whole batch (training and
    // evaluation windows), else one (sequence, head) pair per task, which adds the
    // QKV bias to its own slice first.
    timer.next(phase::attention);
    if (full_length_attention) {
      if constexpr (std::is_same_v<S, float>)
        attention_->forward(batch, len, static_cast<int>(h), static_cast<int>(hd), scale, p + o.bqkv, qkv, att, atty);
    } else {
#pragma omp parallel for schedule(static)
      for (Index bh = 0; bh < batch * h; ++bh) {
        const Index b = bh / h, hh = bh % h;
        S* base = qkv + b * len * 3 * c + hh * hd;
        auto q = view(base, len, hd, 3 * c);
        auto k = view(base + c, len, hd, 3 * c);
        auto vv = view(base + 2 * c, len, hd, 3 * c);
        q.rowwise() += const_row_view<S>(p + o.bqkv + hh * hd, hd);
        k.rowwise() += const_row_view<S>(p + o.bqkv + c + hh * hd, hd);
        vv.rowwise() += const_row_view<S>(p + o.bqkv + 2 * c + hh * hd, hd);
        // With the kernels, only full-length batches reach the backward pass, so a
        // shorter one (evaluation, sampling) keeps its probabilities in a thread's tile.
        S* prob_at = attention_ ? w.dprob.data() + omp_get_thread_num() * len * len : att + bh * len * len;
        auto prob = view(prob_at, len, len);
        auto y = view(atty + b * len * c + hh * hd, len, hd, c);
        // Causal: row block [r0, r1) only needs keys and values [0, r1).
        for (Index r0 = 0; r0 < len; r0 += attention_row_block) {
          const Index r1 = std::min<Index>(len, r0 + attention_row_block), rl = r1 - r0;
          prob.block(r0, 0, rl, r1).noalias() = q.middleRows(r0, rl) * k.topRows(r1).transpose();
          for (Index i = r0; i < r1; ++i) {
            auto row = prob.row(i).head(i + 1).array();
            const S mx = row.maxCoeff();
            row = ((row - mx) * scale).exp();
            row *= S(1) / row.sum();
            // Only the block's columns [0, r1) are ever read; zero the rest of the diagonal block.
            prob.row(i).segment(i + 1, r1 - i - 1).setZero();
          }
          y.middleRows(r0, rl).noalias() = prob.block(r0, 0, rl, r1) * vv.topRows(r1);
        }
      }
    }

    timer.next(phase::dense);
    dense(kern, false, false, n, c, c, static_cast<const S*>(atty), c, p + o.wo, c, xm, c);

    timer.next(phase::layernorm);  // xm = x_l + bo + (the projection, in xm)
    layernorm_forward(xm, static_cast<const S*>(xl), p + o.bo, ln2, w.ln2_stats.data() + l * n * 2, p + o.ln2g,
                      p + o.ln2b, n, c);
    timer.next(phase::dense);
    dense(kern, false, false, n, 4 * c, c, static_cast<const S*>(ln2), c, p + o.w1, 4 * c, hgrad, 4 * c);
    timer.next(phase::gelu);
    gelu_forward(hgrad, p + o.b1, hact, n, 4 * c, gelu_avx512_);
    timer.next(phase::dense);
    dense(kern, false, false, n, c, 4 * c, static_cast<const S*>(hact), 4 * c, p + o.w2, c, xnext, c);
  }

  timer.next(phase::layernorm);
  const int last = s.n_layer - 1;
  layernorm_forward(w.x.data() + s.n_layer * n * c, w.xm.data() + last * n * c, p + w.layers[last].b2,
                    w.lnf.data(), w.lnf_stats.data(), p + w.lnfg, p + w.lnfb, n, c);
  timer.next(phase::dense);
  const S* lnf = w.lnf.data();
  if (s.tied) dense(kern, false, true, n, v, c, lnf, c, p + w.wte, c, w.logits.data(), v);
  else dense(kern, false, false, n, v, c, lnf, c, p + w.lm_head, v, w.logits.data(), v);
}

template <class S>
double gpt<S>::forward_backward(const std::int32_t* inputs, const std::int32_t* targets,
                                int batch) {
  const model_shape& s = layout_.shape;
  const int len = s.context;
  forward(inputs, batch, len);
  workspace& w = *ws_;
  const Index n = static_cast<Index>(batch) * len, c = s.d_model, v = s.vocab, h = s.n_head,
              hd = s.head_dim();
  const S* p = params_.data();
  dense_gemm* kern = kernels_.get();
  S* g = grads_.data();
  phase_timer timer(profile_, phase::loss);
  grads_.zero();

  // Softmax cross-entropy; logits become dlogits = (softmax − onehot) / N.
  const S inv_n = S(1) / static_cast<S>(n);
#pragma omp parallel for schedule(static)
  for (Index r = 0; r < n; ++r) {
    array_view<S> z(w.logits.data() + r * v, v);
    const S mx = z.maxCoeff();
    z = (z - mx).exp();
    const S sum = z.sum();
    const std::int32_t t = targets[r];
    ARCHIPELAGO_INVARIANT(t >= 0 && t < v, "gpt loss: target token within the vocabulary");
    w.row_loss[r] = std::log(static_cast<double>(sum)) - std::log(static_cast<double>(z[t]));
    z *= inv_n / sum;
    z[t] -= inv_n;
  }
  double loss = 0;
  for (Index r = 0; r < n; ++r) loss += w.row_loss[r];
  loss /= static_cast<double>(n);

  // Unembedding.
  timer.next(phase::dense);
  const S* dlogits = w.logits.data();
  const S* lnf = w.lnf.data();
  if (s.tied) {
    weight_grad(kern, dlogits, v, lnf, c, n, g + w.wte, w.wgrad.data());
    dense(kern, false, false, n, c, v, dlogits, v, p + w.wte, c, w.dln.data(), c);
  } else {
    weight_grad(kern, lnf, c, dlogits, v, n, g + w.lm_head, w.wgrad.data());
    dense(kern, false, true, n, c, v, dlogits, v, p + w.lm_head, v, w.dln.data(), c);
  }
  // Each LayerNorm backward also sums the residual stream's gradient it leaves
  // in dx: the gradient of the bias added to the stream there (b2, bo).
  timer.next(phase::layernorm);
  w.dx.zero();
  layernorm_backward(static_cast<const S*>(w.dln.data()), w.x.data() + s.n_layer * n * c,
                     w.lnf_stats.data(), p + w.lnfg, w.dx.data(), g + w.lnfg, g + w.lnfb,
                     g + w.layers[s.n_layer - 1].b2, n, c, w.reduce.data());

  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  for (int l = s.n_layer - 1; l >= 0; --l) {
    const auto& o = w.layers[l];
    const S* xl = w.x.data() + l * n * c;
    const S* ln1 = w.ln1.data() + l * n * c;
    const S* qkv = w.qkv.data() + l * n * 3 * c;
    const S* att = w.att.data() + l * w.cap_batch * h * w.att_pair;
    const S* atty = w.atty.data() + l * n * c;
    const S* xm = w.xm.data() + l * n * c;
    const S* ln2 = w.ln2.data() + l * n * c;
    const S* hgrad = w.hgrad.data() + l * n * 4 * c;
    const S* hact = w.hact.data() + l * n * 4 * c;

    // MLP: dx holds d(x_{l+1}).
    timer.next(phase::dense);
    dense(kern, false, true, n, 4 * c, c, static_cast<const S*>(w.dx.data()), c, p + o.w2, c, w.dh.data(),
          4 * c);
    weight_grad(kern, hact, 4 * c, static_cast<const S*>(w.dx.data()), c, n, g + o.w2, w.wgrad.data());
    timer.next(phase::gelu);
    gelu_backward(hgrad, w.dh.data(), g + o.b1, n, 4 * c, w.reduce.data());
    timer.next(phase::dense);
    const S* dh = w.dh.data();
    weight_grad(kern, ln2, c, dh, 4 * c, n, g + o.w1, w.wgrad.data());
    dense(kern, false, true, n, c, 4 * c, dh, 4 * c, p + o.w1, 4 * c, w.dln.data(), c);
    timer.next(phase::layernorm);
    layernorm_backward(static_cast<const S*>(w.dln.data()), xm, w.ln2_stats.data() + l * n * 2,
                       p + o.ln2g, w.dx.data(), g + o.ln2g, g + o.ln2b, g + o.bo, n, c, w.reduce.data());

    // Attention: dx now holds d(xm).
    timer.next(phase::dense);
    dense(kern, false, true, n, c, c, static_cast<const S*>(w.dx.data()), c, p + o.wo, c, w.datty.data(), c);
    weight_grad(kern, atty, c, static_cast<const S*>(w.dx.data()), c, n, g + o.wo, w.wgrad.data());
    timer.next(phase::attention);

    S* dqkv = w.dqkv.data();
    S* bias_part = w.dqkv_bias_part.data();  // the QKV bias gradient, per sequence
    if (attention_) {
      if constexpr (std::is_same_v<S, float>)
        attention_->backward(batch, len, static_cast<int>(h), static_cast<int>(hd), scale, qkv, att,
                             w.datty.data(), w.dprob.data(), dqkv, bias_part);
    } else {
#pragma omp parallel for schedule(static)
      for (Index bh = 0; bh < batch * h; ++bh) {
        const Index b = bh / h, hh = bh % h;
        const Index at_base = b * len * 3 * c + hh * hd;
        auto q = view(qkv + at_base, len, hd, 3 * c);
        auto k = view(qkv + at_base + c, len, hd, 3 * c);
        auto vv = view(qkv + at_base + 2 * c, len, hd, 3 * c);
        auto prob = view(att + bh * len * len, len, len);
        auto dy = view(static_cast<const S*>(w.datty.data()) + b * len * c + hh * hd, len, hd, c);
        auto dq = view(dqkv + at_base, len, hd, 3 * c);
        auto dk = view(dqkv + at_base + c, len, hd, 3 * c);
        auto dv = view(dqkv + at_base + 2 * c, len, hd, 3 * c);
        auto dprob = view(w.dprob.data() + omp_get_thread_num() * len * len, len, len);

        // Row blocks as in the forward pass; entries above the diagonal are zero.
        for (Index r0 = 0; r0 < len; r0 += attention_row_block) {
          const Index r1 = std::min<Index>(len, r0 + attention_row_block), rl = r1 - r0;
          dprob.block(r0, 0, rl, r1).noalias() = dy.middleRows(r0, rl) * vv.topRows(r1).transpose();
          // Softmax backward; the scale of the scores folds in here.
          for (Index i = r0; i < r1; ++i) {
            auto d = dprob.row(i).head(i + 1).array();
            const auto pr = prob.row(i).head(i + 1).array();
            const S dot = (d * pr).sum();
            d = pr * (d - dot) * scale;
            dprob.row(i).segment(i + 1, r1 - i - 1).setZero();
          }
          dq.middleRows(r0, rl).noalias() = dprob.block(r0, 0, rl, r1) * k.topRows(r1);
        }
        // Keys and values of block [c0, c1) are seen by query rows [c0, len).
        for (Index c0 = 0; c0 < len; c0 += attention_row_block) {
          const Index cl = std::min<Index>(len, c0 + attention_row_block) - c0;
          dv.middleRows(c0, cl).noalias() = prob.block(c0, c0, len - c0, cl).transpose() * dy.bottomRows(len - c0);
          dk.middleRows(c0, cl).noalias() = dprob.block(c0, c0, len - c0, cl).transpose() * q.bottomRows(len - c0);
        }
      }
#pragma omp parallel for schedule(static)
      for (Index b = 0; b < batch; ++b)
        row_view<S>(bias_part + b * 3 * c, 3 * c) = view(static_cast<const S*>(dqkv) + b * len * 3 * c, len, 3 * c).colwise().sum();
    }
    // The per-sequence sums added in sequence order.
    add_partials(static_cast<const S*>(bias_part), batch, 3 * c, g + o.bqkv);
    timer.next(phase::dense);
    weight_grad(kern, ln1, c, static_cast<const S*>(dqkv), 3 * c, n, g + o.wqkv, w.wgrad.data());
    dense(kern, false, true, n, c, 3 * c, static_cast<const S*>(dqkv), 3 * c, p + o.wqkv, 3 * c, w.dln.data(),
          c);
    timer.next(phase::layernorm);
    layernorm_backward(static_cast<const S*>(w.dln.data()), xl, w.ln1_stats.data() + l * n * 2, p + o.ln1g,
                       w.dx.data(), g + o.ln1g, g + o.ln1b, l > 0 ? g + w.layers[l - 1].b2 : nullptr, n, c,
                       w.reduce.data());
  }

  // Embeddings: dx holds d(x_0).
  timer.next(phase::embedding);
  {
    S* dwpe = g + w.wpe;
    const S* d = w.dx.data();
#pragma omp parallel for schedule(static)
    for (Index t = 0; t < len; ++t) {
      array_view<S> out(dwpe + t * c, c);
      for (Index b = 0; b < batch; ++b) out += const_array_view<S>(d + (b * len + t) * c, c);
    }
    // Each task owns a range of vocabulary rows and scans every token in order,
    // so the scatter has no races and a fixed summation order.
    S* dwte = g + w.wte;
    constexpr int vocab_chunks = 16;
#pragma omp parallel for schedule(static)
    for (int chunk = 0; chunk < vocab_chunks; ++chunk) {
      const std::int32_t lo = static_cast<std::int32_t>(v * chunk / vocab_chunks);
      const std::int32_t hi = static_cast<std::int32_t>(v * (chunk + 1) / vocab_chunks);
      for (Index r = 0; r < n; ++r) {
        const std::int32_t tok = w.tokens[r];
        if (tok >= lo && tok < hi) array_view<S>(dwte + tok * c, c) += const_array_view<S>(d + r * c, c);
      }
    }
  }
  return loss;
}

template <class S>
void gpt<S>::forward_scored(const std::int32_t* inputs, const std::int32_t* targets, int batch,
                            int len, const int* first_scored, double& loss_sum,
                            std::int64_t& scored) {
  forward(inputs, batch, len);
  workspace& w = *ws_;
  const Index v = layout_.shape.vocab, n = static_cast<Index>(batch) * len;
#pragma omp parallel for schedule(static)
  for (Index r = 0; r < n; ++r) {
    if (r % len < first_scored[r / len]) {
      w.row_loss[r] = 0;
      continue;
    }
    const_array_view<S> z(w.logits.data() + r * v, v);
    const S mx = z.maxCoeff();
    const double lse = std::log(static_cast<double>((z - mx).exp().sum())) + mx;
    w.row_loss[r] = lse - static_cast<double>(z[targets[r]]);
  }
  for (Index r = 0; r < n; ++r) {
    if (r % len < first_scored[r / len]) continue;
    loss_sum += w.row_loss[r];
    ++scored;
  }
}

template <class S>
void gpt<S>::next_logits(const std::int32_t* tokens, int len, S* logits_out) {
  forward(tokens, 1, len);
  const S* row = ws_->logits.data() + static_cast<Index>(len - 1) * layout_.shape.vocab;
  std::copy(row, row + layout_.shape.vocab, logits_out);
}

template <class S>
double gpt<S>::flops_per_step(int batch) const {
  const model_shape& s = layout_.shape;
  const double c = s.d_model, t = s.context, tokens = static_cast<double>(batch) * t;
  // Attention counts only the causal half of QKᵀ and PV (a query at position i
  // needs i + 1 keys), the work any implementation must do.
  const double per_token_layer = 2.0 * (3 * c * c + c * c + 8 * c * c) + 2.0 * 2.0 * (t + 1) / 2 * c;
  const double per_token = s.n_layer * per_token_layer + 2.0 * c * s.vocab;
  return 3.0 * per_token * tokens;
}

template class gpt<float>;
template class gpt<double>;

}  // namespace archipelago
