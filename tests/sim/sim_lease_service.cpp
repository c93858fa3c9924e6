#include "sim/sim_lease_service.hpp"

namespace archipelago::sim {

void sim_lease_service::drop_lease(std::int64_t id) {
  leases_.erase(id);
  ttl_s_.erase(id);
  if (leader_ && leader_->lease == id) {
    leader_.reset();
    ++revision_;
  }
}

void sim_lease_service::expire(nanos now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    const std::int64_t id = it->first;
    const bool expired = it->second <= now;
    ++it;
    if (expired) drop_lease(id);
  }
}

lease_reply sim_lease_service::handle(const lease_call& call, nanos now) {
  expire(now);
  lease_reply reply = lease_reply::answered();
  switch (call.what) {
    case lease_call::kind::range:
      reply.keys.leader_epoch = leader_ ? leader_->value : 0;
      reply.keys.epoch = epoch_ ? epoch_->value : 0;
      reply.keys.epoch_mod_revision = epoch_ ? epoch_->mod_revision : 0;
      break;
    case lease_call::kind::grant:
      reply.granted = next_lease_++;
      leases_[reply.granted] = now + call.ttl_s * 1'000'000'000;
      ttl_s_[reply.granted] = call.ttl_s;
      break;
    case lease_call::kind::campaign: {
      if (!leases_.count(call.lease_id)) return lease_reply::failed("etcdserver: requested lease not found");
      const std::int64_t epoch_revision = epoch_ ? epoch_->mod_revision : 0;
      reply.won = !leader_ && epoch_revision == call.epoch_mod_revision;
      if (reply.won) {
        ++revision_;
        leader_ = key{call.epoch, call.lease_id, revision_};
        epoch_ = key{call.epoch, 0, revision_};
        ++campaigns_won_;
      }
      break;
    }
    case lease_call::kind::keepalive:
      if (auto it = leases_.find(call.lease_id); it != leases_.end()) {
        reply.ttl_left_s = ttl_s_[call.lease_id];
        it->second = now + reply.ttl_left_s * 1'000'000'000;
      }
      break;
    case lease_call::kind::revoke:
      drop_lease(call.lease_id);
      break;
  }
  return reply;
}

}  // namespace archipelago::sim
