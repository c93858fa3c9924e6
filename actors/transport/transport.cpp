#include "transport/transport.hpp"

#include <arpa/inet.h>  // inet_ntop
#include <linux/tcp.h>  // tcp_info with tcpi_min_rtt (glibc's netinet/tcp.h stops before it)
#include <netdb.h>      // getaddrinfo
#include <netinet/in.h>  // IPPROTO_TCP
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "core/prng.hpp"
#include "transport/bulk_pacer.hpp"
#include "transport/bulk_window.hpp"
#include "transport/peer_identity.hpp"

namespace archipelago::transport {

io_context make_io_context() {
  // One I/O thread: ZeroMQ suggests one per GB/s, and a node needs far less than that.
  auto context = std::make_shared<zmq::context_t>(1);
  // A one-process mesh of 32 learners holds more sockets (a few per peer and lane) than
  // ZeroMQ's default 1023: its transports then fail with "Too many open files".
  context->set(zmq::ctxopt::max_sockets, 16384);
  return context;
}

inbound_message::inbound_message() = default;
inbound_message::~inbound_message() = default;

std::uint64_t transport_counters::rejected_total() const {
  std::uint64_t total = 0;
  for (auto r : rejected) total += r;
  return total;
}

namespace {

/// ZeroMQ binds an IP address or an interface name, not a host name ("tcp://hostB:7000"
/// fails with ENODEV): the endpoint with its host resolved to an IPv4 address, or as it
/// was when the name does not resolve.
std::string with_resolved_host(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  if (!endpoint.starts_with("tcp://") || colon == std::string::npos || colon <= 6) return endpoint;
  const std::string host = endpoint.substr(6, colon - 6);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return endpoint;
  char ip[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr, ip, sizeof ip);
  freeaddrinfo(found);
  return "tcp://" + std::string(ip) + endpoint.substr(colon);
}

std::string identity_of(node_address a) { return a.to_string(); }

/// A message with tensor frames travels on the bulk lane, any other on the control lane.
bool is_bulk(const encoded_message& m) { return !m.tensors.empty(); }

/// Frames of one outbound message, sharing the encoded bytes (no copy).
std::vector<zmq::message_t> make_frames(const std::shared_ptr<const encoded_message>& msg,
                                        std::optional<std::uint64_t> flip_bit) {
  std::vector<zmq::message_t> frames;
  auto hold = [](const std::shared_ptr<const encoded_message>& m) {
    return new std::shared_ptr<const encoded_message>(m);
  };
  auto release = [](void*, void* hint) { delete static_cast<std::shared_ptr<const encoded_message>*>(hint); };
  frames.emplace_back(const_cast<capnp::word*>(msg->envelope.begin()), msg->envelope.size() * sizeof(capnp::word),
                      release, hold(msg));
  for (const auto& t : msg->tensors)
    frames.emplace_back(const_cast<std::uint8_t*>(t.data()), t.size(), release, hold(msg));
  if (flip_bit) {
    // Corruption emulation: flip one bit of a private copy of the frame it falls in.
    std::uint64_t bit = *flip_bit;
    for (auto& f : frames) {
      if (bit < f.size() * 8) {
        zmq::message_t copy(f.data(), f.size());
        static_cast<std::uint8_t*>(copy.data())[bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
        f = std::move(copy);
        break;
      }
      bit -= f.size() * 8;
    }
  }
  return frames;
}

struct scheduled_send {
  nanos at = 0;
  std::uint64_t order = 0;  // FIFO among equal times
  node_address to;
  std::shared_ptr<const encoded_message> message;
  std::optional<std::uint64_t> flip_bit;
  bool bulk = false;
  bool operator>(const scheduled_send& o) const { return at != o.at ? at > o.at : order > o.order; }
};

struct command {
  enum class kind { send, add_peer, set_link, stop } what = kind::send;
  std::vector<node_address> to;
  std::shared_ptr<const encoded_message> message;
  std::string endpoint;
  std::string profile_key;  // add_peer: the peer's CURVE public key
  link_profile profile;
};

}  // namespace

struct node_transport::impl {
  transport_config cfg;
  const clock_source& clock;
  logger& log;
  message_handler on_message;
  peer_handler on_peer;

  std::shared_ptr<zmq::context_t> context_owner;
  zmq::context_t& context;
  std::string bound_endpoint;
  int wake_fd = -1;
  int timer_fd = -1;  // nanosecond wake-ups for shaped deliveries (poll's timeout is in ms)
  std::thread io;
  std::shared_ptr<std::atomic<std::uint64_t>> sequence;  // cfg.sequence: shared with its sibling, if any
  broker_epoch_cell broker_epoch;
  std::atomic<nanos> frozen_until{0};  // freeze_for(): the I/O thread does nothing before then

  // Shared with callers (under mutex).
  mutable std::mutex mutex;
  std::deque<command> commands;
  std::set<node_address> known_peers;
  transport_counters stats;  // written by the I/O thread under mutex, read by counters()
  bool stopped = false;

  // I/O thread only.
  /// One lane to a peer: its socket and what waits for it.
  struct lane {
    std::unique_ptr<zmq::socket_t> dealer;
    std::deque<std::vector<zmq::message_t>> waiting;
    // The bulk lane over tcp://: ZeroMQ's monitor tells its connection's descriptor,
    // whose send buffer follows the queue it builds (bulk_window).
    std::unique_ptr<zmq::socket_t> monitor;
    int fd = -1;
    std::optional<bulk_window> window;
    nanos reported_delay_max_ns = -1;  // what the counters hold (they are written only when it changes)

    /// Monitoring stops before its reader goes: libzmq's I/O thread sends monitor
    /// events blocking, and with no reader left it would hang every socket.
    void close() {
      if (monitor && dealer) (void)zmq_socket_monitor(dealer->handle(), nullptr, 0);
      monitor.reset();
      dealer.reset();
      fd = -1;
    }
    ~lane() { close(); }
  };
  struct peer {
    node_address address;
    std::string endpoint;
    std::string server_key;  // Z85; empty without CURVE
    lane control, bulk;
    link_shaper shaper;
    bulk_pacer pacer;
    std::map<std::uint64_t, std::shared_ptr<const encoded_message>> pacing;  // by pacer id
    nanos reconnect_at = -1;
    reconnect_backoff backoff;
    bool dead = false;
    // The peer's last heartbeat: its sentAtNs, and when it arrived here (echoed back).
    std::int64_t echo_sent_at = 0;
    nanos echo_received_at = 0;

    peer(node_address a, link_shaper s, bulk_pacer b, reconnect_backoff r)
        : address(a), shaper(std::move(s)), pacer(std::move(b)), backoff(std::move(r)) {}
    bool connected() const { return control.dealer != nullptr; }
    void disconnect() {
      for (lane* l : {&control, &bulk}) {
        l->close();
        l->waiting.clear();
      }
      pacer.clear();
      pacing.clear();
    }
  };
  std::map<node_address, peer> peers;
  std::unique_ptr<zmq::socket_t> router;
  std::unique_ptr<zmq::socket_t> zap;  // ZAP handler (CURVE allow-list), if this transport serves it
  bool curve_on = false;               // the ROUTER is a CURVE server: its messages carry the client key's name
  std::priority_queue<scheduled_send, std::vector<scheduled_send>, std::greater<>> schedule;
  std::uint64_t schedule_order = 0;
  std::uint64_t pacer_ids = 0;
  std::uint64_t monitors = 0;
  static constexpr nanos window_sample_ns = 20'000'000;
  nanos next_window_sample = 0;
  peer_liveness liveness;
  dedup_window dedup, bulk_dedup;  // per lane: a bulk message may arrive long after later control ones
  std::set<node_address> dead_reported;

  impl(transport_config c, const clock_source& clk, logger& l, message_handler m, peer_handler p)
      : cfg(std::move(c)), clock(clk), log(l), on_message(std::move(m)), on_peer(std::move(p)),
        context_owner(cfg.context ? cfg.context : make_io_context()), context(*context_owner),
        liveness(cfg.heartbeat) {
    if (!cfg.sequence) cfg.sequence = std::make_shared<std::atomic<std::uint64_t>>(0);
    sequence = cfg.sequence;
  }
  ~impl() {
    if (wake_fd >= 0) ::close(wake_fd);
    if (timer_fd >= 0) ::close(timer_fd);
  }

  template <class F>
  void count(F&& f) {
    std::lock_guard<std::mutex> lock(mutex);
    f(stats);
  }

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
  }

  std::unique_ptr<zmq::socket_t> make_dealer(const std::string& endpoint, const std::string& server_key, bool bulk) {
    auto s = std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
    s->set(zmq::sockopt::linger, 0);
    s->set(zmq::sockopt::sndhwm, cfg.socket_hwm);
    s->set(zmq::sockopt::rcvhwm, cfg.socket_hwm);
    // Two connections to the peer's ROUTER need two identities.
    s->set(zmq::sockopt::routing_id, identity_of(cfg.self) + (bulk ? "+bulk" : ""));
    if (bulk && cfg.bulk_sndbuf_bytes > 0) s->set(zmq::sockopt::sndbuf, cfg.bulk_sndbuf_bytes);
    s->set(zmq::sockopt::immediate, 1);  // do not queue for a peer that is not connected
    s->set(zmq::sockopt::reconnect_ivl, 100);
    s->set(zmq::sockopt::reconnect_ivl_max, 5000);
    s->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(cfg.limits.max_tensor_bytes));
    if (cfg.curve.enabled && endpoint.starts_with("tcp://")) {
      s->set(zmq::sockopt::curve_serverkey, server_key);
      s->set(zmq::sockopt::curve_publickey, cfg.curve.own.public_z85);
      s->set(zmq::sockopt::curve_secretkey, cfg.curve.own.secret_z85);
    }
    s->connect(endpoint);
    return s;
  }

  void connect(peer& p) {
    p.control.dealer = make_dealer(p.endpoint, p.server_key, false);
    p.bulk.close();
    p.bulk.dealer = make_dealer(p.endpoint, p.server_key, true);
    if (cfg.bulk_sndbuf_bytes == 0 && cfg.bulk_queue_target_ns > 0 && p.endpoint.starts_with("tcp://")) {
      // Watch the bulk connection (before it connects: the event is not missed).
      const std::string name = "inproc://archipelago-bulk-" + std::to_string(reinterpret_cast<std::uintptr_t>(this)) +
                               "-" + std::to_string(++monitors);
      if (zmq_socket_monitor(p.bulk.dealer->handle(), name.c_str(), ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) == 0) {
        p.bulk.monitor = std::make_unique<zmq::socket_t>(context, zmq::socket_type::pair);
        p.bulk.monitor->set(zmq::sockopt::linger, 0);
        p.bulk.monitor->connect(name);
      }
      if (!p.bulk.window) {
        bulk_window::config wc;
        wc.target_delay_ns = cfg.bulk_queue_target_ns;
        p.bulk.window.emplace(wc);
      }
    }
  }

  /// The bulk connection's monitor: its descriptor when it connects, forgotten when it drops.
  void monitor_event(peer& p) {
    zmq::message_t event, address;
    while (p.bulk.monitor->recv(event, zmq::recv_flags::dontwait)) {
      if (event.more()) (void)p.bulk.monitor->recv(address, zmq::recv_flags::dontwait);
      if (event.size() < 6) continue;
      std::uint16_t id = 0;
      std::uint32_t value = 0;
      std::memcpy(&id, event.data(), 2);
      std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
      if (id == ZMQ_EVENT_CONNECTED) {
        p.bulk.fd = static_cast<int>(value);
        const int bytes = static_cast<int>(p.bulk.window->bytes());
        (void)::setsockopt(p.bulk.fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
      } else if (id == ZMQ_EVENT_DISCONNECTED) {
        p.bulk.fd = -1;
      }
    }
  }

  /// Every bulk connection's window from its TCP_INFO (bulk_window).
  void adapt_bulk_windows(nanos now) {
    if (now < next_window_sample) return;
    next_window_sample = now + window_sample_ns;
    for (auto& [addr, p] : peers) {
      lane& l = p.bulk;
      if (l.fd < 0 || !l.window) continue;
      tcp_info info{};
      socklen_t size = sizeof info;
      if (::getsockopt(l.fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0 || size < sizeof info) continue;
      const auto changed = l.window->on_sample(now, static_cast<nanos>(info.tcpi_rtt) * 1000,
                                               static_cast<nanos>(info.tcpi_min_rtt) * 1000,
                                               static_cast<std::size_t>(info.tcpi_unacked) * info.tcpi_snd_mss);
      if (changed) {
        const int bytes = static_cast<int>(*changed);
        (void)::setsockopt(l.fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
      }
      if (!changed && l.window->queue_delay_max_ns() == l.reported_delay_max_ns) continue;  // the mutex only on news
      l.reported_delay_max_ns = l.window->queue_delay_max_ns();
      count([&, address = p.address](auto& c) {  // clang 14 cannot capture a structured binding
        link_counters& link = c.links[address];
        link.bulk_window_bytes = l.window->bytes();
        link.bulk_queue_delay_max_ns = l.window->queue_delay_max_ns();
      });
    }
  }

  // -- outbound -------------------------------------------------------------

  void enqueue(node_address to, const std::shared_ptr<const encoded_message>& msg, nanos now) {
    auto it = peers.find(to);
    if (it == peers.end()) {
      count([](auto& s) { ++s.unknown_peer; });
      return;
    }
    peer& p = it->second;
    if (!is_bulk(*msg)) {
      schedule_deliveries(p, msg, p.shaper.submit(now, msg->total_bytes()), false);
      return;
    }
    const std::uint64_t id = ++pacer_ids;
    if (!p.pacer.queue(id, msg->total_bytes())) {
      count([](auto& c) { ++c.peer_queue_full; });
      return;
    }
    p.pacing.emplace(id, msg);
    pace(p, now);
  }

  /// Feeds the peer's link the bulk pieces it can take now.
  void pace(peer& p, nanos now) {
    for (const auto& done : p.pacer.pump(now, p.shaper)) {
      auto m = p.pacing.extract(done.id);
      schedule_deliveries(p, m.mapped(), done.arrivals, true);
    }
  }

  void schedule_deliveries(peer& p, const std::shared_ptr<const encoded_message>& msg, const deliveries& arrivals,
                           bool bulk) {
    if (arrivals.empty()) count([](auto& s) { ++s.shaped_lost; });
    if (arrivals.size() > 1) count([](auto& s) { ++s.shaped_duplicated; });
    for (const auto& d : arrivals) {
      if (d.corrupt) count([](auto& s) { ++s.shaped_corrupted; });
      schedule.push({d.at_ns, schedule_order++, p.address, msg,
                     d.corrupt ? std::optional<std::uint64_t>(d.flip_bit) : std::nullopt, bulk});
    }
  }

  void release_due(nanos now) {
    while (!schedule.empty() && schedule.top().at <= now) {
      const scheduled_send s = schedule.top();
      schedule.pop();
      auto it = peers.find(s.to);
      if (it == peers.end()) continue;
      peer& p = it->second;
      lane& l = s.bulk ? p.bulk : p.control;
      if (l.waiting.size() >= cfg.peer_queue_capacity) {
        count([](auto& c) { ++c.peer_queue_full; });
        continue;
      }
      l.waiting.push_back(make_frames(s.message, s.flip_bit));
      flush(p, l);
    }
  }

  /// Sends what a lane's socket accepts now; the rest waits for POLLOUT.
  void flush(peer& p, lane& l) {
    if (!l.dealer) return;
    while (!l.waiting.empty()) {
      auto& frames = l.waiting.front();
      std::size_t bytes = 0;
      for (auto& f : frames) bytes += f.size();
      // With immediate=1 and a HWM, the first frame either goes or nothing does.
      auto sent = l.dealer->send(frames[0], frames.size() > 1 ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                                              : zmq::send_flags::dontwait);
      if (!sent) return;
      for (std::size_t i = 1; i < frames.size(); ++i)
        l.dealer->send(frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      l.waiting.pop_front();
      count([&](auto& c) {
        ++c.sent_messages;
        c.sent_bytes += bytes;
        link_counters& link = c.links[p.address];
        ++link.sent_messages;
        link.sent_bytes += bytes;
      });
    }
  }

  /// A heartbeat to `p`, echoing the last one it sent us.
  std::shared_ptr<const encoded_message> heartbeat_for(const peer& p, nanos now) {
    envelope_builder b(cfg.self, cfg.self_incarnation, ++*sequence, 0, broker_epoch.get());
    auto hb = b.body().initHeartbeat();
    hb.setSentAtNs(now);
    if (p.echo_sent_at != 0) {
      hb.setEchoSentAtNs(p.echo_sent_at);
      hb.setEchoHeldNs(now - p.echo_received_at);
    }
    count([](auto& c) { ++c.heartbeats_sent; });
    return std::make_shared<const encoded_message>(b.finish());
  }

  void send_heartbeats(nanos now) {
    if (!liveness.heartbeat_due(now)) return;
    liveness.heartbeat_sent(now);
    for (auto& [addr, p] : peers)
      if (!p.dead) enqueue(addr, heartbeat_for(p, now), now);
  }

  /// A heartbeat from `p`: remember it for the echo, and time our own that it echoes.
  void heartbeat_from(peer& p, wire::Heartbeat::Reader hb, nanos now) {
    p.echo_sent_at = hb.getSentAtNs();
    p.echo_received_at = now;
    if (hb.getEchoSentAtNs() == 0) return;
    const nanos rtt = now - hb.getEchoSentAtNs() - hb.getEchoHeldNs();
    if (rtt < 0 || hb.getEchoSentAtNs() > now) return;  // not ours (a restarted node's clock): ignore
    count([&](auto& c) {
      link_counters& link = c.links[p.address];
      ++link.rtt_samples;
      link.rtt_last_ns = rtt;
      link.rtt_sum_ns += rtt;
      link.rtt_max_ns = std::max(link.rtt_max_ns, rtt);
    });
  }

  // -- liveness and reconnects ---------------------------------------------

  void check_liveness(nanos now) {
    for (node_address addr : liveness.expire(now)) {
      count([](auto& c) { ++c.peers_died; });
      if (on_peer) on_peer(addr, false);
      auto it = peers.find(addr);
      if (it == peers.end()) continue;
      peer& p = it->second;
      // Paranoid Pirate: drop the sockets (and what they queued) and reconnect later.
      p.dead = true;
      p.disconnect();
      p.reconnect_at = now + p.backoff.next_delay();
    }
    for (auto& [addr, p] : peers) {
      if (p.dead && p.reconnect_at >= 0 && now >= p.reconnect_at) {
        connect(p);
        p.reconnect_at = now + p.backoff.next_delay();  // again later unless it answers
        count([](auto& c) { ++c.reconnects; });
        // A heartbeat straight away, so a live peer answers within one interval. Through
        // the link's shaper like every message: a partition (loss 1) must stop it too, or
        // a broker cut off from everyone would hear its successor's epoch through it.
        enqueue(addr, heartbeat_for(p, now), now);
      }
    }
  }

  void heard_from(node_address sender, nanos now) {
    liveness.heard_from(sender, now);
    auto it = peers.find(sender);
    if (it != peers.end() && it->second.dead) {
      peer& p = it->second;
      p.dead = false;
      p.reconnect_at = -1;
      p.backoff.reset();
      // It called before our reconnect timer fired: its sockets were dropped at
      // death and must come back now, or nothing would reach it again.
      if (!p.connected()) connect(p);
      if (on_peer) on_peer(sender, true);
    }
  }

  // -- inbound --------------------------------------------------------------

  void log_reject(reject_reason reason, const std::string& from, const std::string& message) {
    // Counted by reason before this (rejected[]); the logger's rate limit keeps a flood to a few lines.
    log.warn("transport.rejected", "archipelago transport %s: rejected message from '%s' (%s): %s",
             cfg.self.to_string().c_str(), from.c_str(), to_string(reason), message.c_str());
  }

  void reply_error(zmq::socket_t& socket, const std::string* identity, wire::ErrorCode code,
                   const std::string& text) {
    envelope_builder b(cfg.self, cfg.self_incarnation, ++*sequence, 0, broker_epoch.get());
    auto e = b.body().initError();
    e.setCode(code);
    e.setMessage(text);
    auto msg = std::make_shared<const encoded_message>(b.finish());
    auto frames = make_frames(msg, std::nullopt);
    if (identity) {
      zmq::message_t id(identity->data(), identity->size());
      if (!socket.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
    }
    for (std::size_t i = 0; i < frames.size(); ++i)
      socket.send(frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                                   : zmq::send_flags::dontwait);
  }

  /// Receives and handles every complete message waiting on `socket`.
  void receive_all(zmq::socket_t& socket, bool has_identity, nanos now) {
    for (int budget = 0; budget < 256; ++budget) {
      auto in = std::make_shared<inbound_message>();
      zmq::message_t part;
      if (!socket.recv(part, zmq::recv_flags::dontwait)) return;
      std::string identity;
      if (has_identity) {
        identity.assign(static_cast<const char*>(part.data()), part.size());
        if (!part.more()) continue;  // identity without a message: ignore
        part = zmq::message_t();
        if (!socket.recv(part, zmq::recv_flags::dontwait)) return;
      }
      std::size_t bytes = part.size();
      bool more = part.more();
      in->frames.push_back(std::move(part));
      while (more) {
        zmq::message_t next;
        if (!socket.recv(next, zmq::recv_flags::none)) break;  // parts of one message arrive together
        more = next.more();
        bytes += next.size();
        in->frames.push_back(std::move(next));
      }
      count([&](auto& c) {
        ++c.received_messages;
        c.received_bytes += bytes;
      });
      handle(socket, has_identity ? &identity : nullptr, std::move(in), now);
    }
  }

  /// The sender a message claims against what its connection proves: over a CURVE
  /// link, the ROUTER's messages carry the client key's allow-list name (the ZAP
  /// handler's User-Id), and the header must claim the identity that name binds
  /// (peer_identity.hpp). A DEALER's messages come from the server whose key it
  /// pinned. Then, with check_roles, the body must be one the sender's role may send.
  std::optional<std::pair<reject_reason, std::string>> admit(bool on_router, zmq::message_t& first,
                                                             const decoded_envelope& env) {
    if (on_router && curve_on) {
      const char* user = zmq_msg_gets(first.handle(), "User-Id");
      if (user == nullptr)
        return std::pair{reject_reason::impersonation, std::string("no authenticated key on a CURVE connection")};
      if (auto no = check_sender(user, env.sender(), env.body()); no && no->impersonation)
        return std::pair{reject_reason::impersonation, no->message};
    }
    if (cfg.check_roles && !role_may_send(env.sender().kind, env.body()))
      return std::pair{reject_reason::not_permitted, std::string(to_string(env.sender().kind)) + " may not send " +
                                                         body_name(env.body())};
    return std::nullopt;
  }

  void handle(zmq::socket_t& socket, const std::string* identity, std::shared_ptr<inbound_message> in,
              nanos now) {
    std::vector<frame_view> views;
    for (auto& f : in->frames) views.push_back({static_cast<const std::uint8_t*>(f.data()), f.size()});
    decode_result r = decode_envelope(views, cfg.limits);
    const std::string from = identity ? *identity : std::string("(reply socket)");
    if (!r.ok()) {
      count([&](auto& c) { ++c.rejected[static_cast<int>(r.reason())]; });
      log_reject(r.reason(), from, r.message());
      if (r.reason() == reject_reason::version_mismatch)
        reply_error(socket, identity, wire::ErrorCode::VERSION_MISMATCH, r.message());
      return;
    }
    in->envelope = r.take();
    const decoded_envelope& env = *in->envelope;
    const node_address sender = env.sender();
    if (auto refused = admit(identity != nullptr, in->frames[0], env)) {
      count([&](auto& c) { ++c.rejected[static_cast<int>(refused->first)]; });
      log_reject(refused->first, from, refused->second);
      return;
    }
    count([&](auto& c) {
      link_counters& link = c.links[sender];
      ++link.received_messages;
      for (const auto& v : views) link.received_bytes += v.size;
    });
    const bool bulk = env.tensor_count() > 0;
    switch ((bulk ? bulk_dedup : dedup).check(sender, incarnation{env.header().getIncarnation()},
                                              env.header().getSequence())) {
      case dedup_window::verdict::fresh: break;
      case dedup_window::verdict::duplicate: count([](auto& c) { ++c.duplicates; }); return;
      case dedup_window::verdict::stale_incarnation: count([](auto& c) { ++c.stale_incarnation; }); return;
      case dedup_window::verdict::too_old: count([](auto& c) { ++c.too_old; }); return;
    }
    if (!bulk) heard_from(sender, now);  // liveness is the control lane's verdict alone
    // Any message, heartbeats too, spreads the newest broker epoch (message_port::broker_epoch).
    broker_epoch.raise(env.header().getBrokerEpoch());
    if (env.body() == wire::Envelope::Body::HEARTBEAT) {
      count([](auto& c) { ++c.heartbeats_received; });
      if (auto it = peers.find(sender); it != peers.end()) heartbeat_from(it->second, env.root().getBody().getHeartbeat(), now);
      return;
    }
    count([](auto& c) { ++c.delivered; });
    if (on_message) on_message(std::move(in));
  }

  // -- commands -------------------------------------------------------------

  bool drain_commands(nanos now) {
    std::uint64_t value = 0;
    [[maybe_unused]] auto n = ::read(wake_fd, &value, sizeof value);
    std::deque<command> batch;
    {
      std::lock_guard<std::mutex> lock(mutex);
      batch.swap(commands);
    }
    for (auto& c : batch) {
      switch (c.what) {
        case command::kind::stop: return false;
        case command::kind::add_peer: {
          auto it = peers.find(c.to[0]);
          if (it == peers.end()) {
            const std::uint64_t seed = derive_seed(cfg.seed, (static_cast<std::uint64_t>(c.to[0].kind) << 32) | c.to[0].index);
            it = peers
                     .try_emplace(c.to[0], c.to[0], link_shaper(cfg.default_link, seed),
                                  bulk_pacer(cfg.bulk_piece_bytes, cfg.peer_queue_capacity),
                                  reconnect_backoff(cfg.backoff, derive_seed(seed, 1)))
                     .first;
          }
          peer& p = it->second;
          p.endpoint = c.endpoint;
          p.server_key = c.profile_key;
          connect(p);  // new sockets; what waits for them is kept
          p.dead = false;
          p.reconnect_at = -1;
          break;
        }
        case command::kind::set_link: {
          auto it = peers.find(c.to[0]);
          if (it != peers.end()) (void)it->second.shaper.set_profile(c.profile);
          break;
        }
        case command::kind::send:
          for (node_address to : c.to) enqueue(to, c.message, now);
          break;
      }
    }
    return true;
  }

  /// One ZAP request: a CURVE client is accepted only if its key is allowed.
  void authenticate() {
    std::string refused;
    if (handle_zap_request(*zap, *cfg.curve.allowed, &refused)) {
      count([](auto& c) { ++c.curve_accepted; });
      return;
    }
    count([](auto& c) { ++c.curve_refused; });
    log.warn("transport.curve_refused", "archipelago transport %s: refused a connection from unknown key %s",
             cfg.self.to_string().c_str(), refused.empty() ? "(none)" : refused.c_str());
  }

  // -- the I/O thread -------------------------------------------------------

  /// Stopping: the control messages not yet sent (a learner's last Progress and
  /// Leave; those a shaped link still holds back included) go to live peers for up
  /// to cfg.stop_drain_ns; a socket that still holds some then lingers for what is
  /// left of it. Bulk messages are dropped.
  void drain_on_stop() {
    const nanos deadline = clock.now() + cfg.stop_drain_ns;
    {
      std::vector<scheduled_send> control;
      for (; !schedule.empty(); schedule.pop())
        if (!schedule.top().bulk) control.push_back(schedule.top());
      for (auto& c : control) schedule.push(std::move(c));
    }
    std::vector<zmq::pollitem_t> items;
    std::vector<peer*> waiting;
    for (nanos now = clock.now(); now < deadline; now = clock.now()) {
      release_due(now);
      items.clear();
      waiting.clear();
      for (auto& [addr, p] : peers)
        if (!p.dead && p.control.dealer && !p.control.waiting.empty()) {
          items.push_back({p.control.dealer->handle(), 0, ZMQ_POLLOUT, 0});
          waiting.push_back(&p);
        }
      if (items.empty() && schedule.empty()) break;
      const nanos until = schedule.empty() ? deadline : std::min(deadline, schedule.top().at);
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds((until - now) / 1'000'000 + 1));
      for (std::size_t i = 0; i < items.size(); ++i)
        if (items[i].revents & ZMQ_POLLOUT) flush(*waiting[i], waiting[i]->control);
    }
    const int linger_ms = static_cast<int>(std::max<nanos>(deadline - clock.now(), 0) / 1'000'000);
    for (auto& [addr, p] : peers)
      if (!p.dead && p.control.dealer && linger_ms > 0) p.control.dealer->set(zmq::sockopt::linger, linger_ms);
  }

  /// Frozen like a SIGSTOPped process: nothing read (it waits in ZeroMQ's
  /// buffers), nothing sent, no heartbeats. Only stop() is noticed. Returns
  /// false when stopped; `woken` remembers a wake-up whose commands wait for the thaw.
  bool stay_frozen(nanos until, bool& woken) {
    for (nanos now = clock.now(); now < until; now = clock.now()) {
      zmq::pollitem_t wake_item{nullptr, wake_fd, ZMQ_POLLIN, 0};
      zmq::poll(&wake_item, 1, std::chrono::milliseconds(std::min<nanos>((until - now) / 1'000'000 + 1, 100)));
      if (wake_item.revents & ZMQ_POLLIN) {
        std::uint64_t value = 0;
        [[maybe_unused]] auto n = ::read(wake_fd, &value, sizeof value);
        woken = true;
        std::lock_guard<std::mutex> lock(mutex);
        if (stopped) return false;
      }
    }
    return true;
  }

  void run() {
    std::vector<zmq::pollitem_t> items;
    std::vector<std::pair<peer*, lane*>> polled;
    for (;;) {
      nanos now = clock.now();
      if (const nanos until = frozen_until.load(); until > now) {
        bool woken = false;
        if (!stay_frozen(until, woken)) return;
        now = clock.now();
        if (woken && !drain_commands(now)) return drain_on_stop();
      }
      for (auto& [addr, p] : peers) pace(p, now);
      release_due(now);
      send_heartbeats(now);
      adapt_bulk_windows(now);

      nanos wait = liveness.next_heartbeat_due(now) - now;
      wait = std::min(wait, cfg.heartbeat.interval_ns / 4);  // liveness checks
      if (cfg.bulk_queue_target_ns > 0) wait = std::min(wait, std::max<nanos>(next_window_sample - now, 0));
      if (!schedule.empty()) wait = std::min(wait, schedule.top().at - now);
      for (auto& [addr, p] : peers) {
        if (p.reconnect_at >= 0) wait = std::min(wait, p.reconnect_at - now);
        if (const nanos at = p.pacer.next_pump_ns(now, p.shaper); at >= 0) wait = std::min(wait, at - now);
      }
      wait = std::max<nanos>(wait, 0);
      // The timer fires at the exact deadline; poll's own timeout (whole
      // milliseconds, rounded up) is only the fallback.
      itimerspec when{};
      when.it_value.tv_sec = wait / 1'000'000'000;
      when.it_value.tv_nsec = std::max<nanos>(wait % 1'000'000'000, wait == 0 ? 1 : 0);
      ::timerfd_settime(timer_fd, 0, &when, nullptr);
      const auto timeout = std::chrono::milliseconds((wait + 999'999) / 1'000'000 + 1);

      items.clear();
      polled.clear();
      items.push_back({router->handle(), 0, ZMQ_POLLIN, 0});
      items.push_back({nullptr, wake_fd, ZMQ_POLLIN, 0});
      items.push_back({nullptr, timer_fd, ZMQ_POLLIN, 0});
      const std::size_t zap_index = items.size();
      if (zap) items.push_back({zap->handle(), 0, ZMQ_POLLIN, 0});
      const std::size_t first_peer = items.size();
      for (auto& [addr, p] : peers)
        for (lane* l : {&p.control, &p.bulk}) {
          if (!l->dealer) continue;
          items.push_back({l->dealer->handle(), 0, static_cast<short>(ZMQ_POLLIN | (l->waiting.empty() ? 0 : ZMQ_POLLOUT)), 0});
          polled.push_back({&p, l});
        }
      const std::size_t first_monitor = items.size();
      std::vector<peer*> monitored;
      for (auto& [addr, p] : peers)
        if (p.bulk.monitor) {
          items.push_back({p.bulk.monitor->handle(), 0, ZMQ_POLLIN, 0});
          monitored.push_back(&p);
        }
      zmq::poll(items.data(), items.size(), timeout);
      if (items[2].revents & ZMQ_POLLIN) {
        std::uint64_t expirations = 0;
        [[maybe_unused]] auto n = ::read(timer_fd, &expirations, sizeof expirations);
      }
      now = clock.now();
      if (items[1].revents & ZMQ_POLLIN)
        if (!drain_commands(now)) return drain_on_stop();
      if (zap && (items[zap_index].revents & ZMQ_POLLIN)) authenticate();
      if (items[0].revents & ZMQ_POLLIN) receive_all(*router, true, now);
      for (std::size_t i = 0; i < polled.size(); ++i) {
        auto [p, l] = polled[i];
        if (!l->dealer) continue;  // dropped by a message handled above
        if (items[first_peer + i].revents & ZMQ_POLLIN) receive_all(*l->dealer, false, now);
        if (l->dealer && (items[first_peer + i].revents & ZMQ_POLLOUT)) flush(*p, *l);
      }
      for (std::size_t i = 0; i < monitored.size(); ++i)
        if ((items[first_monitor + i].revents & ZMQ_POLLIN) && monitored[i]->bulk.monitor) monitor_event(*monitored[i]);
      // Verdicts only after what arrived was read: a thread that did not run for a
      // while (a loaded machine) finds its peers' heartbeats waiting, not its peers dead.
      check_liveness(now);
    }
  }
};

node_transport::node_transport(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

node_transport::~node_transport() { stop(); }

expected<std::unique_ptr<node_transport>> node_transport::start(transport_config config, const clock_source& clock,
                                                                logger& log, message_handler on_message,
                                                                peer_handler on_peer) {
  if (auto ok = validate(config.heartbeat); !ok) return ok.err();
  if (auto ok = validate(config.backoff); !ok) return ok.err();
  if (auto ok = validate(config.default_link); !ok) return ok.err();
  auto p = std::make_unique<impl>(std::move(config), clock, log, std::move(on_message), std::move(on_peer));
  p->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  p->timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (p->wake_fd < 0 || p->timer_fd < 0) return make_error(errc::io_error, "eventfd/timerfd failed");
  try {
    p->router = std::make_unique<zmq::socket_t>(p->context, zmq::socket_type::router);
    p->router->set(zmq::sockopt::linger, 0);
    p->router->set(zmq::sockopt::sndhwm, p->cfg.socket_hwm);
    p->router->set(zmq::sockopt::rcvhwm, p->cfg.socket_hwm);
    p->router->set(zmq::sockopt::router_handover, 1);  // a restarted peer takes over its identity
    p->router->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(p->cfg.limits.max_tensor_bytes));
    std::string endpoint = p->cfg.bind_endpoint;
    if (p->cfg.curve.enabled && endpoint.starts_with("tcp://")) {
      if (!p->cfg.curve.allowed || p->cfg.curve.allowed->empty())
        return make_error(errc::invalid_input, "CURVE is on but no allowed client keys were given");
      // ZeroMQ asks the context's ZAP handler about every CURVE client. One
      // handler serves a context; transports sharing one must share the list.
      p->zap = std::make_unique<zmq::socket_t>(p->context, zmq::socket_type::rep);
      p->zap->set(zmq::sockopt::linger, 0);
      try {
        p->zap->bind(zap_endpoint);
      } catch (const zmq::error_t& e) {
        if (e.num() != EADDRINUSE) throw;
        p->zap.reset();
      }
      p->router->set(zmq::sockopt::curve_server, 1);
      p->curve_on = true;
      p->router->set(zmq::sockopt::curve_secretkey, p->cfg.curve.own.secret_z85);
      p->router->set(zmq::sockopt::zap_domain, "archipelago");
    }
    // "tcp://host:0" means any free port (ZeroMQ spells it "*").
    if (endpoint.starts_with("tcp://") && endpoint.ends_with(":0")) endpoint.replace(endpoint.size() - 1, 1, "*");
    // A node restarted in the same process (a drill) may find its inproc:// name
    // still held for a moment by its predecessor's closing socket: retry, bounded.
    for (int attempt = 0;; ++attempt) {
      try {
        p->router->bind(endpoint);
        break;
      } catch (const zmq::error_t& e) {
        if (e.num() == ENODEV && attempt == 0 && with_resolved_host(endpoint) != endpoint) {
          endpoint = with_resolved_host(endpoint);  // a host name: bind the address it names
          continue;
        }
        if (e.num() != EADDRINUSE || !endpoint.starts_with("inproc://") || attempt >= 100) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    p->bound_endpoint = p->router->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(errc::invalid_input, "cannot bind '" + p->cfg.bind_endpoint + "': " + e.what());
  }
  // The router was created here; from now on only the I/O thread touches it.
  impl* raw = p.get();
  p->io = std::thread([raw] {
    try {
      raw->run();
    } catch (const zmq::error_t& e) {
      raw->log.error("transport.stopped", "archipelago transport %s: I/O thread stopped: %s",
                     raw->cfg.self.to_string().c_str(), e.what());
    }
  });
  return std::unique_ptr<node_transport>(new node_transport(std::move(p)));
}

expected<transport_config> transport_config_from(const config& cfg, node_address self, incarnation inc,
                                                 std::string bind_endpoint, std::string* warning) {
  constexpr nanos ms = 1'000'000;
  const wire_config& w = cfg.wire;
  transport_config t;
  t.self = self;
  t.self_incarnation = inc;
  t.bind_endpoint = std::move(bind_endpoint);
  t.heartbeat = {w.heartbeat_interval_ms * ms, w.liveness};
  t.backoff.initial_ns = w.reconnect_initial_ms * ms;
  t.backoff.max_ns = w.reconnect_max_ms * ms;
  t.socket_hwm = w.socket_hwm;
  t.bulk_piece_bytes = static_cast<std::size_t>(w.bulk_piece_bytes);
  t.bulk_sndbuf_bytes = static_cast<int>(w.bulk_sndbuf_bytes);
  t.bulk_queue_target_ns = static_cast<nanos>(w.bulk_queue_target_ms * 1e6);
  t.outbox_capacity = static_cast<std::size_t>(w.outbox_capacity);
  t.peer_queue_capacity = static_cast<std::size_t>(w.peer_queue_capacity);
  t.limits.max_tensor_bytes = static_cast<std::size_t>(w.max_tensor_bytes);
  const link_config& l = cfg.link;
  t.default_link.bandwidth_bytes_per_s = l.bandwidth_mbit * 1e6 / 8;
  t.default_link.latency_ns = static_cast<nanos>(l.latency_ms * 1e6);
  t.default_link.jitter_ns = static_cast<nanos>(l.jitter_ms * 1e6);
  t.default_link.loss = l.loss;
  t.default_link.duplicate = l.duplicate;
  t.default_link.reorder = l.reorder;
  t.default_link.corrupt = l.corrupt;
  t.seed = derive_seed(cfg.train.seed, (static_cast<std::uint64_t>(self.kind) << 32) | self.index);
  t.check_roles = true;  // a mesh's node: every body from a role that may send it
  if (w.curve && t.bind_endpoint.starts_with("tcp://")) {
    if (w.key_file.empty() && w.allow.empty())
      return make_error(errc::invalid_input,
                        "wire.curve is on for a tcp:// endpoint but wire.key_file is empty "
                        "(create keys with archipelago keygen, or set wire.curve=false)");
    if (w.allow.empty())
      return make_error(errc::invalid_input,
                        "wire.curve is on for a tcp:// endpoint but wire.allow (the allowed public keys) is empty");
    // No wire.key_file: the node's own key beside the public keys, by its name
    // (learner-I before a shared learner.key).
    std::string key_file = w.key_file;
    std::error_code ec;
    for (const std::string& name : curve_key_names(self))
      if (key_file.empty() && std::filesystem::is_directory(w.allow, ec) &&
          std::filesystem::exists(std::filesystem::path(w.allow) / (name + ".key"), ec))
        key_file = (std::filesystem::path(w.allow) / (name + ".key")).string();
    if (key_file.empty())
      return make_error(errc::invalid_input,
                        "wire.curve is on for a tcp:// endpoint but wire.key_file is empty and wire.allow holds no " +
                            curve_key_names(self).front() +
                            ".key (create keys with archipelago keygen, or set wire.curve=false)");
    auto keys = load_keypair(key_file);
    if (!keys) return keys.err();
    auto allowed = key_allow_list::load(w.allow);
    if (!allowed) return allowed.err();
    // The node's own key, if listed, must be bound to this node: its peers hold it to that identity.
    if (allowed->allows_z85(keys->public_z85)) {
      const std::string listed = allowed->name_of_z85(keys->public_z85);
      auto id = identity_of_key_name(listed);
      if (!id || !identity_admits(*id, self))
        return make_error(errc::invalid_input,
                          key_file + " holds the key listed on wire.allow as '" + listed.substr(0, 64) + "', which " +
                              (id ? "is bound to " + id->name() : std::string("binds no identity")) + ", not to " +
                              self.to_string() + " (archipelago keygen --name " + key_name_of(self) + ")");
      if (!id->index && self.kind == role::learner && warning != nullptr)
        *warning = "the key '" + listed + "' is shared by every learner: it binds the learner role only, so any "
                   "learner can contribute in another's name (give each learner its own: keygen --name " +
                   key_name_of(self) + ")";
    }
    t.curve = {true, std::move(*keys), std::make_shared<const key_allow_list>(std::move(*allowed))};
  }
  return t;
}

const std::string& node_transport::endpoint() const { return impl_->bound_endpoint; }
const transport_config& node_transport::config() const { return impl_->cfg; }

std::vector<std::string> curve_key_names(node_address node) {
  const std::string i = std::to_string(node.index);
  switch (node.kind) {
    case role::sync_broker: return node.index == 0 ? std::vector<std::string>{"broker"} : std::vector<std::string>{"broker-" + i};  // standbys: broker-1, ...
    case role::parameter_shard: return {"shard-" + i};
    case role::learner: return {"learner-" + i, "learner"};
    case role::chaos_monkey: return {"chaos"};
    case role::admin: return {"admin"};
  }
  return {};
}

status node_transport::add_peer(node_address peer, const std::string& endpoint,
                                const std::string& server_public_z85) {
  std::string server_key = server_public_z85;
  if (impl_->cfg.curve.enabled && endpoint.starts_with("tcp://")) {
    const std::vector<std::string> names = curve_key_names(peer);
    for (std::size_t n = 0; server_key.empty() && impl_->cfg.curve.allowed && n < names.size(); ++n)
      server_key = impl_->cfg.curve.allowed->key_named(names[n]);
    if (auto ok = validate_z85_key(server_key); !ok) {
      std::string wanted;
      for (const std::string& name : names) wanted += (wanted.empty() ? "'" : " or '") + name + "'";
      error err = make_error(errc::invalid_input,
                             "CURVE peer " + peer.to_string() + ": " +
                                 (server_key.empty() ? "no public key named " + wanted + " on the allow-list (wire.allow)"
                                                     : ok.err().message));
      impl_->log.error("transport.peer_key", "archipelago %s: %s", impl_->cfg.self.to_string().c_str(),
                       err.message.c_str());
      return status(std::move(err));
    }
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopped) return status(make_error(errc::disconnected, "transport stopped"));
    impl_->known_peers.insert(peer);
    command c;
    c.what = command::kind::add_peer;
    c.to = {peer};
    c.endpoint = endpoint;
    c.profile_key = server_key;
    impl_->commands.push_back(std::move(c));
  }
  impl_->wake();
  return {};
}

std::uint64_t node_transport::broker_epoch() const { return impl_->broker_epoch.get(); }
void node_transport::raise_broker_epoch(std::uint64_t epoch) { impl_->broker_epoch.raise(epoch); }

envelope_builder node_transport::make_envelope(std::uint64_t round) {
  return envelope_builder(impl_->cfg.self, impl_->cfg.self_incarnation, ++*impl_->sequence, round,
                          impl_->broker_epoch.get());
}

status node_transport::send(node_address peer, encoded_message&& message) {
  return broadcast({peer}, std::move(message));
}

status node_transport::broadcast(const std::vector<node_address>& peers, encoded_message&& message) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopped) return status(make_error(errc::disconnected, "transport stopped"));
    for (node_address p : peers)
      if (!impl_->known_peers.contains(p)) {
        ++impl_->stats.unknown_peer;
        return status(make_error(errc::not_found, "no endpoint known for " + p.to_string()));
      }
    if (impl_->commands.size() >= impl_->cfg.outbox_capacity) {
      ++impl_->stats.outbox_full;
      return status(make_error(errc::overloaded, "transport outbox full (" +
                                                     std::to_string(impl_->cfg.outbox_capacity) + " messages)"));
    }
    command c;
    c.what = command::kind::send;
    c.to = peers;
    c.message = std::make_shared<const encoded_message>(std::move(message));
    impl_->commands.push_back(std::move(c));
  }
  impl_->wake();
  return {};
}

status node_transport::set_link(node_address peer, const link_profile& profile) {
  if (auto ok = validate(profile); !ok) return ok;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopped) return status(make_error(errc::disconnected, "transport stopped"));
    command c;
    c.what = command::kind::set_link;
    c.to = {peer};
    c.profile = profile;
    impl_->commands.push_back(std::move(c));
  }
  impl_->wake();
  return {};
}

void node_transport::freeze_for(nanos duration) {
  impl_->frozen_until.store(impl_->clock.now() + duration);
  impl_->wake();
}

transport_counters node_transport::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

void node_transport::stop() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;
    command stop_command;
    stop_command.what = command::kind::stop;
    impl_->commands.push_back(std::move(stop_command));  // after the sends before it (drain_on_stop)
  }
  impl_->wake();
  if (impl_->io.joinable()) impl_->io.join();
  // Sockets close here (linger 0, or what is left of the drain on control lanes with
  // messages in them), then the context terminates.
  impl_->peers.clear();
  impl_->router.reset();
  impl_->zap.reset();
}

}  // namespace archipelago::transport
