#include "parameter_shard/robust_merge.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace archipelago {

status validate(const robust_config& config) {
  if (!std::isfinite(config.norm_factor) || config.norm_factor < 1)
    return make_error(errc::invalid_input,
                      "robust norm_factor " + std::to_string(config.norm_factor) + " (need finite, >= 1)");
  if (config.window < 1) return make_error(errc::invalid_input, "robust window 0 (need >= 1)");
  if (!(config.min_cosine >= -1 && config.min_cosine <= 1))
    return make_error(errc::invalid_input, "robust min_cosine " + std::to_string(config.min_cosine) + " (need in [-1, 1])");
  return status::ok();
}

double lower_median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t k = (values.size() - 1) / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
  return values[k];
}

const char* to_string(screen_decision::action a) {
  switch (a) {
    case screen_decision::action::accept: return "accept";
    case screen_decision::action::clip: return "clip";
    case screen_decision::action::reject: return "reject";
  }
  return "?";
}

namespace {

double norm_of(std::span<const float> v) {
  double squares = 0;
  for (float x : v) squares += static_cast<double>(x) * x;
  return std::sqrt(squares);
}

}  // namespace

direction_figures direction_cosines(std::span<const std::span<const float>> deltas, std::span<const float> momentum) {
  direction_figures out;
  out.cosines.assign(deltas.size(), 0.0);
  if (deltas.empty()) return out;
  const std::size_t n = deltas.front().size();
  std::vector<double> norms, inverse_norms;
  for (auto d : deltas) {
    norms.push_back(norm_of(d));
    inverse_norms.push_back(norms.back() > 0 ? 1 / norms.back() : 0);
  }
  std::vector<double> reference;
  if (deltas.size() >= min_round_reference) {
    // The coordinate-wise median of unit vectors: one attacker of three or more
    // cannot pull any coordinate past an honest value.
    reference.resize(n);
    std::vector<double> column(deltas.size());
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t m = 0; m < deltas.size(); ++m) column[m] = deltas[m][i] * inverse_norms[m];
      const std::size_t k = column.size() / 2;
      std::nth_element(column.begin(), column.begin() + static_cast<std::ptrdiff_t>(k), column.end());
      double median = column[k];
      if (column.size() % 2 == 0)  // the mean of the two middle values
        median = (median + *std::max_element(column.begin(), column.begin() + static_cast<std::ptrdiff_t>(k))) / 2;
      reference[i] = median;
    }
  } else {
    for (float m : momentum) reference.push_back(-static_cast<double>(m));  // the descent
  }
  double reference_norm = 0;
  for (double x : reference) reference_norm += x * x;
  reference_norm = std::sqrt(reference_norm);
  if (reference_norm == 0) return out;
  out.has_reference = true;
  for (std::size_t m = 0; m < deltas.size(); ++m) {
    if (norms[m] == 0) continue;
    double dot = 0;
    for (std::size_t i = 0; i < n; ++i) dot += deltas[m][i] * reference[i];
    out.cosines[m] = dot / (norms[m] * reference_norm);
  }
  return out;
}

std::vector<screen_decision> norm_screen::screen(std::span<const double> norms) {
  std::vector<screen_decision> out(norms.size());
  // A round of 3 or more members is its own reference: the window lags when norms
  // grow (the learning-rate warm-up), and an attacker's small figures in it (a
  // stale replay of an early delta) drag it down until honest members look large.
  // Smaller rounds have too few to outvote one attacker: the window joins them.
  std::vector<double> reference(norms.begin(), norms.end());
  if (norms.size() < min_round_reference) reference.insert(reference.end(), window_.begin(), window_.end());
  // One value alone is its own median: it would always pass, so say so plainly.
  const bool comparable = reference.size() >= 2;
  const double bound = comparable ? config_.norm_factor * lower_median(std::move(reference)) : 0;
  for (std::size_t m = 0; m < norms.size(); ++m) {
    screen_decision& d = out[m];
    d.norm = norms[m];
    d.bound = bound;
    if (comparable && d.norm > bound)
      d.what = config_.clip && bound > 0 ? screen_decision::action::clip : screen_decision::action::reject;
  }
  for (const auto& d : out) {
    if (d.what != screen_decision::action::accept) continue;
    window_.push_back(d.norm);
    if (window_.size() > config_.window) window_.pop_front();
  }
  return out;
}

}  // namespace archipelago
