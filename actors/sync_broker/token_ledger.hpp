#pragma once
// The token ledger and goodput accounting (ALGORITHM.md §9), a pure core the
// broker's shell feeds. Every step a learner reports (Progress) is one entry
// with its tokens and its step time; every contribution covers a window of
// steps, (step − c_steps, step], and its outcome raises the bucket of those
// steps: merged > late > rejected > lost. A step no contribution ever covered
// (its learner died first, or the run ended first) stays lost. So every
// processed token ends in exactly one bucket, by construction; the shell
// cross-checks the processed total against the learners' own counts.

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "core/clock.hpp"
#include "core/ids.hpp"
#include "core/ledger_totals.hpp"

namespace archipelago {

enum class ledger_bucket : std::uint8_t { lost = 0, rejected = 1, late = 2, merged = 3 };  // higher wins

class token_ledger {
 public:
  /// Bounds: steps remembered per learner incarnation, rounds with arrivals pending.
  explicit token_ledger(std::uint64_t max_steps_per_learner = std::uint64_t{1} << 22,
                        std::size_t max_open_rounds = 4096);

  /// `who` has done `step` steps, `tokens_total` tokens; the last one took `step_time`.
  /// Steps skipped since its previous report (a lost Progress) share the difference.
  void on_progress(learner_ref who, std::uint64_t step, std::uint64_t tokens_total, nanos step_time);
  /// A contribution covering (step − steps, step] ended in `bucket`.
  void on_outcome(learner_ref who, std::uint64_t step, std::uint64_t steps, ledger_bucket bucket);
  /// A contribution was buffered for round r; its outcome comes with the close
  /// (late at once if r closed already).
  void on_arrival(round_number round, learner_ref who, std::uint64_t step, std::uint64_t steps);
  /// Round r closed. If it merged, its members' windows are merged; a round
  /// closed without a merge leaves them as they were (the learners' counters
  /// still hold that work, and a later contribution covers it again).
  void on_round_closed(round_number round, const std::vector<learner_ref>& members, bool merged);

  /// A restarted broker continues an incarnation from the ledger its previous
  /// broker stored: `totals` over that incarnation's steps 1..`step` (totals.steps
  /// == step, totals.processed == its cumulative tokens at `step`, balanced).
  /// Those steps are frozen in their stored buckets: the next Progress counts
  /// only the steps after `step` (sharing the tokens after totals.processed, as
  /// for a lost Progress), and an outcome whose window reaches below `step`
  /// raises only its part above. So `processed` stays exact; what is
  /// approximate is only which bucket the steps the previous broker saw after
  /// its last ledger write end in (lost unless a later outcome covers them).
  /// Only before anything else is known of `who`; false (nothing changed) if
  /// something is, or if the totals are inconsistent.
  bool restore(learner_ref who, const ledger_totals& totals, std::uint64_t step);
  /// Steps of `who` frozen by restore() (0: none).
  std::uint64_t frozen_steps(learner_ref who) const;

  ledger_totals totals() const { return sum(per_learner()); }
  /// The same, per learner incarnation.
  std::map<learner_ref, ledger_totals> per_learner() const;
  static ledger_totals sum(const std::map<learner_ref, ledger_totals>& per_learner);
  std::uint64_t overflowed_steps() const { return overflowed_steps_; }

 private:
  struct step_entry {
    std::uint32_t tokens = 0;
    std::uint32_t time_us = 0;
    ledger_bucket bucket = ledger_bucket::lost;
  };
  struct learner_steps {
    std::vector<step_entry> steps;  // index = step − 1 − frozen
    std::uint64_t frozen = 0;       // steps 1..frozen were restored as totals only (restore())
    std::uint64_t reported_step = 0, reported_tokens = 0;
    ledger_totals totals;  // over the reported steps, kept as buckets change (reports stay O(learners))
  };
  static void count(ledger_totals& t, const step_entry& e, ledger_bucket bucket, int sign);
  struct arrival {
    learner_ref who;
    std::uint64_t step, steps;
  };
  learner_steps& of(learner_ref who);
  bool extend(learner_steps& l, std::uint64_t step);

  std::uint64_t max_steps_;
  std::size_t max_open_rounds_;
  std::map<learner_ref, learner_steps> learners_;
  std::map<std::uint64_t, std::vector<arrival>> open_;
  std::set<std::uint64_t> closed_;  // the last max_open_rounds closed rounds
  std::uint64_t overflowed_steps_ = 0;
};

/// Share of [start, end] in which the global model advanced: a gap between two
/// publications (or from start to the first, or the last to end) longer than
/// `stall_ns` counts as down time beyond stall_ns.
double uptime_from_publications(const std::vector<nanos>& published_at, nanos start, nanos end, nanos stall_ns);

}  // namespace archipelago
