// The CAF 0.17 actor system as the mesh will use it: a bounded scheduler, a
// request/response round trip, a monitor seeing an actor die, and a shutdown
// that returns (~actor_system waits for every actor; a hang here is a bug).

#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <chrono>

namespace {

using add_atom = caf::atom_constant<caf::atom("add")>;

struct counter_state {
  int total = 0;
  static inline const char* name = "counter";
};

caf::behavior counter(caf::stateful_actor<counter_state>* self) {
  return {[=](add_atom, int x) {
    self->state.total += x;
    return self->state.total;
  }};
}

}  // namespace

TEST_CASE("actor system: request/response, monitor, clean shutdown") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  auto actor = sys.spawn(counter);
  caf::scoped_actor self{sys};
  int last = 0;
  for (int i = 1; i <= 10; ++i) {
    self->request(actor, std::chrono::seconds(5), add_atom::value, i)
        .receive([&](int total) { last = total; },
                 [&](caf::error& err) { FAIL("request failed: " << sys.render(err)); });
  }
  CHECK(last == 55);

  self->monitor(actor);
  self->send_exit(actor, caf::exit_reason::user_shutdown);
  bool down = false;
  self->receive([&](caf::down_msg& dm) {
    down = true;
    CHECK(dm.reason == caf::exit_reason::user_shutdown);
  });
  CHECK(down);
}

#include "../test_log.hpp"
#include "transport/actor_bridge.hpp"

TEST_CASE("transport delivers inbound messages to a CAF actor without copying the tensor") {
  using namespace archipelago;
  using namespace archipelago::transport;
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  steady_clock_source clock;
  {
    auto context = make_io_context();
    transport_config a_cfg, b_cfg;
    a_cfg.context = b_cfg.context = context;
    a_cfg.self = {role::parameter_shard, 0};
    a_cfg.bind_endpoint = "inproc://caf-shard";
    b_cfg.self = {role::learner, 0};
    b_cfg.bind_endpoint = "inproc://caf-learner";
    auto a = node_transport::start(a_cfg, clock, archipelago::test_logging::test_log(), deliver_to(caf::actor_cast<caf::actor>(self)));
    auto b = node_transport::start(b_cfg, clock, archipelago::test_logging::test_log(), {});
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE((*b)->add_peer(a_cfg.self, (*a)->endpoint()));
    std::vector<float> values(1 << 18, 2.0f);
    auto builder = (*b)->make_envelope(1);
    builder.body().initContribution().setFragment(0);
    REQUIRE(builder.add_tensor_values("fragment/0", values.data(), values.size(), tensor_encoding::fp32));
    REQUIRE((*b)->send(a_cfg.self, builder.finish()));
    bool got = false;
    self->receive(
        [&](const inbound_ptr& m) {
          got = true;
          CHECK(m->envelope->tensor_count() == 1);
          // The decoded view points into the received ZeroMQ frame itself.
          CHECK(m->envelope->tensor_bytes(0).data == static_cast<const std::uint8_t*>(m->frames[1].data()));
        },
        caf::after(std::chrono::seconds(5)) >> [] {});
    CHECK(got);
  }  // transports (and the actor handle in the handler) go before the actor system
}
