#pragma once
// What every node of a mesh must agree on, derived from the configuration:
// the model layout, the fragment plan, which shard owns which fragment, the
// initial parameters and where each node listens.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/ids.hpp"
#include "core/layout.hpp"

namespace zmq {
class context_t;
}

namespace archipelago {

/// The mesh has one sync broker, at this address.
inline constexpr node_address broker_address{role::sync_broker, 0};

struct mesh_setup {
  std::shared_ptr<zmq::context_t> io_context;  // one per process: inproc:// needs it shared
  config cfg;
  model_shape shape;
  param_layout layout;
  fragment_plan plan;
  std::vector<std::uint32_t> shard_of_fragment;
  std::string broker_endpoint;
  std::vector<std::string> shard_endpoints;
  std::vector<std::string> learner_endpoints;
};

/// Live figures the actors update and the progress line reads.
struct mesh_stats {
  std::atomic<std::uint64_t> rounds_closed{0}, published{0}, versions{0};
  std::atomic<std::uint64_t> steps{0}, tokens{0}, merged_tokens{0}, late{0}, rejected{0};
  std::atomic<std::uint64_t> members{0};      // summed over closed rounds
  std::atomic<std::uint64_t> bytes_sent{0};   // contributions and fragment broadcasts
  std::atomic<int> learners_done{0};
};

}  // namespace archipelago
