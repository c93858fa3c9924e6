#include "sim/mesh_sim.hpp"

#include <cassert>
#include <cmath>

namespace archipelago::sim {
namespace {

// Node ids: learners 0..M-1, the broker M, shards M+1..M+S.
struct msg_progress { learner_ref from; std::uint64_t steps, tokens; nanos step_ns; };
struct msg_join { learner_ref from; };
struct msg_round_open { round_number round; fragment_index fragment; };
struct msg_contribution { learner_ref from; contribution_plan plan; };
struct msg_arrival { round_number round; learner_ref from; std::uint64_t tokens, steps, step; contribution_verdict verdict; };
struct msg_close { round_number round; fragment_index fragment; std::vector<learner_ref> members; bool merge; };
struct msg_update { fragment_index fragment; std::uint64_t version; std::vector<float> value; bool fetch_reply; round_number round; };
struct msg_published { round_number round; fragment_index fragment; std::uint64_t version; };
struct msg_fetch { learner_ref from; fragment_index fragment; };
using message = std::variant<msg_progress, msg_join, msg_round_open, msg_contribution, msg_arrival, msg_close,
                             msg_update, msg_published, msg_fetch>;

std::size_t message_bytes(const message& m) {
  if (auto c = std::get_if<msg_contribution>(&m)) return 64 + c->plan.delta.size() * 4;
  if (auto u = std::get_if<msg_update>(&m)) return 64 + u->value.size() * 4;
  return 64;
}

const model_shape sim_shape{256, 4, 8, 1, 2, true};

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
    std::vector<float> init(layout_.total_floats, 0.f);
    for (int s = 0; s < c.shards; ++s) {
      std::vector<fragment_index> owned;
      for (int p = 0; p < c.fragments; ++p)
        if (shard_of(fragment_index{static_cast<std::uint32_t>(p)}) == static_cast<std::uint32_t>(s))
          owned.push_back({static_cast<std::uint32_t>(p)});
      shards_.push_back(std::make_unique<shard_core>(layout_, plan_, owned, shard_config{}, init.data()));
    }
    learners_.resize(m);
    result_.learner_steps.assign(m, 0);
    result_.contributions_sent.assign(m, 0);
    result_.member_incarnations.assign(m, {});
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
  }

  sim_result run() {
    result_.initial_loss = loss(global_theta());
    while (!events_.empty() && events_.top().at <= cfg_.duration_ns) {
      event e = events_.top();
      events_.pop();
      now_ = e.at;
      e.action();
    }
    result_.final_theta = global_theta();
    result_.final_loss = loss(result_.final_theta);
    result_.history.assign(broker_.history().begin(), broker_.history().end());
    result_.broker = broker_.counters();
    result_.ledger = ledger_.totals();
    for (auto& s : shards_) result_.shards.push_back(s->ledger());
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
  int broker_node() const { return cfg_.learners; }
  int shard_node(std::uint32_t s) const { return cfg_.learners + 1 + static_cast<int>(s); }

  void at(nanos t, std::function<void()> action) { events_.push({t, seq_++, std::move(action)}); }

  bool partitioned(int a, int b) const {
    for (const auto& p : cfg_.partitions) {
      if (now_ < p.from_ns || now_ >= p.to_ns) continue;
      const int l = static_cast<int>(p.learner);
      if ((a == l) != (b == l)) return true;
    }
    return false;
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
      it = links_.emplace(key, link_shaper(cfg_.link, derive_seed(cfg_.seed, 10'000 + from * 1000 + to))).first;
    const auto deliveries = it->second.submit(now_, message_bytes(m));
    if (deliveries.empty()) ++result_.messages_lost;
    auto shared = std::make_shared<const message>(std::move(m));
    for (const auto& d : deliveries) {
      if (d.corrupt) continue;  // a checksum would reject it
      at(d.at_ns, [this, to, shared] { deliver(to, *shared); });
    }
  }

  void deliver(int to, const message& m) {
    if (to < cfg_.learners) return on_learner_message(to, m);
    if (to == broker_node()) return on_broker_message(m);
    on_shard_message(static_cast<std::uint32_t>(to - cfg_.learners - 1), m);
  }

  // -- learners ---------------------------------------------------------------

  void start_learner(std::uint32_t i, nanos t) {
    learner& l = learners_[i];
    l.inc = incarnation{l.inc.value + 1};
    l.alive = true;
    l.core = std::make_unique<learner_core>(layout_, plan_, cfg_.sync);
    l.waiting = false;
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
  }

  void crash(std::uint32_t i) { learners_[i].alive = false; }

  void schedule_step(std::uint32_t i) {
    learner& l = learners_[i];
    at(now_ + l.step_ns, [this, i, inc = l.inc] { step(i, inc); });
  }

  void send_contributions(std::uint32_t i) {
    learner& l = learners_[i];
    while (auto c = l.core->next_contribution(l.params.data())) {
      ++result_.contributions_sent[i];
      send(static_cast<int>(i), shard_node(shard_of(c->fragment)), msg_contribution{{{i}, l.inc}, std::move(*c)});
    }
  }

  void step(std::uint32_t i, incarnation inc) {
    learner& l = learners_[i];
    if (!l.alive || l.inc != inc) return;
    if (l.core->must_wait()) {  // the synchronous policies: parked until an update arrives
      send_contributions(i);
      l.waiting = true;
      l.wait_since = now_;
      return;
    }
    // One inner step on a quadratic with this learner's target, plus noise.
    for (std::size_t k = 0; k < l.params.size(); ++k)
      l.params[k] -= 0.05f * (l.params[k] - l.target[k]) + 0.01f * static_cast<float>(rng_.normal());
    ++l.steps_done;
    ++result_.learner_steps[i];
    result_.tokens_processed += cfg_.tokens_per_step;
    l.core->on_step(cfg_.tokens_per_step);
    send(static_cast<int>(i), broker_node(),
         msg_progress{{{i}, inc}, l.core->steps_done(), l.core->steps_done() * cfg_.tokens_per_step, l.step_ns});
    send_contributions(i);
    schedule_step(i);
  }

  void on_learner_message(int node, const message& m) {
    const auto i = static_cast<std::uint32_t>(node);
    learner& l = learners_[i];
    if (!l.alive) return;
    if (auto o = std::get_if<msg_round_open>(&m)) {
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
    broker_.tick(now_);
    dispatch_broker_effects();
    at(now_ + cfg_.tick_ns, [this] { broker_tick(); });
  }

  void on_broker_message(const message& m) {
    if (auto p = std::get_if<msg_progress>(&m)) {
      broker_.on_progress(p->from.learner, p->from.inc, p->steps, p->step_ns, now_);
      ledger_.on_progress(p->from, p->steps, p->tokens, p->step_ns);
    } else if (auto j = std::get_if<msg_join>(&m)) {
      broker_.on_join(j->from.learner, j->from.inc, now_);
    } else if (auto a = std::get_if<msg_arrival>(&m)) {
      if (a->verdict == contribution_verdict::buffered) {
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
        for (int i = 0; i < cfg_.learners; ++i) send(broker_node(), i, msg_round_open{o->round, o->fragment});
      } else if (auto c = std::get_if<close_round>(&effect)) {
        std::vector<learner_ref> members;
        for (const auto& m : c->members) {
          members.push_back({m.learner, m.inc});
          result_.member_incarnations[m.learner.value].push_back(m.inc.value);
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
      const auto verdict = shard.on_contribution(c->plan.round, c->plan.fragment, c->from, c->plan.steps,
                                                 c->plan.tokens, c->plan.delta);
      if (verdict != contribution_verdict::duplicate)
        send(self, broker_node(),
             msg_arrival{c->plan.round, c->from, c->plan.tokens, c->plan.steps, c->plan.step, verdict});
    } else if (auto close = std::get_if<msg_close>(&m)) {
      auto published = shard.on_round_close(close->round, close->fragment,
                                            close->merge ? close->members : std::vector<learner_ref>{});
      assert(published);
      if (published && published->has_value()) {
        const published_fragment& pub = **published;
        ++result_.published;
        for (int i = 0; i < cfg_.learners; ++i) send(self, i, msg_update{pub.fragment, pub.version, shard.value(pub.fragment), false, pub.round});
        send(self, broker_node(), msg_published{pub.round, pub.fragment, pub.version});
      }
    } else if (auto f = std::get_if<msg_fetch>(&m)) {
      send(self, static_cast<int>(f->from.learner.value),
           msg_update{f->fragment, shard.version(f->fragment), shard.value(f->fragment), true, round_number{0}});
    }
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
