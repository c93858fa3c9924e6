#pragma once
// A lease that decides which broker may lead (mesh.etcd: etcd_lease). Without
// one, brokers elect by the control lane's liveness verdicts (broker_election),
// and two brokers cut off from each other may both lead, in different epochs,
// until the shards' fencing settles it. With one, a broker leads only while it
// holds the lease, and the lease service allocates each leader's epoch, so at
// most one broker leads at any time and epochs only grow — also across hosts,
// and across restarts of every broker.
//
// The seat (broker_seat) asks for the lease when its election says it should
// lead, or when the service records no leader; it reads where it stands on every
// tick and before acting on a message: the lease itself renews, campaigns and
// observes in the background (lease_keeper, driven by a thread that talks to the
// service), never in the broker's loop.

#include <cstdint>
#include <string>

#include "core/clock.hpp"

namespace archipelago {

struct lease_state {
  std::uint64_t held_epoch = 0;    // this broker holds the lease and leads in this epoch; 0: it does not
  nanos valid_until = 0;           // while held, on the broker's clock: stop leading then unless renewed
  std::uint64_t leader_epoch = 0;  // the epoch the service records as leading (another broker's too); 0: none
  nanos observed_at = -1;          // leader_epoch is as the service answered then; -1: never asked
  std::string error;               // the last failure to reach the service (empty: none since the last success)
};

class broker_lease {
 public:
  virtual ~broker_lease() = default;
  /// Take the lease, again and again until it is held (or release()), leading in an
  /// epoch above every one the service recorded and at least `min_epoch`.
  virtual void campaign(std::uint64_t min_epoch) = 0;
  /// Give the lease up, or stop campaigning.
  virtual void release() = 0;
  virtual lease_state state() const = 0;
};

}  // namespace archipelago
