// Fuzz target for the envelope decoder: the bytes a hostile peer controls.
//
// Input format (so the fuzzer can shape multipart messages): byte 0 = number of
// frames (low 3 bits), 0x80 = place the first frame at an odd offset (as ZeroMQ
// may deliver it), 0x40 = re-seal the envelope checksum so mutations reach the
// Cap'n Proto validation behind it; then per frame a little-endian uint16
// length followed by that many bytes (truncated at the end of the input).
//
// Built as a libFuzzer target with clang (-DARCHIPELAGO_FUZZ=ON), and always as
// `archipelago_envelope_fuzz_smoke` (fuzz_smoke.cpp), a seeded driver that
// mutates fuzz_seeds() — valid messages — for a bounded number of iterations in CI.

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/checksum.hpp"
#include "fuzz_target.hpp"
#include "transport/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace archipelago::transport;
  if (size == 0) return 0;
  const std::size_t frame_count = data[0] % 8;
  const bool misalign = (data[0] & 0x80) != 0;
  const bool reseal = (data[0] & 0x40) != 0;
  std::size_t pos = 1;
  std::vector<std::vector<std::uint8_t>> storage;
  for (std::size_t f = 0; f < frame_count && pos + 2 <= size; ++f) {
    std::size_t len = data[pos] | (std::size_t(data[pos + 1]) << 8);
    pos += 2;
    len = std::min(len, size - pos);
    std::vector<std::uint8_t> frame(len + 1);
    std::memcpy(frame.data() + (misalign && f == 0 ? 1 : 0), data + pos, len);
    storage.push_back(std::move(frame));
    pos += len;
  }
  if (reseal && !storage.empty() && storage[0].size() - 1 >= 16) {
    std::uint8_t* first = storage[0].data() + (misalign ? 1 : 0);
    const std::size_t body = (storage[0].size() - 1) / 8 * 8 - 8;
    const std::uint64_t sum = archipelago::checksum64(first, body);
    std::memcpy(first + body, &sum, sizeof sum);
  }
  std::vector<frame_view> frames;
  for (std::size_t f = 0; f < storage.size(); ++f)
    frames.push_back({storage[f].data() + (misalign && f == 0 ? 1 : 0), storage[f].size() - 1});
  auto result = decode_envelope(frames);
  if (result.ok()) {
    // A validated message must be fully readable, and its tensors decodable or refused.
    const auto& env = result.value();
    (void)env.sender();
    (void)env.root().getBody().which();
    for (std::size_t i = 0; i < env.tensor_count(); ++i) {
      std::vector<float> out(env.tensor_info(i).getElementCount());
      (void)env.decode_tensor_values(i, out.data());
    }
  }
  return 0;
}

namespace {

using namespace archipelago;
using namespace archipelago::transport;

/// Serialises a message in the target's input format.
std::vector<std::uint8_t> to_input(const encoded_message& m, bool misalign) {
  std::vector<std::vector<std::uint8_t>> frames;
  const auto* p = reinterpret_cast<const std::uint8_t*>(m.envelope.begin());
  frames.emplace_back(p, p + m.envelope.size() * 8);
  for (const auto& t : m.tensors) frames.push_back(t.copy());
  std::vector<std::uint8_t> in{static_cast<std::uint8_t>(frames.size() | 0x40 | (misalign ? 0x80 : 0))};
  for (const auto& f : frames) {
    const std::size_t len = std::min<std::size_t>(f.size(), 65535);
    in.push_back(static_cast<std::uint8_t>(len & 0xff));
    in.push_back(static_cast<std::uint8_t>(len >> 8));
    in.insert(in.end(), f.begin(), f.begin() + static_cast<std::ptrdiff_t>(len));
  }
  return in;
}

}  // namespace

std::vector<std::vector<std::uint8_t>> fuzz_seeds() {
  std::vector<std::vector<std::uint8_t>> out;
  const node_address sender{role::learner, 2};
  std::vector<float> values(300);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>(i) - 1.0f;
  for (auto enc : {tensor_encoding::fp32, tensor_encoding::bf16, tensor_encoding::int8,
                   tensor_encoding::int4, tensor_encoding::int2}) {
    envelope_builder b(sender, incarnation{3}, 5, 9);
    b.body().initContribution().setTokens(4096);
    (void)b.add_tensor_values("fragment/1", values.data(), values.size(), enc, 32);
    out.push_back(to_input(b.finish(), false));
  }
  envelope_builder w(sender, incarnation{1}, 1, 0);
  auto shards = w.body().initWelcome().initShards(2);
  shards[0].setEndpoint("tcp://127.0.0.1:7001");
  shards[1].initFragments(3);
  out.push_back(to_input(w.finish(), true));
  envelope_builder e(sender, incarnation{1}, 2, 0);
  e.body().initError().setMessage("version mismatch");
  out.push_back(to_input(e.finish(), false));
  return out;
}
