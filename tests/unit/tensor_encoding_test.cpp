#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/prng.hpp"
#include "transport/tensor_encoding.hpp"

using namespace archipelago;

namespace {

constexpr tensor_encoding all_encodings[] = {tensor_encoding::fp32, tensor_encoding::bf16,
                                             tensor_encoding::int8, tensor_encoding::int4,
                                             tensor_encoding::int2};
constexpr tensor_encoding quantised[] = {tensor_encoding::int8, tensor_encoding::int4,
                                         tensor_encoding::int2};
constexpr float f_inf = std::numeric_limits<float>::infinity();
constexpr float f_nan = std::numeric_limits<float>::quiet_NaN();
constexpr std::size_t no_size = std::numeric_limits<std::size_t>::max();

int levels(tensor_encoding e) {
  return e == tensor_encoding::int8 ? 127 : e == tensor_encoding::int4 ? 7 : 1;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::uint8_t> encode(const std::vector<float>& x, tensor_encoding e, int bs) {
  auto bytes = encode_tensor(x.data(), x.size(), e, bs);
  REQUIRE(bytes);
  CHECK(bytes->size() == encoded_bytes(e, x.size(), bs));
  return std::move(bytes).value();
}

std::vector<float> decode(const std::vector<std::uint8_t>& bytes, std::size_t count,
                          tensor_encoding e, int bs) {
  std::vector<float> y(count);
  const status ok = decode_tensor(bytes.data(), bytes.size(), count, e, bs, y.data());
  if (!ok) FAIL(ok.err().to_string());
  return y;
}

/// Decoding these bytes must fail with corrupt_data; returns the message.
std::string corrupt_message(const std::vector<std::uint8_t>& bytes, std::size_t count,
                            tensor_encoding e, int bs) {
  std::vector<float> y(count);
  const status ok = decode_tensor(bytes.data(), bytes.size(), count, e, bs, y.data());
  REQUIRE_FALSE(ok);
  CHECK(ok.err().code == errc::corrupt_data);
  return ok.err().message;
}

std::vector<std::uint8_t> le32(float v) {
  std::vector<std::uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

void put_f32(std::vector<std::uint8_t>& bytes, std::size_t at, float v) { std::memcpy(&bytes[at], &v, 4); }

/// The absmax of the block holding each element.
std::vector<float> block_absmax(const std::vector<float>& x, int bs) {
  std::vector<float> a(x.size());
  for (std::size_t start = 0; start < x.size(); start += bs) {
    const std::size_t end = std::min(x.size(), start + bs);
    float m = 0;
    for (std::size_t j = start; j < end; ++j) m = std::max(m, std::fabs(x[j]));
    std::fill(a.begin() + start, a.begin() + end, m);
  }
  return a;
}

/// Gaussian values at a given scale, about one in 16 exactly zero.
std::vector<float> sample(prng& rng, std::size_t n, double sigma) {
  std::vector<float> x(n);
  for (auto& v : x) {
    const std::uint64_t kind = rng.below(16);
    v = kind == 0 ? 0.0f : static_cast<float>(rng.normal() * sigma);
  }
  return x;
}

}  // namespace

TEST_CASE("encoding names parse and print") {
  for (auto e : all_encodings) {
    CAPTURE(to_string(e));
    auto parsed = parse_tensor_encoding(to_string(e));
    REQUIRE(parsed);
    CHECK(*parsed == e);
  }
  CHECK(static_cast<int>(tensor_encoding::int2) == 4);
  CHECK(bits_per_value(tensor_encoding::int4) == 4);
  CHECK(std::string(to_string(static_cast<tensor_encoding>(9))) == "unknown");
  auto bad = parse_tensor_encoding("fp16");
  REQUIRE_FALSE(bad);
  CHECK(bad.err().code == errc::invalid_input);
  CHECK(contains(bad.err().message, "'fp16'"));
  CHECK(contains(bad.err().message, "fp32, bf16, int8, int4, int2"));
  CHECK_FALSE(parse_tensor_encoding("INT8"));
  CHECK_FALSE(parse_tensor_encoding(""));
}

TEST_CASE("encoded sizes are exact") {
  using te = tensor_encoding;
  for (auto e : all_encodings) CHECK(encoded_bytes(e, 0, 64) == 0);
  CHECK(encoded_bytes(te::fp32, 100, 64) == 400);
  CHECK(encoded_bytes(te::bf16, 100, 64) == 200);
  // 100 = one block of 64 + a short block of 36.
  CHECK(encoded_bytes(te::int8, 100, 64) == (4 + 64) + (4 + 36));
  CHECK(encoded_bytes(te::int4, 100, 64) == (4 + 32) + (4 + 18));
  CHECK(encoded_bytes(te::int2, 100, 64) == (4 + 16) + (4 + 9));
  CHECK(encoded_bytes(te::int8, 1, 64) == 5);
  CHECK(encoded_bytes(te::int4, 1, 64) == 5);
  CHECK(encoded_bytes(te::int2, 1, 64) == 5);
  CHECK(encoded_bytes(te::int4, 9, 8) == (4 + 4) + (4 + 1));
  // Block sizes that do not fill whole bytes pad every block: 10 x 2 bits = 3 bytes.
  CHECK(encoded_bytes(te::int2, 25, 10) == 2 * (4 + 3) + (4 + 2));
  CHECK(encoded_bytes(te::int4, 25, 9) == 2 * (4 + 5) + (4 + 4));
  CHECK(encoded_bytes(te::int8, 65536, 65536) == 65540);
  CHECK(encoded_bytes(te::int8, 65537, 65536) == 65540 + 5);
  CHECK(encoded_bytes(te::int8, 64, 7) == no_size);
  CHECK(encoded_bytes(te::fp32, 64, 65537) == no_size);
  CHECK(encoded_bytes(static_cast<te>(5), 64, 64) == no_size);
  CHECK(encoded_bytes(te::fp32, no_size / 2, 64) == no_size);
  CHECK(encoded_bytes(te::int8, no_size, 8) == no_size);
}

TEST_CASE("golden bytes pin the wire format") {
  using bytes = std::vector<std::uint8_t>;
  const std::vector<float> x{1.0f, -0.5f, 0.0f, 0.25f, -1.0f, 2.0f, 0.0f, 0.0f, 0.5f};

  SUBCASE("fp32 is the raw little-endian value") {
    CHECK(encode({1.0f, -2.5f}, tensor_encoding::fp32, 8) == bytes{0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0});
  }
  SUBCASE("int8: absmax, then one code per byte, ties to even") {
    // Codes of x * 127 / 2: 63.5 -> 64, -31.75 -> -32, 15.875 -> 16, -63.5 -> -64.
    const bytes want{0x00, 0x00, 0x00, 0x40, 0x40, 0xe0, 0x00, 0x10, 0xc0, 0x7f, 0x00, 0x00,
                     0x00, 0x00, 0x00, 0x3f, 0x7f};
    CHECK(encode(x, tensor_encoding::int8, 8) == want);
    const auto y = decode(want, x.size(), tensor_encoding::int8, 8);
    CHECK(y[0] == static_cast<float>(64.0 * 2 / 127));
    CHECK(y[5] == 2.0f);
    CHECK(y[8] == 0.5f);
    // With absmax 127 the code is x itself: 2.5 -> 2 and -2.5 -> -2 (even), 3.5 -> 4.
    CHECK(encode({127.0f, 2.5f, -2.5f, 3.5f, 0, 0, 0, 0}, tensor_encoding::int8, 8) ==
          bytes{0x00, 0x00, 0xfe, 0x42, 0x7f, 0x02, 0xfe, 0x04, 0x00, 0x00, 0x00, 0x00});
  }
  SUBCASE("int4: low nibble first, odd tail padded with a zero nibble") {
    // Codes of x * 7 / 2: 3.5 -> 4, -1.75 -> -2, 0, 0.875 -> 1, -3.5 -> -4, 7, 0, 0.
    const bytes want{0x00, 0x00, 0x00, 0x40, 0xe4, 0x10, 0x7c, 0x00, 0x00, 0x00, 0x00, 0x3f, 0x07};
    CHECK(encode(x, tensor_encoding::int4, 8) == want);
    const auto y = decode(want, x.size(), tensor_encoding::int4, 8);
    CHECK(y[0] == static_cast<float>(4.0 * 2 / 7));
    CHECK(y[4] == static_cast<float>(-4.0 * 2 / 7));
    CHECK(y[5] == 2.0f);
  }
  SUBCASE("int2: 01 = +1, 11 = -1, element 4k+j in bits 2j") {
    const std::vector<float> t{1.0f, -1.0f, 0.6f, -0.4f, 2.0f, -2.0f, 0.9f, -1.1f, -3.0f};
    // x / 2: 0.5 and -0.5 tie to 0; -0.55 -> -1. Codes 0 0 0 0 | 1 -1 0 -1 | -1.
    const bytes want{0x00, 0x00, 0x00, 0x40, 0x00, 0xcd, 0x00, 0x00, 0x40, 0x40, 0x03};
    CHECK(encode(t, tensor_encoding::int2, 8) == want);
    CHECK(decode(want, t.size(), tensor_encoding::int2, 8) ==
          std::vector<float>{0, 0, 0, 0, 2, -2, 0, -2, -3});
  }
  SUBCASE("bf16 rounds to nearest even and saturates") {
    const std::vector<std::uint32_t> in{0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001,
                                        0x7f7fffff, 0xff7fffff, 0x80000000, 0x00000001,
                                        0x00008000, 0x00018000};
    const std::vector<std::uint16_t> want{0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f7f,
                                          0xff7f, 0x8000, 0x0000, 0x0000, 0x0002};
    std::vector<float> v;
    for (auto b : in) v.push_back(std::bit_cast<float>(b));
    const auto got = encode(v, tensor_encoding::bf16, 8);
    REQUIRE(got.size() == 2 * want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK((got[2 * i] | got[2 * i + 1] << 8) == want[i]);
    }
  }
}

namespace {

/// Whether y is within the documented bound of x (see tensor_encoding.hpp).
bool within_bound(tensor_encoding e, float x, float y, double absmax) {
  if (!std::isfinite(y)) return false;
  const double err = std::fabs(static_cast<double>(x) - y);
  switch (e) {
    case tensor_encoding::fp32: return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
    case tensor_encoding::bf16:
      return std::fabs(x) >= std::numeric_limits<float>::min() ? err <= std::ldexp(std::fabs(x), -8)
                                                               : err <= std::ldexp(1.0, -134);
    default: {
      // Half a step, plus the final rounding to binary32 (half an ulp of a);
      // never beyond the absmax, and the absmax itself exact.
      const double bound = absmax / (2 * levels(e)) + std::max(std::ldexp(absmax, -24), std::ldexp(1.0, -150));
      return err <= bound && std::fabs(y) <= absmax && (std::fabs(x) != absmax || x == y);
    }
  }
}

}  // namespace

TEST_CASE("every encoding round trips within its error bound") {
  std::uint64_t stream = 0;
  for (auto e : all_encodings) {
    for (int bs : {8, 13, 64, 100, 65536}) {
      for (std::size_t count : {0, 1, 7, 64, 65, 203, 1000}) {
        for (double sigma : {1e-40, 1e-3, 1.0, 1e35}) {
          const std::uint64_t seed = derive_seed(7, ++stream);
          CAPTURE(to_string(e));
          CAPTURE(bs);
          CAPTURE(count);
          CAPTURE(sigma);
          CAPTURE(seed);
          prng rng(seed);
          const auto x = sample(rng, count, sigma);
          const auto y = decode(encode(x, e, bs), count, e, bs);
          const auto a = block_absmax(x, bs);
          // One check per case: doctest bookkeeping per element would dominate the run time.
          std::size_t bad = 0;
          while (bad < count && within_bound(e, x[bad], y[bad], a[bad])) ++bad;
          if (bad < count) {
            INFO("element ", bad, ": x = ", x[bad], ", decoded ", y[bad], ", block absmax ", a[bad]);
            CHECK(bad == count);
          }
        }
      }
    }
  }
}

TEST_CASE("int2 is ternary and its bound absmax / 2 is tight") {
  // |x| = a / 2 is a tie and rounds to 0, so the error is exactly a / 2; just
  // above it rounds to +-a, error just under a / 2.
  const std::vector<float> x{4.0f, 2.0f, -2.0f, std::nextafter(2.0f, 3.0f), -1.0f, 0.0f, -4.0f, 3.0f};
  const auto y = decode(encode(x, tensor_encoding::int2, 8), x.size(), tensor_encoding::int2, 8);
  CHECK(y == std::vector<float>{4, 0, 0, 4, 0, 0, -4, 4});
  CHECK(std::fabs(x[1] - y[1]) == 2.0f);
  CHECK(std::fabs(x[3] - y[3]) < 2.0f);
}

TEST_CASE("the block absmax decodes exactly in every quantised encoding") {
  // Hard cases first: absmaxes for which a stored fp32 scale a / L could not
  // give back a (fl(fl(a / L) * L) != a), the reason the format stores a.
  const float hard8 = 0x1.fc0002p+0f, hard4 = 0x1.e00004p+0f;
  CHECK(hard8 / 127.0f * 127.0f != hard8);
  CHECK(hard4 / 7.0f * 7.0f != hard4);
  const std::uint64_t seed = 91;
  CAPTURE(seed);
  prng rng(seed);
  for (int trial = 0; trial < 3000; ++trial) {
    CAPTURE(trial);
    float a = trial == 0 ? hard8 : trial == 1 ? hard4
              : static_cast<float>(std::ldexp(1.0 + rng.uniform(), static_cast<int>(rng.below(200)) - 100));
    std::vector<float> x(8);
    for (auto& v : x) v = static_cast<float>((rng.uniform() * 2 - 1) * a);
    const std::size_t at = rng.below(8);
    x[at] = rng.below(2) ? a : -a;
    CAPTURE(a);
    for (auto e : quantised) {
      CAPTURE(to_string(e));
      const auto y = decode(encode(x, e, 8), x.size(), e, 8);
      REQUIRE(y[at] == x[at]);
    }
  }
}

TEST_CASE("zero blocks encode to absmax 0 and decode to +0") {
  std::vector<float> x(20, 0.0f);
  x[3] = -0.0f;
  x[17] = 1.5f;  // third block (block size 8) is not zero
  for (auto e : quantised) {
    CAPTURE(to_string(e));
    const auto bytes = encode(x, e, 8);
    CHECK(std::equal(bytes.begin(), bytes.begin() + 4, le32(0.0f).begin()));
    const auto y = decode(bytes, x.size(), e, 8);
    for (std::size_t i = 0; i < x.size(); ++i) {
      CAPTURE(i);
      CHECK(std::bit_cast<std::uint32_t>(y[i]) == std::bit_cast<std::uint32_t>(i == 17 ? 1.5f : 0.0f));
    }
  }
}

TEST_CASE("encode rejects non-finite input naming the first bad index") {
  std::vector<float> x(150, 0.5f);
  for (auto e : all_encodings) {
    CAPTURE(to_string(e));
    for (auto [bad, name] : {std::pair{f_nan, "nan"}, std::pair{f_inf, "inf"}, std::pair{-f_inf, "-inf"}}) {
      CAPTURE(name);
      auto y = x;
      y[137] = bad;
      y[140] = f_nan;  // only the first is named
      auto r = encode_tensor(y.data(), y.size(), e, 64);
      REQUIRE_FALSE(r);
      CHECK(r.err().code == errc::invalid_input);
      CHECK(contains(r.err().message, "index 137"));
      CHECK(contains(r.err().message, std::string(" ") + name + " "));
    }
  }
}

TEST_CASE("encode rejects bad block sizes, buffer sizes and encodings") {
  const std::vector<float> x(100, 1.0f);
  for (auto e : all_encodings) {
    CAPTURE(to_string(e));
    for (int bs : {-1, 0, 7, 65537}) {
      CAPTURE(bs);
      auto r = encode_tensor(x.data(), x.size(), e, bs);
      REQUIRE_FALSE(r);
      CHECK(r.err().code == errc::invalid_input);
      CHECK(contains(r.err().message, "block size " + std::to_string(bs)));
    }
    const std::size_t need = encoded_bytes(e, x.size(), 64);
    std::vector<std::uint8_t> out(need + 1);
    for (std::size_t size : {need - 1, need + 1, std::size_t{0}}) {
      CAPTURE(size);
      const status s = encode_tensor(x.data(), x.size(), e, 64, out.data(), size);
      REQUIRE_FALSE(s);
      CHECK(s.err().code == errc::invalid_input);
      CHECK(contains(s.err().message, "needs " + std::to_string(need)));
    }
  }
  auto r = encode_tensor(x.data(), x.size(), static_cast<tensor_encoding>(7), 64);
  REQUIRE_FALSE(r);
  CHECK(r.err().code == errc::invalid_input);
}

TEST_CASE("decode rejects a length that does not match") {
  const std::uint64_t seed = 5;
  CAPTURE(seed);
  prng rng(seed);
  const auto x = sample(rng, 100, 1.0);
  for (auto e : all_encodings) {
    CAPTURE(to_string(e));
    auto bytes = encode(x, e, 64);
    bytes.pop_back();
    CHECK(contains(corrupt_message(bytes, x.size(), e, 64), "got " + std::to_string(bytes.size())));
    bytes.push_back(0);
    bytes.push_back(0);
    corrupt_message(bytes, x.size(), e, 64);
    // A count that does not match the bytes is the same mismatch.
    bytes.pop_back();
    corrupt_message(bytes, x.size() + 1, e, 64);
    corrupt_message({}, 1, e, 64);
  }
}

TEST_CASE("decode rejects a non-finite or negative block absmax") {
  const std::vector<float> x(20, 0.25f);  // blocks at bytes 0, 4 + codes, ...
  for (auto e : quantised) {
    CAPTURE(to_string(e));
    const std::size_t block1 = 4 + (8 * bits_per_value(e) + 7) / 8;
    for (float a : {f_nan, f_inf, -f_inf, -1.0f, -0.0f}) {
      CAPTURE(a);
      auto bytes = encode(x, e, 8);
      put_f32(bytes, block1, a);
      const std::string msg = corrupt_message(bytes, x.size(), e, 8);
      CHECK(contains(msg, "block 1"));
      CHECK(contains(msg, std::isfinite(a) ? "negative" : "non-finite"));
    }
  }
}

TEST_CASE("decode rejects codes outside the valid range") {
  const std::vector<float> x(20, 0.25f);
  SUBCASE("int8 -128") {
    auto bytes = encode(x, tensor_encoding::int8, 8);
    bytes[4 + 8 + 4 + 3] = 0x80;  // block 1, element 11
    CHECK(contains(corrupt_message(bytes, x.size(), tensor_encoding::int8, 8), "invalid code -128 at element 11"));
  }
  SUBCASE("int4 -8 in either nibble") {
    for (auto [mask, element] : {std::pair{0x08, 12}, std::pair{0x80, 13}}) {
      auto bytes = encode(x, tensor_encoding::int4, 8);  // codes 7 = 0x77
      std::uint8_t& b = bytes[4 + 4 + 4 + 2];            // block 1, elements 12 and 13
      b = static_cast<std::uint8_t>(mask == 0x08 ? (b & 0xf0) | 0x08 : (b & 0x0f) | 0x80);
      CHECK(contains(corrupt_message(bytes, x.size(), tensor_encoding::int4, 8),
                     "invalid code -8 at element " + std::to_string(element)));
    }
  }
  SUBCASE("int2 pattern 10 in every position") {
    for (int j = 0; j < 4; ++j) {
      CAPTURE(j);
      auto bytes = encode(x, tensor_encoding::int2, 8);  // codes +1 = 0b01010101
      std::uint8_t& b = bytes[4 + 2 + 4 + 1];            // block 1, elements 12..15
      b = static_cast<std::uint8_t>((b & ~(3 << (2 * j))) | (2 << (2 * j)));
      CHECK(contains(corrupt_message(bytes, x.size(), tensor_encoding::int2, 8),
                     "invalid code -2 at element " + std::to_string(12 + j)));
    }
  }
  SUBCASE("int2 pattern 10 in a short last block") {
    auto bytes = encode(x, tensor_encoding::int2, 8);  // last block: 4 values, 1 byte
    bytes.back() = 0x81;                               // element 19 = 10
    CHECK(contains(corrupt_message(bytes, x.size(), tensor_encoding::int2, 8), "element 19"));
  }
}

TEST_CASE("decode rejects nonzero padding bits and codes in a zero block") {
  const std::vector<float> x(9, 0.25f);  // block size 8: last block holds one value
  SUBCASE("int4 high nibble after an odd tail") {
    auto bytes = encode(x, tensor_encoding::int4, 8);
    bytes.back() |= 0x10;
    CHECK(contains(corrupt_message(bytes, x.size(), tensor_encoding::int4, 8), "padding"));
  }
  SUBCASE("int2 bits after a short tail") {
    for (int bit : {2, 7}) {
      CAPTURE(bit);
      auto bytes = encode(x, tensor_encoding::int2, 8);
      bytes.back() = static_cast<std::uint8_t>(bytes.back() | 1 << bit);
      CHECK(contains(corrupt_message(bytes, x.size(), tensor_encoding::int2, 8), "padding"));
    }
  }
  SUBCASE("int2 padding inside every block when the block size is not a multiple of 4") {
    const std::vector<float> y(20, -0.25f);
    auto bytes = encode(y, tensor_encoding::int2, 10);  // blocks: 4 + 3 bytes, 10 codes + 4 pad bits
    bytes[4 + 2] |= 0x40;
    CHECK(contains(corrupt_message(bytes, y.size(), tensor_encoding::int2, 10), "int2 block 0 holds nonzero padding"));
  }
  SUBCASE("a zero block with nonzero codes") {
    for (auto e : quantised) {
      CAPTURE(to_string(e));
      const std::vector<float> z(16, 0.0f);
      auto bytes = encode(z, e, 8);
      bytes.back() = 0x01;
      CHECK(contains(corrupt_message(bytes, z.size(), e, 8), "block 1 has absmax 0 but nonzero codes"));
    }
  }
}

TEST_CASE("decode rejects non-finite fp32 and bf16 values") {
  const std::vector<float> x(10, 1.0f);
  for (float bad : {f_nan, f_inf, -f_inf}) {
    CAPTURE(bad);
    auto bytes = encode(x, tensor_encoding::fp32, 64);
    put_f32(bytes, 4 * 3, bad);
    CHECK(contains(corrupt_message(bytes, x.size(), tensor_encoding::fp32, 64), "element 3"));
  }
  for (std::uint16_t bad : {0x7f80, 0xff80, 0x7fc0, 0xff81}) {
    CAPTURE(bad);
    auto bytes = encode(x, tensor_encoding::bf16, 64);
    bytes[2 * 6] = static_cast<std::uint8_t>(bad & 0xff);
    bytes[2 * 6 + 1] = static_cast<std::uint8_t>(bad >> 8);
    CHECK(contains(corrupt_message(bytes, x.size(), tensor_encoding::bf16, 64), "element 6"));
  }
}

TEST_CASE("decode rejects unknown encodings and bad block sizes") {
  const std::vector<std::uint8_t> bytes(68);
  std::vector<float> y(64);
  const status unknown = decode_tensor(bytes.data(), bytes.size(), y.size(), static_cast<tensor_encoding>(5), 64, y.data());
  REQUIRE_FALSE(unknown);
  CHECK(unknown.err().code == errc::corrupt_data);
  const status bs = decode_tensor(bytes.data(), bytes.size(), y.size(), tensor_encoding::int8, 4, y.data());
  REQUIRE_FALSE(bs);
  CHECK(bs.err().code == errc::invalid_input);
}

TEST_CASE("decoding damaged or random bytes fails cleanly or yields bounded values") {
  const std::uint64_t seed = 1234;
  CAPTURE(seed);
  prng rng(seed);
  const auto x = sample(rng, 300, 1.0);
  for (auto e : all_encodings) {
    CAPTURE(to_string(e));
    for (int trial = 0; trial < 200; ++trial) {
      CAPTURE(trial);
      std::vector<std::uint8_t> bytes;
      if (trial % 2) {
        bytes.resize(encoded_bytes(e, x.size(), 16));
        for (auto& b : bytes) b = static_cast<std::uint8_t>(rng.next());
      } else {
        bytes = encode(x, e, 16);
        for (int flips = 0; flips < 3; ++flips) bytes[rng.below(bytes.size())] ^= static_cast<std::uint8_t>(1 << rng.below(8));
      }
      std::vector<float> y(x.size());
      const status ok = decode_tensor(bytes.data(), bytes.size(), y.size(), e, 16, y.data());
      if (!ok) {
        CHECK(ok.err().code == errc::corrupt_data);
        continue;
      }
      for (std::size_t i = 0; i < y.size(); ++i) REQUIRE(std::isfinite(y[i]));
    }
  }
}

TEST_CASE("error feedback: the sum of what was sent follows the sum of the deltas, the gap bounded by one call's error") {
  constexpr std::size_t count = 300;  // four full blocks of 64 and a partial one
  constexpr int bs = 64, calls = 400;
  for (tensor_encoding e : {tensor_encoding::bf16, tensor_encoding::int8, tensor_encoding::int4, tensor_encoding::int2}) {
    const std::uint64_t seed = 0xef00 + static_cast<std::uint64_t>(e);
    const std::string encoding = to_string(e);
    CAPTURE(encoding);
    CAPTURE(seed);
    prng rng(seed);
    std::vector<float> residual(count, 0.f), carried(count);
    std::vector<double> sum_deltas(count, 0), sum_sent(count, 0), sum_sent_plain(count, 0);
    double largest_gap = 0, last_bound = 0;
    for (int t = 0; t < calls; ++t) {
      // Deltas with a drift per coordinate (what a learner's outer gradients share
      // round after round) and a scale that varies between calls.
      std::vector<float> d(count);
      const double scale = 0.5 + rng.uniform();
      for (std::size_t i = 0; i < count; ++i)
        d[i] = static_cast<float>(scale * (0.05 * std::sin(static_cast<double>(i)) + rng.normal()));
      for (std::size_t i = 0; i < count; ++i) carried[i] = d[i] + residual[i];
      auto bytes = encode_with_feedback(d.data(), count, e, bs, residual.data());
      REQUIRE(bytes);
      const std::vector<float> sent = decode(*bytes, count, e, bs);
      const std::vector<float> plain = decode(encode(d, e, bs), count, e, bs);
      // The residual is exactly what this call's encoding dropped from d + the old residual.
      for (std::size_t i = 0; i < count; ++i) REQUIRE(residual[i] == carried[i] - sent[i]);
      // ... so it is within one call's error bound: half a step of the carried block's absmax.
      last_bound = 0;
      for (std::size_t b = 0; b < count; b += bs) {
        float absmax = 0;
        for (std::size_t i = b; i < std::min(count, b + bs); ++i) absmax = std::max(absmax, std::abs(carried[i]));
        const double bound = e == tensor_encoding::bf16 ? std::ldexp(absmax, -8) : absmax / (2.0 * levels(e)) * (1 + 1e-6);
        last_bound = std::max(last_bound, bound);
        for (std::size_t i = b; i < std::min(count, b + bs); ++i) CHECK(std::abs(residual[i]) <= bound);
      }
      for (std::size_t i = 0; i < count; ++i) {
        sum_deltas[i] += d[i];
        sum_sent[i] += sent[i];
        sum_sent_plain[i] += plain[i];
        largest_gap = std::max(largest_gap, std::abs(sum_deltas[i] - sum_sent[i]));
      }
    }
    double gap = 0, gap_plain = 0;
    for (std::size_t i = 0; i < count; ++i) {
      // Σ sent = Σ deltas − the last residual, up to fp32 rounding of the carries.
      CHECK(std::abs(sum_deltas[i] - sum_sent[i] - residual[i]) < 1e-3);
      gap = std::max(gap, std::abs(sum_deltas[i] - sum_sent[i]));
      gap_plain = std::max(gap_plain, std::abs(sum_deltas[i] - sum_sent_plain[i]));
    }
    CAPTURE(gap);
    CAPTURE(gap_plain);
    CAPTURE(largest_gap);
    // The gap never grows with the calls: at most one call's error, at every call.
    CHECK(gap <= last_bound + 1e-3);
    CHECK(largest_gap < 4 * last_bound + 1e-3);
    // Without feedback the dropped parts add up: the gap grows like sqrt(calls) (or faster).
    if (e != tensor_encoding::bf16) CHECK(gap_plain > 4 * gap);
  }
}

TEST_CASE("error feedback: fp32 sends the values as they are and keeps no residual") {
  const std::vector<float> d = {1.5f, -2.25f, 0.f, 3.f};
  std::vector<float> residual(d.size(), 0.f);
  auto bytes = encode_with_feedback(d.data(), d.size(), tensor_encoding::fp32, 64, residual.data());
  REQUIRE(bytes);
  CHECK(decode(*bytes, d.size(), tensor_encoding::fp32, 64) == d);
  CHECK(residual == std::vector<float>(d.size(), 0.f));
  // A non-finite value is refused and the residual left as it was.
  residual = {0.25f, 0.f, 0.f, 0.f};
  const std::vector<float> bad = {1.f, f_nan, 0.f, 0.f};
  CHECK_FALSE(encode_with_feedback(bad.data(), bad.size(), tensor_encoding::int4, 64, residual.data()));
  CHECK(residual == std::vector<float>{0.25f, 0.f, 0.f, 0.f});
}
