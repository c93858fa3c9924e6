#pragma once
// The robust merge (mesh.robust): what keeps one poisoned learner from
// wrecking a fragment. Pure and deterministic (no clock, no randomness, a fixed
// order), like the rest of the merge.
//
// At a round's close the shard hands every member's whole delta to its
// fragment's `fragment_screen` (so robust mode needs all members' deltas at
// the close: a shard that merges on arrival must keep them while it is on).
// Three screens, in this order, each on the members the one before kept:
// - Staleness. A contribution anchored on a version the fragment does not have
//   yet, or more than `max_anchor_lag` versions behind it, is rejected; so is
//   one whose delta is bit for bit one this fragment already merged (a digest
//   of each merged delta is kept, the last `replay_window` of them): a replay.
// - Norm. Each member's delta norm per √step, ‖d_m‖ / √c_steps (per √step so
//   that a learner back from a pause, whose delta holds many steps, is not
//   taken for an attacker), above `norm_factor` × a reference is rejected or
//   clipped. The reference is the lower median of the round's figures when it
//   has 3 or more members (one attacker cannot move it); a smaller round adds
//   the fragment's trusted figures — the members accepted in its latest rounds
//   of 3 or more, so the reference follows the learning-rate warm-up instead of
//   lagging it, and a small attacker accepted in a small round never enters it.
// - Direction. Each member's cosine with a reference direction — the
//   coordinate-wise median of the other members' unit deltas with 3 or more,
//   else the fragment's recent descent (the opposite of its outer momentum) —
//   below max(min_cosine, cosine_ratio × the honest level) is rejected. The
//   level is the lower median of the round's cosines (3 or more members), else
//   of the fragment's trusted cosines with the descent. Honest learners descend
//   the same loss, so their deltas agree in direction; a sign-flipped, random
//   or steadily sideways delta of honest norm, which the norm screen cannot
//   see, agrees far less.
// A coordinate-wise trimmed aggregate (merge_options::trim, in merge.hpp) is
// an option on top: every weighted mean of the merge drops the `trim` largest
// and smallest values per coordinate.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace archipelago {

struct robust_config {
  bool enabled = false;      // mesh.robust
  double norm_factor = 3;    // mesh.robust_norm_factor: bound = reference × this; finite, ≥ 1
  /// mesh.robust_window: trusted figures (norms per √step, cosines with the descent)
  /// remembered per fragment, the newest; about one round of members. ≥ 1
  std::size_t window = 4;
  bool clip = false;         // mesh.robust_screen = clip (true) | reject (false)
  std::size_t trim = 0;      // mesh.robust_trim: contributions trimmed per side per coordinate
  double min_cosine = 0;     // mesh.robust_min_cosine: in [-1, 1]; -1 turns the direction screen off
  double cosine_ratio = 0.5; // mesh.robust_cosine_ratio: in [0, 1]; 0: min_cosine alone
  std::uint64_t max_anchor_lag = 64;  // mesh.robust_max_anchor_lag: versions; ≥ 1
  /// false: no screening, only the trimmed merge — `replay verify` re-merges recorded
  /// members, which the shard screened (and clipped) already.
  bool screening = true;
  bool operator==(const robust_config&) const = default;
};

/// Checks the bounds above; the error names the offending field.
status validate(const robust_config& config);

/// Digests of merged deltas remembered per fragment (the replay screen): 8 bytes each.
inline constexpr std::size_t replay_window = 1024;

/// The lower median (the ⌈n/2⌉-th smallest) of `values`; 0 when empty. The lower
/// one so that two values, one honest and one huge, give the honest one.
double lower_median(std::vector<double> values);

/// What screening decided for one member, with the figures it decided on.
struct screen_decision {
  enum class action : std::uint8_t { accept, clip, reject };
  /// Which screen set it apart (none: accepted as it is).
  enum class cause : std::uint8_t { none, stale_anchor, replay, norm, direction };
  action what = action::accept;
  cause why = cause::none;
  double norm = 0;        // ‖d_m‖ / √c_steps over the fragment
  double norm_bound = 0;  // norm_factor × the reference (0: nothing to compare with)
  double cosine = 0;      // with the reference direction (0 when there was none)
  double min_cosine = 0;  // the direction screen's bound this round (-1: no reference, nothing rejected)
  std::int64_t anchor_lag = 0;  // the fragment's version − the member's anchor version (0: unknown)
  /// The factor to multiply the delta by (clip: bound / norm; accept: 1; reject: 0).
  double scale() const { return what == action::clip ? norm_bound / norm : what == action::accept ? 1.0 : 0.0; }
};
const char* to_string(screen_decision::action a);
const char* to_string(screen_decision::cause c);

/// A round with at least this many members is its own reference (one attacker
/// cannot move its medians); a smaller one also leans on the fragment's trusted figures.
inline constexpr std::size_t min_round_reference = 3;

/// Each delta's cosine with the coordinate-wise median of the other deltas' unit
/// vectors (`has_median`: at least min_round_reference deltas), and with the
/// descent, the opposite of `momentum` (`has_descent`: a non-zero momentum of the
/// deltas' length). A zero delta's cosines are 0.
struct direction_figures {
  bool has_median = false, has_descent = false;
  std::vector<double> with_median, with_descent;
};
direction_figures direction_cosines(std::span<const std::span<const float>> deltas, std::span<const float> momentum);

/// One member of a round, as the screens see it.
struct screen_member {
  std::span<const float> delta;
  std::uint64_t steps = 1;
  std::optional<std::uint64_t> anchor_version;  // nullopt: not known (no staleness check by anchor)
};

/// One fragment's screening state: its trusted figures and the digests of its merged deltas.
class fragment_screen {
 public:
  explicit fragment_screen(const robust_config& config) : config_(config) {}

  /// Screens one round's members (in merge order) for the fragment at `version`
  /// whose outer momentum is `momentum` (empty: none, e.g. the AdamW outer
  /// optimizer of send_gradients). The accepted and clipped members count as
  /// merged from here on (their digests; in a round of 3 or more, their figures
  /// become the trusted ones).
  std::vector<screen_decision> screen(std::span<const screen_member> members, std::uint64_t version,
                                      std::span<const float> momentum);

  std::size_t trusted_norms() const { return norms_.size(); }
  std::size_t digests() const { return digests_.size(); }

 private:
  void screen_norms(std::span<const std::size_t> kept, bool own_reference, std::vector<screen_decision>& out) const;
  void screen_directions(std::span<const screen_member> members, std::span<const std::size_t> kept,
                         std::span<const float> momentum, std::vector<screen_decision>& out,
                         std::vector<double>& descent_cosines) const;

  robust_config config_;
  std::deque<double> norms_;            // trusted norms per √step, newest last
  std::deque<double> descent_cosines_;  // trusted cosines with the descent, newest last
  std::deque<std::uint64_t> digests_;   // merged deltas' digests, newest last
};

}  // namespace archipelago
