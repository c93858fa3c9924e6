// The token ledger: every reported step in exactly one bucket, merged > late >
// rejected > lost, windows from contributions, rounds closed with or without a merge.

#include <doctest/doctest.h>

#include "sync_broker/token_ledger.hpp"

using namespace archipelago;

namespace {
const learner_ref a{{0}, incarnation{1}}, b{{1}, incarnation{1}}, a2{{0}, incarnation{2}};
}

TEST_CASE("token ledger: buckets by contribution outcome, the best outcome wins") {
  token_ledger l;
  for (std::uint64_t s = 1; s <= 10; ++s) l.on_progress(a, s, s * 100, 1'000'000);
  l.on_arrival(round_number{0}, a, 4, 4);            // steps 1-4
  l.on_round_closed(round_number{0}, {a}, true);      // merged
  l.on_outcome(a, 6, 3, ledger_bucket::late);         // steps 4-6: step 4 stays merged
  l.on_outcome(a, 8, 1, ledger_bucket::rejected);     // step 8
  l.on_arrival(round_number{0}, a, 9, 1);             // round 0 closed already: late
  const ledger_totals t = l.totals();
  CHECK(t.processed == 1000);
  CHECK(t.merged == 400);
  CHECK(t.late == 300);      // steps 5, 6, 9
  CHECK(t.rejected == 100);  // step 8
  CHECK(t.lost == 200);      // steps 7 and 10: never covered
  CHECK(t.balanced());
  CHECK(t.steps == 10);
  CHECK(t.merged_step_time_s == doctest::Approx(0.004));
}

TEST_CASE("token ledger: a round closed without a merge leaves its windows for later") {
  token_ledger l;
  for (std::uint64_t s = 1; s <= 4; ++s) l.on_progress(b, s, s * 50, 2'000'000);
  l.on_arrival(round_number{3}, b, 2, 2);
  l.on_round_closed(round_number{3}, {b}, false);  // no quorum: nothing merged
  CHECK(l.totals().merged == 0);
  l.on_arrival(round_number{4}, b, 4, 4);  // the learner's counters still hold that work
  l.on_round_closed(round_number{4}, {b}, true);
  CHECK(l.totals().merged == 200);
  CHECK(l.totals().balanced());
}

TEST_CASE("token ledger: lost Progress is filled in, incarnations are separate, bounds hold") {
  token_ledger l(8);
  l.on_progress(a, 1, 10, 1000);
  l.on_progress(a, 4, 70, 1000);  // steps 2 and 3 reported late: 60 tokens shared by steps 2-4
  l.on_progress(a, 3, 50, 1000);  // stale, ignored
  l.on_progress(a2, 1, 10, 1000);  // the rejoined incarnation starts over
  CHECK(l.totals().processed == 80);
  l.on_outcome(a, 4, 3, ledger_bucket::merged);
  CHECK(l.totals().merged == 60);
  l.on_progress(a, 9, 200, 1000);  // beyond the bound of 8 steps: not recorded, counted
  CHECK(l.overflowed_steps() == 1);
  CHECK(l.totals().balanced());
}

TEST_CASE("uptime: gaps longer than the stall bound are down time") {
  CHECK(uptime_from_publications({10, 20, 30}, 0, 40, 15) == doctest::Approx(1.0));
  // A 60 ns gap with a 10 ns allowance: 50 ns of 100 down.
  CHECK(uptime_from_publications({10, 70, 80, 90}, 0, 100, 10) == doctest::Approx(0.5));
  CHECK(uptime_from_publications({}, 0, 100, 10) == doctest::Approx(0.1));  // nothing published
}
