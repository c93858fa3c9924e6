#include "chaos_monkey/chaos_actor.hpp"


#include "transport/actor_bridge.hpp"

namespace archipelago {
namespace {

using tick_atom = caf::atom_constant<caf::atom("tick")>;

struct chaos_state {
  chaos_actor_args args;
  std::unique_ptr<transport::node_transport> wire;
  std::unique_ptr<chaos_wire> chaos;
  nanos started_ns = 0;
  static inline const char* name = "chaos_monkey";
};
using chaos_self = caf::stateful_actor<chaos_state, caf::event_based_actor>;

std::unique_ptr<transport::node_transport> start_transport(const chaos_actor_args& a) {
  auto settings = transport::transport_config_from(a.setup->cfg, {role::chaos_monkey, 0}, incarnation{1}, a.endpoint);
  if (settings) {
    settings->context = a.io;
    // The nodes do not heartbeat back to the chaos monkey: it must never declare them dead.
    settings->heartbeat.interval_ns = 3'600'000'000'000;
    auto wire = transport::node_transport::start(*settings, *a.clock, *a.logs, [](inbound_ptr) {});
    if (wire) return std::move(*wire);
    settings = wire.err();
  }
  a.logs->error("chaos.start", "archipelago chaos monkey: %s", settings.err().message.c_str());
  return nullptr;
}

caf::behavior chaos_actor(chaos_self* self, chaos_actor_args args) {
  auto& st = self->state;
  st.args = std::move(args);
  st.wire = start_transport(st.args);
  if (!st.wire) {
    self->quit(caf::exit_reason::user_shutdown);
    return {};
  }
  st.chaos = std::make_unique<chaos_wire>(*st.args.setup, std::move(st.args.timeline), st.args.safety_ns, *st.wire,
                                          *st.args.control, *st.args.log);
  st.chaos->start();
  st.started_ns = st.args.clock->now();
  {
    std::lock_guard lock(st.args.log->mutex);
    st.args.log->started_ns = st.started_ns;
  }
  self->send(self, tick_atom::value);
  return {
      [self](tick_atom) {
        auto& st = self->state;
        const nanos now = st.args.clock->now() - st.started_ns;
        const nanos next = st.chaos->tick(now);
        if (next >= 0)
          self->delayed_send(self, std::chrono::nanoseconds(std::max<nanos>(next - now, 1'000'000)), tick_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_chaos_monkey(caf::actor_system& sys, chaos_actor_args args) {
  return sys.spawn<caf::detached>(chaos_actor, std::move(args));
}

}  // namespace archipelago
