#include "sync_broker/broker_election.hpp"

#include <algorithm>

namespace archipelago {

broker_election::broker_election(election_config cfg, std::uint64_t incarnation, nanos now)
    : cfg_(cfg), incarnation_(incarnation), since_ns_(now) {}

std::optional<std::uint32_t> broker_election::leader() const {
  if (epoch_ == 0) return std::nullopt;
  return leader_of_epoch(epoch_);
}

bool broker_election::on_epoch(std::uint64_t epoch, nanos now) {
  if (epoch <= epoch_) return false;
  const bool deposed = leading_;
  epoch_ = epoch;
  leading_ = false;
  heard_directly_ = false;
  dead_at_.reset();
  since_ns_ = now;
  return deposed;
}

void broker_election::on_broker_peer(std::uint32_t index, bool alive, nanos now) {
  if (leading_ || epoch_ == 0 || index != leader_of_epoch(epoch_)) return;
  if (alive) {
    on_leader_heard(now);
  } else if (!dead_at_) {
    dead_at_ = now;
  }
}

void broker_election::on_leader_heard(nanos now) {
  if (leading_) return;
  heard_directly_ = true;
  dead_at_.reset();
  since_ns_ = now;
}

std::optional<std::uint64_t> broker_election::take_over(nanos now) {
  const auto epoch = candidate(now);
  if (epoch) lead_in(*epoch);
  return epoch;
}

std::optional<std::uint64_t> broker_election::candidate(nanos now) const {
  if (leading_) return std::nullopt;
  const nanos stagger = cfg_.self > 0 ? (cfg_.self - 1) * cfg_.heartbeat_ns : 0;
  bool go = false;
  if (cfg_.brokers <= 1) {
    go = true;  // no standbys: lead at once, as a mesh always did
  } else if (epoch_ == 0 || leader_of_epoch(epoch_) == cfg_.self) {
    // No leader heard of (or only an earlier incarnation of this broker): the
    // primary listens a liveness window, a standby a heartbeat longer.
    go = now - since_ns_ >= cfg_.dead_after_ns + (cfg_.self == 0 ? 0 : cfg_.heartbeat_ns + stagger);
  } else if (heard_directly_) {
    // The leader's death verdict: the control lane's, which heartbeats feed.
    go = dead_at_ && now - *dead_at_ >= stagger;
  } else {
    // A leader only heard of (from others' headers), never from: the control lane
    // has no verdict on a peer it never heard; a long silence stands in for one.
    go = now - since_ns_ >= 2 * cfg_.dead_after_ns + stagger;
  }
  if (!go) return std::nullopt;
  return epoch_to_lead();
}

std::uint64_t broker_election::epoch_to_lead() const {
  return broker_epoch_of(std::max(incarnation_, (epoch_ >> 8) + 1), cfg_.self);
}

void broker_election::lead_in(std::uint64_t epoch) {
  epoch_ = std::max(epoch_, epoch);
  leading_ = true;
  dead_at_.reset();
  ++takeovers_;
}

void broker_election::step_down(nanos now) {
  leading_ = false;
  dead_at_.reset();
  since_ns_ = now;
}

}  // namespace archipelago
