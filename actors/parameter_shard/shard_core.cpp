#include "parameter_shard/shard_core.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace archipelago {

const char* to_string(contribution_verdict v) {
  switch (v) {
    case contribution_verdict::buffered: return "buffered";
    case contribution_verdict::duplicate: return "duplicate";
    case contribution_verdict::late: return "late";
    case contribution_verdict::rejected: return "rejected";
  }
  return "?";
}

bool shard_core::set_robust(const robust_config& robust) {
  if (robust == config_.robust) return false;
  config_.robust = robust;
  for (auto& [p, f] : fragments_) {
    f.screen.reset();
    if (robust.enabled && robust.screening) f.screen.emplace(robust);
  }
  return true;
}

std::string screened_contribution::reason() const {
  char text[240];
  if (why == cause::claim_bound)
    std::snprintf(text, sizeof text, "learner/%u claims %llu tokens in %llu steps; the broker bounds it to %llu tokens "
                  "in %llu steps (its Progress, batch x context)", from.learner.value,
                  static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(steps),
                  static_cast<unsigned long long>(bound_tokens), static_cast<unsigned long long>(bound_steps));
  else if (decision.why == screen_decision::cause::direction)
    std::snprintf(text, sizeof text, "delta direction: cosine %.4f with the other members' median direction (or the fragment's "
                  "recent descent) below the bound %.4g (mesh.robust_min_cosine, or mesh.robust_cosine_ratio x the "
                  "honest members' cosine)", decision.cosine, decision.min_cosine);
  else if (decision.why == screen_decision::cause::stale_anchor)
    std::snprintf(text, sizeof text, "stale: anchored %lld versions behind the fragment's (a negative lag: a version "
                  "not yet published; mesh.robust_max_anchor_lag)", static_cast<long long>(decision.anchor_lag));
  else if (decision.why == screen_decision::cause::replay)
    std::snprintf(text, sizeof text, "replay: its delta is bit for bit one this fragment already merged");
  else
    std::snprintf(text, sizeof text, "delta norm per sqrt(step) %.6g above the robust bound %.6g (mesh.robust_norm_factor "
                  "x the lower median of the round's or the fragment's trusted ones)", decision.norm, decision.norm_bound);
  return text;
}

std::shared_ptr<const std::vector<float>> shared_floats(std::vector<float> v) {
  return std::make_shared<const std::vector<float>>(std::move(v));
}

std::string round_screening::describe() const {
  std::string out = "round " + std::to_string(round.value) + " fragment " + std::to_string(fragment.value) + " v " +
                    std::to_string(version) + ":";
  char text[224];
  for (const member& m : members) {
    const screen_decision& d = m.decision;
    std::snprintf(text, sizeof text, " learner/%u steps %llu lag %lld norm %.4g (bound %.4g) cos %.3f (bound %.3f) %s%s%s;",
                  m.from.learner.value, static_cast<unsigned long long>(m.steps), static_cast<long long>(d.anchor_lag),
                  d.norm, d.norm_bound, d.cosine, d.min_cosine, to_string(d.what),
                  d.why == screen_decision::cause::none ? "" : " ", d.why == screen_decision::cause::none ? "" : to_string(d.why));
    out += text;
  }
  return out;
}

shard_core::shard_core(const param_layout& layout, const fragment_plan& plan, std::vector<fragment_index> owned,
                       shard_config config, const float* initial_params)
    : config_(config), outer_(config.outer) {
  for (fragment_index p : owned) {
    fragment_state& f = fragments_[p.value];
    const fragment_spec& spec = plan.fragments.at(p.value);
    std::size_t offset = 0;
    std::vector<float> theta;
    theta.reserve(spec.floats);
    param_layout fragment_layout;  // the fragment's tensors at their offsets in its flat vector
    for (std::size_t t : spec.tensors) f.names.push_back(layout.tensors[t].name);
    for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
      const tensor_spec& ts = layout.tensors[spec.tensors[i]];
      // Gradients are averaged on every tensor; deltas get RDA except on embeddings
      // (or nowhere, with mesh.merge = mean).
      f.tensors.push_back({offset, ts.size(),
                           config.gradient_mode || config.merge_mean || ts.kind == tensor_kind::embedding,
                           f.names[i]});
      theta.insert(theta.end(), initial_params + ts.offset, initial_params + ts.offset + ts.size());
      fragment_layout.tensors.push_back(ts);
      fragment_layout.tensors.back().offset = offset;
      offset += ts.size();
    }
    f.momentum = std::make_shared<std::vector<float>>(config.gradient_mode ? 0 : theta.size(), 0.f);
    f.theta = shared_floats(std::move(theta));
    if (config.robust.enabled && config.robust.screening) f.screen.emplace(config.robust);
    if (config.gradient_mode) {
      fragment_layout.total_floats = fragment_layout.param_count = offset;
      f.gradient_optimizer = std::make_unique<inner_optimizer>(fragment_layout, config.adamw_outer);
    }
  }
}

contribution_verdict shard_core::on_contribution(round_number r, fragment_index p, learner_ref from,
                                                 std::uint64_t steps, std::uint64_t tokens,
                                                 std::vector<float> delta, std::string* reason,
                                                 std::uint64_t learner_step, std::optional<std::uint64_t> anchor_version) {
  auto reject = [&](std::string why) {
    ++ledger_.rejected;
    ledger_.rejected_tokens += tokens;
    if (reason) *reason = std::move(why);
    return contribution_verdict::rejected;
  };
  auto it = fragments_.find(p.value);
  if (it == fragments_.end()) return reject("fragment " + std::to_string(p.value) + " is not owned by this shard");
  fragment_state& f = it->second;
  if (delta.size() != f.theta->size())
    return reject("delta has " + std::to_string(delta.size()) + " values, fragment " + std::to_string(p.value) +
                  " has " + std::to_string(f.theta->size()));
  if (steps == 0) return reject("contribution with zero steps");
  for (std::size_t i = 0; i < delta.size(); ++i)
    if (!std::isfinite(delta[i])) return reject("non-finite value at element " + std::to_string(i));
  if (r.value < f.closed_through) {
    ++ledger_.late;
    ledger_.late_tokens += tokens;
    return contribution_verdict::late;
  }
  auto round = f.open.find(r.value);
  if (round == f.open.end()) {
    if (open_rounds_ >= config_.max_open_rounds) drop_oldest_round();
    round = f.open.emplace(r.value, std::vector<buffered_contribution>{}).first;
    ++open_rounds_;
  }
  for (const auto& c : round->second)
    if (c.from.learner == from.learner && c.from.inc == from.inc) {
      ++ledger_.duplicates;
      return contribution_verdict::duplicate;
    }
  if (round->second.size() >= config_.max_contributions_per_round)
    return reject("round " + std::to_string(r.value) + " already holds the maximum of contributions");
  round->second.push_back({from, steps, tokens, std::move(delta), learner_step, anchor_version});
  return contribution_verdict::buffered;
}

expected<std::optional<published_fragment>> shard_core::on_round_close(
    round_number r, fragment_index p, const std::vector<learner_ref>& members) {
  std::vector<decided_member> decided;
  for (const learner_ref& m : members) decided.push_back({m, false, 0, 0});
  return on_round_decided(r, p, decided);
}

expected<std::optional<published_fragment>> shard_core::on_round_decided(
    round_number r, fragment_index p, const std::vector<decided_member>& members) {
  auto it = fragments_.find(p.value);
  if (it == fragments_.end())
    return make_error(errc::invalid_input, "close of round " + std::to_string(r.value) + " for fragment " +
                                               std::to_string(p.value) + ", not owned by this shard");
  fragment_state& f = it->second;
  std::vector<buffered_contribution> buffered;
  if (auto round = f.open.find(r.value); round != f.open.end()) {
    buffered = std::move(round->second);
    f.open.erase(round);
    --open_rounds_;
  }
  f.closed_through = std::max(f.closed_through, r.value + 1);

  std::vector<contribution_view> views;
  std::vector<buffered_contribution*> merged;
  std::uint64_t merged_tokens = 0;
  for (auto& c : buffered) {
    const decided_member* member = nullptr;
    for (const auto& m : members)
      if (m.who.learner == c.from.learner && m.who.inc == c.from.inc) member = &m;
    if (!member) {
      ++ledger_.unmerged;
      ledger_.unmerged_tokens += c.tokens;
      continue;
    }
    if (member->bounded && (c.tokens > member->tokens || c.steps > member->steps)) {
      ++ledger_.rejected;
      ledger_.rejected_tokens += c.tokens;
      screened_.push_back({c.from, r, p, c.tokens, c.steps, c.learner_step, screened_contribution::cause::claim_bound,
                           screen_decision{}, member->tokens, member->steps});
      continue;
    }
    // Gradients are averaged per token: steps = tokens makes the weight tokens²/steps = tokens.
    const auto tokens = static_cast<double>(c.tokens);
    views.push_back({c.delta.data(), tokens, config_.gradient_mode ? std::max(1.0, tokens) : static_cast<double>(c.steps)});
    merged.push_back(&c);
    merged_tokens += c.tokens;
  }
  if (f.screen && !views.empty()) {
    std::vector<screen_member> screened;
    for (const buffered_contribution* c : merged) screened.push_back({c->delta, c->steps, c->anchor_version});
    // A small round's direction reference: the way this fragment has been descending,
    // the opposite of its outer momentum (the outer step moves Θ along the members'
    // deltas); the AdamW outer optimizer of send_gradients keeps none.
    const auto decisions = f.screen->screen(
        screened, f.version, config_.gradient_mode ? std::span<const float>{} : std::span<const float>(*f.momentum));
    round_screening& screening = screenings_.emplace_back();
    screening.round = r;
    screening.fragment = p;
    screening.version = f.version;
    std::vector<contribution_view> kept_views;
    std::vector<buffered_contribution*> kept;
    for (std::size_t m = 0; m < decisions.size(); ++m) {
      buffered_contribution& c = *merged[m];
      const screen_decision& d = decisions[m];
      screening.members.push_back({c.from, c.steps, d});
      if (d.what != screen_decision::action::accept)
        screened_.push_back({c.from, r, p, c.tokens, c.steps, c.learner_step, screened_contribution::cause::robust, d, 0, 0});
      if (d.what == screen_decision::action::reject) {
        ++ledger_.rejected;
        ledger_.rejected_tokens += c.tokens;
        ++ledger_.screened_out;
        ledger_.screened_out_tokens += c.tokens;
        if (d.why == screen_decision::cause::direction) ++ledger_.screened_by_direction;
        if (d.why == screen_decision::cause::stale_anchor || d.why == screen_decision::cause::replay)
          ++ledger_.screened_stale;
        merged_tokens -= c.tokens;
        continue;
      }
      if (d.what == screen_decision::action::clip) {
        ++ledger_.clipped;
        const double scale = d.scale();
        for (float& x : c.delta) x = static_cast<float>(x * scale);
      }
      kept_views.push_back(views[m]);
      kept.push_back(&c);
    }
    views = std::move(kept_views);
    merged = std::move(kept);
  }
  if (views.empty()) return std::optional<published_fragment>{};

  // The merge writes Δ into the buffer that becomes the next Θ: the current one
  // stays as it is (learners may still be sent it, a snapshot may be writing it).
  const std::size_t n = f.theta->size();
  auto next = std::make_shared<std::vector<float>>(n);
  merge_options options;
  if (config_.robust.enabled) options.trim = config_.robust.trim;
  if (auto ok = merge_outer_gradient(f.tensors, views, n, next->data(), options); !ok) return ok.err();
  if (f.gradient_optimizer) {
    std::vector<float> gradient = std::move(*next);
    *next = *f.theta;
    f.gradient_optimizer->step(next->data(), gradient.data(),
                               scheduled_lr(config_.adamw_outer, static_cast<std::int64_t>(f.version),
                                            config_.schedule_steps));
  } else {
    outer_.step_into(next->data(), f.theta->data(), f.momentum->data(), next->data(), n, f.version);
  }
  f.theta = std::move(next);
  ++f.version;
  f.round = r.value;
  ledger_.merged += views.size();
  ledger_.merged_tokens += merged_tokens;
  published_fragment out{p, f.version, r, merged_tokens, views.size(), {}};
  if (config_.record_merges)
    for (buffered_contribution* c : merged) out.merged.push_back({c->from, c->steps, c->tokens, std::move(c->delta)});
  return std::optional<published_fragment>(std::move(out));
}

void shard_core::drop_oldest_round() {
  fragment_state* oldest = nullptr;
  for (auto& [p, f] : fragments_)
    if (!f.open.empty() && (!oldest || f.open.begin()->first < oldest->open.begin()->first)) oldest = &f;
  if (!oldest) return;
  for (const auto& c : oldest->open.begin()->second) {
    ++ledger_.unmerged;
    ledger_.unmerged_tokens += c.tokens;
  }
  oldest->open.erase(oldest->open.begin());
  --open_rounds_;
}

std::size_t shard_core::on_broker_restarted() {
  std::size_t dropped = 0;
  for (auto& [p, f] : fragments_) {
    for (const auto& [r, contributions] : f.open)
      for (const auto& c : contributions) {
        ++ledger_.unmerged;
        ledger_.unmerged_tokens += c.tokens;
        ++dropped;
      }
    f.open.clear();
    f.closed_through = 0;
  }
  open_rounds_ = 0;
  return dropped;
}

contribution_verdict shard_core::on_earlier_broker_round(std::uint64_t tokens) {
  ++ledger_.late;
  ledger_.late_tokens += tokens;
  return contribution_verdict::late;
}

fragment_outer_state shard_core::outer_state(fragment_index p) const {
  const fragment_state& f = fragments_.at(p.value);
  fragment_outer_state s{f.version, round_number{f.round}, f.theta, f.momentum, {}, {}, 0};
  if (f.gradient_optimizer) {
    auto& opt = *f.gradient_optimizer;
    s.adam_m.assign(opt.first_moment(), opt.first_moment() + f.theta->size());
    s.adam_v.assign(opt.second_moment(), opt.second_moment() + f.theta->size());
    s.adam_steps = opt.steps_taken();
  }
  return s;
}

status shard_core::restore(fragment_index p, fragment_outer_state state) {
  auto it = fragments_.find(p.value);
  if (it == fragments_.end())
    return make_error(errc::invalid_input, "fragment " + std::to_string(p.value) + " is not owned by this shard");
  fragment_state& f = it->second;
  const std::size_t n = f.theta->size();
  auto sized = [n](const std::vector<float>& v) { return v.size() == n; };
  const bool gradient = f.gradient_optimizer != nullptr;
  if (!state.theta || !sized(*state.theta) ||
      (gradient ? !sized(state.adam_m) || !sized(state.adam_v) : !state.momentum || !sized(*state.momentum)))
    return make_error(errc::invalid_input, "snapshot of fragment " + std::to_string(p.value) +
                                               " does not fit this model or mode (" +
                                               std::to_string(state.theta ? state.theta->size() : 0) +
                                               " values, the fragment has " + std::to_string(n) + ")");
  f.theta = std::move(state.theta);
  if (gradient) {
    std::copy(state.adam_m.begin(), state.adam_m.end(), f.gradient_optimizer->first_moment());
    std::copy(state.adam_v.begin(), state.adam_v.end(), f.gradient_optimizer->second_moment());
    f.gradient_optimizer->set_steps_taken(state.adam_steps);
  } else {
    f.momentum = std::make_shared<std::vector<float>>(*state.momentum);
  }
  f.version = state.version;
  f.round = state.round.value;
  f.closed_through = std::max(f.closed_through, state.round.value + (state.version > 0 ? 1 : 0));
  return {};
}

}  // namespace archipelago
