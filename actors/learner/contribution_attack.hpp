#pragma once
// A malicious learner, for drills (the chaos monkey's attack_* faults): what it
// does to its own contribution before sending it. Pure and seeded — the random
// attack draws from (seed, round, fragment) — so a simulation reproduces it.

#include <cstdint>
#include <map>
#include <vector>

#include "core/ids.hpp"
#include "transport/chaos_command.hpp"

namespace archipelago {

class contribution_attacker {
 public:
  explicit contribution_attacker(std::uint64_t seed) : seed_(seed) {}

  /// Poisons `delta` (learner's honest θ_p − anchor_p) in place:
  /// - scaled: × factor;  sign_flip: × −1;
  /// - random: Gaussian noise with the delta's RMS (so its norm is about the honest one's);
  /// - stale: the first delta to fragment p seen under this attack, replayed
  ///   (the first one is kept and sent as it is);
  /// - sideways: the delta's norm along a direction fixed per fragment (drawn from
  ///   (seed, fragment)), tilted towards the honest delta to cosine `factor` with
  ///   it: near-orthogonal, the same way every round, so it compounds through the
  ///   outer momentum, and with factor > 0 its cosine with the honest members stays
  ///   positive (a screen that only rejects deltas pointing against them lets it pass).
  /// none: unchanged. Returns true when the delta was changed.
  bool apply(contribution_attack kind, double factor, round_number r, fragment_index p, std::vector<float>& delta);

 private:
  std::uint64_t seed_;
  std::map<std::uint32_t, std::vector<float>> first_;  // stale: fragment → its first delta
};

}  // namespace archipelago
