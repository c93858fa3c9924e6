// Live settings (`archipelago set`): checked like a config file, the hash knobs
// refused with the reason, K and γ applied by the broker core at a round boundary.

#include <doctest/doctest.h>

#include "core/live_settings.hpp"
#include "sync_broker/broker_core.hpp"

using namespace archipelago;

namespace {
constexpr nanos ms = 1'000'000;

config mesh_of(int learners) {
  config c;
  c.mesh.learners = learners;
  return c;
}

std::string refusal(const config& c, std::vector<live_setting> s) {
  auto r = apply_live_settings(c, s);
  return r ? "" : r.err().message;
}
}  // namespace

TEST_CASE("live settings: K, the grace factor and the robust merge change, hash knobs and others do not") {
  const config c = mesh_of(4);
  auto next = apply_live_settings(c, {{"mesh.quorum", "3"}, {"mesh.grace_factor", "1.5"}, {"mesh.robust", "true"}});
  REQUIRE(next);
  CHECK(next->mesh.quorum == 3);
  CHECK(next->mesh.grace_factor == doctest::Approx(1.5));
  CHECK(next->mesh.robust);
  CHECK(live_differences(c, *next).size() == 3);
  CHECK(live_values(*next).size() == live_knobs().size());
  CHECK(refusal(c, {{"mesh.rounds_in_flight", "3"}}).find("cannot change live: it is in the mesh agreement hash") !=
        std::string::npos);
  CHECK(refusal(c, {{"wire.encoding", "fp32"}}).find("mesh agreement hash") != std::string::npos);
  CHECK(refusal(c, {{"mesh.outer_lr", "0.5"}}) == "mesh.outer_lr cannot change live (only mesh.quorum, "
                                                   "mesh.grace_factor and mesh.robust* can)");
  CHECK(refusal(c, {{"mesh.quorum", "5"}}).find("must not exceed mesh.learners") != std::string::npos);
  CHECK(refusal(c, {{"mesh.grace_factor", "-1"}}).find("mesh.grace_factor") != std::string::npos);
  CHECK(refusal(c, {{"mesh.nonsense", "1"}}).find("mesh.nonsense") != std::string::npos);
  CHECK(refusal(c, {}) == "no setting to change");
  config dp = c;
  dp.mesh.mode = "dp";
  CHECK(refusal(dp, {{"mesh.quorum", "2"}}).find("cannot change live in mode dp") != std::string::npos);
  auto k = parse_live_assignment("K=3");
  REQUIRE(k);
  CHECK(*k == live_setting{"mesh.quorum", "3"});
  CHECK(parse_live_assignment("grace=0.5")->key == "mesh.grace_factor");
  CHECK_FALSE(parse_live_assignment("K3"));
}

TEST_CASE("live settings: the broker core takes a new K from the next round opened, open rounds keep theirs") {
  broker_config cfg;
  cfg.fragments = 2;
  cfg.rounds_in_flight = 2;
  cfg.quorum = 1;
  cfg.adaptive_grace = false;
  cfg.shard_of_fragment = {0, 1};
  broker_core core(cfg);
  for (std::uint32_t l = 0; l < 3; ++l) {
    core.on_join(learner_index{l}, incarnation{1}, 0);
    core.on_progress(learner_index{l}, incarnation{1}, 1, 10 * ms, 0);
  }
  core.tick(0);  // opens round 0 under K = 1; the next one ξ_step later
  REQUIRE(core.rounds_open() == 1);
  auto from = core.reconfigure(2, 0.5);
  REQUIRE(from);
  CHECK(from->value == 1);
  CHECK(core.config().quorum == 2);
  CHECK_FALSE(core.reconfigure(0, 0.5));  // checked like the config: K >= 1
  core.on_contribution(round_number{0}, learner_index{0}, incarnation{1}, 100, 1, 1 * ms);
  CHECK(core.find_record(round_number{0}) != nullptr);  // opened under K = 1: one member closes it
  core.tick(10 * ms);  // round 1 opens under K = 2
  REQUIRE(core.rounds_open() == 1);
  core.on_contribution(round_number{1}, learner_index{0}, incarnation{1}, 100, 1, 11 * ms);
  CHECK(core.find_record(round_number{1}) == nullptr);
  core.on_contribution(round_number{1}, learner_index{1}, incarnation{1}, 100, 1, 12 * ms);
  const round_record* r2 = core.find_record(round_number{1});
  REQUIRE(r2 != nullptr);
  CHECK(r2->members.size() == 2);
}

TEST_CASE("live settings: a tape note reads back as the changes it records, in order") {
  auto one = parse_tape_settings("from round 12: mesh.quorum=3 mesh.grace_factor=1.5");
  REQUIRE(one);
  CHECK(*one == std::vector<live_setting>{{"mesh.quorum", "3"}, {"mesh.grace_factor", "1.5"}});
  auto two = parse_tape_settings("from round 12: mesh.quorum=3; from round 14: mesh.quorum=2 mesh.robust=true");
  REQUIRE(two);
  CHECK(*two == std::vector<live_setting>{{"mesh.quorum", "3"}, {"mesh.quorum", "2"}, {"mesh.robust", "true"}});
  // Applied in order, the newest value of a knob wins.
  config cfg;
  cfg.mesh.learners = 4;
  auto now = apply_live_settings(cfg, *two);
  REQUIRE(now);
  CHECK(now->mesh.quorum == 2);
  CHECK(now->mesh.robust);
  CHECK_FALSE(parse_tape_settings("mesh.quorum=3"));
  CHECK_FALSE(parse_tape_settings("from round 3: mesh.quorum"));
  CHECK(parse_tape_settings("")->empty());
}
