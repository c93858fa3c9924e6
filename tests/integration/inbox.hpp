#pragma once
// Test helpers shared by the transport integration tests: an inbox that
// collects what a transport delivers, and a fast-heartbeat configuration.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "transport/transport.hpp"

namespace archipelago::transport::testing {

/// Collects delivered messages and peer events; waits with a deadline.
struct inbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::shared_ptr<const inbound_message>> messages;
  std::vector<std::pair<node_address, bool>> events;

  node_transport::message_handler handler() {
    return [this](std::shared_ptr<const inbound_message> m) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(std::move(m));
      changed.notify_all();
    };
  }
  node_transport::peer_handler peer_handler() {
    return [this](node_address a, bool alive) {
      std::lock_guard<std::mutex> lock(mutex);
      events.emplace_back(a, alive);
      changed.notify_all();
    };
  }
  template <class Pred>
  bool wait_for(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, limit, [&] { return pred(); });
  }
};

/// Heartbeats every 50 ms (dead after 150 ms), reconnects from 20 ms: tests stay fast.
inline transport_config fast_config(node_address self, std::string endpoint, std::uint64_t inc = 1) {
  transport_config c;
  c.self = self;
  c.self_incarnation = incarnation{inc};
  c.bind_endpoint = std::move(endpoint);
  c.heartbeat.interval_ns = 50'000'000;
  c.backoff.initial_ns = 20'000'000;
  c.backoff.max_ns = 200'000'000;
  return c;
}

}  // namespace archipelago::transport::testing
