// The only file that sees RocksDB's headers (docs/design/stack.md §6 has the notes this follows).
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include "storage/rocksdb_options.hpp"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>

#include "storage/kv_store.hpp"

namespace archipelago::storage {

// Modest on a 2-core machine: two background jobs, small memtables, bounded
// total memtable memory, one shared block cache. Parameters are floats, which
// barely compress, so compression would cost CPU for nothing. Not blob files
// for the large values: RocksDB 7.8's secondary instance (every reader) crashes
// reading a blob (SIGSEGV in BlobSource::GetBlob).
rocksdb::DBOptions db_options(open_mode mode) {
  rocksdb::DBOptions o;
  o.create_if_missing = mode == open_mode::create;
  o.create_missing_column_families = mode == open_mode::create;
  o.paranoid_checks = true;
  o.max_background_jobs = 2;
  o.db_write_buffer_size = 64 << 20;
  o.keep_log_file_num = 4;
  // Flushes and compactions run at the actors' priority. A commit waits for them
  // (a large one flushes; a full memtable stalls the next write), so at a lower
  // one a busy machine starved them: on 2 cores at a load of 19, one 125 MB
  // memtable took 12 minutes to flush at nice 19 while the writer waited behind
  // it (bench snapshot).
  // A reader is a secondary instance (RocksDB's supported way to read beside a
  // live primary in another process); it must keep every table file open
  // (RocksDB requires it), so files the writer compacts away stay readable.
  if (mode == open_mode::read_only) o.max_open_files = -1;
  return o;
}

rocksdb::ColumnFamilyOptions family_options(column) {
  static const std::shared_ptr<rocksdb::Cache> block_cache = rocksdb::NewLRUCache(32 << 20);
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = block_cache;
  rocksdb::ColumnFamilyOptions o;
  o.write_buffer_size = 16 << 20;
  o.compression = rocksdb::kNoCompression;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return o;
}
namespace {

namespace fs = std::filesystem;

// RocksDB's family name for each column; meta is the family every database has.
std::string family_name(column c) {
  return c == column::meta ? rocksdb::kDefaultColumnFamilyName : std::string(to_string(c));
}

std::vector<std::string> our_family_names() {
  std::vector<std::string> names;
  for (int i = 0; i < column_count; ++i) names.push_back(family_name(static_cast<column>(i)));
  return names;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

error from_status(const rocksdb::Status& s, const std::string& path, std::string_view what,
                  errc fallback = errc::io_error) {
  errc code = fallback;
  if (s.IsCorruption()) code = errc::corrupt_data;
  else if (s.IsIOError()) code = errc::io_error;
  else if (s.IsInvalidArgument()) code = errc::invalid_input;
  else if (s.IsNotSupported()) code = errc::unsupported;
  return make_error(code, "rocksdb at " + path + ": " + std::string(what) + ": " + s.ToString());
}

std::string_view view(const rocksdb::Slice& s) { return {s.data(), s.size()}; }
rocksdb::Slice slice(std::string_view s) { return {s.data(), s.size()}; }


/// An open database and its family handles, torn down handles first, then the
/// db, then a secondary instance's own directory.
struct open_db {
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // as opened
  std::vector<rocksdb::ColumnFamilyHandle*> columns;  // by column; null: a family this store lacks (format 1: pieces)
  std::string secondary_dir;  // a reader's: its info log and MANIFEST state, removed at close

  open_db() = default;
  open_db(const open_db&) = delete;
  open_db& operator=(const open_db&) = delete;
  ~open_db() {
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    delete db;
    std::error_code ec;
    if (!secondary_dir.empty()) fs::remove_all(secondary_dir, ec);
  }
};

/// A fresh directory for a secondary instance's own files (outside the store: a reader writes nothing there).
expected<std::string> make_secondary_dir(const std::string& path) {
  std::string templ = (fs::temp_directory_path() / "archipelago-reader-XXXXXX").string();
  if (!::mkdtemp(templ.data()))
    return make_error(errc::io_error, "rocksdb at " + path + ": cannot create a reader's directory in " +
                                          fs::temp_directory_path().string());
  return templ;
}

/// `secondary`: a reader beside a possible live writer (OpenAsSecondary, caught
/// up with the primary at open); otherwise the plain read-only open, for a store
/// nobody writes, or read-write.
expected<std::unique_ptr<open_db>> open_families(const std::string& path, open_mode mode,
                                                 const std::vector<std::string>& names, bool secondary = true,
                                                 bool add_missing = false) {
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const auto& n : names) families.emplace_back(n, family_options(n));
  auto out = std::make_unique<open_db>();
  rocksdb::Status s;
  if (mode == open_mode::read_only && secondary) {
    auto dir = make_secondary_dir(path);
    if (!dir) return dir.err();
    out->secondary_dir = *dir;
    s = rocksdb::DB::OpenAsSecondary(db_options(mode), path, *dir, families, &out->handles, &out->db);
  } else if (mode == open_mode::read_only) {
    s = rocksdb::DB::OpenForReadOnly(db_options(mode), path, families, &out->handles, &out->db);
  } else {
    rocksdb::DBOptions options = db_options(mode);
    options.create_missing_column_families |= add_missing;
    s = rocksdb::DB::Open(options, path, families, &out->handles, &out->db);
  }
  if (!s.ok()) return from_status(s, path, "open");
  out->columns.assign(column_count, nullptr);
  for (std::size_t i = 0; i < names.size(); ++i)
    for (int c = 0; c < column_count; ++c)
      if (names[i] == family_name(static_cast<column>(c))) out->columns[static_cast<std::size_t>(c)] = out->handles[i];
  return out;
}

class rocksdb_kv final : public kv_store {
 public:
  rocksdb_kv(std::string path, rocksdb_options options, std::unique_ptr<open_db> db)
      : path_(std::move(path)), options_(options), db_(std::move(db)) {}

  status write(const write_batch& batch) override { return apply(batch, false); }
  status write_unlogged(const write_batch& batch) override { return apply(batch, true); }

  expected<std::optional<std::string>> get(column c, std::string_view key) const override {
    if (!handle(c)) return std::optional<std::string>{};  // a family the store lacks is empty
    rocksdb::PinnableSlice value;
    const rocksdb::Status s = db_->db->Get(read_options(), handle(c), slice(key), &value);
    if (s.IsNotFound()) return std::optional<std::string>{};
    if (!s.ok()) return from_status(s, path_, std::string("get in ") + to_string(c));
    return std::optional<std::string>{value.ToString()};
  }

  // The iterator reads from the implicit snapshot taken when it is created.
  status scan(column c, std::string_view from, std::string_view to,
              const std::function<bool(std::string_view, std::string_view)>& visit) const override {
    if ((!to.empty() && from >= to) || !handle(c)) return status::ok();
    rocksdb::ReadOptions ro = read_options();
    const rocksdb::Slice upper = slice(to);  // must outlive the iterator
    if (!to.empty()) ro.iterate_upper_bound = &upper;
    std::unique_ptr<rocksdb::Iterator> it(db_->db->NewIterator(ro, handle(c)));
    for (it->Seek(slice(from)); it->Valid(); it->Next())
      if (!visit(view(it->key()), view(it->value()))) break;
    if (!it->status().ok()) return from_status(it->status(), path_, std::string("scan of ") + to_string(c));
    return status::ok();
  }

  expected<std::optional<std::pair<std::string, std::string>>> last(column c) const override {
    if (!handle(c)) return std::optional<std::pair<std::string, std::string>>{};
    std::unique_ptr<rocksdb::Iterator> it(db_->db->NewIterator(read_options(), handle(c)));
    it->SeekToLast();
    if (it->Valid())
      return std::optional<std::pair<std::string, std::string>>{std::pair{it->key().ToString(), it->value().ToString()}};
    if (!it->status().ok()) return from_status(it->status(), path_, std::string("last of ") + to_string(c));
    return std::optional<std::pair<std::string, std::string>>{};
  }

  status flush() override {
    if (options_.mode == open_mode::read_only) return status::ok();  // nothing was written
    if (const rocksdb::Status s = db_->db->FlushWAL(true); !s.ok()) return from_status(s, path_, "flush");
    return status::ok();
  }

  status flush_memtables() override {
    if (options_.mode == open_mode::read_only) return status::ok();
    rocksdb::FlushOptions fo;
    fo.wait = true;
    if (const rocksdb::Status s = db_->db->Flush(fo, db_->handles); !s.ok())
      return from_status(s, path_, "flush of the memtables");
    return status::ok();
  }

 private:
  status apply(const write_batch& batch, bool unlogged) {
    if (options_.mode == open_mode::read_only)
      return make_error(errc::unsupported, "rocksdb at " + path_ + ": opened read-only, write refused");
    rocksdb::WriteBatch wb;
    for (const auto& o : batch.ops) {
      if (o.range_end && o.key >= *o.range_end) continue;  // an empty range (RocksDB refuses it)
      if (!handle(o.col))
        return make_error(errc::unsupported, "rocksdb at " + path_ + ": opened without the " +
                                                 std::string(to_string(o.col)) + " column family (a format 1 store)");
      const rocksdb::Status s = o.value       ? wb.Put(handle(o.col), o.key, *o.value)
                                : o.range_end ? wb.DeleteRange(handle(o.col), o.key, *o.range_end)
                                              : wb.Delete(handle(o.col), o.key);
      if (!s.ok()) return from_status(s, path_, "batch");
    }
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync_writes && !unlogged;
    wo.disableWAL = unlogged;
    if (const rocksdb::Status s = db_->db->Write(wo, &wb); !s.ok()) return from_status(s, path_, "write");
    return status::ok();
  }

  static rocksdb::ReadOptions read_options() {
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    return ro;
  }
  rocksdb::ColumnFamilyHandle* handle(column c) const { return db_->columns[static_cast<std::size_t>(c)]; }

  std::string path_;
  rocksdb_options options_;
  std::unique_ptr<open_db> db_;
};

// Whether every family of a database is empty: a store whose creation was
// interrupted (a crash between creating the families) has nothing in any of them.
expected<bool> all_families_empty(const std::string& path, const std::vector<std::string>& names) {
  auto db = open_families(path, open_mode::read_only, names, false);  // nobody writes it: we are its creator
  if (!db) return db.err();
  for (auto* h : (*db)->handles) {
    std::unique_ptr<rocksdb::Iterator> it((*db)->db->NewIterator(rocksdb::ReadOptions(), h));
    it->SeekToFirst();
    if (!it->status().ok()) return from_status(it->status(), path, "scan");
    if (it->Valid()) return false;
  }
  return true;
}

expected<std::unique_ptr<kv_store>> try_open(const std::string& path, rocksdb_options options) {
  std::error_code ec;
  const bool has_database = fs::exists(fs::path(path) / "CURRENT", ec);
  if (ec) return make_error(errc::io_error, "rocksdb at " + path + ": " + ec.message());
  if (!has_database && options.mode != open_mode::create)
    return make_error(errc::not_found, "no archipelago store at " + path + " (no RocksDB CURRENT file)");

  std::vector<std::string> ours = our_family_names();
  std::vector<std::string> names = ours;  // the families to open
  bool add_missing = false;
  if (has_database) {
    // Every existing family must be opened (RocksDB refuses otherwise), and a
    // foreign database must not be adopted, so compare the sets first.
    std::vector<std::string> found;
    const rocksdb::Status s = rocksdb::DB::ListColumnFamilies(db_options(options.mode), path, &found);
    if (!s.ok()) return from_status(s, path, "list column families");
    std::sort(found.begin(), found.end());
    std::vector<std::string> ours_sorted = ours;
    std::sort(ours_sorted.begin(), ours_sorted.end());
    // A format 1 store has every family but pieces: a reader opens what it has, a
    // writer adds the family (the store's format is raised at its first commit).
    std::vector<std::string> format1 = ours;
    std::erase(format1, family_name(column::pieces));
    std::vector<std::string> format1_sorted = format1;
    std::sort(format1_sorted.begin(), format1_sorted.end());
    if (found == format1_sorted) {
      if (options.mode == open_mode::read_only) names = format1;
      else add_missing = true;
    } else if (found != ours_sorted) {
      const bool subset = std::includes(ours_sorted.begin(), ours_sorted.end(), found.begin(), found.end());
      bool complete_it = false;
      if (subset && options.mode == open_mode::create) {
        auto empty = all_families_empty(path, found);
        if (!empty) return empty.err();
        complete_it = *empty;
      }
      if (!complete_it)
        return make_error(errc::invalid_input, path + " is not an archipelago store: its column families are {" +
                                                   join(found) + "}, expected {" + join(ours) + "}");
    }
  }
  auto db = open_families(path, options.mode, names, true, add_missing);
  if (!db) return db.err();
  return std::unique_ptr<kv_store>(std::make_unique<rocksdb_kv>(path, options, std::move(*db)));
}

}  // namespace

rocksdb::ColumnFamilyOptions family_options(const std::string& name) {
  for (int c = 0; c < column_count; ++c)
    if (name == family_name(static_cast<column>(c))) return family_options(static_cast<column>(c));
  return family_options(column::meta);
}

expected<std::unique_ptr<kv_store>> open_rocksdb(const std::string& path, rocksdb_options options) {
  std::error_code ec;
  const auto type = fs::status(path, ec).type();
  if (type == fs::file_type::not_found) {
    if (options.mode != open_mode::create)
      return make_error(errc::not_found, "no archipelago store at " + path + " (no such directory)");
    if (fs::create_directories(path, ec); ec)
      return make_error(errc::io_error, "cannot create " + path + ": " + ec.message());
  } else if (ec) {
    return make_error(errc::io_error, "rocksdb at " + path + ": " + ec.message());
  } else if (type != fs::file_type::directory) {
    return make_error(errc::invalid_input, path + " is not a directory");
  }

  // A reader is a secondary instance: RocksDB supports it beside a writer in
  // another process (the snapshot store retries the moments while a writer recovers).
  return try_open(path, options);
}

}  // namespace archipelago::storage
