// Two real transports in one process, over tcp loopback and inproc: delivery of
// tensors, heartbeats and liveness, reconnect after the peer restarts, shaping
// and duplicate suppression. Every wait is bounded.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "../test_log.hpp"
#include "inbox.hpp"
#include "transport/transport.hpp"

using namespace archipelago;
using namespace archipelago::transport;
using namespace std::chrono_literals;
using testing::fast_config;
using testing::inbox;

namespace {

const node_address broker{role::sync_broker, 0};
const node_address learner{role::learner, 1};

encoded_message contribution(node_transport& t, const std::vector<float>& delta) {
  auto b = t.make_envelope(7);
  auto c = b.body().initContribution();
  c.setFragment(3);
  c.setTokens(4096);
  REQUIRE(b.add_tensor_values("fragment/3", delta.data(), delta.size(), tensor_encoding::fp32));
  return b.finish();
}

/// A transport of `who` on loopback tcp:// with CURVE: its own keys, the allow-list every node shares.
std::unique_ptr<node_transport> curve_node(node_address who, const curve_keypair& keys,
                                           std::shared_ptr<const key_allow_list> allow, const clock_source& clock,
                                           inbox& received) {
  auto cfg = fast_config(who, "tcp://127.0.0.1:0");
  cfg.curve = {true, keys, std::move(allow)};
  auto t = node_transport::start(cfg, clock, archipelago::test_logging::test_log(), received.handler());
  REQUIRE(t);
  return std::move(*t);
}

/// The broker's and the learner's transports, started and told of each other.
std::pair<std::unique_ptr<node_transport>, std::unique_ptr<node_transport>> connected_pair(
    const transport_config& config_a, const transport_config& config_b, const clock_source& clock, inbox& at_a,
    inbox& at_b) {
  auto a = node_transport::start(config_a, clock, archipelago::test_logging::test_log(), at_a.handler(), at_a.peer_handler());
  auto b = node_transport::start(config_b, clock, archipelago::test_logging::test_log(), at_b.handler(), at_b.peer_handler());
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE((*a)->add_peer(learner, (*b)->endpoint()));
  REQUIRE((*b)->add_peer(broker, (*a)->endpoint()));
  return {std::move(*a), std::move(*b)};
}

void exchange(const std::string& endpoint_a, const std::string& endpoint_b) {
  steady_clock_source clock;
  inbox at_a, at_b;
  auto context = make_io_context();  // shared, as by all nodes of one process
  auto config_a = fast_config(broker, endpoint_a), config_b = fast_config(learner, endpoint_b);
  config_a.context = config_b.context = context;
  auto [ta, tb] = connected_pair(config_a, config_b, clock, at_a, at_b);
  auto* a = &ta;
  auto* b = &tb;

  std::vector<float> delta(1 << 20);  // a 4 MiB fragment
  for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = static_cast<float>(i % 1000) * 1e-3f;
  REQUIRE((*b)->send(broker, contribution(**b, delta)));
  REQUIRE(at_a.wait_for([&] { return !at_a.messages.empty(); }));
  const auto& env = *at_a.messages[0]->envelope;
  CHECK(env.sender() == learner);
  CHECK(env.header().getRound() == 7);
  CHECK(env.root().getBody().getContribution().getTokens() == 4096);
  std::vector<float> out(delta.size());
  REQUIRE(env.decode_tensor_values(0, out.data()));
  CHECK(out == delta);

  // Heartbeats flow both ways without being delivered as messages.
  std::this_thread::sleep_for(200ms);
  CHECK((*a)->counters().heartbeats_received >= 2);
  CHECK((*b)->counters().heartbeats_received >= 2);
  CHECK(at_a.messages.size() == 1);
  CHECK((*a)->counters().rejected_total() == 0);
}

/// The transport reported `peer` dead (bounded wait).
bool declared_dead(inbox& at, node_address peer) {
  return at.wait_for([&] {
    for (auto& [addr, alive] : at.events)
      if (addr == peer && !alive) return true;
    return false;
  });
}

/// The transport's latest report on `peer` is: alive (bounded wait).
bool alive_again(inbox& at, node_address peer) {
  return at.wait_for([&] { return !at.events.empty() && at.events.back() == std::make_pair(peer, true); });
}

/// A learner that talks with `a` (heartbeats both ways), then vanishes without a
/// word until `a` declares it dead; returns the endpoint it had.
std::string peer_that_vanishes(node_transport& a, inbox& at_a, const clock_source& clock) {
  inbox at_b;
  auto b = node_transport::start(fast_config(learner, "tcp://127.0.0.1:0"), clock, archipelago::test_logging::test_log(), at_b.handler());
  REQUIRE(b);
  const std::string endpoint = (*b)->endpoint();
  REQUIRE(a.add_peer(learner, endpoint));
  REQUIRE((*b)->add_peer(broker, a.endpoint()));
  std::this_thread::sleep_for(150ms);
  CHECK(a.counters().heartbeats_received >= 1);
  (*b)->stop();
  REQUIRE(declared_dead(at_a, learner));
  return endpoint;
}

}  // namespace

TEST_CASE("transport: a 4 MiB fragment and heartbeats over tcp loopback") {
  exchange("tcp://127.0.0.1:0", "tcp://127.0.0.1:0");
}

TEST_CASE("transport: a host name to listen on binds the address it names (node --listen tcp://hostB:7000)") {
  exchange("tcp://localhost:0", "tcp://127.0.0.1:0");  // ZeroMQ alone refuses it: "No such device"
}

TEST_CASE("transport: the same code path over inproc") {
  exchange("inproc://test-broker", "inproc://test-learner");
}

TEST_CASE("transport: a silent peer is declared dead, and alive again after it restarts") {
  steady_clock_source clock;
  inbox at_a, at_b;
  auto a = node_transport::start(fast_config(broker, "tcp://127.0.0.1:0"), clock, archipelago::test_logging::test_log(), at_a.handler(), at_a.peer_handler());
  REQUIRE(a);
  const std::string b_endpoint = peer_that_vanishes(**a, at_a, clock);

  // The peer comes back on the same endpoint with a new incarnation.
  auto cfg = fast_config(learner, b_endpoint, 2);
  auto b2 = node_transport::start(cfg, clock, archipelago::test_logging::test_log(), at_b.handler());
  REQUIRE(b2);
  REQUIRE((*b2)->add_peer(broker, (*a)->endpoint()));
  REQUIRE(alive_again(at_a, learner));
  CHECK((*a)->counters().peers_died >= 1);
  CHECK((*a)->counters().reconnects >= 1);
}

TEST_CASE("transport: a dead peer that calls before our reconnect timer can be sent to at once") {
  // Regression: the socket to a dead peer is dropped; hearing from the peer again
  // before the reconnect timer fired left no socket, and nothing reached it again.
  steady_clock_source clock;
  inbox at_a;
  auto slow_reconnect = fast_config(broker, "tcp://127.0.0.1:0");
  slow_reconnect.backoff.initial_ns = slow_reconnect.backoff.max_ns = 60'000'000'000;  // a minute
  auto a = node_transport::start(slow_reconnect, clock, archipelago::test_logging::test_log(), at_a.handler(), at_a.peer_handler());
  REQUIRE(a);
  const std::string b_endpoint = peer_that_vanishes(**a, at_a, clock);

  inbox at_b2;
  auto b2 = node_transport::start(fast_config(learner, b_endpoint, 2), clock, archipelago::test_logging::test_log(), at_b2.handler());
  REQUIRE(b2);
  REQUIRE((*b2)->add_peer(broker, (*a)->endpoint()));  // it calls first
  REQUIRE(alive_again(at_a, learner));
  REQUIRE((*a)->send(learner, contribution(**a, std::vector<float>(16, 1.f))));
  REQUIRE(at_b2.wait_for([&] { return !at_b2.messages.empty(); }));
  CHECK(at_b2.messages[0]->envelope->sender() == broker);
}

TEST_CASE("transport: control messages sent just before stop still go out (a learner's last Progress and Leave)") {
  // Regression: stop() jumped the queue and closed every socket with linger 0,
  // dropping what a learner sent on its way out.
  steady_clock_source clock;
  inbox at_a, at_b;
  auto [a, b] = connected_pair(fast_config(broker, "tcp://127.0.0.1:0"), fast_config(learner, "tcp://127.0.0.1:0"),
                               clock, at_a, at_b);
  for (int i = 0; i < 500 && (a->counters().heartbeats_received == 0 || b->counters().heartbeats_received == 0); ++i)
    std::this_thread::sleep_for(10ms);
  REQUIRE(a->counters().heartbeats_received > 0);  // connected both ways
  REQUIRE(b->counters().heartbeats_received > 0);
  constexpr int last_words = 200;
  for (int i = 0; i < last_words; ++i) {
    auto leave = b->make_envelope();
    leave.body().initLeave().setReason("steps done");
    REQUIRE(b->send(broker, leave.finish()));
  }
  const auto stop_started = std::chrono::steady_clock::now();
  b->stop();
  CHECK(std::chrono::steady_clock::now() - stop_started < 5s);  // bounded (stop_drain_ns: 1 s), with room for load
  REQUIRE(at_a.wait_for([&] { return at_a.messages.size() == last_words; }));
}

TEST_CASE("transport: a partition (loss 1 both ways) stops the reconnects' heartbeats too, healed, both are alive") {
  // Regression: a dead peer's reconnect sent its first heartbeat around the link's
  // shaper, so a broker a drill had cut off from everyone still heard its successor's
  // epoch (and stepped down) every reconnect, and the others heard it alive.
  steady_clock_source clock;
  inbox at_a, at_b;
  auto [a, b] = connected_pair(fast_config(broker, "tcp://127.0.0.1:0"), fast_config(learner, "tcp://127.0.0.1:0"),
                               clock, at_a, at_b);
  std::this_thread::sleep_for(150ms);
  link_profile cut = a->default_link();
  cut.loss = 1;
  REQUIRE(a->set_link(learner, cut));
  REQUIRE(b->set_link(broker, cut));
  REQUIRE(declared_dead(at_a, learner));
  REQUIRE(declared_dead(at_b, broker));
  std::this_thread::sleep_for(100ms);  // what was on the wire before the cut has landed
  const auto heard_a = a->counters().heartbeats_received, heard_b = b->counters().heartbeats_received;
  const auto reconnects = a->counters().reconnects;
  std::this_thread::sleep_for(1000ms);  // several reconnects (backoff 20-200 ms)
  CHECK(a->counters().reconnects > reconnects);
  CHECK(a->counters().heartbeats_received == heard_a);
  CHECK(b->counters().heartbeats_received == heard_b);
  {
    std::lock_guard lock(at_a.mutex);
    CHECK(at_a.events.back() == std::make_pair(learner, false));  // never heard alive through the cut
  }
  REQUIRE(a->set_link(learner, a->default_link()));
  REQUIRE(b->set_link(broker, b->default_link()));
  REQUIRE(alive_again(at_a, learner));
  REQUIRE(alive_again(at_b, broker));
}

TEST_CASE("transport: shaping delays a link, duplicates are suppressed, corruption is caught") {
  steady_clock_source clock;
  inbox at_a, at_b;
  auto a = node_transport::start(fast_config(broker, "tcp://127.0.0.1:0"), clock, archipelago::test_logging::test_log(), at_a.handler());
  auto b = node_transport::start(fast_config(learner, "tcp://127.0.0.1:0"), clock, archipelago::test_logging::test_log(), at_b.handler());
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE((*a)->add_peer(learner, (*b)->endpoint()));
  REQUIRE((*b)->add_peer(broker, (*a)->endpoint()));
  std::this_thread::sleep_for(100ms);  // connected

  link_profile slow;
  slow.latency_ns = 120'000'000;
  slow.duplicate = 1.0;
  REQUIRE((*b)->set_link(broker, slow));
  std::vector<float> delta(1000, 0.5f);
  const auto sent_at = std::chrono::steady_clock::now();
  REQUIRE((*b)->send(broker, contribution(**b, delta)));
  REQUIRE(at_a.wait_for([&] { return !at_a.messages.empty(); }));
  const auto delay = std::chrono::steady_clock::now() - sent_at;
  CHECK(delay >= 115ms);
  CHECK(delay < 1000ms);
  std::this_thread::sleep_for(100ms);
  CHECK(at_a.messages.size() == 1);  // the duplicate copy was dropped
  CHECK((*a)->counters().duplicates >= 1);

  link_profile corrupting;
  corrupting.corrupt = 1.0;
  REQUIRE((*b)->set_link(broker, corrupting));
  const auto rejected_before = (*a)->counters().rejected_total();
  for (int i = 0; i < 5; ++i) REQUIRE((*b)->send(broker, contribution(**b, delta)));
  REQUIRE(at_a.wait_for([&] { return (*a)->counters().rejected_total() >= rejected_before + 5; }));
  CHECK(at_a.messages.size() == 1);  // every corrupted message was caught by a checksum
  const auto c = (*a)->counters();
  CHECK(c.rejected[static_cast<int>(reject_reason::envelope_checksum)] +
            c.rejected[static_cast<int>(reject_reason::tensor_checksum)] ==
        c.rejected_total());
}

TEST_CASE("transport: on a 3 Mbit/s link, control messages and heartbeats do not wait behind fragments") {
  // Heartbeats every 250 ms, dead after 1 s of control-lane silence: one 1 MiB
  // fragment takes 2.8 s on this link, so without the control lane the broker
  // would declare the learner dead while its fragments flow.
  steady_clock_source clock;
  inbox at_a, at_b;
  auto config_a = fast_config(broker, "tcp://127.0.0.1:0"), config_b = fast_config(learner, "tcp://127.0.0.1:0");
  for (auto* c : {&config_a, &config_b}) {
    c->heartbeat = {250'000'000, 4};
    c->bulk_piece_bytes = 16 << 10;  // 44 ms at 3 Mbit/s
  }
  auto [ta, tb] = connected_pair(config_a, config_b, clock, at_a, at_b);
  auto* a = &ta;
  auto* b = &tb;
  REQUIRE(at_a.wait_for([&] { return (*a)->counters().heartbeats_received >= 1; }));

  link_profile wan;
  wan.bandwidth_bytes_per_s = 3e6 / 8;
  wan.latency_ns = 10'000'000;
  REQUIRE((*b)->set_link(broker, wan));
  constexpr int fragments = 3;
  const std::vector<float> delta(1 << 18, 0.25f);  // 1 MiB each: 8.4 s for the three
  const auto sent_at = std::chrono::steady_clock::now();
  for (int i = 0; i < fragments; ++i) REQUIRE((*b)->send(broker, contribution(**b, delta)));
  auto leave = (*b)->make_envelope();
  leave.body().initLeave().setReason("control after bulk");
  REQUIRE((*b)->send(broker, leave.finish()));

  // The control message overtakes the fragments queued before it.
  REQUIRE(at_a.wait_for([&] { return !at_a.messages.empty(); }, 3000ms));
  CHECK(at_a.messages[0]->envelope->body() == wire::Envelope::Body::LEAVE);
  CHECK(std::chrono::steady_clock::now() - sent_at < 2000ms);
  // The fragments arrive in order at the link's rate, and nobody was declared dead meanwhile.
  REQUIRE(at_a.wait_for([&] { return at_a.messages.size() == 1 + fragments; }, 30000ms));
  CHECK(std::chrono::steady_clock::now() - sent_at >= 8000ms);
  {
    std::lock_guard<std::mutex> lock(at_a.mutex);
    CHECK(at_a.events.empty());
  }
  {
    std::lock_guard<std::mutex> lock(at_b.mutex);
    CHECK(at_b.events.empty());
  }
  const auto ca = (*a)->counters(), cb = (*b)->counters();
  CHECK(ca.peers_died == 0);
  CHECK(cb.peers_died == 0);
  // The learner's heartbeats crossed the slow link (two 16 KiB pieces ahead of them at most).
  REQUIRE(ca.links.at(learner).rtt_samples >= 10);
  REQUIRE(cb.links.at(broker).rtt_samples >= 10);
  CHECK(ca.links.at(learner).rtt_max_ns < 1'000'000'000);
  CHECK(cb.links.at(broker).rtt_max_ns < 1'000'000'000);
  CHECK(ca.links.at(learner).rtt_max_ns >= 10'000'000);  // the link's latency is in it
}

TEST_CASE("transport: CURVE admits allowed keys and refuses strangers") {
  auto server_keys = generate_keypair(), allowed_keys = generate_keypair(), stranger_keys = generate_keypair();
  REQUIRE(server_keys);
  REQUIRE(allowed_keys);
  REQUIRE(stranger_keys);
  auto allow = std::make_shared<key_allow_list>();
  REQUIRE(allow->add(allowed_keys->public_z85, "learner-1"));
  REQUIRE(allow->add(server_keys->public_z85, "broker"));

  steady_clock_source clock;
  inbox at_server, at_allowed, at_stranger;
  auto server = curve_node(broker, *server_keys, allow, clock, at_server);
  auto allowed = curve_node(learner, *allowed_keys, allow, clock, at_allowed);
  auto stranger = curve_node({role::learner, 9}, *stranger_keys, allow, clock, at_stranger);

  // A peer without a valid server key is refused up front.
  CHECK_FALSE(allowed->add_peer(broker, server->endpoint(), "not-a-key"));
  REQUIRE(allowed->add_peer(broker, server->endpoint(), server_keys->public_z85));
  REQUIRE(stranger->add_peer(broker, server->endpoint(), server_keys->public_z85));
  std::vector<float> delta(64, 0.25f);
  REQUIRE(allowed->send(broker, contribution(*allowed, delta)));
  REQUIRE(stranger->send(broker, contribution(*stranger, delta)));
  REQUIRE(at_server.wait_for([&] { return !at_server.messages.empty(); }));
  std::this_thread::sleep_for(300ms);
  REQUIRE(at_server.messages.size() == 1);
  CHECK(at_server.messages[0]->envelope->sender() == learner);
  const auto c = server->counters();
  CHECK(c.curve_accepted >= 1);
  CHECK(c.curve_refused >= 1);
}

TEST_CASE("transport: CURVE finds a server's key on the allow-list by the peer's name") {
  // The mesh's actors name no keys: node processes take them from wire.allow
  // (deploy/k8s mounts broker.pub, shard-I.pub, learner.pub there).
  auto broker_keys = generate_keypair(), learner_keys = generate_keypair();
  REQUIRE(broker_keys);
  REQUIRE(learner_keys);
  auto allow = std::make_shared<key_allow_list>();
  REQUIRE(allow->add(broker_keys->public_z85, "broker"));
  REQUIRE(allow->add(learner_keys->public_z85, "learner"));  // one keypair for every learner
  CHECK(allow->key_named("broker") == broker_keys->public_z85);
  CHECK(allow->key_named("shard-0").empty());
  CHECK(curve_key_names(learner) == std::vector<std::string>{"learner-1", "learner"});

  steady_clock_source clock;
  inbox at_broker, at_learner;
  auto b = curve_node(broker, *broker_keys, allow, clock, at_broker);
  auto l = curve_node(learner, *learner_keys, allow, clock, at_learner);

  // No key named shard-0 on the list: refused up front, not a silent dead link.
  CHECK_FALSE(l->add_peer({role::parameter_shard, 0}, b->endpoint()));
  REQUIRE(l->add_peer(broker, b->endpoint()));
  REQUIRE(b->add_peer(learner, l->endpoint()));  // learner/1 falls back to "learner"
  std::vector<float> delta(64, 0.5f);
  REQUIRE(l->send(broker, contribution(*l, delta)));
  REQUIRE(b->send(learner, contribution(*b, delta)));
  REQUIRE(at_broker.wait_for([&] { return !at_broker.messages.empty(); }));
  REQUIRE(at_learner.wait_for([&] { return !at_learner.messages.empty(); }));
  CHECK(at_broker.messages[0]->envelope->sender() == learner);
  CHECK(at_learner.messages[0]->envelope->sender() == broker);
}
