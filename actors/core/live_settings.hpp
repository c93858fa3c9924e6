#pragma once
// Knobs a running mesh may change (`archipelago set`, the Reconfigure message):
// mesh.quorum and mesh.grace_factor (the broker's), mesh.robust* (the shards').
// A change is checked like a config file (set_knob, validate_mesh) against the
// configuration in force; a knob in the mesh agreement hash (mode, fragments,
// shards, inner_steps, rounds_in_flight, wire.encoding, merge) is refused: every
// node's Join carries the hash, so changing it means restarting the mesh. Any
// other knob is refused too, naming those that can change. Pure.

#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"

namespace archipelago {

struct live_setting {
  std::string key, value;
  bool operator==(const live_setting&) const = default;
};

/// The knobs a running mesh may change, in a fixed order.
const std::vector<std::string>& live_knobs();

/// `current` with `changes` applied in order; invalid_input naming the first knob
/// that cannot change live or whose value a config file could not hold either.
expected<config> apply_live_settings(const config& current, const std::vector<live_setting>& changes);

/// "K=3" / "grace=1.5" shorthands and "mesh.quorum=3" assignments → settings.
expected<live_setting> parse_live_assignment(std::string_view text);

/// The live knobs whose values differ between `base` (the mesh's start) and `now`:
/// what a Welcome carries, so a (re)joining node takes the values in force.
std::vector<live_setting> live_differences(const config& base, const config& now);
/// Every live knob with its value in `cfg`: what the broker forwards to the shards on a change.
std::vector<live_setting> live_values(const config& cfg);

/// "mesh.quorum=3 mesh.grace_factor=1.5".
std::string describe(const std::vector<live_setting>& settings);

/// The changes a tape record's note holds (TapeRecord.settings: "from round R: KEY=VALUE ...",
/// several joined by "; "), in the order they were made; invalid_input for text not in that form.
expected<std::vector<live_setting>> parse_tape_settings(std::string_view note);

}  // namespace archipelago
