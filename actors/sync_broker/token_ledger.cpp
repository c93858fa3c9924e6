#include "sync_broker/token_ledger.hpp"

#include <algorithm>

#include "core/invariant.hpp"

namespace archipelago {

token_ledger::token_ledger(std::vector<std::uint64_t> fragment_floats, std::uint64_t max_steps_per_learner,
                           std::size_t max_open_rounds)
    : fragment_floats_(std::move(fragment_floats)), floats_before_(fragment_floats_.size() + 1, 0),
      max_steps_(max_steps_per_learner), max_open_rounds_(max_open_rounds) {
  ARCHIPELAGO_INVARIANT(!fragment_floats_.empty(), "token ledger: at least one fragment");
  for (std::size_t p = 0; p < fragment_floats_.size(); ++p)
    floats_before_[p + 1] = floats_before_[p] + fragment_floats_[p];
  ARCHIPELAGO_INVARIANT(floats_before_.back() > 0, "token ledger: a model of at least one float");
}

std::uint64_t token_ledger::share(std::uint64_t tokens, std::uint32_t p) const {
  // ⌊tokens·F_{<p+1}/F⌋ − ⌊tokens·F_{<p}/F⌋: proportional, and the shares sum to tokens.
  using wide = unsigned __int128;
  const wide total = floats_before_.back();
  return static_cast<std::uint64_t>(wide{tokens} * floats_before_[p + 1] / total -
                                    wide{tokens} * floats_before_[p] / total);
}

token_ledger::learner_steps& token_ledger::of(learner_ref who) {
  learner_steps& l = learners_[who];
  if (l.fragments.empty()) {
    l.fragments.resize(fragments());
    l.window_floor.assign(fragments(), 0);
  }
  return l;
}

bool token_ledger::extend(learner_steps& l, std::uint64_t step) {
  // Only the steps after the frozen ones (restore()) have entries.
  if (step - l.frozen > max_steps_) {
    ++overflowed_steps_;
    return false;
  }
  if (l.steps.size() < step - l.frozen) {
    l.steps.resize(step - l.frozen);
    l.bucket.resize(l.steps.size() * fragments(), ledger_bucket::lost);
  }
  return true;
}

void token_ledger::count(learner_steps& l, const step_entry& e, std::uint32_t p, ledger_bucket bucket,
                         int sign) const {
  // Token counts stay exact: a bucket only ever gains what another loses.
  const std::uint64_t tokens = share(e.tokens, p);
  const double time_s = e.time_us * 1e-6 * weight(p);
  for (ledger_totals* t : {&l.totals, &l.fragments[p]}) {
    auto move = [&](std::uint64_t& field) { field = sign > 0 ? field + tokens : field - tokens; };
    switch (bucket) {
      case ledger_bucket::merged:
        move(t->merged);
        t->merged_step_time_s += time_s;  // merged is the best bucket: never left again
        break;
      case ledger_bucket::late: move(t->late); break;
      case ledger_bucket::rejected: move(t->rejected); break;
      case ledger_bucket::overwritten: move(t->overwritten); break;
      case ledger_bucket::lost: move(t->lost); break;
    }
  }
}

void token_ledger::raise(learner_steps& l, std::uint64_t index, std::uint32_t p, ledger_bucket bucket) {
  ledger_bucket& b = l.bucket[index * fragments() + p];
  if (bucket <= b) return;
  if (index + l.frozen < l.reported_step) {  // already counted: move its share to the better bucket
    count(l, l.steps[index], p, b, -1);
    count(l, l.steps[index], p, bucket, +1);
  }
  b = bucket;
}

void token_ledger::on_progress(learner_ref who, std::uint64_t step, std::uint64_t tokens_total, nanos step_time) {
  learner_steps& l = of(who);
  if (step <= l.reported_step || tokens_total < l.reported_tokens || !extend(l, step)) return;  // stale or reordered
  // Steps since the previous report share its tokens; the reported time is the last step's.
  const std::uint64_t gap = step - l.reported_step;
  const std::uint64_t tokens = tokens_total - l.reported_tokens;
  const auto time_us = static_cast<std::uint32_t>(std::clamp<nanos>(step_time / 1000, 0, UINT32_MAX));
  for (std::uint64_t k = 0; k < gap; ++k) {
    const std::uint64_t index = l.reported_step - l.frozen + k;
    step_entry& e = l.steps[index];
    e.tokens = static_cast<std::uint32_t>(tokens / gap + (k + 1 == gap ? tokens % gap : 0));
    e.time_us = time_us;
    // Counted now, each share in the bucket an outcome may already have given it.
    l.totals.processed += e.tokens;
    l.totals.step_time_s += e.time_us * 1e-6;
    ++l.totals.steps;
    for (std::uint32_t p = 0; p < fragments(); ++p) {
      ledger_totals& f = l.fragments[p];
      f.processed += share(e.tokens, p);
      f.step_time_s += e.time_us * 1e-6 * weight(p);
      ++f.steps;
      count(l, e, p, l.bucket[index * fragments() + p], +1);
    }
  }
  l.reported_step = step;
  l.reported_tokens = tokens_total;
}

void token_ledger::settle_below(learner_steps& l, std::uint32_t p, std::uint64_t start) {
  // Windows are cumulative since the learner's anchor: one starting at `start`
  // means the learner installed a newer version of p there, and p's work below
  // that no window covered was overwritten. Each step is settled once.
  std::uint64_t& floor = l.window_floor[p];
  if (floor == unknown_floor) {  // restored: what the previous broker saw last is unknown here
    floor = start;
    return;
  }
  for (std::uint64_t s = std::max(floor, l.frozen); s < start; ++s)
    if (l.bucket[(s - l.frozen) * fragments() + p] == ledger_bucket::lost)
      raise(l, s - l.frozen, p, ledger_bucket::overwritten);
  floor = std::max(floor, start);
}

void token_ledger::on_outcome(learner_ref who, fragment_index p, std::uint64_t step, std::uint64_t steps,
                              ledger_bucket bucket) {
  learner_steps& l = of(who);
  // Frozen steps (restore()) keep their stored bucket: only the window's part above them moves.
  if (p.value >= fragments() || steps > step || step <= l.frozen || !extend(l, step)) return;
  settle_below(l, p.value, step - steps);
  for (std::uint64_t s = std::max(step - steps, l.frozen); s < step; ++s) raise(l, s - l.frozen, p.value, bucket);
}

void token_ledger::on_arrival(round_number round, fragment_index p, learner_ref who, std::uint64_t step,
                              std::uint64_t steps) {
  if (closed_.count(round.value) != 0) return on_outcome(who, p, step, steps, ledger_bucket::late);
  learner_steps& l = of(who);
  if (p.value < fragments() && steps <= step && step > l.frozen && extend(l, step))
    settle_below(l, p.value, step - steps);
  if (open_.size() >= max_open_rounds_ && open_.count(round.value) == 0) open_.erase(open_.begin());
  open_[round.value].push_back({who, p.value, step, steps});
}

void token_ledger::on_round_closed(round_number round, const std::vector<learner_ref>& members, bool merged) {
  closed_.insert(round.value);
  if (closed_.size() > max_open_rounds_) closed_.erase(closed_.begin());
  auto it = open_.find(round.value);
  if (it == open_.end()) return;
  if (merged) {
    std::vector<arrival>& waiting = awaiting_[round.value];
    for (const arrival& a : it->second)
      if (std::find(members.begin(), members.end(), a.who) != members.end()) waiting.push_back(a);
    if (awaiting_.size() > max_open_rounds_) awaiting_.erase(awaiting_.begin());
  }
  open_.erase(it);
}

void token_ledger::on_round_published(round_number round) {
  auto it = awaiting_.find(round.value);
  if (it == awaiting_.end()) return;
  for (const arrival& a : it->second) on_outcome(a.who, {a.fragment}, a.step, a.steps, ledger_bucket::merged);
  awaiting_.erase(it);
}

void token_ledger::withdraw(round_number round, fragment_index p, learner_ref who) {
  auto drop = [&](std::map<std::uint64_t, std::vector<arrival>>& rounds) {
    auto it = rounds.find(round.value);
    if (it == rounds.end()) return;
    std::erase_if(it->second, [&](const arrival& a) { return a.who == who && a.fragment == p.value; });
  };
  drop(open_);
  drop(awaiting_);
}

ledger_tail token_ledger::tail_of(learner_ref who, std::uint64_t max_steps) const {
  ledger_tail tail;
  auto it = learners_.find(who);
  if (it == learners_.end()) return tail;
  const learner_steps& l = it->second;
  std::uint64_t start = l.reported_step;
  for (std::uint64_t floor : l.window_floor) start = std::min(start, floor == unknown_floor ? l.frozen : floor);
  start = std::max({start, l.frozen, l.reported_step > max_steps ? l.reported_step - max_steps : 0});
  for (std::uint64_t s = start; s < l.reported_step; ++s) {
    const std::uint64_t index = s - l.frozen;
    tail.tokens.push_back(l.steps[index].tokens);
    tail.time_us.push_back(l.steps[index].time_us);
    for (std::uint32_t p = 0; p < fragments(); ++p)
      tail.buckets.push_back(static_cast<std::uint8_t>(l.bucket[index * fragments() + p]));
  }
  return tail;
}

bool token_ledger::tail_fits(const ledger_tail& tail, const ledger_totals& totals,
                             const std::vector<ledger_totals>& by_fragment, std::uint64_t step) const {
  const std::size_t n = tail.tokens.size();
  if (n > step || n > max_steps_ || tail.time_us.size() != n || tail.buckets.size() != n * fragments()) return false;
  // Its shares are counted in the totals, each in its bucket: no bucket may hold less.
  std::vector<ledger_totals> in_tail(fragments());
  std::uint64_t tokens = 0;
  for (std::size_t i = 0; i < n; ++i) {
    tokens += tail.tokens[i];
    for (std::uint32_t p = 0; p < fragments(); ++p) {
      const std::uint64_t s = share(tail.tokens[i], p);
      switch (static_cast<ledger_bucket>(tail.buckets[i * fragments() + p])) {
        case ledger_bucket::lost: in_tail[p].lost += s; break;
        case ledger_bucket::overwritten: in_tail[p].overwritten += s; break;
        case ledger_bucket::rejected: in_tail[p].rejected += s; break;
        case ledger_bucket::late: in_tail[p].late += s; break;
        case ledger_bucket::merged: in_tail[p].merged += s; break;
        default: return false;
      }
    }
  }
  if (tokens > totals.processed) return false;
  for (std::uint32_t p = 0; p < fragments(); ++p) {
    const ledger_totals& a = in_tail[p];
    const ledger_totals& b = by_fragment[p];
    if (a.lost > b.lost || a.overwritten > b.overwritten || a.rejected > b.rejected || a.late > b.late ||
        a.merged > b.merged)
      return false;
  }
  return true;
}

bool token_ledger::restore(learner_ref who, const ledger_totals& totals, const std::vector<ledger_totals>& by_fragment,
                           std::uint64_t step, const ledger_tail& tail) {
  if (learners_.count(who) != 0 || totals.steps != step || !totals.balanced() || (step == 0 && totals.processed != 0) ||
      by_fragment.size() != fragments() || !tail_fits(tail, totals, by_fragment, step))
    return false;
  ledger_totals summed;
  for (const ledger_totals& f : by_fragment) {
    if (!f.balanced()) return false;
    summed += f;
  }
  if (summed.processed != totals.processed || summed.merged != totals.merged || summed.late != totals.late ||
      summed.overwritten != totals.overwritten || summed.lost != totals.lost || summed.rejected != totals.rejected)
    return false;
  learner_steps& l = of(who);
  l.reported_step = step;
  l.frozen = step - tail.tokens.size();
  l.reported_tokens = totals.processed;
  l.totals = totals;
  l.fragments = by_fragment;
  for (std::size_t i = 0; i < tail.tokens.size(); ++i) l.steps.push_back({tail.tokens[i], tail.time_us[i]});
  for (std::uint8_t b : tail.buckets) l.bucket.push_back(static_cast<ledger_bucket>(b));
  std::fill(l.window_floor.begin(), l.window_floor.end(), unknown_floor);
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

std::vector<ledger_totals> token_ledger::fragments_of(learner_ref who) const {
  auto it = learners_.find(who);
  return it == learners_.end() ? std::vector<ledger_totals>(fragments()) : it->second.fragments;
}

std::vector<ledger_totals> token_ledger::per_fragment() const {
  std::vector<ledger_totals> out(fragments());
  for (const auto& [who, l] : learners_)
    for (std::size_t p = 0; p < out.size(); ++p) out[p] += l.fragments[p];
  return out;
}

ledger_totals token_ledger::sum(const std::map<learner_ref, ledger_totals>& per_learner) {
  ledger_totals t;
  for (const auto& [who, l] : per_learner) t += l;
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
