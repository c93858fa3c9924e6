#include "learner/model/dense_gemm.hpp"

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <bit>
#include <cassert>
#include <map>
#include <tuple>

#include "core/aligned_buffer.hpp"

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

}  // namespace

const char* precision_name(gemm_precision p) { return p == gemm_precision::bf16 ? "bf16" : "fp32"; }

void round_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

float bf16_to_float(std::uint16_t v) { return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16); }

gemm_cpu detect_gemm_cpu() {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return gemm_cpu{isa_name(isa), has_isa(isa, dnnl_cpu_isa_avx512_core_bf16)};
}

expected<gemm_precision> resolve_precision(std::string_view knob, const gemm_cpu& cpu, std::string& note) {
  note.clear();
  if (knob == "fp32") return gemm_precision::fp32;
  if (knob == "auto") {
    if (cpu.bf16 && !cpu.bf16_faster)
      note = "train.precision = auto: this CPU's native bf16 dot products run slower than its fp32 FMAs "
             "(measured peaks); running fp32";
    return cpu.bf16 && cpu.bf16_faster ? gemm_precision::bf16 : gemm_precision::fp32;
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
  struct matmul_entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
  };
  std::map<key, matmul_entry> primitives;
  aligned_buffer<std::uint16_t> a16, b16;

  /// The bf16 matmul of this shape (op(A) and op(B) packed dense, in their stored layout).
  matmul_entry& primitive(const key& k) {
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
    return primitives.emplace(k, matmul_entry{pd, dnnl::matmul(pd)}).first->second;
  }

  static void ensure(aligned_buffer<std::uint16_t>& buf, std::int64_t count) {
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
  assert(beta == 0.0f || beta == 1.0f);
  if (m == 0 || n == 0) return;
  if (precision_ == gemm_precision::fp32 || k == 0) {
    const dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                                       beta, c, ldc);
    assert(s == dnnl_success);
    (void)s;
    return;
  }
  impl& st = *impl_;
  // Stored layouts: A is [m×k] or, transposed, [k×m]; B is [k×n] or [n×k].
  const std::int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const std::int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  impl::ensure(st.a16, a_rows * a_cols);
  impl::ensure(st.b16, b_rows * b_cols);
  pack_bf16(a, a_rows, a_cols, lda, st.a16.data());
  pack_bf16(b, b_rows, b_cols, ldb, st.b16.data());
  try {
    impl::matmul_entry& mm = st.primitive({trans_a, trans_b, m, n, k, beta != 0.0f, ldc});
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
    assert(s == dnnl_success);
    (void)s;
  }
}

}  // namespace archipelago
