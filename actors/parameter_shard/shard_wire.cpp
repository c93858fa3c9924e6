#include "parameter_shard/shard_wire.hpp"

#include "transport/settings_wire.hpp"

namespace archipelago {
namespace {

wire::Verdict to_wire(contribution_verdict v) {
  return v == contribution_verdict::buffered ? wire::Verdict::BUFFERED
         : v == contribution_verdict::late   ? wire::Verdict::LATE
                                             : wire::Verdict::REJECTED;
}

}  // namespace

robust_config robust_settings(const config& cfg) {
  robust_config r;
  r.enabled = cfg.mesh.robust;
  r.norm_factor = cfg.mesh.robust_norm_factor;
  r.window = static_cast<std::size_t>(cfg.mesh.robust_window);
  r.clip = cfg.mesh.robust_screen == "clip";
  r.trim = static_cast<std::size_t>(cfg.mesh.robust_trim);
  r.min_cosine = cfg.mesh.robust_min_cosine;
  r.cosine_ratio = cfg.mesh.robust_cosine_ratio;
  r.max_anchor_lag = static_cast<std::uint64_t>(cfg.mesh.robust_max_anchor_lag);
  return r;
}

shard_config shard_settings(const mesh_setup& setup, bool record_merges) {
  shard_config sc;
  sc.outer = {setup.cfg.mesh.outer_lr, setup.cfg.mesh.outer_momentum, setup.cfg.mesh.outer_warmup};
  sc.gradient_mode = setup.policy.send_gradients;
  sc.merge_mean = setup.cfg.mesh.merge == "mean";
  sc.adamw_outer = setup.cfg.optimizer;
  sc.schedule_steps = setup.cfg.train.steps;
  sc.record_merges = record_merges;
  sc.robust = robust_settings(setup.cfg);
  return sc;
}

shard_wire::shard_wire(const mesh_setup& setup, std::uint32_t index, incarnation inc, transport::message_port& port,
                       logger& log, shard_store* store, shard_config config, const float* initial_params,
                       std::vector<std::pair<fragment_index, fragment_outer_state>> restored)
    : setup_(setup), index_(index), inc_(inc), port_(port), log_(log), store_(store), owned_(setup.fragments_of(index)),
      core_(std::make_unique<shard_core>(setup.layout, setup.plan, owned_, config, initial_params)) {
  for (auto& [p, state] : restored) {
    // Restoring a fragment the shard owns from a state its own layout produced cannot fail.
    [[maybe_unused]] const archipelago::status ok = core_->restore(p, std::move(state));
  }
  // The start (restored, or the initial state: deterministic, a crash recomputes
  // it) is durable: what the learners may see.
  for (fragment_index p : owned_) visible_[p.value] = {core_->version(p), core_->shared_value(p)};
  chaos_.accept = setup.cfg.wire.accept_chaos;
}

void shard_wire::start() {
  for (std::uint32_t b = 0; b < setup_.brokers(); ++b) (void)port_.add_peer(broker_at(b), setup_.broker_endpoint_of(b));
  send_join();
}

void shard_wire::send_join() {
  auto b = port_.make_envelope();
  auto join = b.body().initJoin();
  join.setLayoutFingerprint(setup_.layout.fingerprint());
  join.setLayout(setup_.layout.description());
  join.setConfigHash(mesh_agreement_hash(setup_.cfg));
  (void)port_.broadcast(broker_.join_targets(setup_.brokers()), b.finish());
}

void shard_wire::on_peer(node_address peer, bool alive) {
  if (alive && peer == broker_.leader()) send_join();
}

/// The broker epoch of any message (broker_follower). A newer one than known is
/// a new broker leading — a restarted one, or a standby that took over: the
/// rounds the old one opened never close, so their buffered contributions go
/// (shard_core::on_broker_restarted), and the new broker learns this shard's
/// incarnation. False: a deposed broker's message, refused (it never merges).
bool shard_wire::follow_broker(const transport::decoded_envelope& env) {
  const std::uint64_t epoch = env.header().getBrokerEpoch();
  switch (broker_.on_message(env.sender(), epoch)) {
    case broker_follower::news::fenced:
      // Counted (broker_messages_fenced); the refusal itself is the answer, the line only a note.
      log_.warn("shard.fenced", "archipelago shard %u: refused %s of broker epoch %llu (epoch %llu leads)", index_,
                env.sender().to_string().c_str(), static_cast<unsigned long long>(epoch),
                static_cast<unsigned long long>(broker_.epoch()));
      transport::refuse_fenced(port_, env, broker_.epoch());
      return false;
    case broker_follower::news::changed: {
      port_.raise_broker_epoch(epoch);
      const node_address leader = broker_.leader();
      // Reconnect now: the old socket may be dead for good (an inproc:// pipe never
      // reconnects), and a broker back within the liveness timeout never looked dead.
      (void)port_.add_peer(leader, setup_.broker_endpoint_of(leader.index));
      const std::size_t dropped = core_->on_broker_restarted();
      log_.info("shard.new_broker", "archipelago shard %u: a new broker leads: %s incarnation %llu (epoch %llu); %zu "
                "buffered contribution(s) of the old one's rounds dropped", index_, leader.to_string().c_str(),
                static_cast<unsigned long long>(epoch >> 8), static_cast<unsigned long long>(epoch), dropped);
      send_join();
      break;
    }
    case broker_follower::news::first:
      port_.raise_broker_epoch(epoch);
      send_join();
      break;
    case broker_follower::news::same: break;
  }
  return true;
}

std::optional<chaos_order> shard_wire::on_message(const transport::decoded_envelope& env, nanos now) {
  if (!follow_broker(env)) return std::nullopt;
  switch (env.body()) {
    case wire::Envelope::Body::CHAOS_COMMAND: {
      auto order = chaos_.on_command(env, port_, log_, now);
      if (order && (order->kind == chaos_order::what::storage_fault || order->kind == chaos_order::what::heal))
        return order;
      break;
    }
    case wire::Envelope::Body::CONTRIBUTION: on_contribution(env); break;
    case wire::Envelope::Body::ROUND_CLOSE: on_round_close(env); break;
    case wire::Envelope::Body::FETCH_FRAGMENT: on_fetch(env); break;
    // The settings changed live, as the leading broker holds them (a Welcome: on (re)joining).
    case wire::Envelope::Body::WELCOME:
      if (env.sender() == broker_.leader()) apply_settings(transport::settings_of(env.root().getBody().getWelcome().getSettings()));
      break;
    case wire::Envelope::Body::RECONFIGURE:
      if (env.sender() == broker_.leader()) apply_settings(transport::settings_of(env.root().getBody().getReconfigure().getSettings()));
      break;
    default: break;
  }
  return std::nullopt;
}

/// `changed`: knobs set live (a Welcome: those that differ from the mesh's configuration;
/// a Reconfigure: every live knob). None: the shard keeps the settings it has.
void shard_wire::apply_settings(const std::vector<live_setting>& changed) {
  if (changed.empty()) return;
  auto next = apply_live_settings(setup_.cfg, changed);
  if (!next) {
    log_.warn("shard.settings_refused", "archipelago shard %u: the broker's live settings %s: %s", index_,
              describe(changed).c_str(), next.err().message.c_str());
    return;
  }
  if (core_->set_robust(robust_settings(*next)))
    log_.info("shard.reconfigured", "archipelago shard %u: robust merge now %s (live: %s)", index_,
              core_->robust().enabled ? "on" : "off", describe(changed).c_str());
}

/// A FragmentUpdate of what the learners may see of `p`.
transport::encoded_message shard_wire::fragment_message(fragment_index p, std::uint64_t round) {
  const visible_state& v = visible_.at(p.value);
  auto b = port_.make_envelope(round);
  auto u = b.body().initFragmentUpdate();
  u.setFragment(p.value);
  u.setVersion(v.version);
  b.add_fp32("fragment/" + std::to_string(p.value), v.theta);  // Θ itself: one buffer for every learner and fetch
  return b.finish();
}

void shard_wire::on_contribution(const transport::decoded_envelope& env) {
  const node_address from = env.sender();
  auto c = env.root().getBody().getContribution();
  const fragment_index p{c.getFragment()};
  std::string why;
  contribution_verdict verdict = contribution_verdict::rejected;
  // The header's epoch (followed above) is at least the round's.
  const std::uint64_t round_broker = c.getBrokerEpoch();
  if (round_broker != 0 && round_broker < broker_.epoch()) {
    verdict = core_->on_earlier_broker_round(c.getTokens());  // its round died with its broker
  } else if (env.tensor_count() == 1 && core_->owns(p) &&
             env.tensor_info(0).getElementCount() == core_->value(p).size()) {
    std::vector<float> delta(env.tensor_info(0).getElementCount());
    if (env.decode_tensor_values(0, delta.data()))
      verdict = core_->on_contribution(round_number{env.header().getRound()}, p,
                                       {{from.index}, incarnation{env.header().getIncarnation()}}, c.getSteps(),
                                       c.getTokens(), std::move(delta), &why, c.getStep(), c.getAnchorVersion());
  }
  if (verdict == contribution_verdict::rejected) {
    // Counted for /metrics; the logger's rate limit keeps a bad learner from flooding the log.
    const std::uint64_t n = ++counts_.rejected;
    log_.warn("shard.rejected", "archipelago shard %u: rejected round %llu from %s: %s (%llu rejected so far)", index_,
              static_cast<unsigned long long>(env.header().getRound()), from.to_string().c_str(),
              why.empty() ? "undecodable tensor" : why.c_str(), static_cast<unsigned long long>(n));
  }
  if (verdict == contribution_verdict::duplicate) return;
  // Arrival notice: the broker admits buffered ones to the round; all go to the ledger.
  auto b = port_.make_envelope(env.header().getRound());
  auto notice = b.body().initContribution();
  notice.setFragment(p.value);
  notice.setSteps(c.getSteps());
  notice.setTokens(c.getTokens());
  notice.setLearner(from.index);
  notice.setLearnerIncarnation(env.header().getIncarnation());
  notice.setStep(c.getStep());
  notice.setBrokerEpoch(round_broker);
  notice.setVerdict(to_wire(verdict));
  (void)port_.send(broker_.leader(), b.finish());
}

void shard_wire::on_round_close(const transport::decoded_envelope& env) {
  auto close = env.root().getBody().getRoundClose();
  const round_number r{env.header().getRound()};
  const fragment_index p{close.getFragment()};
  std::vector<shard_core::decided_member> members;
  const bool merge = close.getQuorumNs() >= 0;  // else aborted: its contributions are dropped unmerged
  if (merge)
    for (auto mb : close.getMembers()) {
      // A broker of before the bound sends neither count (0, 0): the claim stands.
      const bool bounded = mb.getTokens() != 0 || mb.getSteps() != 0 || mb.getWeight() == 0;
      members.push_back({{{mb.getLearner()}, incarnation{mb.getIncarnation()}}, bounded, mb.getTokens(), mb.getSteps()});
    }
  // A fragment whose newest version is not durable yet merges nothing more now: its
  // next version would build on one a crash may take back. The round waits for it
  // (decide_deferred), in order behind any other that waits.
  if (merge && core_->owns(p)) {
    std::deque<deferred_close>& queue = deferred_[p.value];
    if (pending_.count(p.value) != 0 || !queue.empty()) {
      if (queue.size() >= max_deferred_per_fragment) {  // the store has been failing for long: bounded
        const round_number oldest = queue.front().round;
        queue.pop_front();
        ++deferred_dropped_;
        log_.warn("shard.deferred_dropped", "archipelago shard %u: round %llu of fragment %u dropped unmerged: %zu "
                  "rounds already wait for its last version to become durable", index_,
                  static_cast<unsigned long long>(oldest.value), p.value, max_deferred_per_fragment);
        (void)core_->on_round_decided(oldest, p, std::vector<shard_core::decided_member>{});
      }
      queue.push_back({r, std::move(members)});
      ++deferred_rounds_;
      return;
    }
  }
  decide(r, p, members);
}

void shard_wire::decide(round_number r, fragment_index p, const std::vector<shard_core::decided_member>& members) {
  auto published = core_->on_round_decided(r, p, members);
  report_screened();
  if (!published) {
    log_.warn("shard.not_merged", "archipelago shard %u: round %llu not merged: %s", index_,
              static_cast<unsigned long long>(r.value), published.err().message.c_str());
    return;
  }
  if (!published->has_value()) return;
  const std::uint64_t version = (*published)->version;
  if (!store_) return publish(p, version, r, core_->shared_value(p), false);  // nothing to make durable
  pending_commit& pc = pending_[p.value];
  pc.commit = {std::move(**published), core_->outer_state(p), core_->ledger()};
  store_->commit(pc.commit);
}

void shard_wire::decide_deferred(fragment_index p) {
  auto it = deferred_.find(p.value);
  while (it != deferred_.end() && !it->second.empty() && pending_.count(p.value) == 0) {
    const deferred_close next = std::move(it->second.front());
    it->second.pop_front();
    decide(next.round, p, next.members);
  }
}

/// The members the last close set apart, logged: claims above the broker's bound,
/// and mesh.robust's clipped or rejected deltas. A rejected one is announced to the
/// broker as a rejected arrival (before the version it was left out of), so that
/// its ledger credits that work as rejected and its tape does not list it as merged.
void shard_wire::report_screened() {
  for (const round_screening& s : core_->take_screenings())
    if (log_.enabled(log_level::debug))
      log_.debug("shard.screen", "archipelago shard %u: %s", index_, s.describe().c_str());
  for (const screened_contribution& s : core_->take_screened()) {
    const bool claim = s.why == screened_contribution::cause::claim_bound;
    if (claim) {
      ++counts_.rejected;
      refusals_.count("claim_exceeds_bound");
    }
    log_.warn(claim ? "shard.claim_refused" : s.rejected() ? "shard.screened_out" : "shard.clipped",
              "archipelago shard %u: %s round %llu fragment %u from learner/%u: %s", index_,
              s.rejected() ? "rejected" : "clipped", static_cast<unsigned long long>(s.round.value), s.fragment.value,
              s.from.learner.value, s.reason().c_str());
    if (!s.rejected()) continue;
    auto b = port_.make_envelope(s.round.value);
    auto notice = b.body().initContribution();
    notice.setFragment(s.fragment.value);
    notice.setSteps(s.steps);
    notice.setTokens(s.tokens);
    notice.setLearner(s.from.learner.value);
    notice.setLearnerIncarnation(s.from.inc.value);
    notice.setStep(s.learner_step);
    notice.setBrokerEpoch(broker_.epoch());
    notice.setVerdict(wire::Verdict::REJECTED);
    (void)port_.send(broker_.leader(), b.finish());
  }
}

/// A version becomes visible: broadcast to the learners, announced to the broker.
void shard_wire::publish(fragment_index p, std::uint64_t version, round_number round,
                         std::shared_ptr<const std::vector<float>> theta, bool committed) {
  visible_[p.value] = {version, std::move(theta)};
  ++counts_.published;
  counts_.bytes_sent += visible_[p.value].theta->size() * 4 * learners_.size();
  (void)port_.broadcast(learners_, fragment_message(p, round.value));
  auto b = port_.make_envelope(round.value);
  auto u = b.body().initFragmentUpdate();
  u.setFragment(p.value);
  u.setVersion(version);
  u.setCommitted(committed);
  (void)port_.send(broker_.leader(), b.finish());
}

void shard_wire::on_committed(fragment_index p, std::uint64_t version, round_number round) {
  auto it = pending_.find(p.value);
  if (it == pending_.end() || it->second.commit.published.version != version) return;  // not ours, or superseded
  std::shared_ptr<const std::vector<float>> theta = std::move(it->second.commit.state.theta);
  pending_.erase(it);
  publish(p, version, round, std::move(theta), true);
  decide_deferred(p);
}

void shard_wire::on_commit_failed(fragment_index p, std::uint64_t version) {
  if (auto it = pending_.find(p.value); it != pending_.end() && it->second.commit.published.version == version)
    it->second.failed = true;
}

bool shard_wire::retry_commits() {
  bool any = false;
  for (auto& [p, pc] : pending_)
    if (pc.failed) {
      pc.failed = false;
      any = true;
      store_->commit(pc.commit);
    }
  return any;
}

void shard_wire::on_fetch(const transport::decoded_envelope& env) {
  const node_address from = env.sender();
  auto f = env.root().getBody().getFetchFragment();
  // A restarted learner comes back, maybe at a new endpoint: re-point it. At the
  // same endpoint too (a fixed port, inproc://): the old connection may be dead.
  auto& [endpoint, known_inc] = endpoints_[from];
  const std::uint64_t inc = env.header().getIncarnation();
  if (endpoint != f.getReplyEndpoint().cStr() || inc > known_inc) {
    if (endpoint.empty()) learners_.push_back(from);
    endpoint = f.getReplyEndpoint().cStr();
    known_inc = inc;
    (void)port_.add_peer(from, endpoint);
  }
  if (core_->owns({f.getFragment()})) (void)port_.send(from, fragment_message({f.getFragment()}, 0));
}

refusal_counts shard_wire::refusals() const {
  refusal_counts refused = refusals_;
  if (chaos_.refused_sender != 0) refused.by_reason["chaos_sender"] += chaos_.refused_sender;
  return refused;
}

node_status shard_wire::status() const {
  node_status s;
  s.node = {role::parameter_shard, index_};
  s.incarnation = inc_.value;
  s.counts = counts_;
  refusals().add_to(s.counts.refused);
  // mesh.robust's screening: rejects are refusals; clipped members merged scaled down.
  const shard_ledger& led = core_->ledger();
  if (const std::uint64_t by_norm = led.screened_out - led.screened_by_direction - led.screened_stale; by_norm != 0)
    s.counts.refused["robust_reject"] += by_norm;
  if (led.screened_by_direction != 0) s.counts.refused["robust_direction"] += led.screened_by_direction;
  if (led.screened_stale != 0) s.counts.refused["robust_stale"] += led.screened_stale;
  if (led.clipped != 0) s.counts.refused["robust_clip"] += led.clipped;
  s.published_versions.assign(setup_.fragments(), 0);
  for (fragment_index p : owned_) s.published_versions[p.value] = visible_version(p);
  // What is visible is durable (with a store; without one, nothing is).
  s.committed_versions = store_ ? s.published_versions : std::vector<std::uint64_t>(setup_.fragments(), 0);
  return s;
}

void shard_wire::add_metrics(prometheus_text& page) const {
  const metric_labels l = {{"role", to_string(role::parameter_shard)}, {"index", std::to_string(index_)}};
  for (fragment_index p : owned_) {
    metric_labels f = l;
    f.emplace_back("fragment", std::to_string(p.value));
    page.gauge("archipelago_fragment_version", "The version of each fragment this node holds.",
               static_cast<double>(visible_version(p)), f);
  }
  page.counter("archipelago_shard_published_total", "Fragment versions this incarnation merged and published.",
               static_cast<double>(counts_.published), l);
  refusals().add_metrics(page, l);
  page.gauge("archipelago_shard_subscribers", "Learners the shard broadcasts new versions to.",
             static_cast<double>(learners_.size()), l);
  page.gauge("archipelago_shard_undurable_fragments", "Fragments whose newest version is not durable yet (paused).",
             static_cast<double>(pending_.size()), l);
  page.counter("archipelago_shard_deferred_rounds_total",
               "Rounds closed while their fragment's newest version was not durable: merged once it was.",
               static_cast<double>(deferred_rounds_), l);
  page.counter("archipelago_shard_deferred_dropped_total",
               "Deferred rounds dropped unmerged: more than the bound waited for one fragment's durability.",
               static_cast<double>(deferred_dropped_), l);
  const shard_ledger& led = core_->ledger();
  const std::tuple<const char*, std::uint64_t, std::uint64_t> outcomes[] = {
      {"merged", led.merged, led.merged_tokens},
      {"late", led.late, led.late_tokens},
      {"rejected", led.rejected, led.rejected_tokens},
      {"unmerged", led.unmerged, led.unmerged_tokens}};
  for (const auto& [name, contributions, tokens] : outcomes) {
    metric_labels b = l;
    b.emplace_back("outcome", name);
    page.counter("archipelago_shard_contributions_total", "Contributions received, by outcome.",
                 static_cast<double>(contributions), b);
    page.counter("archipelago_shard_contribution_tokens_total", "Tokens of the contributions received, by outcome.",
                 static_cast<double>(tokens), b);
  }
  const std::pair<const char*, std::uint64_t> screened[] = {
      {"clip", led.clipped},
      {"reject", led.screened_out - led.screened_by_direction - led.screened_stale},
      {"reject_direction", led.screened_by_direction},
      {"reject_stale", led.screened_stale}};
  for (const auto& [action, n] : screened) {
    metric_labels b = l;
    b.emplace_back("action", action);
    page.counter("archipelago_shard_screened_total",
                 "mesh.robust: members screened at close, by action: clip or reject (delta norm above the robust "
                 "bound), reject_direction (cosine with the reference direction below its bound), reject_stale "
                 "(anchored beyond mesh.robust_max_anchor_lag, or a replayed delta); "
                 "rejects are also in the rejected outcome, clipped ones merged scaled down.",
                 static_cast<double>(n), b);
  }
}

}  // namespace archipelago
