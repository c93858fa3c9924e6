#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "transport/bulk_pacer.hpp"
#include "transport/link_shaper.hpp"

using namespace archipelago;

namespace {

constexpr nanos ms = 1'000'000;
constexpr nanos s = 1'000'000'000;
constexpr double mbit3 = 3e6 / 8;  // 3 Mbit/s in bytes per second
constexpr std::size_t fragment = 4 << 20;
constexpr std::size_t piece = 64 << 10;

/// Drives the pacer as the transport's I/O thread does: pump at every time it names.
std::vector<std::pair<std::uint64_t, nanos>> run_until(bulk_pacer& pacer, link_shaper& link, nanos from, nanos until) {
  std::vector<std::pair<std::uint64_t, nanos>> arrived;
  for (nanos now = from; now <= until;) {
    for (const auto& done : pacer.pump(now, link))
      for (const auto& d : done.arrivals) arrived.emplace_back(done.id, d.at_ns);
    const nanos next = pacer.next_pump_ns(now, link);
    if (next < 0) break;
    now = std::max(next, now + 1);
  }
  return arrived;
}

}  // namespace

TEST_CASE("bulk_pacer: a control message waits behind one piece, not behind a whole fragment") {
  link_shaper link({.bandwidth_bytes_per_s = mbit3, .latency_ns = 20 * ms}, 7);
  bulk_pacer pacer(piece, 16);
  REQUIRE(pacer.queue(1, fragment));
  REQUIRE(pacer.queue(2, fragment));
  CHECK(pacer.pump(0, link).empty());  // the first pieces went in; no message is whole yet
  CHECK(pacer.waiting() == 2);
  const nanos piece_ns = static_cast<nanos>(piece / mbit3 * 1e9);  // 0.175 s
  // The link's backlog stays within two pieces while the fragments are paced in.
  const nanos hb_at = 5 * s;
  for (nanos now = 0; now < hb_at;) {
    (void)pacer.pump(now, link);
    CHECK(link.busy_until_ns() - now <= 2 * piece_ns + 1);
    const nanos next = pacer.next_pump_ns(now, link);
    REQUIRE(next >= 0);
    now = std::max(next, now + 1);
  }
  // A heartbeat handed to the link 5 s in arrives within two pieces and the latency ...
  (void)pacer.pump(hb_at, link);
  const deliveries hb = link.submit(hb_at, 64);
  REQUIRE(hb.size() == 1);
  CHECK(hb[0].at_ns - hb_at <= 2 * piece_ns + 20 * ms + 1 * ms);
  // ... while without pacing it would have queued behind both fragments (22 s).
  link_shaper fifo({.bandwidth_bytes_per_s = mbit3, .latency_ns = 20 * ms}, 7);
  (void)fifo.submit(0, fragment);
  (void)fifo.submit(0, fragment);
  CHECK(fifo.submit(hb_at, 64)[0].at_ns - hb_at > 15 * s);
}

TEST_CASE("bulk_pacer: fragments keep the link's bandwidth and their order, each arrives once") {
  link_shaper link({.bandwidth_bytes_per_s = mbit3, .latency_ns = 20 * ms}, 11);
  bulk_pacer pacer(piece, 16);
  for (std::uint64_t id = 1; id <= 3; ++id) REQUIRE(pacer.queue(id, fragment));
  const auto arrived = run_until(pacer, link, 0, 60 * s);
  REQUIRE(arrived.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(arrived[i].first == i + 1);
    // The i-th fragment's last byte leaves after (i + 1) fragments' serialisation.
    const double ideal = static_cast<double>((i + 1) * fragment) / mbit3 * 1e9 + 20 * ms;
    CHECK(static_cast<double>(arrived[i].second) == doctest::Approx(ideal).epsilon(0.01));
  }
  CHECK(pacer.waiting() == 0);
  CHECK(pacer.next_pump_ns(60 * s, link) == -1);
}

TEST_CASE("bulk_pacer: an unlimited link takes whole messages at once, the queue is bounded") {
  link_shaper link({}, 3);
  bulk_pacer pacer(piece, 2);
  CHECK(pacer.queue(1, fragment));
  CHECK(pacer.queue(2, fragment));
  CHECK_FALSE(pacer.queue(3, fragment));  // full: the caller drops and counts it
  CHECK(pacer.next_pump_ns(5, link) == 5);
  const auto done = pacer.pump(5, link);
  REQUIRE(done.size() == 2);
  CHECK(done[0].id == 1);
  CHECK(done[1].id == 2);
  CHECK(done[0].arrivals[0].at_ns == 5);
  CHECK(pacer.queue(3, fragment));
  pacer.clear();
  CHECK(pacer.waiting() == 0);
}

TEST_CASE("link_shaper: a frame sent in pieces has one fate, drawn as for a whole frame") {
  // The same seed gives the whole frame and the pieced frame the same fate: pieces draw nothing.
  const link_profile lossy{.bandwidth_bytes_per_s = 1e6, .loss = 0.3, .duplicate = 0.3, .corrupt = 0.5};
  link_shaper whole(lossy, 99), pieced(lossy, 99);
  for (int frame = 0; frame < 200; ++frame) {
    const nanos now = frame * s;
    const deliveries a = whole.submit(now, 10'000);
    for (int i = 0; i < 9; ++i) pieced.submit_piece(now, 1'000);
    const deliveries b = pieced.submit(now, 1'000, 10'000);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].at_ns == b[i].at_ns);
      CHECK(a[i].corrupt == b[i].corrupt);
      CHECK(a[i].flip_bit == b[i].flip_bit);  // chosen among the whole frame's bits
    }
  }
  CHECK(whole.stats().frames == pieced.stats().frames);
  CHECK(whole.stats().bytes == pieced.stats().bytes);
  CHECK(whole.stats().lost == pieced.stats().lost);
}
