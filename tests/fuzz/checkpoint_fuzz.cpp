// Fuzz target for the checkpoint decoder (schemas/checkpoint.capnp): the file
// `sample`, `train --resume` and the replay commands read. Input: the file's
// bytes. A checkpoint that decodes must encode again and decode to the same values.

#include <cstring>
#include <string>
#include <string_view>

#include "core/layout.hpp"
#include "fuzz_target.hpp"
#include "learner/model/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace archipelago;
  auto c = decode_checkpoint(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.ckpt");
  if (!c) return 0;
  auto bytes = encode_checkpoint(*c);
  FUZZ_CHECK(bytes.has_value());
  auto again = decode_checkpoint(*bytes, "fuzz.ckpt");
  FUZZ_CHECK(again.has_value());
  FUZZ_CHECK(again->params.size() == c->params.size());
  FUZZ_CHECK(std::memcmp(again->params.data(), c->params.data(), c->params.size() * sizeof(float)) == 0);
  FUZZ_CHECK(again->corpus == c->corpus && again->steps == c->steps && again->tokens == c->tokens);
  return 0;
}

std::vector<std::vector<std::uint8_t>> fuzz_seeds() {
  using namespace archipelago;
  std::vector<std::vector<std::uint8_t>> out;
  // Two tiny shapes (a few thousand floats): the smallest the validation accepts, tied and untied.
  for (bool tied : {true, false}) {
    checkpoint c;
    c.shape = {256, 4, 4, 1, 2, tied};
    c.params.resize(make_layout(c.shape).total_floats);
    for (std::size_t i = 0; i < c.params.size(); ++i) c.params[i] = 0.001f * static_cast<float>(i);
    c.steps = 12;
    c.tokens = 4096;
    c.corpus = "synthetic";
    c.seed = 7;
    auto bytes = encode_checkpoint(c);
    if (bytes) out.emplace_back(bytes->begin(), bytes->end());
  }
  return out;
}
