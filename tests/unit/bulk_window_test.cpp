#include <doctest/doctest.h>

#include "transport/bulk_window.hpp"

using namespace archipelago;

namespace {
constexpr nanos ms = 1'000'000;
}

TEST_CASE("bulk window: a queue above the target shrinks it, proportionally, once per round trip") {
  bulk_window w({50 * ms, 16 * 1024, 32 << 20, 1 << 20});
  // 200 ms RTT over a 20 ms path: 180 ms of queue, 3.6× the target.
  auto next = w.on_sample(0, 200 * ms, 20 * ms, 1 << 20);
  REQUIRE(next);
  CHECK(*next == (1u << 20) / 2);  // at most halved per step
  CHECK(w.queue_delay_ns() == 180 * ms);
  CHECK_FALSE(w.on_sample(100 * ms, 200 * ms, 20 * ms, 1 << 20));  // within the RTT of the last change
  next = w.on_sample(200 * ms, 100 * ms, 20 * ms, 1 << 20);  // 80 ms: ×50/80
  REQUIRE(next);
  CHECK(*next == static_cast<std::size_t>((1u << 19) * (50.0 / 80.0)));
  for (nanos t = 400 * ms; t < 10'000 * ms; t += 200 * ms) (void)w.on_sample(t, 1000 * ms, 20 * ms, 1 << 20);
  CHECK(w.bytes() == 16 * 1024);  // never below the floor
}

TEST_CASE("bulk window: below the target it grows only while it limits the sender") {
  bulk_window w({50 * ms, 16 * 1024, 4 << 20, 256 * 1024});
  CHECK_FALSE(w.on_sample(0, 25 * ms, 20 * ms, 10 * 1024));  // little in flight: the window is not the limit
  auto next = w.on_sample(0, 20 * ms, 20 * ms, 256 * 1024);  // no queue, window full: ×1.5
  REQUIRE(next);
  CHECK(*next == 384 * 1024);
  next = w.on_sample(50 * ms, 45 * ms, 20 * ms, 384 * 1024);  // 25 ms of queue: half the growth
  REQUIRE(next);
  CHECK(*next == 480 * 1024);
  for (nanos t = 100 * ms; t < 5'000 * ms; t += 30 * ms) (void)w.on_sample(t, 20 * ms, 20 * ms, 64 << 20);
  CHECK(w.bytes() == (4u << 20));  // never above the ceiling
  CHECK_FALSE(w.on_sample(6'000 * ms, 0, 0, 1 << 20));  // no RTT measured yet: nothing to learn
}
