#pragma once
// The brokers' lease in etcd (mesh.etcd), through etcd's v3 JSON API (3.4:
// POST /v3/...). Two keys under one prefix per mesh:
//   PREFIX/leader  the leading broker's epoch, attached to its lease (gone when
//                  the lease expires: the leader stopped renewing it);
//   PREFIX/epoch   the newest epoch ever granted (no lease: it outlives brokers).
// What to ask and when is lease_keeper's (pure, also driven by the simulation);
// this class carries its calls on a thread (blocking HTTP, each call bounded), so
// the broker's loop only reads state(). The request bodies and the reading of the
// answers are pure functions (etcd_requests.hpp), tested without a server.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "sync_broker/broker_lease.hpp"
#include "sync_broker/etcd_requests.hpp"
#include "sync_broker/lease_keeper.hpp"

namespace httplib {
class Client;
}

namespace archipelago {

struct etcd_lease_config {
  std::vector<std::string> endpoints;  // http://host:port, tried in turn
  std::string prefix;                  // the mesh's keys: PREFIX/leader, PREFIX/epoch
  lease_keeper_config keeper;          // its retry_ns also bounds each call
};

class etcd_lease final : public broker_lease {
 public:
  etcd_lease(etcd_lease_config cfg, const clock_source& clock, logger& log);
  ~etcd_lease() override;  // revokes a held lease, stops the thread
  etcd_lease(const etcd_lease&) = delete;
  etcd_lease& operator=(const etcd_lease&) = delete;

  void campaign(std::uint64_t min_epoch) override;
  void release() override;
  lease_state state() const override;

 private:
  void run();
  lease_reply carry(const lease_call& call);
  std::optional<std::string> post(const std::string& path, const std::string& body, std::string& failure);

  const etcd_lease_config cfg_;
  const clock_source& clock_;
  logger& log_;
  std::size_t endpoint_ = 0;  // the one that answered last (thread only)
  std::vector<std::unique_ptr<httplib::Client>> clients_;  // per endpoint, its connection kept alive (thread only)
  std::string last_failure_;  // said once per new failure (thread only)

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  lease_keeper keeper_;
  bool poked_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace archipelago
