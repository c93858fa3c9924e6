#pragma once
// What a role's wire layer sends through: the node's transport in a process,
// the simulation's virtual network in tests. Wire layers take one (the network
// is passed in); they never open sockets themselves.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/ids.hpp"
#include "transport/codec.hpp"
#include "transport/link_shaper.hpp"

namespace archipelago::transport {

class message_port {
 public:
  virtual ~message_port() = default;
  /// This node.
  virtual node_address self() const = 0;
  /// Where this node listens, as peers dial it (a learner announces it).
  virtual const std::string& endpoint() const = 0;
  /// Registers (or re-points) a peer: its messages go to `endpoint`.
  virtual status add_peer(node_address peer, const std::string& endpoint) = 0;
  /// A builder with this node's header and the next sequence number.
  virtual envelope_builder make_envelope(std::uint64_t round = 0) = 0;
  /// Queues a message for `peer`; errc::overloaded when the queue is full.
  virtual status send(node_address peer, encoded_message&& message) = 0;
  /// The same message to every listed peer (a fragment broadcast).
  virtual status broadcast(const std::vector<node_address>& peers, encoded_message&& message) = 0;
  /// Shapes the directed link from this node to `peer` from now on (the chaos monkey's link faults).
  virtual status set_link(node_address peer, const link_profile& profile) = 0;
  /// This node's normal link, which a heal restores.
  virtual const link_profile& default_link() const = 0;

  /// The newest broker epoch this node knows; every envelope it builds carries it
  /// (Header.brokerEpoch), heartbeats too, so the news of a new leader spreads with
  /// any traffic and a deposed one hears it.
  virtual std::uint64_t broker_epoch() const = 0;
  /// Raises it (never lowers); the wire layers call it with every epoch they accept.
  virtual void raise_broker_epoch(std::uint64_t epoch) = 0;
};

/// Refuses `env`, a deposed broker's message (broker_follower::news::fenced): an
/// Error `fenced` to its sender, whose header carries `known_epoch`, the newer one.
void refuse_fenced(message_port& port, const decoded_envelope& env, std::uint64_t known_epoch);

/// A port's broker epoch, readable from its I/O thread while the wire raises it.
class broker_epoch_cell {
 public:
  std::uint64_t get() const { return value_.load(std::memory_order_relaxed); }
  void raise(std::uint64_t epoch) {
    std::uint64_t known = value_.load(std::memory_order_relaxed);
    while (epoch > known && !value_.compare_exchange_weak(known, epoch, std::memory_order_relaxed)) {
    }
  }

 private:
  std::atomic<std::uint64_t> value_{0};
};

}  // namespace archipelago::transport
