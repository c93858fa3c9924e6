#pragma once
// Where the transport meets CAF: every role's actor shell starts its node
// transport here, with inbound messages and peer events delivered to its
// mailbox. An inbound message travels as a shared pointer (frames and decoded
// view together), so a fragment of megabytes reaches the actor without a copy;
// the type is local to the process and never serialised by CAF. Also the atoms
// every shell answers.

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/prometheus_text.hpp"
#include "transport/transport.hpp"

namespace archipelago {
/// A page an actor adds its metrics to (metrics_atom) while the asker waits for its answer.
using metrics_page = std::shared_ptr<prometheus_text>;
}  // namespace archipelago

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const archipelago::transport::inbound_message>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(archipelago::metrics_page)

namespace archipelago {

using inbound_ptr = std::shared_ptr<const transport::inbound_message>;

/// (peer_atom, role as uint8, index, alive): a peer fell silent or speaks again.
using peer_atom = caf::atom_constant<caf::atom("peer")>;
/// (metrics_atom, metrics_page) → true: the actor adds its figures to the page (GET /metrics).
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
/// (status_atom) → std::string: the broker's view of the mesh as one JSON object (GET /status).
using status_atom = caf::atom_constant<caf::atom("status")>;
/// (report_atom) → true: the broker's final report is on its status board.
using report_atom = caf::atom_constant<caf::atom("report")>;
/// A learner leaves after its current step (its last Progress and contributions go out first).
using stop_atom = caf::atom_constant<caf::atom("stop")>;
/// (pause_atom, nanos): a learner freezes, wire included (the one-process mesh's SIGSTOP).
using pause_atom = caf::atom_constant<caf::atom("pause")>;
/// (values_atom) → (fragments, values): a shard's current Θ of its fragments.
using values_atom = caf::atom_constant<caf::atom("values")>;

/// A message handler that delivers every inbound message to `actor`'s mailbox.
/// The handler holds the actor handle: stop the transport before the actor system goes down.
inline transport::node_transport::message_handler deliver_to(caf::actor actor) {
  return [actor](inbound_ptr message) { caf::anon_send(actor, std::move(message)); };
}

/// A peer handler that tells `actor` (peer_atom) when a peer falls silent or speaks
/// again: any message counts, heartbeats included, which the actors never see.
inline transport::node_transport::peer_handler deliver_peer_events_to(caf::actor actor) {
  return [actor](node_address peer, bool alive) {
    caf::anon_send(actor, peer_atom::value, static_cast<std::uint8_t>(peer.kind), peer.index, alive);
  };
}

/// Starts the node transport of `self` as `address` (incarnation `inc`), bound
/// to `endpoint`, sharing `io` with the other transports of the process
/// (inproc:// needs one context); inbound messages and peer events go to
/// `self`'s mailbox. On failure it logs why, ends the actor and returns null.
/// `clock` and `log` outlive the transport.
std::unique_ptr<transport::node_transport> start_actor_wire(caf::scheduled_actor* self, const config& cfg,
                                                            transport::io_context io, node_address address,
                                                            incarnation inc, const std::string& endpoint,
                                                            const clock_source& clock, logger& log);

}  // namespace archipelago
