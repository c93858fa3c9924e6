#pragma once
// Which broker leads, as one broker sees it. Pure: times are passed in.
//
// A mesh without standbys has one broker, which leads from its start in the
// epoch of its incarnation (as before standbys existed). With standbys
// (node --role broker --standby), every broker follows the newest epoch it
// hears of (any message's Header.brokerEpoch) and takes over — in an epoch
// above every one it heard of — when the broker leading it is declared dead
// by the control lane (the transport's liveness verdict: heartbeat interval ×
// liveness), or when it has heard of no leader for as long since its start (a
// leader heard of only through others' headers, never from itself: twice as long).
// Standby i waits (i − 1) heartbeat intervals longer, so that two standbys do
// not usually campaign at once; when they do, the higher epoch wins and the
// other steps down on hearing of it. The primary (broker 0) listens one
// liveness window at its start before it leads (asking the others who leads:
// broker_seat), so that a primary restarted while a standby leads follows that
// standby instead; a standby that hears of no leader waits a heartbeat longer.
//
// Safety does not rest on these timings: shards and learners refuse a
// broker's message of an older epoch than they know (broker_follower), so a
// deposed broker — partitioned or paused, not dead — can neither open nor
// close a round once they heard of its successor. What the timings decide is
// only how soon a leader follows a dead one, and a broker cut off from the
// others may take over needlessly (the mesh then pauses for one takeover).

#include <cstdint>
#include <optional>

#include "core/clock.hpp"
#include "core/mesh_setup.hpp"

namespace archipelago {

struct election_config {
  std::uint32_t self = 0;       // this broker's index (0: the primary)
  std::uint32_t brokers = 1;    // primary and standbys
  nanos heartbeat_ns = 1'000'000'000;
  nanos dead_after_ns = 3'000'000'000;  // the control lane's liveness verdict
};

class broker_election {
 public:
  broker_election(election_config cfg, std::uint64_t incarnation, nanos now);

  /// Any epoch heard of (a message's header, the port's). True: this broker led
  /// and a newer epoch leads now (step down).
  bool on_epoch(std::uint64_t epoch, nanos now);
  /// The control lane's verdict on broker `index` (dead: silent for dead_after_ns).
  void on_broker_peer(std::uint32_t index, bool alive, nanos now);
  /// A message from the broker that leads (it is alive).
  void on_leader_heard(nanos now);
  /// A follower that should lead now: the epoch it leads in from now on.
  std::optional<std::uint64_t> take_over(nanos now);
  /// With a lease (broker_lease) taking over is two steps: the epoch this follower
  /// would lead in when it should lead now (campaign for the lease with it), then
  /// lead_in() the epoch the lease service granted.
  std::optional<std::uint64_t> candidate(nanos now) const;
  /// The epoch this broker would lead in, whatever the timings say: above every
  /// epoch heard of, its own incarnation's when that is higher still.
  std::uint64_t epoch_to_lead() const;
  void lead_in(std::uint64_t epoch);
  /// The broker stopped leading (deposed, or it could not start).
  void step_down(nanos now);

  bool leading() const { return leading_; }
  /// The newest epoch known (this broker's own while it leads); 0: none.
  std::uint64_t epoch() const { return epoch_; }
  /// Who leads in it, if anyone is known to.
  std::optional<std::uint32_t> leader() const;
  std::uint64_t takeovers() const { return takeovers_; }

 private:
  election_config cfg_;
  std::uint64_t incarnation_;
  std::uint64_t epoch_ = 0;
  bool leading_ = false;
  std::optional<nanos> dead_at_;  // the control lane declared the leader dead then
  bool heard_directly_ = false;   // the leader itself was heard (its BrokerState, or its liveness)
  nanos since_ns_;                // the leader was last heard of (or this broker started, or stepped down)
  std::uint64_t takeovers_ = 0;
};

}  // namespace archipelago
