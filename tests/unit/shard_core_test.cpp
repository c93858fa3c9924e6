// The parameter shard's core: buffering per round, merging exactly the named
// members, the outer step, versions, and a ledger in which every contribution
// lands in one bucket.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/prng.hpp"
#include "parameter_shard/shard_core.hpp"

using namespace archipelago;

namespace {

struct fixture {
  param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  fragment_plan plan = *make_fragment_plan(layout, 4);
  std::vector<float> init = std::vector<float>(layout.total_floats, 0.f);
  shard_core shard;
  fixture() : shard(layout, plan, {{0}, {2}}, shard_config{}, fill(init)) {}
  static const float* fill(std::vector<float>& v) {
    prng rng(3);
    for (auto& x : v) x = static_cast<float>(rng.normal());
    return v.data();
  }
  std::vector<float> delta(fragment_index p, std::uint64_t seed) const {
    prng rng(seed);
    std::vector<float> d(plan.fragments[p.value].floats);
    for (auto& x : d) x = 0.01f * static_cast<float>(rng.normal());
    return d;
  }
};

}  // namespace

TEST_CASE("shard core: merge of the named members, outer step, version + 1") {
  fixture f;
  const fragment_index p{2};
  const auto d1 = f.delta(p, 11), d2 = f.delta(p, 12), d3 = f.delta(p, 13);
  CHECK(f.shard.on_contribution(round_number{6}, p, {{1}, {1}}, 4, 400, d1) == contribution_verdict::buffered);
  CHECK(f.shard.on_contribution(round_number{6}, p, {{2}, {1}}, 2, 100, d2) == contribution_verdict::buffered);
  CHECK(f.shard.on_contribution(round_number{6}, p, {{3}, {1}}, 1, 50, d3) == contribution_verdict::buffered);
  CHECK(f.shard.on_contribution(round_number{6}, p, {{1}, {1}}, 4, 400, d1) == contribution_verdict::duplicate);
  const std::vector<float> before = f.shard.value(p);

  // Learner 3 is not a member (it came after the broker closed the round).
  auto published = f.shard.on_round_close(round_number{6}, p, {{{1}, {1}}, {{2}, {1}}});
  REQUIRE(published);
  REQUIRE(published->has_value());
  const auto& pub = **published;
  CHECK(pub.version == 1);
  CHECK(pub.members == 2);
  CHECK(pub.merged_tokens == 500);
  CHECK(f.shard.version(p) == 1);

  // The same arithmetic done directly with the merge and the outer optimizer.
  std::vector<fragment_tensor> tensors;
  std::size_t offset = 0;
  for (std::size_t t : f.plan.fragments[p.value].tensors) {
    tensors.push_back({offset, f.layout.tensors[t].size(), f.layout.tensors[t].kind == tensor_kind::embedding});
    offset += f.layout.tensors[t].size();
  }
  std::vector<contribution_view> views{{d1.data(), 400, 4}, {d2.data(), 100, 2}};
  std::vector<float> grad(before.size()), theta = before, momentum(before.size(), 0.f);
  REQUIRE(merge_outer_gradient(tensors, views, before.size(), grad.data()));
  outer_optimizer(nesterov_config{}).step(theta.data(), momentum.data(), grad.data(), theta.size(), 0);
  CHECK(f.shard.value(p) == theta);
  CHECK(f.shard.momentum(p) == momentum);

  // Late after the close; ledger buckets add up.
  CHECK(f.shard.on_contribution(round_number{6}, p, {{4}, {1}}, 1, 70, d3) == contribution_verdict::late);
  const shard_ledger& l = f.shard.ledger();
  CHECK(l.merged_tokens == 500);
  CHECK(l.unmerged_tokens == 50);
  CHECK(l.late_tokens == 70);
  CHECK(l.duplicates == 1);
}

TEST_CASE("shard core: bad contributions are rejected, counted and never merged") {
  fixture f;
  const fragment_index p{0};
  std::string why;
  auto nan = f.delta(p, 1);
  nan[3] = std::nanf("");
  CHECK(f.shard.on_contribution(round_number{4}, p, {{1}, {1}}, 1, 10, nan, &why) == contribution_verdict::rejected);
  CHECK(why.find("non-finite value at element 3") != std::string::npos);
  auto short_delta = f.delta(p, 2);
  short_delta.pop_back();
  CHECK(f.shard.on_contribution(round_number{4}, p, {{1}, {1}}, 1, 10, short_delta, &why) ==
        contribution_verdict::rejected);
  CHECK(why.find("values") != std::string::npos);
  CHECK(f.shard.on_contribution(round_number{4}, fragment_index{1}, {{1}, {1}}, 1, 10, f.delta({1}, 3), &why) ==
        contribution_verdict::rejected);
  CHECK(why.find("not owned") != std::string::npos);
  CHECK(f.shard.on_contribution(round_number{4}, p, {{1}, {1}}, 0, 10, f.delta(p, 4)) == contribution_verdict::rejected);
  CHECK(f.shard.ledger().rejected == 4);
  CHECK(f.shard.ledger().rejected_tokens == 40);

  // A round closed with members that sent nothing usable publishes nothing.
  const auto before = f.shard.value(p);
  auto published = f.shard.on_round_close(round_number{4}, p, {{{1}, {1}}});
  REQUIRE(published);
  CHECK_FALSE(published->has_value());
  CHECK(f.shard.value(p) == before);
  CHECK(f.shard.version(p) == 0);
}

TEST_CASE("shard core: a broker restart drops the buffered rounds and round numbers start over") {
  fixture f;
  const fragment_index p{0}, q{2};
  REQUIRE(f.shard.on_contribution(round_number{40}, p, {{1}, {1}}, 3, 300, f.delta(p, 1)) ==
          contribution_verdict::buffered);
  REQUIRE(f.shard.on_contribution(round_number{41}, q, {{1}, {1}}, 3, 300, f.delta(q, 2)) ==
          contribution_verdict::buffered);
  REQUIRE(f.shard.on_round_close(round_number{38}, p, {}));  // rounds below 39 closed
  CHECK(f.shard.on_contribution(round_number{5}, p, {{2}, {1}}, 1, 10, f.delta(p, 3)) == contribution_verdict::late);

  CHECK(f.shard.on_broker_restarted() == 2);
  CHECK(f.shard.ledger().unmerged == 2);
  CHECK(f.shard.ledger().unmerged_tokens == 600);
  // The old rounds are gone: their close (if it came) merges nothing.
  auto stale = f.shard.on_round_close(round_number{40}, p, {{{1}, {1}}});
  REQUIRE(stale);
  CHECK_FALSE(stale->has_value());
  CHECK(f.shard.version(p) == 0);
  // A broker without its tape numbers from 0 again: its rounds are new, not late.
  CHECK(f.shard.on_contribution(round_number{5}, q, {{2}, {1}}, 2, 20, f.delta(q, 4)) ==
        contribution_verdict::buffered);
  auto merged = f.shard.on_round_close(round_number{5}, q, {{{2}, {1}}});
  REQUIRE(merged);
  REQUIRE(merged->has_value());
  CHECK((*merged)->version == 1);
  // A contribution to a round of the earlier broker is late.
  const std::uint64_t late_before = f.shard.ledger().late;
  CHECK(f.shard.on_earlier_broker_round(70) == contribution_verdict::late);
  CHECK(f.shard.ledger().late == late_before + 1);
}

TEST_CASE("shard core: mesh.merge = mean takes the token-weighted mean on every tensor, not RDA") {
  fixture f;
  const fragment_index p{0};  // matrices and vectors (the plan puts embeddings last), where RDA applies
  const auto d1 = f.delta(p, 21), d2 = f.delta(p, 22);
  shard_config mean_config;
  mean_config.merge_mean = true;
  shard_core mean_shard(f.layout, f.plan, {p}, mean_config, f.init.data());
  for (shard_core* s : {&f.shard, &mean_shard}) {
    REQUIRE(s->on_contribution(round_number{1}, p, {{1}, {1}}, 4, 400, d1) == contribution_verdict::buffered);
    REQUIRE(s->on_contribution(round_number{1}, p, {{2}, {1}}, 2, 100, d2) == contribution_verdict::buffered);
    REQUIRE(s->on_round_close(round_number{1}, p, {{{1}, {1}}, {{2}, {1}}}));
  }
  // Expected: Δ = Σ w v / Σ w with w = tokens² / steps, v = −d; then the default outer step.
  const double w1 = 400.0 * 400 / 4, w2 = 100.0 * 100 / 2;
  std::vector<float> grad(d1.size()), momentum(d1.size(), 0.f);
  std::vector<float> start;  // the fragment's Θ before the merge: its tensors in plan order
  for (std::size_t t : f.plan.fragments[p.value].tensors)
    start.insert(start.end(), f.init.begin() + static_cast<std::ptrdiff_t>(f.layout.tensors[t].offset),
                 f.init.begin() + static_cast<std::ptrdiff_t>(f.layout.tensors[t].offset + f.layout.tensors[t].size()));
  for (std::size_t i = 0; i < grad.size(); ++i)
    grad[i] = static_cast<float>((w1 * -d1[i] + w2 * -d2[i]) / (w1 + w2));
  outer_optimizer(nesterov_config{}).step(start.data(), momentum.data(), grad.data(), start.size(), 0);
  const std::vector<float> got = mean_shard.value(p);
  REQUIRE(got.size() == start.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - start[i]));
  CHECK(worst < 1e-6);
  CHECK(mean_shard.value(p) != f.shard.value(p));  // RDA (the default) merges differently
}

TEST_CASE("shard core: under dp with optimizer.kind = muon the shard steps Muon on the merged gradient") {
  const param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  const fragment_plan plan = *make_fragment_plan(layout, 1);
  std::vector<float> init(layout.total_floats, 0.f);
  prng rng(41);
  for (auto& x : init) x = static_cast<float>(0.02 * rng.normal());
  shard_config dp;
  dp.gradient_mode = true;
  dp.adamw_outer.kind = "muon";
  dp.schedule_steps = 100;
  const fragment_index p{0};
  shard_core shard(layout, plan, {p}, dp, init.data());
  const std::vector<float> start = shard.value(p);
  std::vector<float> g1(start.size()), g2(start.size());
  for (auto& x : g1) x = static_cast<float>(rng.normal());
  for (auto& x : g2) x = static_cast<float>(rng.normal());
  std::vector<float> d1 = g1, d2 = g2;  // learners send −gradient
  for (auto& x : d1) x = -x;
  for (auto& x : d2) x = -x;
  REQUIRE(shard.on_contribution(round_number{0}, p, {{1}, {1}}, 1, 300, d1) == contribution_verdict::buffered);
  REQUIRE(shard.on_contribution(round_number{0}, p, {{2}, {1}}, 1, 100, d2) == contribution_verdict::buffered);
  REQUIRE(shard.on_round_close(round_number{0}, p, {{{1}, {1}}, {{2}, {1}}}));
  // The fragment's own layout (its tensors back to back) and the token-weighted mean gradient.
  param_layout fragment;
  std::size_t offset = 0;
  for (std::size_t t : plan.fragments[0].tensors) {
    fragment.tensors.push_back(layout.tensors[t]);
    fragment.tensors.back().offset = offset;
    offset += layout.tensors[t].size();
  }
  fragment.total_floats = fragment.param_count = offset;
  std::vector<float> mean(start.size()), theta = start;
  for (std::size_t i = 0; i < mean.size(); ++i) mean[i] = static_cast<float>((300.0 * g1[i] + 100.0 * g2[i]) / 400);
  inner_optimizer muon(fragment, dp.adamw_outer);
  REQUIRE(muon.muon());
  muon.step(theta.data(), mean.data(), scheduled_lr(dp.adamw_outer, 0, dp.schedule_steps));
  const std::vector<float> got = shard.value(p);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - theta[i]));
  CHECK(worst < 1e-6);
  // Muon's momentum is in the snapshot's first-moment buffer, the matrices' second moment stays 0.
  const fragment_outer_state state = shard.outer_state(p);
  for (const tensor_spec& t : fragment.tensors)
    if (t.kind == tensor_kind::matrix) {
      CHECK(state.adam_m[t.offset] != 0);
      CHECK(state.adam_v[t.offset] == 0);
    }
}

TEST_CASE("shard core: the robust merge set live takes effect, the same settings again change nothing") {
  fixture f;
  CHECK_FALSE(f.shard.robust().enabled);
  robust_config on;
  on.enabled = true;
  on.norm_factor = 4;
  CHECK(f.shard.set_robust(on));
  CHECK(f.shard.robust().enabled);
  CHECK(f.shard.robust().norm_factor == 4);
  CHECK_FALSE(f.shard.set_robust(on));
  CHECK(f.shard.set_robust(robust_config{}));
  CHECK_FALSE(f.shard.robust().enabled);
}
