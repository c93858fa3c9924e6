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
