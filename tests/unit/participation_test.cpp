// Participation per round: members merged against learners live at close, never
// above 1; a member screened out or never published is not merged.

#include <doctest/doctest.h>

#include "chaos_monkey/fault_plan.hpp"
#include "sync_broker/broker_core.hpp"
#include "sync_broker/participation.hpp"

using namespace archipelago;

namespace {
constexpr nanos ms = 1'000'000;
learner_ref who(std::uint32_t l) { return {learner_index{l}, incarnation{1}}; }
}  // namespace

TEST_CASE("participation: published rounds count their members, screened and unpublished ones do not") {
  participation_tracker t;
  t.on_close(0, 0, 4, {who(0), who(1), who(2)}, true, 0);
  CHECK(t.rounds() == 0);  // not settled before its version is published
  t.on_screened(0, who(2));  // mesh.robust left it out
  t.on_published(0);
  REQUIRE(t.rounds() == 1);
  CHECK(t.recent().back().merged == 2);
  CHECK(t.mean() == doctest::Approx(0.5));
  t.on_close(1, 1, 4, {who(0)}, false, 1 * ms);  // no quorum: merged nothing
  CHECK(t.mean() == doctest::Approx(0.25));
  t.on_close(2, 2, 2, {who(0), who(1)}, true, 2 * ms);
  t.tick(50 * ms, 100 * ms);
  CHECK(t.rounds() == 2);
  t.tick(102 * ms, 100 * ms);  // never published within the bound: merged nothing
  CHECK(t.rounds() == 3);
  CHECK(t.recent().back().merged == 0);
  t.on_published(2);  // too late to count
  CHECK(t.merged_total() == 2);
  CHECK(t.live_total() == 10);
  t.on_close(3, 0, 0, {}, false, 3 * ms);  // nobody live: not a round anyone could take part in
  CHECK(t.rounds() == 3);
}

TEST_CASE("participation: a round's live count is the live learners at close with its members") {
  broker_config cfg;
  cfg.fragments = 2;
  cfg.quorum = 1;
  cfg.adaptive_grace = false;
  cfg.shard_of_fragment = {0, 0};
  broker_core core(cfg);
  for (std::uint32_t l = 0; l < 3; ++l) {
    core.on_join(learner_index{l}, incarnation{1}, 0);
    core.on_progress(learner_index{l}, incarnation{1}, 1, 10 * ms, 0);
  }
  core.tick(0);
  core.on_peer_lost(learner_index{1}, 1 * ms);  // found silent, then heard again: its contribution
  core.on_leave(learner_index{2}, incarnation{1}, 1 * ms);
  core.on_contribution(round_number{0}, learner_index{1}, incarnation{1}, 100, 1, 2 * ms);
  const round_record* r = core.find_record(round_number{0});
  REQUIRE(r != nullptr);
  CHECK(r->members.size() == 1);
  CHECK(r->live == 2);  // learner 0 live, learner 1 a member; learner 2 left
}

TEST_CASE("participation: a plan's [pass] criterion parses and a bad one is refused with its line") {
  const std::string head = "duration = \"60s\"\n";
  auto plan = parse_fault_plan(head + "[pass]\nparticipation = 0.8\n", "plan.toml", 4, 2);
  REQUIRE(plan);
  CHECK(plan->min_participation == doctest::Approx(0.8));
  auto high = parse_fault_plan(head + "[pass]\nparticipation = 1.5\n", "plan.toml", 4, 2);
  REQUIRE(!high);
  CHECK(high.err().message == "plan.toml:3: participation must be a number in [0, 1]");
  auto other = parse_fault_plan(head + "[pass]\ngoodput = 0.5\n", "plan.toml", 4, 2);
  REQUIRE(!other);
  CHECK(other.err().message.find("'goodput' is not a criterion of [pass]") != std::string::npos);
}
