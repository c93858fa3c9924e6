#include "bench/wire_instruments.hpp"

#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>

#include "transport/peer_identity.hpp"
#include "transport/tensor_encoding.hpp"

namespace archipelago {
namespace {

using transport::encoded_message;
using transport::inbound_message;
using transport::node_transport;
using transport::shared_bytes;
using namespace std::chrono_literals;

std::atomic<int> endpoint_counter{0};

double seconds_between(nanos from, nanos to) { return to_seconds(to - from); }

/// A bounded wait that accepts any byte count: a floor of 50 MB/s plus 5 s.
nanos limit_for(double bytes) { return 5'000'000'000 + static_cast<nanos>(bytes / 50e6 * 1e9); }

/// ZeroMQ spells "any free port" as "*".
std::string zmq_bind_spelling(std::string endpoint) {
  if (endpoint.starts_with("tcp://") && endpoint.ends_with(":0")) endpoint.replace(endpoint.size() - 1, 1, "*");
  return endpoint;
}

/// node_transport::send consumes its message even when it refuses it, so each
/// attempt sends a copy: the small envelope is copied, tensor bytes are shared.
encoded_message clone(const encoded_message& m) {
  encoded_message c;
  c.envelope = kj::heapArray<capnp::word>(m.envelope.asPtr());
  c.tensors = m.tensors;
  return c;
}

/// The keys of a CURVE pair: fresh keypairs, both public keys on one list (a
/// context has one ZAP handler, whichever end serves it).
struct pair_keys {
  transport::curve_keypair a, b;
  std::shared_ptr<transport::key_allow_list> allowed = std::make_shared<transport::key_allow_list>();
};

expected<pair_keys> make_pair_keys(bool curve) {
  pair_keys k;
  if (!curve) return k;
  auto ka = transport::generate_keypair(), kb = transport::generate_keypair();
  if (!ka) return ka.err();
  if (!kb) return kb.err();
  k.a = *ka;
  k.b = *kb;
  // Named after the identities the two ends claim (peer_identity.hpp): another name is an impersonation.
  if (auto s = k.allowed->add(k.a.public_z85, transport::key_name_of(wire_node_a)); !s) return s.err();
  if (auto s = k.allowed->add(k.b.public_z85, transport::key_name_of(wire_node_b)); !s) return s.err();
  return k;
}

transport::transport_config pair_config(const pair_setup& setup, node_address self, const std::string& tag,
                                        const std::shared_ptr<zmq::context_t>& context,
                                        const transport::curve_keypair& keys,
                                        const std::shared_ptr<transport::key_allow_list>& allowed) {
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
}

}  // namespace

shared_bytes fp32_payload(std::size_t floats) {
  std::vector<float> values(floats);
  for (std::size_t i = 0; i < floats; ++i) values[i] = static_cast<float>(i % 1000) * 1e-3f;
  auto bytes = encode_tensor(values.data(), floats, tensor_encoding::fp32, default_block_size);
  return shared_bytes(std::move(*bytes));
}

std::string endpoint_for(const std::string& kind, const std::string& tag) {
  if (kind == "tcp") return "tcp://127.0.0.1:0";
  return "inproc://archipelago-bench-wire-" + std::to_string(::getpid()) + "-" + tag + "-" +
         std::to_string(endpoint_counter++);
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
  b.add_tensor("fragment/3", tensor_encoding::fp32, payload.size() / sizeof(float), default_block_size, payload);
  return b.finish();
}

status send_retrying(node_transport& t, node_address to, const encoded_message& m, std::uint64_t& retries,
                     const clock_source& clock, nanos deadline) {
  for (;;) {
    status s = t.send(to, clone(m));
    if (s || s.err().code != errc::overloaded) return s;
    ++retries;
    if (clock.now() > deadline)
      return status(make_error(errc::timeout, "transport outbox stayed full: " + s.err().message));
    std::this_thread::sleep_for(50us);
  }
}

void sink::arrived(std::uint64_t round, nanos now) {
  std::lock_guard<std::mutex> lock(mutex);
  if (count++ == 0) first_ns = now;
  last_ns = now;
  if (record) arrivals.emplace_back(round, now);
  changed.notify_all();
}

void sink::reset(bool record_arrivals) {
  std::lock_guard<std::mutex> lock(mutex);
  count = 0;
  first_ns = last_ns = 0;
  record = record_arrivals;
  arrivals.clear();
}

bool sink::wait_count(std::uint64_t n, nanos limit_ns) {
  std::unique_lock<std::mutex> lock(mutex);
  return changed.wait_for(lock, std::chrono::nanoseconds(limit_ns), [&] { return count >= n; });
}

std::uint64_t sink::seen() {
  std::lock_guard<std::mutex> lock(mutex);
  return count;
}

transport_pair::~transport_pair() {
  if (a) a->stop();
  if (b) b->stop();
}

expected<std::unique_ptr<transport_pair>> start_pair(const clock_source& clock, logger& log, const pair_setup& setup) {
  auto p = std::make_unique<transport_pair>(clock);
  transport_pair* raw = p.get();
  auto keys = make_pair_keys(setup.curve);
  if (!keys) return keys.err();
  auto a = node_transport::start(pair_config(setup, wire_node_a, "a", setup.context_a, keys->a, keys->allowed), clock, log,
                                 [raw](std::shared_ptr<const inbound_message> m) {
                                   raw->at_a.arrived(m->envelope->header().getRound(), raw->clock.now());
                                 });
  if (!a) return a.err();
  p->a = std::move(*a);
  auto b = node_transport::start(pair_config(setup, wire_node_b, "b", setup.context_b, keys->b, keys->allowed), clock, log,
                                 [raw](std::shared_ptr<const inbound_message> m) {
                                   const nanos now = raw->clock.now();
                                   const std::uint64_t round = m->envelope->header().getRound();
                                   m.reset();  // a consumer is done with the frames here; free them as it would
                                   if (raw->echo.load(std::memory_order_relaxed))
                                     if (!raw->b->send(wire_node_a, progress_message(*raw->b, round)))
                                       ++raw->echo_failures;
                                   raw->at_b.arrived(round, now);
                                 });
  if (!b) return b.err();
  p->b = std::move(*b);
  if (auto s = p->a->add_peer(wire_node_b, p->b->endpoint(), keys->b.public_z85); !s) return s.err();
  if (auto s = p->b->add_peer(wire_node_a, p->a->endpoint(), keys->a.public_z85); !s) return s.err();
  return p;
}

expected<double> transport_throughput(transport_pair& p, std::size_t messages, const shared_bytes& payload,
                                      std::uint64_t& retries) {
  // Built up front so the timed part is the transport, not the envelope builder.
  std::vector<encoded_message> batch;
  for (std::size_t i = 0; i < messages; ++i) batch.push_back(fragment_message(*p.a, i + 1, payload));
  p.at_b.reset(false);
  const nanos limit = limit_for(static_cast<double>(messages * payload.size()));
  const nanos start_ns = p.clock.now();
  for (const auto& m : batch)
    if (auto s = send_retrying(*p.a, wire_node_b, m, retries, p.clock, start_ns + limit); !s) return s.err();
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

expected<std::vector<double>> transport_rtt(transport_pair& p, int count, std::uint64_t& retries) {
  p.echo = true;
  p.at_a.reset(false);
  std::vector<double> rtt_us;
  for (int i = 0; i < count; ++i) {
    const encoded_message m = progress_message(*p.a, i + 1);
    const nanos t0 = p.clock.now();
    if (auto s = send_retrying(*p.a, wire_node_b, m, retries, p.clock, t0 + ping_limit_ns); !s) return s.err();
    if (!p.at_a.wait_count(i + 1, ping_limit_ns))
      return make_error(errc::timeout, "transport echo: no reply to ping " + std::to_string(i + 1) + " within " +
                                           std::to_string(ping_limit_ns / 1'000'000) + " ms (echo send failures: " +
                                           std::to_string(p.echo_failures.load()) + ")");
    rtt_us.push_back(static_cast<double>(p.clock.now() - t0) * 1e-3);
  }
  p.echo = false;
  return rtt_us;
}

raw_pipe::raw_pipe(zmq::context_t& send_context, zmq::context_t& recv_context, const std::string& endpoint, int hwm,
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

expected<double> raw_pipe::run(std::size_t messages, const shared_bytes& payload, const clock_source& clock,
                               bool hash) {
  const nanos deadline = clock.now() + limit_for(static_cast<double>(messages * payload.size()));
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
      zmq::message_t m(const_cast<std::uint8_t*>(payload.data()), payload.size(), release, new shared_bytes(payload));
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

raw_echo::raw_echo(zmq::context_t& context, const std::string& endpoint, int hwm)
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
  server_ = std::thread([this] { serve(); });
}

raw_echo::~raw_echo() {
  stop_ = true;
  server_.join();
}

void raw_echo::serve() {
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
    std::lock_guard lock(failure_mutex_);
    failure_ = e.what();
  }
}

expected<std::vector<double>> raw_echo::run(int count, const clock_source& clock) {
  std::vector<double> rtt_us;
  std::vector<std::uint8_t> bytes(raw_ping_bytes, 0x5a);
  for (int i = 0; i < count; ++i) {
    zmq::message_t ping(bytes.data(), bytes.size()), pong;
    const nanos t0 = clock.now();
    if (!dealer_.send(ping, zmq::send_flags::none) || !dealer_.recv(pong)) {
      std::lock_guard lock(failure_mutex_);
      return make_error(errc::timeout, "raw ZeroMQ echo: no reply to ping " + std::to_string(i + 1) + " within " +
                                           std::to_string(ping_limit_ns / 1'000'000) + " ms" +
                                           (failure_.empty() ? "" : " (echo server stopped: " + failure_ + ")"));
    }
    rtt_us.push_back(static_cast<double>(clock.now() - t0) * 1e-3);
  }
  return rtt_us;
}

}  // namespace archipelago
