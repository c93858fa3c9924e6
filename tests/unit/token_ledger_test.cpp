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

TEST_CASE("token ledger: a restored incarnation continues from its stored steps, which stay frozen") {
  // What the previous broker stored: steps 1-10, 100 tokens each, in every bucket.
  ledger_totals stored;
  stored.processed = 1000;
  stored.merged = 400;
  stored.late = 300;
  stored.rejected = 100;
  stored.lost = 200;
  stored.steps = 10;
  stored.step_time_s = 0.01;
  stored.merged_step_time_s = 0.004;
  token_ledger l;
  REQUIRE(l.restore(a, stored, 10));
  CHECK(l.frozen_steps(a) == 10);
  CHECK(l.totals().processed == 1000);
  CHECK(l.totals().merged == 400);
  CHECK(l.totals().balanced());

  l.on_progress(a, 10, 1000, 1'000'000);  // the step the store already covers: nothing new
  CHECK(l.totals().processed == 1000);
  // The learner's next Progress is cumulative: steps 11-14 (the new broker missed
  // three reports) share the tokens after the stored 1000.
  l.on_progress(a, 14, 1450, 1'000'000);
  CHECK(l.totals().processed == 1450);
  CHECK(l.totals().steps == 14);
  CHECK(l.totals().lost == 200 + 450);  // not covered by any contribution yet
  // A contribution whose window (8, 13] reaches into the frozen steps merges only steps 11-13.
  l.on_arrival(round_number{700}, a, 13, 5);
  l.on_round_closed(round_number{700}, {a}, true);
  const ledger_totals t = l.totals();
  CHECK(t.merged == 400 + 112 * 3);  // 450 shared by four steps: 112, 112, 112, 114
  CHECK(t.lost == 200 + 114);        // the frozen lost steps stay lost
  CHECK(t.late == 300);
  CHECK(t.rejected == 100);
  CHECK(t.balanced());
  CHECK(t.merged_step_time_s == doctest::Approx(0.004 + 0.003));
  // A window entirely below the frozen steps changes nothing.
  l.on_outcome(a, 9, 2, ledger_bucket::merged);
  CHECK(l.totals().merged == t.merged);
  // Other incarnations are untouched: a rejoined one starts at step 1.
  l.on_progress(a2, 2, 20, 1000);
  CHECK(l.frozen_steps(a2) == 0);
  CHECK(l.totals().processed == 1470);
}

TEST_CASE("token ledger: restore refuses known incarnations and inconsistent records") {
  ledger_totals stored;
  stored.processed = stored.merged = 500;
  stored.steps = 5;
  token_ledger l;
  l.on_progress(b, 1, 100, 1000);
  CHECK_FALSE(l.restore(b, stored, 5));  // heard of already: its steps are counted
  CHECK(l.totals().processed == 100);
  CHECK_FALSE(l.restore(a, stored, 4));  // the step count differs from the totals'
  ledger_totals unbalanced = stored;
  unbalanced.merged = 400;
  CHECK_FALSE(l.restore(a, unbalanced, 5));
  ledger_totals old_writer = stored;  // a record without its step count
  old_writer.steps = 0;
  CHECK_FALSE(l.restore(a, old_writer, 0));
  CHECK(l.frozen_steps(a) == 0);
  CHECK(l.restore(a, stored, 5));
  CHECK_FALSE(l.restore(a, stored, 5));  // once
}

TEST_CASE("token ledger: across a broker crash processed stays exact and work merged after the last write is lost") {
  // The old broker's ledger: steps 1-20 of 64 tokens; rounds merge (0, 8] and, after
  // its last ledger write at step 12, (8, 16]. Then it dies.
  token_ledger old;
  for (std::uint64_t s = 1; s <= 12; ++s) old.on_progress(a, s, s * 64, 1'000'000);
  old.on_arrival(round_number{1}, a, 8, 8);
  old.on_round_closed(round_number{1}, {a}, true);
  const ledger_totals written = old.per_learner().at(a);  // the last ledger write
  for (std::uint64_t s = 13; s <= 20; ++s) old.on_progress(a, s, s * 64, 1'000'000);
  old.on_arrival(round_number{2}, a, 16, 8);
  old.on_round_closed(round_number{2}, {a}, true);
  CHECK(old.totals().merged == 16 * 64);

  // The new broker restores the write and hears the learner's next cumulative Progress at step 25.
  token_ledger fresh;
  REQUIRE(fresh.restore(a, written, written.steps));
  fresh.on_progress(a, 25, 25 * 64, 1'000'000);
  const ledger_totals t = fresh.totals();
  CHECK(t.processed == 25 * 64);  // exact: every token once
  CHECK(t.balanced());
  CHECK(t.merged == 8 * 64);       // steps 9-16, merged after the write, count as lost
  CHECK(t.lost == 17 * 64);
  // The learner's next contribution covers its steps since its last anchor (17-25) and is merged.
  fresh.on_arrival(round_number{900}, a, 25, 9);
  fresh.on_round_closed(round_number{900}, {a}, true);
  CHECK(fresh.totals().merged == 17 * 64);
  CHECK(fresh.totals().lost == 8 * 64);  // 9-16 merged by the old broker, unknown here
  CHECK(fresh.totals().balanced());
}

TEST_CASE("uptime: gaps longer than the stall bound are down time") {
  CHECK(uptime_from_publications({10, 20, 30}, 0, 40, 15) == doctest::Approx(1.0));
  // A 60 ns gap with a 10 ns allowance: 50 ns of 100 down.
  CHECK(uptime_from_publications({10, 70, 80, 90}, 0, 100, 10) == doctest::Approx(0.5));
  CHECK(uptime_from_publications({}, 0, 100, 10) == doctest::Approx(0.1));  // nothing published
}
