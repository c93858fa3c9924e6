// Two real processes over tcp loopback: a transport here, and
// archipelago_test_peer in a child process that acknowledges every message.
// The child is killed with SIGKILL and restarted; CURVE admits and refuses.

#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../test_log.hpp"
#include "inbox.hpp"
#include "transport/transport.hpp"

extern char** environ;

using namespace archipelago;
using namespace archipelago::transport;
using namespace std::chrono_literals;
using testing::inbox;

namespace {

const node_address broker{role::sync_broker, 0};
const node_address learner{role::learner, 1};

/// A child process running the test peer; killed (SIGKILL) when destroyed.
class peer_process {
 public:
  explicit peer_process(std::vector<std::string> args) {
    int out[2];
    REQUIRE(pipe(out) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    args.insert(args.begin(), ARCHIPELAGO_TEST_PEER);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, ARCHIPELAGO_TEST_PEER, &actions, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    stdout_ = fdopen(out[0], "r");
    char line[512] = {};
    // The peer prints its endpoint once bound; bounded by the test's ctest timeout.
    if (std::fgets(line, sizeof line, stdout_) != nullptr && std::string(line).starts_with("endpoint ")) {
      endpoint_ = std::string(line + 9);
      endpoint_.pop_back();
    }
  }
  ~peer_process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (stdout_) std::fclose(stdout_);
  }
  const std::string& endpoint() const { return endpoint_; }
  void kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  /// SIGTERM; returns the exit code, or -1 if it did not exit within 5 s.
  int terminate() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 500; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  std::string endpoint_;
};

std::unique_ptr<node_transport> start_broker(inbox& in, const steady_clock_source& clock, curve_config curve = {}) {
  transport_config cfg = testing::fast_config(broker, "tcp://127.0.0.1:0");
  cfg.curve = std::move(curve);
  auto t = node_transport::start(cfg, clock, archipelago::test_logging::test_log(), in.handler(), in.peer_handler());
  REQUIRE(t);
  return std::move(*t);
}

encoded_message ping(node_transport& t) {
  auto b = t.make_envelope();
  b.body().initProgress().setStep(1);
  return b.finish();
}

}  // namespace

TEST_CASE("processes: ack, SIGKILL detected by heartbeats, restart and reconnect, clean SIGTERM") {
  steady_clock_source clock;
  inbox in;
  auto node = start_broker(in, clock);
  auto child = std::make_unique<peer_process>(std::vector<std::string>{
      "--self", "learner/1", "--bind", "tcp://127.0.0.1:0", "--peer", "sync_broker/0=" + node->endpoint()});
  REQUIRE(!child->endpoint().empty());
  const std::string child_endpoint = child->endpoint();
  REQUIRE(node->add_peer(learner, child_endpoint));
  REQUIRE(node->send(learner, ping(*node)));
  REQUIRE(in.wait_for([&] { return !in.messages.empty(); }));
  CHECK(in.messages[0]->envelope->body() == wire::Envelope::Body::ACK);

  child->kill9();
  REQUIRE(in.wait_for([&] {
    for (auto& e : in.events)
      if (e == std::make_pair(learner, false)) return true;
    return false;
  }));

  // Restart on the same endpoint with a new incarnation: reconnect and acks again.
  child = std::make_unique<peer_process>(std::vector<std::string>{
      "--self", "learner/1", "--bind", child_endpoint, "--incarnation", "2", "--peer",
      "sync_broker/0=" + node->endpoint()});
  REQUIRE(child->endpoint() == child_endpoint);
  REQUIRE(in.wait_for([&] { return !in.events.empty() && in.events.back() == std::make_pair(learner, true); }));
  const std::size_t before = in.messages.size();
  REQUIRE(node->send(learner, ping(*node)));
  REQUIRE(in.wait_for([&] { return in.messages.size() > before; }));
  CHECK(in.messages.back()->envelope->header().getIncarnation() == 2);
  CHECK(child->terminate() == 0);
}

TEST_CASE("processes: shaping delays the link to another process") {
  steady_clock_source clock;
  inbox in;
  auto node = start_broker(in, clock);
  peer_process child({"--self", "learner/1", "--bind", "tcp://127.0.0.1:0", "--peer",
                      "sync_broker/0=" + node->endpoint()});
  REQUIRE(node->add_peer(learner, child.endpoint()));
  REQUIRE(node->send(learner, ping(*node)));
  REQUIRE(in.wait_for([&] { return in.messages.size() == 1; }));
  link_profile wan;
  wan.latency_ns = 40'000'000;
  REQUIRE(node->set_link(learner, wan));
  for (int i = 0; i < 5; ++i) {
    const std::size_t before = in.messages.size();
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(node->send(learner, ping(*node)));
    REQUIRE(in.wait_for([&] { return in.messages.size() > before; }));
    const auto rtt = std::chrono::steady_clock::now() - t0;
    CHECK(rtt >= 40ms);
    CHECK(rtt < 400ms);
  }
}

TEST_CASE("processes: CURVE between processes admits the allowed key and refuses a stranger") {
  auto broker_keys = generate_keypair(), child_keys = generate_keypair(), stranger_keys = generate_keypair();
  REQUIRE(broker_keys);
  REQUIRE(child_keys);
  REQUIRE(stranger_keys);
  auto allow = std::make_shared<key_allow_list>();
  REQUIRE(allow->add(child_keys->public_z85, "learner-1"));
  steady_clock_source clock;
  inbox in;
  auto node = start_broker(in, clock, curve_config{true, *broker_keys, allow});
  auto curve_args = [&](const curve_keypair& k, const std::string& self) {
    return std::vector<std::string>{"--self", self, "--bind", "tcp://127.0.0.1:0", "--peer",
                                    "sync_broker/0=" + node->endpoint(), "--curve-secret", k.secret_z85,
                                    "--curve-public", k.public_z85, "--server-key", broker_keys->public_z85,
                                    "--allow", "broker=" + broker_keys->public_z85};
  };
  peer_process good(curve_args(*child_keys, "learner/1"));
  peer_process bad(curve_args(*stranger_keys, "learner/2"));
  REQUIRE(node->add_peer(learner, good.endpoint(), child_keys->public_z85));
  // The child heartbeats the broker; only the allowed one gets through.
  REQUIRE(in.wait_for([&] {
    const auto c = node->counters();
    return c.heartbeats_received >= 2 && c.curve_refused >= 1;
  }));
  REQUIRE(node->send(learner, ping(*node)));
  REQUIRE(in.wait_for([&] { return !in.messages.empty(); }));
  for (const auto& m : in.messages) CHECK(m->envelope->sender() == learner);
}
