#pragma once
// The learner's synchronisation state (docs/design/algorithm.md §4), a pure core: per
// fragment the anchor (the last global value received), its version and the
// work done since (steps, tokens). It never blocks: rounds the broker opened
// are answered with anchor-relative deltas whenever the learner gets to them,
// and global values are applied whenever they arrive.
//
// The model's parameters stay in the engine's buffer; this core reads and
// writes the fragment ranges of that buffer it is handed. A fragment's flat
// vector is the concatenation of its tensors in layout order.

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/layout.hpp"

namespace archipelago {

struct learner_sync_config {
  double mix = 0;  // α_mix: θ_p ← α·θ_p + (1−α)·Θ_p on receipt; 0 = overwrite (the paper)
  std::size_t max_pending_rounds = 64;  // bound on rounds opened and not yet answered
  /// A round is answered once the learner did this many steps on its fragment
  /// since the anchor (H in diloco and streaming; 1 otherwise).
  std::uint64_t contribute_after = 1;
  /// The synchronous policies: the learner stops stepping once a fragment is
  /// this many steps past contribute_after without a new global value (dp and
  /// diloco 0, streaming τ). Negative: never waits (decoupled).
  std::int64_t wait_slack = -1;
  /// On receipt keep the progress not yet contributed: θ_p ← Θ_p + (θ_p − θ_p at
  /// the last contribution since the anchor), or + (θ_p − anchor) when there was
  /// none; the counters keep those steps, so the next contribution carries them.
  /// Excludes mix.
  bool rebase = false;
  /// A learner that missed versions of a fragment (cut off, its broadcasts lost)
  /// catches up before it contributes to it (on_round_open, on_fragment_update).
  /// Decoupled only (mesh.catch_up): the synchronous policies wait for every
  /// version anyway, and take it as it is.
  bool catch_up = false;
};

/// What the learner sends the owning shard for one round.
struct contribution_plan {
  round_number round;
  fragment_index fragment;
  std::uint64_t step = 0;    // the learner's steps done when it was taken (this incarnation)
  std::uint64_t anchor_version = 0;
  std::uint64_t steps = 0;   // c_steps since the anchor
  std::uint64_t tokens = 0;  // c_tokens since the anchor
  std::vector<float> delta;  // θ_p − anchor_p, the fragment's flat vector (dp: −gradient)
};

class learner_core {
 public:
  learner_core(const param_layout& layout, fragment_plan plan, learner_sync_config config);

  std::size_t fragments() const { return plan_.fragments.size(); }
  std::size_t fragment_floats(fragment_index p) const { return plan_.fragments.at(p.value).floats; }
  const fragment_plan& plan() const { return plan_; }

  /// Copies fragment p out of / into a parameter buffer laid out by the layout.
  void gather(fragment_index p, const float* params, float* out) const;
  void scatter(fragment_index p, const float* in, float* params) const;

  /// Join / rejoin (Clone pattern): Θ_p at `version` fetched from the shard.
  /// Sets θ_p and the anchor, zeroes the counters. A version at or below the
  /// one held is ignored (returns false).
  bool install(fragment_index p, std::uint64_t version, std::span<const float> global, float* params);

  /// One inner step of `tokens` tokens finished.
  void on_step(std::uint64_t tokens);

  /// The broker opened round r for fragment p, whose newest version it saw
  /// published is `latest` (0: unknown). Bounded: beyond max_pending_rounds the
  /// oldest pending round is dropped (it would be late). Returns true when the
  /// learner holds an older version of p (it missed some: cut off, or their
  /// broadcasts lost): it contributes to p only once a newer one arrived (fetch it
  /// now), so that it never sends a delta from a value the mesh has moved on from.
  bool on_round_open(round_number r, fragment_index p, std::uint64_t latest = 0);

  /// The next contribution to send: the oldest pending round whose fragment has
  /// contribute_after steps of work since its anchor, and new work since its
  /// last contribution (a round opened before the previous round's result
  /// arrived must not get the same work twice). Rounds not ready stay pending. With `gradient` (the dp policy) the delta is −gradient, so the
  /// shard's outer gradient is the learner's gradient.
  std::optional<contribution_plan> next_contribution(const float* params, const float* gradient = nullptr);

  /// True when the policy makes the learner wait for a fragment update before
  /// its next step (never for decoupled).
  bool must_wait() const;

  /// A new global Θ_p arrived, published by round `from_round`: installed over
  /// θ_p (overwrite, mix or rebase, as configured). Stale or
  /// duplicate versions are ignored (false). Pending rounds of p numbered at or
  /// below from_round are closed already and are dropped: work done since this
  /// anchor must go to a round still open.
  /// A learner that missed versions of p (this one is more than one past its
  /// anchor, or it waits for it after on_round_open) catches up instead (with
  /// catch_up): Θ_p becomes its anchor and θ_p stays, so its next delta is
  /// θ_p − Θ_p, its progress against the value the mesh holds now. Had it sent
  /// θ_p − its old anchor, the merge would add its progress on top of the
  /// mesh's over the same stretch — both descents from the old anchor, counted
  /// twice — with a weight grown with all its steps: two learners back from an
  /// 8 s partition set the mesh back 32 %. Its counters are divided by 1 + the
  /// versions it missed, so the merge weighs it like a learner with one round's
  /// work (c_tokens² / c_steps falls by that factor); the steps the division drops
  /// the ledger books overwritten.
  bool on_fragment_update(fragment_index p, std::uint64_t version, std::span<const float> global,
                          float* params, round_number from_round = round_number{0});
  /// Fragments holding steps no contribution has carried into a received
  /// version yet, or a contribution to a round whose version has not arrived
  /// (a learner that finished flushes them before it leaves: leaving earlier, its
  /// Leave may overtake that contribution, and the broker then closes the round
  /// without it).
  std::size_t fragments_with_unmerged_work() const;
  /// No step follows (a flush): a round is answered with whatever work its
  /// fragment holds, fewer steps than contribute_after included (diloco's H).
  void on_last_step() { last_step_done_ = true; }
  bool last_step_done() const { return last_step_done_; }

  /// The broker restarted (a higher incarnation): the rounds it had opened are
  /// gone, and the new one may number its rounds from 0 again. Pending rounds
  /// are dropped, and work already contributed to a round the old broker never
  /// closed may go to the next round (the shards dropped it unmerged; the
  /// counters since the anchor still hold it). Returns the pending rounds dropped.
  std::size_t on_broker_restarted();

  std::uint64_t version(fragment_index p) const { return state_.at(p.value).version; }
  /// Θ_p as last received (the anchor), the fragment's flat vector.
  std::span<const float> anchor(fragment_index p) const { return state_.at(p.value).anchor; }
  /// Fragment p's shard restarted from its snapshot, at `version` with value
  /// Θ_p = `global`: the anchor becomes the recovered value and the local
  /// progress stays — θ_p and the counters are kept, so the next contribution
  /// carries θ_p − Θ_recovered, and the work since the last merge is not thrown
  /// away. What was contributed to the dead incarnation's rounds is gone with
  /// it: all the work since the anchor may be contributed again.
  void reanchor(fragment_index p, std::uint64_t version, std::span<const float> global);
  std::uint64_t steps_since_anchor(fragment_index p) const { return state_.at(p.value).steps; }
  std::uint64_t tokens_since_anchor(fragment_index p) const { return state_.at(p.value).tokens; }
  bool installed(fragment_index p) const { return state_.at(p.value).installed; }
  std::size_t pending_rounds() const { return pending_.size(); }
  std::uint64_t dropped_rounds() const { return dropped_rounds_; }
  std::uint64_t steps_done() const { return steps_done_; }

 private:
  struct fragment_state {
    std::vector<float> anchor;
    std::uint64_t version = 0;
    std::uint64_t steps = 0;
    std::uint64_t tokens = 0;
    std::uint64_t contributed_steps = 0;  // c_steps when last contributed since the anchor
    // The latest round contributed to whose version has not arrived: a version of an
    // earlier round (rounds in flight) does not carry that contribution's work.
    std::optional<round_number> awaited_round;
    bool installed = false;
    // rebase: θ_p and the counters at the last contribution since the anchor
    // (empty: none yet).
    std::vector<float> contributed_theta;
    std::uint64_t contributed_tokens = 0;
    // catch_up: a newer version exists (a RoundOpen said so); no contribution until one arrives.
    std::uint64_t behind = 0;
  };
  struct pending_round {
    round_number round;
    fragment_index fragment;
  };

  const param_layout& layout_;
  fragment_plan plan_;
  learner_sync_config config_;
  std::vector<fragment_state> state_;
  std::deque<pending_round> pending_;
  std::uint64_t dropped_rounds_ = 0;
  std::uint64_t steps_done_ = 0;
  bool last_step_done_ = false;
};

}  // namespace archipelago
