#pragma once
// The parameter shard's wire layer: contributions in, arrival notices to the
// broker; on the broker's RoundClose, the core's merge and outer step, the new
// version handed to the shard's store and, once durable, broadcast to the
// learners and announced to the broker; FetchFragment answered for joiners (the
// Clone pattern). Durable before visible: no learner ever receives a version a
// crash can take back — a restarted shard restores at least every version any
// learner installed. A fragment whose newest version is not durable yet merges
// nothing more (its next round's contributions stay unmerged in the learners'
// counters); the broker pauses it meanwhile. Pure: no CAF, no sockets, no clock
// reads. The actor shell (shard_actor) and the simulation (tests/sim) both run it.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/refusals.hpp"
#include "core/broker_follower.hpp"
#include "core/clock.hpp"
#include "core/live_settings.hpp"
#include "core/ids.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "core/prometheus_text.hpp"
#include "parameter_shard/shard_core.hpp"
#include "transport/chaos_command.hpp"
#include "transport/codec.hpp"
#include "transport/message_port.hpp"

namespace archipelago {

/// The shard core's settings for a mesh: the one place they are made (the
/// shard, its initial snapshot and `replay verify` all use it).
shard_config shard_settings(const mesh_setup& setup, bool record_merges = false);
/// The robust merge's settings in `cfg` (mesh.robust*).
robust_config robust_settings(const config& cfg);

/// A new fragment version on its way to the store.
struct shard_commit {
  published_fragment published;  // version, round; the merged contributions when the core records them
  fragment_outer_state state;    // what the store keeps of the fragment
  shard_ledger ledger;           // the shard's ledger as of this version
};

/// Where a shard's new versions become durable, as its wire layer sees it.
class shard_store {
 public:
  virtual ~shard_store() = default;
  /// Makes the version durable without blocking the shard (its publication waits for it). Whoever implements this
  /// then calls shard_wire::on_committed — the version becomes visible — or
  /// shard_wire::on_commit_failed, and the shell calls retry_commits later.
  /// The state's buffers are the core's own: they stay unchanged until then.
  virtual void commit(shard_commit c) = 0;
};

class shard_wire {
 public:
  /// Shard `index`, incarnation `inc`, its fragments at `initial_params` (a
  /// buffer laid out by the layout) at version 0, or restored from `restored`
  /// (a snapshot's outer states of every fragment it owns). `store` may be null
  /// (no snapshots). `setup`, `port`, `log` and `store` outlive it.
  shard_wire(const mesh_setup& setup, std::uint32_t index, incarnation inc, transport::message_port& port,
             logger& log, shard_store* store, shard_config config, const float* initial_params,
             std::vector<std::pair<fragment_index, fragment_outer_state>> restored = {});

  /// Announces this incarnation to the broker (after a shard restart the broker
  /// drops the rounds the last one held).
  void start();
  /// Handles one message. A storage fault or heal the chaos monkey ordered is
  /// returned: the shell carries it out on the disk it owns.
  std::optional<chaos_order> on_message(const transport::decoded_envelope& env, nanos now);
  /// The broker speaks again after a silence (a restart, or a healed partition): announce this shard again.
  void on_peer(node_address peer, bool alive);
  /// The store made `version` of fragment `p` (merged in `round`) durable: it is
  /// broadcast to the learners and announced to the broker (committed).
  void on_committed(fragment_index p, std::uint64_t version, round_number round);
  /// The store could not write `version` of `p` (a failing disk): it stays
  /// invisible and the fragment paused until retry_commits succeeds.
  void on_commit_failed(fragment_index p, std::uint64_t version);
  /// Hands every version whose commit failed to the store again. True if there was one.
  bool retry_commits();

  /// Broker messages refused: their broker had been deposed (broker_follower).
  std::uint64_t broker_messages_fenced() const { return broker_.fenced(); }
  /// Rounds closed while their fragment's last version was not durable (merged once it
  /// was), and of them those dropped unmerged because more than the bound waited.
  std::uint64_t deferred_rounds() const { return deferred_rounds_; }
  std::uint64_t deferred_dropped() const { return deferred_dropped_; }
  const shard_core& core() const { return *core_; }
  /// The newest version of `p` the learners may see (durable, or no store kept).
  std::uint64_t visible_version(fragment_index p) const { return visible_.at(p.value).version; }
  const std::vector<fragment_index>& owned() const { return owned_; }
  node_status status() const;
  /// The shard's figures on a /metrics page (the transport's are the shell's).
  void add_metrics(prometheus_text& page) const;

 private:
  transport::encoded_message fragment_message(fragment_index p, std::uint64_t round);
  void send_join();
  bool follow_broker(const transport::decoded_envelope& env);
  void on_contribution(const transport::decoded_envelope& env);
  void on_round_close(const transport::decoded_envelope& env);
  /// Merges round r of p with the members the broker decided, and hands the version to the store.
  void decide(round_number r, fragment_index p, const std::vector<shard_core::decided_member>& members);
  /// The rounds of p that closed while its last version was not durable, merged in
  /// order now that it is (each new version pauses the fragment again: the rest wait).
  void decide_deferred(fragment_index p);
  void report_screened();
  void on_fetch(const transport::decoded_envelope& env);
  void apply_settings(const std::vector<live_setting>& changed);
  void publish(fragment_index p, std::uint64_t version, round_number round,
               std::shared_ptr<const std::vector<float>> theta, bool committed);

  const mesh_setup& setup_;
  const std::uint32_t index_;
  const incarnation inc_;
  transport::message_port& port_;
  logger& log_;
  shard_store* store_;
  std::vector<fragment_index> owned_;
  std::uint64_t deferred_rounds_ = 0;  // rounds closed while their fragment's last version was not durable
  std::uint64_t deferred_dropped_ = 0;  // ...of them, dropped unmerged: more waited than the bound
  std::unique_ptr<shard_core> core_;
  chaos_receiver chaos_;
  node_counters counts_;
  refusal_counts refusals_;  // by reason (core/refusals.hpp)
  /// refusals_ and the chaos commands refused for their sender.
  refusal_counts refusals() const;
  std::vector<node_address> learners_;  // broadcast list (learners that fetched)
  std::map<node_address, std::pair<std::string, std::uint64_t>> endpoints_;  // learner → (endpoint, incarnation)
  broker_follower broker_;  // which broker leads (the newest epoch heard of)
  /// What the learners see of each owned fragment: its newest durable version
  /// (Θ shared with the core while the core has no newer one).
  struct visible_state {
    std::uint64_t version = 0;
    std::shared_ptr<const std::vector<float>> theta;
  };
  std::map<std::uint32_t, visible_state> visible_;
  /// Per fragment, a merged version on its way to the store (at most one: the
  /// fragment merges nothing more until it is durable), and whether its commit failed.
  struct pending_commit {
    shard_commit commit;
    bool failed = false;
  };
  std::map<std::uint32_t, pending_commit> pending_;
  /// Per fragment, the rounds the broker closed while it was paused, oldest first:
  /// merged once its last version is durable (the learners' work in them is not
  /// thrown away, and the broker, which waits for their versions, gets them).
  struct deferred_close {
    round_number round;
    std::vector<shard_core::decided_member> members;
  };
  static constexpr std::size_t max_deferred_per_fragment = 16;
  std::map<std::uint32_t, std::deque<deferred_close>> deferred_;
};

}  // namespace archipelago
