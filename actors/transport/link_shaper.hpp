#pragma once
// The link shaper: makes one directed link behave like a slow, lossy WAN in user
// space, because netem is unavailable on our machines. A pure state core: the
// transport's I/O thread passes in the time a frame was handed to the link and
// gets back when (and whether, how often, how damaged) it arrives. No clock, no
// threads, no sockets; the only randomness is a seeded prng, so the same seed
// and the same submit calls give the same deliveries.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/invariant.hpp"
#include "core/prng.hpp"

namespace archipelago {

struct link_profile {
  double bandwidth_bytes_per_s = 0;  // 0 = unlimited
  std::int64_t burst_bytes = 0;      // token-bucket depth; 0 = one frame (no burst credit)
  nanos latency_ns = 0;              // one-way propagation delay
  nanos jitter_ns = 0;               // extra delay, uniform in [0, jitter_ns]; never reorders
  double loss = 0;                   // probability a frame is dropped (after using bandwidth)
  double duplicate = 0;              // probability a delivered frame arrives twice
  double reorder = 0;                // probability a frame is held back by reorder_delay_ns
  nanos reorder_delay_ns = 0;        // 0 = 2 * latency_ns + 1 ms
  double corrupt = 0;                // probability, per delivered copy, of one flipped bit
  bool operator==(const link_profile&) const = default;
};

/// Upper bound on every delay field, so sums of delays never overflow nanos.
inline constexpr nanos max_link_delay_ns = 3'600'000'000'000;  // 1 hour

/// Probabilities in [0, 1], rates and times non-negative and finite, delays at
/// most max_link_delay_ns. The error names the offending field.
status validate(const link_profile& profile);

/// One line, "field=value" for every field, e.g. for logs and chaos reports.
std::string to_string(const link_profile& profile);

struct delivery {
  nanos at_ns = 0;              // when the whole frame has arrived at the receiver
  bool corrupt = false;         // the transport must flip flip_bit before delivering
  std::uint64_t flip_bit = 0;   // bit index into the frame, < frame bytes * 8 when corrupt
  bool operator==(const delivery&) const = default;
};

/// 0 (lost), 1, or 2 (duplicated) deliveries, without heap allocation.
class deliveries {
 public:
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const delivery& operator[](std::size_t i) const { return items_[i]; }
  const delivery* begin() const { return items_; }
  const delivery* end() const { return items_ + size_; }
  void push_back(const delivery& d) {
    ARCHIPELAGO_INVARIANT(size_ < 2, "link shaper: at most two deliveries per submit");
    items_[size_++] = d;
  }
  bool operator==(const deliveries& other) const {
    if (size_ != other.size_) return false;
    for (std::size_t i = 0; i < size_; ++i) {
      if (!(items_[i] == other.items_[i])) return false;
    }
    return true;
  }

 private:
  delivery items_[2];
  std::size_t size_ = 0;
};

class link_shaper {
 public:
  /// A duplicate arrives this long after its original.
  static constexpr nanos duplicate_gap_ns = 1'000;

  struct counters {
    std::uint64_t frames = 0;      // submitted
    std::uint64_t bytes = 0;       // submitted, pieces included (lost frames used bandwidth too)
    std::uint64_t lost = 0;
    std::uint64_t duplicated = 0;  // frames delivered twice
    std::uint64_t reordered = 0;   // delivered frames given the reorder delay
    std::uint64_t corrupted = 0;   // deliveries (copies) marked corrupt
  };

  /// `profile` must be valid (a programmer error otherwise); use make() for
  /// profiles that come from input.
  link_shaper(link_profile profile, std::uint64_t seed);
  static expected<link_shaper> make(link_profile profile, std::uint64_t seed);

  /// Applies to frames submitted from now on; frames already submitted keep
  /// their deliveries, and later frames still queue behind them and never
  /// overtake them (unless chosen for reordering). An invalid profile is
  /// rejected and the old one kept.
  status set_profile(const link_profile& profile);
  const link_profile& profile() const { return profile_; }

  /// A frame of `bytes` is handed to the link at `now_ns`. The link is FIFO: a
  /// frame never starts sending before the previous one has been sent, so a
  /// now_ns earlier than a previous call's only makes the frame queue.
  deliveries submit(nanos now_ns, std::size_t bytes) { return submit(now_ns, bytes, bytes); }

  /// A long frame sent in pieces, so that other frames can go between them (the
  /// transport's bulk lane, bulk_pacer): every piece but the last only uses the
  /// link (bandwidth, FIFO; no fate, no random draw); the last, submit(now,
  /// piece, frame_bytes), decides the whole frame's fate as submit() does (its
  /// corrupt bit indexes the whole frame of frame_bytes >= piece bytes).
  void submit_piece(nanos now_ns, std::size_t bytes);
  deliveries submit(nanos now_ns, std::size_t bytes, std::size_t frame_bytes);

  const counters& stats() const { return stats_; }

  /// When the link finishes serialising everything submitted so far: the
  /// transport can use busy_until_ns() - now as its queueing backlog.
  nanos busy_until_ns() const { return free_at_ns_ + (free_frac_ns_ > 0 ? 1 : 0); }

 private:
  /// Queues `bytes` behind everything submitted so far and through the bucket.
  void serialise(nanos now_ns, std::size_t bytes);

  link_profile profile_;
  prng rng_;
  counters stats_;
  // The time the link finishes sending the last frame: integer nanoseconds plus
  // a fraction in [0, 1), so millions of sub-nanosecond rounding errors do not
  // add up to a wrong bandwidth.
  bool started_ = false;            // the first frame finds an idle link with a full bucket
  nanos free_at_ns_ = 0;
  double free_frac_ns_ = 0;
  double credit_bytes_ = 0;         // token bucket level at free_at
  nanos in_order_floor_ns_ = std::numeric_limits<nanos>::min();  // latest in-order arrival
};

}  // namespace archipelago
