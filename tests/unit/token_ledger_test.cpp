// The token ledger: every reported step's token-shares, one per fragment, in
// exactly one bucket (merged > late > rejected > overwritten > lost); windows
// from contributions; merged only once the merge is published; rounds closed
// with or without a merge.

#include <doctest/doctest.h>

#include "sync_broker/token_ledger.hpp"

using namespace archipelago;

namespace {
const learner_ref a{{0}, incarnation{1}}, b{{1}, incarnation{1}}, a2{{0}, incarnation{2}};
const fragment_index f0{0}, f1{1}, f2{2};

/// A ledger of one fragment: every share is the whole step.
token_ledger whole(std::uint64_t max_steps = std::uint64_t{1} << 22) { return token_ledger({1000}, max_steps); }

/// Round r merged `who`'s window and the merge was published.
void merge(token_ledger& l, std::uint64_t r, fragment_index p, learner_ref who, std::uint64_t step, std::uint64_t steps) {
  l.on_arrival(round_number{r}, p, who, step, steps);
  l.on_round_closed(round_number{r}, {who}, true);
  l.on_round_published(round_number{r});
}

void check_balanced(const token_ledger& l) {
  CHECK(l.totals().balanced());
  ledger_totals summed;
  for (const ledger_totals& f : l.per_fragment()) {
    CHECK(f.balanced());
    summed += f;
  }
  CHECK(summed.processed == l.totals().processed);
  CHECK(summed.merged == l.totals().merged);
  CHECK(summed.overwritten == l.totals().overwritten);
  CHECK(summed.lost == l.totals().lost);
}
}  // namespace

TEST_CASE("token ledger: buckets by contribution outcome, the best outcome wins") {
  token_ledger l = whole();
  for (std::uint64_t s = 1; s <= 10; ++s) l.on_progress(a, s, s * 100, 1'000'000);
  merge(l, 0, f0, a, 4, 4);                              // steps 1-4
  l.on_outcome(a, f0, 6, 3, ledger_bucket::late);       // steps 4-6: step 4 stays merged
  l.on_outcome(a, f0, 8, 1, ledger_bucket::rejected);   // step 8; its window starts at 7: step 7 was installed over
  l.on_arrival(round_number{0}, f0, a, 9, 1);           // round 0 closed already: late
  const ledger_totals t = l.totals();
  CHECK(t.processed == 1000);
  CHECK(t.merged == 400);
  CHECK(t.late == 300);         // steps 5, 6, 9
  CHECK(t.rejected == 100);     // step 8
  CHECK(t.overwritten == 100);  // step 7: below a later window, never covered
  CHECK(t.lost == 100);         // step 10: never covered, nothing after it
  CHECK(t.balanced());
  CHECK(t.steps == 10);
  CHECK(t.merged_step_time_s == doctest::Approx(0.004));
}

TEST_CASE("token ledger: a step's tokens are split over the fragments by their parameters") {
  token_ledger l({100, 100, 200});
  CHECK(l.share(100, 0) + l.share(100, 1) + l.share(100, 2) == 100);
  CHECK(l.share(100, 2) == 50);
  CHECK(l.share(7, 0) + l.share(7, 1) + l.share(7, 2) == 7);  // exact, whatever the rounding
  for (std::uint64_t s = 1; s <= 4; ++s) l.on_progress(a, s, s * 100, 2'000'000);
  merge(l, 2, f2, a, 4, 4);  // fragment 2's work on steps 1-4 merged; 0 and 1 never contributed
  CHECK(l.totals().merged == 200);
  CHECK(l.totals().lost == 200);
  CHECK(l.totals().merged_step_time_s == doctest::Approx(4 * 0.002 * 0.5));  // half of each step's time
  const auto by_fragment = l.per_fragment();
  REQUIRE(by_fragment.size() == 3);
  CHECK(by_fragment[2].merged == 200);
  CHECK(by_fragment[0].lost == 100);
  CHECK(by_fragment[1].processed == 100);
  check_balanced(l);
}

TEST_CASE("token ledger: work installed over before it was contributed is overwritten, per fragment") {
  token_ledger l({1, 1});
  for (std::uint64_t s = 1; s <= 12; ++s) l.on_progress(a, s, s * 10, 1'000'000);
  merge(l, 0, f0, a, 4, 4);  // fragment 0: steps 1-4
  // The learner installed a new version of fragment 0 after step 6: its next
  // window starts there, and its work on steps 5 and 6 was overwritten.
  merge(l, 2, f0, a, 9, 3);
  // Fragment 1's windows are its own: one contribution covering steps 1-9.
  merge(l, 1, f1, a, 9, 9);
  const auto by_fragment = l.per_fragment();
  CHECK(by_fragment[0].merged == 7 * 5);
  CHECK(by_fragment[0].overwritten == 2 * 5);
  CHECK(by_fragment[0].lost == 3 * 5);  // steps 10-12: not contributed yet
  CHECK(by_fragment[1].merged == 9 * 5);
  CHECK(by_fragment[1].overwritten == 0);
  // A reordered older window still counts (merged wins over overwritten).
  merge(l, 3, f0, a, 6, 6);
  CHECK(l.per_fragment()[0].overwritten == 0);
  check_balanced(l);
}

TEST_CASE("token ledger: merged only once the merge is published, a round closed without a merge leaves its windows") {
  token_ledger l = whole();
  for (std::uint64_t s = 1; s <= 4; ++s) l.on_progress(b, s, s * 50, 2'000'000);
  l.on_arrival(round_number{3}, f0, b, 2, 2);
  l.on_round_closed(round_number{3}, {b}, false);  // no quorum: nothing merged
  CHECK(l.totals().merged == 0);
  l.on_arrival(round_number{4}, f0, b, 3, 3);  // the learner's counters still hold that work
  l.on_round_closed(round_number{4}, {b}, true);
  CHECK(l.totals().merged == 0);  // merged, not durable yet: its shard may die first
  l.on_round_published(round_number{4});
  CHECK(l.totals().merged == 150);
  l.on_round_published(round_number{4});  // a repeated notice changes nothing
  CHECK(l.totals().merged == 150);
  // A merge whose shard died before it was durable credits nothing; the next window covers the work again.
  l.on_arrival(round_number{6}, f0, b, 4, 4);
  l.on_round_closed(round_number{6}, {b}, true);
  CHECK(l.totals().merged == 150);
  merge(l, 8, f0, b, 4, 4);
  CHECK(l.totals().merged == 200);
  check_balanced(l);
}

TEST_CASE("token ledger: lost Progress is filled in, incarnations are separate, bounds hold") {
  token_ledger l = whole(8);
  l.on_progress(a, 1, 10, 1000);
  l.on_progress(a, 4, 70, 1000);  // steps 2 and 3 reported late: 60 tokens shared by steps 2-4
  l.on_progress(a, 3, 50, 1000);  // stale, ignored
  l.on_progress(a2, 1, 10, 1000);  // the rejoined incarnation starts over
  CHECK(l.totals().processed == 80);
  l.on_outcome(a, f0, 4, 3, ledger_bucket::merged);
  CHECK(l.totals().merged == 60);
  l.on_progress(a, 9, 200, 1000);  // beyond the bound of 8 steps: not recorded, counted
  CHECK(l.overflowed_steps() == 1);
  l.on_outcome(a, fragment_index{5}, 4, 1, ledger_bucket::merged);  // no such fragment: ignored
  CHECK(l.totals().merged == 60);
  CHECK(l.totals().balanced());
}

TEST_CASE("token ledger: a restored incarnation continues from its stored steps, which stay frozen") {
  // What the previous broker stored: steps 1-10, 100 tokens each, in every bucket.
  ledger_totals stored;
  stored.processed = 1000;
  stored.merged = 400;
  stored.late = 300;
  stored.rejected = 100;
  stored.overwritten = 50;
  stored.lost = 150;
  stored.steps = 10;
  stored.step_time_s = 0.01;
  stored.merged_step_time_s = 0.004;
  token_ledger l = whole();
  REQUIRE(l.restore(a, stored, {stored}, 10));
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
  CHECK(l.totals().lost == 150 + 450);  // not covered by any contribution yet
  // A contribution whose window (8, 13] reaches into the frozen steps merges only steps 11-13.
  merge(l, 700, f0, a, 13, 5);
  const ledger_totals t = l.totals();
  CHECK(t.merged == 400 + 112 * 3);  // 450 shared by four steps: 112, 112, 112, 114
  CHECK(t.lost == 150 + 114);        // the frozen lost steps stay lost
  CHECK(t.late == 300);
  CHECK(t.rejected == 100);
  CHECK(t.overwritten == 50);
  CHECK(t.balanced());
  CHECK(t.merged_step_time_s == doctest::Approx(0.004 + 0.003));
  // A window entirely below the frozen steps changes nothing.
  l.on_outcome(a, f0, 9, 2, ledger_bucket::merged);
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
  token_ledger l = whole();
  l.on_progress(b, 1, 100, 1000);
  CHECK_FALSE(l.restore(b, stored, {stored}, 5));  // heard of already: its steps are counted
  CHECK(l.totals().processed == 100);
  CHECK_FALSE(l.restore(a, stored, {stored}, 4));  // the step count differs from the totals'
  ledger_totals unbalanced = stored;
  unbalanced.merged = 400;
  CHECK_FALSE(l.restore(a, unbalanced, {unbalanced}, 5));
  ledger_totals old_writer = stored;  // a record without its step count
  old_writer.steps = 0;
  CHECK_FALSE(l.restore(a, old_writer, {old_writer}, 0));
  CHECK_FALSE(l.restore(a, stored, {}, 5));  // without its fragments (an older writer)
  ledger_totals other = stored;  // fragments that do not sum to the totals
  other.merged = other.processed = 400;
  CHECK_FALSE(l.restore(a, stored, {other}, 5));
  CHECK(l.frozen_steps(a) == 0);
  CHECK(l.restore(a, stored, {stored}, 5));
  CHECK_FALSE(l.restore(a, stored, {stored}, 5));  // once
}

TEST_CASE("token ledger: across a broker crash processed stays exact and work merged after the last write is lost") {
  // The old broker's ledger: steps 1-20 of 64 tokens; rounds merge (0, 8] and, after
  // its last ledger write at step 12, (8, 16]. Then it dies.
  token_ledger old = whole();
  for (std::uint64_t s = 1; s <= 12; ++s) old.on_progress(a, s, s * 64, 1'000'000);
  merge(old, 1, f0, a, 8, 8);
  const ledger_totals written = old.per_learner().at(a);  // the last ledger write
  const std::vector<ledger_totals> written_fragments = old.fragments_of(a);
  for (std::uint64_t s = 13; s <= 20; ++s) old.on_progress(a, s, s * 64, 1'000'000);
  merge(old, 2, f0, a, 16, 8);
  CHECK(old.totals().merged == 16 * 64);

  // The new broker restores the write and hears the learner's next cumulative Progress at step 25.
  token_ledger fresh = whole();
  REQUIRE(fresh.restore(a, written, written_fragments, written.steps));
  fresh.on_progress(a, 25, 25 * 64, 1'000'000);
  const ledger_totals t = fresh.totals();
  CHECK(t.processed == 25 * 64);  // exact: every token once
  CHECK(t.balanced());
  CHECK(t.merged == 8 * 64);       // steps 9-16, merged after the write, count as lost
  CHECK(t.lost == 17 * 64);
  // The learner's next contribution covers its steps since its last anchor (17-25)
  // and is merged; steps 13-16 below it stay lost, not overwritten: the new broker
  // cannot know what the old one saw of them.
  merge(fresh, 900, f0, a, 25, 9);
  CHECK(fresh.totals().merged == 17 * 64);
  CHECK(fresh.totals().lost == 8 * 64);  // 9-16 merged by the old broker, unknown here
  CHECK(fresh.totals().overwritten == 0);
  CHECK(fresh.totals().balanced());
}

TEST_CASE("token ledger: the stored tail lets a restarted broker merge the work that was in flight") {
  // The old broker: steps 1-12 of 64 tokens; (0, 8] merged, then the learner
  // installed that version and contributed (8, 12] to a round still open when the
  // broker wrote its ledger and died.
  token_ledger old = token_ledger({600, 400});
  for (std::uint64_t s = 1; s <= 12; ++s) old.on_progress(a, s, s * 64, 1'000'000);
  merge(old, 1, f0, a, 8, 8);
  merge(old, 2, f1, a, 8, 8);
  old.on_arrival(round_number{3}, f0, a, 12, 4);
  old.on_arrival(round_number{4}, f1, a, 12, 4);
  const ledger_totals written = old.per_learner().at(a);
  const ledger_tail tail = old.tail_of(a);
  CHECK(tail.tokens.size() == 4);  // steps 9-12: above every fragment's last install
  CHECK(tail.buckets.size() == 4 * 2);
  CHECK(old.tail_of(a, 3).tokens.size() == 3);  // bounded

  // The new broker restores the write with its tail; the learner, told the broker
  // restarted, contributes its work since its anchor again, (8, 14], and it merges.
  for (bool with_tail : {true, false}) {
    CAPTURE(with_tail);
    token_ledger fresh = token_ledger({600, 400});
    REQUIRE(fresh.restore(a, written, old.fragments_of(a), written.steps, with_tail ? tail : ledger_tail{}));
    CHECK(fresh.frozen_steps(a) == (with_tail ? 8 : 12));
    fresh.on_progress(a, 14, 14 * 64, 1'000'000);
    merge(fresh, 10, f0, a, 14, 6);
    merge(fresh, 11, f1, a, 14, 6);
    check_balanced(fresh);
    // Without the tail, steps 9-12 were frozen as lost (the issue this fixes).
    CHECK(fresh.totals().merged == (with_tail ? 14 : 10) * 64);
    CHECK(fresh.totals().lost == (with_tail ? 0 : 4) * 64);
    CHECK(fresh.totals().processed == 14 * 64);
  }
}

TEST_CASE("token ledger: restore refuses a tail inconsistent with its totals") {
  token_ledger old = whole();
  for (std::uint64_t s = 1; s <= 6; ++s) old.on_progress(a, s, s * 10, 1000);
  merge(old, 1, f0, a, 2, 2);
  old.on_arrival(round_number{2}, f0, a, 6, 4);
  const ledger_totals written = old.per_learner().at(a);
  const ledger_tail tail = old.tail_of(a);
  REQUIRE(tail.tokens.size() == 4);
  ledger_tail merged_claim = tail;  // more merged shares than the totals count
  for (auto& b : merged_claim.buckets) b = static_cast<std::uint8_t>(ledger_bucket::merged);
  ledger_tail short_buckets = tail;
  short_buckets.buckets.pop_back();
  ledger_tail unknown_bucket = tail;
  unknown_bucket.buckets[1] = 9;
  ledger_tail too_long = tail;
  for (int i = 0; i < 3; ++i) {
    too_long.tokens.push_back(0);
    too_long.time_us.push_back(0);
    too_long.buckets.push_back(0);
  }
  for (const ledger_tail* bad : {&merged_claim, &short_buckets, &unknown_bucket, &too_long}) {
    token_ledger fresh = whole();
    CHECK_FALSE(fresh.restore(a, written, old.fragments_of(a), written.steps, *bad));
    CHECK(fresh.totals().processed == 0);
  }
  token_ledger fresh = whole();
  CHECK(fresh.restore(a, written, old.fragments_of(a), written.steps, tail));
}

TEST_CASE("uptime: gaps longer than the stall bound are down time") {
  CHECK(uptime_from_publications({10, 20, 30}, 0, 40, 15) == doctest::Approx(1.0));
  // A 60 ns gap with a 10 ns allowance: 50 ns of 100 down.
  CHECK(uptime_from_publications({10, 70, 80, 90}, 0, 100, 10) == doctest::Approx(0.5));
  CHECK(uptime_from_publications({}, 0, 100, 10) == doctest::Approx(0.1));  // nothing published
}
