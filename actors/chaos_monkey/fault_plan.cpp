#include "chaos_monkey/fault_plan.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/prng.hpp"

namespace archipelago {
namespace {

struct kind_name {
  const char* name;
  fault_kind kind;
};
constexpr kind_name kind_names[] = {
    {"crash", fault_kind::crash},         {"pause", fault_kind::pause},
    {"slow", fault_kind::slow},           {"partition", fault_kind::partition},
    {"link", fault_kind::link},           {"shard_crash", fault_kind::shard_crash},
    {"broker_crash", fault_kind::broker_crash}, {"storage_errors", fault_kind::storage_errors},
    {"broker_host_lost", fault_kind::broker_host_lost},
    {"impersonate", fault_kind::impersonate}, {"lie_tokens", fault_kind::lie_tokens},
    {"attack_scaled", fault_kind::attack_scaled}, {"attack_sign_flip", fault_kind::attack_sign_flip},
    {"attack_random", fault_kind::attack_random}, {"attack_stale", fault_kind::attack_stale},
    {"attack_sideways", fault_kind::attack_sideways},
};

std::string known_kinds() {
  std::string out;
  for (const auto& k : kind_names) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

/// Errors while reading the plan, prefixed with "origin:line: ".
struct reader {
  const std::string& origin;
  int learners, shards, standbys;

  error at(const toml::node& node, const std::string& what) const {
    return make_error(errc::invalid_input, origin + ":" + std::to_string(node.source().begin.line) + ": " + what);
  }

  expected<nanos> duration(const toml::node& node, const std::string& key) const {
    const auto text = node.value_exact<std::string>();
    if (!text) return at(node, key + " must be a duration in quotes, e.g. \"10s\" or \"500ms\"");
    auto d = parse_duration(*text);
    if (!d) return at(node, key + ": " + d.err().message);
    return d;
  }

  expected<fault_target> target(const toml::node& node, fault_kind kind) const {
    const auto text = node.value_exact<std::string>();
    if (!text) return at(node, "target must be a string such as \"learner/1\"");
    const std::string t = *text;
    fault_target out;
    if (t == "learners") {
      out.every_learner = true;
    } else if (t == "broker") {
      out.kind = role::sync_broker;
    } else if (t.starts_with("broker/")) {
      std::uint32_t index = 0;
      const auto [end, ec] = std::from_chars(t.data() + 7, t.data() + t.size(), index);
      if (ec != std::errc() || end != t.data() + t.size())
        return at(node, "unknown target '" + t + "' (learner/N, shard/N, storage/N, broker, broker/N or learners)");
      if (static_cast<int>(index) > standbys)
        return at(node, "unknown target '" + t + "': the plan has " +
                            (standbys == 0 ? std::string("no standby broker (standbys = 0)")
                                           : std::to_string(standbys) + " standby broker" + (standbys > 1 ? "s" : "") +
                                                 " (broker/1" + (standbys > 1 ? " to broker/" + std::to_string(standbys) : "") + ")"));
      out.kind = role::sync_broker;
      out.index = index;
    } else {
      const auto slash = t.find('/');
      const std::string what = t.substr(0, slash);
      std::uint32_t index = 0;
      const char* first = t.data() + (slash == std::string::npos ? t.size() : slash + 1);
      const auto [end, ec] = std::from_chars(first, t.data() + t.size(), index);
      if (slash == std::string::npos || ec != std::errc() || end != t.data() + t.size() ||
          (what != "learner" && what != "shard" && what != "storage"))
        return at(node, "unknown target '" + t + "' (learner/N, shard/N, storage/N, broker, broker/N or learners)");
      out.kind = what == "learner" ? role::learner : role::parameter_shard;
      out.index = index;
      const int bound = what == "learner" ? learners : shards;
      if (static_cast<int>(index) >= bound)
        return at(node, "unknown target '" + t + "': the mesh has " + std::to_string(bound) +
                            (what == "learner" ? " learner" : " shard") + (bound == 1 ? "" : "s"));
    }
    // The kind decides which targets make sense.
    const bool learner_kind = kind == fault_kind::crash || kind == fault_kind::pause || kind == fault_kind::slow ||
                              kind == fault_kind::impersonate || kind == fault_kind::lie_tokens || is_attack(kind);
    const bool ok = kind == fault_kind::link || kind == fault_kind::partition ||
                    (learner_kind && (out.kind == role::learner || out.every_learner)) ||
                    (kind == fault_kind::shard_crash && out.kind == role::parameter_shard) ||
                    (kind == fault_kind::storage_errors && out.kind == role::parameter_shard) ||
                    // A broker crash restarts the primary; a standby's process faults are not drilled (yet).
                    ((kind == fault_kind::broker_crash || kind == fault_kind::broker_host_lost) &&
                     out.kind == role::sync_broker && out.index == 0);
    if (!ok) return at(node, std::string("a ") + to_string(kind) + " fault cannot target '" + t + "'");
    return out;
  }

  expected<double> probability(const toml::node& node, const std::string& key, double max) const {
    const auto v = node.value<double>();
    if (!v || !std::isfinite(*v) || *v < 0 || *v > max)
      return at(node, key + " must be a number in [0, " + (max == 1 ? std::string("1") : std::string("1e9")) + "]");
    return *v;
  }

  expected<planned_fault> fault(const toml::table& t) const {
    planned_fault f;
    f.line = static_cast<int>(t.source().begin.line);
    bool factor_given = false;
    const toml::node* kind = t.get("kind");
    if (!kind) return at(t, "a [[fault]] needs kind = \"...\" (" + known_kinds() + ")");
    const auto kind_text = kind->value_exact<std::string>();
    const auto* found = std::find_if(std::begin(kind_names), std::end(kind_names),
                                     [&](const kind_name& k) { return kind_text && *kind_text == k.name; });
    if (found == std::end(kind_names))
      return at(*kind, "unknown fault kind '" + kind_text.value_or("?") + "' (" + known_kinds() + ")");
    f.kind = found->kind;

    const toml::node* at_node = t.get("at");
    if (!at_node) return at(t, "a [[fault]] needs at = \"...\" (its time from the start)");
    auto when = duration(*at_node, "at");
    if (!when) return when.err();
    f.at_ns = *when;
    if (const toml::node* d = t.get("for"); d && f.kind == fault_kind::broker_host_lost) {
      return at(*d, "a broker_host_lost fault has no for: its host is gone and the primary is never restarted "
                    "(a standby takes over)");
    } else if (d) {
      auto length = duration(*d, "for");
      if (!length) return length.err();
      f.for_ns = *length;
    } else if (f.kind != fault_kind::broker_crash && f.kind != fault_kind::shard_crash &&
               f.kind != fault_kind::broker_host_lost) {
      return at(t, std::string("a ") + to_string(f.kind) + " fault needs for = \"...\" (when it is repaired)");
    }

    if (const toml::node* e = t.get("every"); e && f.kind == fault_kind::broker_host_lost) {
      return at(*e, "a broker_host_lost fault cannot repeat (every): a host is lost once");
    } else if (e) {
      auto period = duration(*e, "every");
      if (!period) return period.err();
      if (*period < f.for_ns || *period <= 0)
        return at(*e, "every must be longer than the fault's for (a fault repeats only after its repair)");
      f.every_ns = *period;
    }

    for (auto&& [key, value] : t) {
      const std::string k(key.str());
      if (k == "kind" || k == "at" || k == "for" || k == "every") continue;
      if (k == "target") {
        auto target = this->target(value, f.kind);
        if (!target) return target.err();
        f.targets.push_back(*target);
      } else if (k == "factor" && (f.kind == fault_kind::slow || f.kind == fault_kind::lie_tokens)) {
        const auto v = value.value<double>();
        if (!v || !std::isfinite(*v) || *v < 1 || *v > 1000) return at(value, "factor must be a number in [1, 1000]");
        f.factor = *v;
      } else if (k == "as" && f.kind == fault_kind::impersonate) {
        auto as = this->target(value, fault_kind::link);  // any one node
        if (!as) return as.err();
        if (as->every_learner) return at(value, "as must name one node: broker, shard/N or learner/N");
        f.as = *as;
      } else if (k == "factor" && f.kind == fault_kind::attack_scaled) {
        const auto v = value.value<double>();
        if (!v || !std::isfinite(*v) || std::fabs(*v) > 1e6)
          return at(value, "factor must be a number in [-1e6, 1e6]");
        f.factor = *v;
        factor_given = true;
      } else if (k == "factor" && f.kind == fault_kind::attack_sideways) {
        const auto v = value.value<double>();
        if (!v || !(*v >= 0 && *v < 1)) return at(value, "factor (the cosine with the honest delta) must be in [0, 1)");
        f.factor = *v;
        factor_given = true;
      } else if (f.kind == fault_kind::link &&
                 (k == "loss" || k == "duplicate" || k == "reorder" || k == "corrupt" || k == "delay_ms" ||
                  k == "bandwidth_mbit")) {
        const bool rate = k == "loss" || k == "duplicate" || k == "reorder" || k == "corrupt";
        auto v = probability(value, k, rate ? 1 : 1e9);
        if (!v) return v.err();
        double* field = k == "loss" ? &f.link.loss : k == "duplicate" ? &f.link.duplicate : k == "reorder" ? &f.link.reorder
                        : k == "corrupt" ? &f.link.corrupt : k == "delay_ms" ? &f.link.delay_ms : &f.link.bandwidth_mbit;
        *field = *v;
      } else if (k == "groups" && f.kind == fault_kind::partition) {
        const auto* groups = value.as_array();
        if (!groups || groups->size() < 2) return at(value, "groups must list at least two groups of targets");
        for (const auto& g : *groups) {
          const auto* members = g.as_array();
          if (!members || members->empty()) return at(g, "each group must be a non-empty list of targets");
          std::vector<fault_target> group;
          for (const auto& m : *members) {
            auto target = this->target(m, f.kind);
            if (!target) return target.err();
            group.push_back(*target);
          }
          f.groups.push_back(std::move(group));
        }
      } else {
        return at(value, "'" + k + "' is not a setting of a " + to_string(f.kind) + " fault");
      }
    }
    if (f.kind == fault_kind::attack_scaled && !factor_given) f.factor = 1000;
    if (f.kind == fault_kind::attack_sideways && !factor_given) f.factor = 0.1;
    if (f.kind == fault_kind::partition ? f.groups.empty() : f.targets.empty())
      return at(t, std::string("a ") + to_string(f.kind) + " fault needs " +
                       (f.kind == fault_kind::partition ? "groups = [[...], [...]]" : "target = \"...\""));
    return f;
  }
};

}  // namespace

const char* to_string(fault_kind k) {
  for (const auto& n : kind_names)
    if (n.kind == k) return n.name;
  return "?";
}

std::string fault_target::to_string() const {
  if (every_learner) return "learners";
  if (kind == role::sync_broker) return index == 0 ? "broker" : "broker/" + std::to_string(index);
  return std::string(kind == role::learner ? "learner/" : "shard/") + std::to_string(index);
}

expected<nanos> parse_duration(std::string_view text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  double scale = 0;
  if (unit == "ms") scale = 1e6;
  else if (unit == "s") scale = 1e9;
  else if (unit == "m") scale = 60e9;
  else if (unit == "h") scale = 3600e9;
  if (ec != std::errc() || scale == 0 || !std::isfinite(value))
    return make_error(errc::invalid_input, "malformed time '" + std::string(text) +
                                               "' (a number and a unit: ms, s, m or h, e.g. \"1.5s\")");
  if (value < 0) return make_error(errc::invalid_input, "negative time '" + std::string(text) + "'");
  if (value * scale > 1e18) return make_error(errc::invalid_input, "time '" + std::string(text) + "' is too long");
  return static_cast<nanos>(std::llround(value * scale));
}

expected<fault_plan_spec> parse_fault_plan(std::string_view toml_text, const std::string& origin, int learners,
                                           int shards) {
  toml::table root;
  try {  // Debian's toml++ is built with exceptions; they stop here.
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    return make_error(errc::invalid_input,
                      origin + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
  fault_plan_spec plan;
  // First: the faults' targets name the standbys (broker/N), and a table's keys come in name order.
  if (const toml::node* n = root.get("standbys")) {
    const auto v = n->value_exact<std::int64_t>();
    if (!v || *v < 0 || *v > max_plan_standbys)
      return make_error(errc::invalid_input, origin + ":" + std::to_string(n->source().begin.line) +
                                                 ": standbys must be an integer in [0, " +
                                                 std::to_string(max_plan_standbys) + "]");
    plan.standbys = static_cast<int>(*v);
  }
  const reader r{origin, learners, shards, plan.standbys};
  for (auto&& [key, value] : root) {
    const std::string k(key.str());
    if (k == "standbys") continue;
    if (k == "seed") {
      const auto v = value.value_exact<std::int64_t>();
      if (!v || *v < 0) return r.at(value, "seed must be a non-negative integer");
      plan.seed = static_cast<std::uint64_t>(*v);
    } else if (k == "duration" || k == "liveness") {
      auto d = r.duration(value, k);
      if (!d) return d.err();
      (k == "duration" ? plan.duration_ns : plan.liveness_ns) = *d;
    } else if (k == "fault") {
      const auto* faults = value.as_array();
      if (!faults) return r.at(value, "fault must be an array of tables: [[fault]]");
      for (const auto& entry : *faults) {
        const auto* table = entry.as_table();
        if (!table) return r.at(entry, "each [[fault]] must be a table");
        auto f = r.fault(*table);
        if (!f) return f.err();
        plan.schedule.push_back(std::move(*f));
      }
    } else if (k == "pass") {
      const auto* table = value.as_table();
      if (!table) return r.at(value, "pass must be a [pass] table");
      for (auto&& [pk, pv] : *table) {
        const auto v = pv.value<double>();
        if (pk.str() != "participation")
          return r.at(pv, "'" + std::string(pk.str()) + "' is not a criterion of [pass] (participation)");
        if (!v || !(*v >= 0 && *v <= 1)) return r.at(pv, "participation must be a number in [0, 1]");
        plan.min_participation = *v;
      }
    } else if (k == "rates") {
      const auto* table = value.as_table();
      if (!table) return r.at(value, "rates must be a [rates] table");
      for (auto&& [rk, rv] : *table) {
        const std::string name(rk.str());
        if (name == "kinds") {
          const auto* kinds = rv.as_array();
          if (!kinds) return r.at(rv, "kinds must be a list such as [\"crash\", \"pause\"]");
          for (const auto& kv : *kinds) {
            const auto text = kv.value_exact<std::string>();
            const auto* found = std::find_if(std::begin(kind_names), std::end(kind_names),
                                             [&](const kind_name& n) { return text && *text == n.name; });
            if (found == std::end(kind_names) ||
                (found->kind != fault_kind::crash && found->kind != fault_kind::pause && found->kind != fault_kind::slow))
              return r.at(kv, "unknown or unsupported random fault kind '" + text.value_or("?") +
                                  "' (rates draw crash, pause or slow)");
            plan.rates.kinds.push_back(found->kind);
          }
        } else if (name == "learner_mtbf" || name == "repair_min" || name == "repair_max") {
          auto d = r.duration(rv, name);
          if (!d) return d.err();
          (name == "learner_mtbf" ? plan.rates.learner_mtbf_ns
           : name == "repair_min" ? plan.rates.repair_min_ns
                                  : plan.rates.repair_max_ns) = *d;
        } else {
          return r.at(rv, "'" + name + "' is not a setting of [rates] (kinds, learner_mtbf, repair_min, repair_max)");
        }
      }
      if (plan.rates.repair_max_ns < plan.rates.repair_min_ns)
        return r.at(value, "repair_max must not be below repair_min");
      if (plan.rates.learner_mtbf_ns > 0 && plan.rates.kinds.empty()) plan.rates.kinds = {fault_kind::crash};
    } else {
      return r.at(value, "unknown plan key '" + k + "' (seed, duration, liveness, standbys, [[fault]], [rates], [pass])");
    }
  }
  if (plan.duration_ns <= 0) return make_error(errc::invalid_input, origin + ": the plan needs duration = \"...\" > 0");
  auto at_line = [&](int line, const std::string& what) {
    return make_error(errc::invalid_input, origin + ":" + std::to_string(line) + ": " + what);
  };
  for (const auto& f : plan.schedule)
    if (f.at_ns > plan.duration_ns) return at_line(f.line, "the fault starts after the plan's duration");
  for (const auto& lost : plan.schedule) {
    if (lost.kind != fault_kind::broker_host_lost) continue;
    if (plan.standbys == 0)
      return at_line(lost.line, "a broker_host_lost fault needs a standby to take over: set standbys = 1 (or more) "
                                "at the top of the plan");
    // The primary is gone for good: nothing can crash or lose it again.
    for (const auto& f : plan.schedule)
      if (&f != &lost && (f.kind == fault_kind::broker_crash || f.kind == fault_kind::broker_host_lost) &&
          (f.every_ns > 0 || f.at_ns + f.for_ns >= lost.at_ns))
        return at_line(f.line, std::string("a ") + to_string(f.kind) + " of the primary " +
                                   (f.every_ns > 0 ? "repeating" : "at or after its host is lost") + " (line " +
                                   std::to_string(lost.line) + "): it is never restarted");
  }
  // The timeline's size, before anything is expanded: repeating faults once per
  // period, per learner for "learners"; [rates] at twice its mean (the Poisson
  // count of a plan at the bound exceeds that with a negligible probability).
  double faults = 0;
  for (const auto& f : plan.schedule) {
    const double times = f.every_ns > 0 ? std::floor(static_cast<double>(plan.duration_ns - f.at_ns) /
                                                     static_cast<double>(f.every_ns)) + 1
                                        : 1;
    faults += times * (f.targets.size() == 1 && f.targets[0].every_learner ? learners : 1);
  }
  const double drawn = plan.rates.learner_mtbf_ns > 0 ? static_cast<double>(learners) *
                                                            static_cast<double>(plan.duration_ns) /
                                                            static_cast<double>(plan.rates.learner_mtbf_ns)
                                                      : 0;
  if (faults + 2 * drawn > static_cast<double>(max_plan_faults)) {
    char text[256];
    std::snprintf(text, sizeof text,
                  ": the plan expands to about %.0f faults (%.0f scheduled, %.0f drawn from [rates]: duration / "
                  "learner_mtbf x %d learners); at most %zu: shorten duration or lengthen every / learner_mtbf",
                  faults + drawn, faults, drawn, learners, max_plan_faults);
    return make_error(errc::invalid_input, origin + text);
  }
  return plan;
}

std::vector<planned_fault> expand_fault_plan(const fault_plan_spec& plan, int learners) {
  std::vector<planned_fault> out, schedule;
  for (const auto& f : plan.schedule)  // a repeating fault: once per period within the safety phase
    for (nanos t = f.at_ns; t < plan.duration_ns || t == f.at_ns; t += f.every_ns) {
      schedule.push_back(f);
      schedule.back().at_ns = t;
      if (f.every_ns <= 0) break;
    }
  for (const auto& f : schedule) {
    if (f.targets.size() == 1 && f.targets[0].every_learner) {
      for (int i = 0; i < learners; ++i) {
        planned_fault one = f;
        one.targets = {fault_target{role::learner, static_cast<std::uint32_t>(i), false}};
        out.push_back(std::move(one));
      }
    } else {
      out.push_back(f);
    }
  }
  if (plan.rates.learner_mtbf_ns > 0)
    for (int i = 0; i < learners; ++i) {
      // One stream per learner: adding a learner does not move the others' faults.
      prng rng(plan.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(i) + 1);
      double t = 0;
      while (out.size() < max_plan_faults) {
        t += -std::log(1 - rng.uniform()) * static_cast<double>(plan.rates.learner_mtbf_ns);
        if (t >= static_cast<double>(plan.duration_ns)) break;
        planned_fault f;
        f.at_ns = static_cast<nanos>(t);
        f.kind = plan.rates.kinds[rng.below(plan.rates.kinds.size())];
        f.targets = {fault_target{role::learner, static_cast<std::uint32_t>(i), false}};
        const double span = static_cast<double>(plan.rates.repair_max_ns - plan.rates.repair_min_ns);
        f.for_ns = plan.rates.repair_min_ns + static_cast<nanos>(rng.uniform() * span);
        f.factor = f.kind == fault_kind::slow ? 2 : 1;
        out.push_back(std::move(f));
        t += static_cast<double>(out.back().for_ns);  // the next fault of this learner comes after its repair
      }
    }
  std::stable_sort(out.begin(), out.end(), [](const planned_fault& a, const planned_fault& b) {
    if (a.at_ns != b.at_ns) return a.at_ns < b.at_ns;
    if (a.line != b.line) return a.line < b.line;
    return !a.targets.empty() && !b.targets.empty() && a.targets[0].index < b.targets[0].index;
  });
  return out;
}

}  // namespace archipelago
