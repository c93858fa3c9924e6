#include "node/mesh_snapshots.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "core/checksum.hpp"
#include "core/clock.hpp"

namespace archipelago {

storage::store_info store_info_of(const mesh_setup& setup) {
  storage::store_info info;
  info.created_ns = wall_clock_ns();
  info.config_toml = to_toml(setup.cfg);
  info.layout_fingerprint = setup.layout.fingerprint();
  info.mesh_hash = mesh_agreement_hash(setup.cfg);
  info.param_floats = setup.layout.total_floats;
  return info;
}

storage::retention retention_of(const config& cfg) {
  return {static_cast<std::uint64_t>(cfg.storage.keep_last), static_cast<std::uint64_t>(cfg.storage.keep_every),
          static_cast<std::uint64_t>(cfg.storage.keep_mb) << 20};
}

expected<recovered_store> open_mesh_store(const std::string& dir, const mesh_setup& setup, bool failing_disk) {
  // Never create a store among someone else's files.
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec) && !std::filesystem::is_empty(dir, ec) &&
      !std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", ec))
    return make_error(errc::invalid_input, dir + " is a directory with other files in it, not a snapshot store");
  auto kv = storage::open_rocksdb(dir, {storage::open_mode::create, setup.cfg.storage.sync});
  if (!kv) return kv.err();
  recovered_store out;
  std::shared_ptr<storage::kv_store> disk(std::move(*kv));
  if (failing_disk) disk = out.disk = std::make_shared<storage::faulty_kv>(std::move(disk), storage::fault_plan{});
  auto store = storage::snapshot_store::create(std::move(disk), store_info_of(setup), retention_of(setup.cfg));
  if (!store) return make_error(store.err().code, dir + ": " + store.err().message);
  out.store = *store;
  auto head = out.store->recover(&out.dropped, &out.head_states);
  if (!head) return make_error(head.err().code, dir + ": " + head.err().message);
  out.head = std::move(*head);
  return out;
}

namespace {

/// Whether another process holds RocksDB's lock on the store (a live writer): RocksDB
/// locks `LOCK` with fcntl, which F_GETLK reports without taking it.
bool writer_holds_lock(const std::string& dir) {
  const int fd = ::open((std::filesystem::path(dir) / "LOCK").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  const bool held = ::fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != F_UNLCK;
  ::close(fd);
  return held;
}

/// open_rocksdb's errors name the directory already; the store's do not.
std::string with_dir(const std::string& dir, const std::string& message) {
  return message.find(dir) == std::string::npos ? dir + ": " + message : message;
}

}  // namespace

expected<std::shared_ptr<storage::snapshot_store>> open_store_read_only(const std::string& dir) {
  // A secondary opened while its writer creates, starts or recovers the store
  // (RocksDB writes CURRENT and the families, replays the WAL into new tables and
  // swaps its MANIFEST) can see no store, an empty one or a half-named one; that
  // settles within moments. So while a live writer holds the store, a failed open
  // is retried a bounded number of times; without a writer the first answer is final.
  constexpr int attempts = 10;
  constexpr auto pause = std::chrono::milliseconds(200);
  for (int attempt = 1;; ++attempt) {
    auto kv = storage::open_rocksdb(dir, {storage::open_mode::read_only, false});
    if (kv) {
      auto store = storage::snapshot_store::open(std::shared_ptr<storage::kv_store>(std::move(*kv)));
      if (store) return store;
      kv = store.err();
    }
    if (!writer_holds_lock(dir)) return make_error(kv.err().code, with_dir(dir, kv.err().message));
    if (attempt == attempts)
      return make_error(kv.err().code, with_dir(dir, kv.err().message) + " (its writer is live, and the store did not settle in " +
                                           std::to_string(attempts * pause.count()) + " ms)");
    std::this_thread::sleep_for(pause);
  }
}

expected<config> config_of(const storage::store_info& info) {
  config cfg;
  if (auto ok = apply_toml(cfg, info.config_toml, "the store's configuration"); !ok) return ok.err();
  return cfg;
}

expected<storage::manifest> pick_manifest(const storage::snapshot_store& store, std::optional<std::uint64_t> version,
                                          std::vector<storage::fragment_state>* states) {
  if (version) {
    auto m = store.read_manifest(*version);
    if (!m || !states) return m;
    states->clear();
    for (const auto& e : m->entries) {
      auto f = store.read_fragment(e.fragment, e.version);
      if (!f) return f.err();
      if (checksum64(f->theta.data(), f->theta.size() * sizeof(float)) != e.theta_checksum)
        return make_error(errc::corrupt_data, "fragment " + std::to_string(e.fragment) + " version " +
                                                  std::to_string(e.version) + " differs from its manifest's checksum");
      states->push_back(std::move(*f));
    }
    return m;
  }
  auto latest = store.latest_valid_manifest(nullptr, states);
  if (!latest) return latest.err();
  if (!*latest) return make_error(errc::not_found, "the store holds no complete snapshot");
  return std::move(**latest);
}

}  // namespace archipelago
