#include "transport/bulk_window.hpp"

#include <algorithm>

namespace archipelago {

bulk_window::bulk_window(config cfg)
    : cfg_(cfg), bytes_(std::clamp(cfg.initial_bytes, cfg.min_bytes, cfg.max_bytes)) {}

std::optional<std::size_t> bulk_window::on_sample(nanos now, nanos smoothed_rtt_ns, nanos min_rtt_ns,
                                                  std::size_t unacked_bytes) {
  if (smoothed_rtt_ns <= 0 || min_rtt_ns <= 0) return std::nullopt;  // no RTT measured yet
  queue_delay_ns_ = std::max<nanos>(smoothed_rtt_ns - min_rtt_ns, 0);
  queue_delay_max_ns_ = std::max(queue_delay_max_ns_, queue_delay_ns_);
  // One change per round trip: the next sample must show the effect of the last.
  if (last_change_ns_ >= 0 && now - last_change_ns_ < std::max<nanos>(smoothed_rtt_ns, 10'000'000)) return std::nullopt;
  const double target = static_cast<double>(cfg_.target_delay_ns), delay = static_cast<double>(queue_delay_ns_);
  double next = static_cast<double>(bytes_);
  if (delay > target) {
    next *= std::max(0.5, target / delay);  // proportional: twice the target halves the window
  } else if (unacked_bytes * 2 >= bytes_) {
    next *= 1.0 + 0.5 * (target - delay) / target;  // window-limited and below the target: grow
  } else {
    return std::nullopt;  // the sender has less to send than the window: nothing learned
  }
  const auto clamped = std::clamp(static_cast<std::size_t>(next), cfg_.min_bytes, cfg_.max_bytes);
  if (clamped == bytes_) return std::nullopt;
  bytes_ = clamped;
  last_change_ns_ = now;
  return bytes_;
}

}  // namespace archipelago
