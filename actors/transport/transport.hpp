#pragma once
// The node's transport: one I/O thread owns every ZeroMQ socket of the process.
//
//   - inbound: a ROUTER socket bound to the node's endpoint (tcp:// or inproc://,
//     one code path); every message is validated by the codec, de-duplicated by
//     (sender, incarnation, sequence), counted, and handed to the local handler
//     with its frames kept alive (tensor bytes are read in place);
//   - outbound: two lanes per peer, each a DEALER socket connected to the
//     peer's endpoint: the control lane (heartbeats, Join, RoundOpen/Close,
//     Progress: every message without tensor frames) and the bulk lane
//     (fragments, contributions), so that a control message never waits behind
//     megabytes of tensors in a socket's queue or a TCP stream; callers on any
//     thread hand messages to the I/O thread through a bounded queue (full =
//     errc::overloaded, never a block);
//   - every directed link passes through a link_shaper (bandwidth, latency,
//     jitter, loss, duplication, reordering, corruption), changeable at run
//     time; bulk messages enter it in pieces (bulk_pacer), so control messages
//     wait behind one piece, not a whole fragment; on a real network each bulk
//     connection's kernel send buffer — its bytes in flight — follows the queue
//     it builds (bulk_window), so tensors queue only ~50 ms before heartbeats in
//     a shared bottleneck;
//   - heartbeats both ways on the control lane, each echoing the peer's last
//     one (the control lane's round trip, per link); liveness of `liveness`
//     intervals judged on the control lane only; reconnect of a dead peer's
//     sockets after a jittered backoff.
//
// Callbacks run on the I/O thread: they must be quick and must not call stop().

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/log.hpp"
#include "transport/codec.hpp"
#include "transport/curve_keys.hpp"
#include "transport/io_context.hpp"
#include "transport/link_shaper.hpp"
#include "transport/message_port.hpp"
#include "transport/reliability.hpp"

namespace zmq {
class message_t;
class context_t;
}

namespace archipelago::transport {

/// One ZeroMQ context per process; transports that share it can talk over inproc://.
io_context make_io_context();

/// CURVE encryption and authentication on tcp:// (inproc:// stays in the process).
struct curve_config {
  bool enabled = false;
  curve_keypair own;                              // this node's keys
  std::shared_ptr<const key_allow_list> allowed;  // client keys this node accepts
};

struct transport_config {
  std::shared_ptr<zmq::context_t> context;  // null: the transport makes its own
  node_address self;
  incarnation self_incarnation{1};
  /// Where to bind: "tcp://127.0.0.1:0" picks a free port; "inproc://name" stays in-process.
  std::string bind_endpoint = "tcp://127.0.0.1:0";
  heartbeat_config heartbeat;
  backoff_config backoff;
  decode_limits limits;
  std::size_t outbox_capacity = 1024;  // messages queued by callers, not yet taken by the I/O thread
  std::size_t peer_queue_capacity = 256;  // messages waiting for one peer's socket (HWM reached)
  int socket_hwm = 64;                 // ZeroMQ high-water mark per socket, in messages
  std::size_t bulk_piece_bytes = 64 * 1024;  // interleaving unit of a shaped link (bulk_pacer)
  int bulk_sndbuf_bytes = 0;           // SO_SNDBUF of the bulk lane's sockets, fixed; 0: see the next
  /// Over tcp://, each bulk connection's send buffer follows the queue it builds
  /// (bulk_window), queueing about this much delay; 0: the OS's autotuning.
  nanos bulk_queue_target_ns = 50'000'000;
  /// At stop, what waits on the control lanes (a learner's last Progress and Leave)
  /// still goes out for at most this long; 0: dropped.
  nanos stop_drain_ns = 1'000'000'000;
  link_profile default_link;           // applied to every new peer link
  std::uint64_t seed = 1;              // shaping and backoff jitter
  curve_config curve;
  /// Refuse (reject_reason::not_permitted) a body the sender's role may not send
  /// (role_may_send in peer_identity.hpp). On in every mesh node (transport_config_from);
  /// off for bare transports (tests, bench wire) that send any body between any two.
  bool check_roles = false;
  /// The sequence numbers of the envelopes it builds; null: a counter of its own.
  /// A node with a second transport (the broker's admin endpoint, `run --admin`) gives
  /// both one counter, so that no peer's de-duplication sees a number twice.
  std::shared_ptr<std::atomic<std::uint64_t>> sequence;
};

/// A received, validated message; its frames stay alive as long as it does.
struct inbound_message {
  std::vector<zmq::message_t> frames;
  std::unique_ptr<decoded_envelope> envelope;
  inbound_message();
  ~inbound_message();
};

/// Traffic on the link to and from one peer (valid messages only on the way in).
struct link_counters {
  std::uint64_t sent_messages = 0, sent_bytes = 0;
  std::uint64_t received_messages = 0, received_bytes = 0;
  // The control lane's round trip (heartbeat echoes), on this node's clock.
  std::uint64_t rtt_samples = 0;
  nanos rtt_last_ns = 0, rtt_max_ns = 0, rtt_sum_ns = 0;
  // The bulk connection's window (bulk_window) and the longest queueing delay it saw.
  std::size_t bulk_window_bytes = 0;
  nanos bulk_queue_delay_max_ns = 0;
};

struct transport_counters {
  std::uint64_t sent_messages = 0, sent_bytes = 0;
  std::uint64_t received_messages = 0, received_bytes = 0;
  std::uint64_t delivered = 0;         // handed to the handler
  std::uint64_t heartbeats_sent = 0, heartbeats_received = 0;
  std::uint64_t duplicates = 0, stale_incarnation = 0, too_old = 0;
  std::uint64_t rejected[static_cast<int>(reject_reason::count_)] = {};
  std::uint64_t outbox_full = 0;       // send() refused: errc::overloaded
  std::uint64_t peer_queue_full = 0;   // dropped: a peer's queue stayed full
  std::uint64_t unknown_peer = 0;      // send() to an address never added
  std::uint64_t shaped_lost = 0, shaped_duplicated = 0, shaped_corrupted = 0;
  std::uint64_t peers_died = 0, reconnects = 0;
  std::uint64_t curve_accepted = 0, curve_refused = 0;  // connection handshakes
  std::map<node_address, link_counters> links;  // per peer, heartbeats included
  std::uint64_t rejected_total() const;
};

/// The names under which the allow-list holds a node's public key, in order of
/// preference: "broker" (standbys "broker-I"), "shard-I", "learner-I" then "learner"
/// (one keypair may serve every learner, so that learners can come and go; it then
/// binds the role only), "chaos". A name is also the identity its key is bound to:
/// with CURVE on, a message whose header claims another sender than its
/// connection's key is refused (reject_reason::impersonation, peer_identity.hpp).
std::vector<std::string> curve_key_names(node_address node);

/// The transport settings of a node from the configuration knobs (wire.*, link.*).
/// With wire.curve on and a tcp:// endpoint it loads the node's keypair
/// (wire.key_file; empty: NAME.key in the wire.allow directory, by curve_key_names)
/// and allow-list (wire.allow); a missing one is invalid_input, and so is a keypair
/// whose public key the allow-list binds to another identity. A learner key shared
/// by every learner (named "learner") is accepted with `*warning` set (it binds the role only).
expected<transport_config> transport_config_from(const config& cfg, node_address self, incarnation inc,
                                                 std::string bind_endpoint, std::string* warning = nullptr);

class node_transport final : public message_port {
 public:
  using message_handler = std::function<void(std::shared_ptr<const inbound_message>)>;
  using peer_handler = std::function<void(node_address peer, bool alive)>;

  /// Binds, starts the I/O thread and returns once the endpoint is bound. `clock`
  /// and `log` (rejected messages, refused keys: rate-limited by kind) outlive it.
  static expected<std::unique_ptr<node_transport>> start(transport_config config, const clock_source& clock,
                                                         logger& log, message_handler on_message,
                                                         peer_handler on_peer = {});
  ~node_transport() override;
  node_transport(const node_transport&) = delete;
  node_transport& operator=(const node_transport&) = delete;

  /// The bound endpoint, with the port resolved ("tcp://127.0.0.1:41234").
  const std::string& endpoint() const override;
  const transport_config& config() const;
  const link_profile& default_link() const override { return config().default_link; }
  node_address self() const override { return config().self; }

  /// Registers (or re-points) a peer: its messages go to `endpoint`. With CURVE
  /// on, `server_public_z85` is the peer's public key; empty: the allow-list's
  /// key named after the peer (curve_key_names). A tcp:// peer without a key is
  /// invalid_input, also logged (the mesh's actors do not check).
  status add_peer(node_address peer, const std::string& endpoint, const std::string& server_public_z85);
  status add_peer(node_address peer, const std::string& endpoint) override { return add_peer(peer, endpoint, {}); }
  /// A builder with this node's header and the next sequence number.
  envelope_builder make_envelope(std::uint64_t round = 0) override;
  std::uint64_t broker_epoch() const override;
  void raise_broker_epoch(std::uint64_t epoch) override;
  /// Queues a message for `peer`. errc::overloaded if the outbox is full; the
  /// message is taken only when the call succeeds, so a caller can retry it.
  status send(node_address peer, encoded_message&& message) override;
  /// Sends the same message to every listed peer (fragment broadcast).
  status broadcast(const std::vector<node_address>& peers, encoded_message&& message) override;
  /// Shapes the directed link from this node to `peer` from now on.
  status set_link(node_address peer, const link_profile& profile) override;

  /// Freezes the I/O thread for `duration`, as SIGSTOP would: nothing is read
  /// or sent, heartbeats stop (peers declare this node dead), inbound messages
  /// wait in ZeroMQ's buffers and outbound ones in the outbox. The chaos
  /// monkey's pause of a learner in a one-process mesh.
  void freeze_for(nanos duration);

  transport_counters counters() const;
  /// Stops the I/O thread and closes every socket; idempotent, never hangs.
  void stop();

 private:
  struct impl;
  explicit node_transport(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace archipelago::transport
