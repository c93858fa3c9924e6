#include "core/live_settings.hpp"

#include <algorithm>

namespace archipelago {
namespace {

const knob* find_knob(std::string_view key) {
  for (const knob& k : knobs())
    if (k.key == key) return &k;
  return nullptr;
}

bool in_agreement_hash(std::string_view key) {
  constexpr std::string_view hashed[] = {"mesh.mode",  "mesh.fragments",       "mesh.shards", "mesh.inner_steps",
                                         "mesh.rounds_in_flight", "wire.encoding", "mesh.merge"};
  return std::find(std::begin(hashed), std::end(hashed), key) != std::end(hashed);
}

}  // namespace

const std::vector<std::string>& live_knobs() {
  static const std::vector<std::string> keys = {"mesh.quorum",         "mesh.grace_factor",
                                                "mesh.robust",         "mesh.robust_norm_factor",
                                                "mesh.robust_window",  "mesh.robust_screen",
                                                "mesh.robust_trim",    "mesh.robust_min_cosine",
                                                "mesh.robust_cosine_ratio", "mesh.robust_max_anchor_lag"};
  return keys;
}

expected<config> apply_live_settings(const config& current, const std::vector<live_setting>& changes) {
  if (changes.empty()) return make_error(errc::invalid_input, "no setting to change");
  config next = current;
  for (const live_setting& s : changes) {
    const auto& live = live_knobs();
    if (std::find(live.begin(), live.end(), s.key) == live.end()) {
      if (in_agreement_hash(s.key))
        return make_error(errc::invalid_input, s.key + " cannot change live: it is in the mesh agreement hash every "
                                                   "node's Join carries (restart the mesh with the new value)");
      if (find_knob(s.key) != nullptr)
        return make_error(errc::invalid_input, s.key + " cannot change live (only mesh.quorum, mesh.grace_factor and "
                                                   "mesh.robust* can)");
    }
    if (auto ok = set_knob(next, s.key, s.value); !ok) return ok.err();  // an unknown key: its own error
  }
  if (auto ok = validate_mesh(next); !ok) return ok.err();
  if (next.mesh.quorum != current.mesh.quorum && next.mesh.mode != "decoupled")
    return make_error(errc::invalid_input, "mesh.quorum cannot change live in mode " + next.mesh.mode +
                                               ": it waits for every learner (K is decoupled's)");
  return next;
}

expected<live_setting> parse_live_assignment(std::string_view text) {
  const auto eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == text.size())
    return make_error(errc::invalid_input, "'" + std::string(text) + "' is not KEY=VALUE (e.g. K=3, grace=1.5, "
                                                                      "mesh.robust=true)");
  std::string key(text.substr(0, eq));
  if (key == "K") key = "mesh.quorum";
  else if (key == "grace") key = "mesh.grace_factor";
  return live_setting{key, std::string(text.substr(eq + 1))};
}

std::vector<live_setting> live_differences(const config& base, const config& now) {
  std::vector<live_setting> out;
  for (const std::string& key : live_knobs()) {
    const knob* k = find_knob(key);
    if (k == nullptr) continue;
    if (std::string v = k->get(now); v != k->get(base)) out.push_back({key, std::move(v)});
  }
  return out;
}

std::vector<live_setting> live_values(const config& cfg) {
  std::vector<live_setting> out;
  for (const std::string& key : live_knobs())
    if (const knob* k = find_knob(key)) out.push_back({key, k->get(cfg)});
  return out;
}

std::string describe(const std::vector<live_setting>& settings) {
  std::string out;
  for (const live_setting& s : settings) out += (out.empty() ? "" : " ") + s.key + "=" + s.value;
  return out;
}

expected<std::vector<live_setting>> parse_tape_settings(std::string_view note) {
  std::vector<live_setting> out;
  constexpr std::string_view prefix = "from round ";
  while (!note.empty()) {
    const auto end = note.find("; ");
    std::string_view change = note.substr(0, end);
    note = end == std::string_view::npos ? std::string_view{} : note.substr(end + 2);
    const auto colon = change.find(": ");
    if (!change.starts_with(prefix) || colon == std::string_view::npos)
      return make_error(errc::invalid_input, "tape settings '" + std::string(change) + "': expected 'from round R: "
                                                                                        "KEY=VALUE ...'");
    change.remove_prefix(colon + 2);
    while (!change.empty()) {
      const auto space = change.find(' ');
      auto s = parse_live_assignment(change.substr(0, space));
      if (!s) return s.err();
      out.push_back(std::move(*s));
      change = space == std::string_view::npos ? std::string_view{} : change.substr(space + 1);
    }
  }
  return out;
}

}  // namespace archipelago
