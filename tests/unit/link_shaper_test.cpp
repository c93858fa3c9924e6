#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/prng.hpp"
#include "transport/link_shaper.hpp"

using namespace archipelago;

namespace {

constexpr nanos ms = 1'000'000;
constexpr nanos us = 1'000;
constexpr nanos s = 1'000'000'000;

// |count - n p| within `sigmas` binomial standard deviations.
bool within_binomial(std::uint64_t count, std::uint64_t n, double p, double sigmas = 5.0) {
  const double mean = static_cast<double>(n) * p;
  const double sd = std::sqrt(static_cast<double>(n) * p * (1 - p));
  return std::abs(static_cast<double>(count) - mean) <= sigmas * sd;
}

// Serialisation time of `bytes` at `bytes_per_s`, in (fractional) nanoseconds.
double send_ns(double bytes, double bytes_per_s) { return bytes / bytes_per_s * 1e9; }

}  // namespace

TEST_CASE("link_shaper: back-to-back frames arrive at the configured bandwidth") {
  struct link_case {
    const char* name;
    double bandwidth_bytes_per_s;
    std::int64_t burst_bytes;
    std::size_t frame_bytes;
    int frames;
    nanos latency_ns;
  };
  const link_case cases[] = {
      {"100 Mbit/s, 64 KiB", 100e6 / 8, 0, 64 << 10, 4000, 20 * ms},
      {"2 Gbit/s, 4 MiB", 2e9 / 8, 0, 4 << 20, 2000, 5 * ms},
      {"100 Mbit/s, 64 KiB, 1 MiB burst", 100e6 / 8, 1 << 20, 64 << 10, 4000, 20 * ms},
      {"7.777777 MB/s, 1500 B (fractional ns per frame)", 7'777'777, 0, 1500, 20000, 1 * ms},
  };
  for (const auto& c : cases) {
    const std::uint64_t seed = 11;
    CAPTURE(c.name);
    CAPTURE(seed);
    link_shaper shaper({.bandwidth_bytes_per_s = c.bandwidth_bytes_per_s,
                        .burst_bytes = c.burst_bytes,
                        .latency_ns = c.latency_ns},
                       seed);
    const nanos first_submit_ns = 1'000 * s;
    nanos last_arrival_ns = 0;
    for (int i = 0; i < c.frames; ++i) {
      const auto out = shaper.submit(first_submit_ns + i, c.frame_bytes);  // faster than the link
      REQUIRE(out.size() == 1);
      last_arrival_ns = out[0].at_ns;
    }
    const double total_bytes = static_cast<double>(c.frame_bytes) * c.frames;
    // The burst leaves at line rate; everything after it is paced.
    const double expected_ns =
        send_ns(total_bytes - static_cast<double>(c.burst_bytes), c.bandwidth_bytes_per_s) +
        static_cast<double>(c.latency_ns);
    const auto elapsed_ns = static_cast<double>(last_arrival_ns - first_submit_ns);
    CAPTURE(expected_ns);
    CAPTURE(elapsed_ns);
    CHECK(std::abs(elapsed_ns - expected_ns) <= 0.01 * expected_ns);
    // No rounding drift: exact to the nanosecond even over thousands of frames.
    CHECK(std::abs(elapsed_ns - expected_ns) <= 1.0);
    CHECK(shaper.stats().frames == static_cast<std::uint64_t>(c.frames));
    CHECK(shaper.stats().bytes == static_cast<std::uint64_t>(total_bytes));
  }
}

TEST_CASE("link_shaper: token bucket bursts after idle, then paces") {
  const std::uint64_t seed = 3;
  CAPTURE(seed);
  // 1 byte per microsecond, so 1000-byte frames take 1 ms each.
  const double bandwidth_bytes_per_s = 1e6;
  const nanos t0 = 50 * s;

  SUBCASE("burst_bytes = 0: every frame pays its serialisation time") {
    link_shaper shaper({.bandwidth_bytes_per_s = bandwidth_bytes_per_s}, seed);
    for (int i = 0; i < 5; ++i) CHECK(shaper.submit(t0, 1000)[0].at_ns == t0 + (i + 1) * ms);
    CHECK(shaper.busy_until_ns() == t0 + 5 * ms);
  }

  SUBCASE("a full bucket sends burst_bytes at once; then the bucket refills at the bandwidth") {
    link_shaper shaper({.bandwidth_bytes_per_s = bandwidth_bytes_per_s, .burst_bytes = 10'000}, seed);
    for (int i = 0; i < 10; ++i) CHECK(shaper.submit(t0, 1000)[0].at_ns == t0);
    CHECK(shaper.submit(t0, 1000)[0].at_ns == t0 + 1 * ms);
    CHECK(shaper.submit(t0, 1000)[0].at_ns == t0 + 2 * ms);
    // 5 ms idle after the link drained refills 5000 bytes of credit.
    const nanos t1 = t0 + 2 * ms + 5 * ms;
    for (int i = 0; i < 5; ++i) CHECK(shaper.submit(t1, 1000)[0].at_ns == t1);
    CHECK(shaper.submit(t1, 1000)[0].at_ns == t1 + 1 * ms);
    // Credit partly covers a frame: 500 bytes of credit, 500 bytes paced.
    const nanos t2 = t1 + 1 * ms + 500 * us;
    CHECK(shaper.submit(t2, 1000)[0].at_ns == t2 + 500 * us);
    // A long idle period never fills the bucket beyond burst_bytes.
    const nanos t3 = t2 + 3600 * s;
    for (int i = 0; i < 10; ++i) CHECK(shaper.submit(t3, 1000)[0].at_ns == t3);
    CHECK(shaper.submit(t3, 1000)[0].at_ns == t3 + 1 * ms);
  }

  SUBCASE("frames slower than the link never queue") {
    link_shaper shaper({.bandwidth_bytes_per_s = bandwidth_bytes_per_s, .latency_ns = 7 * ms}, seed);
    for (int i = 0; i < 100; ++i) {
      const nanos now = t0 + i * 3 * ms;
      CHECK(shaper.submit(now, 2000)[0].at_ns == now + 2 * ms + 7 * ms);
    }
  }
}

TEST_CASE("link_shaper: latency is exact without jitter, unlimited and zero latency delivers at now") {
  const std::uint64_t seed = 5;
  CAPTURE(seed);
  prng times(99);
  link_shaper delayed({.latency_ns = 37 * ms}, seed);
  link_shaper instant({}, seed);
  nanos now = -5 * s;  // the timeline may start anywhere
  for (int i = 0; i < 1000; ++i) {
    now += static_cast<nanos>(times.below(2 * ms));  // often the same instant
    const auto bytes = static_cast<std::size_t>(times.below(1 << 20));
    const auto a = delayed.submit(now, bytes);
    const auto b = instant.submit(now, bytes);
    REQUIRE(a.size() == 1);
    REQUIRE(b.size() == 1);
    CHECK(a[0].at_ns == now + 37 * ms);
    CHECK(b[0].at_ns == now);
    CHECK_FALSE(a[0].corrupt);
  }
}

TEST_CASE("link_shaper: jitter is bounded and never reorders") {
  const std::uint64_t seed = 17;
  CAPTURE(seed);
  const nanos latency_ns = 10 * ms;
  const nanos jitter_ns = 5 * ms;

  SUBCASE("dense frames: jitter much larger than their spacing") {
    link_shaper shaper({.latency_ns = latency_ns, .jitter_ns = jitter_ns}, seed);
    nanos previous_ns = std::numeric_limits<nanos>::min();
    int raised = 0;  // arrivals held back to keep order
    for (int i = 0; i < 20000; ++i) {
      const nanos now = i * 100 * us;
      const auto out = shaper.submit(now, 1000);
      REQUIRE(out.size() == 1);
      CHECK(out[0].at_ns >= now + latency_ns);
      CHECK(out[0].at_ns <= now + latency_ns + jitter_ns);
      CHECK(out[0].at_ns >= previous_ns);
      raised += out[0].at_ns == previous_ns;
      previous_ns = out[0].at_ns;
    }
    CHECK(raised > 0);  // the clamp was needed
  }

  SUBCASE("sparse frames: jitter is uniform over [0, jitter_ns]") {
    link_shaper shaper({.latency_ns = latency_ns, .jitter_ns = jitter_ns}, seed);
    const int n = 20000;
    double sum = 0;
    nanos lo = jitter_ns, hi = 0;
    for (int i = 0; i < n; ++i) {
      const nanos now = i * s;
      const nanos jitter = shaper.submit(now, 1000)[0].at_ns - now - latency_ns;
      REQUIRE(jitter >= 0);
      REQUIRE(jitter <= jitter_ns);
      sum += static_cast<double>(jitter);
      lo = std::min(lo, jitter);
      hi = std::max(hi, jitter);
    }
    const double mean = sum / n;
    const double sd_of_mean = static_cast<double>(jitter_ns) / std::sqrt(12.0 * n);
    CAPTURE(mean);
    CHECK(std::abs(mean - jitter_ns / 2.0) < 5 * sd_of_mean);
    CHECK(lo < jitter_ns / 100);
    CHECK(hi > jitter_ns - jitter_ns / 100);
  }
}

TEST_CASE("link_shaper: loss, duplicate and corrupt rates over 100k frames") {
  const std::uint64_t seed = 2024;
  CAPTURE(seed);
  const link_profile profile{.latency_ns = 1 * ms, .loss = 0.05, .duplicate = 0.02, .corrupt = 0.01};
  link_shaper shaper(profile, seed);
  const std::uint64_t n = 100'000;
  const std::size_t frame_bytes = 1200;
  std::uint64_t delivered = 0, lost = 0, duplicated = 0, copies = 0, corrupted = 0;
  std::uint64_t flip_lo = ~0ULL, flip_hi = 0;
  int one_copy_corrupt = 0;  // copies are corrupted independently
  for (std::uint64_t i = 0; i < n; ++i) {
    const nanos now = static_cast<nanos>(i) * 10 * us;
    const auto out = shaper.submit(now, frame_bytes);
    REQUIRE(out.size() <= 2);
    lost += out.empty();
    delivered += !out.empty();
    duplicated += out.size() == 2;
    if (out.size() == 2) {
      CHECK(out[1].at_ns == out[0].at_ns + link_shaper::duplicate_gap_ns);
      one_copy_corrupt += out[0].corrupt != out[1].corrupt;
    }
    for (const auto& d : out) {
      ++copies;
      if (!d.corrupt) continue;
      ++corrupted;
      REQUIRE(d.flip_bit < frame_bytes * 8);
      flip_lo = std::min(flip_lo, d.flip_bit);
      flip_hi = std::max(flip_hi, d.flip_bit);
    }
  }
  CAPTURE(lost);
  CAPTURE(duplicated);
  CAPTURE(corrupted);
  CHECK(within_binomial(lost, n, profile.loss));
  CHECK(within_binomial(duplicated, delivered, profile.duplicate));
  CHECK(within_binomial(corrupted, copies, profile.corrupt));
  CHECK(one_copy_corrupt > 0);
  CHECK(flip_lo < frame_bytes * 8 / 50);  // the flipped bit is spread over the frame
  CHECK(flip_hi > frame_bytes * 8 * 49 / 50);
  const auto& stats = shaper.stats();
  CHECK(stats.frames == n);
  CHECK(stats.bytes == n * frame_bytes);
  CHECK(stats.lost == lost);
  CHECK(stats.duplicated == duplicated);
  CHECK(stats.corrupted == corrupted);
  CHECK(stats.reordered == 0);
}

TEST_CASE("link_shaper: with one seed, more loss loses a superset of frames") {
  const std::uint64_t seed = 8;
  CAPTURE(seed);
  link_shaper low({.loss = 0.1}, seed);
  link_shaper high({.loss = 0.2}, seed);
  int lost_low = 0, lost_high = 0;
  for (int i = 0; i < 10000; ++i) {
    const bool a = low.submit(i, 100).empty();
    const bool b = high.submit(i, 100).empty();
    CHECK((!a || b));
    lost_low += a;
    lost_high += b;
  }
  CHECK(lost_low < lost_high);
}

TEST_CASE("link_shaper: flip_bit is always inside the frame") {
  const std::uint64_t seed = 31;
  CAPTURE(seed);
  link_shaper shaper({.duplicate = 0.5, .corrupt = 1.0}, seed);
  prng sizes(4);
  bool saw_last_bit = false;
  for (int i = 0; i < 20000; ++i) {
    const std::size_t bytes = i % 7 == 0 ? 1 : 1 + sizes.below(9000);
    const auto out = shaper.submit(i, bytes);
    for (const auto& d : out) {
      REQUIRE(d.corrupt);
      REQUIRE(d.flip_bit < bytes * 8);
      saw_last_bit |= bytes == 1 && d.flip_bit == 7;
    }
  }
  CHECK(saw_last_bit);
  // An empty frame has no bit to flip.
  const auto empty = shaper.submit(20000, 0);
  REQUIRE(empty.size() >= 1);
  CHECK_FALSE(empty[0].corrupt);
}

TEST_CASE("link_shaper: reorder reorders some frames only when enabled") {
  const std::uint64_t seed = 77;
  CAPTURE(seed);
  const nanos latency_ns = 10 * ms;
  const double bandwidth_bytes_per_s = 125e6;  // 1 Gbit/s: 1000 bytes in 8 us
  auto run = [&](double reorder, nanos reorder_delay_ns, link_shaper::counters* stats) {
    link_shaper shaper({.bandwidth_bytes_per_s = bandwidth_bytes_per_s,
                        .latency_ns = latency_ns,
                        .reorder = reorder,
                        .reorder_delay_ns = reorder_delay_ns},
                       seed);
    std::vector<nanos> delays;  // arrival minus the unshaped arrival, per frame
    std::vector<nanos> arrivals;
    for (int i = 0; i < 10000; ++i) {
      const nanos now = i * 100 * us;
      const auto out = shaper.submit(now, 1000);
      REQUIRE(out.size() == 1);
      arrivals.push_back(out[0].at_ns);
      delays.push_back(out[0].at_ns - (now + 8 * us + latency_ns));
    }
    *stats = shaper.stats();
    int inversions = 0;  // frames that arrive before an earlier frame
    nanos latest_ns = std::numeric_limits<nanos>::min();
    for (const nanos at : arrivals) {
      inversions += at < latest_ns;
      latest_ns = std::max(latest_ns, at);
    }
    return std::pair{delays, inversions};
  };

  link_shaper::counters stats{};
  const auto [plain_delays, plain_inversions] = run(0.0, 0, &stats);
  CHECK(plain_inversions == 0);
  CHECK(stats.reordered == 0);
  CHECK(std::all_of(plain_delays.begin(), plain_delays.end(), [](nanos d) { return d == 0; }));

  // reorder_delay_ns = 0 means 2 * latency + 1 ms.
  const auto [delays, inversions] = run(0.05, 0, &stats);
  CAPTURE(inversions);
  CHECK(inversions > 0);
  CHECK(within_binomial(stats.reordered, 10000, 0.05));
  const nanos default_delay_ns = 2 * latency_ns + 1 * ms;
  CHECK(std::all_of(delays.begin(), delays.end(), [&](nanos d) { return d == 0 || d == default_delay_ns; }));
  CHECK(static_cast<std::uint64_t>(std::count(delays.begin(), delays.end(), default_delay_ns)) == stats.reordered);

  const auto [explicit_delays, explicit_inversions] = run(0.05, 3 * ms, &stats);
  CHECK(explicit_inversions > 0);
  CHECK(std::all_of(explicit_delays.begin(), explicit_delays.end(), [](nanos d) { return d == 0 || d == 3 * ms; }));
}

TEST_CASE("link_shaper: deterministic from the seed") {
  const link_profile profile{.bandwidth_bytes_per_s = 12.5e6,
                             .burst_bytes = 100'000,
                             .latency_ns = 20 * ms,
                             .jitter_ns = 4 * ms,
                             .loss = 0.03,
                             .duplicate = 0.02,
                             .reorder = 0.02,
                             .corrupt = 0.01};
  auto run = [&](std::uint64_t seed) {
    link_shaper shaper(profile, seed);
    prng traffic(1234);  // the same submit calls for every seed
    std::vector<deliveries> all;
    nanos now = 0;
    for (int i = 0; i < 20000; ++i) {
      now += static_cast<nanos>(traffic.below(200 * us));
      all.push_back(shaper.submit(now, 1 + traffic.below(64 << 10)));
    }
    return std::pair{all, shaper.stats()};
  };
  const std::uint64_t seed = 42, other_seed = 43;
  CAPTURE(seed);
  CAPTURE(other_seed);
  const auto [a, stats_a] = run(seed);
  const auto [b, stats_b] = run(seed);
  const auto [c, stats_c] = run(other_seed);
  CHECK(a == b);
  CHECK(stats_a.lost == stats_b.lost);
  CHECK(stats_a.duplicated == stats_b.duplicated);
  CHECK(stats_a.reordered == stats_b.reordered);
  CHECK(stats_a.corrupted == stats_b.corrupted);
  CHECK(a != c);
  CHECK(stats_a.lost != stats_c.lost);
}

TEST_CASE("link_shaper: validate rejects bad profiles and names the field") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct bad_case {
    const char* field;
    link_profile profile;
  };
  const bad_case cases[] = {
      {"bandwidth_bytes_per_s", {.bandwidth_bytes_per_s = -1}},
      {"bandwidth_bytes_per_s", {.bandwidth_bytes_per_s = nan}},
      {"bandwidth_bytes_per_s", {.bandwidth_bytes_per_s = inf}},
      {"burst_bytes", {.burst_bytes = -1}},
      {"latency_ns", {.latency_ns = -1}},
      {"latency_ns", {.latency_ns = max_link_delay_ns + 1}},
      {"jitter_ns", {.jitter_ns = -5}},
      {"reorder_delay_ns", {.reorder_delay_ns = -1}},
      {"loss", {.loss = 1.5}},
      {"loss", {.loss = -0.1}},
      {"loss", {.loss = nan}},
      {"duplicate", {.duplicate = 2}},
      {"reorder", {.reorder = -1e-9}},
      {"corrupt", {.corrupt = inf}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.field);
    const status st = validate(c.profile);
    REQUIRE_FALSE(st);
    CAPTURE(st.err().to_string());
    CHECK(st.err().code == errc::invalid_input);
    CHECK(st.err().message.find(std::string("link_profile.") + c.field) != std::string::npos);
    const auto made = link_shaper::make(c.profile, 1);
    REQUIRE_FALSE(made);
    CHECK(made.err().code == errc::invalid_input);
  }

  const link_profile good{.bandwidth_bytes_per_s = 1e6, .latency_ns = max_link_delay_ns, .loss = 1.0, .corrupt = 0.0};
  CHECK(validate(good));
  CHECK(validate(link_profile{}));
  link_shaper shaper(good, 1);
  CHECK_FALSE(shaper.set_profile({.loss = 7}));
  CHECK(shaper.profile() == good);  // a rejected profile leaves the old one in place
}

TEST_CASE("link_shaper: to_string is one line naming every field") {
  const link_profile p{.bandwidth_bytes_per_s = 12.5e6, .latency_ns = 20 * ms, .loss = 0.01};
  const std::string text = to_string(p);
  CAPTURE(text);
  CHECK(text.find('\n') == std::string::npos);
  for (const char* field : {"bandwidth_bytes_per_s=12500000", "burst_bytes=0", "latency_ns=20000000", "jitter_ns=0",
                            "loss=0.01", "duplicate=0", "reorder=0", "reorder_delay_ns=0", "corrupt=0"}) {
    CHECK(text.find(field) != std::string::npos);
  }
  CHECK(to_string(link_profile{}).find("bandwidth_bytes_per_s=unlimited") != std::string::npos);
}

TEST_CASE("link_shaper: set_profile mid-stream changes later frames only") {
  const std::uint64_t seed = 9;
  CAPTURE(seed);

  SUBCASE("a latency drop does not let later frames overtake frames in flight") {
    link_shaper shaper({.latency_ns = 100 * ms}, seed);
    const nanos a = shaper.submit(0, 1000)[0].at_ns;
    CHECK(a == 100 * ms);
    REQUIRE(shaper.set_profile({.latency_ns = 10 * ms}));
    CHECK(shaper.profile().latency_ns == 10 * ms);
    CHECK(shaper.submit(1 * ms, 1000)[0].at_ns == 100 * ms);  // would be 11 ms: held behind a
    CHECK(shaper.submit(200 * ms, 1000)[0].at_ns == 210 * ms);
  }

  SUBCASE("a bandwidth change leaves the queued backlog alone") {
    const link_profile slow{.bandwidth_bytes_per_s = 1e6};  // 1000 bytes per ms
    link_shaper changed(slow, seed), unchanged(slow, seed);
    const nanos t0 = 10 * s;
    for (int i = 0; i < 10; ++i) CHECK(changed.submit(t0, 1000) == unchanged.submit(t0, 1000));
    REQUIRE(changed.set_profile({.bandwidth_bytes_per_s = 2e6}));
    // Queued behind 10 ms of backlog sent at the old rate, then sent at the new one.
    CHECK(changed.submit(t0, 1000)[0].at_ns == t0 + 10 * ms + 500 * us);
    CHECK(unchanged.submit(t0, 1000)[0].at_ns == t0 + 11 * ms);
  }

  SUBCASE("an outage window affects exactly the frames submitted inside it") {
    const link_profile base{.latency_ns = 5 * ms, .jitter_ns = 1 * ms, .duplicate = 0.1, .reorder = 0.1,
                            .corrupt = 0.1};
    link_shaper chaos(base, seed), calm(base, seed);
    // Every other knob differs too: the random choices of later frames must not
    // depend on what the profile was while earlier frames were submitted.
    const link_profile lossy{.loss = 1.0};
    for (int i = 0; i < 3000; ++i) {
      if (i == 1000) REQUIRE(chaos.set_profile(lossy));
      if (i == 2000) REQUIRE(chaos.set_profile(base));
      const nanos now = i * 100 * ms;  // spaced beyond jitter and reorder delay: frames do not interact
      const auto got = chaos.submit(now, 1500);
      const auto expected = calm.submit(now, 1500);
      CAPTURE(i);
      if (i >= 1000 && i < 2000) {
        CHECK(got.empty());
      } else {
        CHECK(got == expected);
      }
    }
    CHECK(chaos.stats().lost == 1000);
  }
}
