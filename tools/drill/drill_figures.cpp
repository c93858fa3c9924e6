// The drill's figures: its samples (one way for both kinds of drill), and what
// the report says once the run is in.

#include <algorithm>

#include "chaos_monkey/chaos_wire.hpp"
#include "drill/drill.hpp"

namespace archipelago {

drill_sample sample_of(const status_board& board, const chaos_log& log, const mesh_setup& setup, double t_s) {
  drill_sample s;
  s.t_s = t_s;
  s.rounds = board.total(role::sync_broker).rounds_closed;
  s.published = board.total(role::parameter_shard).published;
  s.tokens = board.total(role::learner).tokens;
  if (const auto b = board.find(broker_address); b && b->now.report)
    s.merged_step_time_s = b->now.report->ledger.merged_step_time_s;
  s.learner_steps.assign(static_cast<std::size_t>(setup.cfg.mesh.learners), 0);
  s.shard_committed.assign(static_cast<std::size_t>(setup.policy.shards), 0);
  s.fragment_versions.assign(setup.fragments(), 0);
  for (const auto& e : board.entries()) {
    const node_address n = e.now.node;
    if (n.kind == role::learner && n.index < s.learner_steps.size()) s.learner_steps[n.index] = e.total().steps;
    if (n.kind != role::parameter_shard || n.index >= s.shard_committed.size()) continue;
    for (std::uint64_t v : e.now.committed_versions) s.shard_committed[n.index] += v;
    for (std::size_t p = 0; p < s.fragment_versions.size() && p < e.now.published_versions.size(); ++p)
      s.fragment_versions[p] = std::max(s.fragment_versions[p], e.now.published_versions[p]);
  }
  s.learners_down = log.learners_down.load();
  s.shards_down = log.shards_down.load();
  s.broker_down = log.broker_down.load();
  return s;
}

void first_merges::observe(const broker_report& report, nanos now) {
  for (const learner_record& rec : report.learners) {
    const nanos at = rec.first_merged_ns >= 0 ? rec.first_merged_ns : rec.ledger.merged > 0 ? now : -1;
    if (at < 0) continue;
    auto [it, fresh] = first_.try_emplace(rec.who, at);
    if (!fresh) it->second = std::min(it->second, at);
  }
}

void first_merges::apply(broker_report& report) const {
  for (learner_record& rec : report.learners)
    if (auto it = first_.find(rec.who); it != first_.end())
      rec.first_merged_ns = rec.first_merged_ns < 0 ? it->second : std::min(rec.first_merged_ns, it->second);
}

namespace {

/// When the first sample at or after `from_s` satisfies `reached`; -1: never.
template <class F>
double first_after(const std::vector<drill_sample>& samples, double from_s, F reached) {
  for (const auto& s : samples)
    if (s.t_s >= from_s && reached(s)) return s.t_s;
  return -1;
}

const drill_sample* sample_before(const std::vector<drill_sample>& samples, double t_s) {
  const drill_sample* out = nullptr;
  for (const auto& s : samples) {
    if (s.t_s > t_s) break;
    out = &s;
  }
  return out;
}

/// The share of the samples' span in which `value` kept changing: time beyond
/// `gap_s` without a change is stalled, whatever its cause.
template <class F>
double share_advancing(const std::vector<drill_sample>& s, double gap_s, F value) {
  if (s.size() < 2) return 1;
  double stalled_s = 0;
  for (std::size_t i = 1, since = 0; i < s.size(); ++i) {
    if (value(s[i]) != value(s[since])) since = i;
    else if (s[i].t_s - s[since].t_s > gap_s)
      stalled_s += std::min(s[i].t_s - s[i - 1].t_s, s[i].t_s - s[since].t_s - gap_s);
  }
  return 1 - stalled_s / (s.back().t_s - s.front().t_s);
}

/// Downtime: stretches longer than the gap without a new version of any
/// fragment while at least K learners were live, outside the broker's outages
/// (a crashed broker, until the first new version after its restart), which are
/// counted on their own. A shard's outage is no exemption: it pauses only its
/// own fragments (fragment availability shows it), the others keep publishing.
void measure_downtime(drill_report& r, const std::vector<planned_fault>& timeline) {
  std::vector<std::pair<double, double>> outages;
  const double end_s = r.samples.empty() ? 0 : r.samples.back().t_s;
  for (const auto& f : r.faults)
    if (!f.skipped && timeline[f.index].kind == fault_kind::broker_crash)
      outages.emplace_back(f.at_s, f.repaired_s < 0 || f.rejoin_s < 0 ? end_s : f.repaired_s + f.rejoin_s);
  auto in_outage = [&](double t) {
    return std::any_of(outages.begin(), outages.end(), [t](const auto& o) { return t >= o.first && t <= o.second; });
  };
  const auto& s = r.samples;
  r.uptime = share_advancing(s, r.downtime_gap_s, [](const drill_sample& x) { return x.published; });
  r.fragment_availability.clear();
  const std::size_t fragments = s.empty() ? 0 : s.front().fragment_versions.size();
  for (std::size_t p = 0; p < fragments; ++p)
    r.fragment_availability.push_back(share_advancing(s, r.fragment_gap_s, [p](const drill_sample& x) {
      return p < x.fragment_versions.size() ? x.fragment_versions[p] : 0;
    }));
  double sum = 0;
  for (double a : r.fragment_availability) sum += a;
  r.availability = r.fragment_availability.empty() ? r.uptime : sum / static_cast<double>(r.fragment_availability.size());
  std::size_t last_change = 0;
  for (std::size_t i = 1; i < s.size(); ++i) {
    const double dt = s[i].t_s - s[i - 1].t_s;
    if (in_outage(s[i].t_s) || s[i].broker_down) {
      r.broker_outage_s += dt;
      last_change = i;
      continue;
    }
    bool live = true;
    for (std::size_t j = last_change; j <= i; ++j) live = live && r.learners - s[j].learners_down >= r.quorum;
    if (s[i].published != s[last_change].published || !live) {
      last_change = i;
      continue;
    }
    if (s[i].t_s - s[last_change].t_s > r.downtime_gap_s)
      r.downtime_s += std::min(dt, s[i].t_s - s[last_change].t_s - r.downtime_gap_s);
  }
}

/// The final broker's record of a learner incarnation; null when it has none.
const learner_record* record_of(const drill_report& r, std::uint32_t learner, std::uint64_t inc) {
  for (const auto& rec : r.run.broker.learners)
    if (rec.who.learner.value == learner && rec.who.inc.value == inc) return &rec;
  return nullptr;
}

/// The timeline's rows: when each fault was injected and repaired, and how long
/// the restarted node took to be back at work.
void fault_rows(drill_report& r, const mesh_drill& drill, nanos drill_zero_ns) {
  const auto& timeline = drill.timeline;
  r.faults.resize(timeline.size());
  for (std::size_t i = 0; i < timeline.size(); ++i) {
    r.faults[i].index = i;
    r.faults[i].what = describe(timeline[i]);
    r.faults[i].at_s = static_cast<double>(timeline[i].at_ns) * 1e-9;
  }
  for (const chaos_event& e : drill.log.events) {
    drill_fault_row& row = r.faults[e.fault];
    const double t = static_cast<double>(e.at_ns) * 1e-9;
    if (e.action == chaos_action::what::inject) ++r.faults_injected;
    if (e.action == chaos_action::what::skip) {
      row.skipped = true;
      ++r.faults_skipped;
    }
    if (e.action == chaos_action::what::repair) row.repaired_s = t;
  }
  std::vector<bool> used(drill.restarts.size(), false);
  for (std::size_t i = 0; i < timeline.size(); ++i) {
    const planned_fault& f = timeline[i];
    drill_fault_row& row = r.faults[i];
    if (row.repaired_s < 0 || f.targets.empty() ||
        (f.kind != fault_kind::crash && f.kind != fault_kind::shard_crash && f.kind != fault_kind::broker_crash))
      continue;
    const fault_target& t = f.targets.front();
    // The restart this repair caused: the first unused one of that target at or after it.
    const mesh_drill::restart* restart = nullptr;
    for (std::size_t k = 0; k < drill.restarts.size() && !restart; ++k) {
      const auto& c = drill.restarts[k];
      if (used[k] || c.target.kind != t.kind || c.target.index != t.index ||
          static_cast<double>(c.at_ns) * 1e-9 < row.repaired_s - 0.001)
        continue;
      used[k] = true;
      restart = &c;
    }
    if (!restart) continue;
    const double at = static_cast<double>(restart->at_ns) * 1e-9;
    r.committed_rounds_lost += restart->versions_lost;
    if (t.kind == role::learner) {
      if (const learner_record* rec = record_of(r, t.index, restart->incarnation); rec && rec->first_merged_ns >= 0)
        row.rejoin_s = static_cast<double>(rec->first_merged_ns - drill_zero_ns) * 1e-9 - at;
    } else if (t.kind == role::parameter_shard) {
      const drill_sample* before = sample_before(r.samples, at);
      const std::uint64_t was = before && t.index < before->shard_committed.size() ? before->shard_committed[t.index] : 0;
      const double back = first_after(r.samples, at, [&](const drill_sample& s) {
        return t.index < s.shard_committed.size() && s.shard_committed[t.index] > was;
      });
      if (back >= 0) row.rejoin_s = back - at;
    } else {
      // The broker is back when the mesh publishes again: rounds that close without a
      // merge (the learners not rejoined yet) are not work.
      const drill_sample* before = sample_before(r.samples, at);
      const std::uint64_t was = before ? before->published : 0;
      const double back = first_after(r.samples, at, [&](const drill_sample& s) { return s.published > was; });
      if (back >= 0) row.rejoin_s = back - at;
    }
  }
}

}  // namespace

void finish_drill_report(drill_report& r, mesh_drill& drill, const config& cfg, const mesh_setup& layout) {
  nanos zero = 0;
  {
    std::lock_guard lock(drill.log.mutex);
    zero = drill.log.started_ns;
  }
  r.clock_zero_ns = zero;
  r.budget_overruns = r.run.budget_overruns;
  {
    std::lock_guard lock(drill.mutex);
    fault_rows(r, drill, zero);
    for (const auto& k : drill.killed) {
      const learner_record* rec = record_of(r, k.learner, k.incarnation);
      const std::uint64_t reported = rec ? rec->ledger.steps : 0;
      const auto tokens_per_step =
          static_cast<std::uint64_t>(learner_profile_of(cfg, static_cast<int>(k.learner)).batch) * layout.shape.context;
      if (k.steps > reported) r.unreported_tokens += (k.steps - reported) * tokens_per_step;
    }
  }
  // A fragment's turn comes every P rounds, a round every steps_per_round steps: one missed turn is allowed.
  r.fragment_gap_s = std::max(r.downtime_gap_s, 2e-3 * layout.fragments() * layout.policy.steps_per_round * r.step_time_ms);
  measure_downtime(r, drill.timeline);
  // Over the drill's own span: a restarted broker's report starts its span anew.
  auto goodput = [&](const mesh_summary& m) {
    return m.wall_s > 0 ? m.broker.ledger.merged_step_time_s / (cfg.mesh.learners * m.wall_s) : 0.0;
  };
  r.goodput = goodput(r.run);
  if (r.reference) r.reference_goodput = goodput(*r.reference);
  const ledger_totals& l = r.run.broker.ledger;
  r.ledger_exact = l.balanced() && l.processed + r.unreported_tokens == r.run.tokens;
}

}  // namespace archipelago
