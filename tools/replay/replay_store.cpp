// Opening a store for replay, and its manifests: list, show, check.

#include <set>

#include "core/checksum.hpp"
#include "node/mesh_snapshots.hpp"
#include "replay/replay.hpp"

namespace archipelago {
namespace {

std::map<std::uint64_t, storage::eval_record> evals_of(const storage::snapshot_store& store) {
  std::map<std::uint64_t, storage::eval_record> out;
  (void)store.for_each_eval([&](const storage::eval_record& e) {
    out[e.mesh_version] = e;
    return true;
  });
  return out;
}

double eval_loss_of(const std::map<std::uint64_t, storage::eval_record>& evals, std::uint64_t version) {
  const auto e = evals.find(version);
  return e == evals.end() ? std::nan("") : e->second.eval_loss;
}

/// One manifest's checks against the one before it; its fragment states read once each.
void check_manifest(const replay_store& s, std::uint64_t key, check_result& r,
                    std::set<std::pair<std::uint32_t, std::uint64_t>>& checked) {
  auto m = s.store->read_manifest(key);
  if (!m) {
    r.errors.push_back(m.err().message);
    return;
  }
  ++r.manifests;
  const std::string at = "mesh version " + std::to_string(key);
  if (m->mesh_version != key)
    r.errors.push_back("manifest under key " + std::to_string(key) + " says version " + std::to_string(m->mesh_version));
  if (m->mesh_version <= r.head)
    r.errors.push_back("mesh version " + std::to_string(m->mesh_version) + " after " + std::to_string(r.head));
  r.head = m->mesh_version;
  if (m->mesh_hash != s.store->info().mesh_hash)
    r.errors.push_back("version " + std::to_string(key) + " was written by a mesh with another policy");
  for (const auto& e : m->entries) {
    auto before = r.head_versions.find(e.fragment);
    if (before != r.head_versions.end() && e.version < before->second)
      r.errors.push_back("fragment " + std::to_string(e.fragment) + " goes back from version " +
                         std::to_string(before->second) + " to " + std::to_string(e.version) + " in " + at);
    r.head_versions[e.fragment] = e.version;
    if (!checked.insert({e.fragment, e.version}).second) continue;
    auto f = s.store->read_fragment(e.fragment, e.version);
    ++r.fragment_states;
    if (!f) r.errors.push_back(at + ": " + f.err().message);
    else if (checksum64(f->theta.data(), f->theta.size() * 4) != e.theta_checksum)
      r.errors.push_back(at + ": fragment " + std::to_string(e.fragment) + " version " + std::to_string(e.version) +
                         " differs from the manifest's checksum");
  }
}

}  // namespace

expected<replay_store> open_replay(const std::string& db) {
  auto store = open_store_read_only(db);
  if (!store) return store.err();
  auto cfg = config_of((*store)->info());
  if (!cfg) return make_error(errc::corrupt_data, db + ": " + cfg.err().message);
  auto policy = resolve_policy(*cfg);
  if (!policy) return make_error(errc::corrupt_data, db + ": the stored configuration: " + policy.err().message);
  replay_store out{*store, *cfg, make_mesh_setup(*cfg, *policy)};
  if (out.setup.layout.fingerprint() != out.store->info().layout_fingerprint)
    return make_error(errc::unsupported, db + ": its model layout differs from this build's reading of its "
                                              "configuration (written by another version?)");
  return out;
}

expected<std::vector<version_row>> list_versions(const replay_store& s) {
  const auto evals = evals_of(*s.store);
  std::vector<version_row> rows;
  auto ok = s.store->for_each_manifest([&](const storage::manifest& m) {
    rows.push_back({m.mesh_version, m.time_ns, m.entries.size(), m.ledger.processed, m.learner_steps,
                    eval_loss_of(evals, m.mesh_version)});
    return true;
  });
  if (!ok) return ok.err();
  return rows;
}

expected<version_detail> show_version(const replay_store& s, std::uint64_t version) {
  auto m = s.store->read_manifest(version);
  if (!m) return m.err();
  const double loss = eval_loss_of(evals_of(*s.store), m->mesh_version);
  return version_detail{std::move(*m), loss};
}

expected<check_result> check_store(const replay_store& s) {
  check_result r;
  std::set<std::pair<std::uint32_t, std::uint64_t>> checked;
  // Keys first, so that one undecodable manifest does not hide the others.
  std::vector<std::uint64_t> keys;
  if (auto ok = s.store->kv().scan(storage::column::manifests, {}, {}, [&](std::string_view key, std::string_view) {
        keys.push_back(storage::read_be64(key));
        return true;
      });
      !ok)
    return ok.err();
  for (std::uint64_t key : keys) check_manifest(s, key, r, checked);
  if (auto ok = s.store->for_each_tape([&](const storage::tape_record&) { return ++r.tape_records, true; }); !ok)
    r.errors.push_back(ok.err().message);
  if (auto l = s.store->ledgers(); !l) r.errors.push_back(l.err().message);
  return r;
}

}  // namespace archipelago
