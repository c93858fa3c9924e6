#pragma once
// Text generation from a trained model, so a person can see what it learned.

#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "learner/model/gpt.hpp"

namespace archipelago {

struct sample_options {
  std::string prompt;
  int bytes = 256;            // bytes to generate
  double temperature = 0.8;   // > 0; lower is more conservative
  int top_k = 0;              // 0: sample from the whole distribution
  std::uint64_t seed = 1;
};

status validate(const sample_options& opts);

/// Generates opts.bytes bytes after the prompt (the prompt is not repeated in the
/// result). The model sees at most its context window of the most recent bytes.
std::string sample_text(gpt<float>& model, const sample_options& opts);

}  // namespace archipelago
