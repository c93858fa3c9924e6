#include "sync_broker/broker_wire.hpp"

#include <algorithm>
#include <utility>

#include "core/prng.hpp"
#include "transport/settings_wire.hpp"

namespace archipelago {
namespace {

storage::stored_ledger stored(const ledger_totals& l) {
  return {l.merged, l.late, l.rejected, l.lost, l.processed, l.overwritten};
}

ledger_totals totals_of(const storage::stored_ledger& l) {
  ledger_totals t;
  t.processed = l.processed;
  t.merged = l.merged;
  t.late = l.late;
  t.overwritten = l.overwritten;
  t.lost = l.lost;
  t.rejected = l.rejected;
  return t;
}

std::vector<std::uint64_t> fragment_floats(const mesh_setup& setup) {
  std::vector<std::uint64_t> floats;
  for (const auto& f : setup.plan.fragments) floats.push_back(f.floats);
  return floats;
}

/// The tape's record of a round whose fragment version a shard committed (the store stamps the time).
storage::tape_record tape_entry(const round_record& r, std::uint64_t version, std::uint64_t epoch) {
  storage::tape_record t;
  t.broker_epoch = epoch;
  t.round = r.round.value;
  t.fragment = r.fragment.value;
  t.opened_ns = r.opened_ns;
  t.quorum_ns = r.quorum_ns;
  t.grace_ns = r.grace_ns;
  t.closed_ns = r.closed_ns;
  t.reason = to_string(r.reason);
  for (const auto& m : r.members) t.members.push_back({m.learner.value, m.inc.value, m.weight, m.tokens, m.steps});
  for (const auto& l : r.late) t.late.push_back({l.learner.value, l.inc.value, 0, 0, 0});
  for (const auto& m : r.screened_out) t.screened_out.push_back({m.learner.value, m.inc.value, m.weight, m.tokens, m.steps});
  t.version = version;
  return t;
}

wire::CloseReason to_wire(close_reason r) {
  return r == close_reason::all_eligible    ? wire::CloseReason::ALL_ELIGIBLE
         : r == close_reason::grace_expired ? wire::CloseReason::GRACE_EXPIRED
                                            : wire::CloseReason::TIMEOUT;
}

}  // namespace

broker_config broker_settings(const mesh_setup& s) {
  broker_config b;
  const mesh_config& m = s.cfg.mesh;
  b.fragments = static_cast<int>(s.fragments());
  b.rounds_in_flight = s.policy.rounds_in_flight;
  b.quorum = s.policy.quorum;
  b.grace_factor = m.grace_factor;
  b.adaptive_grace = s.policy.adaptive_grace;
  b.wait_for_all = s.policy.wait_for_all;
  b.steps_per_round = s.policy.steps_per_round;
  b.ema_alpha = m.ema_alpha;
  b.round_timeout_ns = static_cast<nanos>(m.round_timeout_s * 1e9);
  b.storage_backlog = static_cast<int>(s.cfg.storage.backlog);
  // The transport's heartbeats decide liveness (on_peer): a learner deep in a
  // long step sends no Progress but is alive. The core's own message timeout
  // is only a backstop.
  b.liveness_timeout_ns = std::max<nanos>(s.cfg.wire.heartbeat_interval_ms * s.cfg.wire.liveness * 1'000'000,
                                          b.round_timeout_ns);
  b.shard_of_fragment = s.shard_of_fragment;
  b.order = parse_fragment_order(m.fragment_order).value_or(fragment_order::round_robin);  // the knob is checked when parsed
  b.order_seed = derive_seed(s.cfg.train.seed, 0x6f72646572);  // "order"
  // A learner's claims are bounded by its Progress and its batch × context.
  b.bound_claims = true;
  for (int l = 0; l < s.cfg.mesh.learners; ++l)
    b.tokens_per_step_max.push_back(static_cast<std::uint64_t>(learner_profile_of(s.cfg, l).batch) * s.shape.context);
  return b;
}

broker_wire::broker_wire(const mesh_setup& setup, broker_config settings, incarnation inc,
                         transport::message_port& port, logger& log, broker_store* store, const broker_start& start,
                         nanos now)
    : setup_(setup), inc_(inc), epoch_(start.epoch != 0 ? start.epoch : broker_epoch_of(inc.value, 0)), port_(port),
      log_(log),
      store_(store), live_cfg_(setup.cfg), lease_(start.recovery && store),
      ledger_write_interval_ns_(start.ledger_write_interval_ns), ledger_(fragment_floats(setup)), started_ns_(now),
      tape_(3 * start.ledger_write_interval_ns) {
  shard_incarnations_.assign(setup.shard_endpoints.size(), 0);
  shard_last_heard_.assign(setup.shard_endpoints.size(), -1);
  fragment_versions_.assign(setup.fragments(), 0);
  fragment_published_at_.assign(setup.fragments(), {});
  settings.first_round = start.first_round;
  if (start.recovery) settings.first_round = recover(start);
  core_ = std::make_unique<broker_core>(settings);
  if (start.recovery) restore_settings(start.settings);
  port_.raise_broker_epoch(epoch_);
  for (std::uint32_t b = 0; b < setup.brokers(); ++b)
    if (b != leader_of_epoch(epoch_)) standbys_.push_back(broker_at(b));
  if (!standbys_.empty())  // the tape its store holds, for a standby that misses some of it
    for (const storage::tape_record& t : start.tape) tape_.append(t.round, storage::encode_record(t));
}

/// A restarted node broker picks up where its predecessor stopped: rounds
/// numbered after every round it opened (the round lease, the tape), and the
/// token ledger it last stored, each incarnation continued from the step count
/// stored with it (token_ledger::restore), its last steps (the tail: the work
/// in flight, not yet merged) still open to the outcomes of later contributions
/// that cover them. What the predecessor saw after its last ledger write (at
/// most ledger_write_interval_ns) is not in the store: those steps are counted
/// again from the learners' cumulative Progress, so `processed` stays exact,
/// but they start as lost and only a later merged (or late) contribution
/// covering them moves them; work the predecessor merged in that window stays
/// counted as lost. The learners' endpoints stored with the
/// ledger let the new broker greet them at once (they re-join; otherwise they
/// find the broker silent only after their liveness timeout). Returns the first round.
std::uint64_t broker_wire::recover(const broker_start& start) {
  const std::uint64_t first_round = std::max(start.first_round, start.rounds_leased);
  rounds_leased_ = first_round;
  std::size_t restored = 0, skipped = 0;
  for (const storage::learner_ledger& l : start.ledgers) {
    ledger_totals t = totals_of(l.totals);
    t.steps = l.steps;
    t.step_time_s = l.step_time_s;
    t.merged_step_time_s = l.merged_step_time_s;
    std::vector<ledger_totals> by_fragment;
    for (const storage::stored_ledger& f : l.fragments) by_fragment.push_back(totals_of(f));
    for (ledger_totals& f : by_fragment) f.steps = l.steps;
    const learner_ref who{{l.learner}, incarnation{l.incarnation}};
    // A record without its step count or its fragments (an older writer) cannot be
    // continued: that incarnation is counted afresh from its Progress (processed stays exact).
    if (!ledger_.restore(who, t, by_fragment, l.steps, {l.tail_tokens, l.tail_time_us, l.tail_buckets})) {
      ++skipped;
      continue;
    }
    records_[who].ledger = t;
    if (!l.endpoint.empty()) endpoints_[who] = l.endpoint;
    ++restored;
  }
  const ledger_totals sum = ledger_.totals();
  if (!start.ledgers.empty() || first_round > 0)
    log_.info("broker.recovered", "archipelago broker: recovered (incarnation %llu): rounds from %llu; the ledger of "
              "%zu learner incarnation(s) restored (%llu tokens processed, %llu merged)%s",
              static_cast<unsigned long long>(inc_.value), static_cast<unsigned long long>(first_round), restored,
              static_cast<unsigned long long>(sum.processed), static_cast<unsigned long long>(sum.merged),
              skipped ? ", records without a step count skipped" : "");
  return first_round;
}

/// The live changes its predecessor made, as the tape records them, in force again
/// (and in every Welcome): the configuration's values are not. A note that no longer
/// checks (a configuration changed since) is said and left out; a change not yet
/// taped when the predecessor stopped is not on the tape, and is lost.
void broker_wire::restore_settings(const std::vector<std::string>& notes) {
  for (const std::string& note : notes) {
    auto changes = parse_tape_settings(note);
    auto next = changes ? apply_live_settings(live_cfg_, *changes) : changes.err();
    if (!next) {
      log_.error("broker.settings_restore", "archipelago broker: the tape's live change '%s' is not restored: %s",
                 note.c_str(), next.err().message.c_str());
      continue;
    }
    live_cfg_ = std::move(*next);
  }
  const std::vector<live_setting> live = live_differences(setup_.cfg, live_cfg_);
  if (live.empty()) return;
  if (auto first = core_->reconfigure(live_cfg_.mesh.quorum, live_cfg_.mesh.grace_factor); !first) {
    log_.error("broker.settings_restore", "archipelago broker: the tape's live changes are not restored: %s",
               first.err().message.c_str());
    live_cfg_ = setup_.cfg;
    return;
  }
  log_.info("broker.settings_restored", "archipelago broker: live changes restored from the tape: %s",
            describe(live).c_str());
}

void broker_wire::start(nanos now) {
  for (node_address b : standbys_) (void)port_.add_peer(b, setup_.broker_endpoint_of(b.index));
  if (!standbys_.empty()) write_ledger(now, true);  // the standbys hear of this epoch at once
  for (std::uint32_t s = 0; s < setup_.shard_endpoints.size(); ++s)
    (void)port_.add_peer({role::parameter_shard, s}, setup_.shard_endpoints[s]);
  welcome_silent_shards(now);
  // A restarted broker greets the learners its predecessor knew (the newest incarnation of each): they re-join.
  for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it) {
    const auto next = std::next(it);
    if (next != endpoints_.end() && next->first.learner == it->first.learner) continue;
    const node_address learner{role::learner, it->first.learner.value};
    if (port_.add_peer(learner, it->second)) send_welcome(learner);
  }
}

/// Before round `round` is announced: the store's round lease must cover it, so a
/// restarted broker numbers after it. Written synchronously, once per block.
void broker_wire::lease_round(std::uint64_t round, nanos now) {
  if (!lease_ || round < rounds_leased_) return;
  rounds_leased_ = round + round_lease_block;
  if (auto ok = store_->lease_rounds(rounds_leased_, inc_); !ok)
    log_.error("broker.lease_write", "archipelago broker: round lease not written (%s): a restarted broker may reuse "
               "round numbers", ok.err().message.c_str());
  replicate({}, false, now);  // the standbys hear of the lease before its rounds are announced
}

/// Tells `to` this broker's incarnation (the header) and where its rounds stand.
/// `schedule_step`: where a restarted learner takes up the learning-rate schedule (0: its start).
void broker_wire::send_welcome(node_address to, std::uint64_t schedule_step) {
  auto b = port_.make_envelope();
  auto w = b.body().initWelcome();
  w.setFragments(static_cast<std::uint32_t>(setup_.fragments()));
  w.setHeartbeatIntervalMs(static_cast<std::uint32_t>(setup_.cfg.wire.heartbeat_interval_ms));
  w.setCurrentRound(core_->next_round().value);
  w.setScheduleStep(schedule_step);
  const std::vector<live_setting> changed = live_differences(setup_.cfg, live_cfg_);
  transport::set_settings(w.initSettings(static_cast<unsigned>(changed.size())), changed);
  (void)port_.send(to, b.finish());
}

/// An operator's change (Reconfigure, from an admin key): checked like a config file
/// against the values in force, applied to rounds opened from now on, forwarded to
/// the shards (mesh.robust* are theirs), noted for the tape; answered at the reply
/// endpoint with an Ack (the first round under the new values) or an Error saying why not.
void broker_wire::on_reconfigure(const transport::decoded_envelope& env, nanos now) {
  const node_address from = env.sender();
  auto rc = env.root().getBody().getReconfigure();
  const std::vector<live_setting> changes = transport::settings_of(rc.getSettings());
  auto next = from.kind == role::admin ? apply_live_settings(live_cfg_, changes)
                                       : expected<config>(make_error(errc::invalid_input, "only an admin may reconfigure"));
  expected<round_number> first = next ? core_->reconfigure(next->mesh.quorum, next->mesh.grace_factor) : next.err();
  const std::string what = describe(changes);
  auto reply = port_.make_envelope();
  if (!first) {
    refusals_.count("reconfigure_refused");
    log_.warn("broker.reconfigure_refused", "archipelago broker: refused %s's change %s: %s", from.to_string().c_str(),
              what.c_str(), first.err().message.c_str());
    note_event(now, "refused the change " + what + ": " + first.err().message);
    auto e = reply.body().initError();
    e.setCode(wire::ErrorCode::REFUSED);
    e.setMessage(first.err().message);
    e.setInReplyTo(env.header().getSequence());
  } else {
    live_cfg_ = std::move(*next);
    const std::string note = "from round " + std::to_string(first->value) + ": " + what;
    tape_note_ += (tape_note_.empty() ? "" : "; ") + note;
    log_.info("broker.reconfigured", "archipelago broker: %s set live by %s", note.c_str(), from.to_string().c_str());
    note_event(now, "set live " + note);
    const std::vector<live_setting> changed = live_values(live_cfg_);
    for (std::uint32_t s = 0; s < shard_incarnations_.size(); ++s) {
      auto b = port_.make_envelope();
      transport::set_settings(b.body().initReconfigure().initSettings(static_cast<unsigned>(changed.size())), changed);
      (void)port_.send({role::parameter_shard, s}, b.finish());
    }
    reply.body().initAck().setSequence(first->value);
  }
  if (from.kind == role::admin && rc.getReplyEndpoint().size() > 0)
    (void)port_.add_peer(from, rc.getReplyEndpoint().cStr());
  (void)port_.send(from, reply.finish());
}

/// Shards learn this incarnation from a Welcome (again each heartbeat interval
/// until they answer): after a broker restart they drop the old rounds and re-join.
void broker_wire::welcome_silent_shards(nanos now) {
  const nanos interval_ns = setup_.cfg.wire.heartbeat_interval_ms * 1'000'000;
  if (last_welcome_ns_ >= 0 && now - last_welcome_ns_ < interval_ns) return;
  last_welcome_ns_ = now;
  for (std::uint32_t s = 0; s < shard_incarnations_.size(); ++s)
    if (shard_incarnations_[s] == 0) send_welcome({role::parameter_shard, s});
}

void broker_wire::tick(nanos now) {
  core_->tick(now);
  dispatch(now);
  participation_.tick(now, core_->config().round_timeout_ns);  // a version not published by then merged nothing
  welcome_silent_shards(now);
  if ((store_ || !standbys_.empty()) && now - last_ledger_write_ns_ >= ledger_write_interval_ns_) write_ledger(now);
}

/// The standbys' copy of what a restarted broker reads back from its store (BrokerState):
/// the round lease, the ledger records changed since the last copy (every one when
/// `whole`, and every 30th copy, which makes good a lost message), and each standby's
/// next stretch of the tape log (tape_log: from what it acknowledged, at most
/// tape_budget_bytes a copy), in messages of at most ~256 KiB (the envelope limit is
/// 1 MiB). Sent on the control lane: only what changed, so that a long run's hundreds
/// of finished incarnations do not crowd the heartbeats on a slow link.
void broker_wire::replicate(const std::vector<storage::learner_ledger>& ledgers, bool whole, nanos now) {
  if (standbys_.empty()) return;
  constexpr std::size_t chunk_bytes = 256 * 1024, tape_budget_bytes = 64 * 1024;
  if (!ledgers.empty() && copies_++ % 30 == 0) whole = true;
  std::vector<std::string> ledger_records;
  for (const auto& l : ledgers) {
    std::string record = storage::encode_record(l);
    std::size_t& sent = copied_[{{l.learner}, incarnation{l.incarnation}}];
    const std::size_t hash = std::hash<std::string>{}(record);
    if (!whole && sent == hash) continue;
    sent = hash;
    ledger_records.push_back(std::move(record));
  }
  const std::uint64_t leased = std::max(rounds_leased_, core_->next_round().value);
  for (const node_address standby : standbys_) {
    const tape_log::chunk tape = tape_.next_for(standby.index, tape_budget_bytes, now);
    std::size_t next_ledger = 0, next_tape = 0;
    do {
      std::size_t bytes = 0, ledger_end = next_ledger, tape_end = next_tape;
      while (ledger_end < ledger_records.size() && (bytes == 0 || bytes + ledger_records[ledger_end].size() < chunk_bytes))
        bytes += ledger_records[ledger_end++].size();
      while (tape_end < tape.records.size() && (bytes == 0 || bytes + tape.records[tape_end]->size() < chunk_bytes))
        bytes += tape.records[tape_end++]->size();
      auto b = port_.make_envelope();
      auto state = b.body().initBrokerState();
      state.setRoundsLeased(leased);
      auto ledger = state.initLedger(static_cast<unsigned>(ledger_end - next_ledger));
      for (unsigned i = 0; i < ledger.size(); ++i) {
        const std::string& r = ledger_records[next_ledger + i];
        ledger.set(i, capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(r.data()), r.size()));
      }
      auto records = state.initTape(static_cast<unsigned>(tape_end - next_tape));
      for (unsigned i = 0; i < records.size(); ++i) {
        const std::string& r = *tape.records[next_tape + i];
        records.set(i, capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(r.data()), r.size()));
      }
      state.setTapeFrom(tape.from + next_tape);
      state.setTapeOldest(tape.oldest);
      next_ledger = ledger_end;
      next_tape = tape_end;
      (void)port_.send(standby, b.finish());
    } while (next_ledger < ledger_records.size() || next_tape < tape.records.size());
  }
}

void broker_wire::write_ledger(nanos now, bool whole) {
  last_ledger_write_ns_ = now;
  std::vector<storage::learner_ledger> ledgers;
  for (const auto& [who, totals] : ledger_.per_learner()) {
    const auto endpoint = endpoints_.find(who);
    std::vector<storage::stored_ledger> fragments;
    for (const ledger_totals& f : ledger_.fragments_of(who)) fragments.push_back(stored(f));
    ledger_tail tail = ledger_.tail_of(who);
    ledgers.push_back({who.learner.value, who.inc.value, stored(totals), totals.steps, totals.step_time_s,
                       totals.merged_step_time_s, endpoint == endpoints_.end() ? "" : endpoint->second,
                       std::move(fragments), std::move(tail.tokens), std::move(tail.time_us),
                       std::move(tail.buckets)});
  }
  if (store_) store_->write_ledger(ledgers);
  replicate(ledgers, whole, now);
}

void broker_wire::on_peer(node_address peer, bool alive, nanos now) {
  if (peer.kind == role::sync_broker) {
    // A broker back (a restarted primary, listening before it leads): a fresh connection
    // (the old one may sit in a long back-off) and this leader's state at once, whose
    // epoch it then follows instead of leading.
    if (alive && peer.index < setup_.brokers()) {
      (void)port_.add_peer(peer, setup_.broker_endpoint_of(peer.index));
      tape_.on_reconnect(peer.index);
      write_ledger(now, true);
    }
    return;
  }
  if (peer.kind == role::parameter_shard) {
    note_event(now, peer.to_string() + (alive ? " heard again" : " fell silent: its fragments pause"));
    if (alive) {
      core_->on_shard_alive(peer.index, now);
    } else {
      log_.warn("broker.shard_silent", "archipelago broker: shard/%u fell silent: its fragments pause, the others go on",
                peer.index);
      core_->on_shard_lost(peer.index, now);
    }
    return dispatch(now);
  }
  if (peer.kind != role::learner) return;
  if (!alive && core_->has_departed({peer.index})) return;  // it said Leave, then exited: no news
  note_event(now, peer.to_string() + (alive ? " heard again" : " fell silent: dead"));
  if (alive) {
    core_->on_peer_alive({peer.index}, now);
  } else {
    log_.warn("broker.learner_silent", "archipelago broker: learner/%u fell silent (no message or heartbeat): dead",
              peer.index);
    core_->on_peer_lost({peer.index}, now);
  }
  dispatch(now);
}

/// Turns the core's effects into messages: RoundOpen to every learner, RoundClose to the owning shard.
void broker_wire::dispatch(nanos now) {
  for (auto& effect : core_->take_effects()) {
    if (auto* o = std::get_if<open_round>(&effect)) {
      if (first_open_ns_ < 0) first_open_ns_ = now;
      lease_round(o->round.value, now);
      auto b = port_.make_envelope(o->round.value);
      auto body = b.body().initRoundOpen();
      body.setFragment(o->fragment.value);
      body.setShard(o->shard);
      if (o->shard < shard_incarnations_.size()) body.setShardIncarnation(shard_incarnations_[o->shard]);
      if (o->fragment.value < fragment_versions_.size()) body.setVersion(fragment_versions_[o->fragment.value]);
      (void)port_.broadcast(learners_, b.finish());
    } else if (auto* c = std::get_if<close_round>(&effect)) {
      auto b = port_.make_envelope(c->round.value);
      auto body = b.body().initRoundClose();
      body.setFragment(c->fragment.value);
      body.setQuorumNs(c->quorum_ns);
      body.setGraceNs(c->grace_ns);
      body.setReason(to_wire(c->reason));
      auto members = body.initMembers(static_cast<unsigned>(c->members.size()));
      std::vector<learner_ref> refs;
      for (unsigned i = 0; i < c->members.size(); ++i) {
        members[i].setLearner(c->members[i].learner.value);
        members[i].setIncarnation(c->members[i].inc.value);
        members[i].setWeight(c->members[i].weight);
        members[i].setTokens(c->members[i].bounded_tokens);
        members[i].setSteps(c->members[i].bounded_steps);
        // A member whose claim was cut is rejected by the shard: its window is not credited as merged.
        if (c->members[i].bounded_tokens == c->members[i].tokens && c->members[i].bounded_steps == c->members[i].steps)
          refs.push_back({c->members[i].learner, c->members[i].inc});
      }
      ledger_.on_round_closed(c->round, refs, c->merge());  // merged once the shard publishes it
      participation_.on_close(c->round.value, c->fragment.value, c->live, refs, c->merge(), now);
      last_grace_ns_ = c->grace_ns;
      (void)port_.send({role::parameter_shard, c->shard}, b.finish());
      ++counts_.rounds_closed;
      counts_.members += c->members.size();
    } else if (auto* d = std::get_if<learner_dead>(&effect)) {
      records_[{d->learner, d->inc}].left_ns = now;
    }
  }
}

/// A message from a shard: a higher incarnation than the one known restarted
/// from its snapshot, and the contributions it held for its open rounds are gone.
void broker_wire::shard_seen(node_address from, std::uint64_t inc, nanos now) {
  shard_last_heard_[from.index] = now;
  std::uint64_t& known = shard_incarnations_[from.index];
  if (inc <= known) return;
  if (known != 0) {
    log_.info("broker.shard_restarted", "archipelago broker: shard/%u restarted (incarnation %llu)", from.index,
              static_cast<unsigned long long>(inc));
    core_->on_shard_restarted(from.index, now);
    // A new connection too: the old one may be dead for good (inproc:// never reconnects).
    (void)port_.add_peer(from, setup_.shard_endpoints[from.index]);
  }
  known = inc;
}

void broker_wire::on_message(const transport::decoded_envelope& env, nanos now) {
  const node_address from = env.sender();
  if (env.body() == wire::Envelope::Body::CHAOS_COMMAND) return;  // the seat obeys them, leading or not (broker_seat)
  const learner_ref who{{from.index}, incarnation{env.header().getIncarnation()}};
  if (from.kind == role::parameter_shard && from.index < shard_incarnations_.size())
    shard_seen(from, env.header().getIncarnation(), now);
  if (from.kind == role::learner && refused_.count(who)) return;  // a refused incarnation is not a member
  switch (env.body()) {
    case wire::Envelope::Body::JOIN:
      if (from.kind == role::learner) on_join(env, now);
      else send_welcome(from);  // a shard announcing its (new) incarnation: seen above
      break;
    case wire::Envelope::Body::LEAVE: on_leave(who, now); break;
    case wire::Envelope::Body::PROGRESS: {
      auto p = env.root().getBody().getProgress();
      // Membership needs a Join (its endpoint: rounds are announced there); a learner's
      // Progress may come first when this broker began to lead after the learner's Join
      // went nowhere. The ledger counts it (Progress is cumulative); a learner follows
      // every Join with its latest Progress, which the core then hears.
      if (std::find(learners_.begin(), learners_.end(), from) != learners_.end())
        core_->on_progress(who.learner, who.inc, p.getStep(), static_cast<nanos>(p.getStepTimeNs()), now, p.getTokens(),
                           p.getFinished());
      ledger_.on_progress(who, p.getStep(), p.getTokens(), static_cast<nanos>(p.getStepTimeNs()));
      break;
    }
    case wire::Envelope::Body::CONTRIBUTION: on_arrival(env, now); break;  // a shard's arrival notice
    case wire::Envelope::Body::RECONFIGURE: on_reconfigure(env, now); break;
    case wire::Envelope::Body::FRAGMENT_UPDATE: on_fragment_update(env, now); break;  // a shard published
    case wire::Envelope::Body::ACK:  // a standby has this leader's tape log up to the sequence
      if (from.kind == role::sync_broker && env.header().getBrokerEpoch() == epoch_)
        tape_.on_ack(from.index, env.root().getBody().getAck().getSequence(), now);
      return;
    default: break;
  }
  dispatch(now);
}

void broker_wire::on_join(const transport::decoded_envelope& env, nanos now) {
  const node_address from = env.sender();
  const incarnation inc{env.header().getIncarnation()};
  auto join = env.root().getBody().getJoin();
  (void)port_.add_peer(from, join.getEndpoint().cStr());
  if (join.getLayoutFingerprint() != setup_.layout.fingerprint() ||
      join.getConfigHash() != mesh_agreement_hash(setup_.cfg)) {
    std::string why = from.to_string() + " refused: its " +
                      (join.getLayoutFingerprint() != setup_.layout.fingerprint()
                           ? "model layout (model.* knobs) differs from the mesh's"
                           : "mesh policy (mesh.mode, fragments, shards, inner_steps, rounds_in_flight or "
                             "wire.encoding) differs from the mesh's");
    if (join.getLayoutFingerprint() != setup_.layout.fingerprint() && join.hasLayout()) {
      const std::string first = first_layout_difference(setup_.layout.description(), join.getLayout().cStr());
      why += first.empty() ? " (the same tensors at other offsets)" : ": " + first;
    }
    log_.warn("broker.join_refused", "archipelago broker: %s", why.c_str());
    note_event(now, why);
    refused_.insert({{from.index}, inc});
    auto b = port_.make_envelope();
    auto e = b.body().initError();
    e.setCode(wire::ErrorCode::MESH_MISMATCH);
    e.setMessage(why);
    e.setInReplyTo(env.header().getSequence());
    (void)port_.send(from, b.finish());
    return;
  }
  if (std::find(learners_.begin(), learners_.end(), from) == learners_.end()) learners_.push_back(from);
  core_->on_join({from.index}, inc, now);
  endpoints_[{{from.index}, inc}] = join.getEndpoint().cStr();
  // A restart (an earlier incarnation of this learner is known) takes up the mesh's
  // schedule: the ledger's steps / M. A first start begins at the schedule's start,
  // however late it joins (at a mesh's start the learners come up a few steps apart).
  const bool restarted = std::any_of(records_.begin(), records_.end(), [&](const auto& r) {
    return r.first.learner.value == from.index && r.first.inc < inc;
  });
  const std::uint64_t schedule_step =
      restarted ? ledger_.totals().steps / static_cast<std::uint64_t>(std::max(1, setup_.cfg.mesh.learners)) : 0;
  send_welcome(from, schedule_step);  // after a broker restart: the learner drops the old broker's rounds
  note_event(now, from.to_string() + " joined (incarnation " + std::to_string(inc.value) + ")");
  if (first_join_ns_ < 0) first_join_ns_ = now;
  for (auto& [known, rec] : records_)  // a restart ends the earlier incarnations
    if (known.learner.value == from.index && known.inc < inc && rec.left_ns < 0) rec.left_ns = now;
  records_[{{from.index}, inc}].joined_ns = now;
}

void broker_wire::on_leave(learner_ref who, nanos now) {
  note_event(now, "learner/" + std::to_string(who.learner.value) + " left");
  core_->on_leave(who.learner, who.inc, now);
  last_leave_ns_ = now;
  records_[who].left_ns = now;
  endpoints_.erase(who);  // nobody to greet there
  // Its final count to the store and the standbys now, not at the next periodic copy: a
  // leader lost in between would otherwise take the learner's last steps with it.
  write_ledger(now);
}

/// A shard's notice of a contribution: buffered ones join their round; every one goes to the ledger.
void broker_wire::on_arrival(const transport::decoded_envelope& env, nanos now) {
  auto c = env.root().getBody().getContribution();
  const round_number round{env.header().getRound()};
  const learner_ref who{{c.getLearner()}, incarnation{c.getLearnerIncarnation()}};
  if (refused_.count(who)) return;
  // Buffered for a round of an earlier broker (the shard had not heard of this one yet):
  // that round will never close here; the shard drops it once it hears of this broker.
  const bool earlier_broker = c.getBrokerEpoch() != 0 && c.getBrokerEpoch() != epoch_;
  const wire::Verdict verdict =
      earlier_broker && c.getVerdict() == wire::Verdict::BUFFERED ? wire::Verdict::LATE : c.getVerdict();
  const fragment_index p{c.getFragment()};
  switch (verdict) {
    case wire::Verdict::BUFFERED:
      ledger_.on_arrival(round, p, who, c.getStep(), c.getSteps());
      core_->on_contribution(round, who.learner, who.inc, c.getTokens(), c.getSteps(), now);
      break;
    case wire::Verdict::LATE: ledger_.on_outcome(who, p, c.getStep(), c.getSteps(), ledger_bucket::late); break;
    case wire::Verdict::REJECTED:
      // A member rejected at its round's close (a claim above its bound, mesh.robust):
      // neither the ledger nor the tape may count it as merged.
      ledger_.withdraw(round, p, who);
      core_->on_member_rejected(round, p, who);
      participation_.on_screened(round.value, who);
      ledger_.on_outcome(who, p, c.getStep(), c.getSteps(), ledger_bucket::rejected);
      break;
  }
  // After the contribution took its place: a round it completes closes with it.
  core_->on_contributed(who.learner, who.inc, p, c.getStep(), now);
}

/// A shard published a new version: durable (committed: the tape records its round)
/// and broadcast to the learners — or broadcast at once by a shard that keeps no snapshots.
/// The round's members' work is merged now.
void broker_wire::on_fragment_update(const transport::decoded_envelope& env, nanos now) {
  auto u = env.root().getBody().getFragmentUpdate();
  if (u.getFragment() >= setup_.shard_of_fragment.size() ||
      setup_.shard_of_fragment[u.getFragment()] != env.sender().index) {
    refusals_.count("not_owner");
    log_.warn("broker.not_owner", "archipelago broker: refused fragment %u's publication from %s: not its owner",
              u.getFragment(), env.sender().to_string().c_str());
    return;
  }
  const round_number round{env.header().getRound()};
  const round_record* r = core_->find_record(round);
  if (u.getCommitted()) {
    ++counts_.committed;
    if (r) {
      storage::tape_record t = tape_entry(*r, u.getVersion(), epoch_);
      t.settings = std::exchange(tape_note_, {});  // a live change shows at the first round taped after it
      if (!standbys_.empty()) tape_.append(t.round, storage::encode_record(t));
      if (store_) store_->append_tape(std::move(t));
    }
  }
  core_->on_published(round, {u.getFragment()}, u.getVersion(), now);
  ledger_.on_round_published(round);
  if (r && r->fragment.value == u.getFragment()) participation_.on_published(round.value);
  if (r && r->fragment.value == u.getFragment())
    for (const round_member& m : r->members)
      if (auto& rec = records_[{m.learner, m.inc}]; rec.first_merged_ns < 0) rec.first_merged_ns = now;
  if (u.getFragment() < fragment_versions_.size()) fragment_versions_[u.getFragment()] = u.getVersion();
  if (published_at_.size() < (std::size_t{1} << 24)) published_at_.push_back(now);
  if (u.getFragment() < fragment_published_at_.size() && fragment_published_at_[u.getFragment()].size() < (std::size_t{1} << 22))
    fragment_published_at_[u.getFragment()].push_back(now);
}

/// The uptime so far: a gap between publications longer than a few planned round intervals is down time.
void broker_wire::note_event(nanos now, std::string text) {
  events_.emplace_back(now, std::move(text));
  if (events_.size() > 40) events_.pop_front();
}

double broker_wire::uptime_until(nanos end) const {
  const auto stall = static_cast<nanos>(
      std::max(1e9, 4 * setup_.policy.steps_per_round * static_cast<double>(last_xi_step_ns_)));
  return first_open_ns_ < 0 ? 1.0 : uptime_from_publications(published_at_, first_open_ns_, end, stall);
}

/// Per fragment, the same over its own publications: a gap longer than two of
/// its planned intervals (P rounds: one missed turn) is down time for it.
std::vector<double> broker_wire::fragment_availability_until(nanos end) const {
  const auto stall = static_cast<nanos>(std::max(
      1e9, 2 * setup_.fragments() * setup_.policy.steps_per_round * static_cast<double>(last_xi_step_ns_)));
  std::vector<double> out;
  for (const std::vector<nanos>& published : fragment_published_at_)
    out.push_back(first_open_ns_ < 0 ? 1.0 : uptime_from_publications(published, first_open_ns_, end, stall));
  return out;
}

/// The learners' share of time spent on steps whose tokens were merged, since the first Join.
/// A broker that began to lead late (restarted, or a standby that took over) holds work done
/// before its first Join: the span is then at least the step time its ledger holds, so the
/// figure never exceeds 1.
double broker_wire::live_goodput(const ledger_totals& l, nanos now) const {
  const int learners = setup_.cfg.mesh.learners;
  if (first_join_ns_ < 0 || now <= first_join_ns_ || learners <= 0) return 0;
  const double span_s = std::max(learners * static_cast<double>(now - first_join_ns_) * 1e-9, l.step_time_s);
  return l.merged_step_time_s / span_s;
}

broker_report broker_wire::report(nanos now, bool final) {
  last_xi_step_ns_ = core_->xi_step_ns().value_or(last_xi_step_ns_);
  broker_report r;
  r.started_ns = started_ns_;
  const auto per_learner = ledger_.per_learner();
  r.ledger = token_ledger::sum(per_learner);
  for (const auto& [who, totals] : per_learner) records_[who].ledger = totals;
  for (auto& [who, rec] : records_) {
    rec.who = who;
    r.learners.push_back(rec);
  }
  r.uptime = uptime_until(last_leave_ns_ >= 0 ? last_leave_ns_ : now);
  r.fragment_availability = fragment_availability_until(last_leave_ns_ >= 0 ? last_leave_ns_ : now);
  r.fragment_ledger = ledger_.per_fragment();
  r.first_join_ns = first_join_ns_;
  r.last_leave_ns = last_leave_ns_;
  r.xi_step_ms = static_cast<double>(last_xi_step_ns_) * 1e-6;
  r.xi_quorum_ms = core_->xi_quorum_ns() * 1e-6;
  r.last_grace_ms = static_cast<double>(last_grace_ns_) * 1e-6;
  const broker_counters& c = core_->counters();
  r.closed_all_eligible = c.closed_all_eligible;
  r.closed_grace_expired = c.closed_grace_expired;
  r.closed_timeout = c.closed_timeout;
  r.participation = participation_.mean();
  r.participation_rounds = participation_.rounds();
  if (final) {  // at most history_capacity rounds, once per run
    for (const round_record& rec : core_->history()) {
      if (rec.published_ns < 0) continue;
      r.round_latency_ms.push_back(static_cast<double>(rec.published_ns - rec.closed_ns) * 1e-6);
      r.round_open_to_published_ms.push_back(static_cast<double>(rec.published_ns - rec.opened_ns) * 1e-6);
    }
  }
  return r;
}

}  // namespace archipelago
