#pragma once
// What every node of a mesh must agree on, derived from the configuration: the
// model layout, the fragment plan, which shard owns which fragment and where
// each node listens. Every role is given one; nothing in it changes while the
// mesh runs.

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/ids.hpp"
#include "core/layout.hpp"

namespace archipelago {

/// The primary sync broker. Standbys (node --role broker --standby) are brokers 1, 2, ...;
/// one broker leads at a time, the one its epoch names.
inline constexpr node_address broker_address{role::sync_broker, 0};
inline constexpr node_address broker_at(std::uint32_t index) { return {role::sync_broker, index}; }

/// A broker epoch: its incarnation when it began to lead, with its index in the low
/// byte, so that epochs are totally ordered, two brokers never share one, and an
/// epoch names its leader. A broker that takes over picks one above every epoch
/// it heard of (Header.brokerEpoch).
inline constexpr std::uint32_t max_brokers = 256;
inline constexpr std::uint64_t broker_epoch_of(std::uint64_t incarnation, std::uint32_t broker) {
  return incarnation << 8 | (broker & 0xff);
}
inline constexpr std::uint32_t leader_of_epoch(std::uint64_t epoch) { return static_cast<std::uint32_t>(epoch & 0xff); }

struct mesh_setup {
  config cfg;
  sync_policy policy;
  model_shape shape;
  param_layout layout;
  fragment_plan plan;
  std::vector<std::uint32_t> shard_of_fragment;
  std::string broker_endpoint;                   // the primary's
  std::vector<std::string> standby_endpoints;    // brokers 1, 2, ...: their endpoints in order
  std::vector<std::string> shard_endpoints;
  std::vector<std::string> learner_endpoints;
  /// The primary broker also listens here, for operators (`archipelago set`), when its
  /// own endpoint is in-process (`run --admin`): tcp:// with CURVE, Reconfigure only. Empty: not.
  std::string admin_endpoint;
  std::int64_t start_step = 0;  // a resumed run: where the learners' schedule starts
  std::int64_t stop_step = -1;  // the learners leave at this step of the schedule; -1: at train.steps
  std::int64_t last_step() const { return stop_step >= 0 ? stop_step : cfg.train.steps; }

  std::size_t fragments() const { return plan.fragments.size(); }
  std::uint32_t brokers() const { return static_cast<std::uint32_t>(1 + standby_endpoints.size()); }
  const std::string& broker_endpoint_of(std::uint32_t broker) const {
    return broker == 0 ? broker_endpoint : standby_endpoints.at(broker - 1);
  }
  /// The fragments parameter shard `shard` owns, ascending.
  std::vector<fragment_index> fragments_of(std::uint32_t shard) const;
};

/// Everything a mesh agrees on but the endpoints, from the configuration and
/// its resolved policy (resolve_policy(cfg)).
mesh_setup make_mesh_setup(const config& cfg, const sync_policy& policy);

}  // namespace archipelago
