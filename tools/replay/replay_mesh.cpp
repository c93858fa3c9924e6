// One view of a whole mesh over its stores: the shards' (fragments, manifests)
// and the broker's (tape), matched into cuts (replay.hpp has the definition).

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <set>
#include <string_view>

#include "core/checksum.hpp"
#include "replay/replay.hpp"

namespace archipelago {
namespace {

namespace fs = std::filesystem;

bool is_store(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "CURRENT", ec) || fs::exists(dir / "LOCK", ec);  // LOCK alone: a store being created
}

/// The first line where two configurations differ, for the refusal's message.
std::string first_difference(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    const std::size_t ei = std::min(a.find('\n', i), a.size()), ej = std::min(b.find('\n', j), b.size());
    const std::string la = a.substr(i, ei - i), lb = b.substr(j, ej - j);
    if (la != lb) return "'" + la + "' vs '" + lb + "'";
    i = ei + 1;
    j = ej + 1;
  }
  return "(none)";
}

/// A store's configuration without the knobs that are each node's own (its key
/// file: every node of a mesh has its own identity), so two nodes of one mesh agree.
std::string mesh_wide(const std::string& config_toml) {
  std::string out;
  std::size_t i = 0;
  while (i < config_toml.size()) {
    const std::size_t end = std::min(config_toml.find('\n', i), config_toml.size());
    const std::string_view line(config_toml.data() + i, end - i);
    if (line.rfind("key_file =", 0) != 0) out.append(line).push_back('\n');
    i = end + 1;
  }
  return out;
}

/// Refuses a store of another mesh than `first`'s, naming both and what differs.
status same_mesh(const std::string& first_db, const storage::store_info& first, const std::string& db,
                 const storage::store_info& info) {
  std::string what;
  if (info.layout_fingerprint != first.layout_fingerprint) what = "their model layouts differ";
  else if (info.mesh_hash != first.mesh_hash) what = "their mesh policies differ (mode, fragments, shards, inner steps, encoding)";
  else if (info.param_floats != first.param_floats) what = "their parameter counts differ";
  else if (mesh_wide(info.config_toml) != mesh_wide(first.config_toml))
    what = "their configurations differ: " + first_difference(mesh_wide(first.config_toml), mesh_wide(info.config_toml));
  if (what.empty()) return {};
  return make_error(errc::invalid_input, first_db + " and " + db + " are stores of different runs: " + what);
}

/// The fragment versions of `part`'s fragments, in its fragment order.
std::vector<std::uint64_t> key_of(const mesh_part& part, const std::vector<std::uint64_t>& versions) {
  std::vector<std::uint64_t> key;
  key.reserve(part.fragments.size());
  for (std::uint32_t p : part.fragments) key.push_back(versions[p]);
  return key;
}

struct part_index {
  std::map<std::vector<std::uint64_t>, const storage::manifest*> by_versions;
  std::vector<storage::manifest> manifests;  // ascending mesh version
};

expected<std::vector<part_index>> index_parts(const mesh_view& v) {
  std::vector<part_index> out(v.parts.size());
  for (std::size_t i = 0; i < v.parts.size(); ++i) {
    auto ok = v.parts[i].store.store->for_each_manifest([&](const storage::manifest& m) {
      out[i].manifests.push_back(m);
      return true;
    });
    if (!ok) return make_error(ok.err().code, v.parts[i].db + ": " + ok.err().message);
    for (const auto& m : out[i].manifests) {
      std::vector<std::uint64_t> key;
      for (const auto& e : m.entries) key.push_back(e.version);
      out[i].by_versions[key] = &m;  // several manifests of one cut: the newest wins
    }
  }
  return out;
}

void fill_from_manifests(const mesh_view& v, const std::vector<part_index>& idx, mesh_cut& c) {
  for (std::size_t i = 0; i < v.parts.size(); ++i) {
    if (!c.manifests[i]) continue;
    auto it = std::find_if(idx[i].manifests.begin(), idx[i].manifests.end(),
                           [&](const storage::manifest& m) { return m.mesh_version == *c.manifests[i]; });
    if (it == idx[i].manifests.end()) continue;
    c.time_ns = std::max(c.time_ns, it->time_ns);
    c.tokens = std::max(c.tokens, it->ledger.processed);
    c.learner_steps = std::max(c.learner_steps, it->learner_steps);
  }
}

}  // namespace

bool mesh_cut::complete(const mesh_view& v) const {
  if (!v.missing.empty()) return false;
  return std::all_of(manifests.begin(), manifests.end(), [](const auto& m) { return m.has_value(); });
}

std::string mesh_cut::name() const {
  if (!given.empty()) return given;
  return tape_seq ? std::to_string(*tape_seq) : "head";
}

std::string missing_of(const mesh_view& v, const mesh_cut& c) {
  std::string out;
  if (!v.missing.empty()) {
    std::set<std::uint32_t> shards;
    for (std::uint32_t p : v.missing) shards.insert(v.setup.shard_of_fragment[p]);
    out = "no store given holds the fragments of shard";
    for (std::uint32_t s : shards) out += " " + std::to_string(s);
  }
  for (std::size_t i = 0; i < v.parts.size(); ++i)
    if (!c.manifests[i]) out += std::string(out.empty() ? "" : "; ") + v.parts[i].db + " kept no manifest of this cut";
  return out;
}

expected<std::vector<std::string>> expand_store_dirs(const std::vector<std::string>& dbs) {
  std::vector<std::string> out;
  for (const auto& db : dbs) {
    std::error_code ec;
    if (is_store(db) || !fs::is_directory(db, ec)) {  // a missing path: open_rocksdb names it
      out.push_back(db);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(db, ec))
      if (entry.is_directory() && is_store(entry.path())) found.push_back(entry.path().string());
    if (ec) return make_error(errc::io_error, "cannot list " + db + ": " + ec.message());
    if (found.empty())
      return make_error(errc::not_found, "no archipelago store at " + db +
                                             " (no RocksDB CURRENT file in it or in any directory in it)");
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  std::vector<std::string> unique = out;
  std::sort(unique.begin(), unique.end());
  if (std::adjacent_find(unique.begin(), unique.end()) != unique.end())
    return make_error(errc::invalid_input, "a store is given twice: " + *std::adjacent_find(unique.begin(), unique.end()));
  return out;
}

expected<mesh_view> open_mesh_view(const std::vector<std::string>& dbs) {
  if (dbs.empty()) return make_error(errc::invalid_input, "no store given (--db DIR)");
  mesh_view v;
  std::optional<storage::store_info> first;
  for (const auto& db : dbs) {
    auto s = open_replay(db);
    if (!s) return s.err();
    // Every store against the first: one mesh, one configuration.
    if (!first) {
      first = s->store->info();
      v.cfg = s->cfg;
      v.setup = s->setup;
    } else if (auto ok = same_mesh(dbs.front(), *first, db, s->store->info()); !ok) {
      return ok.err();
    }
    mesh_part part{db, *s, {}, 0};
    std::set<std::uint32_t> fragments;
    auto ok = s->store->for_each_manifest([&](const storage::manifest& m) {
      ++part.manifests;
      if (m.learner_steps > 0 || m.ledger.processed > 0) v.manifest_counts = true;
      for (const auto& e : m.entries) fragments.insert(e.fragment);
      return true;
    });
    if (!ok) return make_error(ok.err().code, db + ": " + ok.err().message);
    part.fragments.assign(fragments.begin(), fragments.end());
    std::vector<storage::tape_record> tape;
    if (auto t = s->store->for_each_tape([&](const storage::tape_record& r) {
          tape.push_back(r);
          return true;
        });
        !t)
      return make_error(t.err().code, db + ": " + t.err().message);
    if (part.fragments.empty()) {
      v.broker_dbs.push_back(db);  // a broker's (its tape, possibly empty yet: a standby's)
    } else {
      v.parts.push_back(std::move(part));
    }
    if (!tape.empty() && tape.size() > v.tape.size()) {
      v.tape = std::move(tape);
      v.tape_db = db;
    }
  }
  std::sort(v.parts.begin(), v.parts.end(),
            [](const mesh_part& a, const mesh_part& b) { return a.fragments.front() < b.fragments.front(); });
  const std::size_t fragments = v.setup.fragments();
  v.owner.assign(fragments, -1);
  for (std::size_t i = 0; i < v.parts.size(); ++i)
    for (std::uint32_t p : v.parts[i].fragments) {
      if (p >= fragments)
        return make_error(errc::corrupt_data, v.parts[i].db + ": its manifests name fragment " + std::to_string(p) +
                                                  ", the model has " + std::to_string(fragments));
      if (v.owner[p] >= 0)
        return make_error(errc::invalid_input, v.parts[static_cast<std::size_t>(v.owner[p])].db + " and " +
                                                   v.parts[i].db + " both hold fragment " + std::to_string(p) +
                                                   ": two shards' stores of different runs, or one run's store twice");
      v.owner[p] = static_cast<int>(i);
    }
  for (std::uint32_t p = 0; p < fragments; ++p)
    if (v.owner[p] < 0) v.missing.push_back(p);
  // The shards' versions against the broker's tape: a version made in another
  // round than the tape says is another run's (same configuration, other history).
  if (!v.tape.empty()) {
    std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> taped;  // (fragment, version) → round
    for (const auto& t : v.tape) taped[{t.fragment, t.version}] = t.round;
    for (const auto& part : v.parts) {
      std::string bad;
      auto ok = part.store.store->for_each_manifest([&](const storage::manifest& m) {
        for (const auto& e : m.entries) {
          auto it = taped.find({e.fragment, e.version});
          if (it != taped.end() && e.round != 0 && it->second != e.round) {
            bad = part.db + " holds fragment " + std::to_string(e.fragment) + " version " + std::to_string(e.version) +
                  " made in round " + std::to_string(e.round) + ", the broker's tape in " + v.tape_db +
                  " has it made in round " + std::to_string(it->second) + ": stores of different runs";
            return false;
          }
        }
        return true;
      });
      if (!ok) return make_error(ok.err().code, part.db + ": " + ok.err().message);
      if (!bad.empty()) return make_error(errc::invalid_input, bad);
    }
  }
  return v;
}

expected<std::vector<mesh_cut>> list_cuts(const mesh_view& v) {
  auto idx = index_parts(v);
  if (!idx) return idx.err();
  std::vector<mesh_cut> out;
  std::vector<std::uint64_t> versions(v.setup.fragments(), 0);
  auto match = [&](std::size_t i) -> std::optional<std::uint64_t> {
    auto it = (*idx)[i].by_versions.find(key_of(v.parts[i], versions));
    if (it == (*idx)[i].by_versions.end()) return std::nullopt;
    return it->second->mesh_version;
  };
  std::vector<std::optional<std::uint64_t>> current(v.parts.size());
  for (std::size_t i = 0; i < v.parts.size(); ++i) current[i] = match(i);
  // The work the tape's merges carried, per fragment (node shards' manifests record none).
  std::vector<std::uint64_t> merged_tokens(versions.size(), 0), merged_steps(versions.size(), 0);
  auto emit = [&](std::uint64_t seq, std::int64_t tape_ns) {
    if (std::none_of(current.begin(), current.end(), [](const auto& m) { return m.has_value(); })) return;
    if (!out.empty() && out.back().manifests == current && out.back().versions == versions) return;
    mesh_cut c;
    c.tape_seq = seq;
    c.versions = versions;
    c.manifests = current;
    c.time_ns = tape_ns;
    fill_from_manifests(v, *idx, c);
    if (!v.manifest_counts && !versions.empty()) {
      std::uint64_t tokens = 0, steps = 0;
      for (std::size_t p = 0; p < versions.size(); ++p) tokens += merged_tokens[p], steps += merged_steps[p];
      const auto learners = static_cast<std::uint64_t>(std::max(1, v.cfg.mesh.learners));
      c.tokens = tokens / versions.size();
      c.learner_steps = steps / versions.size() / learners;
    }
    out.push_back(std::move(c));
  };
  emit(0, 0);
  for (const auto& t : v.tape) {
    if (t.fragment >= versions.size() || t.version <= versions[t.fragment]) continue;
    versions[t.fragment] = t.version;
    for (const auto& m : t.members) merged_tokens[t.fragment] += m.tokens, merged_steps[t.fragment] += m.steps;
    if (v.owner[t.fragment] >= 0) {
      const auto i = static_cast<std::size_t>(v.owner[t.fragment]);
      current[i] = match(i);
    }
    emit(t.sequence, t.committed_ns);
  }
  // The head: every shard store's newest manifest.
  mesh_cut head;
  head.head = true;
  head.versions.assign(v.setup.fragments(), 0);
  head.manifests.resize(v.parts.size());
  for (std::size_t i = 0; i < v.parts.size(); ++i) {
    if ((*idx)[i].manifests.empty()) continue;
    const storage::manifest& m = (*idx)[i].manifests.back();
    head.manifests[i] = m.mesh_version;
    for (const auto& e : m.entries) head.versions[e.fragment] = e.version;
  }
  fill_from_manifests(v, *idx, head);
  head.counts_known = v.manifest_counts;  // a head the tape did not see: only the manifests know
  for (auto it = out.rbegin(); it != out.rend(); ++it)
    if (it->manifests == head.manifests) {
      it->head = true;
      return out;
    }
  out.push_back(std::move(head));
  return out;
}

namespace {

/// The cut "V0,V1,...": every fragment at the version named, complete when each
/// shard's store kept a manifest naming exactly those versions of its fragments.
expected<mesh_cut> cut_of_versions(const mesh_view& v, const std::string& text) {
  mesh_cut c;
  c.given = text;
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    std::uint64_t version = 0;
    const auto [end, ec] = std::from_chars(text.data() + pos, text.data() + comma, version);
    if (ec != std::errc{} || end != text.data() + comma)
      return make_error(errc::invalid_input, "cut '" + text + "': '" + text.substr(pos, comma - pos) +
                                                 "' is not a version (expected one per fragment: V0,V1,...)");
    c.versions.push_back(version);
    pos = comma + 1;
  }
  if (c.versions.size() != v.setup.fragments())
    return make_error(errc::invalid_input, "cut '" + text + "' names " + std::to_string(c.versions.size()) +
                                               " versions, the model has " + std::to_string(v.setup.fragments()) +
                                               " fragments");
  auto idx = index_parts(v);
  if (!idx) return idx.err();
  c.manifests.resize(v.parts.size());
  for (std::size_t i = 0; i < v.parts.size(); ++i)
    if (auto it = (*idx)[i].by_versions.find(key_of(v.parts[i], c.versions)); it != (*idx)[i].by_versions.end())
      c.manifests[i] = it->second->mesh_version;
  fill_from_manifests(v, *idx, c);
  c.counts_known = v.manifest_counts;
  if (!c.complete(v)) return make_error(errc::not_found, "cut " + text + " is incomplete: " + missing_of(v, c));
  return c;
}

}  // namespace

expected<mesh_cut> find_cut(const mesh_view& v, const std::string& which) {
  if (which.find(',') != std::string::npos) return cut_of_versions(v, which);
  auto cuts = list_cuts(v);
  if (!cuts) return cuts.err();
  const mesh_cut* found = nullptr;
  if (which == "head") {
    for (const auto& c : *cuts)
      if (c.head) found = &c;
  } else if (which == "newest") {
    for (const auto& c : *cuts)
      if (c.tape_seq && c.complete(v)) found = &c;
    if (!found) return make_error(errc::not_found, "no complete cut on the tape (see `replay list`)");
  } else {
    std::uint64_t seq = 0;
    const auto [end, ec] = std::from_chars(which.data(), which.data() + which.size(), seq);
    if (ec != std::errc{} || end != which.data() + which.size())
      return make_error(errc::invalid_input, "cut '" + which + "': expected a number from `replay list` or head");
    // Cut k is the newest listed cut at or before tape record k, if the tape did not change it since.
    for (const auto& c : *cuts)
      if (c.tape_seq && *c.tape_seq == seq) found = &c;
    if (!found)
      return make_error(errc::not_found, "no store keeps cut " + which + " (see `replay list`: the cuts some store kept)");
  }
  if (!found) return make_error(errc::not_found, "the stores hold no manifest");
  if (!found->complete(v))
    return make_error(errc::not_found, "cut " + found->name() + " is incomplete: " + missing_of(v, *found));
  return *found;
}

expected<std::vector<storage::fragment_state>> states_of(const mesh_view& v, const mesh_cut& c) {
  if (!c.complete(v)) return make_error(errc::not_found, "cut " + c.name() + " is incomplete: " + missing_of(v, c));
  std::vector<storage::fragment_state> states;
  for (std::size_t i = 0; i < v.parts.size(); ++i) {
    const auto& part = v.parts[i];
    auto m = part.store.store->read_manifest(*c.manifests[i]);
    if (!m) return make_error(m.err().code, part.db + ": " + m.err().message);
    for (const auto& e : m->entries) {
      auto f = part.store.store->read_fragment(e.fragment, e.version);
      if (!f) return make_error(f.err().code, part.db + ": " + f.err().message);
      const fragment_spec& spec = v.setup.plan.fragments[e.fragment];
      if (f->theta.size() != spec.floats)
        return make_error(errc::corrupt_data, part.db + ": fragment " + std::to_string(e.fragment) + " version " +
                                                  std::to_string(e.version) + " has " + std::to_string(f->theta.size()) +
                                                  " values, the model's fragment " + std::to_string(spec.floats));
      if (checksum64(f->theta.data(), f->theta.size() * 4) != e.theta_checksum)
        return make_error(errc::corrupt_data, part.db + ": fragment " + std::to_string(e.fragment) + " version " +
                                                  std::to_string(e.version) + " differs from its manifest's checksum");
      states.push_back(std::move(*f));
    }
  }
  std::sort(states.begin(), states.end(), [](const auto& a, const auto& b) { return a.fragment < b.fragment; });
  return states;
}

expected<std::vector<float>> params_of(const mesh_view& v, const mesh_cut& c) {
  auto states = states_of(v, c);
  if (!states) return states.err();
  std::vector<float> params(v.setup.layout.total_floats, 0.f);
  for (const auto& f : *states)
    storage::scatter_fragment(v.setup.layout, v.setup.plan.fragments[f.fragment], f.theta.data(), params.data());
  return params;
}

}  // namespace archipelago
