#include "learner/learner_wire.hpp"

#include <algorithm>

#include "core/prng.hpp"


namespace archipelago {

learner_sync_config learner_settings(const mesh_setup& setup) {
  learner_sync_config sync;
  sync.mix = setup.policy.mix;
  sync.rebase = setup.policy.rebase;
  sync.contribute_after = static_cast<std::uint64_t>(setup.policy.contribute_after);
  sync.wait_slack = setup.policy.wait_slack;
  sync.catch_up = setup.policy.catch_up;
  return sync;
}

learner_wire::learner_wire(const mesh_setup& setup, learner_sync_config sync, std::uint32_t index, incarnation inc,
                           transport::message_port& port, logger& log, learner_model_view model)
    : setup_(setup), index_(index), inc_(inc), port_(port), log_(log), model_(model),
      encoding_(*parse_tensor_encoding(setup.cfg.wire.encoding)),
      core_(std::make_unique<learner_core>(setup.layout, setup.plan, sync)),
      attacker_(derive_seed(setup.cfg.train.seed, 0xa77ac0000ULL + index)),
      to_install_(setup.fragments()), shard_incarnations_(setup.shard_endpoints.size(), 0),
      residuals_(setup.cfg.wire.error_feedback ? setup.fragments() : 0) {
  chaos_.accept = setup.cfg.wire.accept_chaos;
}

void learner_wire::start() {
  for (std::uint32_t b = 0; b < setup_.brokers(); ++b) (void)port_.add_peer(broker_at(b), setup_.broker_endpoint_of(b));
  for (std::uint32_t s = 0; s < setup_.shard_endpoints.size(); ++s)
    (void)port_.add_peer({role::parameter_shard, s}, setup_.shard_endpoints[s]);
  fetch();
  send_join();
}

/// Clone pattern: (re)subscribe with every shard (or just `only_shard`) and fetch its fragments.
void learner_wire::fetch(std::optional<std::uint32_t> only_shard) {
  for (std::uint32_t p = 0; p < setup_.fragments(); ++p)
    if (!only_shard || setup_.shard_of_fragment[p] == *only_shard) fetch_fragment(p);
}

void learner_wire::fetch_fragment(std::uint32_t p) {
  auto b = port_.make_envelope();
  auto f = b.body().initFetchFragment();
  f.setFragment(p);
  f.setReplyEndpoint(port_.endpoint());
  (void)port_.send({role::parameter_shard, setup_.shard_of_fragment[p]}, b.finish());
}

/// Announces this incarnation to the broker (first start, and again whenever the
/// broker may have restarted: a new broker knows no learner until it joins).
void learner_wire::send_join() {
  auto b = port_.make_envelope();
  auto j = b.body().initJoin();
  j.setLayoutFingerprint(setup_.layout.fingerprint());
  j.setLayout(setup_.layout.description());
  j.setConfigHash(mesh_agreement_hash(setup_.cfg));
  j.setBatchTokens(model_.tokens_per_step);
  j.setThreads(model_.threads);
  j.setEndpoint(port_.endpoint());
  (void)port_.broadcast(broker_.join_targets(setup_.brokers(), broker_silent_), b.finish());
}

/// A shard restarted from its snapshot (a higher incarnation) and lost our
/// endpoint. Its fragments re-anchor on the version it recovered — the first
/// it sends, whatever its number — keeping this learner's local progress (no
/// work thrown away). Fetch when asked to.
bool learner_wire::shard_restarted(std::uint32_t shard, std::uint64_t inc) {
  if (inc == 0 || shard >= shard_incarnations_.size() || inc <= shard_incarnations_[shard]) return false;
  const bool restarted = shard_incarnations_[shard] != 0;
  shard_incarnations_[shard] = inc;
  if (!restarted) return false;
  // Reconnect now: the link may sit in a long back-off after the shard's crash,
  // and the new shard cannot call first (it lost our endpoint).
  (void)port_.add_peer({role::parameter_shard, shard}, setup_.shard_endpoints[shard]);
  for (fragment_index p : setup_.fragments_of(shard)) reanchor_.insert(p.value);
  return true;
}

/// The broker epoch of any message (broker_follower). A newer one than known is
/// a new broker leading — a restarted one, or a standby that took over: the
/// rounds of the old one will never close, and the new one's are new rounds
/// whatever their numbers (learner_core::on_broker_restarted). Join again: a
/// broker that greets the learners its predecessor knew has not heard this
/// one's Join yet (one that answers a Join has; a second changes nothing).
/// False: a deposed broker's message, refused; the answer's header tells it.
bool learner_wire::follow_broker(const transport::decoded_envelope& env) {
  const node_address from = env.sender();
  const std::uint64_t epoch = env.header().getBrokerEpoch();
  switch (broker_.on_message(from, epoch)) {
    case broker_follower::news::fenced:
      transport::refuse_fenced(port_, env, broker_.epoch());
      return false;
    case broker_follower::news::changed: {
      port_.raise_broker_epoch(epoch);
      const node_address leader = broker_.leader();
      // Reconnect now: the old socket may be dead for good (an inproc:// pipe never reconnects).
      (void)port_.add_peer(leader, setup_.broker_endpoint_of(leader.index));
      const std::size_t dropped = core_->on_broker_restarted();
      log_.info("learner.new_broker", "archipelago learner/%u: a new broker leads: %s incarnation %llu (epoch %llu); "
                "%zu pending round(s) dropped", index_, leader.to_string().c_str(),
                static_cast<unsigned long long>(epoch >> 8), static_cast<unsigned long long>(epoch), dropped);
      if (done_) break;  // a finished incarnation left (its Leave went to the old broker)
      send_join();
      if (core_->steps_done() > 0) send_progress();  // see below
      break;
    }
    case broker_follower::news::first:
      // A broker that began to lead after this learner's Progress went elsewhere knows no
      // step of it yet, and a dp learner sends none until a round opens: it hears the latest.
      port_.raise_broker_epoch(epoch);
      if (core_->steps_done() > 0 && !done_) send_progress();
      break;
    case broker_follower::news::same: break;
  }
  if (from == broker_.leader()) broker_silent_ = false;
  return true;
}

bool learner_wire::on_peer(node_address peer, bool alive) {
  if (peer.kind == role::parameter_shard && alive && to_install_ != 0 && !done_) {
    ++counts_.refetches;
    fetch(peer.index);
    return false;
  }
  if (peer != broker_.leader() || done_) return false;
  const bool was_silent = broker_silent_;
  broker_silent_ = !alive;
  send_join();
  return !alive && !was_silent;
}

bool learner_wire::on_rejoin_timer() {
  if (!broker_silent_ || done_) return false;
  send_join();
  return true;
}

bool learner_wire::on_join_timer(nanos now) {
  bool again = false;
  if (!welcomed_ && !done_) {  // no broker answered yet: with standbys, none may have led at first
    send_join();
    again = true;
  }
  if (to_install_ != 0) {
    const auto longest = static_cast<nanos>(setup_.cfg.mesh.round_timeout_s * 1e9);
    const nanos stall_bound = longest_install_gap_ns_ < 0 ? longest : std::min(3 * longest_install_gap_ns_, longest);
    if (last_install_ns_ < 0) {
      last_install_ns_ = now;
    } else if (now - last_install_ns_ >= stall_bound) {
      ++counts_.refetches;
      fetch();
      last_install_ns_ = now;
    }
    again = true;
  }
  return again;
}

/// Answers every pending round that is ready (dp: with the gradient of the last step).
/// `with_progress`: a Progress goes first (once, if anything is sent): the broker
/// bounds a contribution's claims by the steps and tokens reported, and the
/// Progress of steps taken while the broker was cut off never arrived.
void learner_wire::send_contributions(bool with_progress) {
  const float* gradient = setup_.policy.send_gradients ? model_.gradients : nullptr;
  while (auto c = core_->next_contribution(model_.params, gradient)) {
    if (with_progress && core_->steps_done() > 0) send_progress();
    with_progress = false;
    if (attacker_.apply(chaos_.attack, chaos_.attack_factor, c->round, c->fragment, c->delta))
      log_.info("learner.attack", "archipelago learner %u: sending a %s contribution to round %llu (chaos drill)",
                index_, to_string(chaos_.attack), static_cast<unsigned long long>(c->round.value));
    auto cb = port_.make_envelope(c->round.value);
    auto body = cb.body().initContribution();
    body.setFragment(c->fragment.value);
    body.setAnchorVersion(c->anchor_version);
    body.setSteps(c->steps);
    // An attacker drill's lie (chaos lie_tokens): the broker's bound cuts it, the shard rejects it.
    body.setTokens(chaos_.token_lie == 1 ? c->tokens
                                         : static_cast<std::uint64_t>(static_cast<double>(c->tokens) * chaos_.token_lie));
    body.setStep(c->step);
    body.setBrokerEpoch(broker_.epoch());  // shards refuse rounds of an older epoch
    if (!add_delta(cb, *c)) {  // a non-finite delta is never sent
      ++non_finite_;
      log_.warn("learner.non_finite", "archipelago learner/%u: contribution to round %llu held back: fragment %u's "
                "delta is not finite (a NaN or Inf in the model)", index_,
                static_cast<unsigned long long>(c->round.value), c->fragment.value);
      continue;
    }
    // What the encoding puts on the wire, not the fp32 delta it came from.
    counts_.bytes_sent += encoded_bytes(encoding_, c->delta.size(), setup_.cfg.wire.block_size);
    ++counts_.contributions;
    (void)port_.send({role::parameter_shard, setup_.shard_of_fragment[c->fragment.value]}, cb.finish());
  }
}

/// The contribution's delta as its tensor frame, at wire.encoding; with
/// wire.error_feedback plus what quantising this fragment's earlier contributions
/// dropped (encode_with_feedback). False: the delta is not finite.
bool learner_wire::add_delta(transport::envelope_builder& b, const contribution_plan& c) {
  const std::string name = "delta/" + std::to_string(c.fragment.value);
  const auto block = static_cast<std::uint32_t>(setup_.cfg.wire.block_size);
  if (!setup_.cfg.wire.error_feedback) return bool(b.add_tensor_values(name, c.delta.data(), c.delta.size(), encoding_, block));
  std::vector<float>& residual = residuals_[c.fragment.value];
  residual.resize(c.delta.size(), 0.f);
  auto bytes = encode_with_feedback(c.delta.data(), c.delta.size(), encoding_, static_cast<int>(block), residual.data());
  if (!bytes) return false;
  b.add_tensor(name, encoding_, c.delta.size(), block, transport::shared_bytes(std::move(*bytes)));
  return true;
}

bool learner_wire::wait_before_step(nanos now) {
  if (!core_->must_wait()) return false;  // decoupled never waits; the others also before leaving
  send_contributions();
  waiting_ = true;
  wait_since_ = now;
  return true;
}

void learner_wire::on_wait_timeout() {
  if (!waiting_) return;
  ++counts_.refetches;
  fetch();
}

void learner_wire::after_step(std::uint64_t tokens, nanos step_ns) {
  core_->on_step(tokens);
  ++counts_.steps;
  counts_.tokens += tokens;
  last_step_ns_ = step_ns;
  send_progress();
  send_contributions();
  if (chaos_.impersonate) send_forged(*chaos_.impersonate);
}

/// An attacker drill (chaos impersonate): with this learner's own key, an envelope
/// whose header claims to come from `as` — as the broker a RoundClose weighing this
/// learner 10^9, as a shard a committed FragmentUpdate, as another learner a
/// Contribution. Over CURVE every one is refused (impersonation); in one process,
/// where no key binds a sender, nothing stops it.
void learner_wire::send_forged(node_address as) {
  const fragment_index p{0};
  transport::envelope_builder b(as, inc_, ++forged_sequence_, 0, broker_.epoch());
  node_address to = {role::parameter_shard, setup_.shard_of_fragment[p.value]};
  switch (as.kind) {
    case role::sync_broker: {
      auto c = b.body().initRoundClose();
      c.setFragment(p.value);
      auto m = c.initMembers(1);
      m[0].setLearner(index_);
      m[0].setIncarnation(inc_.value);
      m[0].setWeight(1e9);
      break;
    }
    case role::parameter_shard: {
      auto u = b.body().initFragmentUpdate();
      u.setFragment(p.value);
      u.setVersion(1'000'000);
      u.setCommitted(true);
      to = broker_.leader();
      break;
    }
    default: {
      auto c = b.body().initContribution();
      c.setFragment(p.value);
      c.setSteps(1);
      c.setTokens(1'000'000);
      c.setBrokerEpoch(broker_.epoch());
      std::vector<float> zero(core_->fragment_floats(p), 0.f);
      if (!b.add_tensor_values("delta/0", zero.data(), zero.size(), tensor_encoding::fp32)) return;
      break;
    }
  }
  (void)port_.send(to, b.finish());
}

/// Where this incarnation stands (cumulative: a repeat changes nothing).
void learner_wire::send_progress() {
  auto b = port_.make_envelope();
  auto p = b.body().initProgress();
  p.setStep(core_->steps_done());  // this incarnation's steps (the ledger counts from 1)
  p.setStepTimeNs(static_cast<std::uint64_t>(last_step_ns_));
  p.setTokens(counts_.tokens);
  p.setFinished(core_->last_step_done());
  (void)port_.send(broker_.leader(), b.finish());
}

bool learner_wire::begin_flush() {
  if (!setup_.cfg.mesh.flush) return false;
  core_->on_last_step();
  send_progress();  // finished: the broker waits for it only in rounds of fragments it holds work on
  send_contributions();
  flushing_ = core_->fragments_with_unmerged_work() != 0;
  return flushing_;
}

void learner_wire::leave(const std::string& reason) {
  done_ = true;
  auto b = port_.make_envelope();
  b.body().initLeave().setReason(reason);
  (void)port_.send(broker_.leader(), b.finish());
}

learner_event learner_wire::on_message(const transport::decoded_envelope& env, nanos now) {
  learner_event out;
  auto body = env.root().getBody();
  if (env.body() == wire::Envelope::Body::CHAOS_COMMAND) {
    (void)chaos_.on_command(env, port_, log_, now);
    return out;
  }
  const node_address from = env.sender();
  if (!follow_broker(env)) return out;
  switch (env.body()) {
    case wire::Envelope::Body::ERROR:
      if (body.getError().getCode() == wire::ErrorCode::MESH_MISMATCH) {
        refusal_ = body.getError().getMessage().cStr();
        out.refused = true;
      }
      break;
    case wire::Envelope::Body::WELCOME:
      // A restarted learner takes up the mesh's schedule where the others are, not
      // at its warm-up (the broker sends 0 to a first start): only once (a slow
      // learner keeps its own pace through later broker restarts).
      if (from.kind == role::sync_broker && !welcomed_) {
        welcomed_ = true;
        out.schedule_step = static_cast<std::int64_t>(body.getWelcome().getScheduleStep());
      }
      break;
    case wire::Envelope::Body::ROUND_OPEN: {
      auto open = body.getRoundOpen();
      if (shard_restarted(open.getShard(), open.getShardIncarnation())) fetch(open.getShard());
      // Behind on the fragment (cut off, or its broadcasts lost): its newest value first.
      if (core_->on_round_open(round_number{env.header().getRound()}, {open.getFragment()}, open.getVersion()) &&
          open.getFragment() < setup_.fragments()) {
        ++counts_.refetches;
        fetch_fragment(open.getFragment());
      }
      send_contributions(true);
      break;
    }
    case wire::Envelope::Body::FRAGMENT_UPDATE:
      if (env.tensor_count() == 1) return on_fragment_update(env, now);
      break;
    default: break;
  }
  return out;
}

learner_event learner_wire::on_fragment_update(const transport::decoded_envelope& env, nanos now) {
  learner_event out;
  auto u = env.root().getBody().getFragmentUpdate();
  const fragment_index p{u.getFragment()};
  // Only the owning shard publishes a fragment (its key binds its index: transport).
  if (env.sender().kind != role::parameter_shard || p.value >= setup_.shard_of_fragment.size() ||
      setup_.shard_of_fragment[p.value] != env.sender().index) {
    refusals_.count("not_owner");
    log_.warn("learner.not_owner", "archipelago learner/%u: refused fragment %u from %s: not its owner", index_,
              p.value, env.sender().to_string().c_str());
    return out;
  }
  (void)shard_restarted(env.sender().index, env.header().getIncarnation());
  if (p.value >= core_->fragments() || env.tensor_info(0).getElementCount() != core_->fragment_floats(p)) return out;
  std::vector<float> value(core_->fragment_floats(p));
  if (!env.decode_tensor_values(0, value.data())) return out;
  if (!core_->installed(p)) {
    if (!core_->install(p, u.getVersion(), value, model_.params)) return out;
    reanchor_.erase(p.value);
    if (last_install_ns_ >= 0) longest_install_gap_ns_ = std::max(longest_install_gap_ns_, now - last_install_ns_);
    last_install_ns_ = now;
    if (--to_install_ == 0 && !stepping_) out.start_stepping = stepping_ = true;
    return out;
  }
  if (env.sender().kind == role::parameter_shard && reanchor_.erase(p.value) != 0)
    core_->reanchor(p, u.getVersion(), value);
  else
    core_->on_fragment_update(p, u.getVersion(), value, model_.params, round_number{env.header().getRound()});
  if (flushing_ && !done_ && core_->fragments_with_unmerged_work() == 0) {
    flushing_ = false;
    out.flushed = true;
  }
  if (waiting_ && !core_->must_wait()) {
    waiting_ = false;
    counts_.wait_ns += static_cast<std::uint64_t>(now - wait_since_);
    out.resume = true;
  }
  return out;
}

refusal_counts learner_wire::refusals() const {
  refusal_counts refused = refusals_;
  if (chaos_.refused_sender != 0) refused.by_reason["chaos_sender"] += chaos_.refused_sender;
  return refused;
}

node_status learner_wire::status() const {
  node_status s;
  s.node = {role::learner, index_};
  s.incarnation = inc_.value;
  s.counts = counts_;
  refusals().add_to(s.counts.refused);
  s.left = done_;
  s.refusal = refusal_;
  return s;
}

void learner_wire::add_metrics(prometheus_text& page) const {
  const metric_labels l = {{"role", to_string(role::learner)}, {"index", std::to_string(index_)}};
  page.counter("archipelago_learner_steps_total", "Inner steps this incarnation took.", static_cast<double>(counts_.steps), l);
  page.counter("archipelago_learner_tokens_total", "Tokens this incarnation trained on.", static_cast<double>(counts_.tokens), l);
  page.counter("archipelago_learner_wait_seconds_total", "Time spent waiting for fragments (synchronous modes).",
               static_cast<double>(counts_.wait_ns) * 1e-9, l);
  page.counter("archipelago_learner_contributions_total", "Fragment contributions sent to the shards.",
               static_cast<double>(counts_.contributions), l);
  page.counter("archipelago_learner_non_finite_total",
               "Contributions held back because their delta held a NaN or an Inf (never sent).",
               static_cast<double>(non_finite_), l);
  refusals().add_metrics(page, l);
  if (forged_sequence_ != 0)
    page.counter("archipelago_learner_forged_total",
                 "Envelopes this learner forged in an attacker drill (chaos impersonate), claiming another sender.",
                 static_cast<double>(forged_sequence_), l);
  page.gauge("archipelago_learner_pending_rounds", "Rounds opened that this learner has not answered yet.",
             static_cast<double>(core_->pending_rounds()), l);
  for (std::uint32_t p = 0; p < core_->fragments(); ++p) {
    metric_labels f = l;
    f.emplace_back("fragment", std::to_string(p));
    page.gauge("archipelago_fragment_version", "The version of each fragment this node holds.",
               static_cast<double>(core_->installed({p}) ? core_->version({p}) : 0), f);
  }
}

}  // namespace archipelago
