#pragma once
// Tensor encodings on the wire. Learners send fragment deltas (outer gradients)
// at a configurable precision; receivers decode to fp32. Encoded bytes come
// from the network, so decoding validates everything and never reads past
// the buffer; encoding refuses non-finite input so NaN never leaves a learner.
//
// Wire format (this is a protocol: change it only with a version bump). All
// multi-byte values are little-endian. The byte stream carries no header: the
// element count, the encoding and the block size travel out of band and must
// match on both ends.
//
//   fp32  count * 4 bytes: the IEEE-754 binary32 values, copied bit for bit.
//   bf16  count * 2 bytes: per value, the upper 16 bits of its binary32 after
//         rounding to nearest, ties to even. Finite values beyond the bf16
//         range saturate to +-0x7f7f (bf16 max) instead of becoming infinite.
//   int8, int4, int2 (block absmax quantisation, L = 127, 7 and 1):
//         the values are cut into blocks of block_size elements; the last block
//         holds the remaining count % block_size values (if any). Each block,
//         in order, is
//           4 bytes   a: the block absmax max|x| as binary32 (finite, >= +0)
//           ceil(n * bits / 8) bytes of codes, n = values in this block
//         The code of x is q = round(x * L / a), to nearest with ties to even,
//         computed exactly; a block with a = 0 has all codes 0. The value
//         decoded from q is the binary32 nearest to q * a / L, so q = +-L
//         decodes to exactly +-a and 0 to +0. Codes are two's complement:
//           int8  one byte per value, q in [-127, 127]; 0x80 (-128) is invalid.
//           int4  two values per byte, element 2k in the low nibble and 2k+1
//                 in the high nibble; q in [-7, 7]; nibble 0x8 is invalid.
//           int2  ternary, four values per byte, element 4k+j in bits
//                 [2j, 2j+1]: 00 = 0, 01 = +1, 11 = -1; 10 is invalid.
//         Unused bits in a block's last code byte are 0, and a block with
//         a = 0 has all code bytes 0; anything else is corrupt.
//
// Error bounds per element, for finite input (x^ = decoded value):
//   fp32  exact.
//   bf16  |x - x^| <= 2^-8 |x| when |x| >= 2^-126 (normal); below that the
//         absolute error is at most 2^-134 (half a bf16 subnormal step).
//   intN  |x - x^| <= a / (2L) + ulp(a) / 2: half a quantisation step plus the
//         final rounding to binary32. For int2 that is a / 2, attained by
//         |x| = a / 2, which rounds (tie to even) to 0.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace archipelago {

enum class tensor_encoding : std::uint8_t { fp32 = 0, bf16 = 1, int8 = 2, int4 = 3, int2 = 4 };

/// Values per quantisation block: a knob in [min_block_size, max_block_size].
/// Smaller blocks track local magnitudes better and cost 4 bytes each.
constexpr int default_block_size = 64;
constexpr int min_block_size = 8;
constexpr int max_block_size = 65536;

/// "fp32", "bf16", "int8", "int4", "int2"; "unknown" for an out-of-range value.
const char* to_string(tensor_encoding encoding);
expected<tensor_encoding> parse_tensor_encoding(std::string_view name);

/// Bits per element: 32, 16, 8, 4 or 2; 0 for an out-of-range value.
int bits_per_value(tensor_encoding encoding);

/// errc::invalid_input unless block_size is in [min_block_size, max_block_size].
/// Checked for every encoding, including fp32 and bf16 that do not use it, so
/// a bad knob is caught whatever the precision.
status validate_block_size(int block_size);

/// Exact encoded size in bytes. SIZE_MAX (which no real buffer matches) for an
/// unknown encoding, an invalid block size, or a size that overflows size_t.
std::size_t encoded_bytes(tensor_encoding encoding, std::size_t count, int block_size);

/// Encodes count values into out, which must hold exactly
/// encoded_bytes(encoding, count, block_size) bytes. errc::invalid_input for a
/// non-finite value (the message names the index of the first), a wrong
/// out_bytes, a bad block size or an unknown encoding. On error the contents
/// of out are unspecified. values and out must not overlap.
status encode_tensor(const float* values, std::size_t count, tensor_encoding encoding,
                     int block_size, std::uint8_t* out, std::size_t out_bytes);
expected<std::vector<std::uint8_t>> encode_tensor(const float* values, std::size_t count,
                                                  tensor_encoding encoding, int block_size);

/// Error feedback (wire.error_feedback): encodes values + residual and leaves in
/// `residual` (count floats; zero before the first call) what the encoding
/// dropped: residual ← (values + residual) − decode(bytes). Over successive calls
/// the sum of what was sent then differs from the sum of the values by the last
/// residual alone, which stays within the encoding's error bound of one call
/// (above) instead of growing with the calls. fp32, exact, leaves residual as it
/// is. Errors as encode_tensor's; on an error residual is unchanged.
expected<std::vector<std::uint8_t>> encode_with_feedback(const float* values, std::size_t count,
                                                         tensor_encoding encoding, int block_size, float* residual);

/// Decodes count values from byte_count bytes into out (count floats).
/// errc::corrupt_data when the bytes are not a valid encoding: a length other
/// than encoded_bytes, a non-finite or negative block absmax, an invalid code,
/// nonzero padding bits, a zero block with nonzero codes, a non-finite
/// fp32/bf16 value or an unknown encoding. errc::invalid_input for a bad
/// block size (local configuration, not network data). On error the contents
/// of out are unspecified. bytes and out must not overlap.
status decode_tensor(const std::uint8_t* bytes, std::size_t byte_count, std::size_t count,
                     tensor_encoding encoding, int block_size, float* out);

}  // namespace archipelago
