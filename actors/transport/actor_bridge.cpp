#include "transport/actor_bridge.hpp"

namespace archipelago {

std::unique_ptr<transport::node_transport> start_actor_wire(caf::scheduled_actor* self, const config& cfg,
                                                            transport::io_context io, node_address address,
                                                            incarnation inc, const std::string& endpoint,
                                                            const clock_source& clock, logger& log) {
  std::string warning;
  auto settings = transport::transport_config_from(cfg, address, inc, endpoint, &warning);
  if (!warning.empty()) log.warn("transport.shared_key", "archipelago %s: %s", address.to_string().c_str(), warning.c_str());
  if (settings) {
    settings->context = std::move(io);
    // The handlers hold the actor handle: the shell's state owns the transport, which goes before it.
    const auto actor = caf::actor_cast<caf::actor>(self);
    auto wire = transport::node_transport::start(*settings, clock, log, deliver_to(actor), deliver_peer_events_to(actor));
    if (wire) return std::move(*wire);
    settings = wire.err();
  }
  log.error("transport.start", "archipelago %s: %s", address.to_string().c_str(), settings.err().message.c_str());
  self->quit(caf::exit_reason::user_shutdown);
  return nullptr;
}

}  // namespace archipelago
