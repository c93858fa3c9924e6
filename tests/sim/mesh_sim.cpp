#include "sim/mesh_sim.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <queue>
#include <set>

#include "chaos_monkey/chaos_wire.hpp"
#include "core/invariant.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "core/prng.hpp"
#include "learner/learner_wire.hpp"
#include "parameter_shard/shard_wire.hpp"
#include "sim/sim_lease_service.hpp"
#include "sync_broker/broker_seat.hpp"
#include "sync_broker/lease_keeper.hpp"
#include "transport/bulk_pacer.hpp"
#include "transport/codec.hpp"
#include "transport/message_port.hpp"
#include "transport/reliability.hpp"
#include "transport/settings_wire.hpp"

namespace archipelago::sim {
namespace {

using transport::decoded_envelope;
using transport::encoded_message;

const model_shape sim_shape{256, 4, 8, 1, 2, true};
constexpr nanos commit_retry_ns = 500'000'000;  // as the shard's shell retries a failed commit

/// What the "disk" keeps of a committed state: Θ as it is (no version changes it),
/// the Nesterov buffer copied (the core changes its own in place at its next merge).
fragment_outer_state durable_copy(const fragment_outer_state& s) {
  return {s.version, s.round, s.theta, shared_floats(*s.momentum), s.adam_m, s.adam_v, s.adam_steps};
}
constexpr std::size_t heartbeat_bytes = 64;

/// The mesh as its wire layers see it: the quadratic's layout, its plan and shards,
/// the transport's heartbeat period, and where each node "listens".
mesh_setup sim_setup(const sim_config& c) {
  mesh_setup s;
  s.cfg.mesh.learners = c.learners;
  s.cfg.mesh.shards = c.shards;
  s.cfg.mesh.fragments = c.fragments;
  s.cfg.wire.heartbeat_interval_ms = std::max<std::int64_t>(1, c.broker_silence_ns / 3 / 1'000'000);
  s.cfg.wire.liveness = 3;
  s.cfg.wire.accept_chaos = true;  // the fault drills' ChaosCommands
  s.cfg.mesh.quorum = c.broker.quorum;
  s.cfg.mesh.grace_factor = c.broker.grace_factor;
  s.cfg.mesh.robust = c.robust.enabled;
  s.cfg.mesh.flush = c.flush;
  s.cfg.wire.encoding = c.encoding;
  s.cfg.wire.error_feedback = c.error_feedback;
  s.policy.fragments = c.fragments;
  s.policy.shards = c.shards;
  s.policy.quorum = c.broker.quorum;
  s.policy.rounds_in_flight = c.broker.rounds_in_flight;
  s.policy.steps_per_round = c.broker.steps_per_round;
  s.shape = sim_shape;
  s.layout = make_layout(sim_shape);
  s.plan = *make_fragment_plan(s.layout, c.fragments);
  s.shard_of_fragment = round_robin_shards(c.fragments, static_cast<std::uint32_t>(c.shards));
  s.broker_endpoint = "sim://broker";
  for (int b = 1; b <= c.standbys; ++b) s.standby_endpoints.push_back("sim://broker-" + std::to_string(b));
  for (int i = 0; i < c.shards; ++i) s.shard_endpoints.push_back("sim://shard-" + std::to_string(i));
  for (int i = 0; i < c.learners; ++i) s.learner_endpoints.push_back("sim://learner-" + std::to_string(i));
  return s;
}

class mesh;

/// A node's message port: envelopes it sends go onto the sim's links.
class sim_port final : public transport::message_port {
 public:
  sim_port(mesh& world, int node, node_address self, std::string endpoint, const link_profile& link)
      : world_(world), node_(node), self_(self), endpoint_(std::move(endpoint)), link_(link) {}

  node_address self() const override { return self_; }
  const std::string& endpoint() const override { return endpoint_; }
  status add_peer(node_address, const std::string&) override { return {}; }  // routing is by address
  transport::envelope_builder make_envelope(std::uint64_t round) override {
    return transport::envelope_builder(self_, inc, ++sequence_, round, epoch_.get());
  }
  std::uint64_t broker_epoch() const override { return epoch_.get(); }
  void raise_broker_epoch(std::uint64_t epoch) override { epoch_.raise(epoch); }
  status send(node_address peer, encoded_message&& message) override;
  status broadcast(const std::vector<node_address>& peers, encoded_message&& message) override;
  status set_link(node_address peer, const link_profile& profile) override;
  const link_profile& default_link() const override { return link_; }

  incarnation inc{1};

 private:
  mesh& world_;
  int node_;
  transport::broker_epoch_cell epoch_;
  node_address self_;
  std::string endpoint_;
  link_profile link_;
  std::uint64_t sequence_ = 0;
};

/// A broker's store: its round lease, its tape and its ledger, kept across its restarts
/// (a standby's holds the leader's copies). Records replace theirs by key, as the
/// snapshot store's do.
struct sim_broker_store final : broker_store {
  std::uint64_t rounds_leased = 0;
  std::map<std::pair<std::uint32_t, std::uint64_t>, storage::learner_ledger> ledgers;
  status lease_rounds(std::uint64_t rounds_below, incarnation) override {
    rounds_leased = std::max(rounds_leased, rounds_below);
    return {};
  }
  std::vector<storage::tape_record> tape;
  void append_tape(storage::tape_record record) override {
    record.sequence = tape.size();
    tape.push_back(std::move(record));
  }
  void write_ledger(std::vector<storage::learner_ledger> l) override {
    for (auto& record : l) ledgers[{record.learner, record.incarnation}] = std::move(record);
  }
};

class mesh {
 public:
  explicit mesh(const sim_config& c);
  sim_result run();

  void send(int from, int to, std::shared_ptr<const encoded_message> message);
  void observe_broker_send(const std::vector<node_address>& to, const encoded_message& message);
  /// The broker's answer to a Reconfigure (sim_config::reconfigures).
  void admin_reply(const encoded_message& message);
  int node_of(node_address a) const {
    if (a.kind == role::learner) return static_cast<int>(a.index);
    if (a.kind == role::sync_broker) return broker_node(a.index);
    if (a.kind == role::chaos_monkey) return chaos_node();
    return shard_node(a.index);
  }
  /// A node's transport shapes its link to `to` (a ChaosCommand it obeyed).
  void shape(int from, int to, const link_profile& profile);

 private:
  /// One delivery on a link, in flight or held by a stopped process.
  struct delivery {
    int from;
    std::uint64_t inc;
    std::shared_ptr<const encoded_message> message;  // null: a heartbeat
    bool corrupt;
  };

  struct learner {
    std::vector<float> params, target;
    std::unique_ptr<sim_port> port;
    std::unique_ptr<learner_wire> wire;
    incarnation inc{0};
    bool alive = false;
    nanos step_ns = 0;
    std::uint64_t wait_generation = 0;
    // Fault drills.
    bool paused = false;            // SIGSTOP: nothing runs; deliveries and timers wait in `held`
    std::vector<std::function<void()>> held;
    bool step_due = false;          // a step came due while paused
    // What earlier incarnations counted (the wire's counters start anew with each).
    std::uint64_t contributions_before = 0, wait_ns_before = 0;
  };

  /// A shard's process around its wire layer: whether it runs, and its durable store.
  struct shard_process;
  class sim_shard_store final : public shard_store {
   public:
    sim_shard_store(mesh& world, std::uint32_t shard) : world_(world), shard_(shard) {}
    void commit(shard_commit c) override { world_.on_shard_commit(shard_, std::move(c)); }

   private:
    mesh& world_;
    std::uint32_t shard_;
  };
  struct shard_process {
    std::unique_ptr<sim_port> port;
    std::unique_ptr<sim_shard_store> store;
    std::unique_ptr<shard_wire> wire;
    bool up = true;
    nanos storage_failing_until = 0;  // the chaos monkey's storage fault: commits before this fail
    nanos writer_free_at = 0;         // serial_commits: when its writer is done with what it was given
    std::map<std::uint32_t, fragment_outer_state> durable;  // fragment → newest committed outer state
  };

  /// What each node's transport knows: who it heard from (liveness), the newest
  /// incarnation of each sender (older ones are dropped), who it reported dead.
  /// A broker's process: its port, its seat (leading or following) and its store.
  struct broker_process {
    std::unique_ptr<sim_port> port;
    std::unique_ptr<lease_keeper> lease;  // cfg.lease; the seat holds it, so it outlives the seat
    std::unique_ptr<broker_seat> seat;
    sim_broker_store store;
    bool up = true;
    bool paused = false;                      // SIGSTOP: what arrives waits in `held`
    std::vector<std::function<void()>> held;
    bool host_lost = false;  // broker_host_lost: down for good, its store gone
    const broker_wire* led = nullptr;  // the wire it led through when last looked at
  };

  struct node_transport_state {
    peer_liveness liveness;
    std::map<int, std::uint64_t> newest_inc;
    std::set<int> dead;
  };

  struct event {
    nanos at;
    std::uint64_t seq;
    std::function<void()> action;
    bool operator>(const event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  // -- topology ---------------------------------------------------------------
  // Nodes: the learners, the primary broker, the shards, the standby brokers; the chaos monkey last.
  int broker_node(std::uint32_t b = 0) const {
    return b == 0 ? cfg_.learners : cfg_.learners + cfg_.shards + static_cast<int>(b);
  }
  int shard_node(std::uint32_t s) const { return cfg_.learners + 1 + static_cast<int>(s); }
  bool is_shard_node(int node) const { return node > cfg_.learners && node <= cfg_.learners + cfg_.shards; }
  /// The broker index of a broker's node; -1 for any other node.
  int broker_at_node(int node) const {
    if (node == cfg_.learners) return 0;
    if (node > cfg_.learners + cfg_.shards && node < nodes()) return node - cfg_.learners - cfg_.shards;
    return -1;
  }
  std::uint32_t shard_at(int node) const { return static_cast<std::uint32_t>(node - cfg_.learners - 1); }
  int nodes() const { return cfg_.learners + 1 + cfg_.shards + cfg_.standbys; }  // the chaos monkey's is after them
  int chaos_node() const { return nodes(); }
  node_address address_of(int node) const {
    if (node < cfg_.learners) return {role::learner, static_cast<std::uint32_t>(node)};
    if (const int b = broker_at_node(node); b >= 0) return broker_at(static_cast<std::uint32_t>(b));
    if (node == chaos_node()) return {role::chaos_monkey, 0};
    return {role::parameter_shard, shard_at(node)};
  }
  /// The broker that leads now, if one does (the newest epoch among those that lead).
  const broker_wire* leader() const;
  std::uint32_t shard_of(fragment_index p) const { return setup_.shard_of_fragment[p.value]; }
  void at(nanos t, std::function<void()> action) { events_.push({t, seq_++, std::move(action)}); }

  // -- network ----------------------------------------------------------------
  bool partitioned(int a, int b) const;
  link_profile profile_for(int from, int to) const;
  link_shaper& link(int from, int to);
  /// Feeds the link from → to the bulk pieces it takes now (the transport's lanes).
  void pace(int from, int to);
  std::uint64_t incarnation_of(int node) const;
  bool running(int node) const;
  void deliver(int to, const delivery& d);
  void dispatch(int to, int from, const decoded_envelope& env);
  void heartbeat(int node);
  void peer_event(int node, int peer, bool alive);

  // -- roles ------------------------------------------------------------------
  void start_learner(std::uint32_t i, nanos t);
  void crash(std::uint32_t i);
  nanos step_time(const learner& l) const {
    return std::llround(static_cast<double>(l.step_ns) * l.wire->slowdown());  // the chaos monkey's slow-down
  }
  void schedule_step(std::uint32_t i);
  void step(std::uint32_t i, incarnation inc);
  void learner_do(std::uint32_t i, incarnation inc, std::function<void(learner&)> fn);
  void arm_join_retry(std::uint32_t i, incarnation inc);
  void arm_rejoin(std::uint32_t i, incarnation inc);
  void arm_wait_timeout(std::uint32_t i, incarnation inc);
  void on_learner_event(std::uint32_t i, const learner_event& e);
  void start_broker(std::uint32_t b, bool with_store);
  void note_leadership(std::uint32_t b);
  void broker_tick();
  void crash_broker(std::uint32_t b, bool store_lost = false);
  void pause_broker(std::uint32_t b, nanos duration);
  void pump_lease(std::uint32_t b);
  bool lease_reachable(std::uint32_t b) const;
  bool stopped(int node) const;
  std::unique_ptr<shard_wire> make_shard(std::uint32_t s, std::vector<std::pair<fragment_index, fragment_outer_state>> restored);
  void on_shard_commit(std::uint32_t s, shard_commit c);
  void restart_shard(std::uint32_t s);

  // -- fault drills -----------------------------------------------------------
  class sim_processes;
  void chaos_tick();
  void crash_target(const fault_target& t);
  void restart_target(const fault_target& t);
  void pause_target(const fault_target& t, nanos duration);
  void lose_host_target(const fault_target& t);
  void resume(std::uint32_t i);
  void storage_order(std::uint32_t s, const chaos_order& order);
  void fresh_transport(int node);
  bool cut(int a, int b) const { return profile_for(a, b).loss >= 1; }
  int healthy_learners() const;
  int faults_in_place() const;

  // -- measurement ------------------------------------------------------------
  std::vector<float> global_theta() const;
  double loss(const std::vector<float>& theta) const;
  void sample_loss();
  void collect(sim_result& r) const;

  sim_config cfg_;
  mesh_setup setup_;
  prng rng_;
  std::vector<float> target_;
  std::vector<learner> learners_;
  std::vector<shard_process> shards_;
  std::vector<broker_process> brokers_;  // the primary, then the standbys
  std::vector<round_record> earlier_history_;
  sim_lease_service lease_service_;
  std::vector<node_transport_state> transports_;
  // The chaos monkey: its wire layer, its port, the launcher it drives, its record.
  std::unique_ptr<sim_port> chaos_port_;
  std::uint64_t admin_sequence_ = 0;
  std::unique_ptr<process_control> processes_;
  chaos_log chaos_log_;
  std::unique_ptr<chaos_wire> chaos_;
  std::map<int, nanos> crashed_at_;  // node → its crash: a shard's or the broker's restart takes restart_ns
  std::map<std::pair<int, int>, link_profile> shaped_;  // directed links a node's transport shaped (ChaosCommands)
  std::map<std::pair<int, int>, link_shaper> links_;
  // The bulk lane of each link, as the transport paces it (bulk_pacer): messages
  // with tensors enter the link a piece at a time, so control waits behind one piece.
  struct bulk_lane {
    bulk_pacer pacer;
    std::map<std::uint64_t, std::shared_ptr<const encoded_message>> waiting;
    nanos pump_at = -1;  // a pace() is scheduled then
  };
  std::map<std::pair<int, int>, bulk_lane> bulk_;
  std::uint64_t bulk_ids_ = 0;
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  std::uint64_t seq_ = 0;
  nanos now_ = 0;
  /// The roles' lines, rate-limited on the simulation's virtual time: a seed's run logs the same lines.
  struct virtual_clock final : clock_source {
    const nanos& t;
    explicit virtual_clock(const nanos& at) : t(at) {}
    nanos now() const override { return t; }
  };
  virtual_clock log_clock_{now_};
  logger log_{log_options{}, log_clock_};
  sim_result result_;
};

/// The launcher the chaos monkey drives: the sim's own processes (see "fault drills" below).
class mesh::sim_processes final : public process_control {
 public:
  explicit sim_processes(mesh& world) : world_(world) {}
  void crash(const fault_target& t) override { world_.crash_target(t); }
  void restart(const fault_target& t) override { world_.restart_target(t); }
  void pause(const fault_target& t, nanos duration) override { world_.pause_target(t, duration); }
  void lose_host(const fault_target& t) override { world_.lose_host_target(t); }

 private:
  mesh& world_;
};

status sim_port::set_link(node_address peer, const link_profile& profile) {
  world_.shape(node_, world_.node_of(peer), profile);
  return {};
}

status sim_port::send(node_address peer, encoded_message&& message) {
  return broadcast({peer}, std::move(message));
}

status sim_port::broadcast(const std::vector<node_address>& peers, encoded_message&& message) {
  if (peers.size() == 1 && peers[0].kind == role::admin) return world_.admin_reply(message), status{};
  auto shared = std::make_shared<const encoded_message>(std::move(message));
  if (self_.kind == role::sync_broker) world_.observe_broker_send(peers, *shared);
  for (node_address peer : peers) world_.send(node_, world_.node_of(peer), shared);
  return {};
}

/// The frames of an encoded message as a receiver's socket holds them.
std::vector<transport::frame_view> frames_of(const encoded_message& m) {
  std::vector<transport::frame_view> frames{
      {reinterpret_cast<const std::uint8_t*>(m.envelope.begin()), m.envelope.size() * sizeof(capnp::word)}};
  for (const auto& t : m.tensors) frames.push_back({t.data(), t.size()});
  return frames;
}

mesh::mesh(const sim_config& c) : cfg_(c), setup_(sim_setup(c)), rng_(derive_seed(c.seed, 1)) {
  const int m = c.learners;
  target_.resize(setup_.layout.total_floats);
  for (auto& x : target_) x = static_cast<float>(rng_.normal());
  const heartbeat_config hb{c.broker_silence_ns / 3, 3};
  for (int n = 0; n <= chaos_node(); ++n) transports_.push_back({peer_liveness(hb), {}, {}});
  shards_.resize(static_cast<std::size_t>(c.shards));
  for (std::uint32_t s = 0; s < shards_.size(); ++s) {
    shard_process& proc = shards_[s];
    proc.port = std::make_unique<sim_port>(*this, shard_node(s), node_address{role::parameter_shard, s},
                                           setup_.shard_endpoints[s], c.link);
    proc.store = std::make_unique<sim_shard_store>(*this, s);
    proc.wire = make_shard(s, {});
    // The initial snapshot: a shard that crashes before its first commit restarts from here.
    for (fragment_index p : setup_.fragments_of(s)) proc.durable[p.value] = durable_copy(proc.wire->core().outer_state(p));
  }
  learners_.resize(static_cast<std::size_t>(m));
  result_.learner_steps.assign(m, 0);
  result_.contributions_sent.assign(m, 0);
  result_.member_incarnations.assign(m, {});
  result_.merged_at.assign(m, {});
  for (int i = 0; i < m; ++i) {
    learner& l = learners_[static_cast<std::size_t>(i)];
    l.params.assign(setup_.layout.total_floats, 0.f);
    l.target = target_;
    prng bias(derive_seed(c.seed, 100 + i));
    for (auto& x : l.target) x += c.target_spread * static_cast<float>(bias.normal());  // non-IID data
    l.step_ns = i < static_cast<int>(c.step_ns.size()) ? c.step_ns[i] : 10'000'000;
  }
  brokers_.resize(static_cast<std::size_t>(1 + c.standbys));
  for (std::uint32_t b = 0; b < brokers_.size(); ++b) {
    brokers_[b].port = std::make_unique<sim_port>(*this, broker_node(b), broker_at(b), setup_.broker_endpoint_of(b), c.link);
    start_broker(b, true);
  }
  for (std::uint32_t s = 0; s < shards_.size(); ++s) shards_[s].wire->start();
  for (int i = 0; i < m; ++i) start_learner(static_cast<std::uint32_t>(i), 0);
  for (const auto& f : c.crashes) {
    at(f.at_ns, [this, f] { crash(f.learner); });
    if (f.rejoin_at_ns >= 0) at(f.rejoin_at_ns, [this, f] { start_learner(f.learner, f.rejoin_at_ns); });
  }
  at(0, [this] { broker_tick(); });
  if (c.loss_every_ns > 0) at(0, [this] { sample_loss(); });
  for (int n = 0; n < nodes(); ++n) at(0, [this, n] { heartbeat(n); });
  for (const auto& f : c.broker_pauses) at(f.at_ns, [this, f] { pause_broker(f.broker, f.for_ns); });
  for (const auto& [t, settings] : c.reconfigures)
    at(t, [this, s = settings] {
      transport::envelope_builder b({role::admin, 0}, incarnation{1}, ++admin_sequence_, 0, 0);
      transport::set_settings(b.body().initReconfigure().initSettings(static_cast<unsigned>(s.size())), s);
      const encoded_message m = b.finish();
      auto env = transport::decode_envelope(frames_of(m));
      ARCHIPELAGO_INVARIANT(env, "sim: a node's envelope decodes");
      brokers_[0].seat->on_message(env.value(), now_);
    });
  for (const auto& f : c.broker_crashes) {
    at(f.at_ns, [this, f] { crash_broker(f.broker, f.store_lost); });
    if (f.restart_at_ns >= f.at_ns) at(f.restart_at_ns, [this, f] { start_broker(f.broker, f.with_store); });
  }
  if (!c.timeline.empty()) {
    chaos_port_ = std::make_unique<sim_port>(*this, chaos_node(), node_address{role::chaos_monkey, 0}, "sim://chaos", c.link);
    processes_ = std::make_unique<sim_processes>(*this);
    chaos_ = std::make_unique<chaos_wire>(setup_, c.timeline, c.safety_ns, *chaos_port_, *processes_, chaos_log_);
    chaos_->start();
    at(0, [this] { chaos_tick(); });
  }
}

sim_result mesh::run() {
  result_.initial_loss = loss(global_theta());
  while (!events_.empty() && events_.top().at <= cfg_.duration_ns + cfg_.drain_ns) {
    event e = events_.top();
    events_.pop();
    now_ = e.at;
    e.action();
  }
  collect(result_);
  return std::move(result_);
}

// -- network --------------------------------------------------------------------

bool mesh::partitioned(int a, int b) const {
  for (const auto& p : cfg_.partitions) {
    if (now_ < p.from_ns || now_ >= p.to_ns) continue;
    const int l = static_cast<int>(p.learner);
    if ((a == l) != (b == l)) return true;
  }
  for (const auto& p : cfg_.broker_partitions) {
    if (now_ < p.from_ns || now_ >= p.to_ns) continue;
    const int n = broker_node(p.broker);
    if ((a == n) == (b == n)) continue;
    if (!p.from_brokers_only || (broker_at_node(a) >= 0 && broker_at_node(b) >= 0)) return true;
  }
  return false;
}

/// The link as the sender's transport shaped it (ChaosCommands), else the default.
link_profile mesh::profile_for(int from, int to) const {
  const auto it = shaped_.find({from, to});
  return it == shaped_.end() ? cfg_.link : it->second;
}

void mesh::shape(int from, int to, const link_profile& profile) {
  shaped_[{from, to}] = profile;
  (void)link(from, to).set_profile(profile);
}

/// A new process of `node`: a transport that knows no peer, shapes no link and
/// has no bulk message waiting (its predecessor's died with it).
void mesh::fresh_transport(int node) {
  transports_[static_cast<std::size_t>(node)] = {peer_liveness({cfg_.broker_silence_ns / 3, 3}), {}, {}};
  for (auto& [link_key, lane] : bulk_)
    if (link_key.first == node) {
      lane.pacer.clear();
      lane.waiting.clear();
    }
  for (auto it = shaped_.begin(); it != shaped_.end();)
    if (it->first.first == node) {
      (void)link(node, it->first.second).set_profile(cfg_.link);
      it = shaped_.erase(it);
    } else {
      ++it;
    }
}

link_shaper& mesh::link(int from, int to) {
  const auto key = std::make_pair(from, to);
  auto it = links_.find(key);
  if (it == links_.end())
    it = links_.emplace(key, link_shaper(profile_for(from, to), derive_seed(cfg_.seed, 10'000 + from * 1000 + to))).first;
  return it->second;
}

/// The sender's incarnation, carried by every message as the envelope's header does.
std::uint64_t mesh::incarnation_of(int node) const {
  if (node < cfg_.learners) return learners_[static_cast<std::size_t>(node)].inc.value;
  if (const int b = broker_at_node(node); b >= 0) return brokers_[static_cast<std::size_t>(b)].port->inc.value;
  if (node == chaos_node()) return chaos_port_->inc.value;
  return shards_[shard_at(node)].port->inc.value;
}

/// A paused (SIGSTOP) learner or broker: alive, but it handles nothing.
bool mesh::stopped(int node) const {
  if (node < cfg_.learners) return learners_[static_cast<std::size_t>(node)].paused;
  const int b = broker_at_node(node);
  return b >= 0 && brokers_[static_cast<std::size_t>(b)].paused;
}

/// The node's process runs (a paused learner runs not, but is alive).
bool mesh::running(int node) const {
  if (node < cfg_.learners) return learners_[static_cast<std::size_t>(node)].alive;
  if (const int b = broker_at_node(node); b >= 0) return brokers_[static_cast<std::size_t>(b)].up;
  return shards_[shard_at(node)].up;
}

void mesh::send(int from, int to, std::shared_ptr<const encoded_message> message) {
  ++result_.messages_sent;
  if (partitioned(from, to)) {
    ++result_.messages_lost;
    return;
  }
  if (!message->tensors.empty()) {
    bulk_lane& lane = bulk_.try_emplace({from, to}, bulk_lane{bulk_pacer(cfg_.bulk_piece_bytes), {}, -1}).first->second;
    const std::uint64_t id = ++bulk_ids_;
    if (!lane.pacer.queue(id, message->total_bytes())) {
      ++result_.messages_lost;  // the lane's queue is full: dropped, as the transport does
      return;
    }
    lane.waiting.emplace(id, std::move(message));
    return pace(from, to);
  }
  const auto deliveries = link(from, to).submit(now_, message->total_bytes());
  if (deliveries.empty()) ++result_.messages_lost;
  for (const auto& d : deliveries)
    at(d.at_ns, [this, to, dl = delivery{from, incarnation_of(from), message, d.corrupt}] { deliver(to, dl); });
}

void mesh::pace(int from, int to) {
  bulk_lane& lane = bulk_.at({from, to});
  link_shaper& shaper = link(from, to);
  for (const auto& done : lane.pacer.pump(now_, shaper)) {
    auto m = lane.waiting.extract(done.id);
    if (done.arrivals.empty()) ++result_.messages_lost;
    for (const auto& d : done.arrivals)
      at(d.at_ns, [this, to, dl = delivery{from, incarnation_of(from), m.mapped(), d.corrupt}] { deliver(to, dl); });
  }
  const nanos next = lane.pacer.next_pump_ns(now_, shaper);
  if (next < 0 || next == lane.pump_at) return;
  lane.pump_at = next;
  at(next, [this, from, to] {
    bulk_.at({from, to}).pump_at = -1;
    pace(from, to);
  });
}

/// Every node heartbeats each of its peers (learners never talk to each other)
/// and declares the peers it has not heard from within the liveness window dead.
void mesh::heartbeat(int node) {
  if (running(node) && !stopped(node)) {
    for (int peer = 0; peer < nodes(); ++peer) {
      if (peer == node || (peer < cfg_.learners && node < cfg_.learners) || partitioned(node, peer)) continue;
      for (const auto& d : link(node, peer).submit(now_, heartbeat_bytes))
        at(d.at_ns, [this, peer, dl = delivery{node, incarnation_of(node), nullptr, d.corrupt}] { deliver(peer, dl); });
    }
    for (node_address dead : transports_[static_cast<std::size_t>(node)].liveness.expire(now_)) {
      ++result_.peers_declared_dead;
      peer_event(node, node_of(dead), false);
    }
  }
  at(now_ + cfg_.broker_silence_ns / 3, [this, node] { heartbeat(node); });
}

void mesh::peer_event(int node, int peer, bool alive) {
  auto& dead = transports_[static_cast<std::size_t>(node)].dead;
  if (alive ? dead.erase(peer) == 0 : !dead.insert(peer).second) return;
  const node_address p = address_of(peer);
  if (node < cfg_.learners) {
    const auto i = static_cast<std::uint32_t>(node);
    if (learners_[i].wire->on_peer(p, alive)) arm_rejoin(i, learners_[i].inc);
  } else if (const int b = broker_at_node(node); b >= 0) {
    brokers_[static_cast<std::size_t>(b)].seat->on_peer(p, alive, now_);
  } else {
    shards_[shard_at(node)].wire->on_peer(p, alive);
  }
}

/// What the receiving transport does with an arriving message: a dead process
/// gets nothing; a stopped one holds it; a corrupted one fails the codec's
/// checksum; one of an older incarnation of its sender is dropped; any other
/// goes to the node's wire layer, and a control-lane one (no tensors) counts as a sign of life.
void mesh::deliver(int to, const delivery& d) {
  if (!running(to)) return;
  if (stopped(to)) {
    const int b = broker_at_node(to);
    (b >= 0 ? brokers_[static_cast<std::size_t>(b)].held : learners_[static_cast<std::size_t>(to)].held)
        .push_back([this, to, d] { deliver(to, d); });
    return;
  }
  std::unique_ptr<decoded_envelope> env;
  if (d.message) {
    std::vector<transport::frame_view> frames = frames_of(*d.message);
    std::vector<std::uint8_t> corrupted;
    if (d.corrupt) {  // one byte flipped in flight
      corrupted.assign(frames[0].data, frames[0].data + frames[0].size);
      corrupted[corrupted.size() / 2] ^= 0x5a;
      frames[0] = {corrupted.data(), corrupted.size()};
    }
    auto decoded = transport::decode_envelope(frames);
    if (!decoded) {
      ++result_.messages_corrupted;
      return;
    }
    env = decoded.take();
  } else if (d.corrupt) {
    ++result_.messages_corrupted;
    return;
  }
  node_transport_state& t = transports_[static_cast<std::size_t>(to)];
  std::uint64_t& newest = t.newest_inc[d.from];
  if (d.inc < newest) return;
  newest = d.inc;
  if (!env || env->tensor_count() == 0) {  // liveness is the control lane's verdict alone
    t.liveness.heard_from(address_of(d.from), now_);
    peer_event(to, d.from, true);
  }
  if (env) dispatch(to, d.from, *env);
}

void mesh::dispatch(int to, int from, const decoded_envelope& env) {
  if (to < cfg_.learners) {
    const auto i = static_cast<std::uint32_t>(to);
    on_learner_event(i, learners_[i].wire->on_message(env, now_));
  } else if (const int b = broker_at_node(to); b >= 0) {
    broker_process& proc = brokers_[static_cast<std::size_t>(b)];
    if (env.body() == wire::Envelope::Body::PROGRESS && proc.seat->leading()) {
      std::uint64_t& delivered = result_.progress_delivered[{{env.sender().index}, incarnation{env.header().getIncarnation()}}];
      delivered = std::max(delivered, env.root().getBody().getProgress().getStep());
    }
    proc.seat->on_message(env, now_);
    note_leadership(static_cast<std::uint32_t>(b));
  } else {
    shard_wire& shard = *shards_[shard_at(to)].wire;
    const std::uint64_t fenced = shard.broker_messages_fenced();
    if (auto order = shard.on_message(env, now_)) storage_order(shard_at(to), *order);
    // A round close of an epoch older than one that led already, taken by the shard: a deposed broker merged.
    if (env.body() == wire::Envelope::Body::ROUND_CLOSE && shard.broker_messages_fenced() == fenced)
      for (const auto& [t, b, epoch] : result_.leaders)
        if (epoch > env.header().getBrokerEpoch() && t <= now_) {
          ++result_.closes_merged_by_deposed;
          break;
        }
  }
}

void mesh::admin_reply(const encoded_message& message) {
  auto env = transport::decode_envelope(frames_of(message));
  ARCHIPELAGO_INVARIANT(env, "sim: a node's envelope decodes");
  auto body = env.value().root().getBody();
  if (body.isAck()) result_.admin_replies.emplace_back(true, std::to_string(body.getAck().getSequence()));
  else if (body.isError()) result_.admin_replies.emplace_back(false, body.getError().getMessage().cStr());
}

/// The broker's round closes (who was merged, and when) and its Welcomes to
/// shards, read off what it sends.
void mesh::observe_broker_send(const std::vector<node_address>& to, const encoded_message& message) {
  auto decoded = transport::decode_envelope(frames_of(message));
  ARCHIPELAGO_INVARIANT(decoded, "sim: a fragment decodes");
  const decoded_envelope& env = decoded.value();
  const auto body = env.body();
  if (cfg_.lease && (body == wire::Envelope::Body::ROUND_OPEN || body == wire::Envelope::Body::ROUND_CLOSE)) {
    const lease_state ls = brokers_[env.sender().index].lease->state();
    if (ls.held_epoch != env.header().getBrokerEpoch() || now_ >= ls.valid_until) ++result_.rounds_acted_without_lease;
  }
  if (body == wire::Envelope::Body::WELCOME) {
    for (node_address peer : to)
      if (peer.kind == role::parameter_shard) result_.welcomes_to_shards.emplace_back(now_, peer.index);
  } else if (env.body() == wire::Envelope::Body::ROUND_CLOSE) {
    result_.round_closes.emplace_back(now_, env.sender().index, env.header().getBrokerEpoch());
    auto close = env.root().getBody().getRoundClose();
    for (auto m : close.getMembers()) {
      result_.member_incarnations[m.getLearner()].push_back(m.getIncarnation());
      if (close.getQuorumNs() >= 0) result_.merged_at[m.getLearner()].push_back(now_);
    }
  }
}

// -- learners ---------------------------------------------------------------------

void mesh::start_learner(std::uint32_t i, nanos t) {
  learner& l = learners_[i];
  if (l.wire) {
    l.contributions_before += l.wire->status().counts.contributions;
    l.wait_ns_before += l.wire->status().counts.wait_ns;
  }
  l.inc = incarnation{l.inc.value + 1};
  l.alive = true;
  l.paused = l.step_due = false;
  l.held.clear();
  l.port = std::make_unique<sim_port>(*this, static_cast<int>(i), node_address{role::learner, i},
                                      setup_.learner_endpoints[i], cfg_.link);
  l.port->inc = l.inc;
  l.wire = std::make_unique<learner_wire>(setup_, cfg_.sync, i, l.inc, *l.port, log_,
                                          learner_model_view{l.params.data(), nullptr,
                                                             static_cast<std::uint32_t>(cfg_.tokens_per_step), 1});
  fresh_transport(static_cast<int>(i));
  // Clone pattern: subscribe with (fetch from) every shard first, then Join.
  at(t, [this, i, inc = l.inc] {
    if (learners_[i].inc == inc && learners_[i].alive) learners_[i].wire->start();
  });
  arm_join_retry(i, l.inc);
}

void mesh::crash(std::uint32_t i) {
  learners_[i].alive = false;
  learners_[i].held.clear();
}

/// Runs `fn` on the learner's incarnation `inc` if it still lives; a stopped
/// process runs it when it is resumed (its timers and sockets wait).
void mesh::learner_do(std::uint32_t i, incarnation inc, std::function<void(learner&)> fn) {
  learner& l = learners_[i];
  if (!l.alive || l.inc != inc) return;
  if (l.paused) {
    l.held.push_back([this, i, inc, fn] { learner_do(i, inc, fn); });
    return;
  }
  fn(l);
}

/// Joining is bounded (learner_actor's join retry): fetch what is still missing.
void mesh::arm_join_retry(std::uint32_t i, incarnation inc) {
  at(now_ + cfg_.fetch_retry_ns, [this, i, inc] {
    learner_do(i, inc, [this, i, inc](learner& l) {
      if (l.wire->on_join_timer(now_)) arm_join_retry(i, inc);
    });
  });
}

/// The broker fell silent: Join again each period until it answers.
void mesh::arm_rejoin(std::uint32_t i, incarnation inc) {
  at(now_ + cfg_.broker_silence_ns, [this, i, inc] {
    learner_do(i, inc, [this, i, inc](learner& l) {
      if (l.wire->on_rejoin_timer()) arm_rejoin(i, inc);
    });
  });
}

/// A wait of a synchronous policy is bounded by the round timeout: then fetch again.
void mesh::arm_wait_timeout(std::uint32_t i, incarnation inc) {
  at(now_ + cfg_.broker.round_timeout_ns, [this, i, inc, generation = learners_[i].wait_generation] {
    learner_do(i, inc, [this, i, inc, generation](learner& l) {
      if (!l.wire->waiting() || generation != l.wait_generation) return;
      l.wire->on_wait_timeout();
      arm_wait_timeout(i, inc);
    });
  });
}

void mesh::on_learner_event(std::uint32_t i, const learner_event& e) {
  learner& l = learners_[i];
  ARCHIPELAGO_INVARIANT(!e.refused, "sim: every node agrees on the layout and the policy");
  if (e.resume) ++l.wait_generation;
  if (e.flushed) return l.wire->leave("steps done");
  if (e.start_stepping || e.resume) schedule_step(i);
}

void mesh::schedule_step(std::uint32_t i) {
  learner& l = learners_[i];
  at(now_ + step_time(l), [this, i, inc = l.inc] { step(i, inc); });
}

void mesh::step(std::uint32_t i, incarnation inc) {
  learner& l = learners_[i];
  if (!l.alive || l.inc != inc) return;
  if (now_ > cfg_.duration_ns) return;  // draining: no more work
  if (l.paused) {
    l.step_due = true;
    return;
  }
  if (l.wire->wait_before_step(now_)) {  // the synchronous policies: parked until an update arrives
    arm_wait_timeout(i, inc);
    return;
  }
  if (cfg_.steps_per_learner != 0 && l.wire->core().steps_done() >= cfg_.steps_per_learner) {
    if (!l.wire->begin_flush()) l.wire->leave("steps done");
    return;
  }
  // One inner step on a quadratic with this learner's target, plus noise:
  // uniform with the standard deviation 0.01, 16 random bits per value (the
  // noise is the sim's hot loop: Box-Muller's log and cos took 95% of its
  // time, and the quadratic does not care about the shape).
  constexpr float noise = 0.01f * 3.4641016f / 65536.f;  // σ · √12 spans a unit-variance uniform
  float* params = l.params.data();
  const float* target = l.target.data();
  const float rate = cfg_.inner_rate;
  for (std::size_t k = 0; k < l.params.size(); k += 4) {
    const std::uint64_t bits = rng_.next();
    for (std::size_t j = 0; j < 4 && k + j < l.params.size(); ++j) {
      const auto u = static_cast<float>(static_cast<std::int32_t>((bits >> (16 * j)) & 0xffff) - 32768);
      params[k + j] -= rate * (params[k + j] - target[k + j]) + noise * u;
    }
  }
  ++result_.learner_steps[i];
  ++result_.steps_by_incarnation[{{i}, inc}];
  result_.tokens_processed += cfg_.tokens_per_step;
  l.wire->after_step(cfg_.tokens_per_step, step_time(l));
  schedule_step(i);
}

// -- broker -----------------------------------------------------------------------

/// A new broker process: the first one, or a restart. With its store (as `node
/// --role broker --db`) it leases round numbers and restores its predecessor's
/// round lease and ledger when it begins to lead; without, it starts from
/// nothing. Its seat leads at once in a mesh without standbys; with standbys
/// the election decides (broker_seat).
void mesh::start_broker(std::uint32_t b, bool with_store) {
  broker_process& proc = brokers_[b];
  if (proc.seat && proc.up) return;
  if (proc.seat) {  // a new process: the next incarnation, a port that knows no epoch yet
    const incarnation next{proc.port->inc.value + 1};
    proc.seat.reset();
    proc.paused = false;
    proc.held.clear();
    ++result_.broker_restarts;
    fresh_transport(broker_node(b));
    proc.port = std::make_unique<sim_port>(*this, broker_node(b), broker_at(b), setup_.broker_endpoint_of(b), cfg_.link);
    proc.port->inc = next;
  }
  broker_config settings = cfg_.broker;
  settings.fragments = cfg_.fragments;
  settings.shard_of_fragment = setup_.shard_of_fragment;
  auto read_start = [this, &proc, with_store] {
    broker_start start;
    start.first_round = cfg_.broker.first_round;
    start.recovery = with_store;
    start.rounds_leased = proc.store.rounds_leased;
    for (const auto& [key, record] : proc.store.ledgers) start.ledgers.push_back(record);
    if (with_store) start.tape = proc.store.tape;
    if (with_store)
      for (const storage::tape_record& t : proc.store.tape)
        if (!t.settings.empty()) start.settings.push_back(t.settings);
    start.ledger_write_interval_ns = cfg_.broker_ledger_write_ns;
    return start;
  };
  proc.up = true;
  proc.led = nullptr;
  proc.lease = cfg_.lease ? std::make_unique<lease_keeper>(lease_settings(setup_, b)) : nullptr;
  proc.seat = std::make_unique<broker_seat>(setup_, settings, proc.port->inc, b, *proc.port, log_,
                                            with_store ? &proc.store : nullptr, read_start, now_, proc.lease.get());
  note_leadership(b);
}

/// Records a seat's change of role: the leader's first round and restored ledger,
/// the epochs in turn, and the history of a leader that stepped down.
void mesh::note_leadership(std::uint32_t b) {
  broker_process& proc = brokers_[b];
  const broker_wire* wire = proc.up && proc.seat ? proc.seat->leading() : nullptr;
  if (wire == proc.led) return;
  if (proc.led && !wire && proc.up) result_.step_downs.emplace_back(now_, b);
  proc.led = wire;
  if (!wire) return;
  result_.leaders.emplace_back(now_, b, wire->epoch());
  result_.ledger_restored = wire->ledger().totals();
  result_.broker_first_rounds.push_back(wire->core().next_round().value);
}

const broker_wire* mesh::leader() const {
  const broker_wire* out = nullptr;
  for (const broker_process& proc : brokers_)
    if (proc.up && proc.seat && proc.seat->leading() && (!out || proc.seat->leading()->epoch() > out->epoch()))
      out = proc.seat->leading();
  return out;
}

void mesh::broker_tick() {
  int leading = 0;
  for (std::uint32_t b = 0; b < brokers_.size(); ++b) {
    if (!brokers_[b].up || brokers_[b].paused) continue;
    brokers_[b].seat->tick(now_);
    note_leadership(b);
    if (brokers_[b].lease) pump_lease(b);
    leading += brokers_[b].seat->leading() != nullptr;
  }
  result_.most_leaders_at_once = std::max(result_.most_leaders_at_once, leading);
  if (const int n = healthy_learners(); result_.healthy_learners.empty() || result_.healthy_learners.back().second != n)
    result_.healthy_learners.emplace_back(now_, n);
  at(now_ + cfg_.tick_ns, [this] { broker_tick(); });
}

/// Broker b's process dies; with store_lost its host is gone (a restart starts from an empty store).
void mesh::crash_broker(std::uint32_t b, bool store_lost) {
  broker_process& proc = brokers_[b];
  if (!proc.up) return;
  proc.up = false;
  if (const broker_wire* wire = proc.seat->leading())
    earlier_history_.insert(earlier_history_.end(), wire->core().history().begin(), wire->core().history().end());
  if (store_lost) {
    result_.lost_broker_tapes.emplace_back(b, std::move(proc.store.tape));
    proc.store = sim_broker_store{};
  }
}

/// SIGSTOP for `duration`, then SIGCONT: what arrived meanwhile is handled in order.
void mesh::pause_broker(std::uint32_t b, nanos duration) {
  broker_process& proc = brokers_[b];
  if (!proc.up || proc.paused) return;
  proc.paused = true;
  at(now_ + duration, [this, b, inc = proc.port->inc] {
    broker_process& proc = brokers_[b];
    if (!proc.up || proc.port->inc != inc || !proc.paused) return;
    proc.paused = false;
    std::vector<std::function<void()>> held = std::move(proc.held);
    proc.held.clear();
    for (auto& handle : held) handle();
  });
}

bool mesh::lease_reachable(std::uint32_t b) const {
  for (const lease_outage_fault& f : cfg_.lease_outages)
    if (now_ >= f.from_ns && now_ < f.to_ns && (f.broker < 0 || f.broker == static_cast<int>(b))) return false;
  return true;
}

/// Carries broker b's next lease call, as etcd_lease's thread does: to the model
/// of etcd half a round trip away, its answer back after the other half — or, when
/// either way is cut, no answer until the call's bound. An answer reaches only the
/// process that asked, after it resumes if it is stopped.
void mesh::pump_lease(std::uint32_t b) {
  const auto call = brokers_[b].lease->next(now_);
  if (!call) return;
  auto answer = [this, b, inc = brokers_[b].port->inc](const lease_reply& reply) {
    auto give = [this, b, inc, reply] {
      broker_process& proc = brokers_[b];
      if (proc.up && proc.port->inc == inc) proc.lease->answer(reply, now_);
    };
    if (brokers_[b].paused) brokers_[b].held.push_back(give);
    else give();
  };
  const nanos half = cfg_.lease_rtt_ns / 2, bound = lease_settings(setup_, b).retry_ns;
  const lease_reply unanswered = lease_reply::failed("the lease service did not answer");
  if (!lease_reachable(b)) return at(now_ + bound, [answer, unanswered] { answer(unanswered); });
  at(now_ + half, [this, b, c = *call, answer, half, bound, unanswered] {
    const lease_reply reply = lease_service_.handle(c, now_);
    if (!lease_reachable(b)) return at(now_ + bound - half, [answer, unanswered] { answer(unanswered); });
    at(now_ + half, [answer, reply] { answer(reply); });
  });
}

// -- shards -----------------------------------------------------------------------

std::unique_ptr<shard_wire> mesh::make_shard(std::uint32_t s,
                                             std::vector<std::pair<fragment_index, fragment_outer_state>> restored) {
  const std::vector<float> init(setup_.layout.total_floats, 0.f);
  shard_process& proc = shards_[s];
  shard_config sc;
  sc.robust = cfg_.robust;
  sc.outer = cfg_.outer;
  return std::make_unique<shard_wire>(setup_, s, proc.port->inc, *proc.port, log_, proc.store.get(), sc,
                                      init.data(), std::move(restored));
}

/// The snapshot writer: a merged version becomes durable commit_delay_ns later
/// (serial_commits: after the versions before it, each commit_delay_ns) — then
/// the shard's wire layer makes it visible (broadcast, announced) — unless
/// the disk is failing (the write fails; the shard retries a while later) or the
/// process dies first.
void mesh::on_shard_commit(std::uint32_t s, shard_commit c) {
  shard_process& proc = shards_[s];
  result_.versions.push_back({version_event::what::merged, now_, s, c.published.fragment, c.state.version});
  const bool failing = now_ < proc.storage_failing_until;
  auto state = std::make_shared<fragment_outer_state>(std::move(c.state));
  nanos done = now_ + cfg_.commit_delay_ns;
  if (cfg_.serial_commits) proc.writer_free_at = done = std::max(now_, proc.writer_free_at) + cfg_.commit_delay_ns;
  at(done, [this, s, failing, p = c.published.fragment, r = c.published.round,
                                   inc = proc.port->inc, state] {
    shard_process& proc = shards_[s];
    if (proc.port->inc != inc || !proc.up) return;
    if (failing) {
      proc.wire->on_commit_failed(p, state->version);
      at(now_ + commit_retry_ns, [this, s, inc] {
        if (shards_[s].port->inc == inc && shards_[s].up) (void)shards_[s].wire->retry_commits();
      });
      return;
    }
    result_.versions.push_back({version_event::what::committed, now_, s, p, state->version});
    const std::uint64_t version = state->version;
    proc.durable[p.value] = durable_copy(*state);
    proc.wire->on_committed(p, version, r);
    if (proc.wire->visible_version(p) == version) {
      ++result_.published;
      result_.versions.push_back({version_event::what::published, now_, s, p, version});
    }
  });
}

/// A new process for shard s: its fragments restored from their newest durable
/// copies, announced to the broker (shard_wire::start: a Join).
void mesh::restart_shard(std::uint32_t s) {
  shard_process& proc = shards_[s];
  if (proc.up) return;  // restarted already (a second crash while down)
  std::vector<std::pair<fragment_index, fragment_outer_state>> restored;
  for (const auto& [p, state] : proc.durable) {
    restored.emplace_back(fragment_index{p}, state);
    result_.versions.push_back({version_event::what::restored, now_, s, {p}, state.version});
  }
  ++proc.port->inc.value;
  proc.wire = make_shard(s, std::move(restored));
  proc.up = true;
  proc.writer_free_at = 0;  // a new process: its writer has nothing to do
  fresh_transport(shard_node(s));
  ++result_.shard_restarts;
  proc.wire->start();
}

// -- fault drills -------------------------------------------------------------------
//
// The chaos monkey is the real chaos_wire: it walks the plan's timeline and sends
// its ChaosCommands over the sim's links to the nodes, whose wire layers obey them
// as in a process — a link fault or a partition shapes the directed links at both
// ends (a partition is loss 1), a slow-down stretches the learner's steps, a
// storage fault fails its shard's commits — and heals every node at the end. Its
// process faults go to the sim's launcher (sim_processes):
//   crash          the learner dies (its held messages too); restart: a new
//                  incarnation that rejoins (fetch, Join), with a fresh transport.
//   pause          SIGSTOP: nothing runs and nothing is sent, heartbeats included;
//                  deliveries and timers are held and handed over on the resume
//                  (SIGCONT, after the pause's length), same incarnation.
//   shard_crash    the shard's process is down (receives nothing) for at least
//                  restart_ns, then a new wire layer restores each fragment's newest
//                  committed outer state under a higher incarnation and Joins.
//   broker_crash   crash_broker(), then start_broker() with its store at least
//                  restart_ns later (see broker_crash_fault for what either does).
//   broker_host_lost  crash_broker() with its store lost, never restarted: a
//                  standby (sim_config::standbys) takes over.

void mesh::chaos_tick() {
  if (const nanos next = chaos_->tick(now_); next >= 0) at(next, [this] { chaos_tick(); });
}

void mesh::crash_target(const fault_target& t) {
  const int node = node_of({t.kind, t.index});
  crashed_at_[node] = now_;
  if (t.kind == role::learner) crash(t.index);
  else if (t.kind == role::parameter_shard) shards_[t.index].up = false;
  else crash_broker(t.index);
}

/// A crashed process comes back after its fault's length, but never sooner than a restart takes.
void mesh::restart_target(const fault_target& t) {
  const int node = node_of({t.kind, t.index});
  if (t.kind == role::learner) return start_learner(t.index, now_);
  // Later than the chaos monkey's own reapply: the faults in force reach the new process once it runs.
  at(std::max(now_, crashed_at_[node] + cfg_.restart_ns), [this, t] {
    if (t.kind == role::parameter_shard) restart_shard(t.index);
    else start_broker(t.index, true);
    chaos_->reapply(t);
  });
}

void mesh::lose_host_target(const fault_target& t) {
  crashed_at_[node_of({t.kind, t.index})] = now_;
  crash_broker(t.index, true);
  brokers_[t.index].host_lost = true;
}

void mesh::pause_target(const fault_target& t, nanos duration) {
  learner& l = learners_[t.index];
  if (!l.alive || l.paused) return;
  l.paused = true;
  at(now_ + duration, [this, i = t.index, inc = l.inc] {
    if (learners_[i].alive && learners_[i].inc == inc && learners_[i].paused) resume(i);
  });
}

/// The chaos monkey's storage fault on a shard's disk: its commits fail for the order's length.
void mesh::storage_order(std::uint32_t s, const chaos_order& order) {
  const bool failing = order.kind == chaos_order::what::storage_fault && order.duration_ns > 0;
  shards_[s].storage_failing_until = failing ? now_ + order.duration_ns : 0;
}

/// SIGCONT: what arrived meanwhile is handled in order, then stepping goes on.
void mesh::resume(std::uint32_t i) {
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

int mesh::healthy_learners() const {
  // A shard that is down pauses only its own fragments: the rest of the mesh is healthy without it.
  if (std::none_of(shards_.begin(), shards_.end(), [](const shard_process& proc) { return proc.up; })) return 0;
  int n = 0;
  for (int i = 0; i < cfg_.learners; ++i) {
    const learner& l = learners_[static_cast<std::size_t>(i)];
    const broker_wire* lead = leader();
    bool reachable = lead != nullptr;
    for (int peer = cfg_.learners; reachable && peer < nodes(); ++peer) {
      const int b = broker_at_node(peer);
      const bool matters = b >= 0 ? lead == brokers_[static_cast<std::size_t>(b)].seat->leading() : shards_[shard_at(peer)].up;
      if (matters) reachable &= !partitioned(i, peer) && !cut(i, peer) && !cut(peer, i);
    }
    bool joined = l.alive;
    for (std::uint32_t p = 0; joined && p < setup_.fragments(); ++p) joined = l.wire->core().installed({p});
    n += l.alive && !l.paused && joined && reachable;
  }
  return n;
}

int mesh::faults_in_place() const {
  int n = 0;
  for (const broker_process& proc : brokers_) n += (!proc.up && !proc.host_lost) + proc.paused;  // a lost host is never back
  for (const learner& l : learners_) n += !l.alive + l.paused + (l.alive && std::abs(l.wire->slowdown() - 1) > 1e-9);
  for (const auto& [ends, profile] : shaped_) n += !(profile == cfg_.link);
  for (const shard_process& proc : shards_) n += !proc.up + (now_ < proc.storage_failing_until);
  return n;
}

// -- measurement ---------------------------------------------------------------------

std::vector<float> mesh::global_theta() const {
  std::vector<float> theta(setup_.layout.total_floats, 0.f);
  learner_core scatterer(setup_.layout, setup_.plan, {});
  for (std::uint32_t p = 0; p < setup_.fragments(); ++p)
    scatterer.scatter({p}, shards_[shard_of({p})].wire->core().value({p}).data(), theta.data());
  return theta;
}

double mesh::loss(const std::vector<float>& theta) const {
  double sum = 0;
  for (const auto& t : setup_.layout.tensors)
    for (std::size_t k = t.offset; k < t.offset + t.size(); ++k) sum += std::pow(theta[k] - target_[k], 2);
  return sum / static_cast<double>(setup_.layout.param_count);
}

void mesh::sample_loss() {
  result_.loss_curve.emplace_back(now_, loss(global_theta()));
  at(now_ + cfg_.loss_every_ns, [this] { sample_loss(); });
}

void mesh::collect(sim_result& r) const {
  r.final_theta = global_theta();
  r.final_loss = loss(r.final_theta);
  for (const broker_process& proc : brokers_) r.broker_tapes.push_back(proc.store.tape);
  r.lease_campaigns_won = lease_service_.campaigns_won();
  r.history = earlier_history_;  // the brokers before a restart, then the last one
  if (const broker_wire* lead = leader()) {
    r.history.insert(r.history.end(), lead->core().history().begin(), lead->core().history().end());
    r.broker = lead->core().counters();
    r.ledger = lead->ledger().totals();
    r.ledger_by_incarnation = lead->ledger().per_learner();
    r.fragment_ledger = lead->ledger().per_fragment();
    r.participation = lead->participation().mean();
    r.participation_rounds = lead->participation().rounds();
  }
  for (const shard_process& proc : shards_) {
    r.shards.push_back(proc.wire->core().ledger());
    r.fenced_at_shards += proc.wire->broker_messages_fenced();
    r.shard_deferred_rounds += proc.wire->deferred_rounds();
    r.shard_deferred_dropped += proc.wire->deferred_dropped();
  }
  for (std::size_t i = 0; i < learners_.size(); ++i) {
    const learner& l = learners_[i];
    const node_counters counts = l.wire->status().counts;
    r.contributions_sent[i] = l.contributions_before + counts.contributions;
    r.learner_wait_ns += static_cast<nanos>(l.wait_ns_before + counts.wait_ns);
    r.learner_incarnations.push_back(l.inc.value);
    std::vector<std::uint64_t>& held = r.learner_versions.emplace_back();
    for (std::uint32_t p = 0; p < setup_.fragments(); ++p)
      held.push_back(l.alive && l.wire->core().installed({p}) ? l.wire->core().version({p}) : 0);
  }
  for (std::uint32_t p = 0; p < setup_.fragments(); ++p)
    r.shard_versions.push_back(shards_[shard_of({p})].wire->visible_version({p}));
  if (chaos_) {
    r.chaos_record = chaos_->core().record();
    r.faults_injected = chaos_->core().injected();
    r.chaos_healed = chaos_->core().healed(now_) && chaos_log_.healed;
  }
  r.faults_in_place = faults_in_place();
}

}  // namespace

sim_result run_mesh(const sim_config& config) { return mesh(config).run(); }

}  // namespace archipelago::sim
