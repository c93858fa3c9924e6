// Fuzz target for the configuration reader: a TOML file (--config) applied over
// the defaults, knob by knob, with bounds. Input: the file's text. A file that
// applies and validates must round-trip: to_toml of the result applies again
// and gives the same TOML (config.hpp promises the round trip).

#include <string>
#include <string_view>

#include "core/config.hpp"
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace archipelago;
  config cfg;
  if (!apply_toml(cfg, std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.toml")) return 0;
  (void)validate(cfg);  // cross-knob checks: any answer, no crash
  const std::string text = to_toml(cfg);
  config again;
  FUZZ_CHECK(static_cast<bool>(apply_toml(again, text, "round-trip.toml")));
  FUZZ_CHECK(to_toml(again) == text);
  return 0;
}

std::vector<std::vector<std::uint8_t>> fuzz_seeds() {
  using namespace archipelago;
  std::vector<std::string> texts = {
      to_toml(config{}),
      "[model]\npreset = \"nano\"\n[mesh]\nmode = \"decoupled\"\nlearners = 4\nfragments = 8\n"
      "learner_slowdown = \"1,1,2,4\"\n[wire]\nencoding = \"int4\"\nblock_size = 32\ncurve = false\n",
      "[train]\nsteps = 100\nseed = 3\n[link]\nlatency_ms = 20.5\nloss = 0.01\n# a comment\n",
  };
  std::vector<std::vector<std::uint8_t>> out;
  for (const auto& t : texts) out.emplace_back(t.begin(), t.end());
  return out;
}
