#include "bench/snapshot_baseline.hpp"

#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>

#include "bench/bench_stats.hpp"
#include "core/prng.hpp"
#include "storage/rocksdb_options.hpp"

namespace archipelago {
namespace {

error rocksdb_error(const std::string& what, const rocksdb::Status& s) {
  return make_error(errc::io_error, "plain RocksDB baseline: " + what + ": " + s.ToString());
}

/// A plain RocksDB database and its column family handles, closed in order.
struct plain_db {
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::vector<std::string> names;
  plain_db() = default;
  plain_db(const plain_db&) = delete;
  plain_db& operator=(const plain_db&) = delete;
  ~plain_db() {
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    delete db;
  }
};

/// Read-only: every column family the database has. Otherwise a new database
/// with the default family, or with the store's families when `store_families`.
expected<std::unique_ptr<plain_db>> open_plain(const std::string& path, bool read_only, bool store_families = false) {
  auto out = std::make_unique<plain_db>();
  out->names = {rocksdb::kDefaultColumnFamilyName};
  if (store_families)  // in column order, so that handles[c] is column c's
    for (int c = 1; c < storage::column_count; ++c)
      out->names.push_back(storage::to_string(static_cast<storage::column>(c)));
  if (read_only) {
    if (auto s = rocksdb::DB::ListColumnFamilies(storage::db_options(storage::open_mode::read_only), path, &out->names);
        !s.ok())
      return rocksdb_error("list column families of " + path, s);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  // One family: the options of the store's bulk column; else each its own.
  for (const auto& n : out->names)
    families.emplace_back(n, store_families || read_only ? storage::family_options(n)
                                                          : storage::family_options(storage::column::pieces));
  rocksdb::DBOptions options =
      storage::db_options(read_only ? storage::open_mode::read_only : storage::open_mode::create);
  options.create_missing_column_families = !read_only;
  const rocksdb::Status s = read_only
                                ? rocksdb::DB::OpenForReadOnly(options, path, families, &out->handles, &out->db)
                                : rocksdb::DB::Open(options, path, families, &out->handles, &out->db);
  if (!s.ok()) return rocksdb_error("open " + path, s);
  return out;
}

/// Random bytes as long as the largest value any batch puts.
std::string value_bytes(const std::vector<batch_shape>& setup_batches, const std::vector<batch_shape>& timed) {
  std::size_t largest = 0;
  for (const auto* list : {&setup_batches, &timed})
    for (const auto& b : *list)
      for (const auto& p : b.puts) largest = std::max(largest, p.value_bytes);
  std::string value(largest, '\0');
  prng rng(7);
  for (std::size_t i = 0; i + 8 <= value.size(); i += 8) {
    const std::uint64_t x = rng.next();
    std::memcpy(value.data() + i, &x, 8);
  }
  return value;
}

}  // namespace

std::uint64_t batch_shape::bytes() const {
  std::uint64_t b = 0;
  for (const auto& p : puts) b += p.key.size() + p.value_bytes;
  return b;
}

status recording_kv::write(const storage::write_batch& batch) { return record(batch, false); }
status recording_kv::write_unlogged(const storage::write_batch& batch) { return record(batch, true); }

status recording_kv::record(const storage::write_batch& batch, bool unlogged) {
  batch_shape shape;
  for (const auto& op : batch.ops)
    if (op.value) shape.puts.push_back({op.col, op.key, op.value->size()});
    else ++shape.deletes;
  const auto t0 = seconds_clock::now();
  status s = unlogged ? inner_->write_unlogged(batch) : inner_->write(batch);
  const double seconds = since(t0);
  std::lock_guard lock(mutex_);
  write_seconds_ += seconds;
  if (s) batches_.push_back(std::move(shape));
  return s;
}

std::vector<batch_shape> recording_kv::take() {
  std::lock_guard lock(mutex_);
  return std::exchange(batches_, {});
}

double recording_kv::take_write_seconds() {
  std::lock_guard lock(mutex_);
  return std::exchange(write_seconds_, 0.0);
}

expected<double> plain_write_sample(const std::vector<batch_shape>& setup_batches, const std::vector<batch_shape>& timed,
                                    bool sync, bool store_families, const std::string& path, const bench_hooks& hooks,
                                    const std::string& label) {
  auto db = open_plain(path, false, store_families);
  if (!db) return db.err();
  const std::string value = value_bytes(setup_batches, timed);
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  auto write = [&](const batch_shape& b) -> status {
    rocksdb::WriteBatch wb;
    for (const auto& p : b.puts)
      if (auto s = wb.Put((*db)->handles[store_families ? static_cast<std::size_t>(p.col) : 0], p.key,
                          rocksdb::Slice(value.data(), p.value_bytes));
          !s.ok())
        return rocksdb_error("batch", s);
    if (auto s = (*db)->db->Write(wo, &wb); !s.ok()) return rocksdb_error("write", s);
    return {};
  };
  for (const auto& b : setup_batches)
    if (auto ok = write(b); !ok) return ok.err();
  rocksdb::FlushOptions fo;  // the setup settled on disk, as in the store's sample
  fo.wait = true;
  if (auto s = (*db)->db->Flush(fo, (*db)->handles); !s.ok()) return rocksdb_error("flush of the memtables", s);
  double seconds = 0;
  for (std::size_t k = 0; k < timed.size(); ++k) {
    if (hooks.stopped()) return interrupted();
    if (k % 8 == 0) hooks.update(label + ": batch " + std::to_string(k + 1) + "/" + std::to_string(timed.size()));
    const auto t0 = seconds_clock::now();
    auto ok = write(timed[k]);
    seconds += since(t0);
    if (!ok) return ok.err();
  }
  const auto t0 = seconds_clock::now();
  if (auto s = (*db)->db->FlushWAL(true); !s.ok()) return rocksdb_error("flush", s);
  if (auto s = (*db)->db->Flush(fo, (*db)->handles); !s.ok()) return rocksdb_error("flush of the memtables", s);
  seconds += since(t0);
  return seconds;
}

expected<double> plain_restore_sample(const std::string& path, std::vector<char>& buffer, restore_layout& out) {
  const auto t0 = seconds_clock::now();
  auto db = open_plain(path, true);
  if (!db) return db.err();
  const double opened = since(t0);
  std::uint64_t at = 0;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  for (const char* name : {"fragments", "pieces"}) {  // the states' heads and their floats
    const auto family = std::find((*db)->names.begin(), (*db)->names.end(), name);
    if (family == (*db)->names.end())
      return make_error(errc::internal, path + " has no " + name + " column family");
    rocksdb::ColumnFamilyHandle* handle = (*db)->handles[static_cast<std::size_t>(family - (*db)->names.begin())];
    std::unique_ptr<rocksdb::Iterator> it((*db)->db->NewIterator(ro, handle));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const rocksdb::Slice v = it->value();
      if (at + v.size() > buffer.size())
        return make_error(errc::internal, "plain RocksDB read more fragment record bytes than the store wrote (" +
                                              std::to_string(buffer.size()) + ")");
      std::memcpy(buffer.data() + at, v.data(), v.size());
      at += v.size();
    }
    if (!it->status().ok()) return rocksdb_error("read", it->status());
  }
  const double seconds = since(t0);
  if (at != buffer.size())
    return make_error(errc::internal, "plain RocksDB read " + std::to_string(at) +
                                          " bytes of fragment records, the store wrote " +
                                          std::to_string(buffer.size()));
  out.plain_open_s.push_back(opened);
  out.plain_read_s.push_back(seconds - opened);
  return seconds;
}

status flush_to_tables(const std::string& path) {
  auto db = std::make_unique<plain_db>();
  if (auto s = rocksdb::DB::ListColumnFamilies(storage::db_options(storage::open_mode::read_only), path, &db->names);
      !s.ok())
    return rocksdb_error("list column families of " + path, s);
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const auto& n : db->names) families.emplace_back(n, storage::family_options(n));
  if (auto s = rocksdb::DB::Open(storage::db_options(storage::open_mode::create), path, families, &db->handles, &db->db);
      !s.ok())
    return rocksdb_error("open " + path, s);
  rocksdb::FlushOptions fo;
  fo.wait = true;
  if (auto s = db->db->Flush(fo, db->handles); !s.ok()) return rocksdb_error("flush of " + path, s);
  return {};
}

}  // namespace archipelago
