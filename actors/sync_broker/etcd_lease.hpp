#pragma once
// The brokers' lease in etcd (mesh.etcd), through etcd's v3 JSON API (3.4:
// POST /v3/...). Two keys under one prefix per mesh:
//   PREFIX/leader  the leading broker's epoch, attached to its lease (gone when
//                  the lease expires: the leader stopped renewing it);
//   PREFIX/epoch   the newest epoch ever granted (no lease: it outlives brokers).
// A campaign is one transaction: "leader is absent and epoch is unchanged since I
// read it" → put both with my lease. A holder renews every TTL/3 and stops
// leading at (send time of its last renewal) + TTL − margin, before etcd can have
// expired the lease (etcd counts the TTL from when the renewal arrived), so two
// brokers never lead at once while their clocks run at the same rate.
//
// A thread does the talking (blocking HTTP, each call bounded); the broker's loop
// only reads state(). The request bodies and the reading of the answers are pure
// functions (etcd_requests.hpp), tested without a server.

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

namespace httplib {
class Client;
}

namespace archipelago {

struct etcd_lease_config {
  std::vector<std::string> endpoints;  // http://host:port, tried in turn
  std::string prefix;                  // the mesh's keys: PREFIX/leader, PREFIX/epoch
  std::uint32_t broker_index = 0;
  std::int64_t ttl_s = 3;
  nanos retry_ns = 1'000'000'000;  // between campaigns, and bound of each call
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
  std::optional<std::string> post(const std::string& path, const std::string& body);
  void renew();
  void try_to_lead(std::uint64_t min_epoch);
  void revoke();

  const etcd_lease_config cfg_;
  const clock_source& clock_;
  logger& log_;
  std::size_t endpoint_ = 0;  // the one that answered last (thread only)
  std::vector<std::unique_ptr<httplib::Client>> clients_;  // per endpoint, its connection kept alive (thread only)
  std::int64_t lease_id_ = 0;  // held (thread only)
  nanos next_renewal_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::uint64_t wanted_epoch_ = 0;  // campaigning for at least this; 0: not
  bool release_ = false, stop_ = false;
  lease_state state_;
  std::thread thread_;
};

}  // namespace archipelago
