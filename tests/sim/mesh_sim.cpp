#include "sim/mesh_sim.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <set>

namespace archipelago::sim {
namespace {

// Node ids: learners 0..M-1, the broker M, shards M+1..M+S.
struct msg_progress { learner_ref from; std::uint64_t steps, tokens; nanos step_ns; };
struct msg_join { learner_ref from; };
struct msg_round_open { round_number round; fragment_index fragment; std::uint64_t shard_inc; };
// broker_inc: the incarnation of the broker whose round it answers (0: none known yet).
struct msg_contribution { learner_ref from; contribution_plan plan; std::uint64_t broker_inc = 0; };
struct msg_arrival { round_number round; learner_ref from; std::uint64_t tokens, steps, step; contribution_verdict verdict; std::uint64_t broker_inc = 0; };
struct msg_close { round_number round; fragment_index fragment; std::vector<learner_ref> members; bool merge; };
struct msg_update { fragment_index fragment; std::uint64_t version; std::vector<float> value; bool fetch_reply; round_number round; };
struct msg_published { round_number round; fragment_index fragment; std::uint64_t version; };
struct msg_fetch { learner_ref from; fragment_index fragment; };
struct msg_hello {};  // a (re)started shard announces its incarnation to the broker (Join); a restarted broker its own (Welcome)
using message = std::variant<msg_progress, msg_join, msg_round_open, msg_contribution, msg_arrival, msg_close,
                             msg_update, msg_published, msg_fetch, msg_hello>;

std::size_t message_bytes(const message& m) {
  if (auto c = std::get_if<msg_contribution>(&m)) return 64 + c->plan.delta.size() * 4;
  if (auto u = std::get_if<msg_update>(&m)) return 64 + u->value.size() * 4;
  return 64;
}

const model_shape sim_shape{256, 4, 8, 1, 2, true};

/// A plan's link fault on top of the sim's default link: its probabilities
/// replace the default's; a delay or bandwidth of 0 leaves the default's.
link_profile faulted_link(const link_profile& base, const link_fault& f) {
  link_profile p = base;
  p.loss = f.loss;
  p.duplicate = f.duplicate;
  p.reorder = f.reorder;
  p.corrupt = f.corrupt;
  if (f.delay_ms > 0) p.latency_ns = std::llround(f.delay_ms * 1e6);
  if (f.bandwidth_mbit > 0) p.bandwidth_bytes_per_s = f.bandwidth_mbit * 1e6 / 8;
  return p;
}

class mesh {
 public:
  explicit mesh(const sim_config& c)
      : cfg_(c),
        layout_(make_layout(sim_shape)),
        plan_(*make_fragment_plan(layout_, c.fragments)),
        shard_of_fragment_(round_robin_shards(c.fragments, static_cast<std::uint32_t>(c.shards))),
        rng_(derive_seed(c.seed, 1)),
        broker_(broker_settings(c, shard_of_fragment_)) {
    const int m = c.learners;
    target_.resize(layout_.total_floats);
    for (auto& x : target_) x = static_cast<float>(rng_.normal());
    shard_procs_.resize(c.shards);
    broker_shard_inc_.assign(c.shards, 0);
    shard_broker_inc_.assign(c.shards, 0);
    for (int s = 0; s < c.shards; ++s) {
      shards_.push_back(make_shard(static_cast<std::uint32_t>(s)));
      // The initial snapshot: a shard that crashes before its first commit restarts from here.
      for (fragment_index p : owned_by(static_cast<std::uint32_t>(s)))
        shard_procs_[s].durable[p.value] = shards_[s]->outer_state(p);
    }
    learners_.resize(m);
    result_.learner_steps.assign(m, 0);
    result_.contributions_sent.assign(m, 0);
    result_.member_incarnations.assign(m, {});
    result_.merged_at.assign(m, {});
    for (int i = 0; i < m; ++i) {
      learner& l = learners_[i];
      l.params.assign(layout_.total_floats, 0.f);
      l.target = target_;
      prng bias(derive_seed(c.seed, 100 + i));
      for (auto& x : l.target) x += 0.3f * static_cast<float>(bias.normal());  // non-IID data
      l.step_ns = i < static_cast<int>(c.step_ns.size()) ? c.step_ns[i] : 10'000'000;
      start_learner(i, 0);
    }
    for (const auto& f : c.crashes) {
      at(f.at_ns, [this, f] { crash(f.learner); });
      if (f.rejoin_at_ns >= 0) at(f.rejoin_at_ns, [this, f] { start_learner(f.learner, f.rejoin_at_ns); });
    }
    at(0, [this] { broker_tick(); });
    result_.broker_first_rounds.push_back(c.broker.first_round);
    for (const auto& f : c.broker_crashes) {
      at(f.at_ns, [this] { crash_broker(); });
      if (f.restart_at_ns >= f.at_ns) at(f.restart_at_ns, [this, f] { restart_broker(f.with_store); });
    }
    if (!c.timeline.empty()) {
      chaos_ = std::make_unique<chaos_core>(c.timeline, c.safety_ns);
      if (const nanos first = chaos_->next_due(); first >= 0) at(first, [this] { chaos_tick(); });
    }
  }

  sim_result run() {
    result_.initial_loss = loss(global_theta());
    while (!events_.empty() && events_.top().at <= cfg_.duration_ns + cfg_.drain_ns) {
      event e = events_.top();
      events_.pop();
      now_ = e.at;
      e.action();
    }
    result_.final_theta = global_theta();
    result_.final_loss = loss(result_.final_theta);
    result_.history = std::move(earlier_history_);  // the brokers before a restart, then the last one
    result_.history.insert(result_.history.end(), broker_.history().begin(), broker_.history().end());
    result_.broker = broker_.counters();
    result_.ledger = ledger_.totals();
    for (auto& s : shards_) result_.shards.push_back(s->ledger());
    result_.ledger_by_incarnation = ledger_.per_learner();
    for (const learner& l : learners_) {
      result_.learner_incarnations.push_back(l.inc.value);
      std::vector<std::uint64_t>& held = result_.learner_versions.emplace_back();
      for (std::uint32_t p = 0; p < plan_.fragments.size(); ++p)
        held.push_back(l.alive && l.core->installed({p}) ? l.core->version({p}) : 0);
    }
    for (std::uint32_t p = 0; p < plan_.fragments.size(); ++p)
      result_.shard_versions.push_back(shards_[shard_of({p})]->version({p}));
    if (chaos_) {
      result_.chaos_record = chaos_->record();
      result_.faults_injected = chaos_->injected();
      result_.chaos_healed = chaos_->healed(now_);
    }
    result_.faults_in_place = faults_in_place();
    return std::move(result_);
  }

 private:
  struct learner {
    std::vector<float> params, target;
    std::unique_ptr<learner_core> core;
    incarnation inc{0};
    bool alive = false;
    std::size_t installing = 0;  // fragments still being fetched on (re)join
    nanos step_ns = 0;
    std::uint64_t steps_done = 0;
    bool waiting = false;
    nanos wait_since = 0;
    // Fault drills.
    bool paused = false;            // SIGSTOP: no step runs, deliveries wait in `held`
    bool step_due = false;          // a step came due while paused
    std::vector<std::function<void()>> held;  // deliveries kept for the resume, in arrival order
    double slow = 1;                // step time × this (slow faults in force)
    std::vector<std::uint64_t> shard_inc;  // as last heard from each shard; 0: not yet
    std::uint64_t broker_inc = 0;          // as last heard from the broker; 0: not yet
  };
  /// A shard's process around its core: whether it runs, and its durable store.
  struct shard_process {
    std::uint64_t inc = 1;
    bool up = true;
    int storage_failing = 0;  // storage_errors faults in force: commits fail
    std::map<std::uint32_t, fragment_outer_state> durable;  // fragment → newest committed outer state
  };
  struct event {
    nanos at;
    std::uint64_t seq;
    std::function<void()> action;
    bool operator>(const event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  static broker_config broker_settings(const sim_config& c, const std::vector<std::uint32_t>& shard_of_fragment) {
    broker_config b = c.broker;
    b.fragments = c.fragments;
    b.shard_of_fragment = shard_of_fragment;
    return b;
  }
  std::uint32_t shard_of(fragment_index p) const { return shard_of_fragment_[p.value]; }
  std::vector<fragment_index> owned_by(std::uint32_t s) const {
    std::vector<fragment_index> owned;
    for (std::uint32_t p = 0; p < plan_.fragments.size(); ++p)
      if (shard_of({p}) == s) owned.push_back({p});
    return owned;
  }
  std::unique_ptr<shard_core> make_shard(std::uint32_t s) const {
    const std::vector<float> init(layout_.total_floats, 0.f);
    return std::make_unique<shard_core>(layout_, plan_, owned_by(s), shard_config{}, init.data());
  }
  int broker_node() const { return cfg_.learners; }
  int shard_node(std::uint32_t s) const { return cfg_.learners + 1 + static_cast<int>(s); }

  void at(nanos t, std::function<void()> action) { events_.push({t, seq_++, std::move(action)}); }

  bool partitioned(int a, int b) const {
    for (const auto& p : cfg_.partitions) {
      if (now_ < p.from_ns || now_ >= p.to_ns) continue;
      const int l = static_cast<int>(p.learner);
      if ((a == l) != (b == l)) return true;
    }
    for (const auto& [fault, group_of] : plan_partitions_) {
      const int ga = group_of[static_cast<std::size_t>(a)], gb = group_of[static_cast<std::size_t>(b)];
      if (ga >= 0 && gb >= 0 && ga != gb) return true;
    }
    return false;
  }

  /// The sender's incarnation, carried by every message as the envelope does.
  std::uint64_t incarnation_of(int node) const {
    if (node < cfg_.learners) return learners_[static_cast<std::size_t>(node)].inc.value;
    if (node == broker_node()) return broker_inc_;
    return shard_procs_[shard_at(node)].inc;
  }

  /// A link fault on either end (the sender's first) replaces the default link.
  link_profile profile_for(int from, int to) const {
    for (int node : {from, to})
      if (auto it = link_faults_.find(node); it != link_faults_.end() && !it->second.empty())
        return it->second.back().second;
    return cfg_.link;
  }

  /// Sends through the directed link's shaper; each delivery is an event.
  void send(int from, int to, message m) {
    ++result_.messages_sent;
    if (partitioned(from, to)) {
      ++result_.messages_lost;
      return;
    }
    auto key = std::make_pair(from, to);
    auto it = links_.find(key);
    if (it == links_.end())
      it = links_.emplace(key, link_shaper(profile_for(from, to), derive_seed(cfg_.seed, 10'000 + from * 1000 + to))).first;
    const auto deliveries = it->second.submit(now_, message_bytes(m));
    if (deliveries.empty()) ++result_.messages_lost;
    auto shared = std::make_shared<const message>(std::move(m));
    for (const auto& d : deliveries) {
      if (d.corrupt) {  // a checksum would reject it
        ++result_.messages_corrupted;
        continue;
      }
      at(d.at_ns, [this, from, inc = incarnation_of(from), to, shared] { deliver(from, inc, to, shared); });
    }
  }

  void deliver(int from, std::uint64_t inc, int to, const std::shared_ptr<const message>& m) {
    if (from == broker_node() && from_older_broker(to, inc)) return;  // the transport drops an older incarnation's
    if (to == broker_node() && !broker_up_) return;                    // a dead process receives nothing
    if (from == broker_node() && is_shard_node(to) && shard_procs_[shard_at(to)].up) shard_saw_broker(shard_at(to), inc);
    if (to < cfg_.learners) {
      learner& l = learners_[static_cast<std::size_t>(to)];
      if (l.alive && l.paused) {  // a stopped process's socket buffers keep what arrives
        l.held.push_back([this, from, inc, to, m] { on_learner_message(to, from, inc, *m); });
        return;
      }
      return on_learner_message(to, from, inc, *m);
    }
    if (to == broker_node()) return on_broker_message(from, inc, *m);
    if (shard_procs_[shard_at(to)].up) on_shard_message(shard_at(to), *m);  // a dead process receives nothing
  }
  bool is_shard_node(int node) const { return node > broker_node(); }
  std::uint32_t shard_at(int node) const { return static_cast<std::uint32_t>(node - cfg_.learners - 1); }

  // -- learners ---------------------------------------------------------------

  void start_learner(std::uint32_t i, nanos t) {
    learner& l = learners_[i];
    l.inc = incarnation{l.inc.value + 1};
    l.alive = true;
    l.core = std::make_unique<learner_core>(layout_, plan_, cfg_.sync);
    l.waiting = false;
    l.paused = l.step_due = false;
    l.held.clear();
    l.shard_inc.assign(shards_.size(), 0);
    l.broker_inc = 0;
    l.installing = plan_.fragments.size();
    // Clone pattern: subscribe (be a learner the shards broadcast to) first,
    // then fetch every fragment; updates at or below the fetched version are dropped.
    for (std::uint32_t p = 0; p < plan_.fragments.size(); ++p)
      at(t, [this, i, p, inc = l.inc] {
        if (learners_[i].inc == inc) send(static_cast<int>(i), shard_node(shard_of({p})), msg_fetch{{{i}, inc}, {p}});
      });
    at(t, [this, i, inc = l.inc] {
      if (learners_[i].inc == inc) send(static_cast<int>(i), broker_node(), msg_join{{{i}, inc}});
    });
    at(t + cfg_.fetch_retry_ns, [this, i, inc = l.inc] { refetch(i, inc); });
  }

  /// Joining is bounded (learner_actor's fetch_retry): fetch what is still missing.
  void refetch(std::uint32_t i, incarnation inc) {
    learner& l = learners_[i];
    if (!l.alive || l.inc != inc || l.installing == 0) return;
    if (!l.paused)
      for (std::uint32_t p = 0; p < plan_.fragments.size(); ++p)
        if (!l.core->installed({p})) send(static_cast<int>(i), shard_node(shard_of({p})), msg_fetch{{{i}, inc}, {p}});
    at(now_ + cfg_.fetch_retry_ns, [this, i, inc] { refetch(i, inc); });
  }

  void crash(std::uint32_t i) {
    learners_[i].alive = false;
    learners_[i].held.clear();
  }

  nanos step_time(const learner& l) const { return std::llround(static_cast<double>(l.step_ns) * l.slow); }

  void schedule_step(std::uint32_t i) {
    learner& l = learners_[i];
    at(now_ + step_time(l), [this, i, inc = l.inc] { step(i, inc); });
  }

  void send_contributions(std::uint32_t i) {
    learner& l = learners_[i];
    while (auto c = l.core->next_contribution(l.params.data())) {
      ++result_.contributions_sent[i];
      send(static_cast<int>(i), shard_node(shard_of(c->fragment)), msg_contribution{{{i}, l.inc}, std::move(*c), l.broker_inc});
    }
  }

  void step(std::uint32_t i, incarnation inc) {
    learner& l = learners_[i];
    if (!l.alive || l.inc != inc) return;
    if (now_ > cfg_.duration_ns) return;  // draining: no more work
    if (l.paused) {
      l.step_due = true;
      return;
    }
    if (l.core->must_wait()) {  // the synchronous policies: parked until an update arrives
      send_contributions(i);
      l.waiting = true;
      l.wait_since = now_;
      return;
    }
    // One inner step on a quadratic with this learner's target, plus noise:
    // uniform with the standard deviation 0.01, 16 random bits per value (the
    // noise is the sim's hot loop: Box-Muller's log and cos took 95% of its
    // time, and the quadratic does not care about the shape).
    constexpr float noise = 0.01f * 3.4641016f / 65536.f;  // σ · √12 spans a unit-variance uniform
    float* params = l.params.data();
    const float* target = l.target.data();
    for (std::size_t k = 0; k < l.params.size(); k += 4) {
      const std::uint64_t bits = rng_.next();
      for (std::size_t j = 0; j < 4 && k + j < l.params.size(); ++j) {
        const auto u = static_cast<float>(static_cast<std::int32_t>((bits >> (16 * j)) & 0xffff) - 32768);
        params[k + j] -= 0.05f * (params[k + j] - target[k + j]) + noise * u;
      }
    }
    ++l.steps_done;
    ++result_.learner_steps[i];
    ++result_.steps_by_incarnation[{{i}, inc}];
    result_.tokens_processed += cfg_.tokens_per_step;
    l.core->on_step(cfg_.tokens_per_step);
    send(static_cast<int>(i), broker_node(),
         msg_progress{{{i}, inc}, l.core->steps_done(), l.core->steps_done() * cfg_.tokens_per_step, step_time(l)});
    send_contributions(i);
    schedule_step(i);
  }

  /// learner_actor's shard_restarted(): a shard's higher incarnation means it
  /// restarted from its snapshot, with versions below the ones held here.
  bool shard_restarted(std::uint32_t i, std::uint32_t s, std::uint64_t inc) {
    learner& l = learners_[i];
    if (inc <= l.shard_inc[s]) return false;
    const bool restarted = l.shard_inc[s] != 0;
    l.shard_inc[s] = inc;
    if (restarted)
      for (fragment_index p : owned_by(s)) l.core->forget_version(p);
    return restarted;
  }

  void on_learner_message(int node, int from, std::uint64_t from_inc, const message& m) {
    const auto i = static_cast<std::uint32_t>(node);
    learner& l = learners_[i];
    if (!l.alive) return;
    if (is_shard_node(from)) (void)shard_restarted(i, shard_at(from), from_inc);
    if (from == broker_node()) learner_saw_broker(i, from_inc);
    if (auto o = std::get_if<msg_round_open>(&m)) {
      const std::uint32_t s = shard_of(o->fragment);
      if (shard_restarted(i, s, o->shard_inc))  // fetch at once: its broadcasts may have missed us
        for (fragment_index p : owned_by(s)) send(node, shard_node(s), msg_fetch{{{i}, l.inc}, p});
      l.core->on_round_open(o->round, o->fragment);
      if (l.installing == 0) send_contributions(i);
    } else if (auto u = std::get_if<msg_update>(&m)) {
      if (u->fetch_reply && l.installing > 0 && !l.core->installed(u->fragment)) {
        l.core->install(u->fragment, u->version, u->value, l.params.data());
        if (--l.installing == 0) schedule_step(i);  // joined: start stepping
      } else if (l.core->installed(u->fragment)) {
        l.core->on_fragment_update(u->fragment, u->version, u->value, l.params.data(), u->round);
        if (l.waiting && !l.core->must_wait()) {
          l.waiting = false;
          result_.learner_wait_ns += now_ - l.wait_since;
          schedule_step(i);
        }
      }
    }
  }

  // -- broker -----------------------------------------------------------------

  void broker_tick() {
    if (broker_up_) {
      broker_.tick(now_);
      dispatch_broker_effects();
      broker_housekeeping();
    }
    if (const int n = healthy_learners(); result_.healthy_learners.empty() || result_.healthy_learners.back().second != n)
      result_.healthy_learners.emplace_back(now_, n);
    at(now_ + cfg_.tick_ns, [this] { broker_tick(); });
  }

  void on_broker_message(int from, std::uint64_t from_inc, const message& m) {
    if (is_shard_node(from)) {  // broker_actor: a shard's higher incarnation restarted from its snapshot
      std::uint64_t& known = broker_shard_inc_[shard_at(from)];
      if (from_inc > known) {
        if (known != 0) broker_.on_shard_restarted(shard_at(from), now_);
        known = from_inc;
      }
    }
    if (auto p = std::get_if<msg_progress>(&m)) {
      std::uint64_t& delivered = result_.progress_delivered[p->from];
      delivered = std::max(delivered, p->steps);
      broker_.on_progress(p->from.learner, p->from.inc, p->steps, p->step_ns, now_);
      ledger_.on_progress(p->from, p->steps, p->tokens, p->step_ns);
    } else if (auto j = std::get_if<msg_join>(&m)) {
      broker_.on_join(j->from.learner, j->from.inc, now_);
      // broker_actor answers every Join with a Welcome; before any restart it tells
      // nobody anything new, so the sim sends it only after one (the same messages as before).
      if (broker_inc_ > 1) send(broker_node(), static_cast<int>(j->from.learner.value), msg_hello{});
    } else if (auto a = std::get_if<msg_arrival>(&m)) {
      // Buffered for a round of an earlier broker (the shard had not heard of this one): late.
      const bool earlier_broker = a->broker_inc != 0 && a->broker_inc != broker_inc_;
      if (a->verdict == contribution_verdict::buffered && !earlier_broker) {
        ledger_.on_arrival(a->round, a->from, a->step, a->steps);
        broker_.on_contribution(a->round, a->from.learner, a->from.inc, a->tokens, a->steps, now_);
      } else {
        ledger_.on_outcome(a->from, a->step, a->steps,
                           a->verdict == contribution_verdict::late ? ledger_bucket::late : ledger_bucket::rejected);
      }
    } else if (auto pub = std::get_if<msg_published>(&m)) broker_.on_published(pub->round, pub->fragment, pub->version, now_);
    dispatch_broker_effects();
  }

  void dispatch_broker_effects() {
    for (auto& effect : broker_.take_effects()) {
      if (auto o = std::get_if<open_round>(&effect)) {
        for (int i = 0; i < cfg_.learners; ++i)
          send(broker_node(), i, msg_round_open{o->round, o->fragment, broker_shard_inc_[o->shard]});
      } else if (auto c = std::get_if<close_round>(&effect)) {
        std::vector<learner_ref> members;
        for (const auto& m : c->members) {
          members.push_back({m.learner, m.inc});
          result_.member_incarnations[m.learner.value].push_back(m.inc.value);
          if (c->merge()) result_.merged_at[m.learner.value].push_back(now_);
        }
        ledger_.on_round_closed(c->round, members, c->merge());
        send(broker_node(), shard_node(c->shard), msg_close{c->round, c->fragment, std::move(members), c->merge()});
      }
    }
  }

  // -- shards -----------------------------------------------------------------

  void on_shard_message(std::uint32_t s, const message& m) {
    shard_core& shard = *shards_[s];
    const int self = shard_node(s);
    if (auto c = std::get_if<msg_contribution>(&m)) {
      shard_saw_broker(s, c->broker_inc);  // a round of a newer broker: it restarted
      const auto verdict =
          c->broker_inc != 0 && c->broker_inc < shard_broker_inc_[s]
              ? shard.on_earlier_broker_round(c->plan.tokens)  // its round died with its broker
              : shard.on_contribution(c->plan.round, c->plan.fragment, c->from, c->plan.steps, c->plan.tokens,
                                      c->plan.delta);
      if (verdict != contribution_verdict::duplicate)
        send(self, broker_node(),
             msg_arrival{c->plan.round, c->from, c->plan.tokens, c->plan.steps, c->plan.step, verdict, c->broker_inc});
    } else if (auto close = std::get_if<msg_close>(&m)) {
      auto published = shard.on_round_close(close->round, close->fragment,
                                            close->merge ? close->members : std::vector<learner_ref>{});
      assert(published);
      if (published && published->has_value()) {
        const published_fragment& pub = **published;
        ++result_.published;
        result_.versions.push_back({version_event::what::published, now_, s, pub.fragment, pub.version});
        commit(s, pub.fragment);
        for (int i = 0; i < cfg_.learners; ++i) send(self, i, msg_update{pub.fragment, pub.version, shard.value(pub.fragment), false, pub.round});
        send(self, broker_node(), msg_published{pub.round, pub.fragment, pub.version});
      }
    } else if (auto f = std::get_if<msg_fetch>(&m)) {
      send(self, static_cast<int>(f->from.learner.value),
           msg_update{f->fragment, shard.version(f->fragment), shard.value(f->fragment), true, round_number{0}});
    }
  }

  // -- broker crashes (sim_config::broker_crashes; broker_crash_fault says what happens) --

  void crash_broker() {
    if (!broker_up_) return;
    broker_up_ = false;
    const std::uint64_t dead = broker_inc_;
    rounds_leased_ = broker_.next_round().value;  // the round lease covers every round it opened
    earlier_history_.insert(earlier_history_.end(), broker_.history().begin(), broker_.history().end());
    // Each learner's transport finds the broker silent after its liveness timeout.
    for (std::uint32_t i = 0; i < learners_.size(); ++i)
      at(now_ + cfg_.broker_silence_ns, [this, i, inc = learners_[i].inc, dead] { learner_rejoin(i, inc, dead); });
  }

  void restart_broker(bool with_store) {
    if (broker_up_) return;
    broker_config settings = broker_settings(cfg_, shard_of_fragment_);
    settings.first_round = with_store ? std::max(settings.first_round, rounds_leased_) : settings.first_round;
    broker_ = broker_core(settings);
    ledger_ = token_ledger();
    if (with_store)
      for (const auto& [who, totals] : stored_ledger_) (void)ledger_.restore(who, totals, totals.steps);
    result_.ledger_restored = ledger_.totals();
    ++broker_inc_;
    broker_up_ = true;
    std::fill(broker_shard_inc_.begin(), broker_shard_inc_.end(), 0);  // the new broker knows no shard yet
    last_welcome_ns_ = -1;
    last_ledger_write_ns_ = now_;
    ++result_.broker_restarts;
    result_.broker_first_rounds.push_back(settings.first_round);
    // With its store it knows where the learners its predecessor knew listen (their
    // endpoints are kept with the ledger): it greets them at once, and they re-join.
    if (with_store) {
      std::set<std::uint32_t> known;
      for (const auto& [who, totals] : stored_ledger_) known.insert(who.learner.value);
      for (std::uint32_t i : known) send(broker_node(), static_cast<int>(i), msg_hello{});
    }
  }

  /// The broker's periodic work besides its core: the ledger write to its store, and
  /// Welcomes to the shards it has not heard from (after a restart) each fetch_retry_ns.
  void broker_housekeeping() {
    if (now_ - last_ledger_write_ns_ >= cfg_.broker_ledger_write_ns) {
      last_ledger_write_ns_ = now_;
      stored_ledger_ = ledger_.per_learner();
    }
    if (broker_inc_ == 1 || (last_welcome_ns_ >= 0 && now_ - last_welcome_ns_ < cfg_.fetch_retry_ns)) return;
    last_welcome_ns_ = now_;
    for (std::uint32_t s = 0; s < shards_.size(); ++s)
      if (broker_shard_inc_[s] == 0) send(broker_node(), shard_node(s), msg_hello{});
  }

  /// The transport drops a message of an older incarnation than one heard from already.
  bool from_older_broker(int to, std::uint64_t inc) const {
    if (to < cfg_.learners) return inc < learners_[static_cast<std::size_t>(to)].broker_inc;
    return is_shard_node(to) && inc < shard_broker_inc_[shard_at(to)];
  }

  /// learner_actor's broker_seen(): a higher incarnation is a restarted broker.
  void learner_saw_broker(std::uint32_t i, std::uint64_t inc) {
    learner& l = learners_[i];
    if (inc <= l.broker_inc) return;
    if (l.broker_inc != 0) {
      (void)l.core->on_broker_restarted();
      send(static_cast<int>(i), broker_node(), msg_join{{{i}, l.inc}});  // a greeting broker has no Join of it yet
    }
    l.broker_inc = inc;
  }

  /// The broker fell silent for learner i (incarnation inc): Join again, and again
  /// each broker_silence_ns, until a broker newer than `dead` answered.
  void learner_rejoin(std::uint32_t i, incarnation inc, std::uint64_t dead) {
    learner& l = learners_[i];
    if (!l.alive || l.inc != inc || l.broker_inc > dead) return;
    if (!l.paused) send(static_cast<int>(i), broker_node(), msg_join{{{i}, inc}});
    at(now_ + cfg_.broker_silence_ns, [this, i, inc, dead] { learner_rejoin(i, inc, dead); });
  }

  /// shard_actor's broker_seen(): a higher incarnation drops the old broker's rounds
  /// and announces the shard to the new one.
  void shard_saw_broker(std::uint32_t s, std::uint64_t inc) {
    std::uint64_t& known = shard_broker_inc_[s];
    if (inc <= known) return;
    if (known != 0) (void)shards_[s]->on_broker_restarted();
    known = inc;
    if (broker_inc_ > 1) send(shard_node(s), broker_node(), msg_hello{});  // its Join (the first broker needs none)
  }

  // -- fault drills -----------------------------------------------------------
  //
  // What each fault kind of a plan does to the simulated mesh:
  //   crash          the learner dies (its held messages too); repair: it restarts
  //                  with a new incarnation and rejoins (fetch, Join).
  //   pause          SIGSTOP: no step runs and nothing is sent; deliveries are held
  //                  and handed over on the repair (SIGCONT), same incarnation; a step
  //                  that came due restarts from the resume.
  //   slow           the learner's step time × factor (it survives a restart: the
  //                  machine is slow) until repaired.
  //   partition      no message sent between nodes of different groups; a node in no
  //                  group is unaffected. Messages already in flight still arrive.
  //   link           every link to and from the target (either end's fault, the
  //                  sender's first) uses faulted_link(default, fault); then the default.
  //   shard_crash    the shard's process is down (receives nothing) for at least
  //                  restart_ns, then a new core restores each fragment's newest
  //                  committed outer state under a higher incarnation and says hello;
  //                  the broker and the learners see the new incarnation on its messages.
  //   broker_crash   crash_broker(), then restart_broker() with its store at least
  //                  restart_ns later (see broker_crash_fault for what either does).
  //   storage_errors the shard's commits fail: its durable copies stop advancing.

  void chaos_tick() {
    for (const chaos_action& a : chaos_->tick(now_))
      if (a.action != chaos_action::what::skip) apply(chaos_->timeline()[a.fault], a.fault, a.action == chaos_action::what::inject);
    if (const nanos next = chaos_->next_due(); next >= 0) at(next, [this] { chaos_tick(); });
  }

  std::vector<int> nodes_of(const fault_target& t) const {
    std::vector<int> nodes;
    if (t.every_learner)
      for (int i = 0; i < cfg_.learners; ++i) nodes.push_back(i);
    else if (t.kind == role::sync_broker) nodes.push_back(broker_node());
    else if (t.kind == role::parameter_shard) nodes.push_back(shard_node(t.index));  // shard/N and storage/N
    else nodes.push_back(static_cast<int>(t.index));
    return nodes;
  }

  void apply(const planned_fault& f, std::size_t fault, bool inject) {
    std::vector<int> targets;
    for (const fault_target& t : f.targets)
      for (int node : nodes_of(t)) targets.push_back(node);
    // A crashed process comes back after its `for`, but never sooner than a restart takes.
    const nanos back_at = std::max(now_, f.at_ns + cfg_.restart_ns);
    for (int node : targets) {
      const auto i = static_cast<std::uint32_t>(node);
      switch (f.kind) {
        case fault_kind::crash:
          if (inject) crash(i);
          else start_learner(i, now_);
          break;
        case fault_kind::pause:
          if (inject) learners_[i].paused = true;
          else resume(i);
          break;
        case fault_kind::slow: learners_[i].slow = inject ? learners_[i].slow * f.factor : learners_[i].slow / f.factor; break;
        case fault_kind::link: {
          auto& stack = link_faults_[node];
          if (inject) stack.emplace_back(fault, faulted_link(cfg_.link, f.link));
          else std::erase_if(stack, [&](const auto& entry) { return entry.first == fault; });
          for (auto& [ends, shaper] : links_)
            if (ends.first == node || ends.second == node) (void)shaper.set_profile(profile_for(ends.first, ends.second));
          break;
        }
        case fault_kind::shard_crash:
          if (inject) shard_procs_[shard_at(node)].up = false;
          else at(back_at, [this, s = shard_at(node)] { restart_shard(s); });
          break;
        case fault_kind::broker_crash:
          if (inject) crash_broker();
          else at(back_at, [this] { restart_broker(true); });
          break;
        case fault_kind::storage_errors: shard_procs_[shard_at(node)].storage_failing += inject ? 1 : -1; break;
        case fault_kind::partition: break;
      }
    }
    if (f.kind == fault_kind::partition) {
      if (inject) {
        std::vector<int> group_of(static_cast<std::size_t>(shard_node(0)) + shards_.size(), -1);
        for (std::size_t g = 0; g < f.groups.size(); ++g)
          for (const fault_target& t : f.groups[g])
            for (int node : nodes_of(t)) group_of[static_cast<std::size_t>(node)] = static_cast<int>(g);
        plan_partitions_.emplace_back(fault, std::move(group_of));
      } else {
        std::erase_if(plan_partitions_, [&](const auto& entry) { return entry.first == fault; });
      }
    }
  }

  /// SIGCONT: what arrived meanwhile is handled in order, then stepping goes on.
  void resume(std::uint32_t i) {
    learner& l = learners_[i];
    l.paused = false;
    std::vector<std::function<void()>> held = std::move(l.held);
    l.held.clear();
    for (auto& deliver_held : held) deliver_held();
    if (l.step_due) {
      l.step_due = false;
      schedule_step(i);
    }
  }

  /// The snapshot writer: a published version becomes durable commit_delay_ns
  /// later, unless storage is failing or the process dies first.
  void commit(std::uint32_t s, fragment_index p) {
    shard_process& proc = shard_procs_[s];
    if (proc.storage_failing > 0) return;
    auto state = std::make_shared<fragment_outer_state>(shards_[s]->outer_state(p));
    at(now_ + cfg_.commit_delay_ns, [this, s, p, inc = proc.inc, state] {
      shard_process& proc = shard_procs_[s];
      if (proc.inc != inc || !proc.up) return;
      result_.versions.push_back({version_event::what::committed, now_, s, p, state->version});
      proc.durable[p.value] = std::move(*state);
    });
  }

  void restart_shard(std::uint32_t s) {
    shard_process& proc = shard_procs_[s];
    if (proc.up) return;  // restarted already (a second crash while down)
    shards_[s] = make_shard(s);
    for (const auto& [p, state] : proc.durable) {
      [[maybe_unused]] const status restored = shards_[s]->restore({p}, state);
      assert(restored.has_value());
      result_.versions.push_back({version_event::what::restored, now_, s, {p}, state.version});
    }
    ++proc.inc;
    proc.up = true;
    shard_broker_inc_[s] = 0;  // a new process: it learns the broker's incarnation afresh
    ++result_.shard_restarts;
    send(shard_node(s), broker_node(), msg_hello{});  // shard_actor announces its incarnation with a Join
  }

  int healthy_learners() const {
    for (const shard_process& proc : shard_procs_)
      if (!proc.up) return 0;
    int n = 0;
    for (int i = 0; i < cfg_.learners; ++i) {
      const learner& l = learners_[static_cast<std::size_t>(i)];
      bool reachable = broker_up_ && !partitioned(i, broker_node());
      for (std::size_t s = 0; s < shards_.size(); ++s) reachable &= !partitioned(i, shard_node(static_cast<std::uint32_t>(s)));
      n += l.alive && !l.paused && l.installing == 0 && reachable;
    }
    return n;
  }

  int faults_in_place() const {
    int n = static_cast<int>(plan_partitions_.size()) + !broker_up_;
    for (const learner& l : learners_) n += !l.alive + l.paused + (std::abs(l.slow - 1) > 1e-9);
    for (const auto& [node, stack] : link_faults_) n += static_cast<int>(stack.size());
    for (const shard_process& proc : shard_procs_) n += !proc.up + proc.storage_failing;
    return n;
  }

  // -- measurement ------------------------------------------------------------

  std::vector<float> global_theta() const {
    std::vector<float> theta(layout_.total_floats, 0.f);
    learner_core scatterer(layout_, plan_, {});
    for (std::uint32_t p = 0; p < plan_.fragments.size(); ++p)
      scatterer.scatter({p}, shards_[shard_of({p})]->value({p}).data(), theta.data());
    return theta;
  }
  double loss(const std::vector<float>& theta) const {
    double sum = 0;
    for (const auto& t : layout_.tensors)
      for (std::size_t k = t.offset; k < t.offset + t.size(); ++k) sum += std::pow(theta[k] - target_[k], 2);
    return sum / static_cast<double>(layout_.param_count);
  }

  sim_config cfg_;
  param_layout layout_;
  fragment_plan plan_;
  std::vector<std::uint32_t> shard_of_fragment_;
  prng rng_;
  broker_core broker_;
  token_ledger ledger_;
  std::vector<std::unique_ptr<shard_core>> shards_;
  std::vector<shard_process> shard_procs_;
  std::vector<std::uint64_t> broker_shard_inc_;  // the broker's view of each shard's incarnation; 0: not yet
  std::unique_ptr<chaos_core> chaos_;
  std::vector<std::pair<std::size_t, std::vector<int>>> plan_partitions_;  // fault → node → group (-1: none)
  std::map<int, std::vector<std::pair<std::size_t, link_profile>>> link_faults_;  // node → faults in force, newest last
  // Broker crashes: its process, incarnation, store (round lease, ledger) and earlier history.
  bool broker_up_ = true;
  std::uint64_t broker_inc_ = 1;
  std::uint64_t rounds_leased_ = 0;
  std::map<learner_ref, ledger_totals> stored_ledger_;
  nanos last_ledger_write_ns_ = 0, last_welcome_ns_ = -1;
  std::vector<round_record> earlier_history_;
  std::vector<std::uint64_t> shard_broker_inc_;  // each shard's view of the broker's incarnation; 0: not yet
  std::vector<learner> learners_;
  std::vector<float> target_;
  std::map<std::pair<int, int>, link_shaper> links_;
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  std::uint64_t seq_ = 0;
  nanos now_ = 0;
  sim_result result_;
};

}  // namespace

sim_result run_mesh(const sim_config& config) { return mesh(config).run(); }

}  // namespace archipelago::sim
