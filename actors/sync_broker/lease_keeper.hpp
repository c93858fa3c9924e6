#pragma once
// The brokers' lease as a state machine (pure: no sockets, no clock, no thread).
// It decides which call to make to the lease service next and reads the answers;
// a driver carries the calls: etcd_lease over etcd's v3 JSON API on a thread, the
// simulation over its virtual network to a model of etcd (tests/sim). One call is
// out at a time, as one connection carries them.
//
// A campaign: range the mesh's two keys; when no leader key exists, grant a lease
// and put both keys with it in one transaction guarded by "no leader key, epoch key
// unchanged since the range" (revoking the granted lease when the transaction
// fails). The holder renews every TTL/3 and counts its lease valid until the send
// time of its last successful renewal (or grant) + TTL − margin, before the
// service — which counts the TTL from the call's arrival — can give it to anyone
// else. A broker that neither holds nor campaigns still ranges the keys every
// retry (observing): a follower learns that no broker holds the lease — its leader
// lost the lease without dying — without waiting for the control lane to call the
// leader dead (which it never does while the deposed leader keeps heartbeating).

#include <cstdint>
#include <optional>
#include <string>

#include "core/clock.hpp"
#include "sync_broker/broker_lease.hpp"
#include "sync_broker/etcd_requests.hpp"

namespace archipelago {

/// One call to the lease service.
struct lease_call {
  enum class kind : std::uint8_t { range, grant, campaign, keepalive, revoke };
  kind what = kind::range;
  std::int64_t lease_id = 0;            // campaign, keepalive, revoke
  std::uint64_t epoch = 0;              // campaign: the epoch the leader key records
  std::int64_t epoch_mod_revision = 0;  // campaign: the epoch key's revision the range saw (0: absent)
  std::int64_t ttl_s = 0;               // grant
};

/// Its answer. reached = false: none came (the error says why); the call may or
/// may not have taken effect at the service.
struct lease_reply {
  bool reached = false;
  std::string error;
  etcd_requests::keys_seen keys;  // range
  std::int64_t granted = 0;       // grant: the lease's ID
  bool won = false;               // campaign: the transaction succeeded
  std::int64_t ttl_left_s = 0;    // keepalive: 0 when the lease is gone

  static lease_reply failed(std::string why) {
    lease_reply r;
    r.error = std::move(why);
    return r;
  }
  static lease_reply answered() {
    lease_reply r;
    r.reached = true;
    return r;
  }
};

struct lease_keeper_config {
  std::uint32_t broker_index = 0;
  std::int64_t ttl_s = 3;
  nanos retry_ns = 1'000'000'000;  // between campaigns' ranges, and between observations
};

struct mesh_setup;
/// Broker `index`'s settings in a mesh: the TTL is the control lane's liveness
/// window in whole seconds (etcd counts whole seconds; at least 2), a campaign's
/// or an observation's range every heartbeat interval.
lease_keeper_config lease_settings(const mesh_setup& setup, std::uint32_t index);

class lease_keeper final : public broker_lease {
 public:
  explicit lease_keeper(lease_keeper_config cfg) : cfg_(cfg) {}

  void campaign(std::uint64_t min_epoch) override;
  void release() override;
  lease_state state() const override { return state_; }

  /// The call to make now; none while one is out or none is due.
  std::optional<lease_call> next(nanos now);
  /// The answer to the call next() gave last.
  void answer(const lease_reply& reply, nanos now);
  /// When next() has a call due without campaign() or release() in between (none: far future).
  nanos due_at() const;

 private:
  nanos margin_ns() const;

  const lease_keeper_config cfg_;
  lease_state state_;
  std::optional<lease_call> out_;
  nanos out_sent_ = 0;
  std::uint64_t wanted_epoch_ = 0;  // campaigning for at least this; 0: not
  bool release_ = false;            // give a held lease back
  std::int64_t lease_id_ = 0;       // held
  nanos next_renewal_ = 0;
  nanos next_range_ = 0;            // a campaign's or an observation's next range
  std::optional<lease_call> queued_;  // the next step of a campaign (grant, transaction, or the loser's revoke)
  etcd_requests::keys_seen seen_;     // what the campaign's range saw
  nanos grant_sent_ = 0;
};

}  // namespace archipelago
