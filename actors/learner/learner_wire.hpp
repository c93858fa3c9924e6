#pragma once
// The learner's wire layer: RoundOpen and FragmentUpdate envelopes in,
// learner_core inputs; its contributions out as Contribution envelopes to the
// owning shards, Progress and Join to the broker, FetchFragment while joining
// (the Clone pattern). It reads and writes the model's parameter buffer it is
// handed, never the model itself. Pure: no CAF, no sockets, no clock reads.
// The actor shell (learner_actor) and the simulation (tests/sim) both run it;
// each calls after_step() once its own kind of step is done.

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/refusals.hpp"
#include "core/broker_follower.hpp"
#include "core/clock.hpp"
#include "core/ids.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "core/prometheus_text.hpp"
#include "learner/learner_core.hpp"
#include "transport/chaos_command.hpp"
#include "learner/contribution_attack.hpp"
#include "transport/codec.hpp"
#include "transport/message_port.hpp"
#include "transport/tensor_encoding.hpp"

namespace archipelago {

/// The learner core's settings for a mesh.
learner_sync_config learner_settings(const mesh_setup& setup);

/// The model a learner trains, as its wire layer sees it: the flat parameter
/// buffer (laid out by the mesh's layout) and, under dp, the last gradient.
struct learner_model_view {
  float* params = nullptr;
  const float* gradients = nullptr;  // dp: contributions are −gradient; otherwise unused
  std::uint32_t tokens_per_step = 0;
  std::uint16_t threads = 1;
};

/// What a message asks of the shell that steps the model.
struct learner_event {
  bool start_stepping = false;  // every fragment is installed: the first step may run
  bool resume = false;          // the fragment a synchronous policy waited for arrived
  /// The broker's first Welcome: a restarted learner takes up the mesh's
  /// learning-rate schedule here (forward only).
  std::optional<std::int64_t> schedule_step;
  bool refused = false;  // the broker refused this learner (its status says why): nothing to train for
  bool flushed = false;  // flushing (begin_flush): every step's work is in a received version; leave
};

class learner_wire {
 public:
  /// `sync`: learner_settings(setup) in a mesh (the simulation sets its own).
  /// `setup`, `port` and the model's buffers outlive it.
  learner_wire(const mesh_setup& setup, learner_sync_config sync, std::uint32_t index, incarnation inc,
               transport::message_port& port, logger& log, learner_model_view model);

  /// Peers, a fetch of every fragment (its shard subscribes this learner first), Join.
  void start();
  learner_event on_message(const transport::decoded_envelope& env, nanos now);
  /// The broker fell silent or speaks again: Join again (a restarted broker knows no
  /// learner). True: arm the rejoin timer (on_rejoin_timer), the broker just went silent.
  /// A shard alive again while joining: fetch its fragments again (what was queued
  /// for the dead link was dropped).
  bool on_peer(node_address peer, bool alive);
  /// While the broker stays silent, Join again each liveness period (the reconnecting
  /// socket may drop what it queued). True: arm the timer again.
  bool on_rejoin_timer();
  /// Joining is bounded: Join again until a broker welcomes this incarnation, and fetch
  /// every fragment again (the newest versions of those installed too) while some are
  /// missing and none has arrived for three times the longest gap
  /// between two arrivals so far (at most mesh.round_timeout_s; before the second
  /// arrival, the latter). Not sooner: over a slow link the fragments
  /// asked for are still queued (a 3 Mbit/s link shared by three learners brings one
  /// 1.8 MB fragment every 14 s), and asking again queues a second copy of each behind
  /// them; a lost request on a fast link is asked again within seconds. True: still
  /// joining, arm again.
  bool on_join_timer(nanos now);
  /// Before a step: a synchronous policy sends what is ready and waits (true) until
  /// the awaited fragment arrives (learner_event::resume) or on_wait_timeout().
  bool wait_before_step(nanos now);
  /// A wait ran into its bound (mesh.round_timeout_s): a broadcast may have been lost; fetch again.
  void on_wait_timeout();
  /// One inner step of `tokens` tokens that took `step_ns` (as the ledger counts it):
  /// Progress to the broker, then every contribution now ready.
  void after_step(std::uint64_t tokens, nanos step_ns);
  /// The last step is done. With mesh.flush: stay (answering rounds, no more
  /// steps) until every fragment's work is in a version received
  /// (learner_event::flushed). False: leave now (flush off, or nothing to flush).
  /// The shell bounds the wait.
  bool begin_flush();
  bool flushing() const { return flushing_; }
  /// This incarnation is done: Leave (its last Progress and contributions went out before).
  void leave(const std::string& reason);

  bool done() const { return done_; }
  bool waiting() const { return waiting_; }
  /// The chaos monkey's slow-down factor (1: none).
  double slowdown() const { return chaos_.slowdown; }
  const learner_core& core() const { return *core_; }
  /// Contributions held back because their delta was not finite (a NaN or Inf in the model).
  std::uint64_t non_finite() const { return non_finite_; }
  /// This incarnation's figures.
  node_status status() const;
  /// The learner's figures on a /metrics page (the transport's are the shell's).
  void add_metrics(prometheus_text& page) const;

 private:
  void fetch(std::optional<std::uint32_t> only_shard = std::nullopt);
  void fetch_fragment(std::uint32_t p);
  void send_join();
  void send_progress();
  bool shard_restarted(std::uint32_t shard, std::uint64_t inc);
  bool follow_broker(const transport::decoded_envelope& env);
  void send_contributions(bool with_progress = false);
  bool add_delta(transport::envelope_builder& b, const contribution_plan& c);
  void send_forged(node_address as);
  learner_event on_fragment_update(const transport::decoded_envelope& env, nanos now);

  const mesh_setup& setup_;
  const std::uint32_t index_;
  const incarnation inc_;
  transport::message_port& port_;
  logger& log_;
  const learner_model_view model_;
  const tensor_encoding encoding_;
  std::unique_ptr<learner_core> core_;
  chaos_receiver chaos_;
  contribution_attacker attacker_;  // the chaos monkey's attack_* faults (drills only)
  node_counters counts_;
  refusal_counts refusals_;  // by reason (core/refusals.hpp)
  /// refusals_ and the chaos commands refused for their sender.
  refusal_counts refusals() const;
  std::uint64_t non_finite_ = 0;        // contributions held back: not finite
  std::uint64_t forged_sequence_ = 0;  // an attacker drill's forged envelopes (their own sequence)
  std::size_t to_install_ = 0;
  nanos last_install_ns_ = -1;  // joining: when a fragment last arrived (-1: the first timer starts the clock)
  nanos longest_install_gap_ns_ = -1;  // joining: between two arrivals (-1: none yet)
  bool stepping_ = false, waiting_ = false, done_ = false, flushing_ = false;
  nanos wait_since_ = 0;
  nanos last_step_ns_ = 0;
  std::vector<std::uint64_t> shard_incarnations_;  // as last seen; 0: not yet
  broker_follower broker_;                         // which broker leads (the newest epoch heard of)
  bool broker_silent_ = false;                     // the transport found the broker silent; Join is re-sent
  bool welcomed_ = false;                          // the broker's first Welcome of this incarnation arrived
  std::string refusal_;
  std::set<std::uint32_t> reanchor_;  // fragments of a restarted shard: its next version re-anchors them
  /// wire.error_feedback: per fragment, what quantising its contributions dropped so
  /// far (empty until its first contribution; none without the knob).
  std::vector<std::vector<float>> residuals_;
};

}  // namespace archipelago
