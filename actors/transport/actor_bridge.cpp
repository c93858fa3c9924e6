#include "transport/actor_bridge.hpp"

namespace archipelago {

transport::mesh_bounds mesh_bounds_of(const mesh_setup& setup) {
  return {static_cast<std::uint32_t>(setup.cfg.mesh.learners), static_cast<std::uint32_t>(setup.shard_endpoints.size()),
          setup.brokers()};
}

void guard_actor(caf::scheduled_actor* self, node_address address, logger& log) {
  self->set_exception_handler([address, &log](caf::scheduled_actor*, std::exception_ptr& thrown) -> caf::error {
    std::string what = "an exception that is not a std::exception";
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    log.error("actor.exception", "archipelago %s: stopped by an exception in a message handler (a bug): %s",
              address.to_string().c_str(), what.c_str());
    return caf::make_error(caf::sec::runtime_error, address.to_string() + " stopped by an exception: " + what);
  });
}

std::unique_ptr<transport::node_transport> start_actor_wire(caf::scheduled_actor* self, const mesh_setup& setup,
                                                            transport::io_context io, node_address address,
                                                            incarnation inc, const std::string& endpoint,
                                                            const clock_source& clock, logger& log) {
  guard_actor(self, address, log);
  std::string warning;
  auto settings = transport::transport_config_from(setup.cfg, address, inc, endpoint, &warning);
  if (!warning.empty()) log.warn("transport.shared_key", "archipelago %s: %s", address.to_string().c_str(), warning.c_str());
  if (settings) {
    settings->context = std::move(io);
    settings->bounds = mesh_bounds_of(setup);
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
