// archipelago bench wire: the node transport against raw ZeroMQ measured in the
// same run, on the same context (one I/O thread), endpoint kind and high-water
// mark. This machine class is shared and noisy, so the transport and its
// baseline alternate within each round and the median per-round ratio is
// reported:
//   1. throughput of 4 MiB fp32 fragments (pre-encoded, so the encoder is not
//      measured) vs raw PUSH/PULL carrying the same zero-copy payload, and vs
//      raw PUSH/PULL that also hashes each message as the transport's decoder;
//   2. small-message round trip (a Progress envelope echoed from the handler)
//      vs a raw DEALER/ROUTER echo of 64 bytes;
//   3. the link shaper's accuracy at 100 Mbit/s and 20 ms one way, against the
//      configured link;
//   4. what CURVE costs over tcp: the transport with and without it, and raw
//      ZeroMQ PUSH/PULL with and without it for reference.
// Every wait has a deadline: a lost message fails the bench with a clear error.

#include "cmd_bench_wire.hpp"

#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench_stats.hpp"
#include "cli_common.hpp"
#include "transport/transport.hpp"

namespace archipelago::cli {
namespace {

using transport::encoded_message;
using transport::inbound_message;
using transport::node_transport;
using transport::shared_bytes;
using namespace std::chrono_literals;

struct wire_options {
  bool json = false;
  int rounds = 7;
  int messages = 200;  // 4 MiB fragments per throughput sample
  std::string endpoint = "tcp";
  int hwm = transport::transport_config{}.socket_hwm;  // on every socket, ours and the baselines'
  CLI::App* command = nullptr;  // the `wire` subcommand, to know whether it was parsed
};

wire_options& options() {
  static wire_options o;
  return o;
}

const node_address node_a{role::sync_broker, 0};
const node_address node_b{role::learner, 1};

constexpr std::size_t fragment_floats = std::size_t{1} << 20;  // 4 MiB of fp32
constexpr int warmup_messages = 32;  // also lets the allocator settle on 4 MiB buffers
constexpr int pings = 1000;  // per round and side
constexpr int warmup_pings = 100;
constexpr std::size_t raw_ping_bytes = 64;
constexpr double shaped_rate = 12.5e6;           // 100 Mbit/s, in bytes/s
constexpr nanos shaped_latency_ns = 20'000'000;  // 20 ms one way
constexpr int latency_samples = 25;
constexpr auto latency_spacing = 30ms;             // > the latency: one probe in flight at a time
constexpr std::size_t shaped_floats = std::size_t{1} << 18;  // 1 MiB messages
constexpr double shaped_seconds = 2.5;             // the rate test lasts at least 2 s
constexpr nanos ping_limit_ns = 2'000'000'000;

double seconds_between(nanos from, nanos to) { return to_seconds(to - from); }

/// A bounded wait that accepts any byte count: a floor of 50 MB/s plus 5 s.
nanos limit_for(double bytes) { return 5'000'000'000 + static_cast<nanos>(bytes / 50e6 * 1e9); }

std::atomic<int> endpoint_counter{0};

/// "tcp://127.0.0.1:0" (any free port) or a fresh inproc name per socket.
std::string endpoint_for(const std::string& kind, const std::string& tag) {
  if (kind == "tcp") return "tcp://127.0.0.1:0";
  return "inproc://archipelago-bench-wire-" + std::to_string(::getpid()) + "-" + tag + "-" +
         std::to_string(endpoint_counter++);
}

/// ZeroMQ spells "any free port" as "*".
std::string zmq_bind_spelling(std::string endpoint) {
  if (endpoint.starts_with("tcp://") && endpoint.ends_with(":0")) endpoint.replace(endpoint.size() - 1, 1, "*");
  return endpoint;
}

shared_bytes fp32_payload(std::size_t floats) {
  std::vector<float> values(floats);
  for (std::size_t i = 0; i < floats; ++i) values[i] = static_cast<float>(i % 1000) * 1e-3f;
  auto bytes = encode_tensor(values.data(), floats, tensor_encoding::fp32, default_block_size);
  return std::make_shared<const std::vector<std::uint8_t>>(std::move(*bytes));
}

/// node_transport::send consumes its message even when it refuses it, so each
/// attempt sends a copy: the small envelope is copied, tensor bytes are shared.
encoded_message clone(const encoded_message& m) {
  encoded_message c;
  c.envelope = kj::heapArray<capnp::word>(m.envelope.asPtr());
  c.tensors = m.tensors;
  return c;
}

/// errc::overloaded means the outbox is full: back off briefly and retry (counted).
status send_retrying(node_transport& t, node_address to, const encoded_message& m, std::uint64_t& retries,
                     const clock_source& clock, nanos deadline) {
  for (;;) {
    status s = t.send(to, clone(m));
    if (s || s.err().code != errc::overloaded) return s;
    ++retries;
    if (clock.now() > deadline) return status(make_error(errc::timeout, "transport outbox stayed full: " + s.err().message));
    std::this_thread::sleep_for(50us);
  }
}

encoded_message progress_message(node_transport& t, std::uint64_t round) {
  auto b = t.make_envelope(round);
  auto p = b.body().initProgress();
  p.setStep(round);
  p.setStepTimeNs(123'456'789);
  p.setTokens(4096 * round);
  return b.finish();
}

encoded_message fragment_message(node_transport& t, std::uint64_t round, const shared_bytes& payload) {
  auto b = t.make_envelope(round);
  auto c = b.body().initContribution();
  c.setFragment(3);
  c.setTokens(4096);
  b.add_tensor("fragment/3", tensor_encoding::fp32, payload->size() / sizeof(float), default_block_size, payload);
  return b.finish();
}

/// What one transport's handler saw; the bench thread waits on it with a deadline.
struct sink {
  std::mutex mutex;
  std::condition_variable changed;
  std::uint64_t count = 0;
  nanos first_ns = 0, last_ns = 0;
  bool record = false;
  std::vector<std::pair<std::uint64_t, nanos>> arrivals;  // (header round, time) while recording

  void arrived(std::uint64_t round, nanos now) {
    std::lock_guard<std::mutex> lock(mutex);
    if (count++ == 0) first_ns = now;
    last_ns = now;
    if (record) arrivals.emplace_back(round, now);
    changed.notify_all();
  }
  void reset(bool record_arrivals) {
    std::lock_guard<std::mutex> lock(mutex);
    count = 0;
    first_ns = last_ns = 0;
    record = record_arrivals;
    arrivals.clear();
  }
  /// False if fewer than n messages arrived within limit_ns.
  bool wait_count(std::uint64_t n, nanos limit_ns) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::nanoseconds(limit_ns), [&] { return count >= n; });
  }
  std::uint64_t seen() {
    std::lock_guard<std::mutex> lock(mutex);
    return count;
  }
};

/// Transport A (a broker) and B (a learner); B's handler echoes a Progress
/// message back to A while `echo` is set.
struct transport_pair {
  explicit transport_pair(const clock_source& c) : clock(c) {}
  ~transport_pair() {
    if (a) a->stop();
    if (b) b->stop();
  }
  const clock_source& clock;
  sink at_a, at_b;
  std::atomic<bool> echo{false};
  std::atomic<std::uint64_t> echo_failures{0};
  std::unique_ptr<node_transport> a, b;
};

/// How to start a pair. For inproc both ends must share one context.
struct pair_setup {
  std::shared_ptr<zmq::context_t> context_a, context_b;
  std::string kind = "tcp";
  std::size_t peer_queue = 0;  // at least this many messages may wait for a peer's socket
  bool curve = false;          // tcp only: fresh keypairs, each end allowing the other
  int hwm = 0;                 // socket_hwm; 0 keeps the transport's default
};

expected<std::unique_ptr<transport_pair>> start_pair(const clock_source& clock, const pair_setup& setup) {
  auto p = std::make_unique<transport_pair>(clock);
  transport_pair* raw = p.get();
  transport::curve_keypair keys_a, keys_b;
  auto allowed = std::make_shared<transport::key_allow_list>();
  if (setup.curve) {
    auto ka = transport::generate_keypair(), kb = transport::generate_keypair();
    if (!ka) return ka.err();
    if (!kb) return kb.err();
    keys_a = *ka;
    keys_b = *kb;
    // Both keys on one list: a context has one ZAP handler, whichever end serves it.
    if (auto s = allowed->add(keys_a.public_z85, "bench-a"); !s) return s.err();
    if (auto s = allowed->add(keys_b.public_z85, "bench-b"); !s) return s.err();
  }
  auto configure = [&](node_address self, const std::string& tag, const std::shared_ptr<zmq::context_t>& context,
                       const transport::curve_keypair& keys) {
    transport::transport_config c;
    c.context = context;
    c.self = self;
    c.bind_endpoint = endpoint_for(setup.kind, tag);
    // A fragment waits (shared, not copied) in the peer queue while the socket
    // is at its HWM; the queue drops beyond its capacity, so size it for a sample.
    c.peer_queue_capacity = std::max(c.peer_queue_capacity, setup.peer_queue);
    if (setup.hwm > 0) c.socket_hwm = setup.hwm;
    if (setup.curve) c.curve = {true, keys, allowed};
    return c;
  };
  auto a = node_transport::start(configure(node_a, "a", setup.context_a, keys_a), clock,
                                 [raw](std::shared_ptr<const inbound_message> m) {
                                   raw->at_a.arrived(m->envelope->header().getRound(), raw->clock.now());
                                 });
  if (!a) return a.err();
  p->a = std::move(*a);
  auto b = node_transport::start(configure(node_b, "b", setup.context_b, keys_b), clock,
                                 [raw](std::shared_ptr<const inbound_message> m) {
                                   const nanos now = raw->clock.now();
                                   const std::uint64_t round = m->envelope->header().getRound();
                                   m.reset();  // a consumer is done with the frames here; free them as it would
                                   if (raw->echo.load(std::memory_order_relaxed))
                                     if (!raw->b->send(node_a, progress_message(*raw->b, round))) ++raw->echo_failures;
                                   raw->at_b.arrived(round, now);
                                 });
  if (!b) return b.err();
  p->b = std::move(*b);
  if (auto s = p->a->add_peer(node_b, p->b->endpoint(), keys_b.public_z85); !s) return s.err();
  if (auto s = p->b->add_peer(node_a, p->a->endpoint(), keys_a.public_z85); !s) return s.err();
  return p;
}

/// Z85 keys from zmq_curve_keypair, for the raw baseline.
struct curve_keys {
  char server_public[41] = {}, server_secret[41] = {}, client_public[41] = {}, client_secret[41] = {};
};

/// Raw ZeroMQ PUSH → PULL, the throughput baseline: the transport's socket
/// options that matter (HWM both ways, linger 0, immediate) and the same
/// zero-copy payload, optionally with CURVE (no ZAP handler: any client key).
class raw_pipe {
 public:
  /// The sender's socket lives on `send_context`, the receiver's on `recv_context`
  /// (the same one for inproc).
  raw_pipe(zmq::context_t& send_context, zmq::context_t& recv_context, const std::string& endpoint, int hwm,
           const curve_keys* keys)
      : pull_(recv_context, zmq::socket_type::pull), push_(send_context, zmq::socket_type::push) {
    for (auto* s : {&pull_, &push_}) {
      s->set(zmq::sockopt::linger, 0);
      s->set(zmq::sockopt::sndhwm, hwm);
      s->set(zmq::sockopt::rcvhwm, hwm);
      s->set(zmq::sockopt::sndtimeo, 200);  // short, so every wait checks its deadline
      s->set(zmq::sockopt::rcvtimeo, 200);
    }
    push_.set(zmq::sockopt::immediate, 1);
    if (keys) {
      pull_.set(zmq::sockopt::curve_server, 1);
      pull_.set(zmq::sockopt::curve_secretkey, std::string(keys->server_secret));
      push_.set(zmq::sockopt::curve_serverkey, std::string(keys->server_public));
      push_.set(zmq::sockopt::curve_publickey, std::string(keys->client_public));
      push_.set(zmq::sockopt::curve_secretkey, std::string(keys->client_secret));
    }
    pull_.bind(zmq_bind_spelling(endpoint));
    push_.connect(pull_.get(zmq::sockopt::last_endpoint));
  }

  /// Seconds from the first send to the last message received. With `hash` the
  /// receiver computes each message's XXH3-64, as the transport's decoder does.
  expected<double> run(std::size_t messages, const shared_bytes& payload, const clock_source& clock,
                       bool hash = false) {
    const nanos deadline = clock.now() + limit_for(static_cast<double>(messages * payload->size()));
    std::size_t received = 0;
    nanos end_ns = 0;
    std::string failure;  // a ZeroMQ error on either side; threads must not throw
    std::thread receiver([&] {
      try {
        zmq::message_t m;
        while (received < messages && clock.now() < deadline)
          if (pull_.recv(m)) {
            ++received;
            if (hash) hashes_ ^= XXH3_64bits(m.data(), m.size());
          }
      } catch (const zmq::error_t& e) {
        failure = std::string("receive: ") + e.what();
      }
      end_ns = clock.now();
    });
    auto release = [](void*, void* hint) { delete static_cast<shared_bytes*>(hint); };
    std::size_t sent = 0;
    const nanos start_ns = clock.now();
    try {
      for (; sent < messages; ++sent) {
        zmq::message_t m(const_cast<std::uint8_t*>(payload->data()), payload->size(), release,
                         new shared_bytes(payload));
        bool ok = false;
        while (!(ok = push_.send(m, zmq::send_flags::none).has_value()) && clock.now() < deadline) {
        }
        if (!ok) break;
      }
    } catch (const zmq::error_t& e) {
      receiver.join();
      return make_error(errc::io_error, std::string("raw ZeroMQ PUSH/PULL: send: ") + e.what());
    }
    receiver.join();
    if (!failure.empty()) return make_error(errc::io_error, "raw ZeroMQ PUSH/PULL: " + failure);
    if (received < messages)
      return make_error(errc::timeout, "raw ZeroMQ PUSH/PULL: " + std::to_string(received) + " of " +
                                           std::to_string(messages) + " messages arrived (" + std::to_string(sent) +
                                           " sent) before the deadline");
    return seconds_between(start_ns, end_ns);
  }

 private:
  zmq::socket_t pull_, push_;
  std::uint64_t hashes_ = 0;  // kept, so the hashing cannot be optimised away
};

/// Raw ZeroMQ DEALER ↔ ROUTER echo, the round-trip baseline.
class raw_echo {
 public:
  raw_echo(zmq::context_t& context, const std::string& endpoint, int hwm)
      : router_(context, zmq::socket_type::router), dealer_(context, zmq::socket_type::dealer) {
    for (auto* s : {&router_, &dealer_}) {
      s->set(zmq::sockopt::linger, 0);
      s->set(zmq::sockopt::sndhwm, hwm);
      s->set(zmq::sockopt::rcvhwm, hwm);
    }
    dealer_.set(zmq::sockopt::rcvtimeo, static_cast<int>(ping_limit_ns / 1'000'000));
    dealer_.set(zmq::sockopt::sndtimeo, static_cast<int>(ping_limit_ns / 1'000'000));
    dealer_.set(zmq::sockopt::immediate, 1);
    router_.bind(zmq_bind_spelling(endpoint));
    dealer_.connect(router_.get(zmq::sockopt::last_endpoint));
    server_ = std::thread([this] {
      try {
        zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
        while (!stop_.load()) {
          if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
          zmq::message_t id, payload;
          while (router_.recv(id, zmq::recv_flags::dontwait)) {
            if (!id.more() || !router_.recv(payload, zmq::recv_flags::none)) continue;
            router_.send(id, zmq::send_flags::sndmore);
            router_.send(payload, zmq::send_flags::none);
          }
        }
      } catch (const zmq::error_t& e) {
        // The client's next ping times out and reports it.
        std::fprintf(stderr, "archipelago: raw ZeroMQ echo server stopped: %s\n", e.what());
      }
    });
  }
  ~raw_echo() {
    stop_ = true;
    server_.join();
  }

  /// Round-trip times in microseconds, one per ping.
  expected<std::vector<double>> run(int count, const clock_source& clock) {
    std::vector<double> rtt_us;
    std::vector<std::uint8_t> bytes(raw_ping_bytes, 0x5a);
    for (int i = 0; i < count; ++i) {
      zmq::message_t ping(bytes.data(), bytes.size()), pong;
      const nanos t0 = clock.now();
      if (!dealer_.send(ping, zmq::send_flags::none) || !dealer_.recv(pong))
        return make_error(errc::timeout, "raw ZeroMQ echo: no reply to ping " + std::to_string(i + 1) + " within " +
                                             std::to_string(ping_limit_ns / 1'000'000) + " ms");
      rtt_us.push_back(static_cast<double>(clock.now() - t0) * 1e-3);
    }
    return rtt_us;
  }

 private:
  zmq::socket_t router_, dealer_;
  std::atomic<bool> stop_{false};
  std::thread server_;
};

/// Seconds from the first send at A to the last delivery at B's handler.
expected<double> transport_throughput(transport_pair& p, std::size_t messages, const shared_bytes& payload,
                                      std::uint64_t& retries) {
  // Built up front so the timed part is the transport, not the envelope builder.
  std::vector<encoded_message> batch;
  for (std::size_t i = 0; i < messages; ++i) batch.push_back(fragment_message(*p.a, i + 1, payload));
  p.at_b.reset(false);
  const nanos limit = limit_for(static_cast<double>(messages * payload->size()));
  const nanos start_ns = p.clock.now();
  for (const auto& m : batch)
    if (auto s = send_retrying(*p.a, node_b, m, retries, p.clock, start_ns + limit); !s) return s.err();
  if (!p.at_b.wait_count(messages, limit - (p.clock.now() - start_ns))) {
    const auto c = p.a->counters();
    return make_error(errc::timeout, "transport: " + std::to_string(p.at_b.seen()) + " of " + std::to_string(messages) +
                                         " fragments delivered before the deadline (A sent " +
                                         std::to_string(c.sent_messages) + ", dropped at a full peer queue " +
                                         std::to_string(c.peer_queue_full) + ", lost by its link shaper " +
                                         std::to_string(c.shaped_lost) + ")");
  }
  std::lock_guard<std::mutex> lock(p.at_b.mutex);
  return seconds_between(start_ns, p.at_b.last_ns);
}

/// Round trips in microseconds: A sends a Progress message, B's handler answers
/// with one, the bench thread wakes on A's delivery.
expected<std::vector<double>> transport_rtt(transport_pair& p, int count, std::uint64_t& retries) {
  p.echo = true;
  p.at_a.reset(false);
  std::vector<double> rtt_us;
  for (int i = 0; i < count; ++i) {
    const encoded_message m = progress_message(*p.a, i + 1);
    const nanos t0 = p.clock.now();
    if (auto s = send_retrying(*p.a, node_b, m, retries, p.clock, t0 + ping_limit_ns); !s) return s.err();
    if (!p.at_a.wait_count(i + 1, ping_limit_ns))
      return make_error(errc::timeout, "transport echo: no reply to ping " + std::to_string(i + 1) + " within " +
                                           std::to_string(ping_limit_ns / 1'000'000) + " ms (echo send failures: " +
                                           std::to_string(p.echo_failures.load()) + ")");
    rtt_us.push_back(static_cast<double>(p.clock.now() - t0) * 1e-3);
  }
  p.echo = false;
  return rtt_us;
}

struct shaping_result {
  std::size_t probe_bytes = 0;
  double expected_latency_ms = 0, latency_ms = 0, latency_error_pct = 0;
  double unshaped_latency_ms = 0;  // the same probes on an unshaped link: the transport's own delay
  std::vector<double> latency_samples_ms;
  int rate_messages = 0;
  std::size_t rate_message_bytes = 0;
  double rate_seconds = 0, rate_bytes_per_s = 0, rate_error_pct = 0, end_to_end_bytes_per_s = 0;
};

/// One-way delays in ms of small messages sent one at a time, `latency_spacing`
/// apart: A's send call to B's handler, read on one clock.
expected<std::vector<double>> one_way_delays(transport_pair& p, std::uint64_t& retries, progress_line& progress,
                                             const std::string& label, std::size_t& probe_bytes) {
  p.at_b.reset(true);
  std::vector<nanos> sent_ns(latency_samples);
  for (int i = 0; i < latency_samples; ++i) {
    progress.update("bench wire: " + label + " probe " + std::to_string(i + 1) + "/" + std::to_string(latency_samples));
    const encoded_message m = progress_message(*p.a, i + 1);
    probe_bytes = m.total_bytes();
    sent_ns[i] = p.clock.now();
    if (auto s = send_retrying(*p.a, node_b, m, retries, p.clock, sent_ns[i] + ping_limit_ns); !s) return s.err();
    std::this_thread::sleep_for(latency_spacing);
  }
  if (!p.at_b.wait_count(latency_samples, ping_limit_ns))
    return make_error(errc::timeout, label + ": " + std::to_string(p.at_b.seen()) + " of " +
                                         std::to_string(latency_samples) + " probes arrived");
  std::vector<double> delays_ms;
  std::lock_guard<std::mutex> lock(p.at_b.mutex);
  for (auto [round, at] : p.at_b.arrivals)
    if (round >= 1 && round <= static_cast<std::uint64_t>(latency_samples))
      delays_ms.push_back(static_cast<double>(at - sent_ns[round - 1]) * 1e-6);
  return delays_ms;
}

/// Shapes A → B to 100 Mbit/s and 20 ms; measures the one-way delay of spaced
/// small messages (and, as a reference, the same without shaping) and the
/// delivery rate of 1 MiB messages sent back to back.
expected<shaping_result> measure_shaping(transport_pair& p, std::uint64_t& retries, progress_line& progress) {
  shaping_result r;
  auto unshaped = one_way_delays(p, retries, progress, "unshaped one-way", r.probe_bytes);
  if (!unshaped) return unshaped.err();
  r.unshaped_latency_ms = median(*unshaped);

  link_profile link;
  link.bandwidth_bytes_per_s = shaped_rate;
  link.latency_ns = shaped_latency_ns;
  if (auto s = p.a->set_link(node_b, link); !s) return s.err();
  auto shaped = one_way_delays(p, retries, progress, "shaped one-way", r.probe_bytes);
  if (!shaped) return shaped.err();
  r.latency_samples_ms = std::move(*shaped);
  if (r.latency_samples_ms.empty()) return make_error(errc::internal, "shaped one-way: no probe matched its send time");
  // What the shaper promises: serialisation at the link rate, then the latency.
  r.expected_latency_ms = (static_cast<double>(shaped_latency_ns) + r.probe_bytes / shaped_rate * 1e9) * 1e-6;
  r.latency_ms = median(r.latency_samples_ms);
  r.latency_error_pct = (r.latency_ms / r.expected_latency_ms - 1) * 100;

  progress.update("bench wire: shaping rate, " + std::to_string(shaped_seconds).substr(0, 3) + " s at 100 Mbit/s");
  const shared_bytes payload = fp32_payload(shaped_floats);
  std::vector<encoded_message> batch;
  r.rate_message_bytes = fragment_message(*p.a, 0, payload).total_bytes();
  r.rate_messages = static_cast<int>(std::ceil(shaped_seconds * shaped_rate / r.rate_message_bytes));
  for (int i = 0; i < r.rate_messages; ++i) batch.push_back(fragment_message(*p.a, i + 1, payload));
  p.at_b.reset(false);
  const nanos limit = static_cast<nanos>(2 * shaped_seconds * 1e9) + 5'000'000'000;
  const nanos start_ns = p.clock.now();
  for (const auto& m : batch)
    if (auto s = send_retrying(*p.a, node_b, m, retries, p.clock, start_ns + limit); !s) return s.err();
  if (!p.at_b.wait_count(r.rate_messages, limit))
    return make_error(errc::timeout, "shaping: " + std::to_string(p.at_b.seen()) + " of " +
                                         std::to_string(r.rate_messages) + " 1 MiB messages arrived within " +
                                         format_duration(to_seconds(limit)));
  std::lock_guard<std::mutex> lock(p.at_b.mutex);
  // Steady state: the bytes after the first message over the time between the
  // first and last arrivals, which leaves the latency out.
  r.rate_seconds = seconds_between(p.at_b.first_ns, p.at_b.last_ns);
  r.rate_bytes_per_s = static_cast<double>((r.rate_messages - 1) * r.rate_message_bytes) / r.rate_seconds;
  r.rate_error_pct = (r.rate_bytes_per_s / shaped_rate - 1) * 100;
  r.end_to_end_bytes_per_s = static_cast<double>(r.rate_messages * r.rate_message_bytes) /
                             (seconds_between(start_ns, p.at_b.last_ns) - to_seconds(shaped_latency_ns));
  return r;
}

/// Rounds of (subject, baseline), alternating which goes first so a drift in
/// the machine's load hits both sides alike.
struct paired_rounds {
  std::vector<double> ours, base, ratio;
};

struct curve_result {
  paired_rounds transport, raw;  // ours = with CURVE, base = without
  std::uint64_t accepted = 0, refused = 0;
};

/// Transport throughput with and without CURVE, and raw ZeroMQ PUSH/PULL's, in
/// interleaved rounds. Each end gets its own context, as two node processes
/// would: CURVE encrypts on the sender's I/O thread and decrypts on the
/// receiver's, and one shared I/O thread would do both and overstate the cost.
/// The raw sockets get contexts of their own, without the transports' ZAP handlers.
expected<curve_result> measure_curve(const clock_source& clock, std::size_t messages, int rounds, int hwm,
                                     const shared_bytes& fragment, std::uint64_t& retries, progress_line& progress) {
  if (!transport::curve_available()) return make_error(errc::unsupported, "libzmq was built without CURVE");
  curve_result r;
  auto ctx = [] { return transport::make_io_context(); };
  auto plain = start_pair(clock, {ctx(), ctx(), "tcp", messages, false, hwm});
  if (!plain) return plain.err();
  auto secure = start_pair(clock, {ctx(), ctx(), "tcp", messages, true, hwm});
  if (!secure) return secure.err();
  curve_keys keys;
  if (zmq_curve_keypair(keys.server_public, keys.server_secret) != 0 ||
      zmq_curve_keypair(keys.client_public, keys.client_secret) != 0)
    return make_error(errc::internal, "zmq_curve_keypair failed");
  auto raw_send = ctx(), raw_recv = ctx();
  raw_pipe raw_plain(*raw_send, *raw_recv, "tcp://127.0.0.1:0", hwm, nullptr);
  raw_pipe raw_secure(*raw_send, *raw_recv, "tcp://127.0.0.1:0", hwm, &keys);

  progress.update("bench wire: CURVE warm-up (handshakes)");
  auto with_curve = [](const error& e) { return make_error(e.code, "with CURVE: " + e.message); };
  if (auto s = transport_rtt(**secure, 10, retries); !s) return with_curve(s.err());
  if (auto s = transport_rtt(**plain, 10, retries); !s) return s.err();
  if (auto s = transport_throughput(**secure, warmup_messages, fragment, retries); !s) return with_curve(s.err());
  if (auto s = transport_throughput(**plain, warmup_messages, fragment, retries); !s) return s.err();
  if (auto s = raw_secure.run(warmup_messages, fragment, clock); !s) return with_curve(s.err());
  if (auto s = raw_plain.run(warmup_messages, fragment, clock); !s) return s.err();

  const double bytes = static_cast<double>(messages * fragment->size());
  for (int round = 0; round < rounds; ++round) {
    double gbps[2][2] = {};  // [transport, raw][without, with]
    for (int side = 0; side < 4; ++side) {
      if (stop_requested.load()) return make_error(errc::internal, "interrupted");
      const bool on = (side % 2 == 0) == (round % 2 == 0);
      const bool raw = side >= 2;
      progress.update("bench wire: CURVE round " + std::to_string(round + 1) + "/" + std::to_string(rounds) +
                      (raw ? " (raw ZeroMQ" : " (transport") + (on ? ", with CURVE)" : ", without)"));
      auto s = raw ? (on ? raw_secure : raw_plain).run(messages, fragment, clock)
                   : transport_throughput(on ? **secure : **plain, messages, fragment, retries);
      if (!s) return on ? with_curve(s.err()) : s.err();
      gbps[raw][on] = bytes / *s * 1e-9;
    }
    for (int raw = 0; raw < 2; ++raw) {
      paired_rounds& pr = raw ? r.raw : r.transport;
      pr.ours.push_back(gbps[raw][1]);
      pr.base.push_back(gbps[raw][0]);
      pr.ratio.push_back(gbps[raw][1] / gbps[raw][0]);
    }
  }
  const auto ca = (*secure)->a->counters(), cb = (*secure)->b->counters();
  r.accepted = ca.curve_accepted + cb.curve_accepted;
  r.refused = ca.curve_refused + cb.curve_refused;
  if (r.accepted == 0)
    return make_error(errc::internal, "with CURVE: no handshake was authenticated, so CURVE was not in use");
  return r;
}

int run_wire() {
  const wire_options& o = options();
  install_stop_handlers();
  steady_clock_source clock;
  progress_line progress;
  const std::size_t messages = static_cast<std::size_t>(o.messages);
  const shared_bytes fragment = fp32_payload(fragment_floats);
  const int hwm = o.hwm;
  std::uint64_t retries = 0;
  const double load_before = load_average();
  // The progress line is finished first, so an error starts a line of its own.
  auto fail = [&](const error& e) {
    progress.finish();
    return report(e);
  };
  auto interrupted = [&] { return fail(make_error(errc::internal, "interrupted")); };

  try {
    // One context, as in a node process: for inproc both transports must share
    // it, and the baselines use it too, so all sides get the same I/O thread.
    auto context = transport::make_io_context();
    auto pair = start_pair(clock, {context, context, o.endpoint, messages, false, hwm});
    if (!pair) return fail(pair.err());
    transport_pair& p = **pair;
    raw_pipe pipe(*context, *context, endpoint_for(o.endpoint, "pull"), hwm, nullptr);
    raw_echo echo(*context, endpoint_for(o.endpoint, "router"), hwm);

    // Warm-up: connects every socket and touches every code path once.
    progress.update("bench wire: warming up");
    if (auto s = transport_throughput(p, warmup_messages, fragment, retries); !s) return fail(s.err());
    if (auto s = pipe.run(warmup_messages, fragment, clock); !s) return fail(s.err());
    if (auto s = transport_rtt(p, warmup_pings, retries); !s) return fail(s.err());
    if (auto s = echo.run(warmup_pings, clock); !s) return fail(s.err());

    // 1. Throughput, in GB/s of fragment payload (envelopes not counted),
    // against raw PUSH/PULL and, to tell the transport's overhead from the cost
    // of its integrity check, raw PUSH/PULL that hashes every message on receipt.
    const double sample_bytes = static_cast<double>(messages * fragment->size());
    paired_rounds tput, tput_hashed;
    for (int r = 0; r < o.rounds; ++r) {
      double gbps[3] = {};  // transport, raw, raw + XXH3
      for (int k = 0; k < 3; ++k) {
        if (stop_requested.load()) return interrupted();
        const int side = (k + r) % 3;  // rotate the order round by round
        static const char* const names[] = {" (transport)", " (raw ZeroMQ)", " (raw ZeroMQ + XXH3)"};
        progress.update("bench wire: throughput round " + std::to_string(r + 1) + "/" + std::to_string(o.rounds) +
                        names[side]);
        auto s = side == 0 ? transport_throughput(p, messages, fragment, retries)
                           : pipe.run(messages, fragment, clock, side == 2);
        if (!s) return fail(s.err());
        gbps[side] = sample_bytes / *s * 1e-9;
      }
      tput.ours.push_back(gbps[0]);
      tput.base.push_back(gbps[1]);
      tput.ratio.push_back(gbps[0] / gbps[1]);
      tput_hashed.base.push_back(gbps[2]);
      tput_hashed.ratio.push_back(gbps[0] / gbps[2]);
    }
    const std::uint64_t dropped = p.a->counters().peer_queue_full;
    if (dropped > 0)
      return fail(make_error(errc::internal, "transport dropped " + std::to_string(dropped) + " fragments at a full peer queue"));

    // 2. Small-message round trip, median per round.
    const std::size_t envelope_bytes = progress_message(*p.a, 1).total_bytes();
    paired_rounds rtt;
    for (int r = 0; r < o.rounds; ++r) {
      double ours = 0, base = 0;
      for (int side = 0; side < 2; ++side) {
        if (stop_requested.load()) return interrupted();
        const bool ours_now = (side == 0) == (r % 2 == 0);
        progress.update("bench wire: round trip round " + std::to_string(r + 1) + "/" + std::to_string(o.rounds) +
                        (ours_now ? " (transport)" : " (raw ZeroMQ)"));
        auto s = ours_now ? transport_rtt(p, pings, retries) : echo.run(pings, clock);
        if (!s) return fail(s.err());
        (ours_now ? ours : base) = median(*s);
      }
      rtt.ours.push_back(ours);
      rtt.base.push_back(base);
      rtt.ratio.push_back(ours / base);
    }

    // 3. Shaping accuracy, on a fresh pair so no earlier state is on the link.
    if (stop_requested.load()) return interrupted();
    auto shaped_pair = start_pair(clock, {context, context, o.endpoint, 0, false, hwm});
    if (!shaped_pair) return fail(shaped_pair.err());
    if (auto s = transport_rtt(**shaped_pair, 10, retries); !s) return fail(s.err());  // connected
    auto shaping = measure_shaping(**shaped_pair, retries, progress);
    if (!shaping) return fail(shaping.err());
    shaped_pair->reset();

    // 4. CURVE's cost, on tcp only (inproc skips the ZMTP handshake, so CURVE
    // never applies there). A failure here is reported with the other figures.
    if (stop_requested.load()) return interrupted();
    const std::size_t curve_messages = std::max<std::size_t>(10, messages / 4);
    auto curve = measure_curve(clock, curve_messages, o.rounds, hwm, fragment, retries, progress);
    progress.finish();

    // -- report --------------------------------------------------------------
    const char* kind = o.endpoint == "tcp" ? "tcp loopback" : "inproc";
    const double tput_ratio = median(tput.ratio), rtt_ratio = median(rtt.ratio);
    const double load_after = load_average();
    std::printf("bench wire: %s, %d rounds, one ZeroMQ context (1 I/O thread), HWM %d messages on every socket\n"
                "  machine     load average %.2f before, %.2f after, %u CPUs\n",
                kind, o.rounds, hwm, load_before, load_after, std::thread::hardware_concurrency());
    std::printf("  throughput  %zu x 4 MiB fp32 fragments per sample, first send to last delivery\n", messages);
    std::printf("              transport %.2f GB/s, raw PUSH/PULL %.2f GB/s (medians)\n", median(tput.ours),
                median(tput.base));
    std::printf("              transport / raw = %.3f (per round: %s) [goal >= 0.95: %s]\n", tput_ratio,
                listed(tput.ratio, "%.3f").c_str(), tput_ratio >= 0.95 ? "met" : "NOT met");
    std::printf("              raw PUSH/PULL hashing each message on receipt (XXH3-64, as the transport's decoder) "
                "%.2f GB/s;\n              transport / that = %.3f (per round: %s)\n",
                median(tput_hashed.base), median(tput_hashed.ratio), listed(tput_hashed.ratio, "%.3f").c_str());
    if (o.endpoint == "inproc")
      std::printf("              (raw inproc hands the zero-copy buffer over by pointer and never reads it; the transport\n"
                  "              checks every fragment's XXH3 checksum, so this ratio is checksum speed vs a pointer handoff)\n");
    std::printf("              outbox-full retries: %llu\n", static_cast<unsigned long long>(retries));
    std::printf("  round trip  %d pings per round: Progress envelope (%zu bytes) echoed by B's handler vs raw "
                "DEALER/ROUTER %zu bytes\n",
                pings, envelope_bytes, raw_ping_bytes);
    std::printf("              transport %.1f us, raw %.1f us (medians)\n", median(rtt.ours), median(rtt.base));
    std::printf("              transport / raw = %.2f (per round: %s; lower is better)\n", rtt_ratio,
                listed(rtt.ratio, "%.2f").c_str());
    const shaping_result& sh = *shaping;
    std::printf("  shaping     A -> B at 100 Mbit/s, 20 ms one way [goal: within 5 %%]\n");
    const auto [low, high] = std::minmax_element(sh.latency_samples_ms.begin(), sh.latency_samples_ms.end());
    std::printf("              latency: median %.3f ms (range %.3f-%.3f) over %zu probes of %zu bytes (expected %.3f ms): "
                "%+.2f %%\n",
                sh.latency_ms, *low, *high, sh.latency_samples_ms.size(), sh.probe_bytes, sh.expected_latency_ms,
                sh.latency_error_pct);
    std::printf("              (the same probes unshaped: median %.3f ms one way; shaped - unshaped - expected = %+.3f ms)\n",
                sh.unshaped_latency_ms, sh.latency_ms - sh.unshaped_latency_ms - sh.expected_latency_ms);
    std::printf("              rate: %.4g MB/s over %.2f s (%d x %zu bytes, between first and last arrival): %+.2f %%"
                " (end to end, latency removed: %.4g MB/s)\n",
                sh.rate_bytes_per_s * 1e-6, sh.rate_seconds, sh.rate_messages, sh.rate_message_bytes,
                sh.rate_error_pct, sh.end_to_end_bytes_per_s * 1e-6);
    double curve_ratio = std::nan(""), raw_curve_ratio = std::nan("");
    if (!curve) {
      std::printf("  CURVE       FAILED: %s\n", curve.err().to_string().c_str());
    } else {
      const curve_result& c = *curve;
      curve_ratio = median(c.transport.ratio);
      raw_curve_ratio = median(c.raw.ratio);
      std::printf("  CURVE       tcp loopback, %zu x 4 MiB per sample, one context per end; %llu handshakes "
                  "authenticated, %llu refused\n",
                  curve_messages, static_cast<unsigned long long>(c.accepted),
                  static_cast<unsigned long long>(c.refused));
      std::printf("              transport with CURVE %.2f GB/s, without %.2f GB/s (medians); with / without = %.3f "
                  "(per round: %s)\n",
                  median(c.transport.ours), median(c.transport.base), curve_ratio,
                  listed(c.transport.ratio, "%.3f").c_str());
      std::printf("              raw PUSH/PULL with CURVE %.2f GB/s, without %.2f GB/s; with / without = %.3f "
                  "(per round: %s)\n",
                  median(c.raw.ours), median(c.raw.base), raw_curve_ratio, listed(c.raw.ratio, "%.3f").c_str());
    }

    if (o.json) {
      json_line j;
      j.add("command", "bench wire")
          .add("endpoint", o.endpoint)
          .add("rounds", o.rounds)
          .add("messages", o.messages)
          .add("fragment_bytes", static_cast<std::uint64_t>(fragment->size()))
          .add("hwm", hwm)
          .add("load_before", load_before)
          .add("load_after", load_after)
          .add("throughput_gbps", median(tput.ours))
          .add("raw_throughput_gbps", median(tput.base))
          .add("throughput_ratio", tput_ratio)
          .add_raw("throughput_ratio_per_round", json_array(tput.ratio))
          .add("raw_hashed_throughput_gbps", median(tput_hashed.base))
          .add("throughput_ratio_vs_hashed", median(tput_hashed.ratio))
          .add_raw("throughput_ratio_vs_hashed_per_round", json_array(tput_hashed.ratio))
          .add("overloaded_retries", retries)
          .add("rtt_us", median(rtt.ours))
          .add("raw_rtt_us", median(rtt.base))
          .add("rtt_ratio", rtt_ratio)
          .add_raw("rtt_ratio_per_round", json_array(rtt.ratio))
          .add("rtt_envelope_bytes", static_cast<std::uint64_t>(envelope_bytes))
          .add("raw_rtt_payload_bytes", static_cast<std::uint64_t>(raw_ping_bytes))
          .add("shaping_latency_ms", sh.latency_ms)
          .add("shaping_latency_expected_ms", sh.expected_latency_ms)
          .add("shaping_latency_error_pct", sh.latency_error_pct)
          .add("unshaped_latency_ms", sh.unshaped_latency_ms)
          .add("shaping_rate_bytes_per_s", sh.rate_bytes_per_s)
          .add("shaping_rate_error_pct", sh.rate_error_pct)
          .add("curve_throughput_gbps", curve ? median(curve->transport.ours) : std::nan(""))
          .add("curve_plain_throughput_gbps", curve ? median(curve->transport.base) : std::nan(""))
          .add("curve_throughput_ratio", curve_ratio)
          .add_raw("curve_ratio_per_round", json_array(curve ? curve->transport.ratio : std::vector<double>{}))
          .add("raw_curve_throughput_ratio", raw_curve_ratio)
          .add_raw("raw_curve_ratio_per_round", json_array(curve ? curve->raw.ratio : std::vector<double>{}))
          .add("curve_messages", static_cast<std::uint64_t>(curve_messages))
          .add("curve_endpoint", "tcp");
      if (!curve) j.add("curve_error", curve.err().to_string());
      std::printf("%s\n", j.str().c_str());
    }
    return curve ? exit_ok : exit_failure;
  } catch (const zmq::error_t& e) {
    return fail(make_error(errc::io_error, std::string("ZeroMQ: ") + e.what()));
  }
}

}  // namespace

void add_bench_wire(CLI::App& bench) {
  wire_options& o = options();
  CLI::App* wire = o.command = bench.add_subcommand("wire", "Transport throughput, round trip, shaping and CURVE vs raw ZeroMQ");
  wire->add_option("--rounds", o.rounds, "Rounds of (transport, baseline) per figure (default 7)")
      ->check(CLI::Range(1, 100));
  // At most 1000: a sample's envelopes are built before it starts, and a
  // heartbeat numbered after them must stay within the receiver's 1024-message
  // duplicate window.
  wire->add_option("--messages", o.messages, "4 MiB fragments per throughput sample (default 200)")
      ->check(CLI::Range(2, 1000));
  wire->add_option("--endpoint", o.endpoint, "tcp (loopback, default) or inproc")
      ->check(CLI::IsMember({"tcp", "inproc"}));
  wire->add_option("--hwm", o.hwm, "ZeroMQ high-water mark, in messages, on every socket (default: the transport's, " +
                                        std::to_string(o.hwm) + ")")
      ->check(CLI::Range(1, 100000));
  wire->add_flag("--json", o.json, "Print a one-line JSON summary last");
}

int run_bench_wire() {
  if (options().command == nullptr || !options().command->parsed()) return exit_bad_input;
  return run_wire();
}

}  // namespace archipelago::cli
