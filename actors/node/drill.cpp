#include "node/drill.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "learner/model/trainer.hpp"

namespace archipelago {
namespace {

namespace fs = std::filesystem;

}  // namespace

config drill_config(const config& base, const fault_plan_spec& plan, double step_time_ms) {
  config cfg = base;
  cfg.wire.accept_chaos = true;
  cfg.mesh.step_time_ms = step_time_ms;
  const double total_s = static_cast<double>(plan.duration_ns + plan.liveness_ns) * 1e-9;
  cfg.train.time_limit_s = total_s;
  // The schedule spans the drill: a paced step never takes less than the budget.
  cfg.train.steps = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(total_s * 1000 / step_time_ms)));
  return cfg;
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

/// Downtime: stretches longer than the gap without a new version while at least
/// K learners were live, outside the broker's outages (a crashed broker, until
/// the first new version after its restart), which are counted on their own.
void measure_downtime(drill_report& r, const std::vector<planned_fault>& timeline) {
  std::vector<std::pair<double, double>> outages;
  const double end_s = r.samples.empty() ? 0 : r.samples.back().t_s;
  for (const auto& f : r.faults)
    if (!f.skipped && timeline[f.index].kind == fault_kind::broker_crash)
      outages.emplace_back(f.at_s, f.repaired_s < 0 || f.rejoin_s < 0 ? end_s : f.repaired_s + f.rejoin_s);
  // Across processes a shard's restart is a process start (its store opened, the mesh
  // rejoined: about 2 s) in which no fragment version is published: counted on its own too.
  std::vector<std::pair<double, double>> shard_outages;
  if (r.processes)
    for (const auto& f : r.faults)
      if (!f.skipped && timeline[f.index].kind == fault_kind::shard_crash)
        shard_outages.emplace_back(f.at_s, f.repaired_s < 0 || f.rejoin_s < 0 ? end_s : f.repaired_s + f.rejoin_s);
  auto within = [](const std::vector<std::pair<double, double>>& spans, double t) {
    return std::any_of(spans.begin(), spans.end(), [t](const auto& o) { return t >= o.first && t <= o.second; });
  };
  auto in_outage = [&](double t) { return within(outages, t); };
  const auto& s = r.samples;
  // Uptime counts every stall, whatever its cause: time beyond the gap without a new version.
  double stalled_s = 0;
  for (std::size_t i = 1, since = 0; i < s.size(); ++i) {
    if (s[i].published != s[since].published) since = i;
    else if (s[i].t_s - s[since].t_s > r.downtime_gap_s)
      stalled_s += std::min(s[i].t_s - s[i - 1].t_s, s[i].t_s - s[since].t_s - r.downtime_gap_s);
  }
  if (s.size() > 1) r.uptime = 1 - stalled_s / (s.back().t_s - s.front().t_s);
  std::size_t last_change = 0;
  for (std::size_t i = 1; i < s.size(); ++i) {
    const double dt = s[i].t_s - s[i - 1].t_s;
    if (in_outage(s[i].t_s) || s[i].broker_down) {
      r.broker_outage_s += dt;
      last_change = i;
      continue;
    }
    if (within(shard_outages, s[i].t_s)) {
      r.shard_outage_s += dt;
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

expected<fault_plan_spec> load_drill_plan(const config& cfg, const drill_options& o) {
  auto policy = resolve_policy(cfg);
  if (!policy) return policy.err();
  auto plan = parse_fault_plan(o.plan_text, o.plan_origin, cfg.mesh.learners, policy->shards);
  if (!plan) return plan.err();
  if (!(o.time_scale > 0 && o.time_scale <= 100))
    return make_error(errc::invalid_input, "the time scale must be in (0, 100], not " + std::to_string(o.time_scale));
  auto scale = [&](nanos& t) { t = static_cast<nanos>(static_cast<double>(t) * o.time_scale); };
  scale(plan->duration_ns);
  scale(plan->liveness_ns);
  for (auto& f : plan->schedule) {
    scale(f.at_ns);
    scale(f.for_ns);
  }
  scale(plan->rates.learner_mtbf_ns);
  scale(plan->rates.repair_min_ns);
  scale(plan->rates.repair_max_ns);
  return plan;
}

double calibrate_step_time_ms(const config& cfg) {
  auto shape = resolve_model(cfg.model);
  auto data = shape ? load_dataset(cfg.data, cfg.mesh.learners, shape->context, cfg.train.seed) : shape.err();
  if (!shape || !data) return 100;
  set_compute_threads(1);
  engine e(cfg, *shape, *data, 0);
  e.step();  // warm-up: first-touch of the buffers
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int steps = 5;
  for (int i = 0; i < steps; ++i) e.step();
  const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  // Every learner's step must fit beside the others', the shards' merges, the evaluations and
  // whatever else shares the machine: a third of the CPU stays idle on average.
  return std::ceil(std::max(1.5 * step_ms, 3.0 * step_ms * cfg.mesh.learners / cores));
}

drill_work_area::~drill_work_area() {
  std::error_code ec;
  if (owned && !keep) fs::remove_all(dir, ec);
}

expected<std::unique_ptr<drill_work_area>> drill_work_area::open(const std::string& work_dir) {
  auto area = std::make_unique<drill_work_area>();
  if (work_dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "archipelago-drill-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) return make_error(errc::io_error, "cannot create a temporary directory");
    area->dir = pattern;
    area->owned = true;
  } else {
    area->dir = work_dir;
    std::error_code ec;
    fs::create_directories(area->dir, ec);
    if (ec) return make_error(errc::io_error, "cannot create " + area->dir.string() + ": " + ec.message());
  }
  return area;
}

expected<fs::path> drill_work_area::fresh(const std::string& name) const {
  std::error_code ec;
  const fs::path p = dir / name;
  fs::remove_all(p, ec);
  if (ec) return make_error(errc::io_error, "cannot clear " + p.string() + ": " + ec.message());
  return p;
}

drill_report new_drill_report(const drill_options& o, const config& cfg, const fault_plan_spec& plan,
                              const sync_policy& policy, double step_time_ms) {
  drill_report r;
  r.plan = o.plan_origin;
  r.mode = cfg.mesh.mode;
  r.seed = plan.seed;
  r.learners = cfg.mesh.learners;
  r.shards = policy.shards;
  r.quorum = policy.wait_for_all ? cfg.mesh.learners : policy.quorum;
  r.safety_s = static_cast<double>(plan.duration_ns) * 1e-9;
  r.liveness_s = static_cast<double>(plan.liveness_ns) * 1e-9;
  r.step_time_ms = step_time_ms;
  return r;
}

mesh_progress phase_progress(const mesh_progress& progress, const char* name) {
  return [&progress, name](const std::string& line) {
    if (progress) progress(std::string(name) + ": " + line);
  };
}

expected<drill_report> run_drill(const config& base, const drill_options& o, const mesh_progress& progress,
                                 const std::function<bool()>& stop_requested) {
  auto plan = load_drill_plan(base, o);
  if (!plan) return plan.err();
  auto policy = resolve_policy(base);
  if (!policy) return policy.err();
  const double step_ms = base.mesh.step_time_ms > 0 ? base.mesh.step_time_ms : calibrate_step_time_ms(base);
  const config cfg = drill_config(base, *plan, step_ms);
  if (auto ok = validate_mesh(cfg); !ok) return ok.err();
  const mesh_setup layout = make_mesh_setup(cfg, *policy);

  auto area = drill_work_area::open(o.work_dir);
  if (!area) return area.err();
  drill_report r = new_drill_report(o, cfg, *plan, *policy, step_ms);
  if (o.reference) {
    auto db = (*area)->fresh("reference.db");
    if (!db) return db.err();
    mesh_snapshots snaps;
    snaps.db = db->string();
    auto ref = run_local_mesh(cfg, phase_progress(progress, "reference (no faults)"), stop_requested, snaps);
    if (!ref) return make_error(ref.err().code, "the fault-free reference run: " + ref.err().message);
    r.reference = std::move(*ref);
    if (stop_requested()) return make_error(errc::timeout, "stopped by a signal during the reference run");
  }

  auto db = (*area)->fresh("drill.db");
  if (!db) return db.err();
  mesh_snapshots snaps;
  snaps.db = db->string();
  mesh_drill drill;
  drill.timeline = expand_fault_plan(*plan, cfg.mesh.learners);
  drill.safety_ns = plan->duration_ns;
  drill.sample = [&r, &drill, &layout](nanos since_start, mesh_stats& stats) {
    drill_sample s;
    s.t_s = static_cast<double>(since_start) * 1e-9;
    s.rounds = stats.rounds_closed.load();
    s.published = stats.published.load();
    s.tokens = stats.tokens.load();
    {
      std::lock_guard lock(stats.report_mutex);
      s.merged_step_time_s = stats.report.ledger.merged_step_time_s;
    }
    for (const auto& n : stats.learner_steps) s.learner_steps.push_back(n.load());
    s.shard_committed.assign(static_cast<std::size_t>(r.shards), 0);
    for (std::size_t p = 0; p < stats.committed_version.size() && p < layout.shard_of_fragment.size(); ++p)
      s.shard_committed[layout.shard_of_fragment[p]] += stats.committed_version[p].load();
    s.learners_down = drill.log.learners_down.load();
    s.shards_down = drill.log.shards_down.load();
    s.broker_down = drill.log.broker_down.load();
    r.samples.push_back(std::move(s));
  };
  auto run = run_local_mesh(cfg, phase_progress(progress, "drill"), stop_requested, snaps, &drill);
  if (!run) return make_error(run.err().code, "the drill: " + run.err().message);
  r.run = std::move(*run);
  r.chaos_commands = drill.log.commands_sent.load();
  r.chaos_commands_failed = drill.log.commands_failed.load();
  finish_drill_report(r, drill, cfg, layout);
  return r;
}

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
