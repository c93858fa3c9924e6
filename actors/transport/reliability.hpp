#pragma once
// Reliability state cores for the transport: peer liveness (Paranoid Pirate
// heartbeats), reconnect backoff and duplicate suppression. Pure and
// deterministic: no threads, no sockets, no clock reads. The transport's I/O
// thread drives them with its clock; tests drive them with a manual one.

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <unordered_map>
#include <vector>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/prng.hpp"

namespace archipelago {

struct node_address_hash {
  std::size_t operator()(const node_address& a) const {
    const std::uint64_t key = (static_cast<std::uint64_t>(a.kind) << 32) | a.index;
    std::uint64_t state = key;
    return static_cast<std::size_t>(splitmix64(state));
  }
};

// ---- peer liveness --------------------------------------------------------

struct heartbeat_config {
  nanos interval_ns = 1'000'000'000;
  int liveness = 3;  // intervals of silence before a peer is dead
};

/// interval_ns > 0, liveness in [1, 100], interval_ns * liveness fits in nanos.
status validate(const heartbeat_config& cfg);

/// Who we have heard from lately, and when our own heartbeat is due.
/// A peer is dead when now - last_heard > interval_ns * liveness; at exactly
/// interval_ns * liveness of silence it is still alive.
class peer_liveness {
 public:
  /// cfg must pass validate().
  explicit peer_liveness(heartbeat_config cfg = {});

  /// Any message from the peer counts as a heartbeat. An unknown peer becomes
  /// known and alive; a dead one revives and may be reported by expire() again.
  void heard_from(node_address peer, nanos now);

  /// False for peers never heard from (or forgotten).
  bool alive(node_address peer, nanos now) const;

  /// When our next outgoing heartbeat is due: now if we never sent one,
  /// else last sent + interval_ns.
  nanos next_heartbeat_due(nanos now) const;
  bool heartbeat_due(nanos now) const { return now >= next_heartbeat_due(now); }
  /// Call when a heartbeat (or any message that reaches every peer) went out.
  void heartbeat_sent(nanos now);

  /// Peers that are dead at `now` and were not reported since they were last
  /// heard from, in address order. Each death is reported once; the peer stays
  /// tracked (alive() == false) until heard from again or forgotten.
  std::vector<node_address> expire(nanos now);

  /// Stops tracking the peer (it left the topology).
  void forget(node_address peer);

  std::size_t live_count(nanos now) const;
  /// Peers tracked, alive or dead.
  std::size_t tracked() const { return peers_.size(); }
  nanos timeout_ns() const { return timeout_ns_; }
  const heartbeat_config& config() const { return cfg_; }

 private:
  struct peer_state {
    nanos last_heard_ns = 0;
    bool reported_dead = false;
  };
  bool dead_at(const peer_state& p, nanos now) const;

  heartbeat_config cfg_;
  nanos timeout_ns_;
  // Ordered so that expire() reports in a deterministic order.
  std::map<node_address, peer_state> peers_;
  nanos last_heartbeat_sent_ns_ = 0;
  bool heartbeat_ever_sent_ = false;
};

// ---- reconnect backoff ----------------------------------------------------

struct backoff_config {
  nanos initial_ns = 100'000'000;    // 100 ms
  nanos max_ns = 5'000'000'000;      // 5 s
  double multiplier = 2.0;
  double jitter = 0.2;  // each delay is scaled by a uniform factor in [1 - jitter, 1 + jitter)
};

/// initial_ns > 0, max_ns >= initial_ns, max_ns <= 2^61 (so max * (1 + jitter) fits),
/// multiplier finite and >= 1, jitter in [0, 1].
status validate(const backoff_config& cfg);

/// Capped exponential backoff with seeded jitter, so that peers that lost the
/// same server do not reconnect in lockstep, yet one seed reproduces a run.
class reconnect_backoff {
 public:
  /// cfg must pass validate().
  reconnect_backoff(backoff_config cfg, std::uint64_t seed);

  /// Delay before the next attempt: base = min(initial * multiplier^attempts, max),
  /// scaled by the jitter factor. Always in [0, max * (1 + jitter)].
  nanos next_delay();
  /// After a successful connect: the next delay starts from initial again.
  /// The jitter stream continues (it is not re-seeded).
  void reset();
  /// next_delay() calls since construction or the last reset().
  int attempts() const { return attempts_; }

 private:
  backoff_config cfg_;
  prng rng_;
  double base_ns_;
  int attempts_ = 0;
};

// ---- duplicate suppression ------------------------------------------------

/// Idempotent delivery: remembers, per sender, the latest incarnation and which
/// sequence numbers in [highest - window, highest] were already accepted.
/// O(1) per message (at most window/64 word writes when the highest jumps);
/// memory is bounded per sender and by max_senders, evicting the least
/// recently checked sender, so forged senders cannot grow it without bound.
class dedup_window {
 public:
  enum class verdict : std::uint8_t {
    fresh,              // accept
    duplicate,          // already accepted: drop (re-ack if the protocol acks)
    stale_incarnation,  // from before the sender restarted: drop
    too_old,            // more than window below the highest seen: cannot tell, drop
  };

  static constexpr std::uint32_t max_window = 65536;

  /// window in [0, max_window], max_senders >= 1.
  explicit dedup_window(std::uint32_t window = 1024, std::size_t max_senders = 4096);

  /// Classifies the message and, if fresh, records it as accepted.
  ///  - unknown sender, or inc above the stored one: fresh; the sender's window
  ///    restarts with seq as highest (a higher incarnation means a restart);
  ///  - inc below the stored one: stale_incarnation;
  ///  - seq > highest: fresh, highest = seq;
  ///  - highest - seq > window: too_old (seq == highest - window is still judged);
  ///  - otherwise duplicate if already accepted, else fresh.
  /// Any verdict marks the sender as most recently used.
  verdict check(node_address sender, incarnation inc, std::uint64_t seq);

  /// Drops the sender's state; its next message is fresh.
  void forget(node_address sender);

  std::size_t senders() const { return senders_.size(); }
  std::uint32_t window() const { return window_; }
  std::size_t max_senders() const { return max_senders_; }

 private:
  // Ring of accepted bits for seqs below highest: bit (s & ring_mask_) is seq s.
  // The ring holds ring_bits_ >= window_ seqs; highest itself is implicitly
  // accepted and needs no bit (its slot belongs to highest - ring_bits_).
  struct sender_state {
    incarnation inc;
    std::uint64_t highest = 0;
    std::vector<std::uint64_t> bits;
    std::list<node_address>::iterator lru;
  };

  void restart(sender_state& s, incarnation inc, std::uint64_t seq) const;
  void advance(sender_state& s, std::uint64_t seq) const;
  bool test_and_set(sender_state& s, std::uint64_t seq) const;
  void clear_ring(sender_state& s, std::uint64_t first_seq, std::uint64_t count) const;

  std::uint32_t window_;
  std::size_t max_senders_;
  std::uint64_t ring_bits_;  // power of two, >= max(window_, 64)
  std::uint64_t ring_mask_;
  std::unordered_map<node_address, sender_state, node_address_hash> senders_;
  std::list<node_address> lru_;  // front = most recently checked
};

const char* to_string(dedup_window::verdict v);

}  // namespace archipelago
