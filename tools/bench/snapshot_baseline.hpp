#pragma once
// bench snapshot's baselines: a kv store that records what the snapshot store
// writes (the puts the baseline repeats), and plain RocksDB writing and reading
// the same bytes with the store's own options (storage/rocksdb_options.hpp), so
// that the two differ by the snapshot layer only. Only snapshot_baseline.cpp
// sees RocksDB's headers.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/bench_hooks.hpp"
#include "bench/snapshot_bench.hpp"
#include "storage/kv_store.hpp"

namespace archipelago {

struct put_shape {
  storage::column col;
  std::string key;  // keys are short: kept, so the baseline's keys sort (and compact) as the store's
  std::size_t value_bytes = 0;
};
struct batch_shape {
  std::vector<put_shape> puts;
  std::size_t deletes = 0;
  std::uint64_t bytes() const;
};

/// Forwards to another kv store and records every successful batch's puts
/// (column, key, value size): what the baseline writes again. Also sums
/// the time spent in the inner store's write().
class recording_kv final : public storage::kv_store {
 public:
  explicit recording_kv(std::unique_ptr<storage::kv_store> inner) : inner_(std::move(inner)) {}

  status write(const storage::write_batch& batch) override;
  /// Recorded as write() records (the baseline writes every batch through RocksDB's log).
  status write_unlogged(const storage::write_batch& batch) override;
  expected<std::optional<std::string>> get(storage::column c, std::string_view key) const override {
    return inner_->get(c, key);
  }
  status scan(storage::column c, std::string_view from, std::string_view to,
              const std::function<bool(std::string_view, std::string_view)>& visit) const override {
    return inner_->scan(c, from, to, visit);
  }
  expected<std::optional<std::pair<std::string, std::string>>> last(storage::column c) const override {
    return inner_->last(c);
  }
  status flush() override { return inner_->flush(); }
  status flush_memtables() override { return inner_->flush_memtables(); }

  /// The batches recorded since the last call.
  std::vector<batch_shape> take();
  /// Seconds spent in the inner store's write() since the last call.
  double take_write_seconds();

 private:
  status record(const storage::write_batch& batch, bool unlogged);

  std::unique_ptr<storage::kv_store> inner_;
  std::mutex mutex_;
  std::vector<batch_shape> batches_;
  double write_seconds_ = 0;
};

/// The same puts (keys and value sizes, one WriteBatch per commit) into a new
/// plain RocksDB database at `path` — into its default column family, or with
/// `store_families` into the same families as the store's; the setup batches
/// are written untimed first. Returns the seconds of the timed batches and the
/// final log flush.
expected<double> plain_write_sample(const std::vector<batch_shape>& setup_batches, const std::vector<batch_shape>& timed,
                                    bool sync, bool store_families, const std::string& path, const bench_hooks& hooks,
                                    const std::string& label);

/// Plain RocksDB: open the store's directory read-only and copy every value of
/// the fragments column family into `buffer` (block checksums verified, as the
/// store reads); adds its open and read times to `out`. The buffer is allocated
/// and touched beforehand, so that the page faults of fresh memory do not count
/// against the baseline.
expected<double> plain_restore_sample(const std::string& path, std::vector<char>& buffer, restore_layout& out);

/// Writes every column family's memtable to table files (what RocksDB does by
/// itself as memtables fill), so that an open has no log to replay.
status flush_to_tables(const std::string& path);

}  // namespace archipelago
