#include "transport/tensor_encoding.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/invariant.hpp"

namespace archipelago {

// Values and block absmaxes are copied to and from the wire as host bytes.
static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

namespace {

constexpr std::uint32_t abs_mask = 0x7fffffffu;
constexpr std::uint32_t inf_bits = 0x7f800000u;  // |x| bits >= this: NaN or Inf
constexpr std::size_t no_size = std::numeric_limits<std::size_t>::max();

constexpr int levels(int bits) { return bits == 8 ? 127 : bits == 4 ? 7 : 1; }

std::size_t code_bytes(std::size_t n, int bits) { return (n * static_cast<std::size_t>(bits) + 7) / 8; }

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

std::string describe(tensor_encoding encoding, std::size_t count, int block_size) {
  std::string s = std::string(to_string(encoding)) + " encoding of " + std::to_string(count) + " values";
  if (bits_per_value(encoding) <= 8) s += " with block size " + std::to_string(block_size);
  return s;
}

std::string value_name(float x) {
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}

error non_finite_input(const float* values, std::size_t count) {
  std::size_t i = 0;
  while (i < count && std::isfinite(values[i])) ++i;
  if (i == count) return make_error(errc::internal, "non-finite value reported but not found");
  return make_error(errc::invalid_input,
                    "non-finite value " + value_name(values[i]) + " at index " + std::to_string(i));
}

error corrupt(std::string message) { return make_error(errc::corrupt_data, std::move(message)); }

// For non-negative binary32, integer order of the bits is numeric order, and
// every NaN/Inf compares >= inf_bits: one vectorised max finds the absmax and
// detects non-finite values together.
std::uint32_t max_abs_bits(const float* x, std::size_t n) {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, bits_of(x[i]) & abs_mask);
  return m;
}

// ---- fp32 and bf16 ---------------------------------------------------------

// Copy and check in one loop; on a bad value the output is discarded anyway.
status encode_fp32(const float* __restrict values, std::size_t count, std::uint8_t* __restrict out) {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t b = bits_of(values[i]);
    m = std::max(m, b & abs_mask);
    std::memcpy(out + 4 * i, &b, 4);
  }
  if (m >= inf_bits) return non_finite_input(values, count);
  return {};
}

status encode_bf16(const float* __restrict values, std::size_t count, std::uint8_t* __restrict out) {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t b = bits_of(values[i]);
    m = std::max(m, b & abs_mask);
    // Round to nearest even on the dropped 16 bits; a carry into the exponent
    // is the correct rounding up. Saturate so a finite input stays finite.
    const std::uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    const auto h = static_cast<std::uint16_t>((r & 0x8000u) | std::min(r & 0x7fffu, 0x7f7fu));
    std::memcpy(out + 2 * i, &h, 2);
  }
  if (m >= inf_bits) return non_finite_input(values, count);
  return {};
}

status decode_fp32(const std::uint8_t* __restrict in, std::size_t count, float* __restrict out) {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t b;
    std::memcpy(&b, in + 4 * i, 4);
    m = std::max(m, b & abs_mask);
    out[i] = std::bit_cast<float>(b);
  }
  if (m < inf_bits) return {};
  std::size_t i = 0;
  while (std::isfinite(out[i])) ++i;
  return corrupt("fp32 value at element " + std::to_string(i) + " is " + value_name(out[i]));
}

status decode_bf16(const std::uint8_t* __restrict in, std::size_t count, float* __restrict out) {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    m = std::max(m, static_cast<std::uint32_t>(h) & 0x7fffu);
    out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
  }
  if (m < 0x7f80u) return {};
  std::size_t i = 0;
  while (std::isfinite(out[i])) ++i;
  return corrupt("bf16 value at element " + std::to_string(i) + " is " + value_name(out[i]));
}

// ---- block absmax quantisation ---------------------------------------------

// round(x * L / a), ties to even, exactly: x * L is exact in double and the
// division is correctly rounded, so an exact tie stays a tie. |x| <= a bounds
// the result to [-L, L].
template <int Bits>
struct quantiser {
  static constexpr int L = levels(Bits);
  double a;
  int operator()(float x) const {
    return static_cast<int>(std::nearbyint(static_cast<double>(x) * L / a));
  }
};

template <int Bits>
void pack_block(const float* __restrict x, std::size_t n, float absmax, std::uint8_t* __restrict codes) {
  const quantiser<Bits> q{absmax};
  if constexpr (Bits == 8) {
    for (std::size_t i = 0; i < n; ++i) codes[i] = static_cast<std::uint8_t>(q(x[i]));
  } else {
    // Quantise to one byte per code, then pack the bytes of each 16- or 32-bit
    // word: both loops run at full vector width even for short blocks, where
    // one loop over interleaved floats would fall back to its scalar tail.
    constexpr std::size_t chunk = 256;  // codes per round; a whole number of bytes
    constexpr unsigned mask = (1u << Bits) - 1;
    alignas(32) std::uint8_t q8[chunk];
    for (std::size_t base = 0; base < n; base += chunk) {
      const std::size_t m = std::min(chunk, n - base);
      const std::size_t out_n = code_bytes(m, Bits);
      for (std::size_t i = 0; i < m; ++i) q8[i] = static_cast<std::uint8_t>(q(x[base + i]) & mask);
      std::fill(q8 + m, q8 + out_n * (8 / Bits), std::uint8_t{0});  // padding codes
      std::uint8_t* out = codes + base * Bits / 8;
      if constexpr (Bits == 4) {
        for (std::size_t k = 0; k < out_n; ++k) {
          std::uint16_t v;
          std::memcpy(&v, q8 + 2 * k, 2);
          out[k] = static_cast<std::uint8_t>((v & 0x0f) | (v >> 4 & 0xf0));
        }
      } else {
        for (std::size_t k = 0; k < out_n; ++k) {
          std::uint32_t v;
          std::memcpy(&v, q8 + 4 * k, 4);
          out[k] = static_cast<std::uint8_t>((v & 0x03) | (v >> 6 & 0x0c) | (v >> 12 & 0x30) | (v >> 18 & 0xc0));
        }
      }
    }
  }
}

template <int Bits>
status encode_quantised(const float* values, std::size_t count, int block_size, std::uint8_t* out) {
  const auto bs = static_cast<std::size_t>(block_size);
  for (std::size_t start = 0; start < count; start += bs) {
    const std::size_t n = std::min(bs, count - start);
    const float* x = values + start;
    const std::uint32_t m = max_abs_bits(x, n);
    if (m >= inf_bits) return non_finite_input(values, count);
    std::memcpy(out, &m, 4);
    out += 4;
    const std::size_t nb = code_bytes(n, Bits);
    if (m == 0) {
      std::memset(out, 0, nb);
    } else {
      pack_block<Bits>(x, n, std::bit_cast<float>(m), out);
    }
    out += nb;
  }
  return {};
}

// Sign-extends the Width-bit field at bit `shift` of a code byte.
template <int Width>
int field(std::uint32_t byte, int shift) {
  return static_cast<std::int8_t>(static_cast<std::uint8_t>(byte << (8 - Width - shift))) >> (8 - Width);
}

// Decodes one block of codes; returns false if any code is the invalid
// pattern (-(L+1)) or a padding bit is set. Decoded value: the binary32
// nearest to q * a / L. q * (a / L) in double is within 2^-52 of it relative,
// and q * a / L is never within 2^-40 of a binary32 rounding boundary unless
// representable, so the one rounding to float is exact (and +-L gives +-a).
// Direct loops over interleaved outputs: faster here than widening the codes
// to bytes first (as pack_block does) at the default block size.
template <int Bits>
bool unpack_block(const std::uint8_t* __restrict codes, std::size_t n, float absmax, float* __restrict out) {
  constexpr int L = levels(Bits);
  const double step = static_cast<double>(absmax) / L;
  auto value = [step](int q) { return static_cast<float>(q * step); };
  unsigned bad = 0;
  if constexpr (Bits == 8) {
    for (std::size_t i = 0; i < n; ++i) {
      const int q = static_cast<std::int8_t>(codes[i]);
      bad |= q == -128;
      out[i] = value(q);
    }
  } else if constexpr (Bits == 4) {
    const std::size_t pairs = n / 2;
    for (std::size_t k = 0; k < pairs; ++k) {
      const int lo = field<4>(codes[k], 0), hi = field<4>(codes[k], 4);
      bad |= (lo == -8) | (hi == -8);
      out[2 * k] = value(lo);
      out[2 * k + 1] = value(hi);
    }
    if (n % 2) {
      const int lo = field<4>(codes[pairs], 0);
      bad |= (lo == -8) | (codes[pairs] >> 4 != 0);
      out[n - 1] = value(lo);
    }
  } else {
    const std::size_t quads = n / 4;
    for (std::size_t k = 0; k < quads; ++k) {
      const std::uint32_t b = codes[k];
      const int q0 = field<2>(b, 0), q1 = field<2>(b, 2), q2 = field<2>(b, 4), q3 = field<2>(b, 6);
      bad |= (q0 == -2) | (q1 == -2) | (q2 == -2) | (q3 == -2);
      out[4 * k] = value(q0);
      out[4 * k + 1] = value(q1);
      out[4 * k + 2] = value(q2);
      out[4 * k + 3] = value(q3);
    }
    if (const std::size_t rest = n % 4) {
      const std::uint32_t b = codes[quads];
      for (std::size_t j = 0; j < rest; ++j) {
        const int q = field<2>(b, static_cast<int>(2 * j));
        bad |= q == -2;
        out[4 * quads + j] = value(q);
      }
      bad |= (b >> (2 * rest)) != 0;
    }
  }
  return bad == 0;
}

// Error path only: says what is wrong with a block that failed unpack_block.
template <int Bits>
std::string block_problem(const std::uint8_t* codes, std::size_t n, std::size_t first) {
  constexpr int per_byte = 8 / Bits;
  for (std::size_t i = 0; i < n; ++i) {
    const int shift = static_cast<int>(i % per_byte) * Bits;
    const int q = Bits == 8 ? static_cast<std::int8_t>(codes[i])
                  : Bits == 4 ? field<4>(codes[i / per_byte], shift)
                              : field<2>(codes[i / per_byte], shift);
    if (q == -levels(Bits) - 1) {
      return "invalid code " + std::to_string(q) + " at element " + std::to_string(first + i);
    }
  }
  return "nonzero padding bits";
}

template <int Bits>
status decode_quantised(const std::uint8_t* in, std::size_t count, int block_size, float* out) {
  const auto bs = static_cast<std::size_t>(block_size);
  for (std::size_t start = 0; start < count; start += bs) {
    const std::size_t n = std::min(bs, count - start);
    // Built only on the error path: no allocation per block.
    auto where = [&] {
      return std::string(Bits == 8 ? "int8" : Bits == 4 ? "int4" : "int2") + " block " +
             std::to_string(start / bs);
    };
    std::uint32_t a;
    std::memcpy(&a, in, 4);
    in += 4;
    const std::size_t nb = code_bytes(n, Bits);
    if ((a & abs_mask) >= inf_bits) {
      return corrupt(where() + " has a non-finite absmax (" + value_name(std::bit_cast<float>(a)) + ")");
    }
    if (a >> 31) return corrupt(where() + " has a negative absmax");
    if (a == 0) {
      if (std::any_of(in, in + nb, [](std::uint8_t c) { return c != 0; })) {
        return corrupt(where() + " has absmax 0 but nonzero codes");
      }
      std::fill(out + start, out + start + n, 0.0f);
    } else if (!unpack_block<Bits>(in, n, std::bit_cast<float>(a), out + start)) {
      return corrupt(where() + " holds " + block_problem<Bits>(in, n, start));
    }
    in += nb;
  }
  return {};
}

}  // namespace

const char* to_string(tensor_encoding encoding) {
  switch (encoding) {
    case tensor_encoding::fp32: return "fp32";
    case tensor_encoding::bf16: return "bf16";
    case tensor_encoding::int8: return "int8";
    case tensor_encoding::int4: return "int4";
    case tensor_encoding::int2: return "int2";
  }
  return "unknown";
}

expected<tensor_encoding> parse_tensor_encoding(std::string_view name) {
  for (auto e : {tensor_encoding::fp32, tensor_encoding::bf16, tensor_encoding::int8,
                 tensor_encoding::int4, tensor_encoding::int2}) {
    if (name == to_string(e)) return e;
  }
  return make_error(errc::invalid_input, "unknown tensor encoding '" + std::string(name) +
                                             "' (valid: fp32, bf16, int8, int4, int2)");
}

int bits_per_value(tensor_encoding encoding) {
  switch (encoding) {
    case tensor_encoding::fp32: return 32;
    case tensor_encoding::bf16: return 16;
    case tensor_encoding::int8: return 8;
    case tensor_encoding::int4: return 4;
    case tensor_encoding::int2: return 2;
  }
  return 0;
}

status validate_block_size(int block_size) {
  if (block_size >= min_block_size && block_size <= max_block_size) return {};
  return make_error(errc::invalid_input, "block size " + std::to_string(block_size) + " is outside [" +
                                             std::to_string(min_block_size) + ", " +
                                             std::to_string(max_block_size) + "]");
}

std::size_t encoded_bytes(tensor_encoding encoding, std::size_t count, int block_size) {
  const int bits = bits_per_value(encoding);
  if (bits == 0 || !validate_block_size(block_size)) return no_size;
  std::size_t total = 0;
  if (bits >= 16) {
    if (__builtin_mul_overflow(count, static_cast<std::size_t>(bits / 8), &total)) return no_size;
    return total;
  }
  const auto bs = static_cast<std::size_t>(block_size);
  const std::size_t full = count / bs, rest = count % bs;
  const std::size_t last = rest ? 4 + code_bytes(rest, bits) : 0;
  if (__builtin_mul_overflow(full, 4 + code_bytes(bs, bits), &total) ||
      __builtin_add_overflow(total, last, &total)) {
    return no_size;
  }
  return total;
}

status encode_tensor(const float* values, std::size_t count, tensor_encoding encoding,
                     int block_size, std::uint8_t* out, std::size_t out_bytes) {
  if (bits_per_value(encoding) == 0) {
    return make_error(errc::invalid_input,
                      "unknown tensor encoding " + std::to_string(static_cast<int>(encoding)));
  }
  if (auto ok = validate_block_size(block_size); !ok) return ok;
  const std::size_t need = encoded_bytes(encoding, count, block_size);
  if (need == no_size) {
    return make_error(errc::invalid_input, describe(encoding, count, block_size) + " is too large");
  }
  if (out_bytes != need) {
    return make_error(errc::invalid_input, "output buffer holds " + std::to_string(out_bytes) +
                                               " bytes but " + describe(encoding, count, block_size) +
                                               " needs " + std::to_string(need));
  }
  ARCHIPELAGO_INVARIANT(count == 0 || (values != nullptr && out != nullptr),
                        "tensor encoding: buffers for a non-empty tensor");
  switch (encoding) {
    case tensor_encoding::fp32: return encode_fp32(values, count, out);
    case tensor_encoding::bf16: return encode_bf16(values, count, out);
    case tensor_encoding::int8: return encode_quantised<8>(values, count, block_size, out);
    case tensor_encoding::int4: return encode_quantised<4>(values, count, block_size, out);
    case tensor_encoding::int2: return encode_quantised<2>(values, count, block_size, out);
  }
  return make_error(errc::internal, "unreachable tensor encoding");
}

expected<std::vector<std::uint8_t>> encode_tensor(const float* values, std::size_t count,
                                                  tensor_encoding encoding, int block_size) {
  const std::size_t need = encoded_bytes(encoding, count, block_size);
  // Let the checking overload report bad arguments; it needs no buffer for that.
  if (need == no_size) return encode_tensor(values, count, encoding, block_size, nullptr, 0).err();
  std::vector<std::uint8_t> bytes(need);
  if (auto ok = encode_tensor(values, count, encoding, block_size, bytes.data(), bytes.size()); !ok) {
    return ok.err();
  }
  return bytes;
}

status decode_tensor(const std::uint8_t* bytes, std::size_t byte_count, std::size_t count,
                     tensor_encoding encoding, int block_size, float* out) {
  // The encoding byte usually comes off the wire, so an unknown one is corrupt.
  if (bits_per_value(encoding) == 0) {
    return corrupt("unknown tensor encoding " + std::to_string(static_cast<int>(encoding)));
  }
  if (auto ok = validate_block_size(block_size); !ok) return ok;
  const std::size_t need = encoded_bytes(encoding, count, block_size);
  if (byte_count != need) {
    if (need == no_size) return corrupt(describe(encoding, count, block_size) + " is too large");
    return corrupt(describe(encoding, count, block_size) + " must be " + std::to_string(need) +
                   " bytes, got " + std::to_string(byte_count));
  }
  ARCHIPELAGO_INVARIANT(count == 0 || (bytes != nullptr && out != nullptr),
                        "tensor decoding: buffers for a non-empty tensor");
  switch (encoding) {
    case tensor_encoding::fp32: return decode_fp32(bytes, count, out);
    case tensor_encoding::bf16: return decode_bf16(bytes, count, out);
    case tensor_encoding::int8: return decode_quantised<8>(bytes, count, block_size, out);
    case tensor_encoding::int4: return decode_quantised<4>(bytes, count, block_size, out);
    case tensor_encoding::int2: return decode_quantised<2>(bytes, count, block_size, out);
  }
  return corrupt("unknown tensor encoding");
}

expected<std::vector<std::uint8_t>> encode_with_feedback(const float* values, std::size_t count,
                                                         tensor_encoding encoding, int block_size, float* residual) {
  if (encoding == tensor_encoding::fp32) return encode_tensor(values, count, encoding, block_size);
  std::vector<float> carried(count);
  for (std::size_t i = 0; i < count; ++i) carried[i] = values[i] + residual[i];
  auto bytes = encode_tensor(carried.data(), count, encoding, block_size);
  if (!bytes) return bytes;
  std::vector<float> sent(count);
  if (auto ok = decode_tensor(bytes->data(), bytes->size(), count, encoding, block_size, sent.data()); !ok)
    return ok.err();  // our own encoding: cannot fail
  for (std::size_t i = 0; i < count; ++i) residual[i] = carried[i] - sent[i];
  return bytes;
}

}  // namespace archipelago
