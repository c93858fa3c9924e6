// A bounded, seeded fuzz run without libFuzzer, linked with one target file:
// first every file of each --corpus directory is replayed once (the inputs of
// past findings: CI regressions), then ITERATIONS inputs are made by mutating
// the target's fuzz_seeds() and the corpus files (bit flips, truncation, byte
// changes, splices, insertions) and fed to the target.
//
// Usage: <target>_fuzz_smoke ITERATIONS SEED [--corpus DIR]... [--write-seeds DIR]
// --write-seeds writes fuzz_seeds() to DIR (a starting corpus for libFuzzer) and exits.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/prng.hpp"
#include "fuzz_target.hpp"

namespace {

using input = std::vector<std::uint8_t>;

input read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void mutate(input& in, const std::vector<input>& pool, archipelago::prng& rng) {
  const int mutations = 1 + static_cast<int>(rng.below(8));
  for (int k = 0; k < mutations && !in.empty(); ++k) {
    switch (rng.below(5)) {
      case 0: in[rng.below(in.size())] ^= static_cast<std::uint8_t>(1u << rng.below(8)); break;
      case 1: in.resize(rng.below(in.size() + 1)); break;
      case 2: in[rng.below(in.size())] = static_cast<std::uint8_t>(rng.below(256)); break;
      case 3: {  // splice a chunk of another input
        const input& other = pool[rng.below(pool.size())];
        if (other.empty()) break;
        const std::size_t at = rng.below(in.size()), from = rng.below(other.size());
        const std::size_t len = std::min<std::size_t>(rng.below(64), std::min(in.size() - at, other.size() - from));
        std::copy(other.begin() + static_cast<std::ptrdiff_t>(from),
                  other.begin() + static_cast<std::ptrdiff_t>(from + len), in.begin() + static_cast<std::ptrdiff_t>(at));
        break;
      }
      default:
        in.insert(in.begin() + static_cast<std::ptrdiff_t>(rng.below(in.size() + 1)),
                  static_cast<std::uint8_t>(rng.below(256)));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ITERATIONS SEED [--corpus DIR]... [--write-seeds DIR]\n", argv[0]);
    return 2;
  }
  const long iterations = std::atol(argv[1]);
  const std::uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  std::vector<input> pool = fuzz_seeds();
  std::size_t replayed = 0;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], dir = argv[i + 1];
    if (flag == "--write-seeds") {
      for (std::size_t s = 0; s < pool.size(); ++s) {
        std::ofstream out(std::filesystem::path(dir) / ("seed-" + std::to_string(s)), std::ios::binary);
        out.write(reinterpret_cast<const char*>(pool[s].data()), static_cast<std::streamsize>(pool[s].size()));
      }
      std::printf("fuzz smoke: %zu seeds written to %s\n", pool.size(), dir.c_str());
      return 0;
    }
    if (flag != "--corpus") {
      std::fprintf(stderr, "fuzz smoke: unknown flag '%s'\n", flag.c_str());
      return 2;
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      std::fprintf(stderr, "fuzz smoke: --corpus %s: not a directory\n", dir.c_str());
      return 2;
    }
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.is_regular_file() && !e.path().filename().string().starts_with(".")) files.push_back(e.path());
    std::sort(files.begin(), files.end());  // one order: a seed replays the same run
    for (const auto& f : files) {
      input in = read_file(f);
      std::printf("fuzz smoke: replaying %s (%zu bytes)\n", f.string().c_str(), in.size());
      std::fflush(stdout);  // a crash names the input it was on
      LLVMFuzzerTestOneInput(in.data(), in.size());
      pool.push_back(std::move(in));
      ++replayed;
    }
  }
  std::printf("fuzz smoke: %zu corpus inputs replayed; %ld iterations, seed %llu\n", replayed, iterations,
              static_cast<unsigned long long>(seed));
  archipelago::prng rng(seed);
  for (long i = 0; i < iterations; ++i) {
    input in = pool[rng.below(pool.size())];
    mutate(in, pool, rng);
    LLVMFuzzerTestOneInput(in.data(), in.size());
  }
  std::printf("fuzz smoke: %ld inputs, no crash\n", iterations);
  return 0;
}
