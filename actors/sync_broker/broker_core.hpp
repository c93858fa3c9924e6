#pragma once
// The sync broker's state core (docs/design/algorithm.md §5, §7, §8). Pure and deterministic:
// no clocks, threads or I/O. Inputs carry their timestamp; every decision lands
// in an effects queue the shell drains and executes. The broker never sees
// tensors: parameter shards report arrivals, the broker decides who is in a
// round and with which weight, and tells the owning shard to close it.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <variant>
#include <vector>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/layout.hpp"

namespace archipelago {

struct broker_config {
  int fragments = 24;            // P
  int rounds_in_flight = 2;      // τ: rounds in flight (per parameter shard under decoupled)
  int quorum = 1;                // K
  double grace_factor = 0.8;     // γ
  bool adaptive_grace = true;    // false: close as soon as K have arrived
  bool wait_for_all = false;     // sync modes: close only when every eligible learner contributed
  double steps_per_round = 1;    // rounds open this many ξ_step apart (diloco H, streaming H/P)
  double ema_alpha = 0.5;        // weight of the newest sample, in (0, 1]
  nanos liveness_timeout_ns = 3'000'000'000;
  nanos round_timeout_ns = 60'000'000'000;  // bound on any open round
  std::vector<std::uint32_t> shard_of_fragment;  // fragment → shard index, size P
  fragment_order order = fragment_order::round_robin;  // core/layout.hpp
  std::uint64_t order_seed = 0;  // shuffled: the cycles' orders derive from it
  /// A resumed mesh numbers its rounds on from its snapshot's; a restarted broker
  /// after every round its predecessor opened (its tape and round lease). Rounds
  /// below it belong to an earlier broker: a contribution for one is late.
  std::uint64_t first_round = 0;
  /// Tokens one inner step of learner i processes at most (its batch × context);
  /// learners beyond the list: the last entry. Empty: unbounded (claims_bound).
  std::vector<std::uint64_t> tokens_per_step_max;
  /// Cut every member's claims to bound_claim when its round closes (the mesh's
  /// broker: on). Off: the claims as the shards reported them.
  bool bound_claims = false;
  /// Back-pressure (storage.backlog): a shard's next rounds are held while this
  /// many of its merged versions are not yet durable — its storage is behind the
  /// rounds — instead of piling versions up in its writer. 0: never held.
  int storage_backlog = 0;
};

/// What the broker lets a member's contribution claim: its steps at most what the
/// learner's Progress reported for its incarnation, its tokens at most those steps ×
/// its batch × context and what its Progress reported — each with one step of slack
/// (the Progress of the step a contribution was sent at may still be on its way). Pure; a claim above either
/// bound is cut to it here and rejected by the shard (shard_core::on_round_close).
struct claim_bound {
  std::uint64_t tokens = 0;
  std::uint64_t steps = 0;
};
/// `reported_steps` / `reported_tokens`: the learner's Progress (this incarnation);
/// `tokens_per_step_max` 0: unbounded per step.
claim_bound bound_claim(std::uint64_t claimed_tokens, std::uint64_t claimed_steps, std::uint64_t reported_steps,
                        std::uint64_t reported_tokens, std::uint64_t tokens_per_step_max);

/// Checks every field; the error names the offending one.
status validate(const broker_config& cfg);

enum class close_reason : std::uint8_t { all_eligible, grace_expired, timeout };
const char* to_string(close_reason reason);

struct round_member {
  learner_index learner;
  incarnation inc;
  double weight = 0;          // tokens² / steps (docs/design/algorithm.md §6), of the bounded counts; the shard normalises
  std::uint64_t tokens = 0;   // as claimed (the shard's arrival notice)
  std::uint64_t steps = 0;
  /// What the broker lets it count (bound_claim at close: the learner's Progress, its
  /// batch × context); the shard rejects a contribution that claims more.
  std::uint64_t bounded_tokens = 0;
  std::uint64_t bounded_steps = 0;
};

// ---- effects -------------------------------------------------------------

struct open_round {
  round_number round;
  fragment_index fragment;
  std::uint32_t shard = 0;
  std::vector<learner_ref> eligible;  // ascending learner index
};

struct close_round {
  round_number round;
  fragment_index fragment;
  std::uint32_t shard = 0;
  std::vector<round_member> members;  // in arrival order
  close_reason reason = close_reason::timeout;
  nanos quorum_ns = -1;  // time the K-th contribution arrived; -1: quorum never reached
  nanos grace_ns = 0;    // grace window granted after the quorum
  std::uint32_t live = 0;  // |learners live at close ∪ members| (participation)
  /// The shard merges and publishes only rounds that reached the quorum. A timed-out
  /// round without quorum is dropped: its learners keep their counters, so their work
  /// is merged later with a larger weight instead of being lost.
  bool merge() const { return quorum_ns >= 0; }
};

/// A contribution for a round already closed: dropped, recorded as late for the ledger.
struct late_contribution {
  round_number round;
  learner_index learner;
  incarnation inc;
  std::uint64_t tokens = 0;
};

struct learner_dead {
  learner_index learner;
  incarnation inc;
};

using broker_effect = std::variant<open_round, close_round, late_contribution, learner_dead>;

// ---- event tape ------------------------------------------------------------

struct round_record {
  round_number round;
  fragment_index fragment;
  nanos opened_ns = 0;
  nanos quorum_ns = -1;  // -1: never reached
  nanos grace_ns = 0;
  nanos closed_ns = 0;
  close_reason reason = close_reason::timeout;
  std::vector<round_member> members;
  std::uint32_t live = 0;  // |learners live (not departed) at close ∪ members|
  std::vector<learner_ref> late;  // grows as late contributions arrive
  /// Members a shard rejected at the close (a claim above its bound, mesh.robust's
  /// screening), moved here from `members`: decided, never merged.
  std::vector<round_member> screened_out;
  nanos published_ns = -1;        // -1: not (yet) published
  std::uint64_t published_version = 0;
};

struct broker_counters {
  std::uint64_t rounds_opened = 0;
  std::uint64_t closed_all_eligible = 0;
  std::uint64_t closed_grace_expired = 0;
  std::uint64_t closed_timeout = 0;
  std::uint64_t late = 0;
  std::uint64_t duplicates = 0;     // same learner, incarnation and round again
  std::uint64_t stale = 0;          // messages from an older (or departed) incarnation
  std::uint64_t rejected = 0;       // contributions with zero steps (no defined weight)
  std::uint64_t unknown_round = 0;  // contributions or publications for rounds never opened
  std::uint64_t previous_broker = 0;  // contributions for rounds an earlier broker opened (below first_round; also late)
  std::uint64_t learners_dead = 0;
  std::uint64_t rounds_aborted = 0;  // closed without a merge because their shard restarted or fell silent
  std::uint64_t rounds_superseded = 0;  // closed without quorum once a younger round of their fragment merged
  /// Closed without quorum once every learner it waited for had left, or had finished
  /// (flushing) without work on its fragment: nobody could answer it any more.
  std::uint64_t rounds_unanswerable = 0;
  /// A fragment's turn passed without a round: its shard silent, its shard's τ rounds
  /// in flight, its last merge not yet durable, or its shard's storage behind.
  /// The other fragments keep their pace.
  std::uint64_t rounds_skipped = 0;
  /// Turns held (passed, or waited for) because the fragment's shard had
  /// storage_backlog versions not yet durable: the rounds slowed to its storage.
  std::uint64_t rounds_held_for_storage = 0;
  std::uint64_t shards_lost = 0;  // shards declared silent
  /// Members whose claimed tokens or steps were above what the broker saw them
  /// report (or their batch × context): cut to the bound in the decision.
  std::uint64_t claims_cut = 0;
  std::uint64_t rounds_closed() const {
    return closed_all_eligible + closed_grace_expired + closed_timeout;
  }
};

/// One learner as the broker sees it now (status pages).
struct member_view {
  learner_index learner;
  incarnation inc;
  bool live = true;
  bool departed = false;  // left on purpose
  bool eligible = false;  // counted for quorum now
  nanos last_heard_ns = 0;
  std::uint64_t steps_done = 0;  // of this incarnation
  double step_ema_ns = 0;        // 0: no step time reported yet
};

class broker_core {
 public:
  static constexpr std::size_t history_capacity = 1024;

  /// The config must pass validate() (asserted).
  explicit broker_core(broker_config cfg);
  static expected<broker_core> create(broker_config cfg);

  // ---- inputs (each may append effects) ----
  void on_join(learner_index learner, incarnation inc, nanos now);
  void on_leave(learner_index learner, incarnation inc, nanos now);
  /// `tokens_done`: the tokens this incarnation reports (Progress.tokens); it bounds
  /// the claims of its contributions (bound_claim), as steps_done does. `finished`
  /// (Progress.finished): it takes no more steps and stays only to flush (mesh.flush),
  /// so it can answer a round only of a fragment it stepped on since it last
  /// contributed to it (on_contributed): it is waited for in no other.
  void on_progress(learner_index learner, incarnation inc, std::uint64_t steps_done,
                   nanos step_time_ns, nanos now, std::uint64_t tokens_done = 0, bool finished = false);
  void on_contribution(round_number round, learner_index learner, incarnation inc,
                       std::uint64_t tokens, std::uint64_t steps, nanos now);
  /// A shard's notice of a contribution of `learner` to fragment p taken at its step
  /// `step`, whatever the shard did with it (buffered, late, rejected): the learner
  /// never sends that work again.
  void on_contributed(learner_index learner, incarnation inc, fragment_index p, std::uint64_t step, nanos now);
  void on_published(round_number round, fragment_index fragment, std::uint64_t version, nanos now);
  /// The transport found the learner silent (no message, not even a heartbeat,
  /// for its liveness timeout): it is dead now. Its next message revives it.
  void on_peer_lost(learner_index learner, nanos now);
  /// The transport heard from the learner again (a heartbeat counts): its
  /// current incarnation is live again, even if it has nothing to say yet
  /// (a learner waiting for parameters sends no Progress).
  void on_peer_alive(learner_index learner, nanos now);
  /// Shard `shard` restarted from its snapshot: the contributions it held for
  /// its open rounds are gone. Those rounds close now without a merge (the
  /// learners' next contributions carry the same work, with its steps), and
  /// what it merged but had not made durable is not waited for.
  void on_shard_restarted(std::uint32_t shard, nanos now);
  /// The transport found shard `shard` silent: its open rounds close without a
  /// merge and its fragments' turns are skipped until it speaks again (its
  /// fragments pause; every other fragment keeps its pace). Learners keep
  /// training: their work on the paused fragments stays in their counters.
  void on_shard_lost(std::uint32_t shard, nanos now);
  /// The transport heard from the shard again: its fragments' turns open rounds again.
  void on_shard_alive(std::uint32_t shard, nanos now);
  bool is_shard_live(std::uint32_t shard) const { return shard < shard_live_.size() && shard_live_[shard]; }
  /// Shard `shard`'s merged versions not yet durable (published), as back-pressure counts them.
  std::uint32_t undurable_versions(std::uint32_t shard, nanos now) const;
  /// Shards in all (the highest shard of the plan + 1).
  std::uint32_t shards() const { return static_cast<std::uint32_t>(shard_live_.size()); }
  /// Liveness, grace and timeout deadlines, and opening of paced rounds.
  void tick(nanos now);
  /// A live change of K and γ (`archipelago set`), checked like the config (validate):
  /// rounds opened from now on use them, rounds open keep the values they opened
  /// with (a round boundary). Returns the first round under the new values.
  expected<round_number> reconfigure(int quorum, double grace_factor);

  /// Hands over the effects produced since the last call, in production order.
  std::vector<broker_effect> take_effects();

  // ---- queries ----
  const broker_config& config() const { return cfg_; }
  const broker_counters& counters() const { return counters_; }
  /// The last history_capacity closed rounds, in closing order.
  const std::deque<round_record>& history() const { return history_; }
  const round_record* find_record(round_number round) const;
  /// A shard rejected this member of a closed round at its close: it moves from
  /// the record's members to its screened_out (a member not in it: nothing happens).
  void on_member_rejected(round_number round, fragment_index fragment, learner_ref who);
  std::size_t rounds_open() const { return open_.size(); }
  round_number next_round() const { return round_number{next_round_}; }
  bool is_live(learner_index learner) const;
  /// Its newest incarnation left on purpose (a Leave): its silence afterwards is expected.
  bool has_departed(learner_index learner) const;
  /// Every learner the broker knows (its newest incarnation), by index.
  std::vector<member_view> members() const;
  bool is_eligible(learner_index learner) const;
  /// Current pacing estimate; nullopt before any step time is known.
  std::optional<nanos> xi_step_ns() const;
  double xi_quorum_ns() const { return xi_quorum_ns_; }
  double xi_sync_ns() const { return xi_sync_ns_; }

 private:
  struct learner_state {
    incarnation inc;
    bool live = true;
    bool departed = false;  // left on purpose: this incarnation is finished
    nanos last_heard_ns = 0;
    std::uint64_t steps_done = 0;  // of this incarnation
    std::uint64_t tokens_done = 0; // of this incarnation, as its Progress reported
    double step_ema_ns = 0;
    bool has_step_ema = false;
    bool finished = false;  // its last step is done (Progress.finished): flushing
    std::map<std::uint32_t, std::uint64_t> contributed_step;  // fragment → its step at its latest contribution
  };
  /// Whether the learner may still contribute to fragment p: one that takes more
  /// steps always may; a finished one only with steps since its last contribution to p.
  static bool may_contribute(const learner_state& st, std::uint32_t fragment);
  std::uint64_t tokens_per_step_max(learner_index learner) const;
  /// At close: every member's counts cut to what the broker saw (bound_claim).
  void bound_members(std::vector<round_member>& members);
  struct round_state {
    std::uint64_t round = 0;
    std::uint32_t fragment = 0;
    std::uint32_t shard = 0;
    nanos opened_ns = 0;
    std::vector<learner_ref> eligible;
    std::vector<round_member> members;
    nanos quorum_ns = -1;
    nanos grace_ns = 0;
    int quorum = 1;            // K and γ as the round opened (reconfigure)
    double grace_factor = 0;
  };

  learner_state* admit(learner_index learner, incarnation inc, nanos now);
  void mark_dead(learner_index index, learner_state& st);
  void reset_learner(learner_state& st, incarnation inc, nanos now);
  void update_ema(double& ema, bool& has, double sample) const;
  void reach_quorum(round_state& rs, nanos now);
  bool all_eligible_in(const round_state& rs) const;
  /// Whether any learner the round waits for may still contribute to it (dead ones may come back).
  bool anyone_may_answer(const round_state& rs) const;
  void check_closes(nanos now);
  /// Emits the close effect, records the round, returns the next open round.
  std::map<std::uint64_t, round_state>::iterator close(
      std::map<std::uint64_t, round_state>::iterator it, close_reason reason, nanos now);
  void open_due_rounds(nanos now);
  /// Whether fragment p's turn can open a round now, and if not, why.
  /// no_work: fewer than K live learners may contribute to it (finished ones flushing
  /// hold no work on it).
  enum class turn : std::uint8_t { open, shard_silent, not_durable, shard_busy, storage_busy, no_work };
  turn turn_of(std::uint32_t fragment, std::uint32_t shard, nanos now) const;
  /// Whether a turn that cannot open is waited for (true) or passed to the next fragment.
  bool waits_for(turn t) const;
  /// Counts a turn held for storage, once per turn however often it is looked at.
  void note_held_for_storage();
  /// round_robin and shuffled: the fragment whose turn round `round` is.
  std::uint32_t fragment_of_turn(std::uint64_t round);
  /// stalest: the fragment to open now (nullopt: none can, or the stalest one is waited for).
  std::optional<std::uint32_t> stalest_open_fragment(nanos now);
  void open_round_for(std::uint32_t fragment, nanos now);
  void abort_rounds_of(std::uint32_t shard, nanos now);
  std::vector<learner_ref> eligible_now() const;
  /// eligible_now(), less the finished learners holding no work on the fragment.
  std::vector<learner_ref> eligible_for(std::uint32_t fragment) const;
  round_record* find_record_mut(std::uint64_t round);

  broker_config cfg_;
  std::map<learner_index, learner_state> learners_;
  std::map<std::uint64_t, round_state> open_;
  std::deque<round_record> history_;
  std::vector<broker_effect> effects_;
  broker_counters counters_;
  std::map<std::uint32_t, std::uint64_t> newest_merged_;  // fragment → newest round closed with a merge
  /// Fragment → (round, closed at) of its last merge, until the shard says the
  /// version is durable and visible (on_published). Its next round waits for it.
  std::map<std::uint32_t, std::pair<std::uint64_t, nanos>> unpublished_;
  std::vector<bool> shard_live_;  // per shard: not found silent

  std::uint64_t next_round_ = 0;
  /// stalest: per fragment, the round it last opened at (before any: a value that
  /// makes the first cycle round-robin from first_round).
  std::vector<std::int64_t> last_turn_;
  /// shuffled: the order of cycle `shuffled_cycle_` (turns cycle·P .. cycle·P + P − 1).
  std::uint64_t shuffled_cycle_ = ~std::uint64_t{0};
  std::vector<std::uint32_t> shuffled_order_;
  nanos last_open_ns_ = 0;
  bool any_opened_ = false;
  std::uint64_t storage_held_turn_ = ~std::uint64_t{0};  // the turn last counted as held for storage

  // ξ_step: pooled EMA of the step times reported by the learners that formed the
  // last quorum (the fastest, whose deadline binds); before that, the minimum
  // per-learner EMA.
  std::vector<learner_ref> quorum_set_;
  double pooled_step_ema_ns_ = 0;
  bool has_pooled_step_ema_ = false;
  double xi_quorum_ns_ = 0;
  bool has_xi_quorum_ = false;
  double xi_sync_ns_ = 0;  // 0 until the first publication
  bool has_xi_sync_ = false;
};

}  // namespace archipelago
