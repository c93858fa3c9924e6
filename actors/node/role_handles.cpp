#include "node/role_handles.hpp"

#include <thread>

#include "transport/actor_bridge.hpp"

namespace archipelago {
namespace {

/// One /metrics page of `actors` (the roles of this process): each is asked in
/// turn and waited for at most `bound` (a learner answers between two steps);
/// one that does not answer in time is left out and counted.
std::string scrape_metrics(caf::actor_system& sys, const std::vector<caf::actor>& actors,
                           std::chrono::milliseconds bound = std::chrono::seconds(3)) {
  auto page = std::make_shared<prometheus_text>();
  int missing = 0;
  caf::scoped_actor self{sys};
  for (const auto& a : actors) {
    if (!a) continue;
    self->request(a, bound, metrics_atom::value, page).receive([](bool) {}, [&](caf::error&) { ++missing; });
  }
  page->gauge("archipelago_scrape_missing_actors", "Actors of this process that did not answer this scrape in time.",
              missing);
  return page->str();
}

/// The broker's /status page; nullopt if it did not answer within `bound`.
std::optional<std::string> broker_status(caf::actor_system& sys, const caf::actor& broker,
                                         std::chrono::milliseconds bound = std::chrono::seconds(3)) {
  std::optional<std::string> out;
  if (!broker) return out;
  caf::scoped_actor self{sys};
  self->request(broker, bound, status_atom::value).receive([&](std::string& s) { out = std::move(s); },
                                                            [](caf::error&) {});
  return out;
}

}  // namespace

void stop_learners(caf::scoped_actor& self, const std::vector<caf::actor>& learners, const status_board& board) {
  for (const auto& a : learners) self->send(a, stop_atom::value);
  const auto total = static_cast<int>(learners.size());
  for (int waited_ms = 0; board.learners_left() < total && waited_ms < 10'000; waited_ms += 20)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

void end_actors(caf::scoped_actor& self, const std::vector<caf::actor>& actors, std::chrono::seconds bound) {
  for (const auto& a : actors) {
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  for (std::size_t i = 0; i < actors.size(); ++i)
    self->receive([](const caf::down_msg&) {}, caf::after(bound) >> [] {});
}

void served_roles::set(std::vector<caf::actor> all, caf::actor status_source) {
  std::lock_guard lock(mutex);
  roles = std::move(all);
  broker = std::move(status_source);
}

metrics_server::handlers served_roles::pages(caf::actor_system& sys, bool with_status) {
  metrics_server::handlers h;
  h.metrics = [this, &sys] {
    std::vector<caf::actor> all;
    {
      std::lock_guard lock(mutex);
      all = roles;
    }
    return scrape_metrics(sys, all);
  };
  if (with_status)
    h.status = [this, &sys] {
      caf::actor source;
      {
        std::lock_guard lock(mutex);
        source = broker;
      }
      return broker_status(sys, source);
    };
  h.nodes = [this] {
    std::string out = "[";
    if (board)
      for (const auto& e : board->entries()) out += (out.size() > 1 ? "," : "") + to_json(e.now);
    return out + "]";
  };
  return h;
}

}  // namespace archipelago
