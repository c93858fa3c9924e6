#pragma once
// Model checkpoint files (format: schemas/checkpoint.capnp). Writes go to a
// temporary file that is renamed into place, so a crash never leaves a
// half-written checkpoint under the final name. Reads verify the magic, the
// header, the layout fingerprint and the payload checksum.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/layout.hpp"

namespace archipelago {

struct checkpoint {
  model_shape shape;
  std::vector<float> params;  // layout.total_floats values
  std::uint64_t steps = 0;
  std::uint64_t tokens = 0;
  double train_loss = 0;
  double eval_loss = 0;       // NaN if never evaluated
  std::string corpus;
  std::uint64_t seed = 0;
};

status save_checkpoint(const std::string& path, const checkpoint& ckpt);
expected<checkpoint> load_checkpoint(const std::string& path);
/// The file's bytes, and back: magic, le64 header length, the Cap'n Proto header, the fp32
/// payload. Decoding checks every length against the bytes before it allocates; a bad
/// file is errc::corrupt_data (or unsupported: another format version) naming `name`.
/// Fuzzed by tests/fuzz/checkpoint_fuzz.cpp.
expected<std::string> encode_checkpoint(const checkpoint& ckpt);
expected<checkpoint> decode_checkpoint(std::string_view bytes, const std::string& name);

}  // namespace archipelago
