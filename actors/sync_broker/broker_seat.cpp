#include "sync_broker/broker_seat.hpp"

#include <utility>

#include "core/json_line.hpp"

namespace archipelago {
namespace {

election_config election_settings(const mesh_setup& setup, std::uint32_t index) {
  const nanos heartbeat_ns = setup.cfg.wire.heartbeat_interval_ms * 1'000'000;
  return {index, setup.brokers(), heartbeat_ns, heartbeat_ns * setup.cfg.wire.liveness};
}

/// The rounds on a standby's stored tape: it does not store them again when a leader sends them.
std::vector<std::uint64_t> rounds_held(const mesh_setup& setup, const std::function<broker_start()>& read_start) {
  std::vector<std::uint64_t> rounds;
  if (setup.brokers() > 1)
    for (const storage::tape_record& t : read_start().tape) rounds.push_back(t.round);
  return rounds;
}

}  // namespace

broker_seat::broker_seat(const mesh_setup& setup, broker_config settings, incarnation inc, std::uint32_t index,
                         transport::message_port& port, logger& log, broker_store* store,
                         std::function<broker_start()> read_start, nanos now, broker_lease* lease)
    : setup_(setup), settings_(std::move(settings)), inc_(inc), index_(index), port_(port), log_(log), store_(store),
      read_start_(std::move(read_start)), lease_(lease), election_(election_settings(setup, index), inc.value, now),
      tape_(rounds_held(setup, read_start_)) {
  chaos_.accept = setup.cfg.wire.accept_chaos;
  std::vector<node_address> others;
  for (std::uint32_t b = 0; b < setup.brokers(); ++b)  // heartbeats both ways: the others' liveness and epochs
    if (b != index) {
      others.push_back(broker_at(b));
      (void)port_.add_peer(others.back(), setup.broker_endpoint_of(b));
    }
  if (!lease_)
    if (auto epoch = election_.take_over(now)) {  // without standbys: at once
      lead(*epoch, now);
      return;
    }
  // Ask who leads: a leader answers a broker's Join with a Welcome (its epoch in the
  // header) and, having found it alive, with its state at once (broker_wire::on_peer).
  auto b = port_.make_envelope();
  auto join = b.body().initJoin();
  join.setLayoutFingerprint(setup.layout.fingerprint());
  join.setLayout(setup.layout.description());
  join.setConfigHash(mesh_agreement_hash(setup.cfg));
  join.setEndpoint(port_.endpoint());
  (void)port_.broadcast(others, b.finish());
}

/// Leads in `epoch` from its store, as a restarted broker would.
void broker_seat::lead(std::uint64_t epoch, nanos now) {
  broker_start start = read_start_();
  start.epoch = epoch;
  wire_ = std::make_unique<broker_wire>(setup_, settings_, inc_, port_, log_, store_, start, now);
  if (setup_.brokers() > 1)
    log_.info("broker.leading", "archipelago broker/%u: leading in epoch %llu", index_,
              static_cast<unsigned long long>(epoch));
  wire_->start(now);
}

/// Deposed: it follows (what it counted goes on in its successor's ledger, from the copies).
void broker_seat::follow(nanos now) {
  log_.warn("broker.stepping_down", "archipelago broker/%u: broker/%u leads in a newer epoch (%llu > %llu): stepping down",
            index_, election_.leader().value_or(0), static_cast<unsigned long long>(election_.epoch()),
            static_cast<unsigned long long>(wire_->epoch()));
  stop_leading(now);
}

/// Lost the lease (it expired unrenewed, or etcd gave it to another): stop leading at once.
void broker_seat::follow_lease(nanos now) {
  const lease_state ls = lease_->state();
  log_.warn("broker.stepping_down", "archipelago broker/%u: the lease of epoch %llu is no longer held%s%s: stepping down",
            index_, static_cast<unsigned long long>(wire_->epoch()), ls.error.empty() ? "" : " (etcd: ",
            ls.error.empty() ? "" : (ls.error + ")").c_str());
  stop_leading(now);
}

void broker_seat::stop_leading(nanos now) {
  earlier_terms_ += wire_->counters();
  ++earlier_terms_.step_downs;
  tape_.held(wire_->tape_rounds());  // in its own store: a successor's copy of them is not stored again
  wire_.reset();
  election_.step_down(now);
  if (lease_) {
    lease_->release();
    campaigning_ = false;
  }
}

node_counters broker_seat::counters() const {
  node_counters out = earlier_terms_;
  if (wire_) out += wire_->counters();
  return out;
}

/// A leader whose lease lapsed (expired unrenewed, or etcd gave it to another)
/// stops leading before it acts again: on every tick, message and verdict.
void broker_seat::check_lease(nanos now) {
  if (!lease_ || !wire_) return;
  const lease_state ls = lease_->state();
  if (ls.held_epoch != wire_->epoch() || now >= ls.valid_until) follow_lease(now);
}

void broker_seat::tick(nanos now) {
  if (election_.on_epoch(port_.broker_epoch(), now) && wire_) follow(now);  // heard in a heartbeat
  if (lease_) {
    const lease_state ls = lease_->state();
    if (election_.on_epoch(ls.leader_epoch, now) && wire_) follow(now);  // etcd knows a newer leader
    check_lease(now);
    if (!wire_) {
      // The service records no leader although one was heard of: it lost its lease
      // without dying (cut from etcd, or paused), and may still heartbeat, so the
      // control lane would never call it dead. Ask for the lease at once.
      const bool leaderless = election_.epoch() != 0 && ls.observed_at >= 0 && ls.leader_epoch == 0;
      if (ls.held_epoch != 0 && campaigning_ && now < ls.valid_until) {
        campaigning_ = false;
        election_.lead_in(ls.held_epoch);
        lead(ls.held_epoch, now);
      } else if (auto epoch = election_.candidate(now)) {
        lease_->campaign(*epoch);  // again each tick: a no-op while it campaigns for as much
        campaigning_ = true;
      } else if (leaderless) {
        lease_->campaign(election_.epoch_to_lead());
        campaigning_ = true;
      } else if (campaigning_ || ls.held_epoch != 0) {  // a leader was heard of meanwhile: follow it
        lease_->release();
        campaigning_ = false;
      }
    }
  } else if (!wire_) {
    if (auto epoch = election_.take_over(now)) lead(*epoch, now);
  }
  if (wire_) wire_->tick(now);
}

void broker_seat::on_peer(node_address peer, bool alive, nanos now) {
  check_lease(now);
  if (peer.kind == role::sync_broker) election_.on_broker_peer(peer.index, alive, now);
  if (wire_) wire_->on_peer(peer, alive, now);
}

void broker_seat::on_message(const transport::decoded_envelope& env, nanos now) {
  if (env.body() == wire::Envelope::Body::CHAOS_COMMAND) {
    (void)chaos_.on_command(env, port_, log_, now);
    return;
  }
  if (election_.on_epoch(env.header().getBrokerEpoch(), now) && wire_) follow(now);
  check_lease(now);
  if (wire_) return wire_->on_message(env, now);
  // Following: only the leader's copy of its state matters (it is alive, too).
  const auto leader = election_.leader();
  if (env.body() != wire::Envelope::Body::BROKER_STATE || !leader || env.sender() != broker_at(*leader)) return;
  election_.on_leader_heard(now);
  keep(env);
}

/// The leader's copy of its store (BrokerState) into this broker's own store; the
/// tape in the leader's log order, each round once (tape_intake), acknowledged.
void broker_seat::keep(const transport::decoded_envelope& env) {
  auto state = env.root().getBody().getBrokerState();
  auto tape = state.getTape();
  const tape_intake::accepted take =
      tape_.on_state(env.header().getBrokerEpoch(), state.getTapeFrom(), state.getTapeOldest(), tape.size());
  auto ack = port_.make_envelope();
  ack.body().initAck().setSequence(take.ack);
  (void)port_.send(env.sender(), ack.finish());
  if (!store_) return;
  std::vector<storage::learner_ledger> ledgers;
  std::size_t bad = 0;
  for (auto record : state.getLedger()) {
    auto l = storage::decode_ledger_record({reinterpret_cast<const char*>(record.begin()), record.size()});
    if (l) ledgers.push_back(std::move(*l));
    else ++bad;
  }
  if (!ledgers.empty()) store_->write_ledger(std::move(ledgers));
  for (std::size_t i = take.first; i < tape.size(); ++i) {
    auto t = storage::decode_tape_record({reinterpret_cast<const char*>(tape[i].begin()), tape[i].size()});
    if (!t) ++bad;
    else if (tape_.first_time(t->round)) store_->append_tape(std::move(*t));
  }
  if (const std::uint64_t leased = state.getRoundsLeased(); leased > 0)
    (void)store_->lease_rounds(leased, incarnation{env.header().getIncarnation()});
  if (bad > 0)  // a checksum passed, the records did not: a bug or a foreign build
    log_.error("broker.replica_undecodable", "archipelago broker/%u: %zu record(s) of %s's state undecodable, not kept",
               index_, bad, env.sender().to_string().c_str());
}

std::string broker_seat::status_json(nanos now) const {
  if (wire_) return wire_->status_json(now);
  json_line j;
  j.add("broker", static_cast<std::uint64_t>(index_)).add("incarnation", inc_.value).add("leading", false)
      .add("epoch", election_.epoch());
  if (auto leader = election_.leader()) j.add("leader", static_cast<std::uint64_t>(*leader));
  if (lease_) j.add("lease_error", lease_->state().error);
  return j.str();
}

}  // namespace archipelago
