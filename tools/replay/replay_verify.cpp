// The round tape, and the bit-for-bit re-application of every recorded merge.

#include <algorithm>
#include <climits>

#include "core/checksum.hpp"
#include "parameter_shard/shard_snapshots.hpp"
#include "parameter_shard/shard_wire.hpp"
#include "replay/replay.hpp"

namespace archipelago {
namespace {

/// What to compare each replayed version against: its stored state, and every manifest naming it.
struct stored_truth {
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> named;  // (fragment, version) → checksum
  std::map<std::uint32_t, std::vector<std::uint64_t>> states;              // fragment → stored versions
};

expected<stored_truth> read_truth(const replay_store& s) {
  stored_truth t;
  if (auto ok = s.store->for_each_manifest([&](const storage::manifest& m) {
        for (const auto& e : m.entries) t.named[{e.fragment, e.version}] = e.theta_checksum;
        return true;
      });
      !ok)
    return ok.err();
  auto stored = s.store->fragment_versions();
  if (!stored) return stored.err();
  for (const auto& [p, v] : *stored) t.states[p].push_back(v);
  return t;
}

/// Whether the core's fragment `p` at version `v` equals what the store says of
/// it: a manifest's checksum of it, its stored state, or both. A version the
/// store says something of counts once in `compared`.
expected<bool> matches(const replay_store& s, const stored_truth& t, const shard_core& core, std::uint32_t p,
                       std::uint64_t v, std::size_t& compared) {
  const auto named = t.named.find({p, v});
  const auto& versions = t.states.at(p);
  const bool stored = std::binary_search(versions.begin(), versions.end(), v);
  if (named == t.named.end() && !stored) return true;
  ++compared;
  const auto& theta = core.value({p});
  if (named != t.named.end() && named->second != checksum64(theta.data(), theta.size() * 4)) return false;
  if (!stored) return true;
  auto f = s.store->read_fragment(p, v);
  if (!f) return f.err();
  const auto state = core.outer_state({p});
  return f->theta == *state.theta && f->momentum == *state.momentum && f->adam_m == state.adam_m &&
         f->adam_v == state.adam_v;
}

/// Replays fragment p's recorded merges from the newest stored state before the first.
status verify_fragment(const replay_store& s, const stored_truth& t, std::uint32_t p,
                       const std::vector<std::uint64_t>& recorded, verify_result& r) {
  const auto& versions = t.states.at(p);
  const std::string name = "fragment " + std::to_string(p);
  std::optional<std::uint64_t> start;
  for (std::uint64_t v : versions)
    if (v < recorded.front()) start = v;
  if (!start) {
    r.failures.push_back(name + ": no stored state before its first recorded merge (version " +
                         std::to_string(recorded.front()) + ")");
    return {};
  }
  auto base = s.store->read_fragment(p, *start);
  if (!base) return base.err();
  shard_config sc = shard_settings(s.setup);
  sc.max_contributions_per_round = SIZE_MAX;
  sc.robust.screening = false;  // the recorded members passed the shard's screening (clipped ones as clipped)
  const std::vector<float> zeros(s.setup.layout.total_floats, 0.f);
  shard_core core(s.setup.layout, s.setup.plan, {{p}}, sc, zeros.data());
  if (auto ok = core.restore({p}, outer_state_of(std::move(*base))); !ok) return ok.err();
  ++r.fragments;
  const std::uint64_t last = recorded.back();
  r.unrecorded += static_cast<std::size_t>(std::count_if(versions.begin(), versions.end(),
                                                         [last](std::uint64_t v) { return v > last; }));
  for (std::uint64_t v = *start + 1; v <= last; ++v) {
    auto m = s.store->read_merge(p, v);
    if (!m) {
      r.failures.push_back(name + ": " + m.err().message + " (the chain breaks there)");
      return {};
    }
    std::vector<learner_ref> members;
    for (auto& rc : m->contributions) {
      const learner_ref who{{rc.learner}, incarnation{rc.incarnation}};
      members.push_back(who);
      (void)core.on_contribution(round_number{m->round}, {p}, who, rc.steps, rc.tokens, std::move(rc.delta));
    }
    auto published = core.on_round_close(round_number{m->round}, {p}, members);
    if (!published || !*published || (*published)->version != v) {
      r.failures.push_back(name + " version " + std::to_string(v) + ": the recorded contributions do not produce a new version");
      return {};
    }
    ++r.merges;
    auto same = matches(s, t, core, p, v, r.compared);
    if (!same) return same.err();
    if (!*same) {
      r.failures.push_back(name + " version " + std::to_string(v) + ": replayed value differs from the stored one");
      return {};
    }
  }
  return {};
}

}  // namespace

expected<std::vector<storage::tape_record>> tape_rounds(const replay_store& s, std::uint64_t from, std::uint64_t to) {
  std::vector<storage::tape_record> out;
  auto ok = s.store->for_each_tape([&](const storage::tape_record& t) {
    if (t.round >= from && t.round <= to) out.push_back(t);
    return true;
  });
  if (!ok) return ok.err();
  return out;
}

expected<verify_result> verify_merges(const replay_store& s, const std::string& db) {
  auto truth = read_truth(s);
  if (!truth) return truth.err();
  verify_result r;
  for (const auto& [p, versions] : truth->states) {
    auto recorded = s.store->merge_versions(p);
    if (!recorded) return recorded.err();
    if (recorded->empty()) continue;
    if (auto ok = verify_fragment(s, *truth, p, *recorded, r); !ok) return ok.err();
  }
  if (r.fragments == 0 && r.failures.empty())
    return make_error(errc::invalid_input,
                      db + " has no recorded contributions: record a run with `run --db DIR --record-contributions`");
  return r;
}

}  // namespace archipelago
