#pragma once
// The token ledger and goodput accounting (docs/concepts/accounting.md), per fragment: a
// pure core the broker's shell feeds. Every step a learner reports (Progress)
// is one entry with its tokens and its step time; its tokens are split over the
// P fragments it trained, in proportion to their parameters, and each share
// ends in exactly one bucket. A contribution to fragment p covers a window of
// steps, (step − c_steps, step], and its outcome raises the bucket of p's
// shares of those steps: merged > late > rejected > overwritten > lost.
//   merged       in a round whose merge became durable and visible (published);
//   late         contributed after its round closed;
//   rejected     contributed, refused (a bad contribution);
//   overwritten  never contributed: the learner installed a newer version of p
//                first (its next window starts above the step) — overlap's cost;
//   lost         never contributed: the learner died first, or the run ended.
// So every processed token-share ends in one bucket, by construction; the shell
// cross-checks the processed total against the learners' own counts.

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "core/clock.hpp"
#include "core/ids.hpp"
#include "core/ledger_totals.hpp"

namespace archipelago {

enum class ledger_bucket : std::uint8_t { lost = 0, overwritten = 1, rejected = 2, late = 3, merged = 4 };  // higher wins

/// The last steps of a learner incarnation whose shares a later outcome may
/// still raise, as a broker stores them with its ledger (token_ledger::tail_of).
struct ledger_tail {
  std::vector<std::uint32_t> tokens, time_us;  // per step, oldest first
  std::vector<std::uint8_t> buckets;           // P per step (ledger_bucket values)
};

class token_ledger {
 public:
  /// `fragment_floats`: each fragment's parameter count (a step's tokens are split
  /// in proportion). Bounds: steps remembered per learner incarnation, rounds pending.
  explicit token_ledger(std::vector<std::uint64_t> fragment_floats,
                        std::uint64_t max_steps_per_learner = std::uint64_t{1} << 22,
                        std::size_t max_open_rounds = 4096);

  std::size_t fragments() const { return fragment_floats_.size(); }
  /// Fragment p's share of a step of `tokens` tokens (the shares of a step sum to it exactly).
  std::uint64_t share(std::uint64_t tokens, std::uint32_t p) const;

  /// `who` has done `step` steps, `tokens_total` tokens; the last one took `step_time`.
  /// Steps skipped since its previous report (a lost Progress) share the difference.
  void on_progress(learner_ref who, std::uint64_t step, std::uint64_t tokens_total, nanos step_time);
  /// A contribution to fragment p covering (step − steps, step] ended in `bucket`.
  void on_outcome(learner_ref who, fragment_index p, std::uint64_t step, std::uint64_t steps, ledger_bucket bucket);
  /// A contribution to fragment p was buffered for round r; its outcome comes
  /// with the close (late at once if r closed already).
  void on_arrival(round_number round, fragment_index p, learner_ref who, std::uint64_t step, std::uint64_t steps);
  /// Round r closed. If it merged, its members' windows wait for the merge to be
  /// published (on_round_published); a round closed without a merge leaves
  /// them as they were (the learners' counters still hold that work, and a
  /// later contribution covers it again).
  void on_round_closed(round_number round, const std::vector<learner_ref>& members, bool merged);
  /// The version round r merged is durable and visible: its members' windows are merged.
  /// A merge that never becomes durable (its shard died first) credits nothing.
  void on_round_published(round_number round);
  /// A buffered contribution of `who` to fragment p in round r was refused after
  /// all (mesh.robust screened it out at the close): it leaves the round, so the
  /// round's publish does not credit it as merged. Nothing when it is not there.
  void withdraw(round_number round, fragment_index p, learner_ref who);

  /// The steps of `who` whose shares an outcome may still raise: from the
  /// lowest window start of its fragments (where it last installed each) to its
  /// last Progress, at most `max_steps` of them. Stored with the totals, they let
  /// a restarted broker credit the work that was in flight when its predecessor died.
  ledger_tail tail_of(learner_ref who, std::uint64_t max_steps = 1024) const;

  /// A restarted broker continues an incarnation from the ledger its previous
  /// broker stored: `totals` over that incarnation's steps 1..`step` (totals.steps
  /// == step, totals.processed == its cumulative tokens at `step`, balanced), and
  /// the same per fragment (one balanced entry per fragment, summing to `totals`),
  /// and the tail (tail_of) of those steps. The steps before the tail are frozen
  /// in their stored buckets; the tail's steps keep their entries, so an outcome
  /// whose window reaches into them raises them as before the restart. The next
  /// Progress counts only the steps after `step` (sharing the tokens after
  /// totals.processed, as for a lost Progress). So `processed` stays exact; what
  /// is approximate is only which bucket the steps the previous broker saw after
  /// its last ledger write end in (lost unless a later outcome covers them).
  /// Only before anything else is known of `who`; false (nothing changed) if
  /// something is, or if the totals or the tail are inconsistent.
  bool restore(learner_ref who, const ledger_totals& totals, const std::vector<ledger_totals>& by_fragment,
               std::uint64_t step, const ledger_tail& tail = {});
  /// Steps of `who` frozen by restore(), its tail excluded (0: none).
  std::uint64_t frozen_steps(learner_ref who) const;

  ledger_totals totals() const { return sum(per_learner()); }
  /// The same, per learner incarnation.
  std::map<learner_ref, ledger_totals> per_learner() const;
  /// Per learner incarnation and fragment (what a broker stores).
  std::vector<ledger_totals> fragments_of(learner_ref who) const;
  /// Per fragment, over every learner incarnation.
  std::vector<ledger_totals> per_fragment() const;
  static ledger_totals sum(const std::map<learner_ref, ledger_totals>& per_learner);
  std::uint64_t overflowed_steps() const { return overflowed_steps_; }

 private:
  struct step_entry {
    std::uint32_t tokens = 0;
    std::uint32_t time_us = 0;
  };
  struct learner_steps {
    std::vector<step_entry> steps;      // index = step − 1 − frozen
    std::vector<ledger_bucket> bucket;  // (step − 1 − frozen) × P + p
    std::vector<std::uint64_t> window_floor;  // per fragment: the highest window start seen (or unknown_floor)
    std::uint64_t frozen = 0;  // steps 1..frozen were restored as totals only (restore())
    std::uint64_t reported_step = 0, reported_tokens = 0;
    ledger_totals totals;                   // over the reported steps, kept as buckets change
    std::vector<ledger_totals> fragments;  // the same per fragment (reports stay O(learners × P))
  };
  /// A restored incarnation's first window only sets the floor: the steps below
  /// it may have been merged by the previous broker after its last ledger write.
  static constexpr std::uint64_t unknown_floor = ~std::uint64_t{0};
  struct arrival {
    learner_ref who;
    std::uint32_t fragment;
    std::uint64_t step, steps;
  };
  learner_steps& of(learner_ref who);
  /// Fragment p's share of a step's time.
  double weight(std::uint32_t p) const {
    return static_cast<double>(fragment_floats_[p]) / static_cast<double>(floats_before_.back());
  }
  bool extend(learner_steps& l, std::uint64_t step);
  /// A stored tail is consistent with the totals it was stored with.
  bool tail_fits(const ledger_tail& tail, const ledger_totals& totals, const std::vector<ledger_totals>& by_fragment,
                 std::uint64_t step) const;
  /// Moves fragment p's share of the step at `index` (its entry) to `bucket`.
  void raise(learner_steps& l, std::uint64_t index, std::uint32_t p, ledger_bucket bucket);
  void count(learner_steps& l, const step_entry& e, std::uint32_t p, ledger_bucket bucket, int sign) const;
  /// A window of p starting at `start`: p's shares below it that no window covered were overwritten.
  void settle_below(learner_steps& l, std::uint32_t p, std::uint64_t start);

  std::vector<std::uint64_t> fragment_floats_;
  std::vector<std::uint64_t> floats_before_;  // prefix sums, P + 1 entries
  std::uint64_t max_steps_;
  std::size_t max_open_rounds_;
  std::map<learner_ref, learner_steps> learners_;
  std::map<std::uint64_t, std::vector<arrival>> open_;
  std::map<std::uint64_t, std::vector<arrival>> awaiting_;  // merged rounds not yet published
  std::set<std::uint64_t> closed_;  // the last max_open_rounds closed rounds
  std::uint64_t overflowed_steps_ = 0;
};

/// Share of [start, end] in which the model (or one fragment of it) advanced: a
/// gap between two publications (or from start to the first, or the last to
/// end) longer than `stall_ns` counts as down time beyond stall_ns.
double uptime_from_publications(const std::vector<nanos>& published_at, nanos start, nanos end, nanos stall_ns);

}  // namespace archipelago
