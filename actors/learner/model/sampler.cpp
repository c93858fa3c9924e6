#include "learner/model/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/prng.hpp"

namespace archipelago {

status validate(const sample_options& opts) {
  if (!(opts.temperature > 0) || !std::isfinite(opts.temperature))
    return status(make_error(errc::invalid_input, "--temperature must be a positive number"));
  if (opts.bytes < 0 || opts.bytes > (1 << 20))
    return status(make_error(errc::invalid_input, "--bytes must be in [0, 1048576]"));
  if (opts.top_k < 0 || opts.top_k > 256)
    return status(make_error(errc::invalid_input, "--top-k must be in [0, 256]"));
  return {};
}

std::string sample_text(gpt<float>& model, const sample_options& opts) {
  const int context = model.shape().context, vocab = model.shape().vocab;
  std::vector<std::int32_t> history;
  for (unsigned char ch : opts.prompt) history.push_back(ch);
  // An empty prompt starts from a newline, a natural document boundary.
  if (history.empty()) history.push_back('\n');
  prng rng(opts.seed);
  std::vector<float> logits(vocab);
  std::vector<double> probs(vocab);
  std::string out;
  for (int i = 0; i < opts.bytes; ++i) {
    const int len = std::min<int>(context, static_cast<int>(history.size()));
    model.next_logits(history.data() + history.size() - len, len, logits.data());
    double cutoff = -INFINITY;
    if (opts.top_k > 0) {
      std::vector<float> sorted(logits);
      std::nth_element(sorted.begin(), sorted.begin() + (opts.top_k - 1), sorted.end(), std::greater<>());
      cutoff = sorted[opts.top_k - 1];
    }
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int k = 0; k < vocab; ++k) {
      probs[k] = logits[k] < cutoff ? 0.0 : std::exp((logits[k] - mx) / opts.temperature);
      sum += probs[k];
    }
    double pick = rng.uniform() * sum;
    int next = vocab - 1;
    for (int k = 0; k < vocab; ++k) {
      pick -= probs[k];
      if (pick < 0) {
        next = k;
        break;
      }
    }
    history.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  return out;
}

}  // namespace archipelago
