#pragma once
// The parameter shard's state core (pure, deterministic): the global value Θ_p,
// its Nesterov state and version for every fragment the shard owns; the
// contributions buffered per open round (bounded); on the broker's close, the
// token-weighted merge of exactly the named members, the outer step and the
// new version to publish. Every contribution ends in one ledger bucket.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/inner_optimizer.hpp"
#include "parameter_shard/merge.hpp"
#include "parameter_shard/robust_merge.hpp"

namespace archipelago {

struct shard_config {
  nesterov_config outer;
  /// The dp policy: contributions are gradients, averaged per token over every
  /// tensor, and the outer step is AdamW at the inner schedule (step = version).
  bool gradient_mode = false;
  /// mesh.merge = mean: every tensor takes the token-weighted mean instead of RDA.
  bool merge_mean = false;
  optimizer_config adamw_outer;
  std::int64_t schedule_steps = 1;
  std::size_t max_open_rounds = 16;           // rounds with buffered contributions
  std::size_t max_contributions_per_round = 256;
  bool record_merges = false;  // hand every merged contribution back in published_fragment
  /// mesh.robust: members screened by norm at close (rejected or clipped), then a
  /// coordinate-wise trimmed merge (robust_merge.hpp).
  robust_config robust;
};

/// Which bucket a contribution's tokens end in (docs/concepts/accounting.md).
enum class contribution_verdict : std::uint8_t {
  buffered,   // held for its round; merged or dropped when the round closes
  duplicate,  // same learner, incarnation and round again: ignored (not counted twice)
  late,       // its round already closed
  rejected,   // wrong fragment, wrong size, non-finite values, or a bound exceeded
};
const char* to_string(contribution_verdict v);

struct shard_ledger {
  std::uint64_t merged_tokens = 0, late_tokens = 0, rejected_tokens = 0, unmerged_tokens = 0;
  std::uint64_t merged = 0, late = 0, rejected = 0, duplicates = 0, unmerged = 0;
  /// Of the merged: contributions merged scaled down to the robust norm bound.
  /// Of the rejected: contributions the robust screening rejected at close.
  std::uint64_t clipped = 0, screened_out = 0, screened_out_tokens = 0;
  /// Of the screened out: rejected by the direction screen, by the staleness screen
  /// (anchor too old or a replayed delta); the rest by norm.
  std::uint64_t screened_by_direction = 0, screened_stale = 0;
};

/// A member set apart at its round's close: its claim exceeded the broker's bound
/// (rejected), or the robust screening clipped or rejected it. For the shell's log
/// and metrics, and — when rejected — for the broker (its ledger and tape must not
/// count the member as merged).
struct screened_contribution {
  enum class cause : std::uint8_t { robust, claim_bound };
  learner_ref from;
  round_number round;
  fragment_index fragment;
  std::uint64_t tokens = 0, steps = 0, learner_step = 0;  // as the contribution claimed them
  cause why = cause::robust;
  screen_decision decision;                         // robust: the screening's verdict
  std::uint64_t bound_tokens = 0, bound_steps = 0;  // claim_bound: the broker's bound on the member
  bool rejected() const { return why == cause::claim_bound || decision.what == screen_decision::action::reject; }
  /// "delta norm per sqrt(step) 812.3 above the robust bound 2.41 (...)", or
  /// "learner/1 claims 300000 tokens in 3 steps; the broker bounds it to ...".
  std::string reason() const;
};

/// mesh.robust: what the screens saw at one round's close — every member's figures
/// and verdict — for the shard's debug log (`shard.screen`, one line per round).
struct round_screening {
  round_number round;
  fragment_index fragment;
  std::uint64_t version = 0;  // the fragment's version the round merges into
  struct member {
    learner_ref from;
    std::uint64_t steps = 0;
    screen_decision decision;
  };
  std::vector<member> members;
  /// "round 812 fragment 5 v 31: learner/0 steps 24 lag 0 norm 0.0123 (bound 0.037) cos 0.612 (bound 0.45)
  /// accept; ..."
  std::string describe() const;
};

/// One contribution as merged, in merge order (recorded for `replay verify`).
struct merged_contribution {
  learner_ref from;
  std::uint64_t steps = 0, tokens = 0;
  std::vector<float> delta;
};

/// A new global value (read it with value(fragment)), to broadcast to the learners.
struct published_fragment {
  fragment_index fragment;
  std::uint64_t version = 0;
  round_number round;
  std::uint64_t merged_tokens = 0;
  std::size_t members = 0;
  std::vector<merged_contribution> merged;  // filled only when the core records merges
};

/// A fragment's whole outer state, as a snapshot holds it. Θ and the Nesterov
/// buffer are shared with the core, not copied: a Θ never changes once made (a
/// merge makes the next one in a buffer of its own), while the buffer changes
/// in place at the fragment's next merge — whoever writes it out must finish
/// before that merge (shard_wire merges nothing of a fragment whose last version
/// is not durable).
struct fragment_outer_state {
  std::uint64_t version = 0;
  round_number round;  // the round that produced it
  std::shared_ptr<const std::vector<float>> theta, momentum;  // momentum: empty in gradient mode
  std::vector<float> adam_m, adam_v;  // gradient mode: copies
  std::int64_t adam_steps = 0;
};
/// Shares `v` as a fragment_outer_state holds it.
std::shared_ptr<const std::vector<float>> shared_floats(std::vector<float> v);

class shard_core {
 public:
  /// `owned` fragments start from `initial_params` (a buffer laid out by `layout`) at version 0.
  shard_core(const param_layout& layout, const fragment_plan& plan, std::vector<fragment_index> owned,
             shard_config config, const float* initial_params);

  bool owns(fragment_index p) const { return fragments_.count(p.value) != 0; }
  std::uint64_t version(fragment_index p) const { return fragments_.at(p.value).version; }
  const std::vector<float>& value(fragment_index p) const { return *fragments_.at(p.value).theta; }
  /// Θ_p of the current version, shared (it never changes: the next merge makes a new one).
  std::shared_ptr<const std::vector<float>> shared_value(fragment_index p) const { return fragments_.at(p.value).theta; }
  const std::vector<float>& momentum(fragment_index p) const { return *fragments_.at(p.value).momentum; }
  /// The fragment's whole outer state, Θ and the Nesterov buffer shared (see fragment_outer_state).
  fragment_outer_state outer_state(fragment_index p) const;
  /// Resumes fragment p from a snapshot: rounds up to the one that produced it count as closed.
  /// Θ is shared; the Nesterov buffer is copied (the core changes its own in place).
  status restore(fragment_index p, fragment_outer_state state);

  /// A learner's delta for round r. `reason` (optional) receives why it was rejected.
  /// `learner_step` (the learner's steps when it sent it) only travels back in
  /// screened_contribution, for the broker's ledger.
  /// When max_open_rounds rounds are buffered, the oldest is dropped (unmerged) to
  /// make room: a round that old was closed while this shard was away, or never will be.
  contribution_verdict on_contribution(round_number r, fragment_index p, learner_ref from,
                                       std::uint64_t steps, std::uint64_t tokens, std::vector<float> delta,
                                       std::string* reason = nullptr, std::uint64_t learner_step = 0,
                                       std::optional<std::uint64_t> anchor_version = std::nullopt);

  /// The broker closed round r of fragment p with these members: merge exactly
  /// them (those buffered), step, publish version + 1. Buffered contributions of
  /// non-members are dropped as unmerged. A round with no usable member
  /// publishes nothing (nullopt) and leaves Θ_p unchanged.
  expected<std::optional<published_fragment>> on_round_close(round_number r, fragment_index p,
                                                             const std::vector<learner_ref>& members);
  /// The same, with the broker's bound on each member's claims (RoundClose's
  /// Member.tokens/steps: what the learner's Progress and its batch × context allow).
  /// A buffered contribution that claims more tokens or steps than its bound is
  /// rejected (ledger: rejected; take_screened() hands it back); the others are
  /// weighed by their bounded counts.
  struct decided_member {
    learner_ref who;
    bool bounded = false;  // false: no bound (a broker of before the bound), the claim as is
    std::uint64_t tokens = 0, steps = 0;
  };
  expected<std::optional<published_fragment>> on_round_decided(round_number r, fragment_index p,
                                                               const std::vector<decided_member>& members);

  /// The broker restarted (a higher incarnation): the rounds the old one opened
  /// will never close. Every buffered contribution is dropped (unmerged: the
  /// learners' next contributions carry the same work, as after a shard
  /// restart), and round numbers start over: the new broker's rounds are new
  /// ones whatever their numbers (a broker without its tape numbers from 0;
  /// contributions to the old broker's rounds are told apart by the broker
  /// incarnation they carry, not by number). Returns the contributions dropped.
  std::size_t on_broker_restarted();
  /// A contribution to a round of a broker older than the current one: that
  /// round died with its broker. Counted late; returns contribution_verdict::late.
  contribution_verdict on_earlier_broker_round(std::uint64_t tokens);

  const shard_ledger& ledger() const { return ledger_; }
  /// The members set apart (claims refused, robust screening) since the last call, oldest first.
  std::vector<screened_contribution> take_screened() { return std::exchange(screened_, {}); }
  /// mesh.robust: the screens' figures of every round closed since the last call, oldest first.
  std::vector<round_screening> take_screenings() { return std::exchange(screenings_, {}); }
  /// mesh.robust* set live (`archipelago set`): used from the next round close on. A
  /// changed setting starts each fragment's norm window afresh; the same one keeps it.
  /// Returns whether anything changed.
  bool set_robust(const robust_config& robust);
  const robust_config& robust() const { return config_.robust; }

 private:
  struct buffered_contribution {
    learner_ref from;
    std::uint64_t steps, tokens;
    std::vector<float> delta;
    std::uint64_t learner_step = 0;
    std::optional<std::uint64_t> anchor_version;
  };
  struct fragment_state {
    std::vector<std::string> names;        // owned: tensors' name views point here
    std::vector<fragment_tensor> tensors;  // within the fragment's flat vector
    std::shared_ptr<const std::vector<float>> theta;  // replaced, never changed, by a merge
    std::shared_ptr<std::vector<float>> momentum;     // changed in place by a merge; empty in gradient mode
    std::unique_ptr<inner_optimizer> gradient_optimizer;  // gradient_mode only
    std::uint64_t version = 0;
    std::map<std::uint64_t, std::vector<buffered_contribution>> open;  // round → contributions
    std::uint64_t closed_through = 0;  // rounds below this are closed
    std::uint64_t round = 0;           // the round that produced the current version
    std::optional<fragment_screen> screen;  // mesh.robust
  };

  void drop_oldest_round();

  std::map<std::uint32_t, fragment_state> fragments_;
  shard_config config_;
  outer_optimizer outer_;
  shard_ledger ledger_;
  std::size_t open_rounds_ = 0;
  std::vector<screened_contribution> screened_;
  std::vector<round_screening> screenings_;
};

}  // namespace archipelago
