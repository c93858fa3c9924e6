#include "learner/learner_core.hpp"

#include <algorithm>
#include <cstring>

#include "core/invariant.hpp"

namespace archipelago {

learner_core::learner_core(const param_layout& layout, fragment_plan plan, learner_sync_config config)
    : layout_(layout), plan_(std::move(plan)), config_(config), state_(plan_.fragments.size()) {
  for (std::size_t p = 0; p < plan_.fragments.size(); ++p) state_[p].anchor.assign(plan_.fragments[p].floats, 0.f);
}

void learner_core::gather(fragment_index p, const float* params, float* out) const {
  for (std::size_t t : plan_.fragments.at(p.value).tensors) {
    const tensor_spec& spec = layout_.tensors[t];
    std::memcpy(out, params + spec.offset, spec.size() * sizeof(float));
    out += spec.size();
  }
}

void learner_core::scatter(fragment_index p, const float* in, float* params) const {
  for (std::size_t t : plan_.fragments.at(p.value).tensors) {
    const tensor_spec& spec = layout_.tensors[t];
    std::memcpy(params + spec.offset, in, spec.size() * sizeof(float));
    in += spec.size();
  }
}

bool learner_core::install(fragment_index p, std::uint64_t version, std::span<const float> global,
                           float* params) {
  fragment_state& s = state_.at(p.value);
  ARCHIPELAGO_INVARIANT(global.size() == s.anchor.size(), "learner: a global fragment of its anchor's size");
  if (s.installed && version <= s.version) return false;
  std::copy(global.begin(), global.end(), s.anchor.begin());
  scatter(p, global.data(), params);
  s.version = version;
  s.steps = s.tokens = s.contributed_steps = 0;
  s.behind = 0;
  s.installed = true;
  return true;
}

void learner_core::reanchor(fragment_index p, std::uint64_t version, std::span<const float> global) {
  fragment_state& s = state_.at(p.value);
  ARCHIPELAGO_INVARIANT(global.size() == s.anchor.size(), "learner: a global fragment of its anchor's size");
  std::copy(global.begin(), global.end(), s.anchor.begin());
  s.version = version;
  s.contributed_steps = 0;
  s.contributed_theta.clear();  // contributed to the dead incarnation: not merged
  s.awaited_round.reset();      // ...and its rounds were aborted: the work goes again
  s.behind = 0;                 // the restarted shard's value is the newest there is
}

void learner_core::on_step(std::uint64_t tokens) {
  ++steps_done_;
  for (auto& s : state_) {
    ++s.steps;
    s.tokens += tokens;
  }
}

bool learner_core::on_round_open(round_number r, fragment_index p, std::uint64_t latest) {
  if (p.value >= state_.size()) return false;
  fragment_state& s = state_[p.value];
  // Behind: two versions or more, or one it had no part in (with a contribution of its
  // own in it, the version is likely on its way, as a round of p may open right after
  // p's last one published when P is small). Asked again at each of p's rounds while
  // it waits: a fetch or its answer may be lost.
  const bool behind = config_.catch_up && s.installed && (latest > s.version + 1 || (latest > s.version && !s.awaited_round));
  if (behind) s.behind = std::max(s.behind, latest);
  for (const auto& pending : pending_)
    if (pending.round == r) return behind;  // a duplicate RoundOpen
  if (pending_.size() >= config_.max_pending_rounds) {
    pending_.pop_front();
    ++dropped_rounds_;
  }
  pending_.push_back({r, p});
  return behind;
}

std::optional<contribution_plan> learner_core::next_contribution(const float* params, const float* gradient) {
  const std::uint64_t enough = last_step_done_ ? 1 : config_.contribute_after;
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    fragment_state& s = state_[it->fragment.value];
    if (!s.installed || s.behind > s.version || s.steps < enough || s.steps <= s.contributed_steps) continue;
    s.contributed_steps = s.steps;
    s.awaited_round = std::max(s.awaited_round.value_or(it->round), it->round);
    contribution_plan c;
    c.round = it->round;
    c.fragment = it->fragment;
    c.step = steps_done_;
    c.anchor_version = s.version;
    c.steps = s.steps;
    c.tokens = s.tokens;
    pending_.erase(it);
    c.delta.resize(s.anchor.size());
    if (gradient != nullptr) {
      gather(c.fragment, gradient, c.delta.data());
      for (float& x : c.delta) x = -x;
      return c;
    }
    gather(c.fragment, params, c.delta.data());
    if (config_.rebase) {
      s.contributed_theta = c.delta;
      s.contributed_tokens = s.tokens;
    }
    // The delta is taken against the learner's own anchor, so it is exact even
    // if broadcasts were missed (docs/design/algorithm.md §4).
    for (std::size_t i = 0; i < c.delta.size(); ++i) c.delta[i] -= s.anchor[i];
    return c;
  }
  return std::nullopt;
}

std::size_t learner_core::on_broker_restarted() {
  const std::size_t dropped = pending_.size();
  pending_.clear();
  // A round the old broker merged just before it died, whose update is still on
  // its way, may see its work contributed again before that update lands; without
  // this a synchronous learner would wait for a round that never closes.
  for (auto& s : state_) {
    s.contributed_steps = 0;
    s.contributed_theta.clear();
    s.awaited_round.reset();  // the new broker numbers its rounds afresh; the work goes again
  }
  return dropped;
}

bool learner_core::must_wait() const {
  if (config_.wait_slack < 0) return false;
  const std::uint64_t limit = config_.contribute_after + static_cast<std::uint64_t>(config_.wait_slack);
  for (const auto& s : state_)
    if (s.installed && s.steps >= limit) return true;
  return false;
}

std::size_t learner_core::fragments_with_unmerged_work() const {
  return static_cast<std::size_t>(std::count_if(state_.begin(), state_.end(), [](const fragment_state& s) {
    return s.installed && (s.steps > 0 || s.awaited_round);
  }));
}

bool learner_core::on_fragment_update(fragment_index p, std::uint64_t version, std::span<const float> global,
                                      float* params, round_number from_round) {
  if (p.value >= state_.size()) return false;
  fragment_state& s = state_[p.value];
  if (global.size() != s.anchor.size() || (s.installed && version <= s.version)) return false;
  std::uint64_t kept_steps = 0, kept_tokens = 0;
  if (config_.catch_up && s.installed && (version > s.version + 1 || s.behind > s.version)) {
    // θ_p and the work in it stay; the counters shrink by 1 + the versions missed.
    const std::uint64_t divisor = 1 + (version - s.version);
    kept_steps = (s.steps + divisor - 1) / divisor;
    kept_tokens = s.tokens / divisor;
    s.behind = 0;
  } else if (s.installed && (config_.rebase || config_.mix > 0)) {
    std::vector<float> local(s.anchor.size());
    gather(p, params, local.data());
    if (config_.rebase) {
      // θ_p ← Θ_p + the progress not in it: since the last contribution (merged,
      // or in a round still open), else since the anchor.
      const bool contributed = !s.contributed_theta.empty();
      const std::vector<float>& base = contributed ? s.contributed_theta : s.anchor;
      for (std::size_t i = 0; i < local.size(); ++i) local[i] = global[i] + (local[i] - base[i]);
      kept_steps = s.steps - (contributed ? s.contributed_steps : 0);
      kept_tokens = s.tokens - (contributed ? s.contributed_tokens : 0);
    } else {  // θ_p ← α·θ_p + (1−α)·Θ_p
      const auto a = static_cast<float>(config_.mix);
      for (std::size_t i = 0; i < local.size(); ++i) local[i] = a * local[i] + (1 - a) * global[i];
    }
    scatter(p, local.data(), params);
  } else {
    scatter(p, global.data(), params);
  }
  std::copy(global.begin(), global.end(), s.anchor.begin());
  s.version = version;
  s.steps = kept_steps;
  s.tokens = kept_tokens;
  s.contributed_steps = 0;
  s.contributed_theta.clear();
  if (s.awaited_round && from_round >= *s.awaited_round) s.awaited_round.reset();
  s.installed = true;
  std::erase_if(pending_, [&](const pending_round& r) { return r.fragment == p && r.round <= from_round; });
  return true;
}

}  // namespace archipelago
