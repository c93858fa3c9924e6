// The sync broker's CAF shell: feeds messages and ticks to broker_core and
// turns its effects into RoundOpen / RoundClose messages; keeps the token
// ledger and the publication times (uptime) and reports them to mesh_stats.

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <set>

#include "node/mesh_actors.hpp"
#include "node/mesh_snapshots.hpp"
#include "node/node_metrics.hpp"
#include "core/json_line.hpp"
#include "storage/snapshot_writer.hpp"
#include "sync_broker/broker_core.hpp"
#include "sync_broker/token_ledger.hpp"
#include "chaos_monkey/chaos_command.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {
namespace {

using namespace transport;

nanos thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<nanos>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// Adds the calling thread's CPU time between construction and destruction to `total`.
struct cpu_meter {
  nanos& total;
  nanos start = thread_cpu_ns();
  ~cpu_meter() { total += thread_cpu_ns() - start; }
};

struct broker_state {
  std::unique_ptr<broker_core> core;
  token_ledger ledger;
  std::vector<nanos> published_at;
  nanos first_join_ns = -1, last_leave_ns = -1, first_open_ns = -1, last_grace_ns = 0;
  nanos last_report_ns = 0, started_ns = 0;
  nanos cpu_ns = 0;  // the broker actor's own CPU time (its transport's I/O thread not included)
  nanos last_xi_step_ns = 0;
  std::map<learner_ref, learner_record> records;
  std::set<learner_ref> refused;  // joined with a different layout or policy  // the pace survives the learners' departure at the end
  std::unique_ptr<node_transport> wire;
  std::vector<node_address> learners;
  std::vector<std::uint64_t> shard_incarnations;  // as last heard; 0: not yet
  nanos last_ledger_write_ns = 0;
  std::uint64_t rounds_leased = 0;  // broker recovery: the round lease in the store covers rounds below this
  nanos last_welcome_ns = -1;       // the last Welcome to shards not heard from yet
  std::map<learner_ref, std::string> endpoints;  // where learners listen (their Join), kept with their ledger
  chaos_receiver chaos;  // link shaping from the chaos monkey
  std::vector<std::uint64_t> fragment_versions;  // the newest version the shards published, per fragment
  std::vector<nanos> shard_last_heard;           // per shard; -1: never
  static inline const char* name = "sync_broker";
};

broker_config broker_settings(const mesh_setup& s) {
  broker_config b;
  const mesh_config& m = s.cfg.mesh;
  b.fragments = static_cast<int>(s.plan.fragments.size());
  b.rounds_in_flight = s.policy.rounds_in_flight;
  b.quorum = s.policy.quorum;
  b.grace_factor = m.grace_factor;
  b.adaptive_grace = s.policy.adaptive_grace;
  b.wait_for_all = s.policy.wait_for_all;
  b.steps_per_round = s.policy.steps_per_round;
  b.ema_alpha = m.ema_alpha;
  b.round_timeout_ns = static_cast<nanos>(m.round_timeout_s * 1e9);
  // The transport's heartbeats decide liveness (peer_atom): a learner deep in a
  // long step sends no Progress but is alive. The core's own message timeout
  // is only a backstop.
  b.liveness_timeout_ns = std::max<nanos>(s.cfg.wire.heartbeat_interval_ms * s.cfg.wire.liveness * 1'000'000,
                                          b.round_timeout_ns);
  b.shard_of_fragment = s.shard_of_fragment;
  return b;
}

/// The uptime so far: a gap between publications longer than a few planned round intervals is down time.
double uptime_until(const broker_state& st, const mesh_setup& setup, nanos end) {
  const auto stall = static_cast<nanos>(std::max(1e9, 4 * setup.policy.steps_per_round * static_cast<double>(st.last_xi_step_ns)));
  return st.first_open_ns < 0 ? 1.0 : uptime_from_publications(st.published_at, st.first_open_ns, end, stall);
}

/// The learners' share of time spent on steps whose tokens were merged, since the first Join.
double live_goodput(const broker_state& st, const ledger_totals& l, int learners, nanos now) {
  if (st.first_join_ns < 0 || now <= st.first_join_ns || learners <= 0) return 0;
  return l.merged_step_time_s / (learners * static_cast<double>(now - st.first_join_ns) * 1e-9);
}

void add_broker_metrics(prometheus_text& page, const broker_state& st, const mesh_setup& setup, incarnation inc,
                        nanos now) {
  add_node_metrics(page, broker_address, inc, now - st.started_ns, st.wire->counters());
  const metric_labels l = role_labels(broker_address);
  auto with = [&](const char* key, std::string value) {
    metric_labels x = l;
    x.emplace_back(key, std::move(value));
    return x;
  };
  const broker_counters& c = st.core->counters();
  page.counter("archipelago_rounds_opened_total", "Rounds the broker opened.", static_cast<double>(c.rounds_opened), l);
  page.counter("archipelago_rounds_closed_total", "Rounds closed, by why they closed.",
               static_cast<double>(c.closed_all_eligible), with("reason", "all_eligible"));
  page.counter("archipelago_rounds_closed_total", "Rounds closed, by why they closed.",
               static_cast<double>(c.closed_grace_expired), with("reason", "grace_expired"));
  page.counter("archipelago_rounds_closed_total", "Rounds closed, by why they closed.",
               static_cast<double>(c.closed_timeout), with("reason", "timeout"));
  page.counter("archipelago_rounds_dropped_total", "Rounds closed without a merge (their shard restarted, or a younger round merged).",
               static_cast<double>(c.rounds_aborted + c.rounds_superseded), l);
  page.gauge("archipelago_rounds_open", "Rounds open now (at most mesh.rounds_in_flight per fragment).",
             static_cast<double>(st.core->rounds_open()), l);
  page.counter("archipelago_late_contributions_total", "Contributions that arrived after their round closed.",
               static_cast<double>(c.late), l);
  const auto& history = st.core->history();
  page.gauge("archipelago_quorum_size", "Learners merged in the last closed round.",
             history.empty() ? 0.0 : static_cast<double>(history.back().members.size()), l);
  page.gauge("archipelago_quorum_min", "The minimum quorum K.", static_cast<double>(setup.policy.quorum), l);
  page.gauge("archipelago_grace_seconds", "The last round's grace window after its quorum.",
             static_cast<double>(st.last_grace_ns) * 1e-9, l);
  page.gauge("archipelago_step_time_seconds", "The pace of the learners that form the quorum (xi_step).",
             static_cast<double>(st.core->xi_step_ns().value_or(0)) * 1e-9, l);
  for (std::size_t p = 0; p < st.fragment_versions.size(); ++p)
    page.gauge("archipelago_fragment_version", "The version of each fragment this node holds.",
               static_cast<double>(st.fragment_versions[p]), with("fragment", std::to_string(p)));
  std::size_t live = 0;
  for (const member_view& m : st.core->members()) {
    live += m.live && !m.departed;
    metric_labels who = with("learner", std::to_string(m.learner.value));
    page.gauge("archipelago_learner_last_seen_seconds", "Time since the broker last heard from each learner.",
               static_cast<double>(now - m.last_heard_ns) * 1e-9, who);
  }
  page.gauge("archipelago_learners_live", "Learners alive and not departed.", static_cast<double>(live), l);
  const ledger_totals led = token_ledger::sum(st.ledger.per_learner());
  auto bucket = [&](const char* name, std::uint64_t tokens) {
    page.counter("archipelago_ledger_tokens_total", "The token ledger: processed, and the bucket each processed token ended in.",
                 static_cast<double>(tokens), with("bucket", name));
  };
  bucket("processed", led.processed);
  bucket("merged", led.merged);
  bucket("late", led.late);
  bucket("lost", led.lost);
  bucket("rejected", led.rejected);
  page.gauge("archipelago_ledger_balanced", "1 when merged + late + lost + rejected = processed.", led.balanced() ? 1 : 0, l);
  page.gauge("archipelago_goodput", "Learner time on steps whose tokens were merged, over mesh.learners x time since the first Join.",
             live_goodput(st, led, setup.cfg.mesh.learners, now), l);
  page.gauge("archipelago_uptime", "Share of time since the first round in which the global model advanced.",
             uptime_until(st, setup, now), l);
}

/// The broker's view of the mesh as one JSON object (GET /status; `archipelago status`).
std::string broker_status_json(const broker_state& st, const mesh_setup& setup, incarnation inc, nanos now) {
  auto age_s = [&](nanos t) { return t < 0 ? -1.0 : static_cast<double>(now - t) * 1e-9; };
  const ledger_totals led = token_ledger::sum(st.ledger.per_learner());
  std::string learners = "[";
  for (const member_view& m : st.core->members()) {
    json_line j;
    const learner_ref who{m.learner, m.inc};
    j.add("learner", static_cast<std::uint64_t>(m.learner.value)).add("incarnation", m.inc.value)
        .add("state", m.departed ? "left" : !m.live ? "dead" : m.eligible ? "live" : "joining")
        .add("last_seen_s", age_s(m.last_heard_ns)).add("steps", m.steps_done).add("step_ms", m.step_ema_ns * 1e-6)
        .add("endpoint", st.endpoints.count(who) ? st.endpoints.at(who) : std::string());
    const auto rec = st.records.find(who);
    if (rec != st.records.end()) j.add("merged_tokens", rec->second.ledger.merged);
    learners += (learners.size() > 1 ? "," : "") + j.str();
  }
  std::string shards = "[";
  for (std::size_t s = 0; s < st.shard_incarnations.size(); ++s) {
    json_line j;
    j.add("shard", static_cast<std::uint64_t>(s)).add("incarnation", st.shard_incarnations[s])
        .add("endpoint", setup.shard_endpoints[s]).add("last_seen_s", age_s(st.shard_last_heard[s]));
    shards += (shards.size() > 1 ? "," : "") + j.str();
  }
  std::string versions = "[";
  for (std::size_t p = 0; p < st.fragment_versions.size(); ++p)
    versions += (p ? "," : "") + std::to_string(st.fragment_versions[p]);
  const broker_counters& c = st.core->counters();
  json_line out;
  out.add("mode", setup.cfg.mesh.mode).add("incarnation", inc.value).add("uptime_s", age_s(st.started_ns))
      .add("learners_configured", setup.cfg.mesh.learners).add("quorum", setup.policy.quorum)
      .add("rounds_opened", c.rounds_opened).add("rounds_closed", c.rounds_closed())
      .add("rounds_open", static_cast<std::uint64_t>(st.core->rounds_open())).add("late", c.late)
      .add("grace_ms", static_cast<double>(st.last_grace_ns) * 1e-6)
      .add("goodput", live_goodput(st, led, setup.cfg.mesh.learners, now))
      .add_raw("ledger", "{\"processed\":" + std::to_string(led.processed) + ",\"merged\":" + std::to_string(led.merged) +
                             ",\"late\":" + std::to_string(led.late) + ",\"lost\":" + std::to_string(led.lost) +
                             ",\"rejected\":" + std::to_string(led.rejected) + "}")
      .add("ledger_balanced", led.balanced())
      .add_raw("learners", learners + "]").add_raw("shards", shards + "]").add_raw("fragment_versions", versions + "]");
  return out.str();
}

storage::stored_ledger stored(const ledger_totals& l) {
  return {l.merged, l.late, l.rejected, l.lost, l.processed};
}

/// The tape's record of a round whose fragment version a shard committed.
storage::tape_record tape_entry(const round_record& r, std::uint64_t version) {
  storage::tape_record t;
  t.round = r.round.value;
  t.fragment = r.fragment.value;
  t.opened_ns = r.opened_ns;
  t.quorum_ns = r.quorum_ns;
  t.grace_ns = r.grace_ns;
  t.closed_ns = r.closed_ns;
  t.reason = to_string(r.reason);
  for (const auto& m : r.members) t.members.push_back({m.learner.value, m.inc.value, m.weight, m.tokens, m.steps});
  for (const auto& l : r.late) t.late.push_back({l.learner.value, l.inc.value, 0, 0, 0});
  t.version = version;
  t.committed_ns = wall_clock_ns();
  return t;
}

/// Rounds continue after every round the snapshot (or the broker's own tape) has
/// seen: a resumed shard counts rounds up to its snapshot's as closed.
std::uint64_t first_round_after(const snapshot_context& snaps) {
  std::uint64_t last = 0;
  bool any = false;
  if (snaps.resume_from)
    for (const auto& e : snaps.resume_from->entries) {
      last = std::max(last, e.round);
      any = true;
    }
  if (snaps.writer)
    if (auto tape = snaps.writer->store().last_tape(); tape && *tape) {
      last = std::max(last, (*tape)->round);
      any = true;
    }
  return any ? last + 1 : 0;
}

/// Round numbers are leased from the store in blocks: one synchronous write per block.
constexpr std::uint64_t round_lease_block = 256;
/// The ledger goes to the store this often (a few records; what a restarted broker restores).
constexpr nanos ledger_write_interval_ns = 1'000'000'000;

/// A restarted node broker (snapshot_context::broker_recovery) picks up where its
/// predecessor stopped: rounds numbered after every round it opened (the round
/// lease, the tape), and the token ledger it last stored, each incarnation
/// continued from the step count stored with it (token_ledger::restore). What
/// the predecessor saw after its last ledger write (at most 1 s) is not in the
/// store: those steps are counted again from the learners' cumulative Progress,
/// so `processed` stays exact, but they start as lost and only a later merged
/// (or late) contribution covering them moves them; work the predecessor merged
/// in that window stays counted as lost. The learners' endpoints stored with the
/// ledger let the new broker greet them at once (they re-join; otherwise they find
/// the broker silent only after their liveness timeout). Returns the first round.
std::uint64_t recover_broker(broker_state& st, const snapshot_context& snaps, std::uint64_t first_round,
                             incarnation inc) {
  storage::snapshot_store& store = snaps.writer->store();
  if (auto lease = store.read_round_lease(); !lease)
    std::fprintf(stderr, "archipelago broker: the round lease is unreadable (%s)\n", lease.err().message.c_str());
  else if (*lease)
    first_round = std::max(first_round, (*lease)->rounds_below);
  st.rounds_leased = first_round;
  auto ledgers = store.ledgers();
  if (!ledgers) {
    std::fprintf(stderr, "archipelago broker: the stored ledger is unreadable, counting from the learners' Progress "
                         "only (%s)\n", ledgers.err().message.c_str());
    return first_round;
  }
  std::size_t restored = 0, skipped = 0;
  for (const storage::learner_ledger& l : *ledgers) {
    ledger_totals t;
    t.processed = l.totals.processed;
    t.merged = l.totals.merged;
    t.late = l.totals.late;
    t.lost = l.totals.lost;
    t.rejected = l.totals.rejected;
    t.steps = l.steps;
    t.step_time_s = l.step_time_s;
    t.merged_step_time_s = l.merged_step_time_s;
    const learner_ref who{{l.learner}, incarnation{l.incarnation}};
    // A record without its step count (an older writer) cannot be continued: that
    // incarnation is counted afresh from its Progress (processed stays exact).
    if (!st.ledger.restore(who, t, l.steps)) {
      ++skipped;
      continue;
    }
    st.records[who].ledger = t;
    if (!l.endpoint.empty()) st.endpoints[who] = l.endpoint;
    ++restored;
  }
  const ledger_totals sum = st.ledger.totals();
  if (!ledgers->empty() || first_round > 0)
    std::fprintf(stderr, "archipelago broker: recovered (incarnation %llu): rounds from %llu; the ledger of %zu learner "
                         "incarnation(s) restored (%llu tokens processed, %llu merged)%s\n",
                 static_cast<unsigned long long>(inc.value), static_cast<unsigned long long>(first_round), restored,
                 static_cast<unsigned long long>(sum.processed), static_cast<unsigned long long>(sum.merged),
                 skipped ? ", records without a step count skipped" : "");
  return first_round;
}

/// Before round `round` is announced: the store's round lease must cover it, so a
/// restarted broker numbers after it. Written synchronously, once per block.
void lease_round(broker_state& st, const snapshot_context* snaps, std::uint64_t round, incarnation inc) {
  if (!snaps || !snaps->broker_recovery || !snaps->writer || round < st.rounds_leased) return;
  st.rounds_leased = round + round_lease_block;
  if (auto ok = snaps->writer->store().put_round_lease({st.rounds_leased, inc.value, wall_clock_ns()}); !ok)
    std::fprintf(stderr, "archipelago broker: round lease not written (%s): a restarted broker may reuse round "
                         "numbers\n", ok.err().message.c_str());
}

/// Tells `to` this broker's incarnation (the header) and where its rounds stand.
/// `schedule_step`: where a restarted learner takes up the learning-rate schedule (0: its start).
void send_welcome(broker_state& st, const mesh_setup& setup, node_address to, std::uint64_t schedule_step = 0) {
  auto b = st.wire->make_envelope();
  auto w = b.body().initWelcome();
  w.setFragments(static_cast<std::uint32_t>(setup.plan.fragments.size()));
  w.setHeartbeatIntervalMs(static_cast<std::uint32_t>(setup.cfg.wire.heartbeat_interval_ms));
  w.setCurrentRound(st.core->next_round().value);
  w.setScheduleStep(schedule_step);
  (void)st.wire->send(to, b.finish());
}

caf::behavior broker_actor(caf::stateful_actor<broker_state>* self, const mesh_setup* setup, mesh_stats* stats,
                           const clock_source* clock, const snapshot_context* snaps, incarnation inc) {
  auto& st = self->state;
  st.shard_incarnations.assign(setup->shard_endpoints.size(), 0);
  st.shard_last_heard.assign(setup->shard_endpoints.size(), -1);
  st.fragment_versions.assign(setup->plan.fragments.size(), 0);
  st.started_ns = clock->now();
  broker_config settings = broker_settings(*setup);
  if (snaps) settings.first_round = first_round_after(*snaps);
  if (snaps && snaps->broker_recovery && snaps->writer)
    settings.first_round = recover_broker(st, *snaps, settings.first_round, inc);
  st.core = std::make_unique<broker_core>(settings);
  st.wire = start_mesh_wire(self, *setup, broker_address, setup->broker_endpoint, *clock, inc);
  if (!st.wire) return {};
  st.chaos.accept = setup->cfg.wire.accept_chaos;
  for (std::uint32_t s = 0; s < setup->shard_endpoints.size(); ++s)
    (void)st.wire->add_peer({role::parameter_shard, s}, setup->shard_endpoints[s]);
  // Shards learn this incarnation from a Welcome (again each heartbeat interval
  // until they answer): after a broker restart they drop the old rounds and re-join.
  auto welcome_shards = [self, setup, clock] {
    auto& st = self->state;
    const nanos now = clock->now();
    const nanos interval_ns = setup->cfg.wire.heartbeat_interval_ms * 1'000'000;
    if (st.last_welcome_ns >= 0 && now - st.last_welcome_ns < interval_ns) return;
    st.last_welcome_ns = now;
    for (std::uint32_t s = 0; s < st.shard_incarnations.size(); ++s)
      if (st.shard_incarnations[s] == 0) send_welcome(st, *setup, {role::parameter_shard, s});
  };
  welcome_shards();
  // A restarted broker greets the learners its predecessor knew (the newest incarnation of each): they re-join.
  for (auto it = st.endpoints.begin(); it != st.endpoints.end(); ++it) {
    const auto next = std::next(it);
    if (next != st.endpoints.end() && next->first.learner == it->first.learner) continue;
    const node_address learner{role::learner, it->first.learner.value};
    if (st.wire->add_peer(learner, it->second)) send_welcome(st, *setup, learner);
  }

  // `final`: asked for with report_atom (the end of a run); also adds the rounds' latencies.
  auto report = [self, stats, setup, snaps](nanos now, bool final) {
    auto& st = self->state;
    st.last_report_ns = now;
    st.last_xi_step_ns = st.core->xi_step_ns().value_or(st.last_xi_step_ns);
    const auto step_ns = static_cast<double>(st.last_xi_step_ns);
    std::lock_guard lock(stats->report_mutex);
    broker_report& r = stats->report;
    r.started_ns = st.started_ns;
    r.broker_cpu_s = static_cast<double>(st.cpu_ns) * 1e-9;
    const auto per_learner = st.ledger.per_learner();
    r.ledger = token_ledger::sum(per_learner);
    r.learners.clear();
    for (const auto& [who, totals] : per_learner) st.records[who].ledger = totals;
    for (auto& [who, rec] : st.records) {
      rec.who = who;
      r.learners.push_back(rec);
    }
    const nanos end = st.last_leave_ns >= 0 ? st.last_leave_ns : now;
    r.uptime = uptime_until(st, *setup, end);
    r.first_join_ns = st.first_join_ns;
    r.last_leave_ns = st.last_leave_ns;
    r.xi_step_ms = step_ns * 1e-6;
    r.xi_quorum_ms = st.core->xi_quorum_ns() * 1e-6;
    r.last_grace_ms = static_cast<double>(st.last_grace_ns) * 1e-6;
    r.closed_all_eligible = st.core->counters().closed_all_eligible;
    r.closed_grace_expired = st.core->counters().closed_grace_expired;
    r.closed_timeout = st.core->counters().closed_timeout;
    if (final) {  // at most history_capacity rounds, once per run
      r.round_latency_ms.clear();
      r.round_open_to_published_ms.clear();
      for (const round_record& rec : st.core->history()) {
        if (rec.published_ns < 0) continue;
        r.round_latency_ms.push_back(static_cast<double>(rec.published_ns - rec.closed_ns) * 1e-6);
        r.round_open_to_published_ms.push_back(static_cast<double>(rec.published_ns - rec.opened_ns) * 1e-6);
      }
    }
    if (snaps && snaps->writer && now - st.last_ledger_write_ns >= ledger_write_interval_ns) {
      st.last_ledger_write_ns = now;
      std::vector<storage::learner_ledger> ledgers;
      for (const auto& [who, totals] : per_learner)
        ledgers.push_back({who.learner.value, who.inc.value, stored(totals), totals.steps, totals.step_time_s,
                           totals.merged_step_time_s, st.endpoints.count(who) ? st.endpoints.at(who) : ""});
      (void)snaps->writer->submit(std::move(ledgers));  // a full queue skips one ledger write; the next one catches up
    }
  };

  auto dispatch = [self, stats, clock, snaps, inc] {
    auto& st = self->state;
    for (auto& effect : st.core->take_effects()) {
      if (auto* o = std::get_if<open_round>(&effect)) {
        if (st.first_open_ns < 0) st.first_open_ns = clock->now();
        lease_round(st, snaps, o->round.value, inc);
        auto b = st.wire->make_envelope(o->round.value);
        auto body = b.body().initRoundOpen();
        body.setFragment(o->fragment.value);
        body.setShard(o->shard);
        if (o->shard < st.shard_incarnations.size()) body.setShardIncarnation(st.shard_incarnations[o->shard]);
        (void)st.wire->broadcast(st.learners, b.finish());
      } else if (auto* c = std::get_if<close_round>(&effect)) {
        auto b = st.wire->make_envelope(c->round.value);
        auto body = b.body().initRoundClose();
        body.setFragment(c->fragment.value);
        body.setQuorumNs(c->quorum_ns);
        body.setGraceNs(c->grace_ns);
        body.setReason(c->reason == close_reason::all_eligible    ? wire::CloseReason::ALL_ELIGIBLE
                       : c->reason == close_reason::grace_expired ? wire::CloseReason::GRACE_EXPIRED
                                                                  : wire::CloseReason::TIMEOUT);
        auto members = body.initMembers(static_cast<unsigned>(c->members.size()));
        std::vector<learner_ref> refs;
        for (unsigned i = 0; i < c->members.size(); ++i) {
          members[i].setLearner(c->members[i].learner.value);
          members[i].setIncarnation(c->members[i].inc.value);
          members[i].setWeight(c->members[i].weight);
          refs.push_back({c->members[i].learner, c->members[i].inc});
        }
        st.ledger.on_round_closed(c->round, refs, c->merge());
        if (c->merge())
          for (const auto& who : refs)
            if (auto& rec = st.records[who]; rec.first_merged_ns < 0) rec.first_merged_ns = clock->now();
        st.last_grace_ns = c->grace_ns;
        (void)st.wire->send({role::parameter_shard, c->shard}, b.finish());
        ++stats->rounds_closed;
        stats->members += c->members.size();
      } else if (auto* d = std::get_if<learner_dead>(&effect)) {
        st.records[{d->learner, d->inc}].left_ns = clock->now();
      }
    }
  };

  self->send(self, tick_atom::value);
  return {
      [self, dispatch, report, clock, welcome_shards](tick_atom) {
        cpu_meter meter{self->state.cpu_ns};
        const nanos now = clock->now();
        self->state.core->tick(now);
        dispatch();
        welcome_shards();
        if (now - self->state.last_report_ns >= 250'000'000) report(now, false);
        self->delayed_send(self, std::chrono::milliseconds(2), tick_atom::value);
      },
      [self, dispatch, clock](peer_atom, std::uint8_t kind, std::uint32_t index, bool alive) {
        if (kind != static_cast<std::uint8_t>(role::learner)) return;
        if (alive) {
          self->state.core->on_peer_alive({index}, clock->now());
        } else {
          std::fprintf(stderr, "archipelago broker: learner/%u fell silent (no message or heartbeat): dead\n", index);
          self->state.core->on_peer_lost({index}, clock->now());
        }
        dispatch();
      },
      [self, setup, clock, inc](metrics_atom, const metrics_page& page) {
        add_broker_metrics(*page, self->state, *setup, inc, clock->now());
        return true;
      },
      [self, setup, clock, inc](status_atom) { return broker_status_json(self->state, *setup, inc, clock->now()); },
      [self, report, clock](report_atom) {
        report(clock->now(), true);
        return true;
      },
      [self, setup, dispatch, clock, snaps, stats, inc](const inbound_ptr& m) {
        auto& st = self->state;
        cpu_meter meter{st.cpu_ns};
        const nanos now = clock->now();
        const auto& env = *m->envelope;
        const node_address from = env.sender();
        auto body = env.root().getBody();
        if (env.body() == wire::Envelope::Body::CHAOS_COMMAND) {
          (void)st.chaos.on_command(env, *st.wire, st.wire->config().default_link, now);
          return;
        }
        if (from.kind == role::parameter_shard && from.index < st.shard_incarnations.size()) {
          st.shard_last_heard[from.index] = now;
          std::uint64_t& known = st.shard_incarnations[from.index];
          const std::uint64_t inc = env.header().getIncarnation();
          if (inc > known) {
            if (known != 0) {  // restarted from its snapshot: its open rounds' contributions are gone
              std::fprintf(stderr, "archipelago broker: shard/%u restarted (incarnation %llu)\n", from.index,
                           static_cast<unsigned long long>(inc));
              st.core->on_shard_restarted(from.index, now);
              // A new connection too: the old one may be dead for good (inproc:// never reconnects).
              (void)st.wire->add_peer(from, setup->shard_endpoints[from.index]);
            }
            known = inc;
          }
        }
        if (from.kind == role::learner && st.refused.count({{from.index}, incarnation{env.header().getIncarnation()}}))
          return;  // a refused incarnation is not a member
        switch (env.body()) {
          case wire::Envelope::Body::JOIN: {
            auto join = body.getJoin();
            if (from.kind != role::learner) {  // a shard announcing its (new) incarnation: seen above
              send_welcome(st, *setup, from);
              break;
            }
            (void)st.wire->add_peer(from, join.getEndpoint().cStr());
            if (join.getLayoutFingerprint() != setup->layout.fingerprint() ||
                join.getConfigHash() != mesh_agreement_hash(setup->cfg)) {
              const std::string why =
                  from.to_string() + " refused: its " +
                  (join.getLayoutFingerprint() != setup->layout.fingerprint()
                       ? "model layout (model.* knobs) differs from the mesh's"
                       : "mesh policy (mesh.mode, fragments, shards, inner_steps, rounds_in_flight or "
                         "wire.encoding) differs from the mesh's");
              std::fprintf(stderr, "archipelago broker: %s\n", why.c_str());
              st.refused.insert({{from.index}, incarnation{env.header().getIncarnation()}});
              auto b = st.wire->make_envelope();
              auto e = b.body().initError();
              e.setCode(wire::ErrorCode::MESH_MISMATCH);
              e.setMessage(why);
              e.setInReplyTo(env.header().getSequence());
              (void)st.wire->send(from, b.finish());
              break;
            }
            if (std::find(st.learners.begin(), st.learners.end(), from) == st.learners.end()) st.learners.push_back(from);
            st.core->on_join({from.index}, incarnation{env.header().getIncarnation()}, now);
            st.endpoints[{{from.index}, incarnation{env.header().getIncarnation()}}] = join.getEndpoint().cStr();
            // A restart (an earlier incarnation of this learner is known) takes up the mesh's
            // schedule: the ledger's steps / M. A first start begins at the schedule's start,
            // however late it joins (at a mesh's start the learners come up a few steps apart).
            const bool restarted = std::any_of(st.records.begin(), st.records.end(), [&](const auto& r) {
              return r.first.learner.value == from.index && r.first.inc.value < env.header().getIncarnation();
            });
            const std::uint64_t schedule_step =
                restarted ? st.ledger.totals().steps / static_cast<std::uint64_t>(std::max(1, setup->cfg.mesh.learners)) : 0;
            send_welcome(st, *setup, from, schedule_step);  // after a broker restart: the learner drops the old broker's rounds
            if (st.first_join_ns < 0) st.first_join_ns = now;
            for (auto& [who, rec] : st.records)  // a restart ends the earlier incarnations
              if (who.learner.value == from.index && who.inc.value < env.header().getIncarnation() && rec.left_ns < 0)
                rec.left_ns = now;
            st.records[{{from.index}, incarnation{env.header().getIncarnation()}}].joined_ns = now;
            break;
          }
          case wire::Envelope::Body::LEAVE:
            st.core->on_leave({from.index}, incarnation{env.header().getIncarnation()}, now);
            st.last_leave_ns = now;
            st.records[{{from.index}, incarnation{env.header().getIncarnation()}}].left_ns = now;
            st.endpoints.erase({{from.index}, incarnation{env.header().getIncarnation()}});  // nobody to greet there
            break;
          case wire::Envelope::Body::PROGRESS: {
            auto p = body.getProgress();
            const learner_ref who{{from.index}, incarnation{env.header().getIncarnation()}};
            st.core->on_progress(who.learner, who.inc, p.getStep(), static_cast<nanos>(p.getStepTimeNs()), now);
            st.ledger.on_progress(who, p.getStep(), p.getTokens(), static_cast<nanos>(p.getStepTimeNs()));
            break;
          }
          case wire::Envelope::Body::CONTRIBUTION: {  // a shard's arrival notice
            auto c = body.getContribution();
            const round_number round{env.header().getRound()};
            const learner_ref who{{c.getLearner()}, incarnation{c.getLearnerIncarnation()}};
            if (st.refused.count(who)) break;
            // Buffered for a round of an earlier broker (the shard had not heard of this one yet):
            // that round will never close here; the shard drops it once it hears of this broker.
            const bool earlier_broker = c.getBrokerIncarnation() != 0 && c.getBrokerIncarnation() != inc.value;
            const wire::Verdict verdict =
                earlier_broker && c.getVerdict() == wire::Verdict::BUFFERED ? wire::Verdict::LATE : c.getVerdict();
            switch (verdict) {
              case wire::Verdict::BUFFERED:
                st.ledger.on_arrival(round, who, c.getStep(), c.getSteps());
                st.core->on_contribution(round, who.learner, who.inc, c.getTokens(), c.getSteps(), now);
                break;
              case wire::Verdict::LATE: st.ledger.on_outcome(who, c.getStep(), c.getSteps(), ledger_bucket::late); break;
              case wire::Verdict::REJECTED:
                st.ledger.on_outcome(who, c.getStep(), c.getSteps(), ledger_bucket::rejected);
                break;
            }
            break;
          }
          case wire::Envelope::Body::FRAGMENT_UPDATE: {  // a shard published
            auto u = body.getFragmentUpdate();
            if (u.getCommitted()) {  // ... and later made it durable: the tape records the round
              ++stats->committed;
              const round_record* r = st.core->find_record(round_number{env.header().getRound()});
              if (snaps && snaps->writer && r) (void)snaps->writer->submit(tape_entry(*r, u.getVersion()));
              break;
            }
            st.core->on_published(round_number{env.header().getRound()}, {u.getFragment()}, u.getVersion(), now);
            if (u.getFragment() < st.fragment_versions.size())  // a restarted shard may publish lower ones: the newest is what it holds
              st.fragment_versions[u.getFragment()] = u.getVersion();
            if (st.published_at.size() < (std::size_t{1} << 24)) st.published_at.push_back(now);
            break;
          }
          default: break;
        }
        dispatch();
      },
  };
}

}  // namespace

caf::actor spawn_broker(caf::actor_system& sys, const mesh_setup& setup, mesh_stats& stats,
                        const clock_source& clock, const snapshot_context* snapshots, incarnation inc) {
  return sys.spawn(broker_actor, &setup, &stats, &clock, snapshots, inc);
}

}  // namespace archipelago
