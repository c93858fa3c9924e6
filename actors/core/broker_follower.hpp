#pragma once
// Which broker a learner or a shard follows: the one leading in the newest
// broker epoch it has heard of, from any sender (Header.brokerEpoch; see
// mesh_setup.hpp). A broker's message of an older epoch, or of a broker that
// does not lead in the newest one, is fenced: its sender was deposed (or never
// led) and must not open or close rounds. Pure.

#include <cstdint>
#include <vector>

#include "core/ids.hpp"
#include "core/mesh_setup.hpp"

namespace archipelago {

class broker_follower {
 public:
  enum class news {
    same,     // nothing new
    first,    // the first epoch heard of
    changed,  // a newer epoch: another broker (or a restarted one) leads now
    fenced,   // a broker's message that must be refused
  };

  news on_message(node_address from, std::uint64_t epoch) {
    news out = news::same;
    if (epoch > epoch_) {
      out = epoch_ == 0 ? news::first : news::changed;
      epoch_ = epoch;
    }
    if (from.kind == role::sync_broker && (epoch < epoch_ || from.index != leader_of_epoch(epoch_))) {
      ++fenced_;
      return news::fenced;
    }
    return out;
  }

  /// The broker to talk to: the primary until an epoch is heard of.
  node_address leader() const { return epoch_ == 0 ? broker_address : broker_at(leader_of_epoch(epoch_)); }
  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t fenced() const { return fenced_; }
  /// Who a Join goes to: the leader, or every broker while no epoch is known (a
  /// node that starts while a standby leads) or while the leader is silent (one
  /// that took over may not know this node's endpoint); only the leader answers.
  std::vector<node_address> join_targets(std::uint32_t brokers, bool leader_silent = false) const {
    if (epoch_ != 0 && !leader_silent) return {leader()};
    std::vector<node_address> all;
    for (std::uint32_t b = 0; b < brokers; ++b) all.push_back(broker_at(b));
    return all;
  }

 private:
  std::uint64_t epoch_ = 0;
  std::uint64_t fenced_ = 0;
};

}  // namespace archipelago
