#pragma once
// The tensor bytes one bulk connection may have in flight on a real network. A
// separate control connection does not help when both cross one FIFO queue (a
// slow access link, a router's buffer): a heartbeat waits behind every tensor
// byte queued there, and when that queue overflows, a dropped heartbeat waits a
// TCP retransmission timeout on top. So the transport caps each bulk
// connection's kernel send buffer — which bounds its unacknowledged bytes — at
// a window that follows the queue the connection builds, as a delay-based
// (LEDBAT-like) congestion control would: the queueing delay is the kernel's
// smoothed RTT of the connection minus its minimum RTT; above the target the
// window shrinks, below it (while the window is what limits the sender) it grows.
// So tensors keep a link full while queueing at most about `target` in front of
// the control lane. Pure: the transport reads TCP_INFO and sets SO_SNDBUF.

#include <cstddef>
#include <optional>

#include "core/clock.hpp"

namespace archipelago {

class bulk_window {
 public:
  struct config {
    nanos target_delay_ns = 50'000'000;  // queueing the bulk lane may cause
    std::size_t min_bytes = 16 * 1024;
    std::size_t max_bytes = 32 * 1024 * 1024;
    std::size_t initial_bytes = 256 * 1024;
  };
  explicit bulk_window(config cfg);

  /// One sample of the connection (TCP_INFO): its smoothed RTT, its minimum RTT, and
  /// the bytes sent but not acknowledged. Returns the new window when it changed.
  std::optional<std::size_t> on_sample(nanos now, nanos smoothed_rtt_ns, nanos min_rtt_ns, std::size_t unacked_bytes);

  std::size_t bytes() const { return bytes_; }
  /// The last queueing delay seen (smoothed RTT − minimum RTT).
  nanos queue_delay_ns() const { return queue_delay_ns_; }
  /// The longest queueing delay seen.
  nanos queue_delay_max_ns() const { return queue_delay_max_ns_; }

 private:
  config cfg_;
  std::size_t bytes_;
  nanos queue_delay_ns_ = 0, queue_delay_max_ns_ = 0;
  nanos last_change_ns_ = -1;
};

}  // namespace archipelago
