#pragma once
// The storage seam (LevelDB's Env habit): an ordered key-value store with a
// fixed set of columns and atomic multi-column batches. The snapshot store is
// written against this interface only; RocksDB, an in-memory map and a
// fault-injecting wrapper implement it. Keys compare as unsigned bytes.
// Every implementation is safe to call from several threads.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace archipelago::storage {

/// One RocksDB column family each (storage/FORMAT.md).
enum class column : std::uint8_t {
  meta,           // format version, creation time, the run's configuration
  fragments,      // (fragment, version) → parameters + optimizer state
  manifests,      // mesh version → a consistent cut
  tape,           // sequence → one closed and committed round
  ledger,         // (learner, incarnation) → token ledger totals
  contributions,  // (fragment, version) → the contributions merged into it
  evals,          // mesh version → eval loss measured on it
  pieces,         // (fragment, version, index) → a piece of a fragment state's floats (format 2)
};
inline constexpr int column_count = 8;
const char* to_string(column c);

/// Puts and deletes applied all together or not at all.
struct write_batch {
  struct op {
    column col;
    std::string key;
    std::optional<std::string> value;  // nullopt: delete
    std::optional<std::string> range_end;  // a delete of every key in [key, range_end)
  };
  std::vector<op> ops;
  void put(column c, std::string key, std::string value) { ops.push_back({c, std::move(key), std::move(value), {}}); }
  void del(column c, std::string key) { ops.push_back({c, std::move(key), std::nullopt, {}}); }
  void del_range(column c, std::string from, std::string to) {
    ops.push_back({c, std::move(from), std::nullopt, std::move(to)});
  }
  std::size_t bytes() const;
};

class kv_store {
 public:
  virtual ~kv_store() = default;

  /// Applies the batch atomically. io_error when the write failed (nothing applied
  /// unless the implementation says otherwise, see faulty_kv).
  virtual status write(const write_batch& batch) = 0;
  /// The same without RocksDB's log: bulk data written once, to table files,
  /// instead of twice. It survives no crash until flush_memtables() returns, so
  /// nothing may refer to it before that (a commit's pieces, then its manifest).
  virtual status write_unlogged(const write_batch& batch) = 0;
  /// The value, nullopt when the key is absent; io_error when the read failed.
  virtual expected<std::optional<std::string>> get(column c, std::string_view key) const = 0;
  /// Calls `visit` on every key in [from, to) in ascending order (an empty `to`
  /// means no upper bound) until it returns false. Reads one consistent view.
  virtual status scan(column c, std::string_view from, std::string_view to,
                      const std::function<bool(std::string_view key, std::string_view value)>& visit) const = 0;
  /// The greatest key in the column, with its value; nullopt when the column is empty.
  virtual expected<std::optional<std::pair<std::string, std::string>>> last(column c) const = 0;
  /// Makes every completed write durable against power loss (fsync of the log).
  virtual status flush() = 0;
  /// Writes every column's in-memory part to table files and waits (RocksDB's
  /// Flush): what was written no longer depends on the log, and the background
  /// work a sustained load causes is done. A no-op where nothing is in memory.
  virtual status flush_memtables() = 0;
};

// ---- implementations ------------------------------------------------------------

enum class open_mode : std::uint8_t {
  create,       // create the directory and database when missing
  existing,     // read-write; invalid_input/not_found when there is no database
  read_only,    // never modifies anything on disk
};

struct rocksdb_options {
  open_mode mode = open_mode::create;
  bool sync_writes = false;  // fsync every batch (survives power loss, not only a process crash)
};

/// RocksDB with one column family per `column`. Errors name the path.
expected<std::unique_ptr<kv_store>> open_rocksdb(const std::string& path, rocksdb_options options);

/// An in-memory store (tests, and runs without --db).
std::unique_ptr<kv_store> make_memory_kv();

/// Faults injected into writes of a wrapped store, seeded and reproducible.
struct fault_plan {
  std::uint64_t seed = 1;
  double write_error_rate = 0;  // a batch (logged or not) fails with io_error, nothing applied
  double torn_write_rate = 0;   // a prefix of the batch is applied, its last value truncated; io_error
  std::uint64_t fail_after_writes = 0;  // >0: every write after this many succeeds no more (a dying disk)
};
struct fault_counters {
  std::uint64_t writes = 0, write_errors = 0, torn_writes = 0;
};

class faulty_kv final : public kv_store {
 public:
  faulty_kv(std::shared_ptr<kv_store> inner, fault_plan plan);
  ~faulty_kv() override;  // defined where impl is complete
  status write(const write_batch& batch) override;
  status write_unlogged(const write_batch& batch) override;
  expected<std::optional<std::string>> get(column c, std::string_view key) const override;
  status scan(column c, std::string_view from, std::string_view to,
              const std::function<bool(std::string_view, std::string_view)>& visit) const override;
  expected<std::optional<std::pair<std::string, std::string>>> last(column c) const override;
  status flush() override;
  status flush_memtables() override;
  fault_counters counters() const;
  /// Changes the write error rate from now on (a disk that starts or stops failing).
  void set_write_error_rate(double rate);

 private:
  struct impl;
  status write(const write_batch& batch, bool unlogged);

  std::shared_ptr<kv_store> inner_;
  std::unique_ptr<impl> impl_;
};

// ---- keys -----------------------------------------------------------------------

/// Big-endian encodings, so that byte order is numeric order.
std::string be32(std::uint32_t v);
std::string be64(std::uint64_t v);
std::uint32_t read_be32(std::string_view s, std::size_t at = 0);
std::uint64_t read_be64(std::string_view s, std::size_t at = 0);

}  // namespace archipelago::storage
