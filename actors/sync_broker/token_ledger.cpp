#include "sync_broker/token_ledger.hpp"

#include <algorithm>

namespace archipelago {

token_ledger::token_ledger(std::uint64_t max_steps_per_learner, std::size_t max_open_rounds)
    : max_steps_(max_steps_per_learner), max_open_rounds_(max_open_rounds) {}

token_ledger::learner_steps& token_ledger::of(learner_ref who) { return learners_[who]; }

bool token_ledger::extend(learner_steps& l, std::uint64_t step) {
  // Only the steps after the frozen ones (restore()) have entries.
  if (step - l.frozen > max_steps_) {
    ++overflowed_steps_;
    return false;
  }
  if (l.steps.size() < step - l.frozen) l.steps.resize(step - l.frozen);
  return true;
}

void token_ledger::count(ledger_totals& t, const step_entry& e, ledger_bucket bucket, int sign) {
  // Token counts stay exact: a bucket only ever gains what another loses.
  const std::uint64_t tokens = e.tokens;
  auto move = [&](std::uint64_t& field) { field = sign > 0 ? field + tokens : field - tokens; };
  switch (bucket) {
    case ledger_bucket::merged:
      move(t.merged);
      t.merged_step_time_s += e.time_us * 1e-6;  // merged is the best bucket: never left again
      break;
    case ledger_bucket::late: move(t.late); break;
    case ledger_bucket::rejected: move(t.rejected); break;
    case ledger_bucket::lost: move(t.lost); break;
  }
}

void token_ledger::on_progress(learner_ref who, std::uint64_t step, std::uint64_t tokens_total, nanos step_time) {
  learner_steps& l = of(who);
  if (step <= l.reported_step || tokens_total < l.reported_tokens || !extend(l, step)) return;  // stale or reordered
  // Steps since the previous report share its tokens; the reported time is the last step's.
  const std::uint64_t gap = step - l.reported_step;
  const std::uint64_t tokens = tokens_total - l.reported_tokens;
  const auto time_us = static_cast<std::uint32_t>(std::clamp<nanos>(step_time / 1000, 0, UINT32_MAX));
  for (std::uint64_t k = 0; k < gap; ++k) {
    step_entry& e = l.steps[l.reported_step - l.frozen + k];
    e.tokens = static_cast<std::uint32_t>(tokens / gap + (k + 1 == gap ? tokens % gap : 0));
    e.time_us = time_us;
    // Counted now, in the bucket an outcome may already have given it.
    l.totals.processed += e.tokens;
    l.totals.step_time_s += e.time_us * 1e-6;
    ++l.totals.steps;
    count(l.totals, e, e.bucket, +1);
  }
  l.reported_step = step;
  l.reported_tokens = tokens_total;
}

void token_ledger::on_outcome(learner_ref who, std::uint64_t step, std::uint64_t steps, ledger_bucket bucket) {
  learner_steps& l = of(who);
  // Frozen steps (restore()) keep their stored bucket: only the window's part above them moves.
  if (steps > step || step <= l.frozen || !extend(l, step)) return;
  for (std::uint64_t s = std::max(step - steps, l.frozen); s < step; ++s) {
    step_entry& e = l.steps[s - l.frozen];
    if (bucket <= e.bucket) continue;
    if (s < l.reported_step) {  // already counted: move its tokens to the better bucket
      count(l.totals, e, e.bucket, -1);
      count(l.totals, e, bucket, +1);
    }
    e.bucket = bucket;
  }
}

void token_ledger::on_arrival(round_number round, learner_ref who, std::uint64_t step, std::uint64_t steps) {
  if (closed_.count(round.value) != 0) return on_outcome(who, step, steps, ledger_bucket::late);
  if (open_.size() >= max_open_rounds_ && open_.count(round.value) == 0) open_.erase(open_.begin());
  open_[round.value].push_back({who, step, steps});
}

void token_ledger::on_round_closed(round_number round, const std::vector<learner_ref>& members, bool merged) {
  closed_.insert(round.value);
  if (closed_.size() > max_open_rounds_) closed_.erase(closed_.begin());
  auto it = open_.find(round.value);
  if (it == open_.end()) return;
  if (merged) {
    for (const arrival& a : it->second)
      if (std::find(members.begin(), members.end(), a.who) != members.end())
        on_outcome(a.who, a.step, a.steps, ledger_bucket::merged);
  }
  open_.erase(it);
}

bool token_ledger::restore(learner_ref who, const ledger_totals& totals, std::uint64_t step) {
  if (learners_.count(who) != 0 || totals.steps != step || !totals.balanced() || (step == 0 && totals.processed != 0))
    return false;
  learner_steps& l = learners_[who];
  l.frozen = l.reported_step = step;
  l.reported_tokens = totals.processed;
  l.totals = totals;
  return true;
}

std::uint64_t token_ledger::frozen_steps(learner_ref who) const {
  auto it = learners_.find(who);
  return it == learners_.end() ? 0 : it->second.frozen;
}

std::map<learner_ref, ledger_totals> token_ledger::per_learner() const {
  std::map<learner_ref, ledger_totals> out;
  for (const auto& [who, l] : learners_) out[who] = l.totals;
  return out;
}

ledger_totals token_ledger::sum(const std::map<learner_ref, ledger_totals>& per_learner) {
  ledger_totals t;
  for (const auto& [who, l] : per_learner) {
    t.processed += l.processed;
    t.merged += l.merged;
    t.late += l.late;
    t.lost += l.lost;
    t.rejected += l.rejected;
    t.steps += l.steps;
    t.step_time_s += l.step_time_s;
    t.merged_step_time_s += l.merged_step_time_s;
  }
  return t;
}

double uptime_from_publications(const std::vector<nanos>& published_at, nanos start, nanos end, nanos stall_ns) {
  if (end <= start) return 1.0;
  nanos down = 0, previous = start;
  auto gap = [&](nanos until) {
    if (until > previous) down += std::max<nanos>(0, (until - previous) - stall_ns);
    previous = std::max(previous, until);
  };
  for (nanos t : published_at)
    if (t >= start && t <= end) gap(t);
  gap(end);
  return 1.0 - static_cast<double>(down) / static_cast<double>(end - start);
}

}  // namespace archipelago
