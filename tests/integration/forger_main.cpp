// The forged-message battery's attacker (tests/integration/forged_messages_test.py):
// a process holding one valid learner key and nothing else.
//
//   archipelago_test_forger --allow DIR --index I --broker EP[,EP...] --shards EP,EP
//                           --learners EP,EP,... --bind tcp://127.0.0.1:PORT [--set KEY=VALUE]...
//
// It joins the mesh as learner I with a valid Join and a FetchFragment to each shard
// (so the broker and the shards dial it back: the other socket direction), then sends,
// for every body kind of schemas/envelope.capnp, well-formed envelopes with forged
// senders, broker epochs (0, old, current, newer, of a broker not in the mesh, near
// 2^64), incarnations (0, 1, its own, 2^64 − 1), steps, token counts, endpoints and
// fragment numbers: as a client of every node's listening socket, and back on the
// connections the broker and the shards opened to it. Each envelope is built to be
// refused; the reason it must be refused for is the transport's admission rule
// (admit_envelope, computed here as the receiver computes it) or, for one the
// transport admits, the receiving role's. Prints one JSON line: the envelopes sent,
// the body kinds covered per direction, and per node the refusals expected by reason.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include <nlohmann/json.hpp>

#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/mesh_setup.hpp"
#include "transport/codec.hpp"
#include "transport/curve_keys.hpp"
#include "transport/peer_identity.hpp"

using namespace archipelago;
using namespace archipelago::transport;
using B = wire::Envelope::Body;
using namespace std::chrono_literals;

namespace {

constexpr B::Which bodies[] = {B::JOIN,           B::WELCOME,       B::HEARTBEAT, B::LEAVE,         B::PROGRESS,
                               B::ROUND_OPEN,     B::CONTRIBUTION,  B::ROUND_CLOSE, B::FRAGMENT_UPDATE, B::FETCH_FRAGMENT,
                               B::CHAOS_COMMAND,  B::ERROR,         B::ACK,       B::BROKER_STATE,  B::RECONFIGURE};

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

std::vector<frame_view> frames_of(const encoded_message& m) {
  std::vector<frame_view> frames{
      {reinterpret_cast<const std::uint8_t*>(m.envelope.begin()), m.envelope.size() * sizeof(capnp::word)}};
  for (const auto& t : m.tensors) frames.push_back({t.data(), t.size()});
  return frames;
}

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "archipelago_test_forger: %s\n", why.c_str());
  std::exit(2);
}

/// One envelope of the battery, and where it must be refused for what.
struct forgery {
  node_address target;
  bool back = false;  // on the connection the target opened to the forger (its DEALER), not to its ROUTER
  encoded_message message;
  std::string reason;
};

class forger {
 public:
  forger(const mesh_setup& setup, std::uint32_t index) : setup_(setup), self_{role::learner, index} {}

  /// The body `kind` with forged contents, the `variant`-th of a few.
  void fill(envelope_builder& b, B::Which kind, std::uint64_t variant) const {
    const std::uint32_t fragments = static_cast<std::uint32_t>(setup_.fragments());
    const std::uint32_t fragment = variant % 3 == 0 ? 0 : variant % 3 == 1 ? fragments : ~std::uint32_t{0};
    auto body = b.body();
    switch (kind) {
      case B::JOIN: {
        auto j = body.initJoin();
        j.setLayoutFingerprint(setup_.layout.fingerprint());
        j.setConfigHash(mesh_agreement_hash(setup_.cfg));
        j.setEndpoint(variant % 2 ? "x" : "tcp://127.0.0.1:1");
        break;
      }
      case B::WELCOME: {
        auto w = body.initWelcome();
        w.setFragments(fragments + 7);
        w.setScheduleStep(~std::uint64_t{0});
        auto s = w.initSettings(1);
        s[0].setKey("mesh.robust");
        s[0].setValue("false");
        auto shards = w.initShards(1);
        shards[0].setIndex(9);
        shards[0].setEndpoint("x");
        break;
      }
      case B::HEARTBEAT: body.initHeartbeat().setSentAtNs(-1); break;
      case B::LEAVE: body.initLeave().setReason("forged"); break;
      case B::PROGRESS: {
        auto p = body.initProgress();
        p.setStep(variant % 2 ? 1'000'000'000 : ~std::uint64_t{0});
        p.setTokens(~std::uint64_t{0});
        p.setStepTimeNs(1);
        break;
      }
      case B::ROUND_OPEN: {
        auto o = body.initRoundOpen();
        o.setFragment(fragment);
        o.setShard(9);
        o.setShardIncarnation(~std::uint64_t{0});
        break;
      }
      case B::CONTRIBUTION: {
        auto c = body.initContribution();
        c.setFragment(fragment);
        c.setSteps(variant % 2 ? 0 : 1'000'000);
        c.setTokens(~std::uint64_t{0});
        c.setLearner(0);
        c.setLearnerIncarnation(1);
        c.setStep(~std::uint64_t{0});
        c.setVerdict(variant % 2 ? wire::Verdict::REJECTED : wire::Verdict::BUFFERED);
        c.setBrokerEpoch(~std::uint64_t{0});
        break;
      }
      case B::ROUND_CLOSE: {
        auto c = body.initRoundClose();
        c.setFragment(fragment);
        auto m = c.initMembers(1);
        m[0].setLearner(self_.index);
        m[0].setIncarnation(1);
        m[0].setWeight(1e9);
        m[0].setTokens(~std::uint64_t{0});
        m[0].setSteps(1);
        break;
      }
      case B::FRAGMENT_UPDATE: {
        auto u = body.initFragmentUpdate();
        u.setFragment(fragment);
        u.setVersion(~std::uint64_t{0});
        u.setCommitted(true);
        u.setMergedNothing(variant % 2 == 1);
        break;
      }
      case B::FETCH_FRAGMENT: {
        auto f = body.initFetchFragment();
        f.setFragment(fragment);
        f.setReplyEndpoint(variant % 2 ? "tcp://*:1" : "tcp://127.0.0.1:99999");
        break;
      }
      case B::CHAOS_COMMAND: {
        auto c = body.initChaosCommand();
        c.setKind(variant % 2 ? wire::ChaosKind::SLOW_DOWN : wire::ChaosKind::HEAL);
        c.setFactor(1000);
        set_address(c.initTarget(), {role::sync_broker, 0});
        break;
      }
      case B::ERROR: {
        auto e = body.initError();
        e.setCode(variant % 2 ? wire::ErrorCode::MESH_MISMATCH : wire::ErrorCode::FENCED);
        e.setMessage("forged");
        break;
      }
      case B::ACK: body.initAck().setSequence(~std::uint64_t{0}); break;
      case B::BROKER_STATE: {
        auto s = body.initBrokerState();
        s.setRoundsLeased(~std::uint64_t{0});
        s.setTapeFrom(~std::uint64_t{0});
        const capnp::byte junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        s.initLedger(1).set(0, capnp::Data::Reader(junk, sizeof junk));
        break;
      }
      case B::RECONFIGURE: {
        auto r = body.initReconfigure();
        r.setReplyEndpoint("x");
        auto s = r.initSettings(1);
        s[0].setKey("mesh.quorum");
        s[0].setValue("1");
        break;
      }
    }
  }

  /// An envelope claiming `claimed` (incarnation `inc`, epoch `epoch`) with body `kind`.
  encoded_message make(node_address claimed, std::uint64_t inc, std::uint64_t epoch, B::Which kind, std::uint64_t variant,
                       std::uint64_t round = 0) {
    envelope_builder b(claimed, incarnation{inc}, ++sequence_, round, epoch);
    fill(b, kind, variant);
    return b.finish();
  }

  /// What a receiving transport's admission rule says of `m` (empty: admitted).
  std::string verdict(const encoded_message& m, const connection_identity& from) const {
    auto env = decode_envelope(frames_of(m));
    if (!env) die("built an undecodable envelope: " + env.message());
    const mesh_bounds bounds{static_cast<std::uint32_t>(setup_.cfg.mesh.learners),
                             static_cast<std::uint32_t>(setup_.shard_endpoints.size()), setup_.brokers()};
    auto refused = admit_envelope(from, env.value(), bounds, true);
    return refused ? to_string(refused->reason) : "";
  }

  node_address self() const { return self_; }
  std::uint64_t next_sequence() { return ++sequence_; }

 private:
  const mesh_setup& setup_;
  node_address self_;
  std::uint64_t sequence_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string allow, bind = "tcp://127.0.0.1:0";
  std::uint32_t index = 0;
  std::vector<std::string> brokers, shards, learners, sets;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--allow") allow = value;
    else if (flag == "--index") index = static_cast<std::uint32_t>(std::stoul(value));
    else if (flag == "--broker") brokers = split(value);
    else if (flag == "--shards") shards = split(value);
    else if (flag == "--learners") learners = split(value);
    else if (flag == "--bind") bind = value;
    else if (flag == "--set") sets.push_back(value);
    else die("unknown flag " + flag);
  }
  config cfg;
  for (const std::string& s : sets)
    if (auto ok = set_knob_assignment(cfg, s); !ok) die(ok.err().message);
  auto policy = resolve_policy(cfg);
  if (!policy) die(policy.err().message);
  mesh_setup setup = make_mesh_setup(cfg, *policy);
  if (brokers.empty() || shards.size() != static_cast<std::size_t>(policy->shards) ||
      learners.size() != static_cast<std::size_t>(cfg.mesh.learners) || index >= learners.size())
    die("--broker, --shards and --learners must list the mesh's brokers, shards and learners (this one's too)");
  setup.broker_endpoint = brokers[0];
  setup.standby_endpoints.assign(brokers.begin() + 1, brokers.end());
  setup.shard_endpoints = shards;

  const std::string me = "learner-" + std::to_string(index);
  auto keys = load_keypair(allow + "/" + me + ".key");
  if (!keys) die(keys.err().message);
  auto allowed = key_allow_list::load(allow);
  if (!allowed) die(allowed.err().message);
  forger f(setup, index);
  const node_address self = f.self();
  const std::uint64_t inc = static_cast<std::uint64_t>(wall_clock_ns() / 1'000'000);

  zmq::context_t context(1);
  // Its own listening socket, a CURVE server with its learner key: where the broker and
  // the shards dial it back once it joined and fetched.
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::router_mandatory, 1);
  router.set(zmq::sockopt::curve_server, 1);
  router.set(zmq::sockopt::curve_secretkey, keys->secret_z85);
  std::string endpoint = bind;
  if (endpoint.ends_with(":0")) endpoint.replace(endpoint.size() - 1, 1, "*");
  router.bind(endpoint);
  endpoint = router.get(zmq::sockopt::last_endpoint);

  // A client of every node's listening socket, with its key.
  std::map<node_address, zmq::socket_t> clients;
  std::map<node_address, std::string> names;
  for (std::uint32_t b = 0; b < brokers.size(); ++b) names[broker_at(b)] = b == 0 ? "broker" : "broker-" + std::to_string(b);
  for (std::uint32_t s = 0; s < shards.size(); ++s) names[{role::parameter_shard, s}] = "shard-" + std::to_string(s);
  for (std::uint32_t l = 0; l < learners.size(); ++l)
    if (l != index) names[{role::learner, l}] = "learner-" + std::to_string(l);
  auto endpoint_of = [&](node_address n) {
    return n.kind == role::sync_broker ? brokers[n.index] : n.kind == role::parameter_shard ? shards[n.index] : learners[n.index];
  };
  for (const auto& [node, name] : names) {
    const std::string server = allowed->key_named(name);
    if (server.empty()) die("no key named " + name + " in " + allow);
    zmq::socket_t s(context, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndtimeo, 10'000);
    s.set(zmq::sockopt::sndhwm, 100'000);
    s.set(zmq::sockopt::routing_id, routing_id_of(self));
    s.set(zmq::sockopt::curve_serverkey, server);
    s.set(zmq::sockopt::curve_publickey, keys->public_z85);
    s.set(zmq::sockopt::curve_secretkey, keys->secret_z85);
    s.connect(endpoint_of(node));
    clients.emplace(node, std::move(s));
  }
  auto send = [](zmq::socket_t& s, const encoded_message& m, const std::string* to) {
    for (auto until = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < until;
         std::this_thread::sleep_for(5ms)) {
      try {
        if (to) {
          zmq::message_t id(to->data(), to->size());
          if (!s.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) continue;
        }
        zmq::message_t body(m.envelope.begin(), m.envelope.size() * sizeof(capnp::word));
        if (!s.send(body, m.tensors.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore)) continue;
        for (std::size_t t = 0; t < m.tensors.size(); ++t) {
          zmq::message_t tensor(m.tensors[t].data(), m.tensors[t].size());
          (void)s.send(tensor, t + 1 < m.tensors.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
        return true;
      } catch (const zmq::error_t&) {  // router_mandatory: not connected (yet)
      }
    }
    return false;
  };
  // What arrives is read (and dropped), so that nobody's queue to it fills; the
  // broker's header tells the epoch, and the nodes that dialled it are noted.
  std::set<std::string> dialled;
  std::uint64_t epoch = 0;
  std::vector<node_address> dialling = {broker_at(0)};
  for (std::uint32_t s = 0; s < shards.size(); ++s) dialling.push_back({role::parameter_shard, s});
  auto last_heartbeat = std::chrono::steady_clock::now();
  auto drain = [&] {
    // A member's heartbeats to those it fetched from and joined: they keep their connections to it up.
    if (std::chrono::steady_clock::now() - last_heartbeat > 250ms) {
      last_heartbeat = std::chrono::steady_clock::now();
      for (node_address n : dialling) {
        envelope_builder b(self, incarnation{inc}, f.next_sequence(), 0, epoch);
        b.body().initHeartbeat().setSentAtNs(0);
        const encoded_message m = b.finish();
        zmq::message_t body(m.envelope.begin(), m.envelope.size() * sizeof(capnp::word));
        (void)clients.at(n).send(body, zmq::send_flags::dontwait);
      }
    }
    for (;;) {
      zmq::message_t id;
      if (!router.recv(id, zmq::recv_flags::dontwait)) break;
      std::vector<zmq::message_t> frames;
      for (bool more = id.more(); more;) {
        zmq::message_t part;
        (void)router.recv(part, zmq::recv_flags::none);
        more = part.more();
        frames.push_back(std::move(part));
      }
      dialled.insert(std::string(static_cast<const char*>(id.data()), id.size()));
      if (frames.empty()) continue;
      std::vector<frame_view> views;
      for (auto& fr : frames) views.push_back({static_cast<const std::uint8_t*>(fr.data()), fr.size()});
      if (auto env = decode_envelope(views); env && env.value().sender().kind == role::sync_broker)
        epoch = std::max(epoch, env.value().header().getBrokerEpoch());
    }
    for (auto& [node, s] : clients)
      for (zmq::message_t m; s.recv(m, zmq::recv_flags::dontwait);) {
      }
  };

  // A member: its Join (its endpoint: the broker dials it) and a fetch of one fragment per shard.
  {
    envelope_builder b(self, incarnation{inc}, f.next_sequence(), 0, 0);
    auto j = b.body().initJoin();
    j.setLayoutFingerprint(setup.layout.fingerprint());
    j.setLayout(setup.layout.description());
    j.setConfigHash(mesh_agreement_hash(setup.cfg));
    j.setEndpoint(endpoint);
    if (!send(clients.at(broker_at(0)), b.finish(), nullptr)) die("cannot reach the broker");
  }
  for (std::uint32_t s = 0; s < shards.size(); ++s) {
    envelope_builder b(self, incarnation{inc}, f.next_sequence(), 0, 0);
    auto fetch = b.body().initFetchFragment();
    fetch.setFragment(setup.fragments_of(s).front().value);
    fetch.setReplyEndpoint(endpoint);
    if (!send(clients.at({role::parameter_shard, s}), b.finish(), nullptr)) die("cannot reach shard " + std::to_string(s));
  }
  for (auto until = std::chrono::steady_clock::now() + 30s;; std::this_thread::sleep_for(20ms)) {
    drain();
    bool all = epoch != 0;
    for (node_address n : dialling) all = all && dialled.count(routing_id_of(n));
    if (all) break;
    if (std::chrono::steady_clock::now() > until) die("the broker and the shards did not dial back within 30 s");
  }

  // The battery.
  const std::uint64_t epochs[] = {0, epoch >= 256 ? epoch - 256 : 0, epoch, ((epoch >> 8) + 1) << 8,
                                  (epoch & ~std::uint64_t{0xff}) | setup.brokers(), ~std::uint64_t{0} - 0xff};
  constexpr int possible_epochs = 4;  // the first four can exist; the last two cannot
  const std::uint64_t incarnations[] = {0, 1, inc, ~std::uint64_t{0}};
  std::vector<node_address> others;  // every identity but its own
  for (std::uint32_t b = 0; b < setup.brokers(); ++b) others.push_back(broker_at(b));
  for (std::uint32_t sh = 0; sh < shards.size(); ++sh) others.push_back({role::parameter_shard, sh});
  for (std::uint32_t l = 0; l < learners.size(); ++l)
    if (l != index) others.push_back({role::learner, l});
  others.push_back({role::chaos_monkey, 0});
  others.push_back({role::admin, 0});
  std::vector<forgery> battery;
  std::uint64_t turn = 0;
  // `role_reason`: why the receiving role refuses it when the transport admits it.
  auto add = [&](node_address target, bool back, encoded_message m, const std::string& role_reason = "") {
    connection_identity c;
    if (back) {
      c.how = connection_identity::kind::dialled;
      c.peer = self;
    } else {
      c.how = connection_identity::kind::key;
      c.key_name = me;
    }
    std::string reason = f.verdict(m, c);
    if (reason.empty()) reason = role_reason;
    if (reason.empty()) die("a battery envelope no node refuses (a bug of the battery)");
    battery.push_back({target, back, std::move(m), reason});
  };
  auto forged = [&](node_address claimed, std::uint64_t e, B::Which kind) {
    const std::uint64_t t = turn++;
    return f.make(claimed, incarnations[t % 4], e, kind, t);
  };
  std::vector<node_address> targets;
  for (const auto& [node, name] : names) targets.push_back(node);
  for (node_address t : targets) {
    for (B::Which kind : bodies) {
      // Forged senders: every other identity, every body kind, every epoch (impersonation).
      for (node_address claimed : others) add(t, false, forged(claimed, epochs[turn % 6], kind));
      // Its own identity with epochs that cannot exist (bad_epoch; a body a learner may not send: not_permitted).
      for (int e = possible_epochs; e < 6; ++e) add(t, false, forged(self, epochs[e], kind));
    }
    // Its own identity, bodies only a broker, a shard, the chaos monkey or an admin sends, every epoch that can exist.
    for (B::Which kind : {B::WELCOME, B::ROUND_OPEN, B::ROUND_CLOSE, B::FRAGMENT_UPDATE, B::CHAOS_COMMAND, B::BROKER_STATE,
                          B::RECONFIGURE})
      for (int e = 0; e < possible_epochs; ++e) add(t, false, forged(self, epochs[e], kind));
  }
  // Admitted by the transport, refused by the role: its own identity and incarnation, the current epoch.
  // `adjust` changes the body (or adds a tensor) before it is finished.
  auto own = [&](B::Which kind, std::uint64_t variant, const auto& adjust) {
    envelope_builder b(self, incarnation{inc}, f.next_sequence(), 0, epoch);
    f.fill(b, kind, variant);
    adjust(b);
    return b.finish();
  };
  const auto as_is = [](envelope_builder&) {};
  const node_address leader = broker_at(leader_of_epoch(epoch));
  const char* bad_endpoints[] = {"x", "", "tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://*:7000", "ipc:///tmp/a",
                                 "tcp://a;b:1", "inproc://", "tcp://[::1:7000", "udp://1.2.3.4:5"};
  for (const char* bad : bad_endpoints)
    add(leader, false, own(B::JOIN, 0, [&](envelope_builder& b) { b.body().getJoin().setEndpoint(bad); }), "bad_endpoint");
  for (std::uint64_t v = 0; v < 4; ++v) add(leader, false, own(B::CONTRIBUTION, v, as_is), "notice_not_owner");
  for (std::uint64_t v = 0; v < 2; ++v) add(leader, false, own(B::PROGRESS, v, as_is), "progress_exceeds_rate");
  add(leader, false, own(B::ACK, 0, as_is), "wrong_role");
  add(leader, false, own(B::FETCH_FRAGMENT, 0, as_is), "wrong_role");
  for (std::uint32_t sh = 0; sh < shards.size(); ++sh) {
    const node_address shard{role::parameter_shard, sh};
    const std::uint32_t mine = setup.fragments_of(sh).front().value;
    const std::uint32_t not_mine = setup.fragments_of((sh + 1) % shards.size()).front().value;
    for (const char* bad : bad_endpoints)
      add(shard, false, own(B::FETCH_FRAGMENT, 0, [&](envelope_builder& b) {
        b.body().getFetchFragment().setFragment(mine);
        b.body().getFetchFragment().setReplyEndpoint(bad);
      }), "bad_endpoint");
    for (std::uint32_t fragment : {not_mine, static_cast<std::uint32_t>(setup.fragments()), ~std::uint32_t{0}})
      add(shard, false, own(B::FETCH_FRAGMENT, 0, [&](envelope_builder& b) {
        b.body().getFetchFragment().setFragment(fragment);
        b.body().getFetchFragment().setReplyEndpoint(endpoint);
      }), "not_owner");
    for (std::uint32_t fragment : {not_mine, static_cast<std::uint32_t>(setup.fragments()), mine})
      add(shard, false, own(B::CONTRIBUTION, 0, [&](envelope_builder& b) {
        b.body().getContribution().setFragment(fragment);
        b.body().getContribution().setSteps(3);
        const float delta[1] = {0.5f};  // one value: no fragment's size
        if (!b.add_tensor_values("delta", delta, 1, tensor_encoding::fp32)) die("cannot encode a tensor");
      }), "bad_contribution");
    for (B::Which kind : {B::JOIN, B::PROGRESS, B::LEAVE}) add(shard, false, own(kind, 0, as_is), "wrong_role");
  }
  for (node_address t : targets)
    if (t.kind == role::learner) add(t, false, own(B::ERROR, 1, as_is), "command_not_from_leader");
  // Back on the connections the broker and the shards opened to it: only an Error of its own
  // travels there (a refusal's reply), and only with an epoch that can exist.
  for (node_address t : dialling)
    for (B::Which kind : bodies) {
      if (kind != B::ERROR) add(t, true, forged(self, epochs[turn % possible_epochs], kind));  // wrong_direction
      for (node_address claimed : others) add(t, true, forged(claimed, epochs[turn % 6], kind));  // impersonation
      add(t, true, forged(self, epochs[possible_epochs + turn % 2], B::ERROR));                   // bad_epoch
    }

  nlohmann::json expected = nlohmann::json::object();
  std::map<std::string, std::set<std::string>> kinds;  // direction → body kinds
  std::size_t sent = 0;
  for (const forgery& x : battery) {
    const std::string id = routing_id_of(x.target);
    const bool ok = x.back ? send(router, x.message, &id) : send(clients.at(x.target), x.message, nullptr);
    if (!ok) die("could not send to " + x.target.to_string());
    ++sent;
    nlohmann::json& at = expected[x.target.to_string()][x.reason];
    at = at.is_null() ? 1 : at.get<int>() + 1;
    kinds[x.back ? "back" : "in"].insert(body_name(decode_envelope(frames_of(x.message)).value().body()));
    if (sent % 20 == 0) {
      drain();
      std::this_thread::sleep_for(2ms);
    }
  }
  drain();
  nlohmann::json out = {{"sent", sent}, {"expected", expected}, {"endpoint", endpoint}, {"epoch", epoch},
                        {"incarnation", inc}};
  for (const auto& [direction, set] : kinds) out["kinds"][direction] = std::vector<std::string>(set.begin(), set.end());
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  // Stays a member that reads what it is sent until told to stop (stdin closes); then leaves.
  std::atomic<bool> stop{false};
  std::thread([&] {
    char c;
    while (std::fread(&c, 1, 1, stdin) == 1) {
    }
    stop = true;
  }).detach();
  while (!stop) {
    drain();
    std::this_thread::sleep_for(20ms);
  }
  envelope_builder b(self, incarnation{inc}, f.next_sequence(), 0, epoch);
  b.body().initLeave().setReason("the battery is over");
  (void)send(clients.at(broker_at(leader_of_epoch(epoch))), b.finish(), nullptr);
  std::this_thread::sleep_for(200ms);
  return 0;
}
