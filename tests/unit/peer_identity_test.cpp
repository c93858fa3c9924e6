// Identities bound to keys, role permissions and claim bounds: the
// pure parts the transport, the broker and the shard apply.

#include <doctest/doctest.h>

#include <vector>

#include "core/prng.hpp"
#include "parameter_shard/shard_core.hpp"
#include "sync_broker/broker_core.hpp"
#include "transport/peer_identity.hpp"

using namespace archipelago;
using namespace archipelago::transport;
using B = wire::Envelope::Body;

TEST_CASE("peer identity: keygen names bind one identity each") {
  CHECK(*identity_of_key_name("broker") == key_identity{role::sync_broker, 0u});
  CHECK(*identity_of_key_name("broker-0") == key_identity{role::sync_broker, 0u});
  CHECK(*identity_of_key_name("broker-2") == key_identity{role::sync_broker, 2u});
  CHECK(*identity_of_key_name("shard-1") == key_identity{role::parameter_shard, 1u});
  CHECK(*identity_of_key_name("learner-3") == key_identity{role::learner, 3u});
  CHECK(*identity_of_key_name("learner") == key_identity{role::learner, std::nullopt});
  CHECK(*identity_of_key_name("chaos") == key_identity{role::chaos_monkey, std::nullopt});
  CHECK(*identity_of_key_name("admin") == key_identity{role::admin, std::nullopt});
  for (const char* bad : {"", "alice", "shard", "shard-", "shard-x", "learner-01", "learner--1", "broker-99999999999",
                          "chaos-1", "LEARNER-1"})
    CHECK_MESSAGE(!identity_of_key_name(bad), bad);
  // The names round trip, and a node's own name is the first the transport looks up.
  for (const char* name : {"broker", "broker-1", "shard-0", "learner-7", "learner", "chaos", "admin"})
    CHECK(identity_of_key_name(name)->name() == name);
  CHECK(key_name_of({role::sync_broker, 0}) == "broker");
  CHECK(key_name_of({role::sync_broker, 1}) == "broker-1");
  CHECK(key_name_of({role::parameter_shard, 2}) == "shard-2");
  CHECK(key_name_of({role::learner, 4}) == "learner-4");
}

TEST_CASE("peer identity: a key admits only the sender it is bound to") {
  const key_identity learner3{role::learner, 3u}, any_learner{role::learner, std::nullopt};
  CHECK(identity_admits(learner3, {role::learner, 3}));
  CHECK_FALSE(identity_admits(learner3, {role::learner, 2}));            // another learner's index
  CHECK_FALSE(identity_admits(learner3, {role::sync_broker, 0}));        // the broker
  CHECK_FALSE(identity_admits(learner3, {role::parameter_shard, 3}));    // a shard
  CHECK(identity_admits(any_learner, {role::learner, 2}));               // a shared key binds the role only
  CHECK_FALSE(identity_admits(any_learner, {role::sync_broker, 0}));
  CHECK(identity_admits({role::sync_broker, 1u}, {role::sync_broker, 1}));
  CHECK_FALSE(identity_admits({role::sync_broker, 1u}, {role::sync_broker, 0}));  // a standby is not the primary
}

TEST_CASE("peer identity: the role permissions table") {
  CHECK(role_may_send(role::sync_broker, B::ROUND_OPEN));
  CHECK(role_may_send(role::sync_broker, B::ROUND_CLOSE));
  CHECK(role_may_send(role::sync_broker, B::WELCOME));
  for (role r : {role::learner, role::parameter_shard, role::chaos_monkey}) {
    CHECK_FALSE(role_may_send(r, B::ROUND_OPEN));
    CHECK_FALSE(role_may_send(r, B::ROUND_CLOSE));
    CHECK_FALSE(role_may_send(r, B::WELCOME));
    CHECK_FALSE(role_may_send(r, B::BROKER_STATE));
  }
  CHECK(role_may_send(role::parameter_shard, B::FRAGMENT_UPDATE));
  CHECK_FALSE(role_may_send(role::learner, B::FRAGMENT_UPDATE));
  CHECK_FALSE(role_may_send(role::sync_broker, B::FRAGMENT_UPDATE));
  CHECK(role_may_send(role::learner, B::CONTRIBUTION));
  CHECK(role_may_send(role::parameter_shard, B::CONTRIBUTION));  // arrival notices
  CHECK_FALSE(role_may_send(role::sync_broker, B::CONTRIBUTION));
  CHECK(role_may_send(role::chaos_monkey, B::CHAOS_COMMAND));
  for (role r : {role::learner, role::parameter_shard, role::sync_broker}) CHECK_FALSE(role_may_send(r, B::CHAOS_COMMAND));
  CHECK_FALSE(role_may_send(role::sync_broker, B::PROGRESS));
  // Reconfigure: an admin's to the broker, which forwards it to the shards; nobody else.
  CHECK(role_may_send(role::admin, B::RECONFIGURE));
  CHECK(role_may_send(role::sync_broker, B::RECONFIGURE));
  for (role r : {role::learner, role::parameter_shard, role::chaos_monkey}) CHECK_FALSE(role_may_send(r, B::RECONFIGURE));
  for (auto b : {B::ROUND_CLOSE, B::CONTRIBUTION, B::JOIN, B::CHAOS_COMMAND}) CHECK_FALSE(role_may_send(role::admin, b));
  auto learner_reconfigures = check_sender("learner-1", {role::learner, 1}, B::RECONFIGURE);
  REQUIRE(learner_reconfigures);
  CHECK_FALSE(learner_reconfigures->impersonation);
  CHECK(check_sender("learner-1", {role::admin, 0}, B::RECONFIGURE)->impersonation);
  CHECK_FALSE(check_sender("admin", {role::admin, 0}, B::RECONFIGURE));
  for (role r : {role::learner, role::parameter_shard, role::sync_broker, role::chaos_monkey}) {
    CHECK(role_may_send(r, B::HEARTBEAT));
    CHECK(role_may_send(r, B::ERROR));
  }
}

TEST_CASE("peer identity: check_sender names impersonation before permission") {
  CHECK_FALSE(check_sender("learner-1", {role::learner, 1}, B::CONTRIBUTION));
  auto as_broker = check_sender("learner-1", {role::sync_broker, 0}, B::ROUND_OPEN);
  REQUIRE(as_broker);
  CHECK(as_broker->impersonation);
  CHECK(as_broker->message.find("learner-1") != std::string::npos);
  auto other_index = check_sender("learner-1", {role::learner, 2}, B::CONTRIBUTION);
  REQUIRE(other_index);
  CHECK(other_index->impersonation);
  auto unnamed = check_sender("rq:A8x...", {role::learner, 1}, B::PROGRESS);
  REQUIRE(unnamed);
  CHECK(unnamed->impersonation);
  auto not_permitted = check_sender("learner-1", {role::learner, 1}, B::ROUND_CLOSE);
  REQUIRE(not_permitted);
  CHECK_FALSE(not_permitted->impersonation);
}

TEST_CASE("claims: bounded by the reported steps, tokens and batch x context") {
  // An honest claim within what was reported is kept as is.
  auto b = bound_claim(4 * 512, 4, 10, 10 * 512, 512);
  CHECK(b.tokens == 4 * 512);
  CHECK(b.steps == 4);
  // Tokens above steps × batch × context: cut.
  b = bound_claim(1'000'000, 4, 10, 10 * 512, 512);
  CHECK(b.tokens == 4 * 512);
  // Steps above what Progress reported (+ one step of slack): cut, and the tokens with them.
  b = bound_claim(40 * 512, 40, 10, 10 * 512, 512);
  CHECK(b.steps == 11);
  CHECK(b.tokens == 11 * 512);
  // Tokens above what Progress reported (a learner that claims more than it did), + one step.
  b = bound_claim(8 * 512, 8, 10, 6 * 512, 512);
  CHECK(b.tokens == 7 * 512);
  // Nothing reported: one step's worth at most.
  b = bound_claim(10 * 512, 10, 0, 0, 512);
  CHECK(b.steps == 1);
  CHECK(b.tokens == 512);
  // No batch × context known: the reported tokens, without slack.
  b = bound_claim(1000, 2, 10, 600, 0);
  CHECK(b.tokens == 600);
}

TEST_CASE("claims: the broker's round decision carries each member's bounded counts") {
  broker_config cfg;
  cfg.fragments = 1;
  cfg.rounds_in_flight = 1;
  cfg.quorum = 2;
  cfg.adaptive_grace = false;
  cfg.shard_of_fragment = {0};
  cfg.tokens_per_step_max = {100};
  cfg.bound_claims = true;
  auto core = broker_core::create(cfg);
  REQUIRE(core);
  nanos now = 1'000'000;
  for (std::uint32_t l : {0u, 1u}) core->on_join({l}, {1}, now);
  for (std::uint32_t l : {0u, 1u}) core->on_progress({l}, {1}, 3, 1'000'000, now, 300);
  core->tick(now += 10'000'000);
  round_number r{};
  bool opened = false;
  for (auto& e : core->take_effects())
    if (auto* o = std::get_if<open_round>(&e)) r = o->round, opened = true;
  REQUIRE(opened);
  core->on_contribution(r, {0}, {1}, 300, 3, now + 1);          // honest
  core->on_contribution(r, {1}, {1}, 300'000, 3, now + 2);      // lies about its tokens
  const close_round* close = nullptr;
  std::vector<broker_effect> effects = core->take_effects();
  for (auto& e : effects)
    if (auto* c = std::get_if<close_round>(&e)) close = c;
  REQUIRE(close != nullptr);
  REQUIRE(close->members.size() == 2);
  CHECK(close->members[0].bounded_tokens == 300);
  CHECK(close->members[0].weight == doctest::Approx(300.0 * 300.0 / 3));
  CHECK(close->members[1].tokens == 300'000);
  CHECK(close->members[1].bounded_tokens == 300);
  CHECK(close->members[1].weight == doctest::Approx(300.0 * 300.0 / 3));
  CHECK(core->counters().claims_cut == 1);
}

TEST_CASE("claims: the shard rejects a contribution that claims more than its bound") {
  param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  fragment_plan plan = *make_fragment_plan(layout, 4);
  std::vector<float> init(layout.total_floats, 0.f);
  shard_core shard(layout, plan, {{0}}, shard_config{}, init.data());
  const fragment_index p{0};
  std::vector<float> d(plan.fragments[0].floats, 0.01f);
  CHECK(shard.on_contribution(round_number{1}, p, {{0}, {1}}, 3, 300, d) == contribution_verdict::buffered);
  CHECK(shard.on_contribution(round_number{1}, p, {{1}, {1}}, 3, 300'000, d) == contribution_verdict::buffered);
  auto published = shard.on_round_decided(round_number{1}, p, {{{{0}, {1}}, true, 300, 3}, {{{1}, {1}}, true, 300, 3}});
  REQUIRE(published);
  REQUIRE(published->has_value());
  CHECK((*published)->members == 1);
  CHECK((*published)->merged_tokens == 300);
  const auto refused = shard.take_screened();
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].rejected());
  CHECK(refused[0].from.learner.value == 1);
  CHECK(refused[0].reason().find("learner/1 claims 300000 tokens in 3 steps; the broker bounds it to 300 tokens") !=
        std::string::npos);
  CHECK(shard.ledger().rejected == 1);
  CHECK(shard.ledger().rejected_tokens == 300'000);
}
