#include "parameter_shard/merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/adamw.hpp"
#include "core/invariant.hpp"

namespace archipelago {

namespace {

std::string tensor_label(const fragment_tensor& tensor, std::size_t index) {
  if (!tensor.name.empty()) return "tensor '" + std::string(tensor.name) + "'";
  return "tensor #" + std::to_string(index);
}

// Sum of squares in double. A float squared is at most ~1.2e77, so the sum is
// finite exactly when every element is finite: one pass both measures the norm
// and validates the input.
double sum_of_squares(const float* x, std::size_t n) {
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double value = x[i];
    sum += value * value;
  }
  return sum;
}

status check_tensors(std::span<const fragment_tensor> tensors, std::size_t fragment_size) {
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto& tensor = tensors[t];
    if (tensor.offset > fragment_size || tensor.size > fragment_size - tensor.offset) {
      return make_error(errc::invalid_input,
                        tensor_label(tensor, t) + " [" + std::to_string(tensor.offset) + ", +" +
                            std::to_string(tensor.size) + ") exceeds the fragment of " +
                            std::to_string(fragment_size) + " floats");
    }
    order[t] = t;
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return tensors[a].offset < tensors[b].offset;
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const auto& prev = tensors[order[k - 1]];
    const auto& next = tensors[order[k]];
    // Empty tensors occupy nothing and cannot overlap.
    if (prev.size != 0 && next.size != 0 && prev.offset + prev.size > next.offset) {
      return make_error(errc::invalid_input, tensor_label(prev, order[k - 1]) + " overlaps " +
                                                 tensor_label(next, order[k]));
    }
  }
  return status::ok();
}

// acc[i] += coef · v_m[i] for each contribution in order (v_m = −d_m, folded
// into the coefficient). The order is fixed, so the result is reproducible.
void accumulate(std::vector<double>& acc, std::span<const contribution_view> contributions,
                const std::vector<double>& coef, std::size_t offset, std::size_t size) {
  std::fill(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(size), 0.0);
  for (std::size_t m = 0; m < contributions.size(); ++m) {
    if (coef[m] == 0) continue;  // zero weight or zero vector: adds exactly nothing
    const double c = -coef[m];
    const float* d = contributions[m].delta + offset;
    for (std::size_t i = 0; i < size; ++i) acc[i] += c * static_cast<double>(d[i]);
  }
}

// Σ w x / Σ w over the values left once the `trim` smallest and largest are
// dropped (ties by index). `order` is scratch of the values' count.
double trimmed_mean(const double* x, const double* w, std::size_t n, std::size_t trim,
                    std::vector<std::size_t>& order) {
  for (std::size_t m = 0; m < n; ++m) order[m] = m;
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n),
            [&](std::size_t a, std::size_t b) { return x[a] < x[b] || (x[a] == x[b] && a < b); });
  double sum = 0, weight = 0;
  for (std::size_t k = trim; k + trim < n; ++k) {
    sum += w[order[k]] * x[order[k]];
    weight += w[order[k]];
  }
  return weight > 0 ? sum / weight : 0.0;
}

// acc[i] = trimmed weighted mean over m of coef_m · v_m[i] (v_m = −d_m).
void accumulate_trimmed(std::vector<double>& acc, std::span<const contribution_view> contributions,
                        const std::vector<double>& coef, const std::vector<double>& share, std::size_t offset,
                        std::size_t size, std::size_t trim) {
  const std::size_t n = contributions.size();
  std::vector<double> x(n);
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < size; ++i) {
    for (std::size_t m = 0; m < n; ++m) x[m] = -coef[m] * static_cast<double>(contributions[m].delta[offset + i]);
    acc[i] = trimmed_mean(x.data(), share.data(), n, trim, order);
  }
}

}  // namespace

double merge_weight(double tokens, double steps) {
  ARCHIPELAGO_INVARIANT(steps >= 1, "merge weight: at least one step");
  return tokens * tokens / steps;
}

status merge_outer_gradient(std::span<const fragment_tensor> tensors,
                            std::span<const contribution_view> contributions,
                            std::size_t fragment_size, float* delta_out, const merge_options& options) {
  ARCHIPELAGO_INVARIANT(delta_out != nullptr || fragment_size == 0, "merge: an output for a non-empty fragment");
  const std::size_t count = contributions.size();
  const std::size_t trim = count == 0 ? 0 : std::min(options.trim, (count - 1) / 2);
  if (count == 0) return make_error(errc::invalid_input, "merge: no contributions");

  // Weights, normalised once: p_m = w_m / Σ w.
  std::vector<double> share(count);
  double total_weight = 0;
  for (std::size_t m = 0; m < count; ++m) {
    const auto& c = contributions[m];
    const std::string who = "merge: contribution " + std::to_string(m);
    if (c.delta == nullptr && fragment_size != 0) {
      return make_error(errc::invalid_input, who + " has no delta");
    }
    if (!std::isfinite(c.tokens) || c.tokens < 0) {
      return make_error(errc::invalid_input,
                        who + " has tokens " + std::to_string(c.tokens) + " (need finite, >= 0)");
    }
    if (!std::isfinite(c.steps) || !(c.steps >= 1)) {
      return make_error(errc::invalid_input,
                        who + " has steps " + std::to_string(c.steps) + " (need finite, >= 1)");
    }
    share[m] = merge_weight(c.tokens, c.steps);
    total_weight += share[m];
  }
  if (!(total_weight > 0) || !std::isfinite(total_weight)) {
    return make_error(errc::invalid_input, "merge: total weight " + std::to_string(total_weight) +
                                               " (need finite, > 0)");
  }
  for (auto& s : share) s /= total_weight;

  if (auto ok = check_tensors(tensors, fragment_size); !ok) return ok;

  // First pass: norms ‖v_m‖ per (tensor, contribution), which also validates
  // every value before anything is written.
  std::vector<double> norms(tensors.size() * count);
  std::size_t largest = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto& tensor = tensors[t];
    largest = std::max(largest, tensor.size);
    for (std::size_t m = 0; m < count; ++m) {
      const float* d = contributions[m].delta + tensor.offset;
      const double squares = sum_of_squares(d, tensor.size);
      if (!std::isfinite(squares)) {
        std::size_t i = 0;
        while (i < tensor.size && std::isfinite(d[i])) ++i;
        return make_error(errc::invalid_input,
                          "merge: contribution " + std::to_string(m) + " has a non-finite value in " +
                              tensor_label(tensor, t) + " at element " + std::to_string(i));
      }
      norms[t * count + m] = std::sqrt(squares);
    }
  }

  // Padding between tensors gets a zero update, so Θ there never moves.
  std::fill(delta_out, delta_out + fragment_size, 0.0f);

  std::vector<double> acc(largest);
  std::vector<double> coef(count);
  const std::vector<double> ones(count, 1.0);
  std::vector<std::size_t> order(count);
  bool overflow = false;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto& tensor = tensors[t];
    if (tensor.size == 0) continue;
    const double* norm = &norms[t * count];
    double scale = 1;  // multiplies acc on output
    bool use_mean = tensor.embedding;

    if (!tensor.embedding) {
      // Radius: weighted mean of norms. Direction: weighted mean of unit
      // vectors; a zero v_m contributes direction 0 but keeps its weight.
      double radius = 0;
      double aligned = 0;  // ‖mean direction‖ if all non-zero v_m pointed the same way
      for (std::size_t m = 0; m < count; ++m) {
        radius += share[m] * norm[m];
        coef[m] = norm[m] > 0 ? share[m] / norm[m] : 0.0;
        if (norm[m] > 0) aligned += share[m];
      }
      if (trim > 0) {
        // The same formula with trimmed means: radius over the norms, direction
        // over the unit vectors u(v_m) coordinate by coordinate.
        radius = trimmed_mean(norm, share.data(), count, trim, order);
        aligned = 0;
        for (std::size_t m = 0; m < count; ++m) coef[m] = norm[m] > 0 ? 1.0 / norm[m] : 0.0;
        for (std::size_t m = 0; m < count; ++m)
          if (norm[m] > 0) aligned = 1;  // a mean of unit-vector coordinates is at most 1 in norm
        accumulate_trimmed(acc, contributions, coef, share, tensor.offset, tensor.size, trim);
      } else {
        accumulate(acc, contributions, coef, tensor.offset, tensor.size);
      }
      double squares = 0;
      for (std::size_t i = 0; i < tensor.size; ++i) squares += acc[i] * acc[i];
      const double direction_norm = std::sqrt(squares);
      // All-zero inputs give aligned == 0 and take the mean (which is zero).
      if (direction_norm > rda_cancellation_epsilon * aligned) {
        scale = radius / direction_norm;
      } else {
        use_mean = true;  // directions cancel: u(·) would amplify rounding noise
      }
    }
    if (use_mean) {
      if (trim > 0) accumulate_trimmed(acc, contributions, ones, share, tensor.offset, tensor.size, trim);
      else accumulate(acc, contributions, share, tensor.offset, tensor.size);
      scale = 1;
    }
    // Δ = scale · acc: RDA's radius / ‖Σ p u(v)‖ applied to the direction sum,
    // or 1 for the weighted mean.
    float* out = delta_out + tensor.offset;
    for (std::size_t i = 0; i < tensor.size; ++i) {
      out[i] = static_cast<float>(scale * acc[i]);
      overflow |= !std::isfinite(out[i]);
    }
  }
  if (overflow) {
    return make_error(errc::invalid_input, "merge: the merged update is not representable in fp32");
  }
  return status::ok();
}

status validate(const nesterov_config& config) {
  if (!std::isfinite(config.lr) || config.lr < 0) {
    return make_error(errc::invalid_input,
                      "outer lr " + std::to_string(config.lr) + " (need finite, >= 0)");
  }
  if (!std::isfinite(config.momentum) || config.momentum < 0 || config.momentum >= 1) {
    return make_error(errc::invalid_input,
                      "outer momentum " + std::to_string(config.momentum) + " (need in [0, 1))");
  }
  if (config.warmup < 0)
    return make_error(errc::invalid_input, "outer warm-up " + std::to_string(config.warmup) + " (need >= 0)");
  return status::ok();
}

outer_optimizer::outer_optimizer(nesterov_config config) : config_(config) {
  ARCHIPELAGO_INVARIANT(validate(config_).has_value(), "outer optimizer: a validated Nesterov config");
}

double outer_optimizer::lr_at(std::uint64_t version) const {
  return warmed_up_lr(config_.lr, static_cast<std::int64_t>(version), config_.warmup);
}

void outer_optimizer::step(float* theta, float* momentum_buffer, const float* delta, std::size_t n,
                           std::uint64_t version) const {
  step_into(theta, theta, momentum_buffer, delta, n, version);
}

void outer_optimizer::step_into(float* theta_out, const float* theta_in, float* momentum_buffer, const float* delta,
                                std::size_t n, std::uint64_t version) const {
  const double lr = lr_at(version);
  const double mu = config_.momentum;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = delta[i];
    momentum_buffer[i] = static_cast<float>(mu * momentum_buffer[i] + d);
    theta_out[i] = static_cast<float>(theta_in[i] - lr * (d + mu * momentum_buffer[i]));
  }
}

}  // namespace archipelago
