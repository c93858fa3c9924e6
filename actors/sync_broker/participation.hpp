#pragma once
// Participation per round (pure): the learners whose work a round merged against
// the learners live when it closed. A round settles once its outcome is known: its
// fragment version published (its members merged, less those a shard screened out
// under mesh.robust and those whose claims the broker cut), or closed without a
// merge (none merged), or not published within the settle bound (none merged).
// Participation of a round = merged / |live at close ∪ members|: never above 1.
// The mean is over settled rounds whose denominator is not empty.

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "core/clock.hpp"
#include "core/ids.hpp"

namespace archipelago {

struct participation_round {
  std::uint64_t round = 0;
  std::uint32_t fragment = 0;
  std::uint32_t live = 0;    // |learners live at close ∪ the round's members|
  std::uint32_t merged = 0;  // members whose work the published version holds
  nanos closed_ns = 0;
  double share() const { return live == 0 ? 0.0 : static_cast<double>(merged) / live; }
};

class participation_tracker {
 public:
  static constexpr std::size_t recent_capacity = 64;
  /// Rounds awaiting their outcome at most (older ones settle as merging nothing).
  static constexpr std::size_t pending_capacity = 4096;

  /// A round closed. `live`: |learners live at close ∪ its members| (round_record::live);
  /// `accepted`: the members whose claims stood (the shard merges them); `merge`: it reached quorum.
  void on_close(std::uint64_t round, std::uint32_t fragment, std::uint32_t live,
                const std::vector<learner_ref>& accepted, bool merge, nanos now);
  /// A shard screened `who` out of `round` at its close (mesh.robust): not merged.
  void on_screened(std::uint64_t round, learner_ref who);
  /// The round's fragment version was published: its remaining members are merged.
  void on_published(std::uint64_t round);
  /// Rounds unpublished `settle_ns` after their close settle with none merged.
  void tick(nanos now, nanos settle_ns);

  std::uint64_t rounds() const { return rounds_; }
  std::uint64_t merged_total() const { return merged_total_; }
  std::uint64_t live_total() const { return live_total_; }
  /// Mean over settled rounds of merged / live; 0 before any.
  double mean() const { return rounds_ == 0 ? 0.0 : share_sum_ / static_cast<double>(rounds_); }
  /// The newest settled rounds, oldest first.
  const std::deque<participation_round>& recent() const { return recent_; }

 private:
  struct pending {
    participation_round r;
    std::vector<learner_ref> accepted;
  };
  void settle(participation_round r);

  std::map<std::uint64_t, pending> pending_;
  std::deque<participation_round> recent_;
  std::uint64_t rounds_ = 0, merged_total_ = 0, live_total_ = 0;
  double share_sum_ = 0;
};

}  // namespace archipelago
