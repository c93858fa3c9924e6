#include "sync_broker/broker_actor.hpp"

#include <ctime>
#include <deque>

#include "storage/snapshot_writer.hpp"
#include "sync_broker/broker_seat.hpp"
#include "sync_broker/etcd_lease.hpp"
#include "transport/actor_bridge.hpp"
#include "transport/peer_identity.hpp"
#include "transport/wire_metrics.hpp"

namespace archipelago {
namespace {

using tick_atom = caf::atom_constant<caf::atom("tick")>;

constexpr nanos report_interval_ns = 250'000'000;

nanos thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<nanos>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// Adds the calling thread's CPU time between construction and destruction to `total`.
struct cpu_meter {
  nanos& total;
  nanos start = thread_cpu_ns();
  ~cpu_meter() { total += thread_cpu_ns() - start; }
};

/// The broker's durable records, through the snapshot writer (the actor never waits for it).
class writer_broker_store final : public broker_store {
 public:
  explicit writer_broker_store(storage::snapshot_writer& writer) : writer_(writer) {}
  status lease_rounds(std::uint64_t rounds_below, incarnation inc) override {
    return writer_.store().put_round_lease({rounds_below, inc.value, wall_clock_ns()});
  }
  void append_tape(storage::tape_record record) override {
    record.committed_ns = wall_clock_ns();
    (void)writer_.submit(std::move(record));
  }
  void write_ledger(std::vector<storage::learner_ledger> ledgers) override { (void)writer_.submit(std::move(ledgers)); }

 private:
  storage::snapshot_writer& writer_;
};

/// What the broker's wire layer sends through when it also listens for operators on an
/// admin endpoint (mesh_setup::admin_endpoint): an admin's answer goes out of the admin
/// transport (the tcp:// link with CURVE it came in on), everything else out of the
/// mesh's. Both share one sequence counter (transport_config::sequence).
class admin_routed_port final : public transport::message_port {
 public:
  admin_routed_port(transport::node_transport& mesh, transport::node_transport& admin) : mesh_(mesh), admin_(admin) {}
  node_address self() const override { return mesh_.self(); }
  const std::string& endpoint() const override { return mesh_.endpoint(); }
  status add_peer(node_address peer, const std::string& endpoint) override {
    return of(peer).add_peer(peer, endpoint);
  }
  transport::envelope_builder make_envelope(std::uint64_t round) override { return mesh_.make_envelope(round); }
  status send(node_address peer, transport::encoded_message&& message) override {
    return of(peer).send(peer, std::move(message));
  }
  status broadcast(const std::vector<node_address>& peers, transport::encoded_message&& message) override {
    return mesh_.broadcast(peers, std::move(message));
  }
  status set_link(node_address peer, const link_profile& profile) override { return mesh_.set_link(peer, profile); }
  const link_profile& default_link() const override { return mesh_.default_link(); }
  std::uint64_t broker_epoch() const override { return mesh_.broker_epoch(); }
  void raise_broker_epoch(std::uint64_t epoch) override {
    mesh_.raise_broker_epoch(epoch);
    admin_.raise_broker_epoch(epoch);
  }

 private:
  transport::message_port& of(node_address peer) { return peer.kind == role::admin ? admin_ : mesh_; }
  transport::node_transport& mesh_;
  transport::node_transport& admin_;
};

/// Where the broker starts, read from its store: rounds after every round the
/// resumed snapshot or the tape has seen; with recovery, its predecessor's
/// round lease and ledger. What cannot be read is said and left out.
broker_start read_start(const broker_actor_args& a) {
  broker_start start;
  std::uint64_t last = 0;
  bool any = false;
  if (a.resume_from)
    for (const auto& e : a.resume_from->entries) {
      last = std::max(last, e.round);
      any = true;
    }
  if (a.writer)
    if (auto tape = a.writer->store().last_tape(); tape && *tape) {
      last = std::max(last, (*tape)->round);
      any = true;
    }
  start.first_round = any ? last + 1 : 0;
  if (!a.recovery || !a.writer) return start;
  storage::snapshot_store& store = a.writer->store();
  // The live changes on the tape, and with standbys its newest records: a leader's
  // copy for the standbys, a standby's rounds held.
  const bool keep_tape = a.setup->brokers() > 1;
  std::deque<storage::tape_record> tape;
  auto read = store.for_each_tape([&](const storage::tape_record& t) {
    if (!t.settings.empty()) start.settings.push_back(t.settings);
    if (keep_tape) {
      tape.push_back(t);
      if (tape.size() > tape_log::capacity) tape.pop_front();
    }
    return true;
  });
  if (!read)
    a.logs->error("broker.tape_read", "archipelago broker: the stored tape is unreadable: the live changes on it are "
                  "not restored%s (%s)", keep_tape ? ", a standby is not sent it" : "", read.err().message.c_str());
  start.tape.assign(std::make_move_iterator(tape.begin()), std::make_move_iterator(tape.end()));
  start.recovery = true;
  if (auto lease = store.read_round_lease(); !lease)
    a.logs->error("broker.lease_read", "archipelago broker: the round lease is unreadable (%s)",
                  lease.err().message.c_str());
  else if (*lease)
    start.rounds_leased = (*lease)->rounds_below;
  if (auto ledgers = store.ledgers(); ledgers)
    start.ledgers = std::move(*ledgers);
  else
    a.logs->error("broker.ledger_read", "archipelago broker: the stored ledger is unreadable, counting from the "
                  "learners' Progress only (%s)", ledgers.err().message.c_str());
  return start;
}

/// The admin endpoint's transport (mesh_setup::admin_endpoint), as `node --role broker`
/// binds its own: the broker's keypair and wire.allow from the configuration
/// (transport_config_from), CURVE required (`run` checks it first). Only a Reconfigure reaches the broker from
/// it; anything else is refused and logged. Null (the actor ended, the reason logged) if it cannot bind.
std::unique_ptr<transport::node_transport> start_admin_wire(caf::scheduled_actor* self,
                                                            const transport::node_transport& mesh,
                                                            const mesh_setup& setup, const broker_actor_args& a) {
  const node_address me = broker_at(a.index);
  logger* logs = a.logs;
  auto settings = transport::transport_config_from(setup.cfg, me, a.inc, setup.admin_endpoint);
  if (settings && !settings->curve.enabled)  // no admin endpoint without the keys that say who is an admin
    settings = make_error(errc::invalid_input, setup.admin_endpoint + " is not a tcp:// endpoint with wire.curve on");
  if (settings) {
    settings->context = a.io;
    settings->sequence = mesh.config().sequence;
    const auto actor = caf::actor_cast<caf::actor>(self);
    auto only_reconfigure = [actor, logs](inbound_ptr m) {
      if (m->envelope->body() == wire::Envelope::Body::RECONFIGURE) {
        caf::anon_send(actor, std::move(m));
        return;
      }
      logs->warn("broker.admin_endpoint", "archipelago broker: refused %s from %s on the admin endpoint: it hears "
               "Reconfigure only", transport::body_name(m->envelope->body()), m->envelope->sender().to_string().c_str());
    };
    auto wire = transport::node_transport::start(*settings, *a.clock, *logs, only_reconfigure);
    if (wire) {
      logs->info("broker.admin_endpoint", "archipelago broker: listening for archipelago set on %s",
               (*wire)->endpoint().c_str());
      return std::move(*wire);
    }
    settings = wire.err();
  }
  logs->error("broker.admin_endpoint", "archipelago broker: admin endpoint: %s", settings.err().message.c_str());
  self->quit(caf::exit_reason::user_shutdown);
  return nullptr;
}

struct broker_state {
  broker_actor_args args;
  std::unique_ptr<transport::node_transport> wire;
  std::unique_ptr<transport::node_transport> admin_wire;  // mesh_setup::admin_endpoint: operators' Reconfigure
  std::unique_ptr<admin_routed_port> admin_port;
  std::unique_ptr<writer_broker_store> store;
  std::unique_ptr<etcd_lease> lease;  // mesh.etcd; declared before the seat, which uses it
  std::unique_ptr<broker_seat> seat;
  nanos cpu_ns = 0;  // the broker actor's own CPU time (its transport's I/O thread not included)
  nanos last_report_ns = 0;
  static inline const char* name = "sync_broker";

  nanos now() const { return args.clock->now(); }
  node_address self_address() const { return broker_at(args.index); }

  void publish(bool final) {
    if (!args.board) return;
    node_status s;
    s.node = self_address();
    s.incarnation = args.inc.value;
    s.counts = seat->counters();  // every term it led, and its step-downs
    s.broker_epoch = seat->election().epoch();
    if (wire) count_wire(s.counts, wire->counters());
    if (auto* leader = seat->leading()) {
      s.report = leader->report(now(), final);
      s.report->broker_cpu_s = static_cast<double>(cpu_ns) * 1e-9;
    }
    args.board->update(s);
  }
};

caf::behavior broker_actor(caf::stateful_actor<broker_state>* self, broker_actor_args args) {
  auto& st = self->state;
  st.args = std::move(args);
  const mesh_setup& setup = *st.args.setup;
  st.wire = start_actor_wire(self, setup.cfg, st.args.io, st.self_address(), st.args.inc,
                             setup.broker_endpoint_of(st.args.index), *st.args.clock, *st.args.logs);
  if (!st.wire) return {};
  if (!setup.admin_endpoint.empty() && st.args.index == 0) {
    st.admin_wire = start_admin_wire(self, *st.wire, setup, st.args);
    if (!st.admin_wire) return {};
    st.admin_port = std::make_unique<admin_routed_port>(*st.wire, *st.admin_wire);
  }
  transport::message_port& port = st.admin_port ? static_cast<transport::message_port&>(*st.admin_port) : *st.wire;
  if (st.args.writer) st.store = std::make_unique<writer_broker_store>(*st.args.writer);
  // A broker begins to lead from its store read back (the queue drained first, so a
  // standby reads every copy it was sent), as a restarted one does.
  auto read_back = [&a = st.args] {
    if (a.writer) (void)a.writer->drain(std::chrono::seconds(5));
    return read_start(a);
  };
  if (!setup.cfg.mesh.etcd.empty()) {
    auto endpoints = parse_etcd_endpoints(setup.cfg.mesh.etcd);
    if (!endpoints) {  // the knob's check ran before: a programmer error
      st.args.logs->error("broker.etcd", "archipelago broker/%u: mesh.etcd: %s", st.args.index,
                          endpoints.err().message.c_str());
      return {};
    }
    // The mesh's keys under its agreement hash: meshes sharing one etcd never meet.
    char prefix[64];
    std::snprintf(prefix, sizeof prefix, "archipelago/%016llx",
                  static_cast<unsigned long long>(mesh_agreement_hash(setup.cfg)));
    st.lease = std::make_unique<etcd_lease>(etcd_lease_config{std::move(*endpoints), prefix, lease_settings(setup, st.args.index)},
                                            *st.args.clock, *st.args.logs);
  }
  st.seat = std::make_unique<broker_seat>(setup, broker_settings(setup), st.args.inc, st.args.index, port,
                                          *st.args.logs,
                                          st.store.get(), read_back, st.now(), st.lease.get());
  self->send(self, tick_atom::value);
  return {
      [self](tick_atom) {
        auto& st = self->state;
        cpu_meter meter{st.cpu_ns};
        const nanos now = st.now();
        st.seat->tick(now);
        if (now - st.last_report_ns >= report_interval_ns) {
          st.last_report_ns = now;
          st.publish(false);
        }
        self->delayed_send(self, std::chrono::milliseconds(2), tick_atom::value);
      },
      [self](peer_atom, std::uint8_t kind, std::uint32_t index, bool alive) {
        self->state.seat->on_peer({static_cast<role>(kind), index}, alive, self->state.now());
      },
      [self](const inbound_ptr& m) {
        auto& st = self->state;
        cpu_meter meter{st.cpu_ns};
        st.seat->on_message(*m->envelope, st.now());
      },
      [self](metrics_atom, const metrics_page& page) {
        const auto& st = self->state;
        const nanos now = st.now();
        const broker_wire* leader = st.seat->leading();
        add_node_metrics(*page, st.self_address(), st.args.inc, leader ? now - leader->started_ns() : 0,
                         st.wire->counters(), st.args.logs);
        if (leader) leader->add_metrics(*page, now);
        const metric_labels l = {{"role", to_string(role::sync_broker)}, {"index", std::to_string(st.args.index)}};
        page->gauge("archipelago_broker_leading", "1 while this broker leads, 0 while it follows (a standby).",
                    leader ? 1.0 : 0.0, l);
        page->gauge("archipelago_broker_epoch", "The newest broker epoch this broker knows (its own while it leads).",
                    static_cast<double>(st.seat->election().epoch()), l);
        return true;
      },
      [self](status_atom) { return self->state.seat->status_json(self->state.now()); },
      [self](report_atom) {
        self->state.publish(true);
        return true;
      },
  };
}

}  // namespace

caf::actor spawn_broker(caf::actor_system& sys, broker_actor_args args) {
  return sys.spawn(broker_actor, std::move(args));
}

}  // namespace archipelago
