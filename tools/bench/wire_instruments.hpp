#pragma once
// The instruments of bench wire: a pair of node transports in one process (A a
// broker, B a learner whose handler can echo), and the raw ZeroMQ baselines
// they are measured against — PUSH/PULL for throughput, DEALER/ROUTER for the
// round trip — with the transport's socket options that matter (HWM both ways,
// linger 0, immediate). Every wait has a deadline: a lost message is an error.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "transport/transport.hpp"

namespace archipelago {

constexpr int wire_pings = 1000;  // round trips per round and side
constexpr std::size_t raw_ping_bytes = 64;
constexpr nanos ping_limit_ns = 2'000'000'000;

inline const node_address wire_node_a{role::sync_broker, 0};
inline const node_address wire_node_b{role::learner, 1};

/// `floats` fp32 values encoded once, to be shared by every message that carries them.
transport::shared_bytes fp32_payload(std::size_t floats);

/// "tcp://127.0.0.1:0" (any free port) or a fresh inproc name per socket.
std::string endpoint_for(const std::string& kind, const std::string& tag);

/// A small Progress envelope (the round trip's ping), and a Contribution carrying `payload`.
transport::encoded_message progress_message(transport::node_transport& t, std::uint64_t round);
transport::encoded_message fragment_message(transport::node_transport& t, std::uint64_t round,
                                            const transport::shared_bytes& payload);

/// Sends a copy of `m`; errc::overloaded means the outbox is full: back off
/// briefly and retry (counted in `retries`) until `deadline`.
status send_retrying(transport::node_transport& t, node_address to, const transport::encoded_message& m,
                     std::uint64_t& retries, const clock_source& clock, nanos deadline);

/// What one transport's handler saw; the bench thread waits on it with a deadline.
struct sink {
  std::mutex mutex;
  std::condition_variable changed;
  std::uint64_t count = 0;
  nanos first_ns = 0, last_ns = 0;
  bool record = false;
  std::vector<std::pair<std::uint64_t, nanos>> arrivals;  // (header round, time) while recording

  void arrived(std::uint64_t round, nanos now);
  void reset(bool record_arrivals);
  /// False if fewer than n messages arrived within limit_ns.
  bool wait_count(std::uint64_t n, nanos limit_ns);
  std::uint64_t seen();
};

/// Transport A (a broker) and B (a learner); B's handler echoes a Progress
/// message back to A while `echo` is set.
struct transport_pair {
  explicit transport_pair(const clock_source& c) : clock(c) {}
  ~transport_pair();
  const clock_source& clock;
  sink at_a, at_b;
  std::atomic<bool> echo{false};
  std::atomic<std::uint64_t> echo_failures{0};
  std::unique_ptr<transport::node_transport> a, b;
};

/// How to start a pair. For inproc both ends must share one context.
struct pair_setup {
  std::shared_ptr<zmq::context_t> context_a, context_b;
  std::string kind = "tcp";
  std::size_t peer_queue = 0;  // at least this many messages may wait for a peer's socket
  bool curve = false;          // tcp only: fresh keypairs, each end allowing the other
  int hwm = 0;                 // socket_hwm; 0 keeps the transport's default
};

/// Starts both transports and makes each the other's peer.
expected<std::unique_ptr<transport_pair>> start_pair(const clock_source& clock, logger& log, const pair_setup& setup);

/// Seconds from the first send at A to the last delivery at B's handler.
expected<double> transport_throughput(transport_pair& p, std::size_t messages, const transport::shared_bytes& payload,
                                      std::uint64_t& retries);

/// Round trips in microseconds: A sends a Progress message, B's handler answers
/// with one, the bench thread wakes on A's delivery.
expected<std::vector<double>> transport_rtt(transport_pair& p, int count, std::uint64_t& retries);

/// Z85 keys from zmq_curve_keypair, for the raw baseline.
struct curve_keys {
  char server_public[41] = {}, server_secret[41] = {}, client_public[41] = {}, client_secret[41] = {};
};

/// Raw ZeroMQ PUSH → PULL, the throughput baseline: the same zero-copy payload,
/// optionally with CURVE (no ZAP handler: any client key).
class raw_pipe {
 public:
  /// The sender's socket lives on `send_context`, the receiver's on `recv_context`
  /// (the same one for inproc).
  raw_pipe(zmq::context_t& send_context, zmq::context_t& recv_context, const std::string& endpoint, int hwm,
           const curve_keys* keys);

  /// Seconds from the first send to the last message received. With `hash` the
  /// receiver computes each message's XXH3-64, as the transport's decoder does.
  expected<double> run(std::size_t messages, const transport::shared_bytes& payload, const clock_source& clock,
                       bool hash = false);

 private:
  zmq::socket_t pull_, push_;
  std::uint64_t hashes_ = 0;  // kept, so the hashing cannot be optimised away
};

/// Raw ZeroMQ DEALER ↔ ROUTER echo, the round-trip baseline; the ROUTER echoes
/// on a thread of its own.
class raw_echo {
 public:
  raw_echo(zmq::context_t& context, const std::string& endpoint, int hwm);
  ~raw_echo();
  raw_echo(const raw_echo&) = delete;
  raw_echo& operator=(const raw_echo&) = delete;

  /// Round-trip times in microseconds, one per ping of raw_ping_bytes.
  expected<std::vector<double>> run(int count, const clock_source& clock);

 private:
  void serve();
  zmq::socket_t router_, dealer_;
  std::atomic<bool> stop_{false};
  std::mutex failure_mutex_;
  std::string failure_;  // why the echo thread stopped early, for the next ping's error
  std::thread server_;
};

}  // namespace archipelago
