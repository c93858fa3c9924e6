#include "learner/model/synthetic.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

using namespace archipelago;

namespace {

synthetic_source make_source(std::uint64_t seed, int words) {
  auto src = synthetic_source::make({seed, words});
  REQUIRE_MESSAGE(src.has_value(), (src ? "" : src.err().to_string()));
  return std::move(src).value();
}

bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }

// Decodes a text by the rules documented in synthetic.hpp alone: "." and "\n"
// are tokens, every maximal run of letters is a word, a word after "." or "\n"
// (or at the start) is capitalised, and a space precedes every word except one
// after "\n" or at the start. Fails the test on any byte the rules do not allow.
// A word run at the very end may be cut short and is returned in `tail`.
std::vector<std::int32_t> decode(const synthetic_source& src, const std::string& text, std::string& tail) {
  std::unordered_map<std::string, std::int32_t> ids;
  for (std::int32_t i = 0; i < src.params().words; ++i) ids.emplace(src.word(i), i);
  std::vector<std::int32_t> tokens;
  std::int32_t prev = src.newline_token();  // a text starts as after a paragraph
  std::size_t i = 0;
  tail.clear();
  while (i < text.size()) {
    const char c = text[i];
    if (c == '.' || c == '\n') {
      // "." only after a word, "\n" only after ".".
      if (c == '.') REQUIRE(prev < src.params().words);
      if (c == '\n') REQUIRE(prev == src.period_token());
      prev = c == '.' ? src.period_token() : src.newline_token();
      tokens.push_back(prev);
      ++i;
      continue;
    }
    const bool after_newline = prev == src.newline_token();
    if (!after_newline) {
      REQUIRE_MESSAGE(c == ' ', "byte " << i << " is '" << c << "', expected a space before a word");
      ++i;
      if (i == text.size()) break;  // cut right after the space
    }
    const std::size_t start = i;
    while (i < text.size() && (is_lower(text[i]) || is_upper(text[i]))) ++i;
    std::string word = text.substr(start, i - start);
    REQUIRE(!word.empty());
    const bool capital = prev == src.period_token() || prev == src.newline_token();
    REQUIRE_MESSAGE((capital ? is_upper(word[0]) : is_lower(word[0])), "word at byte " << start);
    for (std::size_t j = 1; j < word.size(); ++j) REQUIRE(is_lower(word[j]));
    if (capital) word[0] = static_cast<char>(word[0] - 'A' + 'a');
    if (i == text.size()) {  // possibly cut short
      tail = word;
      break;
    }
    const auto it = ids.find(word);
    REQUIRE_MESSAGE(it != ids.end(), "unknown word '" << word << "' at byte " << start);
    prev = it->second;
    tokens.push_back(prev);
  }
  return tokens;
}

}  // namespace

TEST_CASE("synthetic: rejects a vocabulary outside [4, 100000]") {
  for (const int words : {-1, 0, 3, 100001}) {
    CAPTURE(words);
    const auto src = synthetic_source::make({7, words});
    REQUIRE_FALSE(src.has_value());
    CHECK(src.err().code == errc::invalid_input);
    CHECK(src.err().message.find("[4, 100000]") != std::string::npos);
    CHECK(src.err().message.find(std::to_string(words)) != std::string::npos);
  }
}

TEST_CASE("synthetic: words are distinct lowercase strings of 2..8 letters") {
  const std::uint64_t seed = 7;
  CAPTURE(seed);
  const synthetic_source src = make_source(seed, 256);
  std::unordered_set<std::string> seen;
  double letters = 0;
  for (std::int32_t i = 0; i < 256; ++i) {
    const std::string& w = src.word(i);
    CAPTURE(w);
    CHECK(w.size() >= 2);
    CHECK(w.size() <= 8);
    for (const char c : w) CHECK(is_lower(c));
    CHECK(seen.insert(w).second);
    letters += static_cast<double>(w.size());
  }
  CHECK(letters / 256 > 3.5);  // mostly 3..6 letters
  CHECK(letters / 256 < 5.5);
  CHECK(src.token_count() == 258);
  CHECK(src.period_token() == 256);
  CHECK(src.newline_token() == 257);
  CHECK(src.name() == "synthetic(seed=7, words=256)");
}

TEST_CASE("synthetic: the same seeds give the same text, other seeds other text") {
  const std::uint64_t seed = 7, stream = 11;
  CAPTURE(seed);
  CAPTURE(stream);
  const synthetic_source a = make_source(seed, 256);
  const synthetic_source b = make_source(seed, 256);
  CHECK(a.entropy_rate_bits_per_byte() == b.entropy_rate_bits_per_byte());
  CHECK(a.states() == b.states());

  const std::string text = a.generate(1 << 16, stream);
  CHECK(text.size() == (1u << 16));
  CHECK(text == b.generate(1 << 16, stream));
  CHECK(text == a.sample(1 << 16, stream).text);
  CHECK(text != a.generate(1 << 16, stream + 1));

  const synthetic_source other = make_source(seed + 1, 256);
  CHECK(text != other.generate(1 << 16, stream));
  CHECK(a.entropy_rate_bits_per_byte() != other.entropy_rate_bits_per_byte());

  // A shorter request is a prefix of a longer one from the same stream.
  CHECK(a.generate(1000, stream) == text.substr(0, 1000));
  CHECK(a.generate(0, stream).empty());
  CHECK(a.generate(1, stream).size() == 1);
}

TEST_CASE("synthetic: the default language has a rate between 0.6 and 1.2 bits per byte") {
  const synthetic_source src = make_source(7, 256);
  const double rate = src.entropy_rate_bits_per_byte();
  INFO("rate " << rate << " order-1 rate " << src.order1_rate_bits_per_byte() << " bytes/token "
               << src.bytes_per_token() << " states " << src.states());
  CHECK(std::isfinite(rate));
  CHECK(rate > 0.6);
  CHECK(rate < 1.2);
  // The previous token carries information the current one alone does not.
  CHECK(src.order1_rate_bits_per_byte() > rate + 0.02);
  CHECK(src.bytes_per_token() > 3.0);
  CHECK(src.bytes_per_token() < 7.0);
}

TEST_CASE("synthetic: the ideal predictor's code length matches the analytic rate") {
  const synthetic_source src = make_source(7, 256);
  const std::uint64_t stream = 2024;
  CAPTURE(stream);
  const synthetic_sample s = src.sample(4u << 20, stream, false);
  const double empirical = s.code_bits / static_cast<double>(s.text.size());
  const double rate = src.entropy_rate_bits_per_byte();
  INFO("empirical " << empirical << " analytic " << rate);
  CHECK(std::abs(empirical - rate) < 0.01 * rate);
}

TEST_CASE("synthetic: rates hold for other seeds and vocabulary sizes") {
  for (const auto& [seed, words] : std::vector<std::pair<std::uint64_t, int>>{{1, 4}, {2, 5}, {3, 37}, {4, 1000}}) {
    CAPTURE(seed);
    CAPTURE(words);
    const synthetic_source src = make_source(seed, words);
    const double rate = src.entropy_rate_bits_per_byte();
    CHECK(std::isfinite(rate));
    CHECK(rate > 0.05);
    CHECK(src.order1_rate_bits_per_byte() >= rate - 1e-12);
    const synthetic_sample s = src.sample(1u << 20, seed, false);
    const double empirical = s.code_bits / static_cast<double>(s.text.size());
    INFO("empirical " << empirical << " analytic " << rate);
    CHECK(std::abs(empirical - rate) < 0.02 * rate);
  }
}

TEST_CASE("synthetic: text is printable and decodes back to its tokens") {
  for (const auto& [seed, words, stream] :
       std::vector<std::tuple<std::uint64_t, int, std::uint64_t>>{{7, 256, 5}, {9, 4, 6}, {10, 3000, 7}}) {
    CAPTURE(seed);
    CAPTURE(words);
    CAPTURE(stream);
    const synthetic_source src = make_source(seed, words);
    const synthetic_sample s = src.sample(1u << 18, stream);
    REQUIRE(s.text.size() == (1u << 18));
    const auto printable = [](char c) {
      return is_lower(c) || is_upper(c) || c == ' ' || c == '.' || c == '\n';
    };
    CHECK(std::all_of(s.text.begin(), s.text.end(), printable));
    std::string tail;
    const std::vector<std::int32_t> decoded = decode(src, s.text, tail);
    // Every token but a cut-short last word decodes exactly.
    REQUIRE(decoded.size() <= s.tokens.size());
    REQUIRE(decoded.size() + 1 >= s.tokens.size());
    CHECK(std::equal(decoded.begin(), decoded.end(), s.tokens.begin()));
    if (decoded.size() < s.tokens.size()) {
      const std::string& last = src.word(s.tokens.back());
      CHECK(last.compare(0, tail.size(), tail) == 0);
    }
    // The text has sentence and paragraph structure.
    std::size_t periods = 0, newlines = 0;
    for (const std::int32_t t : s.tokens) {
      periods += t == src.period_token();
      newlines += t == src.newline_token();
    }
    CHECK(periods > s.tokens.size() / 20);
    CHECK(newlines > periods / 40);
    CHECK(newlines < periods / 4);
  }
}

TEST_CASE("synthetic: the code length sums -log2 P over the emitted tokens") {
  // Two samples of the same stream: the longer one's extra tokens add their own
  // bits, and the bits per token sit near rate * bytes per token.
  const synthetic_source src = make_source(7, 256);
  const std::uint64_t stream = 3;
  CAPTURE(stream);
  const synthetic_sample small = src.sample(1000, stream);
  const synthetic_sample large = src.sample(200000, stream);
  REQUIRE(small.tokens.size() <= large.tokens.size());
  CHECK(std::equal(small.tokens.begin(), small.tokens.end(), large.tokens.begin()));
  CHECK(small.code_bits > 0);
  CHECK(small.code_bits < large.code_bits);
  const double per_token = large.code_bits / static_cast<double>(large.tokens.size());
  const double expected_per_token = src.entropy_rate_bits_per_byte() * src.bytes_per_token();
  INFO("bits/token " << per_token << " expected " << expected_per_token);
  CHECK(std::abs(per_token - expected_per_token) < 0.05 * expected_per_token);
}
