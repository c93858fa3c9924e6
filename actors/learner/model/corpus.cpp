#include "learner/model/corpus.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/invariant.hpp"

namespace archipelago {
namespace {

// Decorrelates the split's shuffle from other uses of the run seed.
constexpr std::uint64_t stream_split = 0x73706c6974;  // "split"

struct file_closer {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

std::string quoted(const std::string& name) { return "'" + name + "'"; }

// Sorts ranges and joins the ones that touch: a window may then straddle two
// adjacent blocks of the same part, which is real, contiguous text.
std::vector<byte_range> sorted_merged(std::vector<byte_range> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const byte_range& a, const byte_range& b) { return a.begin < b.begin; });
  std::vector<byte_range> out;
  for (const byte_range& r : ranges) {
    if (!out.empty() && out.back().end == r.begin) {
      out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

expected<corpus> corpus::from_file(const std::string& path) {
  std::error_code ec;
  const auto type = std::filesystem::status(path, ec).type();
  if (type == std::filesystem::file_type::not_found)
    return make_error(errc::not_found, "corpus file " + quoted(path) + " does not exist");

  std::unique_ptr<std::FILE, file_closer> file(std::fopen(path.c_str(), "rb"));
  if (!file)
    return make_error(errc::io_error,
                      "cannot open corpus file " + quoted(path) + ": " + std::strerror(errno));
  std::string bytes;
  if (type == std::filesystem::file_type::regular) {
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec) bytes.reserve(static_cast<std::size_t>(size));
  }
  char buffer[1 << 16];
  for (;;) {
    const std::size_t got = std::fread(buffer, 1, sizeof buffer, file.get());
    bytes.append(buffer, got);
    if (got < sizeof buffer) break;
  }
  if (std::ferror(file.get()))
    return make_error(errc::io_error,
                      "cannot read corpus file " + quoted(path) + ": " + std::strerror(errno));
  if (bytes.empty()) return make_error(errc::invalid_input, "corpus " + quoted(path) + " is empty");
  return corpus(std::move(bytes), path);
}

corpus corpus::from_bytes(std::string bytes, std::string name) {
  return corpus(std::move(bytes), std::move(name));
}

expected<corpus_split> split_corpus(const corpus& data, int shards, double heldout_fraction,
                                    int context, std::uint64_t seed) {
  const std::string name = quoted(data.name());
  if (shards < 1)
    return make_error(errc::invalid_input,
                      "cannot split corpus " + name + ": shards must be at least 1, got " + std::to_string(shards));
  if (context < 1)
    return make_error(errc::invalid_input,
                      "cannot split corpus " + name + ": context must be at least 1, got " + std::to_string(context));
  if (!(heldout_fraction >= 0.0 && heldout_fraction < 1.0))
    return make_error(errc::invalid_input, "cannot split corpus " + name +
                                               ": held-out fraction must be in [0, 1), got " +
                                               std::to_string(heldout_fraction));

  const std::size_t size = data.size();
  const auto window = static_cast<std::size_t>(context) + 1;
  if (size < window)
    return make_error(errc::invalid_input, "corpus " + name + " has " + std::to_string(size) +
                                               " bytes, fewer than context + 1 = " + std::to_string(window));

  const std::size_t block = std::max(4 * window, std::min<std::size_t>(65536, size / 32));
  std::vector<byte_range> blocks;
  for (std::size_t begin = 0; begin < size; begin += block)
    blocks.push_back({begin, std::min(begin + block, size)});
  if (blocks.size() > 1 && blocks.back().size() < window) {  // too short for one window
    blocks[blocks.size() - 2].end = size;
    blocks.pop_back();
  }

  const std::size_t n = blocks.size();
  // The epsilon keeps 0.05 * 100 from rounding up to 6.
  const auto held = static_cast<std::size_t>(
      std::max(1.0, std::ceil(heldout_fraction * static_cast<double>(n) - 1e-9)));
  if (held + static_cast<std::size_t>(shards) > n)
    return make_error(errc::invalid_input,
                      "corpus " + name + " (" + std::to_string(size) + " bytes) gives only " +
                          std::to_string(n) + " blocks of " + std::to_string(block) +
                          " bytes, but the held-out part needs " + std::to_string(held) + " and each of " +
                          std::to_string(shards) +
                          " shards needs 1: use a larger corpus, fewer shards or a smaller held-out fraction");

  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  prng rng(derive_seed(seed, stream_split));
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);

  corpus_split split;
  std::vector<byte_range> heldout;
  std::vector<std::vector<byte_range>> parts(static_cast<std::size_t>(shards));
  for (std::size_t i = 0; i < n; ++i) {
    const byte_range& b = blocks[order[i]];
    if (i < held) {
      heldout.push_back(b);
    } else {
      parts[(i - held) % static_cast<std::size_t>(shards)].push_back(b);
    }
  }
  split.heldout = sorted_merged(std::move(heldout));
  split.shards.reserve(parts.size());
  for (auto& part : parts) split.shards.push_back(sorted_merged(std::move(part)));
  return split;
}

batch_sampler::batch_sampler(const corpus& data, std::vector<byte_range> shard, int context,
                             std::uint64_t seed)
    : data_(&data), shard_(std::move(shard)), context_(context), rng_(seed) {
  ARCHIPELAGO_INVARIANT(context_ >= 1, "batch sampler: context >= 1");
  ARCHIPELAGO_INVARIANT(!shard_.empty(), "batch sampler: a non-empty shard");
  std::uint64_t total = 0;
  for (const byte_range& r : shard_) {
    ARCHIPELAGO_INVARIANT(r.end <= data.size() && r.size() >= static_cast<std::size_t>(context_) + 1,
                          "batch sampler: every range inside the corpus and longer than the context");
    total += r.size() - static_cast<std::size_t>(context_);  // starts [begin, end - T - 1]
    cumulative_.push_back(total);
  }
}

void batch_sampler::next(int batch, std::int32_t* inputs, std::int32_t* targets) {
  const auto t = static_cast<std::size_t>(context_);
  const std::uint8_t* bytes = data_->data();
  for (int b = 0; b < batch; ++b) {
    // One uniform draw over all valid starts picks the range in proportion to
    // its starts and the start within it.
    const std::uint64_t r = rng_.below(cumulative_.back());
    const auto i = static_cast<std::size_t>(
        std::upper_bound(cumulative_.begin(), cumulative_.end(), r) - cumulative_.begin());
    const std::uint64_t before = i == 0 ? 0 : cumulative_[i - 1];
    const std::uint8_t* window = bytes + shard_[i].begin + (r - before);
    std::int32_t* in = inputs + static_cast<std::size_t>(b) * t;
    std::int32_t* out = targets + static_cast<std::size_t>(b) * t;
    for (std::size_t j = 0; j < t; ++j) {
      in[j] = window[j];
      out[j] = window[j + 1];
    }
  }
}

std::vector<eval_window> make_eval_windows(const std::vector<byte_range>& heldout, int context,
                                           std::int64_t max_scored_tokens) {
  const auto t = static_cast<std::size_t>(std::max(context, 1));
  const std::size_t stride = std::max<std::size_t>(1, t / 2);

  // Per range: where the next window goes and the first byte not yet scored.
  struct cursor {
    byte_range range;
    std::size_t offset = 0;
    std::size_t unscored = 0;  // 0: no window yet
  };
  std::vector<cursor> cursors;
  for (const byte_range& r : heldout)
    if (r.size() >= t + 1) cursors.push_back({r, r.begin, 0});

  std::vector<eval_window> windows;
  std::int64_t scored = 0;
  const bool capped = max_scored_tokens > 0;
  bool open = true;
  while (open && !(capped && scored >= max_scored_tokens)) {
    open = false;
    for (cursor& c : cursors) {
      if (capped && scored >= max_scored_tokens) break;
      if (c.unscored == c.range.end) continue;  // range done
      eval_window w;
      if (c.unscored == 0) {
        w = {c.range.begin, 0};
      } else {
        // Step by the stride, but never past the last window that fits; score
        // from the first byte not yet scored (position i predicts byte offset + 1 + i).
        const std::size_t last = c.range.end - t - 1;
        w.offset = std::min(c.offset + stride, last);
        w.first_scored = static_cast<int>(c.unscored - w.offset - 1);
      }
      c.offset = w.offset;
      c.unscored = w.offset + t + 1;
      auto count = static_cast<std::int64_t>(t) - w.first_scored;
      if (capped && scored + count > max_scored_tokens) {  // trim to land on the cap
        count = max_scored_tokens - scored;
        w.first_scored = static_cast<int>(static_cast<std::int64_t>(t) - count);
      }
      windows.push_back(w);
      scored += count;
      open = open || c.unscored != c.range.end;
    }
  }
  std::sort(windows.begin(), windows.end(),
            [](const eval_window& a, const eval_window& b) { return a.offset < b.offset; });
  return windows;
}

std::int64_t scored_tokens(const std::vector<eval_window>& windows, int context) {
  std::int64_t total = 0;
  for (const eval_window& w : windows) total += context - w.first_scored;
  return total;
}

}  // namespace archipelago
