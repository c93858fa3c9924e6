#include "transport/link_shaper.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "core/invariant.hpp"

namespace archipelago {
namespace {

status invalid(const char* field, const std::string& rule, const std::string& got) {
  return status(make_error(errc::invalid_input,
                           std::string("link_profile.") + field + " must be " + rule + ", got " + got));
}

std::string number_text(double value) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

status check_probability(const char* field, double p) {
  if (!(p >= 0.0 && p <= 1.0)) return invalid(field, "in [0, 1]", number_text(p));
  return {};
}

status check_delay(const char* field, nanos delay_ns) {
  if (delay_ns < 0 || delay_ns > max_link_delay_ns) {
    return invalid(field, "in [0, " + std::to_string(max_link_delay_ns) + "] ns", std::to_string(delay_ns));
  }
  return {};
}

// Uniform in [0, n) from one prng word (multiply-shift). Unlike prng::below it
// never draws again, so every frame consumes a fixed number of words; the bias,
// at most n / 2^64, is irrelevant for fault injection.
std::uint64_t scale(std::uint64_t word, std::uint64_t n) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(word) * n) >> 64);
}

// Far enough in the future to mean "never", small enough that adding delays of
// up to a few max_link_delay_ns cannot overflow.
constexpr nanos never_ns = nanos{1} << 62;

nanos saturating_add(nanos t, nanos delta) { return t > never_ns - delta ? never_ns : t + delta; }

}  // namespace

status validate(const link_profile& p) {
  if (!std::isfinite(p.bandwidth_bytes_per_s) || p.bandwidth_bytes_per_s < 0) {
    return invalid("bandwidth_bytes_per_s", "finite and >= 0 (0 = unlimited)", number_text(p.bandwidth_bytes_per_s));
  }
  if (p.burst_bytes < 0) return invalid("burst_bytes", ">= 0", std::to_string(p.burst_bytes));
  if (auto s = check_delay("latency_ns", p.latency_ns); !s) return s;
  if (auto s = check_delay("jitter_ns", p.jitter_ns); !s) return s;
  if (auto s = check_delay("reorder_delay_ns", p.reorder_delay_ns); !s) return s;
  if (auto s = check_probability("loss", p.loss); !s) return s;
  if (auto s = check_probability("duplicate", p.duplicate); !s) return s;
  if (auto s = check_probability("reorder", p.reorder); !s) return s;
  if (auto s = check_probability("corrupt", p.corrupt); !s) return s;
  return {};
}

std::string to_string(const link_profile& p) {
  std::string out = "bandwidth_bytes_per_s=";
  out += p.bandwidth_bytes_per_s == 0 ? std::string("unlimited") : number_text(p.bandwidth_bytes_per_s);
  out += " burst_bytes=" + std::to_string(p.burst_bytes);
  out += " latency_ns=" + std::to_string(p.latency_ns);
  out += " jitter_ns=" + std::to_string(p.jitter_ns);
  out += " loss=" + number_text(p.loss);
  out += " duplicate=" + number_text(p.duplicate);
  out += " reorder=" + number_text(p.reorder);
  out += " reorder_delay_ns=" + std::to_string(p.reorder_delay_ns);
  out += " corrupt=" + number_text(p.corrupt);
  return out;
}

link_shaper::link_shaper(link_profile profile, std::uint64_t seed) : profile_(profile), rng_(seed) {
  ARCHIPELAGO_INVARIANT(validate(profile_), "link shaper: a valid link_profile (use link_shaper::make)");
}

expected<link_shaper> link_shaper::make(link_profile profile, std::uint64_t seed) {
  if (auto s = validate(profile); !s) return s.err();
  return link_shaper(profile, seed);
}

status link_shaper::set_profile(const link_profile& profile) {
  if (auto s = validate(profile); !s) return s;
  // The queue, the bucket level and the in-order floor carry over: frames in
  // flight keep their times and later frames still queue behind them.
  profile_ = profile;
  return {};
}

void link_shaper::serialise(nanos now_ns, std::size_t bytes) {
  const link_profile& p = profile_;
  stats_.bytes += bytes;
  // Serialisation through a token bucket. The frame starts when the link has
  // sent everything before it (FIFO). While the link idles the bucket fills at
  // the line's bandwidth up to burst_bytes; bytes covered by tokens leave at
  // once (line rate), the rest at bandwidth_bytes_per_s. Tokens do not
  // accumulate while the link is busy, so a saturated link runs at exactly the
  // bandwidth and a burst is only available after idle time.
  if (!started_) {
    started_ = true;
    free_at_ns_ = now_ns;
    free_frac_ns_ = 0;
    credit_bytes_ = static_cast<double>(p.burst_bytes);  // an idle link has a full bucket
  }
  nanos start_ns = free_at_ns_;
  double start_frac_ns = free_frac_ns_;
  double idle_ns = 0;
  if (now_ns > free_at_ns_) {
    idle_ns = static_cast<double>(now_ns - free_at_ns_) - free_frac_ns_;
    start_ns = now_ns;
    start_frac_ns = 0;
  }
  if (p.bandwidth_bytes_per_s > 0) {
    const double rate_bytes_per_ns = p.bandwidth_bytes_per_s * 1e-9;
    const auto depth_bytes = static_cast<double>(p.burst_bytes);
    credit_bytes_ = std::min(depth_bytes, credit_bytes_ + idle_ns * rate_bytes_per_ns);
    const auto frame_bytes = static_cast<double>(bytes);
    const double from_credit = std::min(credit_bytes_, frame_bytes);
    credit_bytes_ -= from_credit;
    const double send_ns = std::min((frame_bytes - from_credit) / rate_bytes_per_ns, static_cast<double>(never_ns));
    const double total_ns = start_frac_ns + send_ns;
    const double whole_ns = std::floor(total_ns);
    free_at_ns_ = saturating_add(start_ns, static_cast<nanos>(whole_ns));
    free_frac_ns_ = free_at_ns_ == never_ns ? 0.0 : total_ns - whole_ns;
  } else {
    // Unlimited: the frame leaves as soon as the queue ahead of it has.
    free_at_ns_ = start_ns;
    free_frac_ns_ = start_frac_ns;
  }
}

void link_shaper::submit_piece(nanos now_ns, std::size_t bytes) { serialise(now_ns, bytes); }

deliveries link_shaper::submit(nanos now_ns, std::size_t bytes, std::size_t frame_bytes) {
  ARCHIPELAGO_INVARIANT(frame_bytes >= bytes, "link shaper: a frame holds its payload");
  const link_profile& p = profile_;

  // Every frame draws exactly these eight words whatever the profile, so a
  // profile change never shifts the random choices of other frames: with one
  // seed, a higher loss loses a superset of the frames a lower loss loses.
  const double u_loss = rng_.uniform();
  const double u_duplicate = rng_.uniform();
  const double u_reorder = rng_.uniform();
  const std::uint64_t w_jitter = rng_.next();
  const double u_corrupt0 = rng_.uniform();
  const std::uint64_t w_flip0 = rng_.next();
  const double u_corrupt1 = rng_.uniform();
  const std::uint64_t w_flip1 = rng_.next();

  ++stats_.frames;
  serialise(now_ns, bytes);
  const nanos departure_ns = busy_until_ns();

  deliveries out;
  if (u_loss < p.loss) {
    ++stats_.lost;
    return out;
  }

  const nanos jitter_ns = p.jitter_ns > 0 ? static_cast<nanos>(scale(w_jitter, static_cast<std::uint64_t>(p.jitter_ns) + 1)) : 0;
  nanos arrival_ns = saturating_add(departure_ns, p.latency_ns + jitter_ns);
  if (u_reorder < p.reorder) {
    // Held back and left out of the in-order floor: later frames may overtake
    // it, and with large jitter it may still overtake earlier ones.
    ++stats_.reordered;
    const nanos delay_ns = p.reorder_delay_ns > 0 ? p.reorder_delay_ns : 2 * p.latency_ns + 1'000'000;
    arrival_ns = saturating_add(arrival_ns, delay_ns);
  } else {
    // Jitter must not reorder: never arrive before an earlier in-order frame.
    arrival_ns = std::max(arrival_ns, in_order_floor_ns_);
    in_order_floor_ns_ = arrival_ns;
  }

  // A frame of n bytes has n * 8 bits to choose from; an empty frame cannot be corrupted.
  const std::uint64_t frame_bits = frame_bytes > std::numeric_limits<std::uint64_t>::max() / 8
                                       ? std::numeric_limits<std::uint64_t>::max()
                                       : static_cast<std::uint64_t>(frame_bytes) * 8;
  auto copy = [&](nanos at_ns, double u_corrupt, std::uint64_t w_flip) {
    delivery d{at_ns, false, 0};
    if (frame_bits > 0 && u_corrupt < p.corrupt) {
      d.corrupt = true;
      d.flip_bit = scale(w_flip, frame_bits);
      ++stats_.corrupted;
    }
    out.push_back(d);
  };
  copy(arrival_ns, u_corrupt0, w_flip0);
  if (u_duplicate < p.duplicate) {
    // The copy is made after the bottleneck (same departure, no extra
    // bandwidth) and does not raise the in-order floor, so the frame after it
    // may arrive between the two copies, as on a real network.
    ++stats_.duplicated;
    copy(saturating_add(arrival_ns, duplicate_gap_ns), u_corrupt1, w_flip1);
  }
  return out;
}

}  // namespace archipelago
