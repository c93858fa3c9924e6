// The broker's pages: its figures on /metrics and its view of the mesh on /status.

#include "core/json_line.hpp"
#include "sync_broker/broker_wire.hpp"

namespace archipelago {

node_counters broker_wire::counters() const {
  node_counters out = counts_;
  refusals_.add_to(out.refused);
  if (const std::uint64_t cut = core_->counters().claims_cut; cut != 0) out.refused["claim_cut"] += cut;
  return out;
}

void broker_wire::add_metrics(prometheus_text& page, nanos now) const {
  const metric_labels l = {{"role", to_string(role::sync_broker)}, {"index", std::to_string(leader_of_epoch(epoch_))}};
  auto with = [&](const char* key, std::string value) {
    metric_labels x = l;
    x.emplace_back(key, std::move(value));
    return x;
  };
  const broker_counters& c = core_->counters();
  refusals_.add_metrics(page, l);
  page.counter("archipelago_broker_claims_cut_total",
               "Round members whose claimed tokens or steps exceeded what the broker saw them report (Progress) "
               "or their batch x context: cut to that bound in the round's decision.",
               static_cast<double>(c.claims_cut), l);
  page.counter("archipelago_rounds_opened_total", "Rounds the broker opened.", static_cast<double>(c.rounds_opened), l);
  const std::pair<const char*, std::uint64_t> closed[] = {
      {"all_eligible", c.closed_all_eligible}, {"grace_expired", c.closed_grace_expired}, {"timeout", c.closed_timeout}};
  for (const auto& [reason, n] : closed)
    page.counter("archipelago_rounds_closed_total", "Rounds closed, by why they closed.", static_cast<double>(n),
                 with("reason", reason));
  page.counter("archipelago_rounds_dropped_total",
               "Rounds closed without a merge (their shard restarted, a younger round merged, or nobody was left to "
               "answer them).",
               static_cast<double>(c.rounds_aborted + c.rounds_superseded + c.rounds_unanswerable), l);
  page.counter("archipelago_rounds_skipped_total",
               "Fragment turns passed without a round: its shard silent or busy, its last merge not durable yet, or "
               "no learner left with work on it (the others finished, flushing).",
               static_cast<double>(c.rounds_skipped), l);
  page.counter("archipelago_rounds_held_for_storage_total",
               "Fragment turns held (passed, or waited for) because the fragment's shard had storage.backlog versions "
               "not yet durable: back-pressure, the rounds slowed to its storage.",
               static_cast<double>(c.rounds_held_for_storage), l);
  for (std::uint32_t s = 0; s < core_->shards(); ++s)
    page.gauge("archipelago_shard_undurable_versions",
               "Per shard, its merged versions not yet durable (storage.backlog of them hold its next rounds).",
               static_cast<double>(core_->undurable_versions(s, now)), with("shard", std::to_string(s)));
  page.counter("archipelago_shards_lost_total", "Times a parameter shard fell silent (its fragments paused).",
               static_cast<double>(c.shards_lost), l);
  page.gauge("archipelago_rounds_open", "Rounds open now (at most mesh.rounds_in_flight per parameter shard).",
             static_cast<double>(core_->rounds_open()), l);
  page.counter("archipelago_late_contributions_total", "Contributions that arrived after their round closed.",
               static_cast<double>(c.late), l);
  const auto& history = core_->history();
  page.gauge("archipelago_quorum_size", "Learners merged in the last closed round.",
             history.empty() ? 0.0 : static_cast<double>(history.back().members.size()), l);
  page.gauge("archipelago_quorum_min", "The minimum quorum K (as set live, if it was).",
             static_cast<double>(core_->config().quorum), l);
  page.gauge("archipelago_grace_factor", "The grace factor gamma (as set live, if it was).", core_->config().grace_factor, l);
  page.gauge("archipelago_grace_seconds", "The last round's grace window after its quorum.",
             static_cast<double>(last_grace_ns_) * 1e-9, l);
  page.gauge("archipelago_step_time_seconds", "The pace of the learners that form the quorum (xi_step).",
             static_cast<double>(core_->xi_step_ns().value_or(0)) * 1e-9, l);
  for (std::size_t p = 0; p < fragment_versions_.size(); ++p)
    page.gauge("archipelago_fragment_version", "The version of each fragment this node holds.",
               static_cast<double>(fragment_versions_[p]), with("fragment", std::to_string(p)));
  std::size_t live = 0;
  for (const member_view& m : core_->members()) {
    live += m.live && !m.departed;
    page.gauge("archipelago_learner_last_seen_seconds", "Time since the broker last heard from each learner.",
               static_cast<double>(now - m.last_heard_ns) * 1e-9, with("learner", std::to_string(m.learner.value)));
  }
  page.gauge("archipelago_learners_live", "Learners alive and not departed.", static_cast<double>(live), l);
  const participation_tracker& part = participation_;
  page.counter("archipelago_participation_rounds_total",
               "Rounds settled for participation: their version published, or closed or timed out without one.",
               static_cast<double>(part.rounds()), l);
  page.counter("archipelago_participation_merged_total",
               "Members merged, summed over settled rounds (a member screened out or whose claim was cut is not merged).",
               static_cast<double>(part.merged_total()), l);
  page.counter("archipelago_participation_live_total",
               "Learners live at each settled round's close (with its members), summed over those rounds.",
               static_cast<double>(part.live_total()), l);
  page.gauge("archipelago_participation",
             "Mean over settled rounds of members merged / learners live at close (docs/concepts/accounting.md).",
             part.mean(), l);
  page.gauge("archipelago_round_participation", "Members merged / learners live, of the newest settled round.",
             part.recent().empty() ? 0.0 : part.recent().back().share(), l);
  const ledger_totals led = ledger_.totals();
  auto ledger_counters = [&](const char* name, const char* help, const ledger_totals& t, metric_labels labels) {
    const std::pair<const char*, std::uint64_t> buckets[] = {
        {"processed", t.processed}, {"merged", t.merged}, {"late", t.late},
        {"overwritten", t.overwritten}, {"lost", t.lost}, {"rejected", t.rejected}};
    labels.emplace_back("bucket", "");
    for (const auto& [bucket, tokens] : buckets) {
      labels.back().second = bucket;
      page.counter(name, help, static_cast<double>(tokens), labels);
    }
  };
  ledger_counters("archipelago_ledger_tokens_total",
                  "The token ledger: processed tokens, and the bucket each token-share ended in.", led, l);
  const std::vector<ledger_totals> by_fragment = ledger_.per_fragment();
  const std::vector<double> availability = fragment_availability_until(now);
  for (std::size_t p = 0; p < by_fragment.size(); ++p) {
    ledger_counters("archipelago_fragment_ledger_tokens_total",
                    "The token ledger per fragment: the token-shares of each fragment, by bucket.", by_fragment[p],
                    with("fragment", std::to_string(p)));
    page.gauge("archipelago_fragment_availability",
               "Per fragment, the share of time since the first round in which it advanced.", availability[p],
               with("fragment", std::to_string(p)));
  }
  page.gauge("archipelago_ledger_balanced", "1 when merged + late + overwritten + lost + rejected = processed.",
             led.balanced() ? 1 : 0, l);
  page.gauge("archipelago_goodput", "Learner time on steps whose tokens were merged, over mesh.learners x time since the first Join.",
             live_goodput(led, now), l);
  page.gauge("archipelago_uptime", "Share of time since the first round in which the global model advanced.",
             uptime_until(now), l);
}

std::string broker_wire::status_json(nanos now) const {
  auto age_s = [&](nanos t) { return t < 0 ? -1.0 : static_cast<double>(now - t) * 1e-9; };
  const ledger_totals led = ledger_.totals();
  std::string learners = "[";
  for (const member_view& m : core_->members()) {
    json_line j;
    const learner_ref who{m.learner, m.inc};
    const auto endpoint = endpoints_.find(who);
    j.add("learner", static_cast<std::uint64_t>(m.learner.value)).add("incarnation", m.inc.value)
        .add("state", m.departed ? "left" : !m.live ? "dead" : m.eligible ? "live" : "joining")
        .add("last_seen_s", age_s(m.last_heard_ns)).add("steps", m.steps_done).add("step_ms", m.step_ema_ns * 1e-6)
        .add("endpoint", endpoint == endpoints_.end() ? std::string() : endpoint->second);
    if (const auto rec = records_.find(who); rec != records_.end()) j.add("merged_tokens", rec->second.ledger.merged);
    learners += (learners.size() > 1 ? "," : "") + j.str();
  }
  std::string shards = "[";
  for (std::size_t s = 0; s < shard_incarnations_.size(); ++s) {
    json_line j;
    j.add("shard", static_cast<std::uint64_t>(s)).add("incarnation", shard_incarnations_[s])
        .add("endpoint", setup_.shard_endpoints[s]).add("last_seen_s", age_s(shard_last_heard_[s]))
        .add("undurable_versions", static_cast<std::uint64_t>(core_->undurable_versions(static_cast<std::uint32_t>(s), now)));
    shards += (shards.size() > 1 ? "," : "") + j.str();
  }
  std::string versions = "[";
  for (std::size_t p = 0; p < fragment_versions_.size(); ++p)
    versions += (p ? "," : "") + std::to_string(fragment_versions_[p]);
  const broker_counters& c = core_->counters();
  // The dashboard's: the last rounds closed, what fell silent or joined, availability so far.
  std::string rounds = "[";
  const auto& history = core_->history();
  for (std::size_t i = history.size() > 40 ? history.size() - 40 : 0; i < history.size(); ++i) {
    const round_record& r = history[i];
    json_line j;
    j.add("round", r.round.value).add("fragment", static_cast<std::uint64_t>(r.fragment.value))
        .add("members", static_cast<std::uint64_t>(r.members.size())).add("live", static_cast<std::uint64_t>(r.live))
        .add("quorum_ms", r.quorum_ns < 0 ? -1.0 : static_cast<double>(r.quorum_ns - r.opened_ns) * 1e-6)
        .add("grace_ms", static_cast<double>(r.grace_ns) * 1e-6).add("reason", to_string(r.reason))
        .add("closed_s", age_s(r.closed_ns));
    rounds += (rounds.size() > 1 ? "," : "") + j.str();
  }
  std::string settled = "[";  // participation: the newest rounds whose outcome is known
  for (const participation_round& p : participation_.recent())
    settled += (settled.size() > 1 ? "," : "") + json_line().add("round", p.round).add("live", static_cast<std::uint64_t>(p.live))
                                                   .add("merged", static_cast<std::uint64_t>(p.merged)).str();
  std::string events = "[";
  for (const auto& [t, text] : events_)
    events += (events.size() > 1 ? "," : "") + json_line().add("ago_s", age_s(t)).add("text", text).str();
  const std::vector<double> availability = fragment_availability_until(now);
  double mean_availability = 0;
  for (double a : availability) mean_availability += a / static_cast<double>(std::max<std::size_t>(1, availability.size()));
  json_line out;
  out.add("mode", setup_.cfg.mesh.mode).add("incarnation", inc_.value).add("uptime_s", age_s(started_ns_))
      .add("broker", static_cast<std::uint64_t>(leader_of_epoch(epoch_))).add("leading", true).add("epoch", epoch_)
      .add("learners_configured", setup_.cfg.mesh.learners).add("quorum", core_->config().quorum)
      .add("grace_factor", core_->config().grace_factor)
      .add("settings_live", describe(live_differences(setup_.cfg, live_cfg_)))
      .add("rounds_opened", c.rounds_opened).add("rounds_closed", c.rounds_closed())
      .add("rounds_open", static_cast<std::uint64_t>(core_->rounds_open())).add("late", c.late)
      .add("rounds_held_for_storage", c.rounds_held_for_storage)
      .add("grace_ms", static_cast<double>(last_grace_ns_) * 1e-6)
      .add("goodput", live_goodput(led, now))
      .add_raw("ledger", ledger_json(led))
      .add("ledger_balanced", led.balanced())
      .add("uptime", uptime_until(now)).add("fragment_availability", mean_availability)
      .add("participation", participation_.mean()).add("participation_rounds", participation_.rounds())
      .add_raw("participation_recent", settled + "]")
      .add("rejected", c.rejected).add("stale", c.stale).add("duplicates", c.duplicates)
      .add_raw("learners", learners + "]").add_raw("shards", shards + "]").add_raw("fragment_versions", versions + "]")
      .add_raw("recent_rounds", rounds + "]").add_raw("events", events + "]");
  return out.str();
}

}  // namespace archipelago
