#pragma once
// The lease service as the simulation's brokers see it: a model of what etcd
// (3.4) does with the calls a lease_keeper makes — leases that expire their TTL
// after the last grant or keep-alive arrived, keys attached to a lease deleted
// with it, and the campaign's transaction guarded by "no leader key, epoch key
// unchanged since read". Times are the calls' arrival times in virtual time.

#include <cstdint>
#include <map>
#include <optional>

#include "core/clock.hpp"
#include "sync_broker/lease_keeper.hpp"

namespace archipelago::sim {

class sim_lease_service {
 public:
  lease_reply handle(const lease_call& call, nanos now);
  std::uint64_t campaigns_won() const { return campaigns_won_; }

 private:
  struct key {
    std::uint64_t value = 0;
    std::int64_t lease = 0;  // 0: none
    std::int64_t mod_revision = 0;
  };
  void expire(nanos now);
  void drop_lease(std::int64_t id);

  std::map<std::int64_t, nanos> leases_;  // ID → when it expires
  std::map<std::int64_t, std::int64_t> ttl_s_;
  std::optional<key> leader_, epoch_;
  std::int64_t revision_ = 1, next_lease_ = 1;
  std::uint64_t campaigns_won_ = 0;
};

}  // namespace archipelago::sim
