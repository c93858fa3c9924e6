// The fault drills of deploy/drills run against the deterministic simulation:
// each plan's safety phase with its faults (the chaos monkey's real wire layer
// carries them out in virtual time), then its liveness phase healed, and the properties the drills exist
// for checked on the result. A failure prints the plan and the seed; rerun one
// plan with -tc="sim: fault drill <plan>", and another seed with
// SIM_CHAOS_SEED=<n> (it reseeds both the plan's random faults and the sim).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "chaos_monkey/fault_plan.hpp"
#include "sim/mesh_sim.hpp"

using namespace archipelago;
using namespace archipelago::sim;

namespace {

// The mesh the plans are written for.
constexpr int drill_learners = 4, drill_shards = 2;
constexpr int drill_quorum = 2;  // K
constexpr nanos ms = 1'000'000, sec = 1'000 * ms;

// Every plan in deploy/drills has a test case below; a guard test keeps this list complete.
// (Its subfolders hold plans for live drills of other sizes: 30 minutes, 8 learners.)
constexpr const char* drill_plans[] = {"broker_crash.toml",     "broker_host_lost.toml", "broker_partition.toml",
                                       "corruption.toml",       "crash_storm.toml",      "mixed.toml",
                                       "partition.toml",        "shard_crash.toml",      "shard_down.toml",
                                       "stragglers.toml",       "wan.toml"};

std::filesystem::path drills_dir() { return std::filesystem::path(ARCHIPELAGO_SOURCE_DIR) / "deploy" / "drills"; }

/// SIM_CHAOS_SEED overrides a plan's seed (soak runs); 0 when unset.
std::uint64_t seed_override() {
  const char* text = std::getenv("SIM_CHAOS_SEED");
  return text ? std::strtoull(text, nullptr, 10) : 0;
}

std::string joined(const std::vector<std::uint64_t>& values) {
  std::string out;
  for (std::uint64_t v : values) out += (out.empty() ? "" : " ") + std::to_string(v);
  return out;
}

fault_plan_spec load_plan(const std::string& name) {
  std::ifstream in(drills_dir() / name);
  REQUIRE_MESSAGE(in.good(), "cannot read " << (drills_dir() / name).string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto plan = parse_fault_plan(text, name, drill_learners, drill_shards);
  REQUIRE_MESSAGE(plan.has_value(), (plan ? "" : plan.err().message));
  return *plan;
}

/// The drill's mesh: 10 ms steps, K = 2 of 4, and durability lagging publication
/// by 50 ms so a shard crash loses its newest versions. The safety phase is the
/// plan's duration; the liveness phase follows; then 1 s of drain.
sim_config drill_config(const fault_plan_spec& plan, std::uint64_t seed) {
  sim_config c;
  c.seed = seed;
  c.learners = drill_learners;
  c.shards = drill_shards;
  c.fragments = 4;
  c.broker.quorum = drill_quorum;
  c.broker.liveness_timeout_ns = 500 * ms;
  c.broker.round_timeout_ns = 2 * sec;
  c.duration_ns = plan.duration_ns + plan.liveness_ns;
  c.safety_ns = plan.duration_ns;
  c.drain_ns = 1 * sec;
  c.commit_delay_ns = 2 * ms;
  c.standbys = plan.standbys;
  // As the mesh's broker does (broker_settings): claims bounded by Progress and batch × context.
  c.broker.bound_claims = true;
  c.broker.tokens_per_step_max = {c.tokens_per_step};
  return c;
}

// Zero global downtime while >= K learners can work: within every stretch in
// which at least K learners were healthy (alive, not paused, joined, and able to
// reach the broker and every shard, all up), after the stretch's first
// settle_ns, no gap between publications (global model versions) is longer than
// max_publication_gap_ns. settle_ns is the time a mesh needs to get going again
// after a fault left fewer than K: rejoins, and rounds opened meanwhile that
// only the round timeout closes.
//
// One exception, by design: while links lose or corrupt messages, a round can
// lose its RoundOpen or contributions to all but K-1 learners. Such a round
// holds one of the τ in-flight slots until a younger round of its fragment
// merges (broker_core closes it then) — or, when every slot is held by such
// rounds, until its round timeout. A gap that begins while a lossy link fault is
// in force (or in_flight_ns after) may therefore last the round timeout.
constexpr nanos settle_ns = 2'500 * ms;  // round_timeout + liveness_timeout
constexpr nanos max_publication_gap_ns = 500 * ms;
constexpr nanos in_flight_ns = 500 * ms;  // what was sent before a fault may still arrive and merge

struct stall {
  nanos at_ns = 0, length_ns = 0;
};

/// Every gap between publications longer than `bound` within the stretches of >= K healthy learners.
std::vector<stall> stalls_longer_than(const sim_result& r, nanos end_ns, nanos bound) {
  std::vector<nanos> published;
  for (const auto& v : r.versions)
    if (v.kind == version_event::what::published) published.push_back(v.at_ns);
  std::vector<stall> out;
  auto check_window = [&](nanos from, nanos to) {
    if (to <= from) return;
    nanos previous = from;
    for (auto it = std::upper_bound(published.begin(), published.end(), from); it != published.end() && *it < to; ++it) {
      if (*it - previous > bound) out.push_back({previous, *it - previous});
      previous = *it;
    }
    if (to - previous > bound) out.push_back({previous, to - previous});
  };
  nanos stretch_start = -1;
  for (std::size_t k = 0; k <= r.healthy_learners.size(); ++k) {
    const nanos t = k < r.healthy_learners.size() ? std::min(r.healthy_learners[k].first, end_ns) : end_ns;
    const bool enough = k < r.healthy_learners.size() && r.healthy_learners[k].second >= drill_quorum;
    if (stretch_start >= 0 && (!enough || t == end_ns)) {
      check_window(stretch_start + settle_ns, t);
      stretch_start = -1;
    }
    if (enough && stretch_start < 0 && t < end_ns) stretch_start = t;
  }
  return out;
}

/// [from, to): a stretch of the run.
using span = std::pair<nanos, nanos>;

/// When the faults `matching` were in force, each widened by `before` and `after`:
/// [inject − before, repair + after); one never repaired (a lost host) to the run's end.
std::vector<span> in_force(const sim_result& r, const sim_config& c,
                           const std::function<bool(const planned_fault&)>& matching, nanos before, nanos after) {
  std::map<std::size_t, nanos> injected_at;
  for (const chaos_action& a : r.chaos_record)
    if (a.action == chaos_action::what::inject && matching(c.timeline[a.fault])) injected_at[a.fault] = a.at_ns;
  std::vector<span> out;
  for (const chaos_action& a : r.chaos_record)
    if (a.action == chaos_action::what::repair && injected_at.count(a.fault) != 0) {
      out.emplace_back(injected_at.at(a.fault) - before, a.at_ns + after);
      injected_at.erase(a.fault);
    }
  for (const auto& [fault, at] : injected_at) out.emplace_back(at - before, c.duration_ns);
  return out;
}

bool within(const std::vector<span>& spans, nanos t) {
  return std::any_of(spans.begin(), spans.end(), [&](const span& s) { return t >= s.first && t < s.second; });
}

/// Checks the stalls (see above); returns the longest gap seen, for the report.
nanos check_downtime(const sim_result& r, const sim_config& c) {
  const std::vector<span> lossy = in_force(
      r, c, [](const planned_fault& f) { return f.kind == fault_kind::link && (f.link.loss > 0 || f.link.corrupt > 0); },
      0, in_flight_ns);
  nanos longest = 0;
  for (const stall& s : stalls_longer_than(r, c.duration_ns, 0)) longest = std::max(longest, s.length_ns);
  for (const stall& s : stalls_longer_than(r, c.duration_ns, max_publication_gap_ns)) {
    const bool in_lossy = within(lossy, s.at_ns);
    INFO("no publication for " << static_cast<double>(s.length_ns) / 1e9 << " s from "
                               << static_cast<double>(s.at_ns) / 1e9 << " s with >= K learners healthy"
                               << (in_lossy ? " (lossy links)" : ""));
    CHECK(s.length_ns <= (in_lossy ? c.broker.round_timeout_ns + max_publication_gap_ns : max_publication_gap_ns));
  }
  return longest;
}

/// Nothing installed is taken back, and no committed round is lost: per
/// fragment, replays the shards' version trace. A fragment merges one version
/// at a time (the next only once the last is durable; a failed write is
/// retried); versions become durable in order; a version is visible (broadcast:
/// a learner may install it) only once durable, and visibility never goes back;
/// a restart restores at least every version ever visible, and publication goes
/// on from there. (One CHECK for the whole trace, naming the first violation: it
/// has thousands of events.) Returns the merges a crash took before they were
/// durable — never seen by any learner.
std::size_t check_versions(const sim_result& r) {
  std::map<std::uint32_t, std::uint64_t> visible, committed, merged;
  std::size_t merges_lost = 0;
  std::size_t violations = 0;
  std::string first;
  auto expect = [&](bool ok, const version_event& v, const char* rule) {
    if (ok || violations++ > 0) return;
    std::ostringstream out;
    out << rule << ": fragment " << v.fragment.value << " version " << v.version << " at "
        << static_cast<double>(v.at_ns) / 1e9 << " s (visible " << visible[v.fragment.value] << ", committed "
        << committed[v.fragment.value] << ")";
    first = out.str();
  };
  for (const auto& v : r.versions) {
    const std::uint32_t p = v.fragment.value;
    switch (v.kind) {
      case version_event::what::merged:
        expect(v.version == committed[p] + 1, v, "merged on a version that is not durable");
        merged[p] = v.version;
        break;
      case version_event::what::committed:
        expect(v.version == committed[p] + 1, v, "committed a version out of order");
        committed[p] = v.version;
        break;
      case version_event::what::published:
        expect(v.version == visible[p] + 1, v, "published a version that does not follow the visible one");
        expect(v.version <= committed[p], v, "published a version before it was durable");
        visible[p] = v.version;
        break;
      case version_event::what::restored:
        expect(v.version >= visible[p], v, "a restart took back a version learners could install");
        expect(v.version == committed[p], v, "restored other than the newest durable version");
        merges_lost += merged[p] > v.version;
        visible[p] = merged[p] = v.version;
        break;
    }
  }
  CHECK_MESSAGE(violations == 0, first);
  for (std::uint32_t p = 0; p < r.shard_versions.size(); ++p) {
    CAPTURE(p);
    CHECK(r.shard_versions[p] == visible[p]);
    for (const auto& held : r.learner_versions) CHECK(held[p] <= committed[p]);
  }
  return merges_lost;
}

/// The ledger is exact: every token the broker heard of is in one bucket, and
/// what it heard of is exactly what each incarnation reported in its newest
/// Progress that arrived — all it did, for every incarnation alive at the end
/// (the drain delivers its last Progress over healed links).
///
/// One loss is by design: a crashed broker's ledger comes back as its store last
/// wrote it, so an incarnation that died before it reported to the restarted
/// broker lacks the steps it did between that write and the restart (at most
/// broker_ledger_write_ns + restart_ns + broker_silence_ns of steps per crash).
void check_ledger(const sim_result& r, const sim_config& c) {
  CHECK(r.ledger.balanced());
  // Per fragment too: each fragment's token-shares in one bucket each, summing to the totals.
  REQUIRE(r.fragment_ledger.size() == static_cast<std::size_t>(c.fragments));
  ledger_totals summed;
  for (const ledger_totals& f : r.fragment_ledger) {
    CHECK(f.balanced());
    summed += f;
  }
  CHECK(summed.processed == r.ledger.processed);
  CHECK(summed.merged == r.ledger.merged);
  CHECK(summed.overwritten == r.ledger.overwritten);
  CHECK(summed.lost == r.ledger.lost);
  CHECK(r.ledger.merged > 0);
  CHECK(r.ledger.rejected == 0);  // corrupted messages never reach a core
  // No honest claim is cut by the broker's bound, whatever the faults (a lost or late Progress included).
  CHECK(r.broker.claims_cut == 0);
  for (const shard_ledger& s : r.shards) CHECK(s.rejected == 0);
  constexpr nanos step_ns = 10 * ms;  // the learners' fastest step
  // A standby that took over continues from its copy of the ledger, at most one copy old, as a restart would.
  const std::uint64_t takeovers = r.leaders.empty() ? 0 : r.leaders.size() - 1;
  const std::uint64_t unwritten_steps =
      (r.broker_restarts + takeovers) *
      static_cast<std::uint64_t>((c.broker_ledger_write_ns + c.restart_ns + c.broker_silence_ns) / step_ns);
  std::uint64_t own = 0;
  for (const auto& [who, steps] : r.steps_by_incarnation) {
    CAPTURE(who.learner.value);
    CAPTURE(who.inc.value);
    own += steps;
    const auto delivered = r.progress_delivered.count(who) ? r.progress_delivered.at(who) : 0;
    const auto booked = r.ledger_by_incarnation.count(who) ? r.ledger_by_incarnation.at(who).processed : 0;
    const bool alive_at_end = r.learner_incarnations[who.learner.value] == who.inc.value;
    CHECK(delivered <= steps);
    if (alive_at_end) CHECK(delivered == steps);
    if (alive_at_end || r.broker_restarts + takeovers == 0) {
      CHECK(booked == delivered * c.tokens_per_step);
    } else {
      CHECK(booked <= delivered * c.tokens_per_step);
      CHECK(booked + unwritten_steps * c.tokens_per_step >= delivered * c.tokens_per_step);
    }
  }
  CHECK(own * c.tokens_per_step == r.tokens_processed);
}

/// After the liveness phase every learner is back: its latest incarnation was a
/// member of rounds, it was merged after everything healed, and it holds the
/// shards' current versions (a learner that missed a shard's restart would
/// keep newer version numbers and ignore its updates).
void check_rejoined(const sim_result& r, const sim_config& c) {
  for (std::size_t i = 0; i < r.learner_incarnations.size(); ++i) {
    CAPTURE(i);
    const auto& seen = r.member_incarnations[i];
    CHECK(std::find(seen.begin(), seen.end(), r.learner_incarnations[i]) != seen.end());
    CHECK(!r.merged_at[i].empty());
    if (!r.merged_at[i].empty()) CHECK(r.merged_at[i].back() > c.safety_ns);
    CHECK_MESSAGE(r.learner_versions[i] == r.shard_versions,
                  "learner holds versions " << joined(r.learner_versions[i]) << ", the shards " << joined(r.shard_versions));
  }
}

/// Every round a broker closed with members is merged and published — a shard whose
/// fragment's last version is not durable yet holds the close until it is, and drops
/// none of the learners' work in it. Not checked around a fault that touches a shard
/// or a broker (from in_flight_ns before it to settle_ns after its repair): a dead
/// shard takes its open rounds with it, and a new broker holds no record of the old one's.
void check_closed_rounds_published(const sim_result& r, const sim_config& c) {
  const std::vector<span> exempt = in_force(
      r, c,
      [](const planned_fault& f) {
        bool touches = f.kind == fault_kind::shard_crash || f.kind == fault_kind::storage_errors ||
                       f.kind == fault_kind::broker_crash || f.kind == fault_kind::broker_host_lost;
        for (const fault_target& t : f.targets) touches |= t.kind != role::learner;
        for (const auto& group : f.groups)
          for (const fault_target& t : group) touches |= t.kind != role::learner;
        return touches;
      },
      in_flight_ns, settle_ns);
  std::size_t checked = 0;
  for (const round_record& rec : r.history) {
    if (rec.quorum_ns < 0 || rec.members.empty() || rec.closed_ns > c.duration_ns - settle_ns) continue;
    if (within(exempt, rec.closed_ns)) continue;
    ++checked;
    CHECK_MESSAGE(rec.published_ns >= 0, "round " << rec.round.value << " of fragment " << rec.fragment.value
                                                  << " closed at " << static_cast<double>(rec.closed_ns) / 1e9 << " s with "
                                                  << rec.members.size() << " members, never published");
  }
  CHECK(checked > 0);
}

void check_chaos(const sim_result& r, const std::vector<planned_fault>& timeline) {
  CHECK(r.faults_injected > 0);
  CHECK(r.chaos_healed);
  CHECK(r.faults_in_place == 0);  // the sim undid every fault it applied
  const std::size_t timeline_size = timeline.size();
  std::size_t injected = 0, repaired = 0, skipped = 0, never_repaired = 0;
  for (const chaos_action& a : r.chaos_record) {
    injected += a.action == chaos_action::what::inject;
    repaired += a.action == chaos_action::what::repair;
    skipped += a.action == chaos_action::what::skip;
    never_repaired += a.action == chaos_action::what::inject && timeline[a.fault].kind == fault_kind::broker_host_lost;
  }
  CHECK(injected == r.faults_injected);
  CHECK(repaired + never_repaired == injected);  // a lost host is never back
  CHECK(injected + skipped == timeline_size);
}

/// Each injected fault did to the mesh what its kind says, seen from outside
/// the sim's fault code (a mapping that silently did nothing would pass every
/// other check): a learner crashed, paused or cut off from the broker is in no
/// merged round while it lasts; a slowed learner reports longer steps; faulty
/// links lose, corrupt and duplicate messages (and the cores suppress the
/// duplicates); a shard or broker crash restarts it; a shard's storage errors
/// commit and publish nothing; while the broker is down nothing is published.
void check_faults_took_effect(const sim_result& r, const std::vector<planned_fault>& timeline, const sim_config& c) {
  constexpr nanos step_ns = 10 * ms;        // sim_config's default step time
  std::map<std::size_t, nanos> repaired_at;
  for (const chaos_action& a : r.chaos_record)
    if (a.action == chaos_action::what::repair) repaired_at[a.fault] = a.at_ns;
  auto merged_between = [&](std::uint32_t learner, nanos from, nanos to) {
    const auto& times = r.merged_at[learner];
    const auto it = std::upper_bound(times.begin(), times.end(), from);
    return it != times.end() && *it < to;
  };
  auto versions_between = [&](version_event::what kind, std::uint32_t shard, bool any_shard, nanos from, nanos to) {
    return std::count_if(r.versions.begin(), r.versions.end(), [&](const version_event& v) {
      return v.kind == kind && (any_shard || v.shard == shard) && v.at_ns > from && v.at_ns < to;
    });
  };
  std::size_t shard_crashes = 0, broker_crashes = 0;
  bool lossy = false, corrupting = false, duplicating = false;
  std::set<std::uint32_t> slowed;
  for (const chaos_action& a : r.chaos_record) {
    if (a.action != chaos_action::what::inject) continue;
    const planned_fault& f = timeline[a.fault];
    const auto repaired = repaired_at.find(a.fault);  // a lost host: never
    const nanos until = repaired == repaired_at.end() ? c.duration_ns : repaired->second;
    INFO("fault " << a.fault << ": " << std::string(to_string(f.kind)) << " at " << static_cast<double>(f.at_ns) / 1e9
                  << " s (plan line " << f.line << ")");
    switch (f.kind) {
      case fault_kind::crash:
      case fault_kind::pause:
        CHECK_FALSE(merged_between(f.targets[0].index, f.at_ns + in_flight_ns, until));
        break;
      case fault_kind::partition:
        for (const auto& group : f.groups) {
          const bool with_broker = std::any_of(group.begin(), group.end(),
                                               [](const fault_target& t) { return t.kind == role::sync_broker; });
          for (const fault_target& t : group)
            if (!with_broker && t.kind == role::learner && !t.every_learner)
              CHECK_FALSE(merged_between(t.index, f.at_ns + in_flight_ns, until));
        }
        break;
      case fault_kind::slow: slowed.insert(f.targets[0].index); break;
      case fault_kind::link:
        lossy |= f.link.loss > 0;
        corrupting |= f.link.corrupt > 0;
        duplicating |= f.link.duplicate > 0;
        break;
      case fault_kind::shard_crash: ++shard_crashes; break;
      case fault_kind::storage_errors:  // nothing durable, so nothing visible: its fragments pause
        CHECK(versions_between(version_event::what::committed, f.targets[0].index, false, f.at_ns + c.commit_delay_ns,
                               until) == 0);
        CHECK(versions_between(version_event::what::published, f.targets[0].index, false, f.at_ns + c.commit_delay_ns,
                               until) == 0);
        break;
      case fault_kind::broker_host_lost: break;  // check_takeovers
      case fault_kind::impersonate:
      case fault_kind::lie_tokens: break;  // attackers: the impersonation test and the shard's claim checks
      case fault_kind::attack_scaled:  // the model's damage is measured by drills, not here
      case fault_kind::attack_sign_flip:
      case fault_kind::attack_random:
      case fault_kind::attack_stale:
      case fault_kind::attack_sideways: break;
      case fault_kind::broker_crash:  // the closes it sent before still publish at once (default link: no delay)
        ++broker_crashes;
        CHECK(versions_between(version_event::what::published, 0, true, f.at_ns + 10 * ms, f.at_ns + c.restart_ns) == 0);
        break;
    }
  }
  CHECK(r.shard_restarts == shard_crashes);
  CHECK(r.broker_restarts == broker_crashes);
  if (lossy) CHECK(r.messages_lost > 0);
  if (corrupting) CHECK(r.messages_corrupted > 0);
  if (duplicating) {  // duplicates arrived, and the cores suppressed them
    std::uint64_t duplicates = r.broker.duplicates;
    for (const auto& shard : r.shards) duplicates += shard.duplicates;
    CHECK(duplicates > 0);
  }
  std::map<std::uint32_t, ledger_totals> per_learner;
  for (const auto& [who, totals] : r.ledger_by_incarnation) {
    ledger_totals& sum = per_learner[who.learner.value];
    sum.steps += totals.steps;
    sum.step_time_s += totals.step_time_s;
  }
  for (const auto& [learner, totals] : per_learner) {
    CAPTURE(learner);
    const double mean_step_ns = totals.step_time_s * 1e9 / static_cast<double>(totals.steps);
    if (slowed.count(learner)) CHECK(mean_step_ns > 1.1 * step_ns);
    else CHECK(mean_step_ns == doctest::Approx(step_ns));
  }
}

/// The broker leading at `t` as the sim recorded it: the newest epoch begun by then (none: -1).
int leader_at(const sim_result& r, nanos t) {
  int out = -1;
  std::uint64_t newest = 0;
  for (const auto& [at, b, epoch] : r.leaders)
    if (at <= t && epoch > newest) newest = epoch, out = static_cast<int>(b);
  return out;
}

/// A mesh with standbys: every fault that took the leading broker away — its host
/// lost, or a partition that left it without a shard — is followed by a standby
/// leading in a newer epoch on the liveness verdict (one heartbeat of slack: the
/// tick), nothing published meanwhile, and a new version within the verdict and a
/// publication gap after that; a partitioned leader steps down once the cut heals
/// (the first message it gets carries the newer epoch); and no round a deposed
/// broker closed was merged (fencing).
void check_takeovers(const sim_result& r, const sim_config& c) {
  CHECK(r.closes_merged_by_deposed == 0);
  std::map<std::size_t, nanos> repaired_at;
  for (const chaos_action& a : r.chaos_record)
    if (a.action == chaos_action::what::repair) repaired_at[a.fault] = a.at_ns;
  for (const chaos_action& a : r.chaos_record) {
    if (a.action != chaos_action::what::inject) continue;
    const planned_fault& f = c.timeline[a.fault];
    const int deposed = std::max(0, leader_at(r, a.at_ns));
    bool cut_off = false;  // a partition leaving the leader without any shard
    for (const auto& group : f.groups)
      if (std::any_of(group.begin(), group.end(), [&](const fault_target& t) {
            return t.kind == role::sync_broker && static_cast<int>(t.index) == deposed;
          }))
        cut_off = std::none_of(group.begin(), group.end(), [](const fault_target& t) { return t.kind == role::parameter_shard; });
    if (f.kind != fault_kind::broker_host_lost && !(f.kind == fault_kind::partition && cut_off)) continue;
    INFO("fault " << a.fault << ": " << std::string(to_string(f.kind)) << " at " << static_cast<double>(a.at_ns) / 1e9 << " s (plan line "
                  << f.line << "), broker/" << deposed << " leading");
    REQUIRE(c.standbys > 0);
    const auto next = std::find_if(r.leaders.begin(), r.leaders.end(), [&](const auto& l) {
      return std::get<0>(l) > a.at_ns && static_cast<int>(std::get<1>(l)) != deposed;
    });
    REQUIRE(next != r.leaders.end());
    const nanos led_ns = std::get<0>(*next);
    CHECK(led_ns - a.at_ns <= c.broker_silence_ns + c.broker_silence_ns / 3 + c.tick_ns);
    nanos published_ns = -1;
    std::size_t meanwhile = 0;
    for (const version_event& v : r.versions) {
      if (v.kind != version_event::what::published || v.at_ns <= a.at_ns + 10 * ms) continue;
      if (v.at_ns < led_ns) ++meanwhile;
      else if (published_ns < 0) published_ns = v.at_ns;
    }
    CHECK(meanwhile == 0);  // nobody led: nothing merged (a close sent before the fault may land in its first 10 ms)
    REQUIRE(published_ns >= 0);
    CHECK(published_ns - a.at_ns <= c.broker_silence_ns + c.broker_silence_ns / 3 + c.tick_ns + max_publication_gap_ns);
    std::ostringstream report;
    report << to_string(f.kind) << " at " << static_cast<double>(a.at_ns) / 1e9 << " s: broker/" << std::get<1>(*next)
           << " leading (epoch " << std::get<2>(*next) << ") " << static_cast<double>(led_ns - a.at_ns) / 1e6
           << " ms later, a new version " << static_cast<double>(published_ns - a.at_ns) / 1e6 << " ms after the fault";
    if (f.kind == fault_kind::partition) {
      const nanos heal_ns = repaired_at.at(a.fault);
      const auto down = std::find_if(r.step_downs.begin(), r.step_downs.end(), [&](const auto& d) {
        return d.first > a.at_ns && static_cast<int>(d.second) == deposed;
      });
      REQUIRE(down != r.step_downs.end());
      CHECK(down->first >= heal_ns);  // cut off, it heard of nobody
      CHECK(down->first - heal_ns < 2 * c.broker_silence_ns);
      report << "; broker/" << deposed << " stepped down " << static_cast<double>(down->first - heal_ns) / 1e6
             << " ms after the heal (" << r.fenced_at_shards << " of its messages fenced by the shards)";
    }
    MESSAGE(report.str());
  }
}

/// Versions of fragment p published in [from, to).
std::size_t fragment_published_between(const sim_result& r, std::uint32_t p, nanos from, nanos to) {
  return static_cast<std::size_t>(std::count_if(r.versions.begin(), r.versions.end(), [&](const version_event& v) {
    return v.kind == version_event::what::published && v.fragment.value == p && v.at_ns >= from && v.at_ns < to;
  }));
}

std::size_t published_between(const sim_result& r, std::uint32_t shard, nanos from, nanos to) {
  std::size_t n = 0;
  for (std::uint32_t p = shard; p < r.shard_versions.size(); p += drill_shards) n += fragment_published_between(r, p, from, to);
  return n;
}

/// A shard out of the mesh (down, or cut off from the broker) over [from, to)
/// pauses only its own fragments: they publish nothing once what was in flight
/// has landed, and every fragment of the other shard keeps at least 90 % of its
/// publication rate in the fault-free run of the same seed (not more often either:
/// the paused fragments' turns are skipped, not given away).
void check_pause_is_partial(const sim_result& r, const sim_result& clean, std::uint32_t out, nanos from, nanos to) {
  INFO("shard " << out << " out from " << static_cast<double>(from) / 1e9 << " s to " << static_cast<double>(to) / 1e9
                << " s");
  CHECK(published_between(r, out, from + in_flight_ns, to) == 0);
  for (std::uint32_t p = 0; p < r.shard_versions.size(); ++p) {
    if (p % drill_shards == out) continue;
    const auto faulty = static_cast<double>(fragment_published_between(r, p, from, to));
    const auto fault_free = static_cast<double>(fragment_published_between(clean, p, from, to));
    CAPTURE(p);
    CAPTURE(faulty);
    CAPTURE(fault_free);
    CHECK(faulty >= 0.9 * fault_free);
    CHECK(faulty <= 1.1 * fault_free + 1);
  }
}

/// Every shard crash whose outage is long enough to measure rates over (>= 5 s) pauses only its shard's fragments.
void check_shard_outages(const sim_result& r, const sim_result& clean, const sim_config& c) {
  std::map<std::size_t, nanos> injected_at;
  for (const chaos_action& a : r.chaos_record) {
    const planned_fault& f = c.timeline[a.fault];
    if (f.kind != fault_kind::shard_crash) continue;
    if (a.action == chaos_action::what::inject) injected_at[a.fault] = a.at_ns;
    if (a.action == chaos_action::what::repair && a.at_ns - injected_at.at(a.fault) >= 5 * sec)
      check_pause_is_partial(r, clean, f.targets[0].index, injected_at.at(a.fault), a.at_ns);
  }
}

// The loss after the liveness phase against a fault-free run of the same seed
// and length: both have converged to the noise floor of the quadratic, so they
// must agree within this fraction of the fault-free loss.
constexpr double loss_tolerance = 0.10;

void run_drill(const std::string& name) {
  fault_plan_spec plan = load_plan(name);
  if (const std::uint64_t seed = seed_override()) plan.seed = seed;
  const std::uint64_t seed = plan.seed;
  INFO("plan " << name << ", seed " << seed << " (rerun: SIM_CHAOS_SEED=" << seed << " -tc=\"sim: fault drill "
               << name << "\")");
  sim_config c = drill_config(plan, seed);
  c.timeline = expand_fault_plan(plan, drill_learners);
  const sim_result r = run_mesh(c);
  sim_config clean_config = c;
  clean_config.timeline.clear();
  const sim_result clean = run_mesh(clean_config);

  const nanos longest_gap = check_downtime(r, c);
  MESSAGE(name << " seed " << seed << ": " << r.faults_injected << " faults, " << r.shard_restarts
               << " shard and " << r.broker_restarts << " broker restarts; longest gap between publications with >= K healthy "
               << static_cast<double>(longest_gap) / 1e9 << " s; final loss " << r.final_loss
               << " (fault-free " << clean.final_loss << ", initial " << r.initial_loss << "); ledger merged "
               << static_cast<double>(r.ledger.merged) / static_cast<double>(r.ledger.processed) << ", overwritten "
               << static_cast<double>(r.ledger.overwritten) / static_cast<double>(r.ledger.processed));

  check_chaos(r, c.timeline);
  check_faults_took_effect(r, c.timeline, c);
  check_takeovers(r, c);
  check_shard_outages(r, clean, c);
  check_versions(r);
  check_ledger(r, c);
  check_rejoined(r, c);
  check_closed_rounds_published(r, c);
  CHECK(r.final_loss < 0.2 * r.initial_loss);
  CHECK(std::abs(r.final_loss - clean.final_loss) <= loss_tolerance * clean.final_loss);
}

}  // namespace

TEST_CASE("sim: fault drill broker_crash.toml") { run_drill("broker_crash.toml"); }
TEST_CASE("sim: fault drill broker_host_lost.toml") { run_drill("broker_host_lost.toml"); }
TEST_CASE("sim: fault drill broker_partition.toml") { run_drill("broker_partition.toml"); }
TEST_CASE("sim: fault drill corruption.toml") { run_drill("corruption.toml"); }
TEST_CASE("sim: fault drill crash_storm.toml") { run_drill("crash_storm.toml"); }
TEST_CASE("sim: fault drill mixed.toml") { run_drill("mixed.toml"); }
TEST_CASE("sim: fault drill partition.toml") { run_drill("partition.toml"); }
TEST_CASE("sim: fault drill shard_crash.toml") { run_drill("shard_crash.toml"); }
TEST_CASE("sim: fault drill shard_down.toml") { run_drill("shard_down.toml"); }
TEST_CASE("sim: fault drill stragglers.toml") { run_drill("stragglers.toml"); }
TEST_CASE("sim: fault drill wan.toml") { run_drill("wan.toml"); }


TEST_CASE("sim: every plan in deploy/drills has a fault drill test") {
  std::set<std::string> on_disk, tested(std::begin(drill_plans), std::end(drill_plans));
  for (const auto& entry : std::filesystem::directory_iterator(drills_dir()))
    if (entry.path().extension() == ".toml") on_disk.insert(entry.path().filename().string());
  CHECK(on_disk == tested);
}

TEST_CASE("sim: a fault drill replays exactly from its seed") {
  fault_plan_spec plan = load_plan("mixed.toml");  // nearly every kind of fault
  if (const std::uint64_t seed = seed_override()) plan.seed = seed;
  CAPTURE(plan.seed);
  sim_config c = drill_config(plan, plan.seed);
  c.timeline = expand_fault_plan(plan, drill_learners);
  const sim_result a = run_mesh(c), b = run_mesh(c);
  REQUIRE(a.final_theta.size() == b.final_theta.size());
  CHECK(std::memcmp(a.final_theta.data(), b.final_theta.data(), a.final_theta.size() * sizeof(float)) == 0);
  CHECK(a.versions.size() == b.versions.size());
  CHECK(a.messages_lost == b.messages_lost);
  CHECK(a.healthy_learners == b.healthy_learners);
  CHECK(a.steps_by_incarnation == b.steps_by_incarnation);
}

namespace {

/// A plan written inline (the drill plans' parser, the drill mesh), run with and without its faults.
struct inline_drill {
  sim_config config;
  sim_result faulty, clean;
};

inline_drill run_inline(const std::string& text, nanos commit_delay_ns = 0,
                        fragment_order order = fragment_order::round_robin) {
  auto plan = parse_fault_plan(text, "inline.toml", drill_learners, drill_shards);
  REQUIRE_MESSAGE(plan.has_value(), (plan ? "" : plan.err().message));
  if (const std::uint64_t seed = seed_override()) plan->seed = seed;
  inline_drill d;
  d.config = drill_config(*plan, plan->seed);
  if (commit_delay_ns > 0) d.config.commit_delay_ns = commit_delay_ns;
  d.config.broker.order = order;
  d.config.timeline = expand_fault_plan(*plan, drill_learners);
  d.faulty = run_mesh(d.config);
  sim_config clean_config = d.config;
  clean_config.timeline.clear();
  d.clean = run_mesh(clean_config);
  return d;
}

/// Of shard `s`'s fragments' token-shares, the part no merge took (overwritten or lost).
double unmerged_share(const sim_result& r, std::uint32_t s) {
  std::uint64_t unmerged = 0, processed = 0;
  for (std::uint32_t p = s; p < r.fragment_ledger.size(); p += drill_shards) {
    unmerged += r.fragment_ledger[p].overwritten + r.fragment_ledger[p].lost;
    processed += r.fragment_ledger[p].processed;
  }
  return processed ? static_cast<double>(unmerged) / static_cast<double>(processed) : 0;
}

/// After the faults: no version taken back, the ledger exact, every learner back
/// and following the shards, the loss the fault-free run's.
void check_recovered(const inline_drill& d) {
  check_versions(d.faulty);
  check_ledger(d.faulty, d.config);
  check_rejoined(d.faulty, d.config);
  CHECK(std::abs(d.faulty.final_loss - d.clean.final_loss) <= loss_tolerance * d.clean.final_loss);
}

}  // namespace

// The drills never crash a shard while its storage fails; this one does. A
// shard whose writes fail makes nothing visible: its fragments pause (the
// merges wait for a durable version) while the other shard's go on at their
// pace. Its crash then takes nothing back: it restores exactly the version the
// learners last saw, and they keep their work (re-anchored, not overwritten).
TEST_CASE("sim: a shard whose disk fails pauses its fragments, its crash then takes back nothing learners installed") {
  const inline_drill d = run_inline(R"(seed = 19
duration = "14s"
liveness = "4s"

[[fault]]
at = "2s"
kind = "storage_errors"
target = "storage/0"
for = "20s"   # cut short by the end of the safety phase

[[fault]]
at = "12s"
kind = "shard_crash"
target = "shard/0"
)");
  const sim_result& r = d.faulty;
  CAPTURE(d.config.seed);
  REQUIRE(r.shard_restarts == 1);
  // Nothing of shard 0 became visible while its disk failed; shard 1 kept its pace.
  const nanos errors_from = 2 * sec + d.config.commit_delay_ns, crash_at = 12 * sec;
  CHECK(published_between(r, 0, errors_from, crash_at) == 0);
  check_pause_is_partial(r, d.clean, 0, errors_from, crash_at);
  // The restart restores what the learners last saw: the last version published before the errors.
  std::map<std::uint32_t, std::uint64_t> before_errors, restored;
  for (const auto& v : r.versions) {
    if (v.kind == version_event::what::published && v.at_ns < errors_from) before_errors[v.fragment.value] = v.version;
    if (v.kind == version_event::what::restored) restored[v.fragment.value] = v.version;
  }
  REQUIRE(restored.size() == 2);  // shard 0's fragments, 0 and 2
  for (const auto& [p, version] : restored) {
    CAPTURE(p);
    CHECK(version == before_errors[p]);
  }
  // Shard 0's fragments merge again after the restart (the errors end with the safety phase).
  CHECK(published_between(r, 0, d.config.safety_ns, d.config.duration_ns) > 50);
  check_recovered(d);
}

// The broker cannot reach shard 1 for 10 s (the learners can).
constexpr const char* shard1_cut_from_broker = R"(seed = 23
duration = "20s"
liveness = "6s"

[[fault]]
at = "5s"
kind = "partition"
for = "10s"
groups = [["broker"], ["shard/1"]]
)";

// Its transport finds the shard silent, shard 1's fragments pause and shard 0's
// keep their pace; once the link heals, shard 1's fragments merge again and every
// learner holds the shards' versions.
TEST_CASE("sim: a partition between the broker and one shard pauses only that shard's fragments") {
  const inline_drill d = run_inline(shard1_cut_from_broker);
  const sim_result& r = d.faulty;
  CAPTURE(d.config.seed);
  REQUIRE(r.faults_injected == 1);
  CHECK(r.broker.shards_lost >= 1);
  check_pause_is_partial(r, d.clean, 1, 5 * sec, 15 * sec);
  CHECK(published_between(r, 1, 15 * sec + settle_ns, d.config.duration_ns) > 50);
  check_downtime(r, d.config);
  check_recovered(d);
}

// mesh.fragment_order = stalest, the same partition: shard 1's fragments still
// pause (nothing of theirs published while it is cut off), their turns go to
// shard 0's fragments, which sync more often meanwhile, and once the broker hears
// from shard 1 again its two fragments, the stalest, open the next two rounds.
TEST_CASE("sim: with the stalest fragment order a paused shard's turns go to the others, and its fragments go first when it is back") {
  const inline_drill d = run_inline(shard1_cut_from_broker, 0, fragment_order::stalest);
  const sim_result& r = d.faulty;
  CAPTURE(d.config.seed);
  REQUIRE(r.faults_injected == 1);
  CHECK(r.broker.shards_lost >= 1);
  CHECK(published_between(r, 1, 5 * sec + in_flight_ns, 15 * sec) == 0);
  const auto shard0_faulty = static_cast<double>(published_between(r, 0, 5 * sec + in_flight_ns, 15 * sec));
  const auto shard0_clean = static_cast<double>(published_between(d.clean, 0, 5 * sec + in_flight_ns, 15 * sec));
  MESSAGE("shard 0's versions while shard 1 was cut off: " << shard0_faulty << " (fault-free " << shard0_clean << ")");
  CHECK(shard0_faulty >= 1.5 * shard0_clean);
  // The rounds in the order they opened: the first one of shard 1's after the cut
  // is followed at once by its other fragment's.
  std::vector<round_record> rounds(r.history.begin(), r.history.end());
  std::sort(rounds.begin(), rounds.end(), [](const round_record& a, const round_record& b) { return a.round.value < b.round.value; });
  const auto back = std::find_if(rounds.begin(), rounds.end(), [](const round_record& rec) {
    return rec.opened_ns > 5 * sec + in_flight_ns && rec.fragment.value % drill_shards == 1;
  });
  REQUIRE(back != rounds.end());
  REQUIRE(std::next(back) != rounds.end());
  CHECK(back->opened_ns >= 15 * sec);
  CHECK(std::next(back)->round.value == back->round.value + 1);
  CHECK(std::next(back)->fragment.value % drill_shards == 1);
  CHECK(std::next(back)->fragment.value != back->fragment.value);
  CHECK(r.broker.rounds_skipped == 0);
  check_downtime(r, d.config);
  check_recovered(d);
}

// No work is thrown away by a shard restart: the learners re-anchor on the
// version it recovered and keep their local progress, so the work they did on
// its fragments while it was down (and since their last merge) is merged once
// it is back. Shard 0 is killed every 3 s; the share of its fragments' work
// that no merge took stays that of the fault-free run (overlap's cost). Were
// the learners to overwrite their fragments with the recovered version, the
// work of every outage (half a second of steps) would be overwritten.
TEST_CASE("sim: a shard restart throws away no learner work: what learners did while it was down is merged") {
  const inline_drill d = run_inline(R"(seed = 25
duration = "20s"
liveness = "4s"

[[fault]]
at = "2s"
kind = "shard_crash"
target = "shard/0"
every = "3s"
)");
  const sim_result& r = d.faulty;
  CAPTURE(d.config.seed);
  REQUIRE(r.shard_restarts >= 5);
  const double faulty = unmerged_share(r, 0), fault_free = unmerged_share(d.clean, 0);
  MESSAGE("shard 0's fragments, share of the work no merge took: " << faulty << " with " << r.shard_restarts
                                                                   << " restarts, " << fault_free << " fault-free");
  CHECK(faulty <= fault_free + 0.01);
  CHECK(r.ledger.lost <= d.clean.ledger.lost + r.ledger.processed / 100);
  check_recovered(d);
}

// Durable before visible, where it matters: shards killed again and again with
// a 30 ms write behind every merge, so crashes land between a merge and its
// commit. Those merges are gone with the process — and no learner ever saw
// them: every restart restores at least every version that was visible.
TEST_CASE("sim: a shard killed right after a merge takes back nothing any learner installed") {
  const inline_drill d = run_inline(R"(seed = 27
duration = "16s"
liveness = "4s"

[[fault]]
at = "1s"
kind = "shard_crash"
target = "shard/0"
every = "1.1s"

[[fault]]
at = "1.5s"
kind = "shard_crash"
target = "shard/1"
every = "1.3s"
)",
                                    30 * ms);
  const sim_result& r = d.faulty;
  CAPTURE(d.config.seed);
  REQUIRE(r.shard_restarts >= 20);
  const std::size_t merges_lost = check_versions(r);
  MESSAGE(r.shard_restarts << " shard restarts; " << merges_lost << " merges lost before they were durable, none seen");
  CHECK(merges_lost >= 3);  // the case this test exists for happened
  check_ledger(r, d.config);
  // Every learner follows the restored shards. (With a write slower than τ
  // steps the grace window is 0 and only the first K learners of a round are
  // merged, so membership is not checked here.)
  for (std::size_t i = 0; i < r.learner_versions.size(); ++i) {
    CAPTURE(i);
    CHECK(r.learner_versions[i] == r.shard_versions);
  }
  CHECK(r.final_loss < 0.2 * r.initial_loss);
}

// An attacker (deploy/drills/attacks/lie_tokens.toml): learner 1 claims 100 × its tokens
// for 20 s. The broker cuts its claims to what its Progress reported (and batch ×
// context), the shards reject those contributions, and the others train on.
TEST_CASE("sim: attacker lie_tokens.toml is cut by the broker and rejected by the shards") {
  const fault_plan_spec plan = load_plan("attacks/lie_tokens.toml");
  INFO("plan attacks/lie_tokens.toml, seed " << plan.seed);
  sim_config c = drill_config(plan, plan.seed);
  c.timeline = expand_fault_plan(plan, drill_learners);
  const sim_result r = run_mesh(c);
  std::uint64_t rejected = 0, rejected_tokens = 0, merged_tokens = 0;
  for (const shard_ledger& s : r.shards) {
    rejected += s.rejected;
    rejected_tokens += s.rejected_tokens;
    merged_tokens += s.merged_tokens;
  }
  MESSAGE("lie_tokens: " << r.broker.claims_cut << " claims cut, " << rejected << " contributions rejected ("
                         << rejected_tokens << " claimed tokens), " << merged_tokens << " tokens merged; final loss "
                         << r.final_loss << " (initial " << r.initial_loss << ")");
  CHECK(r.broker.claims_cut > 0);
  CHECK(rejected > 0);
  CHECK(rejected <= r.broker.claims_cut);  // a cut member of a round closed without a merge is dropped, not rejected
  CHECK(merged_tokens > 0);
  // The shards tell the broker: its ledger books the refused claims as rejected, never as merged.
  std::uint64_t attacker_rejected = 0;
  for (const auto& [who, totals] : r.ledger_by_incarnation)
    if (who.learner.value == 1) attacker_rejected += totals.rejected;
  CHECK(attacker_rejected > 0);
  CHECK(r.ledger.balanced());
  CHECK(r.final_loss < r.initial_loss);
}

// -- attackers (deploy/drills/attacks/, mesh.robust) --------------------------------

namespace {

/// One attacker of four (the plan in deploy/drills/attacks/), robust merge off and
/// on, beside the fault-free mesh (robust off and on). The losses are taken when
/// the attack ends (the safety phase's end): the simulation's quadratic forgets
/// any damage within a second of honest steps, so a liveness phase would hide it.
struct attack_losses {
  double off = 0, on = 0, clean = 0, clean_on = 0;
  ledger_totals ledger_on, attacker_on;  // the broker's ledger with robust on: all, and learner/3's
};

attack_losses run_attack(const std::string& kind) {
  fault_plan_spec plan = load_plan("attacks/" + kind + ".toml");
  if (const std::uint64_t seed = seed_override()) plan.seed = seed;
  sim_config c = drill_config(plan, plan.seed);
  c.duration_ns = c.safety_ns;
  c.timeline = expand_fault_plan(plan, drill_learners);
  sim_config clean_config = c;
  clean_config.timeline.clear();
  attack_losses out;
  out.clean = run_mesh(clean_config).final_loss;
  clean_config.robust.enabled = true;
  out.clean_on = run_mesh(clean_config).final_loss;
  out.off = run_mesh(c).final_loss;
  c.robust.enabled = true;
  const sim_result on = run_mesh(c);
  out.on = on.final_loss;
  out.ledger_on = on.ledger;
  for (const auto& [who, totals] : on.ledger_by_incarnation)
    if (who.learner.value == 3) {
      out.attacker_on.processed += totals.processed;
      out.attacker_on.merged += totals.merged;
      out.attacker_on.rejected += totals.rejected;
    }
  CHECK(on.faults_injected == 1);
  CHECK(on.ledger.balanced());
  MESSAGE("attack " << kind << " seed " << plan.seed << " (rerun: SIM_CHAOS_SEED=" << plan.seed
                    << "): final loss robust off " << out.off << ", on " << out.on << "; fault-free off " << out.clean
                    << ", on " << out.clean_on << "; the shards rejected " << on.shards[0].screened_out + on.shards[1].screened_out
                    << ", clipped " << on.shards[0].clipped + on.shards[1].clipped);
  return out;
}

}  // namespace

// What the robust merge does here, measured (seed 19; the quadratic's learners have
// non-IID targets, so leaving one learner out — its work rejected — itself moves the
// optimum, about +26 %): it stops the scaled attacker (robust off: the loss explodes)
// and the stale one (a replayed delta). Near the quadratic's optimum each learner's
// delta points at its own target, against the others': the members share no
// direction, the direction screen steps aside, and a sign-flipped, random or sideways
// attacker of honest norm looks like one more non-IID learner (the drills of a real
// model, whose learners' deltas agree, are where the direction screen is measured:
// docs/guides/robust-merge.md).
// The defaults screen without trimming. The checks pin what holds and bound the
// rest, so that a change that makes it worse fails.
TEST_CASE("sim: attack scaled x1000, the robust merge rejects it") {
  const attack_losses l = run_attack("scaled");
  CHECK(l.off > 1000 * l.clean);  // without it the mesh is wrecked
  CHECK(l.on < 1.5 * l.clean_on);  // with it: the cost of one learner's (non-IID) work missing
  // The broker's ledger never credits the screened-out work as merged: the
  // attacker's token-shares are rejected (it attacks from 1 s of 60 on).
  INFO("attacker: processed " << l.attacker_on.processed << ", merged " << l.attacker_on.merged << ", rejected "
                              << l.attacker_on.rejected);
  CHECK(l.attacker_on.rejected > l.attacker_on.processed / 2);
  CHECK(l.attacker_on.merged < l.attacker_on.processed / 20);
}

TEST_CASE("sim: attack sign_flip takes effect, the robust merge bounds it no worse than off") {
  const attack_losses l = run_attack("sign_flip");
  CHECK(l.off > 1.5 * l.clean);  // the attack took effect
  CHECK(l.on <= (1 + loss_tolerance) * l.off);
  CHECK(l.clean_on <= (1 + loss_tolerance) * l.clean);  // no honest member screened out
}

TEST_CASE("sim: attack random takes effect, the robust merge stays within 1.5x its fault-free loss") {
  const attack_losses l = run_attack("random");
  CHECK(l.off > 1.2 * l.clean);
  CHECK(l.on < 1.5 * l.clean_on);
}

// The stale attacker replays its first delta under attack: the shards know it by its
// digest and reject it, so it costs what the scaled one does (its share missing).
TEST_CASE("sim: attack stale, the robust merge rejects the replays") {
  const attack_losses l = run_attack("stale");
  CHECK(l.off != l.clean);
  CHECK(l.on < 1.5 * l.clean_on);
  INFO("attacker: processed " << l.attacker_on.processed << ", merged " << l.attacker_on.merged << ", rejected "
                              << l.attacker_on.rejected);
  CHECK(l.attacker_on.rejected > l.attacker_on.processed / 2);
  CHECK(l.attacker_on.merged < l.attacker_on.processed / 20);
}

// Sideways (deploy/drills/attacks/sideways.toml): the honest norm along a direction
// fixed per fragment, at cosine 0.1 with the honest delta; it compounds through the
// outer momentum. Here it is one more pull towards a target of its own, as each
// non-IID learner's is: the robust merge must not make it worse, nor screen out honest work.
TEST_CASE("sim: attack sideways takes effect, the robust merge does no harm") {
  const attack_losses l = run_attack("sideways");
  CHECK(l.off > 1.2 * l.clean);
  CHECK(l.on <= (1 + loss_tolerance) * l.off);
  CHECK(l.clean_on <= (1 + loss_tolerance) * l.clean);
}

// Churn at scale (deploy/drills/churn/churn_32.toml): 32 learners, about 125 crashes
// an hour in all, for the plan's 10 minutes of virtual time, each learner stepping
// every 100 ms. Rounds never stop, the ledger stays exact, and participation
// (members merged / live learners per round, averaged) meets the plan's criterion.
TEST_CASE("sim: churn at 32 learners keeps participation above the plan's bound") {
  std::ifstream in(drills_dir() / "churn" / "churn_32.toml");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto plan = parse_fault_plan(text, "churn_32.toml", 32, drill_shards);
  REQUIRE_MESSAGE(plan.has_value(), (plan ? "" : plan.err().message));
  if (const std::uint64_t seed = seed_override()) plan->seed = seed;
  CAPTURE(plan->seed);
  sim_config c = drill_config(*plan, plan->seed);
  c.learners = 32;
  c.broker.quorum = 1;
  c.step_ns.assign(32, 100 * ms);
  c.broker.tokens_per_step_max = {c.tokens_per_step};
  c.timeline = expand_fault_plan(*plan, 32);
  const sim_result r = run_mesh(c);
  const nanos longest_gap = check_downtime(r, c);
  check_ledger(r, c);
  MESSAGE("churn_32 seed " << plan->seed << ": " << r.faults_injected << " faults; participation "
                           << 100 * r.participation << " % over " << r.participation_rounds
                           << " rounds; longest gap between publications " << static_cast<double>(longest_gap) / 1e9
                           << " s; ledger merged " << static_cast<double>(r.ledger.merged) / static_cast<double>(r.ledger.processed));
  CHECK(r.faults_injected >= 10);
  CHECK(r.participation_rounds > 1000);
  CHECK(r.participation >= plan->min_participation);
}

// Two learners back from a partition (deploy/drills/partition.toml: two of four cut off
// from the broker and the shards for 20 s, then the other two) set the whole mesh back:
// their first contributions are deltas from the anchor they held when cut off, over all
// their steps since — merged onto a model the others had moved on from, their progress
// counted on top of the mesh's over the same stretch, weighted by all those steps (the
// drill at 0.4 of its time: eval +32 %). Here the learners' quadratic has one target for
// all (as a language model's data are alike) and a slow inner rate, so they are still far
// from it when cut off, under the mesh's outer step (0.6, 0.6). With mesh.catch_up each
// learner back catches up first (learner_core::on_round_open): the loss of Θ never rises
// above its value at the heal in the 3 s after it, and its gap to the fault-free run's is
// narrower 3 s later than at the heal; without it, the loss rises after a heal.
TEST_CASE("sim: with mesh.catch_up learners back from a partition do not set the mesh back") {
  fault_plan_spec plan = load_plan("partition.toml");
  if (const std::uint64_t seed = seed_override()) plan.seed = seed;
  INFO("seed " << plan.seed << " (rerun: SIM_CHAOS_SEED=" << plan.seed << ")");
  sim_config c = drill_config(plan, plan.seed);
  c.timeline = expand_fault_plan(plan, drill_learners);
  c.inner_rate = 0.0005f;
  c.target_spread = 0;
  c.outer = {0.6, 0.6, 0};
  c.loss_every_ns = 100 * ms;
  sim_config clean_config = c;
  clean_config.timeline.clear();
  const sim_result clean = run_mesh(clean_config);
  auto loss_at = [](const sim_result& run, nanos t) {
    const auto it = std::lower_bound(run.loss_curve.begin(), run.loss_curve.end(), std::pair<nanos, double>{t, 0.0});
    REQUIRE(it != run.loss_curve.end());
    return it->second;
  };
  int setbacks_without = 0;
  for (const bool catch_up : {false, true}) {
    CAPTURE(catch_up);
    c.sync.catch_up = catch_up;
    const sim_result r = run_mesh(c);
    REQUIRE(r.loss_curve.size() == clean.loss_curve.size());
    CHECK(r.ledger.balanced());
    int heals = 0;
    for (const chaos_action& a : r.chaos_record) {
      if (a.action != chaos_action::what::repair) continue;
      ++heals;
      const double at_heal = loss_at(r, a.at_ns);
      double highest = 0;
      for (const auto& [t, loss] : r.loss_curve)
        if (t > a.at_ns && t <= a.at_ns + 3 * sec) highest = std::max(highest, loss);
      const double later = loss_at(r, a.at_ns + 3 * sec);
      const double gap_at_heal = at_heal / loss_at(clean, a.at_ns);
      const double gap_later = later / loss_at(clean, a.at_ns + 3 * sec);
      MESSAGE("catch_up " << catch_up << ", heal at " << static_cast<double>(a.at_ns) / 1e9 << " s: loss " << at_heal
                          << " (" << gap_at_heal << "x the fault-free run's), highest in the 3 s after " << highest
                          << ", then " << later << " (" << gap_later << "x)");
      if (!catch_up) {
        setbacks_without += highest > at_heal ? 1 : 0;
        continue;
      }
      CHECK(highest <= at_heal);
      CHECK(gap_later < gap_at_heal);
    }
    CHECK(heals == 2);
  }
  CHECK(setbacks_without > 0);  // the case arises without mesh.catch_up
}
