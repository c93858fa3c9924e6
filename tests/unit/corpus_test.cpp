#include "learner/model/corpus.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/prng.hpp"

using namespace archipelago;

namespace {

std::string random_bytes(std::size_t n, std::uint64_t seed) {
  prng rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng.below(256));
  return s;
}

// A scratch directory unique to this process, removed on scope exit.
struct scratch_dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("archipelago_corpus_test_" + std::to_string(::getpid()));
  scratch_dir() { std::filesystem::create_directories(path); }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Checks the split invariants: parts are sorted, disjoint, cover the corpus,
// and every range holds at least one window.
void check_split(const corpus_split& split, std::size_t size, int shards, int context) {
  REQUIRE(split.shards.size() == static_cast<std::size_t>(shards));
  REQUIRE(!split.heldout.empty());
  std::vector<byte_range> all = split.heldout;
  for (const auto& shard : split.shards) {
    REQUIRE(!shard.empty());
    all.insert(all.end(), shard.begin(), shard.end());
  }
  const auto by_begin = [](const byte_range& a, const byte_range& b) { return a.begin < b.begin; };
  CHECK(std::is_sorted(split.heldout.begin(), split.heldout.end(), by_begin));
  for (const auto& shard : split.shards) CHECK(std::is_sorted(shard.begin(), shard.end(), by_begin));
  std::sort(all.begin(), all.end(), by_begin);
  std::size_t at = 0;
  for (const byte_range& r : all) {
    CHECK(r.begin == at);  // no gap, no overlap
    CHECK(r.size() >= static_cast<std::size_t>(context) + 1);
    at = r.end;
  }
  CHECK(at == size);
}

std::size_t total_bytes(const std::vector<byte_range>& ranges) {
  std::size_t n = 0;
  for (const byte_range& r : ranges) n += r.size();
  return n;
}

}  // namespace

TEST_CASE("corpus: from_bytes keeps the bytes and the name") {
  const corpus c = corpus::from_bytes("hello\0world", "greeting");
  CHECK(c.name() == "greeting");
  CHECK(c.size() == 5);  // the literal stops at the NUL
  const std::string with_nul("ab\0\xff", 4);
  const corpus d = corpus::from_bytes(with_nul, "binary");
  REQUIRE(d.size() == 4);
  CHECK(d.data()[2] == 0);
  CHECK(d.data()[3] == 255);
  CHECK(d.bytes() == with_nul);
}

TEST_CASE("corpus: from_file reads a file and reports missing, empty and unreadable ones") {
  scratch_dir dir;
  const std::uint64_t seed = 41;
  CAPTURE(seed);
  const std::string content = random_bytes(200000, seed);
  const std::string path = (dir.path / "data.bin").string();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  const auto c = corpus::from_file(path);
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.err().to_string()));
  CHECK(c->name() == path);
  CHECK(c->bytes() == content);

  const std::string missing = (dir.path / "missing.txt").string();
  const auto m = corpus::from_file(missing);
  REQUIRE_FALSE(m.has_value());
  CHECK(m.err().code == errc::not_found);
  CHECK(m.err().message == "corpus file '" + missing + "' does not exist");

  const std::string empty = (dir.path / "empty.txt").string();
  { std::ofstream out(empty); }
  const auto e = corpus::from_file(empty);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.err().code == errc::invalid_input);
  CHECK(e.err().message == "corpus '" + empty + "' is empty");

  // A directory opens but cannot be read (works even as root, unlike chmod 000).
  const auto d = corpus::from_file(dir.path.string());
  REQUIRE_FALSE(d.has_value());
  CHECK(d.err().code == errc::io_error);
  CHECK(d.err().message.find(dir.path.string()) != std::string::npos);
}

TEST_CASE("corpus: split is deterministic, disjoint, covering, with usable ranges") {
  const std::uint64_t seed = 5;
  CAPTURE(seed);
  const corpus c = corpus::from_bytes(random_bytes(3'000'000, seed), "random");
  const int shards = 3, context = 64;
  const auto a = split_corpus(c, shards, 0.05, context, seed);
  REQUIRE_MESSAGE(a.has_value(), (a ? "" : a.err().to_string()));
  check_split(*a, c.size(), shards, context);

  const auto b = split_corpus(c, shards, 0.05, context, seed);
  REQUIRE(b.has_value());
  CHECK(a->heldout == b->heldout);
  CHECK(a->shards == b->shards);

  const auto other = split_corpus(c, shards, 0.05, context, seed + 1);
  REQUIRE(other.has_value());
  CHECK(a->heldout != other->heldout);

  // 3 MB gives blocks of 3000000 / 32 = 93750 -> capped at 65536: 46 blocks, of
  // which ceil(0.05 * 46) = 3 are held out (the last, short one may be merged).
  const std::size_t held = total_bytes(a->heldout);
  CHECK(held >= 3 * 65536 - 65536);
  CHECK(held <= 3 * 65536 + 65536);
  // The rest is dealt evenly: shard sizes differ by at most one block (plus the tail).
  std::size_t lo = c.size(), hi = 0;
  for (const auto& shard : a->shards) {
    lo = std::min(lo, total_bytes(shard));
    hi = std::max(hi, total_bytes(shard));
  }
  CHECK(hi - lo <= 2 * 65536);
}

TEST_CASE("corpus: split invariants hold across sizes, contexts and shard counts") {
  const std::uint64_t seed = 99;
  CAPTURE(seed);
  prng rng(seed);
  int succeeded = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int context = 1 + static_cast<int>(rng.below(128));
    const int shards = 1 + static_cast<int>(rng.below(6));
    const double fraction = rng.uniform() * 0.3;
    const std::size_t size = static_cast<std::size_t>(context) + 1 + rng.below(200000);
    const std::uint64_t split_seed = rng.next();
    CAPTURE(trial);
    CAPTURE(context);
    CAPTURE(shards);
    CAPTURE(fraction);
    CAPTURE(size);
    const corpus c = corpus::from_bytes(std::string(size, 'x'), "trial");
    const auto split = split_corpus(c, shards, fraction, context, split_seed);
    if (!split) {
      CHECK(split.err().code == errc::invalid_input);
      CHECK(split.err().message.find("blocks") != std::string::npos);
      // Refusals only come from too few blocks (the block rule from the header).
      const std::size_t window = static_cast<std::size_t>(context) + 1;
      const std::size_t block = std::max(4 * window, std::min<std::size_t>(65536, size / 32));
      std::size_t blocks = std::max<std::size_t>(1, size / block);
      if (size >= block && size % block >= window) ++blocks;
      const double held = std::max(1.0, std::ceil(fraction * static_cast<double>(blocks) - 1e-9));
      CHECK(held + shards > static_cast<double>(blocks));
      continue;
    }
    ++succeeded;
    check_split(*split, size, shards, context);
  }
  CHECK(succeeded > 150);
}

TEST_CASE("corpus: split errors name the corpus and the numbers") {
  const corpus tiny = corpus::from_bytes("0123456789", "tiny");
  const auto short_corpus = split_corpus(tiny, 1, 0.1, 16, 1);
  REQUIRE_FALSE(short_corpus.has_value());
  CHECK(short_corpus.err().code == errc::invalid_input);
  CHECK(short_corpus.err().message == "corpus 'tiny' has 10 bytes, fewer than context + 1 = 17");

  // 200 bytes with context 7 give blocks of 32 bytes: 6 full blocks and an
  // 8-byte tail that is long enough to stand alone, so 7 blocks: 1 held out
  // plus 6 shards fit, 7 shards do not.
  const corpus small = corpus::from_bytes(std::string(200, 'a'), "small");
  const auto fits = split_corpus(small, 6, 0.0, 7, 1);
  REQUIRE_MESSAGE(fits.has_value(), (fits ? "" : fits.err().to_string()));
  check_split(*fits, 200, 6, 7);
  const auto too_many = split_corpus(small, 7, 0.0, 7, 1);
  REQUIRE_FALSE(too_many.has_value());
  CHECK(too_many.err().code == errc::invalid_input);
  const std::string& msg = too_many.err().message;
  CHECK(msg.find("'small'") != std::string::npos);
  CHECK(msg.find("200 bytes") != std::string::npos);
  CHECK(msg.find("7 blocks of 32 bytes") != std::string::npos);
  CHECK(msg.find("7 shards") != std::string::npos);

  for (const auto& [shards, fraction, context] :
       std::vector<std::tuple<int, double, int>>{{0, 0.1, 8}, {2, 1.0, 8}, {2, -0.1, 8}, {2, 0.1, 0}}) {
    CAPTURE(shards);
    CAPTURE(fraction);
    CAPTURE(context);
    const auto bad = split_corpus(small, shards, fraction, context, 1);
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.err().code == errc::invalid_input);
    CHECK(bad.err().message.find("'small'") != std::string::npos);
  }
}

TEST_CASE("corpus: a short trailing block joins its neighbour") {
  // 325 bytes, context 7: blocks of 32, ten full ones and a 5-byte tail (< 8),
  // which is merged, so no range is shorter than a window.
  const corpus c = corpus::from_bytes(std::string(325, 'z'), "tail");
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    CAPTURE(seed);
    const auto split = split_corpus(c, 2, 0.2, 7, seed);
    REQUIRE(split.has_value());
    check_split(*split, 325, 2, 7);
  }
}

TEST_CASE("batch_sampler: windows are corpus bytes, targets shifted by one") {
  const std::uint64_t seed = 17;
  CAPTURE(seed);
  const corpus c = corpus::from_bytes(random_bytes(1 << 16, seed), "random");
  const int context = 32;
  const auto split = split_corpus(c, 2, 0.1, context, seed);
  REQUIRE(split.has_value());
  const std::vector<byte_range>& shard = split->shards[1];

  batch_sampler sampler(c, shard, context, seed);
  batch_sampler twin(c, shard, context, seed);
  batch_sampler other(c, shard, context, seed + 1);
  const int batch = 16;
  std::vector<std::int32_t> in(batch * context), out(batch * context);
  std::vector<std::int32_t> in2(in.size()), out2(in.size()), in3(in.size()), out3(in.size());
  for (int step = 0; step < 20; ++step) {
    sampler.next(batch, in.data(), out.data());
    twin.next(batch, in2.data(), out2.data());
    other.next(batch, in3.data(), out3.data());
    CHECK(in == in2);
    CHECK(out == out2);
    CHECK(in != in3);
    for (int b = 0; b < batch; ++b) {
      const std::int32_t* row_in = in.data() + b * context;
      const std::int32_t* row_out = out.data() + b * context;
      for (int t = 0; t + 1 < context; ++t) REQUIRE(row_out[t] == row_in[t + 1]);
      for (int t = 0; t < context; ++t) REQUIRE((row_in[t] >= 0 && row_in[t] < 256));
      // Find the window in the shard: random bytes make a 33-byte match unique.
      std::string window(static_cast<std::size_t>(context) + 1, '\0');
      for (int t = 0; t < context; ++t) window[static_cast<std::size_t>(t)] = static_cast<char>(row_in[t]);
      window.back() = static_cast<char>(row_out[context - 1]);
      const std::size_t at = c.bytes().find(window);
      REQUIRE(at != std::string_view::npos);
      const bool inside = std::any_of(shard.begin(), shard.end(), [&](const byte_range& r) {
        return at >= r.begin && at + window.size() <= r.end;
      });
      CHECK(inside);
    }
  }
}

TEST_CASE("batch_sampler: ranges are picked in proportion to their valid starts") {
  // bytes[i] = i, so a window's first input is its start offset.
  std::string bytes(256, '\0');
  for (int i = 0; i < 256; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>(i);
  const corpus c = corpus::from_bytes(bytes, "ramp");
  const int context = 16;
  // Valid starts: [0, 24) -> 24, [100, 101) -> 1, [200, 240) -> 40; 65 in all.
  const std::vector<byte_range> shard = {{0, 40}, {100, 117}, {200, 256}};
  const std::uint64_t seed = 3;
  CAPTURE(seed);
  batch_sampler sampler(c, shard, context, seed);
  CHECK(sampler.windows() == 65);
  const int batch = 64, steps = 500;
  std::vector<std::int32_t> in(batch * context), out(batch * context);
  std::vector<int> hits(256, 0);
  for (int step = 0; step < steps; ++step) {
    sampler.next(batch, in.data(), out.data());
    for (int b = 0; b < batch; ++b) {
      const int start = in[static_cast<std::size_t>(b * context)];
      for (int t = 0; t < context; ++t) {
        REQUIRE(in[static_cast<std::size_t>(b * context + t)] == start + t);
        REQUIRE(out[static_cast<std::size_t>(b * context + t)] == start + t + 1);
      }
      ++hits[static_cast<std::size_t>(start)];
    }
  }
  const std::set<int> valid = [] {
    std::set<int> v;
    for (int s = 0; s < 24; ++s) v.insert(s);
    v.insert(100);
    for (int s = 200; s < 240; ++s) v.insert(s);
    return v;
  }();
  const double draws = batch * steps, expected = draws / 65;
  for (int s = 0; s < 256; ++s) {
    CAPTURE(s);
    if (valid.count(s) == 0) {
      CHECK(hits[static_cast<std::size_t>(s)] == 0);
    } else {
      // Each valid start is uniform: ~492 hits, sd ~22; allow 6 sd.
      CHECK(std::abs(hits[static_cast<std::size_t>(s)] - expected) < 6 * std::sqrt(expected));
    }
  }
}

TEST_CASE("eval windows: every held-out byte but the first of each range is scored once") {
  const std::uint64_t seed = 23;
  CAPTURE(seed);
  prng rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int context = 1 + static_cast<int>(rng.below(70));
    const auto t = static_cast<std::size_t>(context);
    // Ranges of assorted lengths, from exactly one window up, with gaps between.
    std::vector<byte_range> heldout;
    std::size_t at = rng.below(50);
    const int ranges = 1 + static_cast<int>(rng.below(5));
    for (int r = 0; r < ranges; ++r) {
      const std::size_t len = t + 1 + (rng.below(3) == 0 ? rng.below(3) : rng.below(20 * t + 50));
      heldout.push_back({at, at + len});
      at += len + 1 + rng.below(100);
    }
    CAPTURE(trial);
    CAPTURE(context);
    CAPTURE(ranges);

    const std::vector<eval_window> windows = make_eval_windows(heldout, context, 0);
    std::vector<int> scored(at, 0);
    for (const eval_window& w : windows) {
      CAPTURE(w.offset);
      CAPTURE(w.first_scored);
      REQUIRE(w.first_scored >= 0);
      REQUIRE(w.first_scored < context);
      const auto range = std::find_if(heldout.begin(), heldout.end(), [&](const byte_range& r) {
        return w.offset >= r.begin && w.offset + t + 1 <= r.end;
      });
      REQUIRE(range != heldout.end());
      // Later windows keep at least half the context for every scored byte.
      if (w.offset != range->begin) CHECK(w.first_scored >= context - std::max(1, context / 2));
      for (std::size_t i = static_cast<std::size_t>(w.first_scored); i < t; ++i) ++scored[w.offset + 1 + i];
    }
    std::int64_t expected = 0;
    for (const byte_range& r : heldout) {
      CHECK(scored[r.begin] == 0);
      for (std::size_t i = r.begin + 1; i < r.end; ++i) REQUIRE(scored[i] == 1);
      expected += static_cast<std::int64_t>(r.size()) - 1;
    }
    CHECK(scored_tokens(windows, context) == expected);
    CHECK(std::is_sorted(windows.begin(), windows.end(),
                         [](const eval_window& a, const eval_window& b) { return a.offset < b.offset; }));
  }
}

TEST_CASE("eval windows: a cap is met exactly and spread over all ranges") {
  const int context = 64;
  const std::vector<byte_range> heldout = {{0, 65536}, {100000, 165536}, {200000, 265536}};
  for (const std::int64_t cap : {1, 63, 64, 65, 1000, 65536, 196605, 1000000}) {
    CAPTURE(cap);
    const std::vector<eval_window> windows = make_eval_windows(heldout, context, cap);
    const std::int64_t total = 3 * 65535;
    CHECK(scored_tokens(windows, context) == std::min(cap, total));
    std::set<std::size_t> seen_ranges;
    std::set<std::size_t> scored;
    for (const eval_window& w : windows) {
      for (std::size_t r = 0; r < heldout.size(); ++r)
        if (w.offset >= heldout[r].begin && w.offset < heldout[r].end) seen_ranges.insert(r);
      for (int i = w.first_scored; i < context; ++i)
        CHECK(scored.insert(w.offset + 1 + static_cast<std::size_t>(i)).second);  // once
    }
    if (cap >= 3 * context) CHECK(seen_ranges.size() == 3);
  }
  CHECK(make_eval_windows({}, context, 100).empty());
  CHECK(make_eval_windows({{0, 64}}, context, 100).empty());  // shorter than a window
}
