#pragma once
// The robust merge (mesh.robust): what keeps one poisoned
// learner from wrecking a fragment. Pure and deterministic (no clock, no
// randomness, a fixed order), like the rest of the merge.
//
// Two layers, both per fragment:
// - Norm screening: each member's delta norm per √step, ‖d_m‖ / √c_steps (the
//   whole fragment; per √step so that a learner back from a pause, whose delta
//   holds many steps, is not taken for an attacker), is compared with a robust
//   statistic times `norm_factor`: the lower median of the round's members when
//   there are 3 or more, else of them together with the last `window` accepted
//   figures of this fragment. Above it the contribution is rejected
//   (counted in the shard's ledger as rejected, with the reason) or clipped to
//   the bound (mesh.robust_screen). The median of a set where honest learners
//   are the majority is an honest norm, so a ×1000 delta cannot move it.
// - Direction screening: each member's cosine with a robust reference direction —
//   the coordinate-wise median of the round's members' unit deltas when there are
//   3 or more, else the fragment's recent descent (the opposite of its outer
//   momentum) — below `min_cosine` is rejected. Honest learners descend the same
//   loss, so their deltas agree in direction; a sign-flipped delta of honest norm,
//   which the norm screen cannot see, points against them.
// - A coordinate-wise trimmed aggregate (merge_options::trim, in merge.hpp):
//   every weighted mean of the merge drops the `trim` largest and smallest
//   values per coordinate, which bounds what a sign-flipped, random or stale
//   delta of unremarkable norm can do.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "core/error.hpp"

namespace archipelago {

struct robust_config {
  bool enabled = false;      // mesh.robust
  double norm_factor = 3;    // mesh.robust_norm_factor: bound = lower median × this; finite, ≥ 1
  std::size_t window = 32;   // mesh.robust_window: accepted norms remembered per fragment; ≥ 1
  bool clip = false;         // mesh.robust_screen = clip (true) | reject (false)
  std::size_t trim = 0;      // mesh.robust_trim: contributions trimmed per side per coordinate
  double min_cosine = 0;     // mesh.robust_min_cosine: in [-1, 1]; -1 turns the direction screen off
  /// false: no screening, only the trimmed merge — `replay verify` re-merges recorded
  /// members, which the shard screened (and clipped) already.
  bool screening = true;
};

/// Checks the bounds above; the error names the offending field.
status validate(const robust_config& config);

/// The lower median (the ⌈n/2⌉-th smallest) of `values`; 0 when empty. The lower
/// one so that two values, one honest and one huge, give the honest one.
double lower_median(std::vector<double> values);

/// What screening decided for one member.
struct screen_decision {
  enum class action : std::uint8_t { accept, clip, reject };
  action what = action::accept;
  double norm = 0;   // the screened figure: ‖d_m‖ / √c_steps over the fragment
  double bound = 0;  // norm_factor × the reference statistic (0: nothing to compare with)
  /// Rejected by the direction screen (not the norm): its cosine with the reference
  /// direction was below min_cosine.
  bool by_direction = false;
  double cosine = 0;  // with the reference direction; 0 when there was none
  /// The factor to multiply the delta by (clip: bound / norm; accept: 1; reject: 0).
  double scale() const { return what == action::clip ? bound / norm : what == action::accept ? 1.0 : 0.0; }
};
const char* to_string(screen_decision::action a);

/// A round with at least this many members is screened against its own lower
/// median alone (one attacker cannot move it); a smaller one also against the window.
inline constexpr std::size_t min_round_reference = 3;

/// The direction screen's cosines: each delta's cosine with the reference — the
/// coordinate-wise median of the deltas' unit vectors when there are at least
/// min_round_reference of them, else the descent: the opposite of the fragment's
/// outer `momentum` (an empty span or a zero vector: no reference, every cosine 0
/// and `has_reference` false). All spans have one length.
struct direction_figures {
  bool has_reference = false;
  std::vector<double> cosines;
};
direction_figures direction_cosines(std::span<const std::span<const float>> deltas, std::span<const float> momentum);

/// One fragment's screening state: a bounded window of recently accepted norms.
class norm_screen {
 public:
  explicit norm_screen(const robust_config& config) : config_(config) {}

  /// Screens one round's members (their norms, in merge order). The reference
  /// is the lower median of these norms when there are at least
  /// min_round_reference of them, else of the window and these norms together; a norm above
  /// norm_factor × reference is clipped or rejected. Accepted norms then enter
  /// the window (the oldest leave beyond `window`); clipped and rejected ones never
  /// do, so an attacker cannot drag the statistic up. With a single member and an
  /// empty window there is nothing to compare with: accepted.
  std::vector<screen_decision> screen(std::span<const double> norms);

  std::size_t remembered() const { return window_.size(); }

 private:
  robust_config config_;
  std::deque<double> window_;
};

}  // namespace archipelago
