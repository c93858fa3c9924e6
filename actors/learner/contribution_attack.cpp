#include "learner/contribution_attack.hpp"

#include <cmath>

#include "core/prng.hpp"

namespace archipelago {

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
      for (float& x : delta) {
        // Box-Muller from our own prng: the same numbers on every platform.
        const double u1 = 1 - rng.uniform(), u2 = rng.uniform();
        x = static_cast<float>(rms * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
      }
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
