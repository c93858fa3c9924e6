#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>

#include "core/config.hpp"

using namespace archipelago;

TEST_CASE("every knob's default round-trips through TOML") {
  config defaults;
  const std::string text = to_toml(defaults);
  config parsed;
  parsed.train.steps = 1;  // changed, so the round trip must restore it
  REQUIRE(apply_toml(parsed, text, "roundtrip"));
  CHECK(to_toml(parsed) == text);
  for (const auto& k : knobs()) {
    CAPTURE(k.key);
    CHECK(!k.help.empty());
    CHECK(!k.bound.empty());
    CHECK(k.help.find("Default:") != std::string::npos);
  }
}

TEST_CASE("TOML values and flag overrides apply in order") {
  config cfg;
  REQUIRE(apply_toml(cfg, "[model]\nsize = \"micro\"\n[optimizer]\nlr = 1e-3\n[train]\nsteps = 10\n", "t"));
  CHECK(cfg.model.size == "micro");
  CHECK(cfg.optimizer.lr == doctest::Approx(1e-3));
  REQUIRE(set_knob_assignment(cfg, "train.steps=20"));
  CHECK(cfg.train.steps == 20);
  auto shape = resolve_model(cfg.model);
  REQUIRE(shape);
  CHECK(shape->d_model == 160);
  REQUIRE(set_knob(cfg, "model.d_model", "40"));
  CHECK(resolve_model(cfg.model)->d_model == 40);
}

TEST_CASE("bad configuration is reported with the key and the bound") {
  config cfg;
  auto lr = set_knob(cfg, "optimizer.lr", "-1");
  REQUIRE_FALSE(lr);
  CHECK(lr.err().code == errc::invalid_input);
  CHECK(lr.err().message.find("optimizer.lr must be in") != std::string::npos);
  CHECK_FALSE(set_knob(cfg, "train.threads", "0"));
  CHECK_FALSE(set_knob(cfg, "train.threads", "two"));
  CHECK_FALSE(set_knob(cfg, "optimizer.lr", "nan"));
  CHECK_FALSE(set_knob(cfg, "model.size", "huge"));
  auto order = set_knob(cfg, "mesh.fragment_order", "oldest");
  REQUIRE_FALSE(order);
  CHECK(order.err().message.find("unknown fragment order 'oldest' (round_robin, stalest or shuffled)") != std::string::npos);
  CHECK(cfg.mesh.fragment_order == "round_robin");
  auto unknown = set_knob(cfg, "train.stepz", "1");
  REQUIRE_FALSE(unknown);
  CHECK(unknown.err().message.find("train.stepz") != std::string::npos);
  CHECK_FALSE(set_knob_assignment(cfg, "no_equals_sign"));

  auto syntax = apply_toml(cfg, "[train\nsteps = 1\n", "broken.toml");
  REQUIRE_FALSE(syntax);
  CHECK(syntax.err().message.find("broken.toml") != std::string::npos);
  auto type = apply_toml(cfg, "[train]\nsteps = \"many\"\n", "typed.toml");
  REQUIRE_FALSE(type);
  CHECK(type.err().message.find("train.steps has the wrong type") != std::string::npos);
  auto bare = apply_toml(cfg, "steps = 1\n", "bare.toml");
  CHECK_FALSE(bare);
  auto missing = apply_toml_file(cfg, "/nonexistent/archipelago.toml");
  REQUIRE_FALSE(missing);
  CHECK(missing.err().code == errc::not_found);
}

TEST_CASE("a shape override that breaks the model is caught by validate") {
  config cfg;
  REQUIRE(set_knob(cfg, "model.n_head", "7"));
  auto ok = validate(cfg);
  REQUIRE_FALSE(ok);
  CHECK(ok.err().message.find("n_head") != std::string::npos);
}

TEST_CASE("mesh configurations that cannot work are refused with the knobs named") {
  auto refuses = [](std::vector<std::string> sets, const std::string& needle) {
    config cfg;
    for (const auto& s : sets) REQUIRE(set_knob_assignment(cfg, s));
    CHECK(validate(cfg));  // commands without a mesh do not care
    auto ok = validate_mesh(cfg);
    REQUIRE_FALSE(ok);
    CHECK(ok.err().message.find(needle) != std::string::npos);
  };
  refuses({"mesh.learners=2", "mesh.quorum=3"}, "mesh.quorum (3) must not exceed mesh.learners (2)");
  refuses({"mesh.fragments=4", "mesh.shards=5"}, "mesh.shards (5) must not exceed mesh.fragments (4)");
  refuses({"mesh.fragments=1000"}, "mesh.fragments");
  refuses({"mesh.learners=3", "mesh.learner_slowdown=1,2"}, "mesh.learner_slowdown has 2 values for 3 learners");
  config cfg;
  CHECK_FALSE(set_knob(cfg, "mesh.fragments", "0"));
  auto mode = set_knob(cfg, "mesh.mode", "async");
  REQUIRE_FALSE(mode);
  CHECK(mode.err().message.find("unknown mode 'async'") != std::string::npos);
  CHECK(validate_mesh(config{}));
  CHECK_FALSE(set_knob(cfg, "mesh.learner_slowdown", "2,0.5"));  // a slow-down below 1 is out of bounds
  auto list = set_knob(cfg, "mesh.learner_batch", "8,x");
  REQUIRE_FALSE(list);
  CHECK(list.err().message == "mesh.learner_batch: 'x' is not a number");
}

TEST_CASE("every mode resolves to the policy of docs/design/algorithm.md §8") {
  auto policy_of = [](std::vector<std::string> sets) {
    config cfg;
    for (const auto& s : sets) REQUIRE(set_knob_assignment(cfg, s));
    auto p = resolve_policy(cfg);
    REQUIRE(p);
    return *p;
  };
  const sync_policy dp = policy_of({"mesh.mode=dp", "mesh.shards=3"});
  CHECK(dp.fragments == 1);
  CHECK(dp.shards == 1);  // one fragment, one shard
  CHECK(dp.send_gradients);
  CHECK(dp.wait_for_all);
  CHECK(dp.wait_slack == 0);
  const sync_policy diloco = policy_of({"mesh.mode=diloco", "mesh.inner_steps=40"});
  CHECK(diloco.fragments == 1);
  CHECK(diloco.contribute_after == 40);
  CHECK(diloco.steps_per_round == 40);
  CHECK(diloco.wait_slack == 0);
  CHECK_FALSE(diloco.send_gradients);
  const sync_policy streaming = policy_of({"mesh.mode=streaming", "mesh.inner_steps=48", "mesh.fragments=24"});
  CHECK(streaming.fragments == 24);
  CHECK(streaming.steps_per_round == 2);
  CHECK(streaming.wait_slack == 2);  // τ
  CHECK(streaming.mix == 0.5);
  const sync_policy decoupled = policy_of({"mesh.quorum=2", "mesh.grace=false"});
  CHECK(decoupled.quorum == 2);
  CHECK_FALSE(decoupled.wait_for_all);
  CHECK_FALSE(decoupled.adaptive_grace);
  CHECK(decoupled.wait_slack < 0);
  CHECK(policy_of({"mesh.mode=dp", "mesh.elastic=false", "mesh.learners=5"}).quorum == 5);
  CHECK(policy_of({"mesh.mode=streaming", "mesh.mix=0"}).mix == 0);
  CHECK_FALSE(decoupled.rebase);
  CHECK(policy_of({"mesh.rebase=true"}).rebase);
  const sync_policy rebased_streaming = policy_of({"mesh.mode=streaming", "mesh.rebase=true"});
  CHECK(rebased_streaming.rebase);
  CHECK(rebased_streaming.mix == 0);  // streaming's default α gives way
  CHECK_FALSE(policy_of({"mesh.mode=dp", "mesh.rebase=true"}).rebase);  // no local progress in dp
  CHECK_FALSE(decoupled.catch_up);
  CHECK(policy_of({"mesh.catch_up=true"}).catch_up);
  for (const char* mode : {"mesh.mode=dp", "mesh.mode=diloco", "mesh.mode=streaming"})  // they wait for every version
    CHECK_FALSE(policy_of({mode, "mesh.catch_up=true"}).catch_up);
  {
    config both;
    REQUIRE(set_knob_assignment(both, "mesh.rebase=true"));
    REQUIRE(set_knob_assignment(both, "mesh.mix=0.3"));
    auto refused = resolve_policy(both);
    REQUIRE_FALSE(refused);
    CHECK(refused.err().message.find("mesh.rebase and mesh.mix") != std::string::npos);
  }

  config cfg;
  REQUIRE(set_knob_assignment(cfg, "mesh.learners=3"));
  REQUIRE(set_knob_assignment(cfg, "mesh.learner_batch=8,16,4"));
  REQUIRE(set_knob_assignment(cfg, "mesh.learner_slowdown=1,2.5,1"));
  CHECK(learner_profile_of(cfg, 1).batch == 16);
  CHECK(learner_profile_of(cfg, 1).slowdown == 2.5);
  CHECK(learner_profile_of(cfg, 2).threads == 1);  // train.threads 2 over 3 learners
}

// Regression (fuzzing, tests/fuzz/corpus/config_toml/control-character-round-trip): a
// text knob read from a TOML escape (\f) was written back raw, and TOML refuses raw
// control characters: `archipelago config` printed a file it could not read back.
TEST_CASE("a text knob with control characters round-trips through TOML") {
  config cfg;
  REQUIRE(apply_toml(cfg, "[mesh]\netcd = \"http://a\\f\\u0001\\u007f\\tb\\\\c\\\"\"\n", "in.toml"));
  CHECK(cfg.mesh.etcd == std::string("http://a\f\x01\x7f\tb\\c\""));
  const std::string text = to_toml(cfg);
  config again;
  auto ok = apply_toml(again, text, "out.toml");
  REQUIRE_MESSAGE(ok, ok.err().message);
  CHECK(again.mesh.etcd == cfg.mesh.etcd);
  CHECK(to_toml(again) == text);
}
