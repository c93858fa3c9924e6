#include "learner/contribution_attack.hpp"

#include <algorithm>
#include <cmath>

#include "core/prng.hpp"

namespace archipelago {
namespace {

/// Gaussian noise from our own prng (Box-Muller): the same numbers on every platform.
double gaussian(prng& rng) {
  const double u1 = 1 - rng.uniform(), u2 = rng.uniform();
  return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

double norm_of(const std::vector<float>& v) {
  double squares = 0;
  for (float x : v) squares += static_cast<double>(x) * x;
  return std::sqrt(squares);
}

}  // namespace

bool contribution_attacker::apply(contribution_attack kind, double factor, round_number r, fragment_index p,
                                  std::vector<float>& delta) {
  switch (kind) {
    case contribution_attack::none: return false;
    case contribution_attack::scaled:
      for (float& x : delta) x = static_cast<float>(x * factor);
      return true;
    case contribution_attack::sign_flip:
      for (float& x : delta) x = -x;
      return true;
    case contribution_attack::random: {
      double squares = 0;
      for (float x : delta) squares += static_cast<double>(x) * x;
      const double rms = delta.empty() ? 0 : std::sqrt(squares / static_cast<double>(delta.size()));
      prng rng(derive_seed(derive_seed(seed_, r.value), p.value));
      for (float& x : delta) x = static_cast<float>(rms * gaussian(rng));
      return true;
    }
    case contribution_attack::sideways: {
      const double norm = norm_of(delta);
      if (norm == 0) return false;
      // w: the fixed direction without its component along the honest delta, unit length.
      constexpr std::uint64_t fixed_stream = ~std::uint64_t{0};  // a stream no round number (random's) takes
      prng rng(derive_seed(derive_seed(seed_, fixed_stream), p.value));
      std::vector<double> w(delta.size());
      double along = 0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        w[i] = gaussian(rng);
        along += w[i] * delta[i] / norm;
      }
      double w_squares = 0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        w[i] -= along * delta[i] / norm;
        w_squares += w[i] * w[i];
      }
      const double w_norm = std::sqrt(w_squares);
      if (w_norm == 0) return false;
      const double c = std::clamp(factor, 0.0, 1.0), s = std::sqrt(1 - c * c);
      for (std::size_t i = 0; i < w.size(); ++i)
        delta[i] = static_cast<float>(c * delta[i] + s * norm * w[i] / w_norm);
      return true;
    }
    case contribution_attack::stale: {
      auto [it, first] = first_.try_emplace(p.value, delta);
      if (first || it->second.size() != delta.size()) {
        it->second = delta;
        return false;
      }
      delta = it->second;
      return true;
    }
  }
  return false;
}

}  // namespace archipelago
