#include "transport/reliability.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <limits>
#include <string>

#include "core/invariant.hpp"

namespace archipelago {

// ---- peer liveness --------------------------------------------------------

status validate(const heartbeat_config& cfg) {
  if (cfg.interval_ns <= 0) {
    return make_error(errc::invalid_input,
                      "heartbeat interval_ns must be > 0, got " + std::to_string(cfg.interval_ns));
  }
  if (cfg.liveness < 1 || cfg.liveness > 100) {
    return make_error(errc::invalid_input,
                      "heartbeat liveness must be in [1, 100], got " + std::to_string(cfg.liveness));
  }
  if (cfg.interval_ns > std::numeric_limits<nanos>::max() / cfg.liveness) {
    return make_error(errc::invalid_input, "heartbeat interval_ns * liveness overflows");
  }
  return {};
}

peer_liveness::peer_liveness(heartbeat_config cfg)
    : cfg_(cfg), timeout_ns_(cfg.interval_ns * cfg.liveness) {
  ARCHIPELAGO_INVARIANT(validate(cfg).has_value(), "reliability: a validated config");
}

bool peer_liveness::dead_at(const peer_state& p, nanos now) const {
  // Unsigned difference: exact for any now > last, no signed overflow.
  return now > p.last_heard_ns &&
         static_cast<std::uint64_t>(now) - static_cast<std::uint64_t>(p.last_heard_ns) >
             static_cast<std::uint64_t>(timeout_ns_);
}

void peer_liveness::heard_from(node_address peer, nanos now) {
  auto [it, inserted] = peers_.try_emplace(peer, peer_state{now, false});
  if (inserted) return;
  // max: a late-delivered timestamp must not make a peer look older than it is.
  it->second.last_heard_ns = std::max(it->second.last_heard_ns, now);
  it->second.reported_dead = false;
}

bool peer_liveness::alive(node_address peer, nanos now) const {
  const auto it = peers_.find(peer);
  return it != peers_.end() && !dead_at(it->second, now);
}

nanos peer_liveness::next_heartbeat_due(nanos now) const {
  return heartbeat_ever_sent_ ? last_heartbeat_sent_ns_ + cfg_.interval_ns : now;
}

void peer_liveness::heartbeat_sent(nanos now) {
  // Scheduled from the actual send time, as in the zguide: a late send does
  // not cause a burst of catch-up heartbeats.
  last_heartbeat_sent_ns_ = heartbeat_ever_sent_ ? std::max(last_heartbeat_sent_ns_, now) : now;
  heartbeat_ever_sent_ = true;
}

std::vector<node_address> peer_liveness::expire(nanos now) {
  std::vector<node_address> died;
  for (auto& [peer, state] : peers_) {
    if (!state.reported_dead && dead_at(state, now)) {
      state.reported_dead = true;
      died.push_back(peer);
    }
  }
  return died;
}

void peer_liveness::forget(node_address peer) { peers_.erase(peer); }

std::size_t peer_liveness::live_count(nanos now) const {
  return static_cast<std::size_t>(std::count_if(
      peers_.begin(), peers_.end(), [&](const auto& entry) { return !dead_at(entry.second, now); }));
}

// ---- reconnect backoff ----------------------------------------------------

status validate(const backoff_config& cfg) {
  if (cfg.initial_ns <= 0) {
    return make_error(errc::invalid_input,
                      "backoff initial_ns must be > 0, got " + std::to_string(cfg.initial_ns));
  }
  if (cfg.max_ns < cfg.initial_ns) {
    return make_error(errc::invalid_input, "backoff max_ns (" + std::to_string(cfg.max_ns) +
                                               ") must be >= initial_ns (" +
                                               std::to_string(cfg.initial_ns) + ")");
  }
  if (cfg.max_ns > (nanos{1} << 61)) {
    return make_error(errc::invalid_input, "backoff max_ns must be <= 2^61 ns");
  }
  if (!std::isfinite(cfg.multiplier) || cfg.multiplier < 1.0) {
    return make_error(errc::invalid_input,
                      "backoff multiplier must be finite and >= 1, got " + std::to_string(cfg.multiplier));
  }
  if (!std::isfinite(cfg.jitter) || cfg.jitter < 0.0 || cfg.jitter > 1.0) {
    return make_error(errc::invalid_input,
                      "backoff jitter must be in [0, 1], got " + std::to_string(cfg.jitter));
  }
  return {};
}

reconnect_backoff::reconnect_backoff(backoff_config cfg, std::uint64_t seed)
    : cfg_(cfg), rng_(seed), base_ns_(static_cast<double>(cfg.initial_ns)) {
  ARCHIPELAGO_INVARIANT(validate(cfg).has_value(), "reliability: a validated config");
}

nanos reconnect_backoff::next_delay() {
  const double max_ns = static_cast<double>(cfg_.max_ns);
  const double base_ns = base_ns_;
  base_ns_ = std::min(base_ns_ * cfg_.multiplier, max_ns);
  if (attempts_ < INT_MAX) ++attempts_;
  // Always draw, even with jitter == 0, so the stream position depends only on
  // the number of calls.
  const double factor = 1.0 + cfg_.jitter * (2.0 * rng_.uniform() - 1.0);
  const double bound_ns = max_ns * (1.0 + cfg_.jitter);
  return static_cast<nanos>(std::clamp(base_ns * factor, 0.0, bound_ns));
}

void reconnect_backoff::reset() {
  base_ns_ = static_cast<double>(cfg_.initial_ns);
  attempts_ = 0;
}

// ---- duplicate suppression ------------------------------------------------

dedup_window::dedup_window(std::uint32_t window, std::size_t max_senders)
    : window_(window),
      max_senders_(max_senders),
      ring_bits_(std::bit_ceil(std::max<std::uint64_t>(window, 64))),
      ring_mask_(ring_bits_ - 1) {
  ARCHIPELAGO_INVARIANT(window <= max_window, "duplicate filter: window <= max_window");
  ARCHIPELAGO_INVARIANT(max_senders >= 1, "duplicate filter: at least one sender");
}

void dedup_window::restart(sender_state& s, incarnation inc, std::uint64_t seq) const {
  s.inc = inc;
  s.highest = seq;
  s.bits.assign(ring_bits_ / 64, 0);
}

void dedup_window::clear_ring(sender_state& s, std::uint64_t first_seq, std::uint64_t count) const {
  if (count >= ring_bits_) {
    std::fill(s.bits.begin(), s.bits.end(), 0);
    return;
  }
  // ring_bits_ is a multiple of 64, so the wrap-around falls on a word boundary.
  std::uint64_t pos = first_seq & ring_mask_;
  while (count > 0) {
    const std::uint64_t bit = pos & 63;
    const std::uint64_t n = std::min<std::uint64_t>(64 - bit, count);
    const std::uint64_t mask = (n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1) << bit;
    s.bits[pos >> 6] &= ~mask;
    count -= n;
    pos = (pos + n) & ring_mask_;
  }
}

void dedup_window::advance(sender_state& s, std::uint64_t seq) const {
  const std::uint64_t delta = seq - s.highest;
  if (delta > ring_bits_) {
    std::fill(s.bits.begin(), s.bits.end(), 0);
  } else {
    // Slots of highest+1 .. seq-1 still hold seqs that now fall off the ring;
    // the old highest was accepted, so its slot gets a 1.
    clear_ring(s, s.highest + 1, delta - 1);
    const std::uint64_t pos = s.highest & ring_mask_;
    s.bits[pos >> 6] |= std::uint64_t{1} << (pos & 63);
  }
  s.highest = seq;
}

bool dedup_window::test_and_set(sender_state& s, std::uint64_t seq) const {
  const std::uint64_t pos = seq & ring_mask_;
  const std::uint64_t mask = std::uint64_t{1} << (pos & 63);
  std::uint64_t& word = s.bits[pos >> 6];
  const bool was_set = (word & mask) != 0;
  word |= mask;
  return was_set;
}

dedup_window::verdict dedup_window::check(node_address sender, incarnation inc, std::uint64_t seq) {
  auto it = senders_.find(sender);
  if (it == senders_.end()) {
    if (senders_.size() >= max_senders_) {
      // Recycle the least recently used sender's node and bitmap: a flood of
      // new senders costs no allocation once the table is full.
      auto node = senders_.extract(lru_.back());
      sender_state& s = node.mapped();
      lru_.splice(lru_.begin(), lru_, s.lru);
      *s.lru = sender;
      node.key() = sender;
      restart(s, inc, seq);
      senders_.insert(std::move(node));
    } else {
      lru_.push_front(sender);
      sender_state s;
      s.lru = lru_.begin();
      restart(s, inc, seq);
      senders_.emplace(sender, std::move(s));
    }
    return verdict::fresh;
  }

  sender_state& s = it->second;
  lru_.splice(lru_.begin(), lru_, s.lru);
  if (inc < s.inc) return verdict::stale_incarnation;
  if (inc > s.inc) {
    restart(s, inc, seq);
    return verdict::fresh;
  }
  if (seq > s.highest) {
    advance(s, seq);
    return verdict::fresh;
  }
  if (seq == s.highest) return verdict::duplicate;
  if (s.highest - seq > window_) return verdict::too_old;
  return test_and_set(s, seq) ? verdict::duplicate : verdict::fresh;
}

void dedup_window::forget(node_address sender) {
  const auto it = senders_.find(sender);
  if (it == senders_.end()) return;
  lru_.erase(it->second.lru);
  senders_.erase(it);
}

const char* to_string(dedup_window::verdict v) {
  switch (v) {
    case dedup_window::verdict::fresh: return "fresh";
    case dedup_window::verdict::duplicate: return "duplicate";
    case dedup_window::verdict::stale_incarnation: return "stale_incarnation";
    case dedup_window::verdict::too_old: return "too_old";
  }
  return "unknown";
}

}  // namespace archipelago
