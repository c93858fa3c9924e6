// The drill's figures: its samples (one way for both kinds of drill), and what
// the report says once the run is in.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "chaos_monkey/chaos_wire.hpp"
#include "drill/drill.hpp"
#include "node/mesh_snapshots.hpp"

namespace archipelago {

drill_sample sample_of(const status_board& board, const chaos_log& log, const mesh_setup& setup, double t_s) {
  drill_sample s;
  s.t_s = t_s;
  s.rounds = board.total(role::sync_broker).rounds_closed;
  s.published = board.total(role::parameter_shard).published;
  s.tokens = board.total(role::learner).tokens;
  if (const auto b = board.leading_broker(); b && b->now.report)
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
  std::uint32_t brokers = setup.brokers();
  for (const auto& e : board.entries())
    if (e.now.node.kind == role::sync_broker) brokers = std::max(brokers, e.now.node.index + 1);
  s.broker_epochs.assign(brokers, 0);
  s.broker_leading.assign(brokers, 0);
  for (const auto& e : board.entries())
    if (e.now.node.kind == role::sync_broker) {
      s.broker_epochs[e.now.node.index] = e.now.broker_epoch;
      s.broker_leading[e.now.node.index] = e.now.report.has_value();
    }
  if (const auto b = board.leading_broker(); b && b->now.report) {
    s.leader = static_cast<std::int32_t>(b->now.node.index);
    s.epoch = b->now.broker_epoch;
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
  // A leader taken away: until the first version under its successor, at most the bound.
  for (const auto& t : r.takeovers)
    outages.emplace_back(t.at_s, t.at_s + (t.back_s >= 0 ? std::min(t.back_s, r.takeover_bound_s) : r.takeover_bound_s));
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
  // Before its first version the mesh is starting, not down (with standbys, the
  // primary listens a liveness window before it leads).
  std::size_t first = 0;
  while (first < s.size() && s[first].published == 0) ++first;
  std::size_t last_change = first;
  for (std::size_t i = first + 1; i < s.size(); ++i) {
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

/// The brokers' tapes after the run: every merged round once (a standby's store
/// holds copies of its leader's records), each epoch's rounds, and the two ways a
/// deposed broker would show: a fragment version following one of a newer epoch
/// (or one version closed under two epochs), and an epoch's rounds closed after a
/// newer epoch's first.
void read_tapes(drill_report& r, const std::vector<std::string>& broker_dbs, logger& log) {
  struct closed {
    std::uint64_t epoch;
    std::int64_t closed_ns;
  };
  std::map<std::pair<std::uint32_t, std::uint64_t>, closed> rounds;  // (fragment, version) → its close
  for (const std::string& dir : broker_dbs) {
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) continue;  // its host is lost
    auto store = open_store_read_only(dir);
    if (!store) {
      log.error("drill.tape", "archipelago drill: cannot read the tape of %s: %s", dir.c_str(),
                store.err().message.c_str());
      continue;
    }
    (void)(*store)->for_each_tape([&](const storage::tape_record& t) {
      if (t.broker_epoch == 0) return true;  // an older writer's: no epoch to judge
      auto [it, fresh] = rounds.try_emplace({t.fragment, t.version}, closed{t.broker_epoch, t.closed_ns});
      if (!fresh && it->second.epoch != t.broker_epoch) ++r.deposed_merges;  // one version closed by two leaders
      return true;
    });
  }
  std::map<std::uint32_t, std::uint64_t> newest;  // per fragment: the epoch of its latest version so far
  std::map<std::uint64_t, drill_epoch> epochs;
  for (const auto& [key, c] : rounds) {  // in (fragment, version) order
    std::uint64_t& e = newest[key.first];
    if (c.epoch < e) ++r.deposed_merges;
    e = std::max(e, c.epoch);
    const double t = static_cast<double>(c.closed_ns - r.clock_zero_ns) * 1e-9;
    auto [it, fresh] = epochs.try_emplace(c.epoch, drill_epoch{c.epoch, leader_of_epoch(c.epoch), 0, t, t});
    ++it->second.rounds;
    it->second.first_closed_s = std::min(it->second.first_closed_s, t);
    it->second.last_closed_s = std::max(it->second.last_closed_s, t);
  }
  r.epochs.clear();
  for (const auto& [e, info] : epochs) r.epochs.push_back(info);
  for (const auto& [key, c] : rounds) {
    const double t = static_cast<double>(c.closed_ns - r.clock_zero_ns) * 1e-9;
    for (const drill_epoch& later : r.epochs)
      if (later.epoch > c.epoch && later.first_closed_s < t) {
        ++r.epochs_interleaved;
        break;
      }
  }
}

/// Whether fault `f` takes the broker `leader` away from the mesh: its host lost,
/// or a partition that leaves it without any shard (it can merge nothing).
bool takes_leader_away(const planned_fault& f, std::uint32_t leader) {
  if (f.kind == fault_kind::broker_host_lost) return true;
  if (f.kind != fault_kind::partition) return false;
  for (const auto& group : f.groups) {
    const bool has_leader = std::any_of(group.begin(), group.end(), [&](const fault_target& t) {
      return t.kind == role::sync_broker && t.index == leader;
    });
    if (has_leader)
      return std::none_of(group.begin(), group.end(), [](const fault_target& t) { return t.kind == role::parameter_shard; });
  }
  return false;
}

/// The takeovers: per fault that took the leader away (with standbys), who led
/// next, how soon its first round merged (tapes) and the mesh published again
/// (samples), and — a partition — when the deposed broker stepped down after the heal.
void find_takeovers(drill_report& r, const std::vector<planned_fault>& timeline) {
  r.takeovers.clear();
  if (r.standbys == 0) return;
  for (const drill_fault_row& row : r.faults) {
    const planned_fault& f = timeline[row.index];
    const drill_sample* before = sample_before(r.samples, row.at_s);
    const std::uint32_t leader = before && before->leader >= 0 ? static_cast<std::uint32_t>(before->leader) : 0;
    if (row.skipped || !takes_leader_away(f, leader)) continue;
    drill_takeover t;
    t.fault = row.index;
    t.at_s = row.at_s;
    t.deposed = leader;
    const std::uint64_t epoch_before = before ? before->epoch : 0;
    // The successor: the first epoch above the one before whose rounds began after the fault.
    for (const drill_epoch& e : r.epochs)
      if (e.epoch > epoch_before && e.broker != leader && e.first_closed_s >= row.at_s) {
        t.broker = e.broker;
        t.epoch = e.epoch;
        t.first_round_s = e.first_closed_s - row.at_s;
        break;
      }
    // Back: a version published after the successor was seen leading (not one the deposed
    // broker's last rounds left in flight), at the first sample that shows it.
    const auto successor = [&](const drill_sample& s) {
      return s.epoch > epoch_before && s.leader != static_cast<std::int32_t>(leader);
    };
    const double led = first_after(r.samples, row.at_s, successor);
    const drill_sample* at_lead = led >= 0 ? sample_before(r.samples, led) : nullptr;
    const double back = at_lead ? first_after(r.samples, led, [&](const drill_sample& s) {
      return successor(s) && s.published > at_lead->published;
    }) : -1;
    if (back >= 0) t.back_s = back - row.at_s;
    if (t.broker < 0)  // no tape names one (a lost tape copy): the samples' leader
      if (const drill_sample* s = back >= 0 ? sample_before(r.samples, back) : nullptr) {
        t.broker = s->leader;
        t.epoch = s->epoch;
      }
    if (f.kind == fault_kind::partition && row.repaired_s >= 0) {
      const double down = first_after(r.samples, row.repaired_s, [&](const drill_sample& s) {
        return leader < s.broker_leading.size() && !s.broker_leading[leader] && s.broker_epochs[leader] > epoch_before;
      });
      if (down >= 0) t.stepped_down_s = down - row.repaired_s;
    }
    r.takeovers.push_back(t);
  }
}

}  // namespace

void finish_drill_report(drill_report& r, mesh_drill& drill, const config& cfg, const mesh_setup& layout,
                         const std::vector<std::string>& broker_dbs, logger& log) {
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
  const double heartbeat_s = static_cast<double>(cfg.wire.heartbeat_interval_ms) * 1e-3;
  // The verdict on the leader, the last standby's stagger, then two stretches of what
  // any stall may last: the successor's greeting and first round, and its merge published.
  r.takeover_bound_s = heartbeat_s * static_cast<double>(cfg.wire.liveness) +
                       heartbeat_s * std::max(0, r.standbys - 1) + 2 * r.downtime_gap_s;
  read_tapes(r, broker_dbs, log);
  find_takeovers(r, drill.timeline);
  for (const drill_takeover& t : r.takeovers)  // a lost host's row: back at work once its successor publishes
    if (drill.timeline[t.fault].kind == fault_kind::broker_host_lost) r.faults[t.fault].rejoin_s = t.back_s;
  r.step_downs = r.run.broker_step_downs;
  measure_downtime(r, drill.timeline);
  // Over the drill's own span: a restarted broker's report starts its span anew.
  r.goodput = ledger_goodput(r.run.broker.ledger, cfg.mesh.learners, r.run.wall_s);
  if (r.reference)
    r.reference_goodput = ledger_goodput(r.reference->broker.ledger, cfg.mesh.learners, r.reference->wall_s);
  const ledger_totals& l = r.run.broker.ledger;
  r.ledger_exact = l.balanced() && l.processed + r.unreported_tokens == r.run.tokens;
}

}  // namespace archipelago
