#pragma once
// Who a CURVE key is, and what that identity may say. The allow-list names each
// public key (keygen's NAME, the .pub file's stem); the name is the identity the
// key is bound to:
//   broker | broker-0   the sync broker of index 0 (the primary)
//   broker-I            the standby broker of index I
//   shard-I             parameter shard I
//   learner-I           learner I
//   learner             any learner (one keypair shared by every learner: binds the role only)
//   chaos               the chaos monkey (any index)
//   admin               an operator's tool (`archipelago set`, any index): Reconfigure to the broker
// Any other name (or a key listed without one) binds no identity: every envelope
// it carries is refused as an impersonation. The transport takes the
// authenticated key's name from the connection (the ZAP handler's User-Id) and
// refuses an envelope whose header claims another sender (reject_reason::impersonation);
// then the body must be one the sender's role may send (role_may_send, reject_reason::not_permitted).
// Pure: no sockets, no clock.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "core/ids.hpp"
#include "schemas/envelope.capnp.h"

namespace archipelago::transport {

/// The identity a key is bound to: a role and, unless the key is shared by the
/// role (learner, chaos), one index.
struct key_identity {
  role kind = role::learner;
  std::optional<std::uint32_t> index;  // nullopt: the role only
  bool operator==(const key_identity&) const = default;
  /// keygen's name for it ("broker", "broker-1", "shard-0", "learner-3", "learner", "chaos").
  std::string name() const;
};

/// The identity a key name binds (table above); invalid_input naming the name otherwise.
expected<key_identity> identity_of_key_name(std::string_view name);

/// The key name of a node's own identity (the first of curve_key_names).
std::string key_name_of(node_address node);

/// Whether a key bound to `id` may claim to be `claimed` in an envelope header.
bool identity_admits(const key_identity& id, node_address claimed);

/// The body's name as the schema spells it ("RoundOpen"), for logs.
const char* body_name(wire::Envelope::Body::Which body);

/// Whether a node of role `sender` may send a body of this kind at all (the
/// permissions table; finer checks — the leading broker, the owning shard —
/// are the receiving role's):
///   Welcome, RoundOpen, RoundClose, BrokerState   brokers
///   FragmentUpdate                                shards
///   Progress, FetchFragment                       learners
///   Contribution                                  learners (to shards), shards (arrival notices to the broker)
///   Join                                          learners, shards, brokers (standbys)
///   ChaosCommand                                  the chaos monkey
///   Reconfigure                                   admin (to the broker), brokers (forwarded to shards)
///   Heartbeat, Leave, Error, Ack                  anyone
bool role_may_send(role sender, wire::Envelope::Body::Which body);

/// The verdict on one authenticated envelope: nullopt when admitted, else why not
/// (one line for the log; the reason is the caller's counter).
struct refusal {
  bool impersonation = false;  // false: not permitted
  std::string message;
};
/// `key_name`: the User-Id of the connection (the allow-list's name of the
/// client's key); `claimed`: the header's sender.
std::optional<refusal> check_sender(std::string_view key_name, node_address claimed,
                                    wire::Envelope::Body::Which body);

}  // namespace archipelago::transport
