#include "sync_broker/broker_core.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/invariant.hpp"
#include "core/prng.hpp"

namespace archipelago {

namespace {

status invalid(std::string message) {
  return status(make_error(errc::invalid_input, std::move(message)));
}

bool same(const round_member& m, learner_index learner, incarnation inc) {
  return m.learner == learner && m.inc == inc;
}

}  // namespace

status validate(const broker_config& cfg) {
  if (cfg.fragments < 1) return invalid("broker fragments must be >= 1, got " + std::to_string(cfg.fragments));
  if (cfg.rounds_in_flight < 1) {
    return invalid("broker rounds_in_flight must be >= 1, got " + std::to_string(cfg.rounds_in_flight));
  }
  if (cfg.quorum < 1) return invalid("broker quorum must be >= 1, got " + std::to_string(cfg.quorum));
  if (!std::isfinite(cfg.grace_factor) || cfg.grace_factor < 0) {
    return invalid("broker grace_factor must be finite and >= 0, got " + std::to_string(cfg.grace_factor));
  }
  if (!std::isfinite(cfg.ema_alpha) || cfg.ema_alpha <= 0 || cfg.ema_alpha > 1) {
    return invalid("broker ema_alpha must be in (0, 1], got " + std::to_string(cfg.ema_alpha));
  }
  if (cfg.liveness_timeout_ns <= 0) {
    return invalid("broker liveness_timeout_ns must be > 0, got " + std::to_string(cfg.liveness_timeout_ns));
  }
  if (!std::isfinite(cfg.steps_per_round) || cfg.steps_per_round <= 0) {
    return invalid("broker steps_per_round must be finite and > 0, got " + std::to_string(cfg.steps_per_round));
  }
  if (cfg.round_timeout_ns <= 0) {
    return invalid("broker round_timeout_ns must be > 0, got " + std::to_string(cfg.round_timeout_ns));
  }
  if (cfg.storage_backlog < 0) {
    return invalid("broker storage_backlog must be >= 0, got " + std::to_string(cfg.storage_backlog));
  }
  if (cfg.shard_of_fragment.size() != static_cast<std::size_t>(cfg.fragments)) {
    return invalid("broker shard_of_fragment must have one entry per fragment (" +
                   std::to_string(cfg.fragments) + "), got " +
                   std::to_string(cfg.shard_of_fragment.size()));
  }
  return status::ok();
}

const char* to_string(close_reason reason) {
  switch (reason) {
    case close_reason::all_eligible: return "all_eligible";
    case close_reason::grace_expired: return "grace_expired";
    case close_reason::timeout: return "timeout";
  }
  return "unknown";
}

broker_core::broker_core(broker_config cfg) : cfg_(std::move(cfg)), next_round_(cfg_.first_round) {
  ARCHIPELAGO_INVARIANT(validate(cfg_).has_value(), "broker core: a validated config");
  // As if the cycle before first_round had been round-robin: fragment first_round mod P is the stalest.
  const auto p_count = static_cast<std::int64_t>(cfg_.fragments);
  const auto first = static_cast<std::int64_t>(cfg_.first_round);
  last_turn_.resize(cfg_.fragments);
  for (std::int64_t p = 0; p < p_count; ++p) last_turn_[p] = first - p_count + ((p - first) % p_count + p_count) % p_count;
  std::uint32_t shards = 0;
  for (std::uint32_t s : cfg_.shard_of_fragment) shards = std::max(shards, s + 1);
  shard_live_.assign(shards, true);
}

expected<broker_core> broker_core::create(broker_config cfg) {
  if (auto ok = validate(cfg); !ok) return ok.err();
  return broker_core(std::move(cfg));
}

std::vector<broker_effect> broker_core::take_effects() {
  std::vector<broker_effect> out;
  out.swap(effects_);
  return out;
}

// ---- learners ---------------------------------------------------------------

void broker_core::reset_learner(learner_state& st, incarnation inc, nanos now) {
  st = learner_state{};
  st.inc = inc;
  st.last_heard_ns = now;
}

void broker_core::update_ema(double& ema, bool& has, double sample) const {
  ema = has ? cfg_.ema_alpha * sample + (1 - cfg_.ema_alpha) * ema : sample;
  has = true;
}

// Any message is a heartbeat. An unknown learner or a higher incarnation is an
// implicit (re)join, so a reordered join/progress pair cannot lose a learner.
broker_core::learner_state* broker_core::admit(learner_index learner, incarnation inc, nanos now) {
  auto it = learners_.find(learner);
  if (it == learners_.end()) {
    reset_learner(learners_[learner], inc, now);
    return &learners_[learner];
  }
  learner_state& st = it->second;
  if (inc < st.inc || (inc == st.inc && st.departed)) {
    ++counters_.stale;
    return nullptr;
  }
  if (inc > st.inc) {
    reset_learner(st, inc, now);
    return &st;
  }
  st.last_heard_ns = std::max(st.last_heard_ns, now);
  st.live = true;  // a learner declared dead that speaks again is back
  return &st;
}

void broker_core::on_join(learner_index learner, incarnation inc, nanos now) {
  admit(learner, inc, now);
}

void broker_core::on_leave(learner_index learner, incarnation inc, nanos now) {
  auto it = learners_.find(learner);
  if (it != learners_.end() && inc < it->second.inc) {
    ++counters_.stale;
    return;
  }
  learner_state& st = learners_[learner];
  if (it == learners_.end() || inc > st.inc) reset_learner(st, inc, now);
  st.departed = true;
  st.live = false;
  check_closes(now);  // open rounds stop waiting for it
}

claim_bound bound_claim(std::uint64_t claimed_tokens, std::uint64_t claimed_steps, std::uint64_t reported_steps,
                        std::uint64_t reported_tokens, std::uint64_t tokens_per_step_max) {
  // One step of slack: the Progress of the step a contribution was sent at may
  // still be on its way (or lost) when the round closes; an honest learner's claim
  // is never cut, a liar gains at most one step's tokens.
  claim_bound b;
  b.steps = std::min(claimed_steps, reported_steps + 1);
  b.tokens = claimed_tokens;
  if (tokens_per_step_max != 0 && b.steps <= UINT64_MAX / tokens_per_step_max) {
    b.tokens = std::min(b.tokens, b.steps * tokens_per_step_max);
    b.tokens = std::min(b.tokens, reported_tokens + tokens_per_step_max);
  } else {
    b.tokens = std::min(b.tokens, reported_tokens);
  }
  return b;
}

std::uint64_t broker_core::tokens_per_step_max(learner_index learner) const {
  const auto& v = cfg_.tokens_per_step_max;
  if (v.empty()) return 0;
  return learner.value < v.size() ? v[learner.value] : v.back();
}

void broker_core::bound_members(std::vector<round_member>& members) {
  for (round_member& m : members) {
    m.bounded_tokens = m.tokens;
    m.bounded_steps = m.steps;
    if (!cfg_.bound_claims) continue;
    auto it = learners_.find(m.learner);
    const bool known = it != learners_.end() && it->second.inc == m.inc;
    const claim_bound b = bound_claim(m.tokens, m.steps, known ? it->second.steps_done : 0,
                                      known ? it->second.tokens_done : 0, tokens_per_step_max(m.learner));
    if (b.tokens != m.tokens || b.steps != m.steps) ++counters_.claims_cut;
    m.bounded_tokens = b.tokens;
    m.bounded_steps = b.steps;
    const auto t = static_cast<double>(b.tokens);
    m.weight = b.steps == 0 ? 0.0 : t * t / static_cast<double>(b.steps);
  }
}

void broker_core::on_progress(learner_index learner, incarnation inc, std::uint64_t steps_done,
                              nanos step_time_ns, nanos now, std::uint64_t tokens_done, bool finished) {
  learner_state* st = admit(learner, inc, now);
  if (st == nullptr) return;
  st->steps_done = std::max(st->steps_done, steps_done);
  st->tokens_done = std::max(st->tokens_done, tokens_done);
  if (finished && !st->finished) {
    st->finished = true;
    check_closes(now);  // rounds it held no work for wait for it no longer
  }
  if (step_time_ns < 0) return;
  const auto sample = static_cast<double>(step_time_ns);
  update_ema(st->step_ema_ns, st->has_step_ema, sample);
  const learner_ref self{learner, inc};
  if (std::find(quorum_set_.begin(), quorum_set_.end(), self) != quorum_set_.end()) {
    update_ema(pooled_step_ema_ns_, has_pooled_step_ema_, sample);
  }
}

bool broker_core::is_live(learner_index learner) const {
  auto it = learners_.find(learner);
  return it != learners_.end() && it->second.live && !it->second.departed;
}

bool broker_core::has_departed(learner_index learner) const {
  auto it = learners_.find(learner);
  return it != learners_.end() && it->second.departed;
}

std::vector<member_view> broker_core::members() const {
  std::vector<member_view> out;
  for (const auto& [index, st] : learners_)
    out.push_back({index, st.inc, st.live, st.departed, is_eligible(index), st.last_heard_ns, st.steps_done,
                   st.has_step_ema ? st.step_ema_ns : 0.0});
  return out;
}

bool broker_core::may_contribute(const learner_state& st, std::uint32_t fragment) {
  if (!st.finished) return true;
  auto it = st.contributed_step.find(fragment);
  return st.steps_done > (it == st.contributed_step.end() ? 0 : it->second);
}

void broker_core::on_contributed(learner_index learner, incarnation inc, fragment_index p, std::uint64_t step,
                                 nanos now) {
  auto it = learners_.find(learner);
  if (it == learners_.end() || it->second.inc != inc || p.value >= static_cast<std::uint32_t>(cfg_.fragments)) return;
  std::uint64_t& latest = it->second.contributed_step[p.value];
  latest = std::max(latest, step);
  if (it->second.finished) check_closes(now);
}

bool broker_core::is_eligible(learner_index learner) const {
  auto it = learners_.find(learner);
  return is_live(learner) && it->second.steps_done >= 1;
}

std::vector<learner_ref> broker_core::eligible_now() const {
  std::vector<learner_ref> out;
  for (const auto& [index, st] : learners_) {
    if (is_eligible(index)) out.push_back({index, st.inc});
  }
  return out;
}

std::vector<learner_ref> broker_core::eligible_for(std::uint32_t fragment) const {
  std::vector<learner_ref> out = eligible_now();
  std::erase_if(out, [&](const learner_ref& l) { return !may_contribute(learners_.at(l.learner), fragment); });
  return out;
}

std::optional<nanos> broker_core::xi_step_ns() const {
  // The pooled estimate holds while someone of the last quorum is still around.
  if (has_pooled_step_ema_) {
    for (const auto& ref : quorum_set_) {
      auto it = learners_.find(ref.learner);
      if (it != learners_.end() && it->second.inc == ref.inc && it->second.live &&
          !it->second.departed) {
        return std::llround(pooled_step_ema_ns_);
      }
    }
  }
  std::optional<double> fastest;
  for (const auto& [index, st] : learners_) {
    if (!st.live || st.departed || !st.has_step_ema) continue;
    if (!fastest || st.step_ema_ns < *fastest) fastest = st.step_ema_ns;
  }
  if (!fastest) return std::nullopt;
  return std::llround(*fastest);
}

// ---- rounds -----------------------------------------------------------------

void broker_core::on_contribution(round_number round, learner_index learner, incarnation inc,
                                  std::uint64_t tokens, std::uint64_t steps, nanos now) {
  if (admit(learner, inc, now) == nullptr) return;
  const std::uint64_t r = round.value;
  if (r >= next_round_) {
    ++counters_.unknown_round;
    return;
  }
  auto it = open_.find(r);
  if (it == open_.end()) {
    // Closed already: late, unless it is a repeat of something we have seen.
    if (round_record* rec = find_record_mut(r)) {
      const learner_ref self{learner, inc};
      const bool seen =
          std::any_of(rec->members.begin(), rec->members.end(),
                      [&](const round_member& m) { return same(m, learner, inc); }) ||
          std::find(rec->late.begin(), rec->late.end(), self) != rec->late.end();
      if (seen) {
        ++counters_.duplicates;
        return;
      }
      rec->late.push_back(self);
    } else if (r < cfg_.first_round) {
      ++counters_.previous_broker;  // its round died with the broker that opened it
    }
    ++counters_.late;
    effects_.push_back(late_contribution{round, learner, inc, tokens});
    return;
  }
  round_state& rs = it->second;
  if (std::any_of(rs.members.begin(), rs.members.end(),
                  [&](const round_member& m) { return same(m, learner, inc); })) {
    ++counters_.duplicates;
    return;
  }
  if (steps == 0) {  // tokens² / steps is undefined; the shard would reject the merge
    ++counters_.rejected;
    return;
  }
  const auto t = static_cast<double>(tokens);
  rs.members.push_back({learner, inc, t * t / static_cast<double>(steps), tokens, steps});
  if (rs.quorum_ns < 0 && rs.members.size() >= static_cast<std::size_t>(rs.quorum)) {
    reach_quorum(rs, now);
  }
  check_closes(now);
}

void broker_core::reach_quorum(round_state& rs, nanos now) {
  rs.quorum_ns = now;
  update_ema(xi_quorum_ns_, has_xi_quorum_, static_cast<double>(now - rs.opened_ns));
  quorum_set_.clear();
  for (const auto& m : rs.members) quorum_set_.push_back({m.learner, m.inc});
  if (!cfg_.adaptive_grace || cfg_.wait_for_all) {
    rs.grace_ns = 0;  // no grace, or unbounded (wait_for_all closes on completeness only)
    return;
  }
  const double step = static_cast<double>(xi_step_ns().value_or(0));
  const double raw = rs.grace_factor *
                     (cfg_.rounds_in_flight * step - xi_quorum_ns_ - xi_sync_ns_);
  rs.grace_ns = std::llround(std::clamp(raw, 0.0, step));
}

bool broker_core::anyone_may_answer(const round_state& rs) const {
  return std::any_of(rs.eligible.begin(), rs.eligible.end(), [&](const learner_ref& e) {
    // Only one that left, or finished without work on the fragment, cannot: a dead
    // learner may come back (a partition heals) and answer, as before its timeout.
    auto it = learners_.find(e.learner);
    return it == learners_.end() || it->second.inc != e.inc ||
           (!it->second.departed && may_contribute(it->second, rs.fragment));
  });
}

bool broker_core::all_eligible_in(const round_state& rs) const {
  for (const auto& e : rs.eligible) {
    auto it = learners_.find(e.learner);
    // Dead, departed or reincarnated learners are no longer waited for, nor finished
    // ones without work on the fragment.
    const bool awaited = it != learners_.end() && it->second.inc == e.inc && it->second.live &&
                         !it->second.departed && may_contribute(it->second, rs.fragment);
    if (!awaited) continue;
    const bool in = std::any_of(rs.members.begin(), rs.members.end(),
                                [&](const round_member& m) { return same(m, e.learner, e.inc); });
    if (!in) return false;
  }
  return true;
}

void broker_core::check_closes(nanos now) {
  for (auto it = open_.begin(); it != open_.end();) {
    const round_state& rs = it->second;
    if (rs.quorum_ns >= 0 && all_eligible_in(rs)) {
      it = close(it, close_reason::all_eligible, now);
    } else if (rs.quorum_ns >= 0 && !cfg_.wait_for_all && now >= rs.quorum_ns + rs.grace_ns) {
      it = close(it, close_reason::grace_expired, now);
    } else if (now - rs.opened_ns >= cfg_.round_timeout_ns) {
      it = close(it, close_reason::timeout, now);
    } else if (rs.quorum_ns < 0 && !anyone_may_answer(rs)) {
      // Every learner it waits for left, or finished without work on its fragment:
      // held to its timeout, it would keep its shard's fragments with work (a
      // flushing learner's last steps) from their turns until that learner gives up.
      ++counters_.rounds_unanswerable;
      it = close(it, close_reason::timeout, now);
    } else if (auto merged = newest_merged_.find(rs.fragment);
               rs.quorum_ns < 0 && merged != newest_merged_.end() && merged->second > rs.round) {
      // Its fragment moved on: the shard takes contributions to it as late from
      // now on, so it can never reach the quorum. Waiting for its timeout would
      // hold one of the τ slots that long: a round whose RoundOpen or
      // contributions were lost stalled the whole mesh (the corruption drill).
      // Closed without a merge, as its timeout would close it.
      ++counters_.rounds_superseded;
      it = close(it, close_reason::timeout, now);
    } else {
      ++it;
    }
  }
}

std::map<std::uint64_t, broker_core::round_state>::iterator broker_core::close(
    std::map<std::uint64_t, round_state>::iterator it, close_reason reason, nanos now) {
  round_state& rs = it->second;
  switch (reason) {
    case close_reason::all_eligible: ++counters_.closed_all_eligible; break;
    case close_reason::grace_expired: ++counters_.closed_grace_expired; break;
    case close_reason::timeout: ++counters_.closed_timeout; break;
  }
  round_record rec;
  rec.round = round_number{rs.round};
  rec.fragment = fragment_index{rs.fragment};
  rec.opened_ns = rs.opened_ns;
  rec.quorum_ns = rs.quorum_ns;
  rec.grace_ns = rs.grace_ns;
  rec.closed_ns = now;
  rec.reason = reason;
  bound_members(rs.members);
  rec.members = rs.members;
  for (const auto& [index, st] : learners_) {
    const bool member = std::any_of(rs.members.begin(), rs.members.end(),
                                    [&](const round_member& m) { return m.learner == index; });
    rec.live += (st.live && !st.departed) || member;
  }
  const std::uint32_t rec_live = rec.live;
  history_.push_back(std::move(rec));
  if (history_.size() > history_capacity) history_.pop_front();
  if (rs.quorum_ns >= 0) {
    std::uint64_t& newest = newest_merged_[rs.fragment];
    newest = std::max(newest, rs.round);
    unpublished_[rs.fragment] = {rs.round, now};
  }

  effects_.push_back(close_round{round_number{rs.round}, fragment_index{rs.fragment}, rs.shard,
                                 std::move(rs.members), reason, rs.quorum_ns, rs.grace_ns, rec_live});
  return open_.erase(it);
}

std::uint32_t broker_core::undurable_versions(std::uint32_t shard, nanos now) const {
  // A notice lost on the way is not waited for beyond the round timeout.
  return static_cast<std::uint32_t>(std::count_if(unpublished_.begin(), unpublished_.end(), [&](const auto& u) {
    return cfg_.shard_of_fragment[u.first] == shard && now - u.second.second < cfg_.round_timeout_ns;
  }));
}

broker_core::turn broker_core::turn_of(std::uint32_t fragment, std::uint32_t shard, nanos now) const {
  if (!is_shard_live(shard)) return turn::shard_silent;
  // Durable before visible: the fragment's last merge is not published yet (a
  // notice lost on the way is not waited for beyond the round timeout).
  if (auto u = unpublished_.find(fragment); u != unpublished_.end() && now - u->second.second < cfg_.round_timeout_ns)
    return turn::not_durable;
  // Back-pressure: the shard's storage is behind; a round more would only queue another version.
  if (cfg_.storage_backlog > 0 && undurable_versions(shard, now) >= static_cast<std::uint32_t>(cfg_.storage_backlog))
    return turn::storage_busy;
  const auto in_flight = std::count_if(open_.begin(), open_.end(), [&](const auto& r) { return r.second.shard == shard; });
  if (!cfg_.wait_for_all && in_flight >= cfg_.rounds_in_flight) return turn::shard_busy;
  if (eligible_for(fragment).size() < static_cast<std::size_t>(cfg_.quorum)) return turn::no_work;
  return turn::open;
}

bool broker_core::waits_for(turn t) const {
  // A busy shard is waited for where waiting holds no other shard back (one
  // shard); the synchronous modes, whose learners wait for every fragment, wait
  // for durability. Otherwise the turn passes: the other fragments keep their pace.
  const bool one_shard = shard_live_.size() <= 1;
  const bool busy = t == turn::shard_busy || t == turn::storage_busy;
  const bool undurable = t == turn::not_durable || t == turn::storage_busy;
  return (busy && one_shard) || (undurable && cfg_.wait_for_all);
}

void broker_core::note_held_for_storage() {
  if (storage_held_turn_ == next_round_) return;
  storage_held_turn_ = next_round_;
  ++counters_.rounds_held_for_storage;
}

void broker_core::open_due_rounds(nanos now) {
  // Bounded: one pass over the fragments' turns at most (with ξ_step = 0 every turn is due).
  for (int skipped = 0; skipped < cfg_.fragments;) {
    // The synchronous modes keep τ rounds in flight in all; decoupled τ per shard (turn_of).
    if (cfg_.wait_for_all && open_.size() >= static_cast<std::size_t>(cfg_.rounds_in_flight)) return;
    // Rounds go on while at least K learners can contribute; below that they pause.
    if (eligible_now().size() < static_cast<std::size_t>(cfg_.quorum)) return;
    const std::optional<nanos> step = xi_step_ns();
    if (!step) return;
    if (any_opened_ && now < last_open_ns_ + std::llround(static_cast<double>(*step) * cfg_.steps_per_round)) return;

    if (cfg_.order == fragment_order::stalest) {
      // Every turn goes to a fragment that can take it: a paused fragment's turns go to
      // the others meanwhile, and once it can open again it is the stalest, so it goes first.
      const std::optional<std::uint32_t> fragment = stalest_open_fragment(now);
      if (!fragment) return;
      open_round_for(*fragment, now);
      continue;
    }
    const std::uint32_t fragment = fragment_of_turn(next_round_);
    const std::uint32_t shard = cfg_.shard_of_fragment[fragment];
    if (const turn t = turn_of(fragment, shard, now); t != turn::open) {
      // A paused fragment (its shard silent or its storage behind, or its last
      // merge not durable yet) is skipped: the others keep their turns (not
      // synced more often), unless the turn is waited for (waits_for).
      if (t == turn::storage_busy) note_held_for_storage();
      if (waits_for(t)) return;
      ++next_round_;
      last_open_ns_ = now;
      any_opened_ = true;
      ++counters_.rounds_skipped;
      ++skipped;
      continue;
    }
    open_round_for(fragment, now);
  }
}

std::uint32_t broker_core::fragment_of_turn(std::uint64_t round) {
  const auto p_count = static_cast<std::uint64_t>(cfg_.fragments);
  if (cfg_.order != fragment_order::shuffled) return static_cast<std::uint32_t>(round % p_count);
  // A function of the round alone, so a restarted broker keeps its predecessor's order.
  if (const std::uint64_t cycle = round / p_count; cycle != shuffled_cycle_) {
    shuffled_order_.resize(p_count);
    for (std::uint32_t p = 0; p < p_count; ++p) shuffled_order_[p] = p;
    prng rng(derive_seed(cfg_.order_seed, cycle));
    for (std::uint64_t i = p_count; i > 1; --i) std::swap(shuffled_order_[i - 1], shuffled_order_[rng.below(i)]);
    shuffled_cycle_ = cycle;
  }
  return shuffled_order_[round % p_count];
}

std::optional<std::uint32_t> broker_core::stalest_open_fragment(nanos now) {
  std::vector<std::uint32_t> by_age(static_cast<std::size_t>(cfg_.fragments));
  for (std::uint32_t p = 0; p < by_age.size(); ++p) by_age[p] = p;
  std::sort(by_age.begin(), by_age.end(), [&](std::uint32_t a, std::uint32_t b) { return last_turn_[a] < last_turn_[b]; });
  bool stalest = true;
  for (std::uint32_t p : by_age) {
    const turn t = turn_of(p, cfg_.shard_of_fragment[p], now);
    if (t == turn::open) return p;
    if (t == turn::storage_busy && stalest) note_held_for_storage();  // the turn goes elsewhere, or waits
    stalest = false;
    // As in round-robin: a busy shard alone is waited for, the synchronous modes wait for durability.
    if (waits_for(t)) return std::nullopt;
  }
  return std::nullopt;
}

void broker_core::open_round_for(std::uint32_t fragment, nanos now) {
  std::vector<learner_ref> eligible = eligible_for(fragment);
  round_state rs;
  rs.round = next_round_++;
  rs.fragment = fragment;
  rs.shard = cfg_.shard_of_fragment[fragment];
  rs.opened_ns = now;
  rs.eligible = eligible;
  rs.quorum = cfg_.quorum;
  rs.grace_factor = cfg_.grace_factor;
  last_turn_[fragment] = static_cast<std::int64_t>(rs.round);
  last_open_ns_ = now;
  any_opened_ = true;
  ++counters_.rounds_opened;
  effects_.push_back(open_round{round_number{rs.round}, fragment_index{rs.fragment}, rs.shard, std::move(eligible)});
  open_.emplace(rs.round, std::move(rs));
}

void broker_core::mark_dead(learner_index index, learner_state& st) {
  st.live = false;
  ++counters_.learners_dead;
  effects_.push_back(learner_dead{index, st.inc});
}

void broker_core::abort_rounds_of(std::uint32_t shard, nanos now) {
  for (auto it = open_.begin(); it != open_.end();) {
    if (it->second.shard != shard) {
      ++it;
      continue;
    }
    it->second.quorum_ns = -1;  // merge() is false: the shard merges nothing
    ++counters_.rounds_aborted;
    it = close(it, close_reason::timeout, now);
  }
}

void broker_core::on_shard_restarted(std::uint32_t shard, nanos now) {
  abort_rounds_of(shard, now);
  std::erase_if(unpublished_, [&](const auto& u) { return cfg_.shard_of_fragment[u.first] == shard; });
  if (shard < shard_live_.size()) shard_live_[shard] = true;
  open_due_rounds(now);
}

void broker_core::on_shard_lost(std::uint32_t shard, nanos now) {
  if (!is_shard_live(shard)) return;
  shard_live_[shard] = false;
  ++counters_.shards_lost;
  abort_rounds_of(shard, now);
  open_due_rounds(now);
}

void broker_core::on_shard_alive(std::uint32_t shard, nanos now) {
  if (shard >= shard_live_.size() || shard_live_[shard]) return;
  shard_live_[shard] = true;
  open_due_rounds(now);
}

void broker_core::on_peer_lost(learner_index learner, nanos now) {
  auto it = learners_.find(learner);
  if (it == learners_.end() || !it->second.live || it->second.departed) return;
  mark_dead(learner, it->second);
  check_closes(now);
}

void broker_core::on_peer_alive(learner_index learner, nanos now) {
  auto it = learners_.find(learner);
  if (it == learners_.end() || it->second.departed) return;
  admit(learner, it->second.inc, now);
}

expected<round_number> broker_core::reconfigure(int quorum, double grace_factor) {
  broker_config next = cfg_;
  next.quorum = quorum;
  next.grace_factor = grace_factor;
  if (auto ok = validate(next); !ok) return ok.err();
  cfg_ = std::move(next);
  return round_number{next_round_};
}

void broker_core::tick(nanos now) {
  // The message timeout is a backstop behind the transport's verdict (peer_dead). A
  // learner that has not stepped yet sends nothing while it downloads the model, which
  // takes minutes over a slow link: only the transport judges it.
  for (auto& [index, st] : learners_) {
    if (st.live && !st.departed && st.steps_done > 0 && now - st.last_heard_ns >= cfg_.liveness_timeout_ns)
      mark_dead(index, st);
  }
  check_closes(now);
  open_due_rounds(now);
}

// ---- publications and the tape --------------------------------------------------

void broker_core::on_published(round_number round, fragment_index fragment, std::uint64_t version,
                               nanos now) {
  if (auto u = unpublished_.find(fragment.value); u != unpublished_.end() && u->second.first <= round.value)
    unpublished_.erase(u);  // durable and visible: its next round may open
  round_record* rec = find_record_mut(round.value);
  if (rec == nullptr || rec->fragment != fragment) {
    ++counters_.unknown_round;
    return;
  }
  if (rec->published_ns >= 0) return;  // repeated notice: ξ_sync already has it
  rec->published_ns = now;
  rec->published_version = version;
  update_ema(xi_sync_ns_, has_xi_sync_, static_cast<double>(std::max<nanos>(0, now - rec->closed_ns)));
}

round_record* broker_core::find_record_mut(std::uint64_t round) {
  // Rounds close nearly in order, so the match is near the back.
  for (auto it = history_.rbegin(); it != history_.rend(); ++it) {
    if (it->round.value == round) return &*it;
  }
  return nullptr;
}

void broker_core::on_member_rejected(round_number round, fragment_index fragment, learner_ref who) {
  round_record* rec = find_record_mut(round.value);
  if (rec == nullptr || rec->fragment != fragment) return;
  auto it = std::find_if(rec->members.begin(), rec->members.end(),
                         [&](const round_member& m) { return m.learner == who.learner && m.inc == who.inc; });
  if (it == rec->members.end()) return;
  rec->screened_out.push_back(*it);
  rec->members.erase(it);
}

const round_record* broker_core::find_record(round_number round) const {
  return const_cast<broker_core*>(this)->find_record_mut(round.value);
}

}  // namespace archipelago
