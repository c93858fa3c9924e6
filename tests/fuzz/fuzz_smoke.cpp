// A bounded, seeded fuzz run without libFuzzer: mutates valid multipart
// messages (bit flips, truncation, splices, length changes) and feeds them to
// the decoder target. Usage: archipelago_fuzz_smoke [iterations] [seed]
// [corpus-dir]; with a directory it writes the valid seed inputs there, as a
// starting corpus for libFuzzer.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/prng.hpp"
#include "transport/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using namespace archipelago;
using namespace archipelago::transport;

/// Serialises a message in the fuzz target's input format.
std::vector<std::uint8_t> to_input(const encoded_message& m, bool misalign) {
  std::vector<std::vector<std::uint8_t>> frames;
  const auto* p = reinterpret_cast<const std::uint8_t*>(m.envelope.begin());
  frames.emplace_back(p, p + m.envelope.size() * 8);
  for (const auto& t : m.tensors) frames.push_back(*t);
  std::vector<std::uint8_t> in{static_cast<std::uint8_t>(frames.size() | 0x40 | (misalign ? 0x80 : 0))};
  for (const auto& f : frames) {
    const std::size_t len = std::min<std::size_t>(f.size(), 65535);
    in.push_back(static_cast<std::uint8_t>(len & 0xff));
    in.push_back(static_cast<std::uint8_t>(len >> 8));
    in.insert(in.end(), f.begin(), f.begin() + static_cast<std::ptrdiff_t>(len));
  }
  return in;
}

std::vector<std::vector<std::uint8_t>> seeds() {
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

}  // namespace

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 20000;
  const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  std::printf("fuzz smoke: %ld iterations, seed %llu\n", iterations, static_cast<unsigned long long>(seed));
  archipelago::prng rng(seed);
  const auto corpus = seeds();
  if (argc > 3) {
    for (std::size_t i = 0; i < corpus.size(); ++i) {
      const std::string path = std::string(argv[3]) + "/seed-" + std::to_string(i);
      if (FILE* f = std::fopen(path.c_str(), "wb")) {
        std::fwrite(corpus[i].data(), 1, corpus[i].size(), f);
        std::fclose(f);
      }
    }
  }
  for (long i = 0; i < iterations; ++i) {
    std::vector<std::uint8_t> in = corpus[rng.below(corpus.size())];
    const int mutations = 1 + static_cast<int>(rng.below(8));
    for (int k = 0; k < mutations && !in.empty(); ++k) {
      switch (rng.below(5)) {
        case 0: in[rng.below(in.size())] ^= static_cast<std::uint8_t>(1u << rng.below(8)); break;
        case 1: in.resize(rng.below(in.size() + 1)); break;
        case 2: in[rng.below(in.size())] = static_cast<std::uint8_t>(rng.below(256)); break;
        case 3: {  // splice a chunk of another seed
          const auto& other = corpus[rng.below(corpus.size())];
          const std::size_t at = rng.below(in.size()), from = rng.below(other.size());
          const std::size_t len = std::min<std::size_t>(rng.below(64), std::min(in.size() - at, other.size() - from));
          std::copy(other.begin() + static_cast<std::ptrdiff_t>(from),
                    other.begin() + static_cast<std::ptrdiff_t>(from + len),
                    in.begin() + static_cast<std::ptrdiff_t>(at));
          break;
        }
        default: in.insert(in.begin() + static_cast<std::ptrdiff_t>(rng.below(in.size() + 1)),
                           static_cast<std::uint8_t>(rng.below(256)));
      }
    }
    LLVMFuzzerTestOneInput(in.data(), in.size());
  }
  std::printf("fuzz smoke: %ld inputs, no crash\n", iterations);
  return 0;
}
