#pragma once
// The sync broker's wire layer: envelopes in, broker_core and token_ledger
// inputs; their effects out as RoundOpen / RoundClose / Welcome envelopes
// through the message port, and as tape and ledger records to the broker's
// store. Pure: no CAF, no sockets, no clock reads — every input carries its
// time. The actor shell (broker_actor) and the simulation (tests/sim) both
// run it.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/refusals.hpp"
#include "core/clock.hpp"
#include "core/live_settings.hpp"
#include "core/ids.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "core/prometheus_text.hpp"
#include "sync_broker/broker_core.hpp"
#include "sync_broker/broker_store.hpp"
#include "sync_broker/participation.hpp"
#include "sync_broker/tape_replication.hpp"
#include "sync_broker/token_ledger.hpp"
#include "transport/codec.hpp"
#include "transport/message_port.hpp"

namespace archipelago {

/// The broker core's settings for a mesh.
broker_config broker_settings(const mesh_setup& setup);

class broker_wire {
 public:
  /// Round numbers are leased from the store in blocks: one synchronous write per block.
  static constexpr std::uint64_t round_lease_block = 256;

  /// `settings`: broker_settings(setup) in a mesh (the simulation sets its own);
  /// start.first_round overrides its first round. `store` may be null (no
  /// snapshots); `setup`, `port` and `store` outlive the wire.
  broker_wire(const mesh_setup& setup, broker_config settings, incarnation inc, transport::message_port& port,
              logger& log, broker_store* store, const broker_start& start, nanos now);

  /// The first messages: a Welcome to every shard, and to every learner a
  /// restarted broker's store knew (they re-join at once).
  void start(nanos now);
  void on_message(const transport::decoded_envelope& env, nanos now);
  /// The transport found a peer silent (alive false) or heard it again.
  void on_peer(node_address peer, bool alive, nanos now);
  /// Deadlines and paced rounds (the core), Welcomes to shards not heard from, the ledger
  /// write and the standbys' copy.
  void tick(nanos now);
  /// The epoch this broker leads in. Once a newer one is heard of, another broker leads:
  /// its seat (broker_seat) steps down and drops this wire before it sees another message.
  std::uint64_t epoch() const { return epoch_; }

  /// The accounting as of now; `final` (the end of a run) adds the rounds' latencies.
  broker_report report(nanos now, bool final);
  /// Its counters, with what it refused and the claims it cut (node_counters::refused).
  node_counters counters() const;
  nanos started_ns() const { return started_ns_; }
  const broker_core& core() const { return *core_; }
  const token_ledger& ledger() const { return ledger_; }
  /// The configuration in force: the mesh's, with the changes set live.
  const config& live_config() const { return live_cfg_; }
  const participation_tracker& participation() const { return participation_; }
  /// The rounds on its tape log (a leader stepping down takes them as held: broker_seat).
  std::vector<std::uint64_t> tape_rounds() const { return tape_.rounds(); }

  /// The broker's figures on a /metrics page (the transport's are the shell's).
  void add_metrics(prometheus_text& page, nanos now) const;
  /// The broker's view of the mesh as one JSON object (GET /status; `archipelago status`).
  std::string status_json(nanos now) const;

 private:
  std::uint64_t recover(const broker_start& start);
  void restore_settings(const std::vector<std::string>& notes);
  void lease_round(std::uint64_t round, nanos now);
  void send_welcome(node_address to, std::uint64_t schedule_step = 0);
  void welcome_silent_shards(nanos now);
  void dispatch(nanos now);
  void shard_seen(node_address from, std::uint64_t inc, nanos now);
  void on_join(const transport::decoded_envelope& env, nanos now);
  void on_leave(learner_ref who, nanos now);
  void on_arrival(const transport::decoded_envelope& env, nanos now);
  void on_reconfigure(const transport::decoded_envelope& env, nanos now);
  void on_fragment_update(const transport::decoded_envelope& env, nanos now);
  /// `whole`: every record goes to the standbys, not only those changed since the last copy.
  void write_ledger(nanos now, bool whole = false);
  void replicate(const std::vector<storage::learner_ledger>& ledgers, bool whole, nanos now);
  double uptime_until(nanos end) const;
  std::vector<double> fragment_availability_until(nanos end) const;
  double live_goodput(const ledger_totals& l, nanos now) const;
  /// A line for the dashboard's recent events (GET /status): the newest 40 are kept.
  void note_event(nanos now, std::string text);

  const mesh_setup& setup_;
  const incarnation inc_;
  const std::uint64_t epoch_;
  transport::message_port& port_;
  logger& log_;
  broker_store* store_;
  config live_cfg_;        // the mesh's configuration with the changes set live (Reconfigure)
  std::string tape_note_;  // live changes not yet on the tape: the next taped round carries them
  const bool lease_ = false;  // broker_start::recovery: lease round numbers ahead
  const nanos ledger_write_interval_ns_;
  std::unique_ptr<broker_core> core_;
  token_ledger ledger_;
  participation_tracker participation_;  // members merged against live learners, per round
  node_counters counts_;
  refusal_counts refusals_;  // by reason (core/refusals.hpp)
  std::vector<nanos> published_at_;
  std::vector<std::vector<nanos>> fragment_published_at_;  // per fragment
  nanos first_join_ns_ = -1, last_leave_ns_ = -1, first_open_ns_ = -1, last_grace_ns_ = 0;
  nanos started_ns_ = 0, last_xi_step_ns_ = 0, last_ledger_write_ns_ = 0;
  nanos last_welcome_ns_ = -1;  // the last Welcome to shards not heard from yet
  std::uint64_t rounds_leased_ = 0;  // the lease in the store covers rounds below this
  std::map<learner_ref, learner_record> records_;
  std::set<learner_ref> refused_;  // joined with a different layout or policy
  std::vector<node_address> learners_;
  std::map<learner_ref, std::string> endpoints_;  // where learners listen (their Join), kept with their ledger
  std::vector<std::uint64_t> shard_incarnations_;  // as last heard; 0: not yet
  std::vector<nanos> shard_last_heard_;            // per shard; -1: never
  std::vector<std::uint64_t> fragment_versions_;   // the newest version the shards published, per fragment
  std::vector<node_address> standbys_;             // the other brokers: BrokerState goes to them
  tape_log tape_;                                  // the tape as the standbys are sent it (tape_replication.hpp)
  std::map<learner_ref, std::size_t> copied_;      // the hash of each ledger record as last sent to them
  std::uint64_t copies_ = 0;
  std::deque<std::pair<nanos, std::string>> events_;  // note_event: peers lost and back, joins, refusals, leaves
};

}  // namespace archipelago
