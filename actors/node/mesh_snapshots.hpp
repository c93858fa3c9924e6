#pragma once
// Snapshot stores as a mesh uses them: opening (and recovering) the store of a
// run or a shard, the starting point of a resumed run, reading a store back.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/ids.hpp"
#include "core/mesh_setup.hpp"
#include "storage/snapshot_store.hpp"

namespace archipelago {

/// What identifies a mesh's store: its configuration, layout and policy hash.
storage::store_info store_info_of(const mesh_setup& setup);
storage::retention retention_of(const config& cfg);

struct recovered_store {
  std::shared_ptr<storage::snapshot_store> store;
  std::optional<storage::manifest> head;  // nullopt: a new store
  std::vector<std::string> dropped;       // torn or corrupt tail removed by recovery
  /// With a failing disk asked for: the store's writes pass through it (the chaos
  /// monkey's storage faults switch its error rate); null otherwise.
  std::shared_ptr<storage::faulty_kv> disk;
  std::vector<storage::fragment_state> head_states;  // the head's fragment states, read and verified once
};

/// Opens (creating it when missing) the RocksDB store in `dir` for this mesh and
/// recovers it: the newest fully valid manifest becomes the head. With
/// `failing_disk`, every write goes through a faulty_kv (error rate 0 until changed).
expected<recovered_store> open_mesh_store(const std::string& dir, const mesh_setup& setup, bool failing_disk = false);

/// Opens the store in `dir` read-only (replay); a missing, foreign or corrupt
/// directory is an error naming it. Nothing on disk changes.
expected<std::shared_ptr<storage::snapshot_store>> open_store_read_only(const std::string& dir);

/// The configuration the store's run used.
expected<config> config_of(const storage::store_info& info);

/// A manifest of the store: `version`, or the newest valid one. With `states`:
/// its fragment states too, each read once and checked against the manifest.
expected<storage::manifest> pick_manifest(const storage::snapshot_store& store, std::optional<std::uint64_t> version,
                                          std::vector<storage::fragment_state>* states = nullptr);

}  // namespace archipelago
