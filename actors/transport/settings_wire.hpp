#pragma once
// Live settings (core/live_settings.hpp) in a Welcome or a Reconfigure: a list of
// (key, value) texts, read and written here for every role.

#include <vector>

#include "core/live_settings.hpp"
#include "schemas/envelope.capnp.h"

namespace archipelago::transport {

inline std::vector<live_setting> settings_of(capnp::List<wire::Setting>::Reader list) {
  std::vector<live_setting> out;
  for (auto s : list) out.push_back({s.getKey().cStr(), s.getValue().cStr()});
  return out;
}

inline void set_settings(capnp::List<wire::Setting>::Builder list, const std::vector<live_setting>& settings) {
  for (unsigned i = 0; i < settings.size(); ++i) {
    list[i].setKey(settings[i].key);
    list[i].setValue(settings[i].value);
  }
}

}  // namespace archipelago::transport
