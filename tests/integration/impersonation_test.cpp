// Keys bound to identities between real processes: a broker and a
// shard run as `archipelago node` processes with CURVE on, every node with a key
// of its own (keygen's names: broker, shard-0, learner-0, learner-1). An attacker
// process (archipelago_test_peer) holding learner-1's key — a key on the
// allow-list, so its handshake succeeds — claims in its envelopes to be the
// broker (a RoundClose to the shard), the shard (a FragmentUpdate to the broker)
// and learner 0 (a Contribution to the shard). Each is refused and counted as
// archipelago_wire_rejected_total{reason="impersonation"}, and logged naming the
// key and the claim. The same key claiming its own identity is not an
// impersonation; sending a RoundClose as learner/1 is not permitted to its role.

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "transport/curve_keys.hpp"
#include "free_port.hpp"

extern char** environ;

using namespace archipelago;
using namespace archipelago::transport;
using namespace std::chrono_literals;
using archipelago::testing::free_port;

namespace {

/// A child process, its stdout and stderr to files; SIGTERM then SIGKILL when dropped.
struct child {
  pid_t pid = -1;
  child(std::vector<std::string> args, const std::filesystem::path& out) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (out.string() + ".out").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (out.string() + ".err").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
  }
  ~child() { stop(); }
  void stop() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 300 && waitpid(pid, &status, WNOHANG) != pid; ++i) std::this_thread::sleep_for(10ms);
    if (kill(pid, 0) == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    pid = -1;
  }
};

/// GET http://127.0.0.1:port/path; empty if nothing answers.
std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) body.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return body;
}

/// The sum of a counter's samples whose labels contain `label` (e.g. reason="impersonation"); -1: no page.
double metric(int port, const std::string& name, const std::string& label) {
  const std::string page = http_get(port, "/metrics");
  if (page.find("200") == std::string::npos) return -1;
  std::istringstream in(page);
  double sum = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) != 0 || line.find(label) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

template <class F>
bool eventually(F f, std::chrono::milliseconds limit = 20s) {
  for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(50ms))
    if (f()) return true;
  return false;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("processes: a learner's key claiming the broker, a shard or another learner is refused and counted") {
  const auto dir = std::filesystem::temp_directory_path() / ("archipelago_impersonation_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "keys");
  std::map<std::string, curve_keypair> keys;
  for (const char* name : {"broker", "shard-0", "learner-0", "learner-1"}) {
    auto k = generate_keypair();
    REQUIRE(k);
    REQUIRE(save_keypair((dir / "keys").string(), name, *k));
    keys[name] = *k;
  }
  const int broker_port = free_port(), shard_port = free_port(), broker_metrics = free_port(),
            shard_metrics = free_port();
  const std::string broker_ep = "tcp://127.0.0.1:" + std::to_string(broker_port);
  const std::string shard_ep = "tcp://127.0.0.1:" + std::to_string(shard_port);
  auto node = [&](std::vector<std::string> role_args, const std::string& key, int metrics_port) {
    std::vector<std::string> a = {ARCHIPELAGO_BINARY, "node"};
    a.insert(a.end(), role_args.begin(), role_args.end());
    a.insert(a.end(), {"--broker", broker_ep, "--shards", shard_ep, "--set", "mesh.shards=1", "--set",
                       "mesh.learners=2", "--set", "wire.key_file=" + (dir / "keys" / (key + ".key")).string(),
                       "--set", "wire.allow=" + (dir / "keys").string(), "--metrics-port",
                       std::to_string(metrics_port), "--log-burst", "1000"});
    return a;
  };
  child broker(node({"--role", "broker"}, "broker", broker_metrics), dir / "broker");
  child shard(node({"--role", "shard", "--index", "0"}, "shard-0", shard_metrics), dir / "shard");
  REQUIRE_MESSAGE(eventually([&] { return metric(shard_metrics, "archipelago_wire_rejected_total", "reason=") >= 0 &&
                                          metric(broker_metrics, "archipelago_wire_rejected_total", "reason=") >= 0; }),
                  "the broker and the shard never served /metrics: " << slurp(dir / "broker.err") << slurp(dir / "shard.err"));

  // The attacker: learner-1's own key (allowed), claiming whatever it likes.
  const curve_keypair& mine = keys["learner-1"];
  auto attacker = [&](const std::string& peer, const std::string& endpoint, const std::string& server,
                      const std::string& body, const std::string& claim, const std::string& tag) {
    std::vector<std::string> a = {ARCHIPELAGO_TEST_PEER, "--self", "learner/1", "--bind", "tcp://127.0.0.1:0",
                                  "--peer", peer + "=" + endpoint, "--curve-secret", mine.secret_z85,
                                  "--curve-public", mine.public_z85, "--server-key", keys[server].public_z85,
                                  "--allow", server + "=" + keys[server].public_z85, "--send", body};
    if (!claim.empty()) a.insert(a.end(), {"--claim", claim});
    return std::make_unique<child>(a, dir / tag);
  };
  const std::string impersonation = "reason=\"impersonation\"";
  auto refused_while = [&](int metrics_port, const std::string& reason, std::unique_ptr<child> running) {
    const double before = metric(metrics_port, "archipelago_wire_rejected_total", reason);
    const bool grew = eventually([&] { return metric(metrics_port, "archipelago_wire_rejected_total", reason) >= before + 3; });
    running->stop();
    return grew;
  };

  // 1. As the broker: a RoundClose to the shard (a round it never saw, weight 1e9).
  CHECK(refused_while(shard_metrics, impersonation,
                      attacker("parameter_shard/0", shard_ep, "shard-0", "round_close", "sync_broker/0", "as_broker")));
  // 2. As the shard: a committed FragmentUpdate to the broker.
  CHECK(refused_while(broker_metrics, impersonation,
                      attacker("sync_broker/0", broker_ep, "broker", "fragment_update", "parameter_shard/0", "as_shard")));
  // 3. As learner 0: a Contribution for another index.
  CHECK(refused_while(shard_metrics, impersonation,
                      attacker("parameter_shard/0", shard_ep, "shard-0", "contribution", "learner/0", "as_learner0")));
  // 4. As itself, a body its role may not send: not permitted (not an impersonation).
  const double impersonations = metric(shard_metrics, "archipelago_wire_rejected_total", impersonation);
  CHECK(refused_while(shard_metrics, "reason=\"not_permitted\"",
                      attacker("parameter_shard/0", shard_ep, "shard-0", "round_close", "", "own_round_close")));
  CHECK(metric(shard_metrics, "archipelago_wire_rejected_total", impersonation) == impersonations);

  // Nothing the attacker sent was taken: the shard published no version.
  CHECK(metric(shard_metrics, "archipelago_shard_published_total", "role=") == 0);
  shard.stop();
  broker.stop();
  const std::string shard_log = slurp(dir / "shard.err"), broker_log = slurp(dir / "broker.err");
  CHECK(shard_log.find("the key of learner-1 claims to be sync_broker/0") != std::string::npos);
  CHECK(shard_log.find("the key of learner-1 claims to be learner/0") != std::string::npos);
  CHECK(broker_log.find("the key of learner-1 claims to be parameter_shard/0") != std::string::npos);
  CHECK(shard_log.find("learner may not send RoundClose") != std::string::npos);
  std::filesystem::remove_all(dir);
}
