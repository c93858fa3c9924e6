#pragma once
// The built-in training corpus: a seeded synthetic text source whose entropy
// rate in bits per byte is known exactly, so every run has a floor to compare
// its held-out loss with.
//
// Tokens are `words` distinct lowercase words (a-z, 2..8 letters, mostly 3..6),
// a sentence end "." and a paragraph break "\n". The token sequence is a Markov
// chain whose state is (previous token, current token):
//   - a word is followed by one of 1..6 seeded successor words (Zipf weights
//     1/rank) or by "." (a seeded per-word probability in [0.10, 0.35], so
//     sentences average about 4.3 words);
//   - about 30% of the words are "order 2": the previous token re-ranks their
//     successors and swaps the favourite for a word of its own (a table seeded
//     from the pair), so they are only fully predictable from both tokens;
//   - "." is followed by "\n" with probability 0.1, otherwise by a sentence
//     start; "\n" is followed by a sentence start; any word can start a
//     sentence (nearly uniform: Zipf weights 1/rank^0.3 in a seeded order).
// Nothing further back than the previous two tokens helps prediction, and
// every word can end a sentence, so the chain is irreducible on the states
// reachable from the start. With the defaults (seed 7, 256 words) the rate is
// 0.676 bits per byte; knowing only the current token gives 0.727.
//
// Rendering rules (injective and decodable left to right):
//   - a word after a word renders as " " + word;
//   - a word after "." renders as " " + Word (first letter uppercase);
//   - a word after "\n", and the first token of every text, renders as Word
//     (no space): a text starts as if a paragraph had just ended;
//   - "." renders as "." and "\n" as "\n"; "." only ever follows a word and
//     "\n" only ever follows ".".
// So a text looks like "Kel maro vit. Sa tuno.\nVit kel sa." and every maximal
// run of letters is exactly one word (lowercase it to look it up); a word is
// known to be complete when the byte after it (" ", ".") arrives.
//
// The entropy rate is computed once, in make(): the stationary distribution pi
// over the reachable states (sparse power iteration on the lazy chain), then
//   rate = sum_s pi(s) H(next | s) / sum_s pi(s) E[bytes of next token | s],
// which is the byte stream's rate because the rendering is injective.
// States whose previous token cannot matter (current token not an order-2
// word) are merged; that lumping is exact and keeps "." a single state.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace archipelago {

struct synthetic_params {
  std::uint64_t seed = 7;  // selects the language (words, tables)
  int words = 256;         // vocabulary size, in [min_words, max_words]
};

/// A generated text with what an ideal predictor pays for it.
struct synthetic_sample {
  std::string text;                  // exactly the requested number of bytes
  std::vector<std::int32_t> tokens;  // the tokens emitted; the last may be cut short in text
  double code_bits = 0;              // sum of -log2 P(token | state) over `tokens`
};

class synthetic_source {
 public:
  static constexpr int min_words = 4;
  static constexpr int max_words = 100000;

  /// Builds the language and its exact entropy rate. Errors: words out of range
  /// (invalid_input); the stationary distribution failed to converge (internal).
  static expected<synthetic_source> make(const synthetic_params& params);

  /// Entropy rate of the byte stream, in bits per byte: the floor for any model.
  double entropy_rate_bits_per_byte() const { return rate_; }
  /// The best rate a predictor that sees only the current token (not the one
  /// before) can reach; the gap to entropy_rate is what order-2 context buys.
  double order1_rate_bits_per_byte() const { return order1_rate_; }
  /// Mean rendered bytes per token under the stationary distribution.
  double bytes_per_token() const { return bytes_per_token_; }

  /// `bytes` bytes of text, the last token cut short. The same (source,
  /// stream_seed) always gives the same text; different stream seeds give
  /// independent texts.
  std::string generate(std::size_t bytes, std::uint64_t stream_seed) const;
  /// As generate(), plus the token sequence (if keep_tokens) and the ideal
  /// predictor's code length; code_bits / text.size() estimates the rate.
  synthetic_sample sample(std::size_t bytes, std::uint64_t stream_seed,
                          bool keep_tokens = true) const;

  const synthetic_params& params() const { return params_; }
  /// Token ids: words are [0, words), then "." and "\n".
  int token_count() const { return params_.words + 2; }
  std::int32_t period_token() const { return params_.words; }
  std::int32_t newline_token() const { return params_.words + 1; }
  /// The lowercase spelling of word `id`.
  const std::string& word(std::int32_t id) const { return words_[static_cast<std::size_t>(id)]; }
  /// Number of reachable (previous, current) states.
  std::size_t states() const { return state_cur_.size(); }
  /// "synthetic(seed=7, words=256)", for corpus names and log lines.
  std::string name() const;

 private:
  synthetic_source() = default;

  synthetic_params params_;
  std::vector<std::string> words_;        // lowercase
  std::vector<std::string> capitalised_;  // same bytes count, first letter uppercase

  // The reachable state graph in compressed sparse rows. Edges of a state are
  // sorted by falling probability so sampling usually stops after a few.
  std::vector<std::int32_t> state_cur_;     // current token of each state
  std::vector<std::uint32_t> edge_begin_;   // states + 1 entries
  std::vector<std::int32_t> edge_token_;
  std::vector<std::uint32_t> edge_next_;    // state after emitting edge_token_
  std::vector<double> edge_cum_;            // cumulative probability, last = 1
  std::vector<double> edge_bits_;           // -log2 P(token | state)
  std::uint32_t start_state_ = 0;           // (".", "\n"): a paragraph just ended

  double rate_ = 0;
  double order1_rate_ = 0;
  double bytes_per_token_ = 0;
};

}  // namespace archipelago
