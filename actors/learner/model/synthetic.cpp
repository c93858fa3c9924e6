#include "learner/model/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/prng.hpp"

namespace archipelago {
namespace {

// Shape of the language. With 256 words this puts the rate near 0.68 bits per
// byte, most of it at word starts, while every table stays small enough for a
// ~100k-parameter model to learn.
constexpr int min_fanout = 1;                // successor words per word
constexpr int max_fanout = 6;
constexpr double successor_zipf = 1.0;       // weight of rank r is 1 / (r + 1)^s
constexpr double min_end = 0.10;             // per-word probability of ".": sentences
constexpr double max_end = 0.35;             //   average about 4.5 words
constexpr double newline_after_period = 0.1;
constexpr double order2_fraction = 0.3;
constexpr double starter_zipf = 0.3;         // every word can start a sentence, nearly uniformly

// Independent streams derived from the language seed.
constexpr std::uint64_t stream_words = 1;
constexpr std::uint64_t stream_tables = 2;
constexpr std::uint64_t stream_pairs = 3;
constexpr std::uint64_t stream_text = 4;

constexpr double convergence_l1 = 1e-14;
constexpr int max_iterations = 100000;  // the default language needs ~100
// Accepted when the iteration cap is hit first: far below anything measurable.
constexpr double fallback_l1 = 1e-11;

int draw_length(prng& rng) {
  // 2..8 letters with weights 2 4 4 3 2 1 1 (of 17): mostly 3..6, mean 4.35.
  static constexpr int weights[] = {2, 4, 4, 3, 2, 1, 1};
  int r = static_cast<int>(rng.below(17));
  for (int i = 0; i < 7; ++i) {
    if (r < weights[i]) return i + 2;
    r -= weights[i];
  }
  return 8;
}

std::vector<double> zipf_weights(std::size_t n, double exponent) {
  std::vector<double> w(n);
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = std::pow(static_cast<double>(i + 1), -exponent);
    total += w[i];
  }
  for (double& x : w) x /= total;
  return w;
}

struct word_table {
  std::vector<std::int32_t> successors;  // in rank order
  double end = 0;                        // P(".")
  bool order2 = false;
};

struct language {
  int words = 0;
  std::vector<word_table> tables;
  std::vector<std::int32_t> starters;     // in rank order
  std::vector<double> starter_weights;
  std::vector<std::vector<double>> zipf;  // zipf[k]: successor weights for fan-out k
  std::uint64_t pair_seed = 0;

  std::int32_t period() const { return words; }
  std::int32_t newline() const { return words + 1; }
  bool order2(std::int32_t token) const {
    return token < words && tables[static_cast<std::size_t>(token)].order2;
  }

  // P(next | prev, cur) as (token, probability) pairs.
  void next_distribution(std::int32_t prev, std::int32_t cur,
                         std::vector<std::pair<std::int32_t, double>>& out) const {
    out.clear();
    if (cur == period() || cur == newline()) {
      const double stay = cur == period() ? 1.0 - newline_after_period : 1.0;
      if (cur == period()) out.emplace_back(newline(), newline_after_period);
      for (std::size_t i = 0; i < starters.size(); ++i)
        out.emplace_back(starters[i], stay * starter_weights[i]);
      return;
    }
    const word_table& t = tables[static_cast<std::size_t>(cur)];
    const std::size_t k = t.successors.size();
    std::int32_t succ[max_fanout];
    std::copy(t.successors.begin(), t.successors.end(), succ);
    if (t.order2) {
      // The previous token re-ranks the successors and swaps the new favourite
      // for a word of its own: sparse, but only predictable from both tokens.
      const auto tokens = static_cast<std::uint64_t>(words + 2);
      prng rng(derive_seed(pair_seed, static_cast<std::uint64_t>(prev) * tokens +
                                          static_cast<std::uint64_t>(cur)));
      for (std::size_t i = k; i > 1; --i) std::swap(succ[i - 1], succ[rng.below(i)]);
      if (k + 1 < static_cast<std::size_t>(words)) {  // else no word is left to swap in
        std::int32_t fresh = 0;
        do {
          fresh = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(words)));
        } while (fresh == cur || std::find(succ, succ + k, fresh) != succ + k);
        succ[0] = fresh;
      }
    }
    const std::vector<double>& w = zipf[k];
    for (std::size_t i = 0; i < k; ++i) out.emplace_back(succ[i], (1.0 - t.end) * w[i]);
    out.emplace_back(period(), t.end);
  }
};

language build_language(const synthetic_params& params, std::vector<std::string>& words) {
  const int n = params.words;
  language lang;
  lang.words = n;

  prng word_rng(derive_seed(params.seed, stream_words));
  std::unordered_set<std::string> seen;
  words.clear();
  words.reserve(static_cast<std::size_t>(n));
  while (static_cast<int>(words.size()) < n) {
    std::string w(static_cast<std::size_t>(draw_length(word_rng)), 'a');
    for (char& c : w) c = static_cast<char>('a' + word_rng.below(26));
    if (seen.insert(w).second) words.push_back(std::move(w));
  }

  prng rng(derive_seed(params.seed, stream_tables));
  lang.zipf.resize(max_fanout + 1);
  for (int k = 1; k <= max_fanout; ++k) {
    lang.zipf[static_cast<std::size_t>(k)] = zipf_weights(static_cast<std::size_t>(k), successor_zipf);
  }

  lang.tables.resize(static_cast<std::size_t>(n));
  for (int w = 0; w < n; ++w) {
    word_table& t = lang.tables[static_cast<std::size_t>(w)];
    const int k = std::min(n - 1, min_fanout + static_cast<int>(rng.below(max_fanout - min_fanout + 1)));
    while (static_cast<int>(t.successors.size()) < k) {
      const auto s = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(n)));
      if (s == w || std::find(t.successors.begin(), t.successors.end(), s) != t.successors.end())
        continue;
      t.successors.push_back(s);
    }
    // Every word can end its sentence, so every reachable state reaches "." and
    // the chain on reachable states is irreducible.
    t.end = min_end + (max_end - min_end) * rng.uniform();
    t.order2 = rng.uniform() < order2_fraction;
  }

  std::vector<std::int32_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  for (std::size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  lang.starters = std::move(perm);
  lang.starter_weights = zipf_weights(lang.starters.size(), starter_zipf);

  lang.pair_seed = derive_seed(params.seed, stream_pairs);
  return lang;
}

}  // namespace

expected<synthetic_source> synthetic_source::make(const synthetic_params& params) {
  if (params.words < min_words || params.words > max_words)
    return make_error(errc::invalid_input,
                      "synthetic words must be in [" + std::to_string(min_words) + ", " +
                          std::to_string(max_words) + "], got " + std::to_string(params.words));

  synthetic_source src;
  src.params_ = params;
  const language lang = build_language(params, src.words_);
  src.capitalised_ = src.words_;
  for (std::string& w : src.capitalised_) w[0] = static_cast<char>(w[0] - 'a' + 'A');

  // Explore the states reachable from the start, breadth first.
  const auto tokens = static_cast<std::uint64_t>(params.words + 2);
  std::unordered_map<std::uint64_t, std::uint32_t> index;
  std::vector<std::int32_t> state_prev;
  auto id_of = [&](std::int32_t prev, std::int32_t cur) {
    // The previous token matters only before an order-2 word; elsewhere states
    // that differ only in it have the same future, so they are merged (exact).
    if (!lang.order2(cur)) prev = -1;
    const std::uint64_t key = static_cast<std::uint64_t>(prev + 1) * tokens + static_cast<std::uint64_t>(cur);
    auto [it, inserted] = index.try_emplace(key, static_cast<std::uint32_t>(state_prev.size()));
    if (inserted) {
      state_prev.push_back(prev);
      src.state_cur_.push_back(cur);
    }
    return it->second;
  };
  src.start_state_ = id_of(lang.period(), lang.newline());

  std::vector<double> edge_prob;
  std::vector<double> state_entropy;  // H(next | s), bits
  std::vector<double> state_bytes;    // E[bytes of next token | s]
  std::vector<std::pair<std::int32_t, double>> dist;
  src.edge_begin_.push_back(0);
  for (std::size_t s = 0; s < src.state_cur_.size(); ++s) {  // grows as states are found
    const std::int32_t cur = src.state_cur_[s];
    lang.next_distribution(state_prev[s], cur, dist);
    std::sort(dist.begin(), dist.end(), [](const auto& a, const auto& b) {
      return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    double h = 0, bytes = 0, cum = 0;
    for (const auto& [t, p] : dist) {
      cum += p;
      h -= p * std::log2(p);
      const bool word = t < params.words;
      const std::size_t len =
          word ? src.words_[static_cast<std::size_t>(t)].size() + (cur == lang.newline() ? 0 : 1) : 1;
      bytes += p * static_cast<double>(len);
      src.edge_token_.push_back(t);
      src.edge_next_.push_back(id_of(cur, t));
      src.edge_cum_.push_back(cum);
      src.edge_bits_.push_back(-std::log2(p));
      edge_prob.push_back(p);
    }
    if (std::abs(cum - 1.0) > 1e-9)
      return make_error(errc::internal, "next-token probabilities of " + src.name() + " sum to " +
                                            std::to_string(cum) + ", not 1");
    src.edge_cum_.back() = 1.0;  // so a uniform draw in [0, 1) always lands
    src.edge_begin_.push_back(static_cast<std::uint32_t>(src.edge_token_.size()));
    state_entropy.push_back(h);
    state_bytes.push_back(bytes);
  }

  // Stationary distribution: power iteration on the lazy chain (I + P) / 2,
  // which has the same fixed point as P and converges even if P is periodic.
  const std::size_t n = src.state_cur_.size();
  std::vector<double> pi(n, 0.0), next(n);
  pi[src.start_state_] = 1.0;  // a paragraph just ended
  double change = 1.0;
  for (int iter = 0; iter < max_iterations && change >= convergence_l1; ++iter) {
    for (std::size_t s = 0; s < n; ++s) next[s] = 0.5 * pi[s];
    for (std::size_t s = 0; s < n; ++s) {
      const double mass = 0.5 * pi[s];
      if (mass == 0) continue;
      for (std::uint32_t e = src.edge_begin_[s]; e < src.edge_begin_[s + 1]; ++e)
        next[src.edge_next_[e]] += mass * edge_prob[e];
    }
    change = 0;
    for (std::size_t s = 0; s < n; ++s) change += std::abs(next[s] - pi[s]);
    pi.swap(next);
  }
  if (change >= fallback_l1)
    return make_error(errc::internal, "stationary distribution of " + src.name() +
                                          " did not converge (L1 change " + std::to_string(change) + ")");
  const double total = std::accumulate(pi.begin(), pi.end(), 0.0);
  for (double& p : pi) p /= total;

  double h = 0, bytes = 0;
  for (std::size_t s = 0; s < n; ++s) {
    h += pi[s] * state_entropy[s];
    bytes += pi[s] * state_bytes[s];
  }
  src.rate_ = h / bytes;
  src.bytes_per_token_ = bytes;

  // H(next | current token): mix the states that share a current token.
  std::vector<std::uint32_t> by_cur(n);
  std::iota(by_cur.begin(), by_cur.end(), 0u);
  std::sort(by_cur.begin(), by_cur.end(), [&](std::uint32_t a, std::uint32_t b) {
    return src.state_cur_[a] < src.state_cur_[b];
  });
  std::vector<double> mix(tokens, 0.0);
  std::vector<std::int32_t> touched;
  double h1 = 0;
  for (std::size_t i = 0; i < n;) {
    const std::int32_t cur = src.state_cur_[by_cur[i]];
    double mass = 0;
    for (; i < n && src.state_cur_[by_cur[i]] == cur; ++i) {
      const std::uint32_t s = by_cur[i];
      mass += pi[s];
      for (std::uint32_t e = src.edge_begin_[s]; e < src.edge_begin_[s + 1]; ++e) {
        const std::int32_t t = src.edge_token_[e];
        if (mix[static_cast<std::size_t>(t)] == 0) touched.push_back(t);
        mix[static_cast<std::size_t>(t)] += pi[s] * edge_prob[e];
      }
    }
    for (const std::int32_t t : touched) {
      const double m = mix[static_cast<std::size_t>(t)];
      if (m > 0 && mass > 0) h1 -= m * std::log2(m / mass);
      mix[static_cast<std::size_t>(t)] = 0;
    }
    touched.clear();
  }
  src.order1_rate_ = h1 / bytes;
  return src;
}

std::string synthetic_source::name() const {
  return "synthetic(seed=" + std::to_string(params_.seed) + ", words=" + std::to_string(params_.words) + ")";
}

std::string synthetic_source::generate(std::size_t bytes, std::uint64_t stream_seed) const {
  return sample(bytes, stream_seed, false).text;
}

synthetic_sample synthetic_source::sample(std::size_t bytes, std::uint64_t stream_seed,
                                          bool keep_tokens) const {
  synthetic_sample out;
  // Room for one whole token past the end, so rendering never checks bounds.
  out.text.resize(bytes + 16);
  if (keep_tokens) out.tokens.reserve(bytes / 4 + 16);
  char* text = out.text.data();
  prng rng(derive_seed(derive_seed(params_.seed, stream_text), stream_seed));
  const std::int32_t words = params_.words;
  const std::int32_t newline = newline_token();
  std::size_t pos = 0;
  double code_bits = 0;
  std::uint32_t state = start_state_;
  while (pos < bytes) {
    const double u = rng.uniform();
    const std::uint32_t begin = edge_begin_[state];
    const std::uint32_t end = edge_begin_[state + 1];
    std::uint32_t e = begin;
    if (end - begin <= 16) {
      while (edge_cum_[e] <= u) ++e;  // the last cum is 1 > u
    } else {
      e = static_cast<std::uint32_t>(
          std::upper_bound(edge_cum_.begin() + begin, edge_cum_.begin() + end, u) - edge_cum_.begin());
      if (e >= end) e = end - 1;
    }
    const std::int32_t t = edge_token_[e];
    const std::int32_t cur = state_cur_[state];
    if (t < words) {
      if (cur != newline) text[pos++] = ' ';
      const std::string& w = cur < words ? words_[static_cast<std::size_t>(t)]
                                         : capitalised_[static_cast<std::size_t>(t)];
      std::memcpy(text + pos, w.data(), w.size());
      pos += w.size();
    } else {
      text[pos++] = t == newline ? '\n' : '.';
    }
    code_bits += edge_bits_[e];
    if (keep_tokens) out.tokens.push_back(t);
    state = edge_next_[e];
  }
  out.text.resize(bytes);
  out.code_bits = code_bits;
  return out;
}

}  // namespace archipelago
