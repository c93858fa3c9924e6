#pragma once
// Identifiers shared by every role. Strong types keep a learner index from being
// passed where a fragment index is expected.

#include <cstdint>
#include <compare>
#include <string>

namespace archipelago {

enum class role : std::uint8_t { learner, sync_broker, parameter_shard, chaos_monkey, admin };

inline const char* to_string(role r) {
  switch (r) {
    case role::learner: return "learner";
    case role::sync_broker: return "sync_broker";
    case role::parameter_shard: return "parameter_shard";
    case role::chaos_monkey: return "chaos_monkey";
    case role::admin: return "admin";
  }
  return "unknown";
}

template <class Tag, class Rep>
struct strong_id {
  Rep value{};
  constexpr auto operator<=>(const strong_id&) const = default;
};

using learner_index = strong_id<struct learner_tag, std::uint32_t>;
using fragment_index = strong_id<struct fragment_tag, std::uint32_t>;
using round_number = strong_id<struct round_tag, std::uint64_t>;
/// Incremented each time a node process (re)starts; tells a rejoin from a duplicate.
using incarnation = strong_id<struct incarnation_tag, std::uint64_t>;

/// A learner as one incarnation of it: work of an older incarnation never counts for a newer one.
struct learner_ref {
  learner_index learner;
  incarnation inc;
  constexpr auto operator<=>(const learner_ref&) const = default;
};

/// One addressable actor in the mesh: role plus index within the role.
struct node_address {
  role kind = role::learner;
  std::uint32_t index = 0;
  constexpr auto operator<=>(const node_address&) const = default;
  std::string to_string() const {
    return std::string(archipelago::to_string(kind)) + "/" + std::to_string(index);
  }
};

}  // namespace archipelago
