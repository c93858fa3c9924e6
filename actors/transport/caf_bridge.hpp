#pragma once
// Hands inbound messages from the transport's I/O thread to CAF actors. The
// message travels as a shared pointer (frames and decoded view together), so a
// fragment of megabytes reaches the actor without a copy; the type is local to
// the process and never serialised by CAF.

#include <caf/all.hpp>

#include <memory>

#include "transport/transport.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const archipelago::transport::inbound_message>)

namespace archipelago::transport {

using inbound_ptr = std::shared_ptr<const inbound_message>;

/// A message handler that delivers every inbound message to `actor`'s mailbox.
/// The handler holds the actor handle: stop and destroy the transport before the
/// actor system goes down.
inline node_transport::message_handler deliver_to(caf::actor actor) {
  return [actor](inbound_ptr message) { caf::anon_send(actor, std::move(message)); };
}

using peer_atom = caf::atom_constant<caf::atom("peer")>;

/// A peer handler that tells `actor` (peer_atom, role as uint8, index, alive)
/// when a peer falls silent or speaks again: any message counts, heartbeats
/// included, which the actors never see.
inline node_transport::peer_handler deliver_peer_events_to(caf::actor actor) {
  return [actor](node_address peer, bool alive) {
    caf::anon_send(actor, peer_atom::value, static_cast<std::uint8_t>(peer.kind), peer.index, alive);
  };
}

}  // namespace archipelago::transport
