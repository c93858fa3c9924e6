// A transport in a process of its own, for the two-process integration tests.
//
//   archipelago_test_peer --self learner/1 --bind tcp://127.0.0.1:PORT
//                         --peer sync_broker/0=tcp://127.0.0.1:PORT2 [--incarnation N]
//                         [--curve-secret Z85 --curve-public Z85 --server-key Z85 --allow [NAME=]Z85]...
//                         [--send round_close|round_open|fragment_update|contribution|reconfigure [--claim ROLE/I]]
//
// Prints "endpoint <bound endpoint>" once bound; answers every delivered message
// with an Ack of its sequence; exits 0 on SIGTERM. With --send, it also sends
// such a message to the peer every 100 ms, in an envelope whose header claims to
// come from --claim (default: --self): an attacker with its own key.

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "../test_log.hpp"
#include "transport/transport.hpp"

using namespace archipelago;
using namespace archipelago::transport;

namespace {
volatile std::sig_atomic_t stop_flag = 0;
extern "C" void on_term(int) { stop_flag = 1; }

bool parse_address(const std::string& text, node_address& out) {
  const auto slash = text.find('/');
  if (slash == std::string::npos) return false;
  const std::string kind = text.substr(0, slash);
  const role roles[] = {role::learner, role::sync_broker, role::parameter_shard, role::chaos_monkey, role::admin};
  for (role r : roles)
    if (kind == to_string(r)) {
      out = {r, static_cast<std::uint32_t>(std::stoul(text.substr(slash + 1)))};
      return true;
    }
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  transport_config cfg;
  cfg.heartbeat.interval_ns = 50'000'000;
  cfg.backoff.initial_ns = 20'000'000;
  cfg.backoff.max_ns = 200'000'000;
  node_address peer{};
  std::string peer_endpoint, server_key, send_body;
  std::optional<node_address> claim;
  auto allow = std::make_shared<key_allow_list>();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--self" && !parse_address(value, cfg.self)) return 2;
    if (flag == "--bind") cfg.bind_endpoint = value;
    if (flag == "--incarnation") cfg.self_incarnation = incarnation{std::stoull(value)};
    if (flag == "--peer") {
      const auto eq = value.find('=');
      if (eq == std::string::npos || !parse_address(value.substr(0, eq), peer)) return 2;
      peer_endpoint = value.substr(eq + 1);
    }
    if (flag == "--curve-secret") cfg.curve.own.secret_z85 = value, cfg.curve.enabled = true;
    if (flag == "--curve-public") cfg.curve.own.public_z85 = value;
    if (flag == "--server-key") server_key = value;
    if (flag == "--allow") {
      const auto eq = value.find('=');
      if (!(eq == std::string::npos ? allow->add(value) : allow->add(value.substr(eq + 1), value.substr(0, eq)))) return 2;
    }
    if (flag == "--send") send_body = value;
    if (flag == "--claim") {
      node_address a;
      if (!parse_address(value, a)) return 2;
      claim = a;
    }
  }
  cfg.curve.allowed = allow;
  std::signal(SIGTERM, on_term);
  std::signal(SIGINT, on_term);
  steady_clock_source clock;
  std::atomic<node_transport*> ready{nullptr};
  auto t = node_transport::start(cfg, clock, archipelago::test_logging::test_log(), [&](std::shared_ptr<const inbound_message> m) {
    node_transport* self = ready.load();
    if (self == nullptr) return;  // not wired yet
    auto b = self->make_envelope();
    b.body().initAck().setSequence(m->envelope->header().getSequence());
    (void)self->send(m->envelope->sender(), b.finish());
  });
  if (!t) {
    std::fprintf(stderr, "%s\n", t.err().message.c_str());
    return 1;
  }
  ready.store(t->get());
  if (!peer_endpoint.empty() && !(*t)->add_peer(peer, peer_endpoint, server_key)) return 2;
  std::printf("endpoint %s\n", (*t)->endpoint().c_str());
  std::fflush(stdout);
  std::uint64_t sequence = 0;
  for (int tick = 0; !stop_flag; ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (send_body.empty() || tick % 10 != 0) continue;
    envelope_builder b(claim.value_or(cfg.self), cfg.self_incarnation, ++sequence, 1);
    if (send_body == "round_close") {
      auto c = b.body().initRoundClose();
      c.setFragment(0);
      auto m = c.initMembers(1);
      m[0].setLearner(1);
      m[0].setIncarnation(1);
      m[0].setWeight(1e9);
    } else if (send_body == "round_open") {
      b.body().initRoundOpen().setFragment(0);
    } else if (send_body == "fragment_update") {
      auto u = b.body().initFragmentUpdate();
      u.setFragment(0);
      u.setVersion(1000);
      u.setCommitted(true);
    } else if (send_body == "contribution") {
      auto c = b.body().initContribution();
      c.setFragment(0);
      c.setSteps(1);
      c.setTokens(1'000'000);
      const float delta[4] = {1, 2, 3, 4};
      (void)b.add_tensor_values("delta/0", delta, 4, tensor_encoding::fp32);
    } else if (send_body == "reconfigure") {  // K = 1, as `archipelago set K=1` would ask
      auto s = b.body().initReconfigure().initSettings(1);
      s[0].setKey("mesh.quorum");
      s[0].setValue("1");
    } else {
      return 2;
    }
    (void)(*t)->send(peer, b.finish());
  }
  (*t)->stop();
  return 0;
}
