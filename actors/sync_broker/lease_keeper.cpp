#include "sync_broker/lease_keeper.hpp"

#include <algorithm>
#include <limits>

#include "core/mesh_setup.hpp"

namespace archipelago {
namespace {
constexpr nanos far_future = std::numeric_limits<nanos>::max() / 2;
}

lease_keeper_config lease_settings(const mesh_setup& setup, std::uint32_t index) {
  const nanos heartbeat_ns = setup.cfg.wire.heartbeat_interval_ms * 1'000'000;
  const nanos liveness_ns = heartbeat_ns * setup.cfg.wire.liveness;
  return {index, std::max<std::int64_t>(2, (liveness_ns + 999'999'999) / 1'000'000'000), heartbeat_ns};
}

nanos lease_keeper::margin_ns() const {
  return std::max<nanos>(cfg_.ttl_s * 1'000'000'000 / 10, 200'000'000);
}

void lease_keeper::campaign(std::uint64_t min_epoch) {
  min_epoch = std::max<std::uint64_t>(min_epoch, 1);
  if (state_.held_epoch != 0 || wanted_epoch_ >= min_epoch) return;
  wanted_epoch_ = min_epoch;
  release_ = false;
}

void lease_keeper::release() {
  wanted_epoch_ = 0;
  release_ = true;
}

nanos lease_keeper::due_at() const {
  if (out_) return far_future;
  if (queued_) return 0;
  if (lease_id_ != 0) return release_ ? 0 : next_renewal_;
  return next_range_;
}

std::optional<lease_call> lease_keeper::next(nanos now) {
  if (out_ || now < due_at()) return std::nullopt;
  lease_call call;
  if (queued_) {
    call = *queued_;
    queued_.reset();
    if (call.what == lease_call::kind::grant) grant_sent_ = now;
  } else if (lease_id_ != 0 && release_) {
    call = {lease_call::kind::revoke, lease_id_};
    lease_id_ = 0;  // given back: leads no more from this moment, whether or not the call arrives
    state_.held_epoch = 0;
    release_ = false;
  } else if (lease_id_ != 0) {
    call = {lease_call::kind::keepalive, lease_id_};
    next_renewal_ = now + cfg_.ttl_s * 1'000'000'000 / 3;
  } else {
    call = {lease_call::kind::range};
    next_range_ = now + cfg_.retry_ns;
  }
  out_ = call;
  out_sent_ = now;
  return call;
}

void lease_keeper::answer(const lease_reply& reply, nanos now) {
  if (!out_) return;
  const lease_call call = *out_;
  const nanos sent = out_sent_;
  out_.reset();
  if (!reply.reached) {
    state_.error = reply.error;
    // A transaction without an answer may have won: revoke what it was granted, so
    // that a leader key nobody renews does not block every campaign for a TTL.
    if (call.what == lease_call::kind::campaign) queued_ = lease_call{lease_call::kind::revoke, call.lease_id};
    return;
  }
  state_.error.clear();
  switch (call.what) {
    case lease_call::kind::range:
      state_.leader_epoch = reply.keys.leader_epoch;
      state_.observed_at = now;
      if (lease_id_ == 0 && wanted_epoch_ != 0 && reply.keys.leader_epoch == 0) {
        seen_ = reply.keys;
        queued_ = lease_call{lease_call::kind::grant, 0, 0, 0, cfg_.ttl_s};
      }
      break;
    case lease_call::kind::grant:
      if (wanted_epoch_ == 0) {  // released meanwhile
        queued_ = lease_call{lease_call::kind::revoke, reply.granted};
        break;
      }
      queued_ = lease_call{lease_call::kind::campaign, reply.granted,
                           std::max(wanted_epoch_, broker_epoch_of((seen_.epoch >> 8) + 1, cfg_.broker_index)),
                           seen_.epoch_mod_revision};
      break;
    case lease_call::kind::campaign:
      if (!reply.won) {  // another broker was quicker
        queued_ = lease_call{lease_call::kind::revoke, call.lease_id};
        break;
      }
      lease_id_ = call.lease_id;
      next_renewal_ = grant_sent_ + cfg_.ttl_s * 1'000'000'000 / 3;
      state_.held_epoch = state_.leader_epoch = call.epoch;
      state_.valid_until = grant_sent_ + cfg_.ttl_s * 1'000'000'000 - margin_ns();
      wanted_epoch_ = 0;  // a release() meanwhile left release_ set: the next call gives it back
      break;
    case lease_call::kind::keepalive:
      if (call.lease_id != lease_id_) break;  // given back meanwhile
      if (reply.ttl_left_s > 0) {
        state_.valid_until = sent + reply.ttl_left_s * 1'000'000'000 - margin_ns();
      } else {  // expired at the service: another broker may hold it now
        lease_id_ = 0;
        state_.held_epoch = 0;
        state_.error = "the lease expired at the service";
      }
      break;
    case lease_call::kind::revoke:
      break;
  }
}

}  // namespace archipelago
