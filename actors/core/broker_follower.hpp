#pragma once
// Which broker a learner or a shard follows: the one leading in the newest
// broker epoch it has heard of from a broker (Header.brokerEpoch; see
// mesh_setup.hpp). Only a broker's header moves the epoch: any other sender's
// is what that sender believes, and a learner could otherwise depose the leader
// with one forged header. An epoch that cannot exist in this mesh (its leader is
// not one of the mesh's brokers, or its incarnation is out of range) is refused.
// A broker's message of an older epoch, or of a broker that does not lead in the
// newest one, is fenced: its sender was deposed (or never led) and must not open
// or close rounds. Pure.

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
    refused,  // a broker's message whose epoch cannot exist in this mesh: refused
  };

  /// `brokers`: the mesh's brokers (primary and standbys), as this node was told.
  explicit broker_follower(std::uint32_t brokers) : brokers_(brokers) {}

  news on_message(node_address from, std::uint64_t epoch) {
    if (from.kind != role::sync_broker) return news::same;
    if (from.index >= brokers_ || !epoch_can_exist(epoch, brokers_)) {
      ++refused_;
      return news::refused;
    }
    news out = news::same;
    if (epoch > epoch_) {
      out = epoch_ == 0 ? news::first : news::changed;
      epoch_ = epoch;
    }
    if (epoch < epoch_ || from.index != leader_of_epoch(epoch_)) {
      ++fenced_;
      return news::fenced;
    }
    return out;
  }

  /// The broker to talk to: the primary until an epoch is heard of.
  node_address leader() const { return epoch_ == 0 ? broker_address : broker_at(leader_of_epoch(epoch_)); }
  /// Whether `from` is the broker that leads now (commands that end or reconfigure a node come only from it).
  bool is_leader(node_address from) const { return from.kind == role::sync_broker && from == leader(); }
  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t fenced() const { return fenced_; }
  /// Brokers' messages refused for an epoch that cannot exist (or a broker index beyond the mesh's).
  std::uint64_t refused() const { return refused_; }
  /// Who a Join goes to: the leader, or every broker while no epoch is known (a
  /// node that starts while a standby leads) or while the leader is silent (one
  /// that took over may not know this node's endpoint); only the leader answers.
  std::vector<node_address> join_targets(bool leader_silent = false) const {
    if (epoch_ != 0 && !leader_silent) return {leader()};
    std::vector<node_address> all;
    for (std::uint32_t b = 0; b < brokers_; ++b) all.push_back(broker_at(b));
    return all;
  }

 private:
  std::uint32_t brokers_;
  std::uint64_t epoch_ = 0;
  std::uint64_t fenced_ = 0;
  std::uint64_t refused_ = 0;
};

}  // namespace archipelago
