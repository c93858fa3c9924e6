#pragma once
// One broker of a mesh: it leads (through a broker_wire) or follows the broker
// that does (broker_election decides which), keeping the leader's copy of its
// store (BrokerState) in its own store, so that it can take over from there as
// a restarted broker would. A mesh without standbys has one seat, which leads
// from its start. The chaos monkey's commands (a drill's partitions, link
// faults) are the seat's to obey, leading or following: the links it shapes
// outlive a change of role. Pure like broker_wire: the actor shell and the
// simulation drive it; every input carries its time.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/clock.hpp"
#include "core/ids.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "sync_broker/broker_election.hpp"
#include "sync_broker/broker_lease.hpp"
#include "sync_broker/broker_store.hpp"
#include "sync_broker/broker_wire.hpp"
#include "sync_broker/tape_replication.hpp"
#include "transport/chaos_command.hpp"
#include "transport/codec.hpp"
#include "transport/message_port.hpp"

namespace archipelago {

class broker_seat {
 public:
  /// `index`: 0 the primary, from 1 a standby. `read_start`: where this broker starts
  /// when it begins to lead — its store read back (with a standby's copy in it) and
  /// the first round of a resumed run. `lease` (may be null: none): this broker leads
  /// only while it holds it, in the epoch it grants. `setup`, `port`, `store` and
  /// `lease` outlive the seat.
  broker_seat(const mesh_setup& setup, broker_config settings, incarnation inc, std::uint32_t index,
              transport::message_port& port, logger& log, broker_store* store, std::function<broker_start()> read_start, nanos now,
              broker_lease* lease = nullptr);

  void on_message(const transport::decoded_envelope& env, nanos now);
  void on_peer(node_address peer, bool alive, nanos now);
  /// Takes over when the election says so, steps down when a newer epoch is heard of; the leader's tick.
  void tick(nanos now);

  /// The leader's wire while this broker leads; null while it follows.
  broker_wire* leading() { return wire_.get(); }
  const broker_wire* leading() const { return wire_.get(); }
  const broker_election& election() const { return election_; }
  /// The counts of every term this broker led (rounds closed, members, committed
  /// versions: the leader's wire's, summed over its terms) and how often it was
  /// deposed (node_counters::step_downs).
  node_counters counters() const;
  /// GET /status: the leader's view, or who this standby follows.
  std::string status_json(nanos now) const;

 private:
  void lead(std::uint64_t epoch, nanos now);
  void follow(nanos now);
  void follow_lease(nanos now);
  void check_lease(nanos now);
  void stop_leading(nanos now);
  void keep(const transport::decoded_envelope& env);

  const mesh_setup& setup_;
  const broker_config settings_;
  const incarnation inc_;
  const std::uint32_t index_;
  transport::message_port& port_;
  logger& log_;
  broker_store* store_;
  std::function<broker_start()> read_start_;
  broker_lease* lease_;
  broker_election election_;
  std::unique_ptr<broker_wire> wire_;
  tape_intake tape_;  // following: which of the leader's tape records to store, and the acknowledgement
  bool campaigning_ = false;
  node_counters earlier_terms_;  // what the wires of its earlier terms counted, and its step-downs
  chaos_receiver chaos_;
};

}  // namespace archipelago
