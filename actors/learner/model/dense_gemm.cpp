#include "learner/model/dense_gemm.hpp"

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <tuple>

#include "core/aligned_buffer.hpp"
#include "core/invariant.hpp"
#include "learner/model/attention_avx512.hpp"

namespace archipelago {
namespace {

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

bool has_isa(dnnl_cpu_isa_t have, dnnl_cpu_isa_t want) {
  return (static_cast<unsigned>(have) & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

inline std::uint16_t to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  // NaN stays a (quiet) NaN; everything else rounds to nearest, ties to even.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// rows×cols of `in` (leading dimension ld) into a dense rows×cols bf16 block.
void pack_bf16(const float* in, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::uint16_t* out) {
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* src = in + r * ld;
    std::uint16_t* dst = out + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) dst[c] = to_bf16(src[c]);
  }
}

/// out[k×n] = in[n×k]ᵀ (in's rows ld apart), in tiles that stay in L1.
void transpose(const float* in, std::int64_t n, std::int64_t k, std::int64_t ld, float* out) {
  constexpr std::int64_t tile = 32;
#pragma omp parallel for schedule(static) collapse(2)
  for (std::int64_t r0 = 0; r0 < n; r0 += tile)
    for (std::int64_t c0 = 0; c0 < k; c0 += tile) {
      const std::int64_t r1 = std::min(n, r0 + tile), c1 = std::min(k, c0 + tile);
      for (std::int64_t col = c0; col < c1; ++col)
        for (std::int64_t r = r0; r < r1; ++r) out[col * n + r] = in[r * ld + col];
    }
}

/// A built oneDNN matmul and its descriptor (which gives the memory descriptors to run it with).
struct matmul_op {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

}  // namespace

const char* precision_name(gemm_precision p) { return p == gemm_precision::bf16 ? "bf16" : "fp32"; }

void round_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

float bf16_to_float(std::uint16_t v) { return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16); }

gemm_cpu detect_gemm_cpu() {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return gemm_cpu{isa_name(isa), has_isa(isa, dnnl_cpu_isa_avx512_core_bf16), false,
                  has_isa(isa, dnnl_cpu_isa_avx512_core_amx)};
}

expected<gemm_precision> resolve_precision(std::string_view knob, const gemm_cpu& cpu, std::string& note) {
  note.clear();
  if (knob == "fp32") return gemm_precision::fp32;
  if (knob == "auto") {
    const bool faster = cpu.bf16 && (cpu.amx || cpu.bf16_faster);
    if (cpu.bf16 && !faster)
      note = "train.precision = auto: this CPU's native bf16 dot products run slower than its fp32 FMAs "
             "(measured peaks) and it has no AMX; running fp32";
    return faster ? gemm_precision::bf16 : gemm_precision::fp32;
  }
  if (knob == "bf16") {
    if (cpu.bf16) return gemm_precision::bf16;
    note = "train.precision = bf16: this CPU (oneDNN ISA " + cpu.isa +
           ") has no native bf16 (AVX512_BF16 or AMX); running fp32";
    return gemm_precision::fp32;
  }
  return make_error(errc::invalid_input,
                    "train.precision: unknown precision '" + std::string(knob) + "' (fp32, bf16 or auto)");
}

struct dense_gemm::impl {
  // One matmul per shape: (trans_a, trans_b, m, n, k, accumulate, ldc).
  using key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, bool, std::int64_t>;
  static constexpr std::size_t primitives_max = 64;

  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<key, matmul_op> primitives;
  aligned_buffer<std::uint16_t> a16, b16;
  aligned_buffer<float> bt;  // B transposed for the fp32 NN layout

  /// The bf16 matmul of this shape (op(A) and op(B) packed dense, in their stored layout).
  matmul_op& primitive(const key& k) {
    if (auto it = primitives.find(k); it != primitives.end()) return it->second;
    if (primitives.size() >= primitives_max) primitives.clear();
    const auto [ta, tb, m, n, kk, accumulate, ldc] = k;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc a_md({m, kk}, dt::bf16, ta ? dnnl::memory::dims{1, m} : dnnl::memory::dims{kk, 1});
    const dnnl::memory::desc b_md({kk, n}, dt::bf16, tb ? dnnl::memory::dims{1, kk} : dnnl::memory::dims{n, 1});
    const dnnl::memory::desc c_md({m, n}, dt::f32, dnnl::memory::dims{ldc, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
    return primitives.emplace(k, matmul_op{pd, dnnl::matmul(pd)}).first->second;
  }

  template <class T>
  static void ensure(aligned_buffer<T>& buf, std::int64_t count) {
    if (buf.size() < static_cast<std::size_t>(count)) buf.resize(static_cast<std::size_t>(count));
  }
};

dense_gemm::dense_gemm(gemm_precision precision, std::unique_ptr<impl> state)
    : precision_(precision), impl_(std::move(state)) {}

dense_gemm::~dense_gemm() = default;

expected<std::unique_ptr<dense_gemm>> dense_gemm::make(gemm_precision precision) {
  try {
    auto state = std::make_unique<impl>();
    if (precision == gemm_precision::bf16) {
      if (!detect_gemm_cpu().bf16)
        return make_error(errc::unsupported, "bf16 GEMMs need AVX512_BF16 or AMX (oneDNN ISA " +
                                                 detect_gemm_cpu().isa + ")");
      state->primitive({false, false, 16, 16, 16, false, 16});  // oneDNN builds a bf16 matmul here
    }
    return std::unique_ptr<dense_gemm>(new dense_gemm(precision, std::move(state)));
  } catch (const dnnl::error& e) {
    return make_error(errc::unsupported, std::string("oneDNN: ") + e.what());
  }
}

void dense_gemm::run(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                     std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  ARCHIPELAGO_INVARIANT(beta == 0.0f || beta == 1.0f, "dense_gemm: beta is 0 or 1");
  if (m == 0 || n == 0) return;
  impl& st = *impl_;
  if (precision_ == gemm_precision::fp32 || k == 0) {
    // B stored [n×k] with n ≤ k (an input gradient dY·Wᵀ, W no taller than wide) goes in
    // transposed: oneDNN's sgemm runs the NN layout up to a fifth faster there (mini's MLP
    // input gradient on an AMD EPYC: 22.4 ms with the copy against 27.2), and the product is
    // the same bit for bit.
    if (trans_b && n <= k) {
      impl::ensure(st.bt, n * k);
      transpose(b, n, k, ldb, st.bt.data());
      b = st.bt.data();
      ldb = n;
      trans_b = false;
    }
    const dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                                       beta, c, ldc);
    ARCHIPELAGO_INVARIANT(s == dnnl_success, "dense_gemm: oneDNN sgemm accepts its arguments");
    (void)s;
    return;
  }
  // Stored layouts: A is [m×k] or, transposed, [k×m]; B is [k×n] or [n×k].
  const std::int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const std::int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  impl::ensure(st.a16, a_rows * a_cols);
  impl::ensure(st.b16, b_rows * b_cols);
  pack_bf16(a, a_rows, a_cols, lda, st.a16.data());
  pack_bf16(b, b_rows, b_cols, ldb, st.b16.data());
  try {
    matmul_op& mm = st.primitive({trans_a, trans_b, m, n, k, beta != 0.0f, ldc});
    dnnl::memory am(mm.pd.src_desc(), st.engine, st.a16.data());
    dnnl::memory bm(mm.pd.weights_desc(), st.engine, st.b16.data());
    dnnl::memory cm(mm.pd.dst_desc(), st.engine, c);
    mm.prim.execute(st.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    st.stream.wait();
  } catch (const dnnl::error&) {
    // A shape oneDNN has no bf16 matmul for (make()'s probe makes this unlikely): this call runs fp32.
    ++fp32_fallbacks_;
    const dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                                       beta, c, ldc);
    ARCHIPELAGO_INVARIANT(s == dnnl_success, "dense_gemm: oneDNN sgemm accepts its arguments");
    (void)s;
  }
}

// ---------------------------------------------------------------------------

struct causal_attention::impl {
  // One set of primitives per (batch, len, heads, head_dim, scale).
  using key = std::tuple<int, int, int, int, float>;
  static constexpr std::size_t shapes_max = 8;

  using op = matmul_op;
  struct shape {
    op scores, values;                 // S = scale·Q·Kᵀ; Y = P·V
    op dprob, dq, dk, dv;              // dP = dY·Vᵀ; dQ = scale·dS·K; dK = scale·dSᵀ·Q; dV = Pᵀ·dY
    dnnl::softmax_forward softmax;
    dnnl::softmax_backward softmax_grad;
    dnnl::memory::desc prob_md;
  };

  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<key, shape> shapes;
  // The fused AVX-512 kernels where oneDNN itself dispatches to AVX-512, so that
  // ONEDNN_MAX_CPU_ISA=AVX2 shows the whole AVX2-only path.
  bool avx512 = detect_gemm_cpu().avx512();

  aligned_buffer<float> fused_scratch;  // the fused kernels' transposed heads

  bool fused(int len, int head_dim) const { return avx512 && fused_attention_fits(len, head_dim); }
  float* scratch(int len, int head_dim) {
    const auto need = static_cast<std::size_t>(fused_attention_scratch(omp_get_max_threads(), len, head_dim));
    if (fused_scratch.size() < need) fused_scratch.resize(need);
    return fused_scratch.data();
  }

  shape& at(int batch, int len, int heads, int head_dim, float scale) {
    const key k{batch, len, heads, head_dim, scale};
    if (auto it = shapes.find(k); it != shapes.end()) return it->second;
    if (shapes.size() >= shapes_max) shapes.clear();
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dnnl::memory::dim b = batch, t = len, h = heads, d = head_dim, c = h * d;
    auto md = [](dims shape_dims, dims strides) { return dnnl::memory::desc(shape_dims, dt::f32, strides); };
    // Views of one head of every sequence, as [B, H, ·, ·] with strides into the row-major buffers.
    const auto q = md({b, h, t, d}, {t * 3 * c, d, 3 * c, 1});      // Q, K, V or their gradients
    const auto kt = md({b, h, d, t}, {t * 3 * c, d, 1, 3 * c});     // Kᵀ, Vᵀ
    const auto y = md({b, h, t, d}, {t * c, d, c, 1});              // Y, dY
    const auto p = md({b, h, t, t}, {h * t * t, t * t, t, 1});      // P, dP, dS
    const auto pt = md({b, h, t, t}, {h * t * t, t * t, 1, t});     // Pᵀ, dSᵀ
    auto matmul = [&](const dnnl::memory::desc& src, const dnnl::memory::desc& weights, const dnnl::memory::desc& dst,
                      float out_scale) {
      dnnl::primitive_attr attr;
      if (out_scale != 1.0f) attr.set_output_scales(0, {out_scale});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, weights, dst), attr, engine);
      return op{pd, dnnl::matmul(pd)};
    };
    const dnnl::softmax_forward::primitive_desc sf(
        dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, p, 3), engine);
    const dnnl::softmax_backward::primitive_desc sb(dnnl::softmax_backward::desc(p, p, 3), engine, sf);
    shape s{matmul(q, kt, p, scale), matmul(p, q, y, 1.0f),   matmul(y, kt, p, 1.0f),
            matmul(p, q, q, scale),  matmul(pt, q, q, scale), matmul(pt, y, q, 1.0f),
            dnnl::softmax_forward(sf), dnnl::softmax_backward(sb), p};
    return shapes.emplace(k, std::move(s)).first->second;
  }

  void run(op& o, const float* src, const float* weights, float* dst) {
    dnnl::memory sm(o.pd.src_desc(), engine, const_cast<float*>(src));
    dnnl::memory wm(o.pd.weights_desc(), engine, const_cast<float*>(weights));
    dnnl::memory dm(o.pd.dst_desc(), engine, dst);
    o.prim.execute(stream, {{DNNL_ARG_SRC, sm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dm}});
  }
};

causal_attention::causal_attention(std::unique_ptr<impl> state) : impl_(std::move(state)) {}
causal_attention::~causal_attention() = default;

expected<std::unique_ptr<causal_attention>> causal_attention::make() {
  try {
    auto state = std::make_unique<impl>();
    state->at(1, 4, 1, 4, 0.5f);  // oneDNN builds these primitives here, or says why not
    state->shapes.clear();
    return std::unique_ptr<causal_attention>(new causal_attention(std::move(state)));
  } catch (const dnnl::error& e) {
    return make_error(errc::unsupported, std::string("oneDNN attention: ") + e.what());
  }
}

const char* causal_attention::kernel(int len, int head_dim) const {
  return impl_->fused(len, head_dim) ? "fused avx512" : "onednn batched";
}

long causal_attention::prob_floats(int len, int head_dim) const {
  return impl_->fused(len, head_dim) ? long{len} : long{len} * len;
}

long causal_attention::dprob_floats(int len, int head_dim) const {
  return impl_->fused(len, head_dim) ? 0 : long{len} * len;
}

void causal_attention::forward(int batch, int len, int heads, int head_dim, float scale, const float* qkv_bias,
                               float* qkv, float* prob, float* y) {
  impl& st = *impl_;
  if (st.fused(len, head_dim))
    return fused_attention_forward(batch, len, heads, head_dim, scale, qkv_bias, qkv, prob, y,
                                   st.scratch(len, head_dim));
  impl::shape& s = st.at(batch, len, heads, head_dim, scale);
  const std::int64_t c = std::int64_t{heads} * head_dim, rows = std::int64_t{batch} * heads * len;
  const std::int64_t tokens = std::int64_t{batch} * len;
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < tokens; ++r)
    for (std::int64_t j = 0; j < 3 * c; ++j) qkv[r * 3 * c + j] += qkv_bias[j];
  st.run(s.scores, qkv, qkv + c, prob);
  st.stream.wait();
  // Causal mask: query i sees keys 0..i.
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % len;
    std::fill(prob + r * len + i + 1, prob + (r + 1) * len, -std::numeric_limits<float>::infinity());
  }
  dnnl::memory pm(s.prob_md, st.engine, prob);
  s.softmax.execute(st.stream, {{DNNL_ARG_SRC, pm}, {DNNL_ARG_DST, pm}});
  st.run(s.values, prob, qkv + 2 * c, y);
  st.stream.wait();
}

void causal_attention::backward(int batch, int len, int heads, int head_dim, float scale, const float* qkv,
                                const float* prob, const float* dy, float* dprob, float* dqkv,
                                float* dqkv_bias_part) {
  impl& st = *impl_;
  if (st.fused(len, head_dim))
    return fused_attention_backward(batch, len, heads, head_dim, scale, qkv, prob, dy, dqkv, dqkv_bias_part,
                                    st.scratch(len, head_dim));
  impl::shape& s = st.at(batch, len, heads, head_dim, scale);
  const std::int64_t c = std::int64_t{heads} * head_dim;
  st.run(s.dprob, dy, qkv + 2 * c, dprob);
  // dS = P ⊙ (dP − rowsum(dP ⊙ P)), in place; the score scale folds into dQ and dK.
  dnnl::memory pm(s.prob_md, st.engine, const_cast<float*>(prob)), dm(s.prob_md, st.engine, dprob);
  s.softmax_grad.execute(st.stream, {{DNNL_ARG_DST, pm}, {DNNL_ARG_DIFF_DST, dm}, {DNNL_ARG_DIFF_SRC, dm}});
  st.run(s.dq, dprob, qkv + c, dqkv);
  st.run(s.dk, dprob, qkv, dqkv + c);
  st.run(s.dv, prob, dy, dqkv + 2 * c);
  st.stream.wait();
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < batch; ++b) {
    float* part = dqkv_bias_part + b * 3 * c;
    std::fill(part, part + 3 * c, 0.0f);
    for (std::int64_t r = b * len; r < (b + 1) * len; ++r)
      for (std::int64_t j = 0; j < 3 * c; ++j) part[j] += dqkv[r * 3 * c + j];
  }
}

}  // namespace archipelago
