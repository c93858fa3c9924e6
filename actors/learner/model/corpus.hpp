#pragma once
// The data pipeline: a corpus of bytes, its split into a held-out part and one
// part per learner shard, random training windows, and the sliding evaluation
// windows that score every held-out byte once, with context.
//
// A window of a context-T model is T + 1 consecutive bytes: the model reads
// bytes [0, T) and predicts bytes [1, T + 1); "position i" predicts byte i + 1.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/prng.hpp"

namespace archipelago {

class corpus {
 public:
  /// Reads a whole file. Errors: missing (not_found), unreadable (io_error),
  /// empty (invalid_input). The path doubles as the name.
  static expected<corpus> from_file(const std::string& path);
  /// Wraps bytes already in memory (e.g. synthetic text); `name` is for messages.
  static corpus from_bytes(std::string bytes, std::string name);

  const std::string& name() const { return name_; }
  std::size_t size() const { return bytes_.size(); }
  const std::uint8_t* data() const { return reinterpret_cast<const std::uint8_t*>(bytes_.data()); }
  std::string_view bytes() const { return bytes_; }

 private:
  corpus(std::string bytes, std::string name) : bytes_(std::move(bytes)), name_(std::move(name)) {}

  std::string bytes_;
  std::string name_;
};

/// Bytes [begin, end) of a corpus.
struct byte_range {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
  bool operator==(const byte_range&) const = default;
};

struct corpus_split {
  std::vector<byte_range> heldout;              // sorted, disjoint
  std::vector<std::vector<byte_range>> shards;  // one list per learner shard, each sorted
};

/// Cuts the corpus into contiguous blocks of max(4 (T + 1), min(65536, size / 32))
/// bytes (a trailing block shorter than T + 1 joins its neighbour), shuffles
/// them with `seed`, holds out the first max(1, ceil(heldout_fraction * blocks))
/// and deals the rest round-robin to `shards`. Adjacent blocks that land in the
/// same part are merged, so every range has at least T + 1 bytes and parts are
/// disjoint and together cover the corpus. Errors (invalid_input): bad
/// arguments, a corpus shorter than T + 1, or too few blocks for the held-out
/// part and one block per shard.
expected<corpus_split> split_corpus(const corpus& data, int shards, double heldout_fraction,
                                    int context, std::uint64_t seed);

/// Random training windows from one shard. Keeps a pointer to the corpus, which
/// must outlive the sampler. Preconditions (asserted): context >= 1, the shard
/// is non-empty and every range has at least context + 1 bytes.
class batch_sampler {
 public:
  batch_sampler(const corpus& data, std::vector<byte_range> shard, int context, std::uint64_t seed);

  /// Fills row-major [batch][context] arrays: a window start is uniform over all
  /// valid starts in the shard (so a range is picked in proportion to its
  /// starts), inputs = bytes [start, start + T), targets = bytes [start + 1,
  /// start + T + 1), as values 0..255.
  void next(int batch, std::int32_t* inputs, std::int32_t* targets);

  int context() const { return context_; }
  /// Number of distinct windows the shard offers.
  std::uint64_t windows() const { return cumulative_.empty() ? 0 : cumulative_.back(); }

 private:
  const corpus* data_;
  std::vector<byte_range> shard_;
  std::vector<std::uint64_t> cumulative_;  // valid starts in ranges [0, i]
  int context_;
  prng rng_;
};

/// One evaluation window: T + 1 bytes at `offset`; positions [first_scored, T)
/// are scored.
struct eval_window {
  std::size_t offset = 0;
  int first_scored = 0;
  bool operator==(const eval_window&) const = default;
};

/// Sliding windows over the held-out ranges, stride s = max(1, T / 2): the first
/// window of a range scores all T positions, later ones only their last s, and
/// the last window is aligned to the range end and scores only what is still
/// unscored. So every held-out byte except the first of each range is scored
/// exactly once, mostly with at least T - s bytes of context. With a cap
/// (max_scored_tokens > 0) windows are taken round-robin over the ranges (so the
/// cap samples all of them) and the window that reaches the cap is trimmed to
/// land on it exactly. Returned sorted by offset; ranges shorter than T + 1
/// are skipped.
std::vector<eval_window> make_eval_windows(const std::vector<byte_range>& heldout, int context,
                                           std::int64_t max_scored_tokens);

/// Total scored positions of `windows`.
std::int64_t scored_tokens(const std::vector<eval_window>& windows, int context);

}  // namespace archipelago
