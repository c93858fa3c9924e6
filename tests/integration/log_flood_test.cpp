// The log bound at a real node: `archipelago node --role broker` in a child
// process, with JSON logs on its stderr, takes 10,000 malformed messages from a
// raw ZeroMQ socket. Its logger (made in main, handed to its transport) writes
// the first 10 lines of the kind "transport.rejected" and, at the end of the
// interval (here: at exit, the interval being an hour), one summary line with
// the count of the rest: 11 lines for the flood, whatever its size. Between
// the flood and the exit the node still answers on the wire: a message of the
// wrong protocol version gets its Error reply.

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "core/checksum.hpp"
#include "core/prng.hpp"
#include "transport/codec.hpp"
#include "free_port.hpp"

extern char** environ;

using namespace archipelago;
using namespace archipelago::transport;
using namespace std::chrono_literals;
using archipelago::testing::free_port;

namespace {

std::vector<std::uint8_t> wrong_version_heartbeat() {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::Envelope>();
  auto h = root.initHeader();
  h.setProtocolVersion(wire::PROTOCOL_VERSION + 7);
  set_address(h.initSender(), {role::learner, 4});
  root.getBody().initHeartbeat();
  auto flat = capnp::messageToFlatArray(mb);
  std::vector<std::uint8_t> env(reinterpret_cast<const std::uint8_t*>(flat.begin()),
                                reinterpret_cast<const std::uint8_t*>(flat.end()));
  env.resize(env.size() + 8);
  const std::uint64_t sum = checksum64(env.data(), env.size() - 8);
  std::memcpy(env.data() + env.size() - 8, &sum, 8);
  return env;
}

/// The body of GET `path` at 127.0.0.1:`port` (HTTP/1.0: the server closes when done); empty on failure.
std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  const auto body = response.find("\r\n\r\n");
  return body == std::string::npos ? std::string{} : response.substr(body + 4);
}

/// The value of the first sample of `metric` whose labels contain `label` (-1: none).
double sample_of(const std::string& page, const std::string& metric, const std::string& label) {
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(metric + "{", 0) == 0 && line.find(label) != std::string::npos)
      return std::stod(line.substr(line.rfind(' ') + 1));
  return -1;
}

}  // namespace

TEST_CASE("a node process under 10,000 malformed messages: 11 log lines of the kind, and it keeps answering") {
  const std::filesystem::path err = std::filesystem::temp_directory_path() /
                                    ("archipelago_log_flood_" + std::to_string(::getpid()) + ".err");
  const int port = free_port();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  const int metrics_port = free_port();
  std::vector<std::string> args = {ARCHIPELAGO_BINARY, "node", "--role", "broker", "--broker", endpoint,
                                   "--shards", "tcp://127.0.0.1:1,tcp://127.0.0.1:2", "--set", "wire.curve=false",
                                   "--log-format", "json", "--log-burst", "10", "--log-interval-s", "3600",
                                   "--metrics-port", std::to_string(metrics_port)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, ARCHIPELAGO_BINARY, &actions, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&actions);
  struct reaper {
    pid_t& pid;
    ~reaper() {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reap{pid};

  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::routing_id, "learner/4");
  raw.set(zmq::sockopt::rcvtimeo, 500);
  raw.connect(endpoint);  // ZeroMQ dials until the node has bound

  // Up: it answers a message of the wrong protocol version (bounded: 30 s).
  const std::vector<std::uint8_t> probe = wrong_version_heartbeat();
  auto answers = [&] {
    raw.send(zmq::buffer(probe), zmq::send_flags::none);
    zmq::message_t reply;
    return raw.recv(reply).has_value();
  };
  bool up = false;
  for (int i = 0; i < 60 && !up; ++i) up = answers();
  REQUIRE_MESSAGE(up, "the node never answered on " << endpoint);
  for (zmq::message_t stale; raw.recv(stale);) {  // the answers to probes queued before it was up
  }

  const std::uint64_t seed = 10000;
  CAPTURE(seed);
  prng rng(seed);
  constexpr int flood = 10000;
  for (int i = 0; i < flood; ++i) {
    std::vector<std::uint8_t> junk(8 + rng.below(200));
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng.below(256));
    raw.send(zmq::buffer(junk), zmq::send_flags::none);
  }
  // Still serving after the flood: one probe, one answer (read after every junk message).
  raw.set(zmq::sockopt::rcvtimeo, 30000);
  CHECK(answers());
  // The lines the rate limit cut are counted on the node's /metrics.
  const std::string page = http_get(metrics_port, "/metrics");
  INFO("GET /metrics on port " << metrics_port << ": " << page.size() << " bytes");
  CHECK(sample_of(page, "archipelago_log_lines_total", "outcome=\"suppressed\"") >= flood - 10);
  CHECK(sample_of(page, "archipelago_log_lines_total", "outcome=\"written\"") >= 10);

  kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 1000 && waitpid(pid, &status, WNOHANG) != pid; ++i) std::this_thread::sleep_for(10ms);
  const bool exited = WIFEXITED(status) || WIFSIGNALED(status);
  if (exited) pid = -1;
  REQUIRE(exited);

  std::ifstream in(err);
  std::vector<nlohmann::json> rejected;
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    ++lines;
    auto j = nlohmann::json::parse(line, nullptr, false);
    REQUIRE_MESSAGE(!j.is_discarded(), "not a JSON line: " << line);
    if (j.value("kind", "") == "transport.rejected") rejected.push_back(std::move(j));
  }
  std::filesystem::remove(err);
  // burst (10) + one summary: the flood, plus the version probes, all rejected.
  REQUIRE(rejected.size() == 11);
  REQUIRE(rejected.back().contains("suppressed"));
  CHECK(rejected.back()["suppressed"].get<int>() >= flood - 10);
  CHECK(lines < 40);  // the rest: the node's start, its progress lines and its end
  MESSAGE("log lines in all: " << lines << ", of kind transport.rejected: " << rejected.size()
                               << " (the summary counts " << rejected.back()["suppressed"].get<int>() << ")");
}
