#include "storage/kv_store.hpp"

#include <doctest/doctest.h>
#include <rocksdb/db.h>  // only to build foreign databases; the store itself hides RocksDB
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/prng.hpp"
#include "temp_dir.hpp"

using namespace archipelago;
using namespace archipelago::storage;
namespace fs = std::filesystem;

using archipelago::testing::temp_dir;

namespace {


bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::unique_ptr<kv_store> must_open(const std::string& path, rocksdb_options options = {}) {
  auto kv = open_rocksdb(path, options);
  if (!kv) FAIL_CHECK(kv.err().to_string());
  REQUIRE(kv);
  return std::move(*kv);
}

void must_write(kv_store& kv, const write_batch& batch) {
  const status st = kv.write(batch);
  if (!st) FAIL_CHECK(st.err().to_string());
  REQUIRE(st);
}

std::optional<std::string> must_get(const kv_store& kv, column c, std::string_view key) {
  auto v = kv.get(c, key);
  if (!v) FAIL_CHECK(v.err().to_string());
  REQUIRE(v);
  return *v;
}

using pairs = std::vector<std::pair<std::string, std::string>>;

pairs scan_all(const kv_store& kv, column c, std::string_view from = {}, std::string_view to = {},
               std::size_t limit = SIZE_MAX) {
  pairs out;
  const status st = kv.scan(c, from, to, [&](std::string_view k, std::string_view v) {
    out.emplace_back(k, v);
    return out.size() < limit;
  });
  if (!st) FAIL_CHECK(st.err().to_string());
  REQUIRE(st);
  return out;
}

// Every column's contents, for comparing whole stores.
std::string dump(const kv_store& kv) {
  std::string out;
  for (int i = 0; i < column_count; ++i)
    for (const auto& [k, v] : scan_all(kv, static_cast<column>(i))) out += std::to_string(i) + ":" + k + "=" + v + ";";
  return out;
}

// name → (size, mtime) of every file under a directory, to prove nothing was touched.
std::map<std::string, std::pair<std::uintmax_t, fs::file_time_type>> listing(const std::string& dir) {
  std::map<std::string, std::pair<std::uintmax_t, fs::file_time_type>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[e.path().string()] = {e.is_regular_file() ? e.file_size() : 0, e.last_write_time()};
  return out;
}

// A RocksDB made without archipelago, with the given column families and one key in each.
void make_plain_rocksdb(const std::string& path, const std::vector<std::string>& families) {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const auto& f : families) descriptors.emplace_back(f, rocksdb::ColumnFamilyOptions());
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  REQUIRE(rocksdb::DB::Open(options, path, descriptors, &handles, &db).ok());
  for (auto* h : handles) CHECK(db->Put(rocksdb::WriteOptions(), h, "key", "value").ok());
  for (auto* h : handles) CHECK(db->DestroyColumnFamilyHandle(h).ok());
  delete db;
}

}  // namespace

// ---- encodings --------------------------------------------------------------------

TEST_CASE("kv_store: column names, batch sizes and big-endian keys") {
  CHECK(std::string(to_string(column::meta)) == "meta");
  CHECK(std::string(to_string(column::fragments)) == "fragments");
  CHECK(std::string(to_string(column::manifests)) == "manifests");
  CHECK(std::string(to_string(column::tape)) == "tape");
  CHECK(std::string(to_string(column::ledger)) == "ledger");
  CHECK(std::string(to_string(column::contributions)) == "contributions");
  CHECK(std::string(to_string(column::evals)) == "evals");
  CHECK(std::string(to_string(column::pieces)) == "pieces");

  write_batch b;
  CHECK(b.bytes() == 0);
  b.put(column::tape, "abc", "12345");
  b.del(column::ledger, "xy");
  CHECK(b.bytes() == 3 + 5 + 2);

  CHECK(be32(0x01020304u) == std::string("\x01\x02\x03\x04", 4));
  CHECK(be64(0x0102030405060708ull) == std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  CHECK(read_be32(std::string("xx\xff\x00\x00\x01", 6), 2) == 0xff000001u);
  CHECK(read_be64(be64(UINT64_MAX)) == UINT64_MAX);

  const std::uint64_t seed = 7;
  CAPTURE(seed);
  prng rng(seed);
  for (int i = 0; i < 2000; ++i) {
    // Small and large magnitudes, so both high-bit and low-bit differences occur.
    const std::uint64_t a = rng.next() >> rng.below(64), b = rng.next() >> rng.below(64);
    CAPTURE(a);
    CAPTURE(b);
    REQUIRE(read_be64(be64(a)) == a);
    REQUIRE((be64(a) < be64(b)) == (a < b));
    const auto a32 = static_cast<std::uint32_t>(a), b32 = static_cast<std::uint32_t>(b);
    REQUIRE(read_be32(be32(a32)) == a32);
    REQUIRE((be32(a32) < be32(b32)) == (a32 < b32));
  }
}

// ---- both implementations ----------------------------------------------------------
// Each of these runs once on the in-memory store and once on RocksDB (doctest subcases).

TEST_CASE("kv_store: put, get and delete across columns") {
  temp_dir dir;
  std::unique_ptr<kv_store> kv;
  SUBCASE("memory") { kv = make_memory_kv(); }
  SUBCASE("rocksdb") { kv = must_open(dir.file("db")); }

  CHECK_FALSE(must_get(*kv, column::tape, "k"));
  write_batch b;
  for (int i = 0; i < column_count; ++i) b.put(static_cast<column>(i), "k", std::string("value of ") + to_string(static_cast<column>(i)));
  b.put(column::fragments, std::string("\0\xff", 2), std::string("\0binary\0", 8));
  b.put(column::evals, "empty", "");
  must_write(*kv, b);
  for (int i = 0; i < column_count; ++i) {
    const auto c = static_cast<column>(i);
    CAPTURE(to_string(c));
    CHECK(must_get(*kv, c, "k") == std::optional<std::string>(std::string("value of ") + to_string(c)));
  }
  CHECK(must_get(*kv, column::fragments, std::string("\0\xff", 2)) == std::optional<std::string>(std::string("\0binary\0", 8)));
  CHECK(must_get(*kv, column::evals, "empty") == std::optional<std::string>(""));
  CHECK_FALSE(must_get(*kv, column::tape, std::string("\0\xff", 2)));  // columns are separate

  write_batch overwrite_and_delete;
  overwrite_and_delete.put(column::tape, "k", "new");
  overwrite_and_delete.del(column::ledger, "k");
  overwrite_and_delete.del(column::ledger, "never there");
  must_write(*kv, overwrite_and_delete);
  CHECK(must_get(*kv, column::tape, "k") == std::optional<std::string>("new"));
  CHECK_FALSE(must_get(*kv, column::ledger, "k"));
  CHECK(must_get(*kv, column::meta, "k") == std::optional<std::string>("value of meta"));

  // Within a batch, a later op on the same key wins.
  write_batch same_key;
  same_key.put(column::manifests, "x", "1");
  same_key.del(column::manifests, "x");
  same_key.put(column::manifests, "y", "1");
  same_key.put(column::manifests, "y", "2");
  must_write(*kv, same_key);
  CHECK_FALSE(must_get(*kv, column::manifests, "x"));
  CHECK(must_get(*kv, column::manifests, "y") == std::optional<std::string>("2"));
  must_write(*kv, write_batch{});  // an empty batch is fine
  CHECK(kv->flush());
}

TEST_CASE("kv_store: range deletes, and writes past the log made durable by flush_memtables") {
  temp_dir dir;
  const std::string path = dir.file("db");
  std::unique_ptr<kv_store> kv;
  bool rocksdb = false;
  SUBCASE("memory") { kv = make_memory_kv(); }
  SUBCASE("rocksdb") {
    kv = must_open(path);
    rocksdb = true;
  }
  write_batch pieces;
  for (const char* k : {"a", "b", "b1", "c", "d"}) pieces.put(column::pieces, k, std::string("v") + k);
  const status unlogged = kv->write_unlogged(pieces);
  REQUIRE(unlogged);
  REQUIRE(kv->flush_memtables());
  write_batch ranges;
  ranges.del_range(column::pieces, "b", "c");    // b and b1
  ranges.del_range(column::pieces, "z", "a");    // an empty range: nothing
  ranges.del_range(column::fragments, "a", "e");  // another column's keys stay
  must_write(*kv, ranges);
  const pairs expected = {{"a", "va"}, {"c", "vc"}, {"d", "vd"}};
  CHECK(scan_all(*kv, column::pieces) == expected);
  if (rocksdb) {  // flushed before the handle closed: reopened, it is all there
    kv.reset();
    CHECK(scan_all(*must_open(path, {open_mode::read_only, false}), column::pieces) == expected);
  }
}

TEST_CASE("kv_store: a reader beside the live writer reads large values written past the log") {
  temp_dir dir;
  const std::string path = dir.file("db");
  auto kv = must_open(path);
  const std::string big(1 << 20, 'f');
  write_batch b;
  b.put(column::pieces, "p", big);
  REQUIRE(kv->write_unlogged(b));
  REQUIRE(kv->flush_memtables());
  auto reader = must_open(path, {open_mode::read_only});  // a secondary instance, as replay opens it
  CHECK(must_get(*reader, column::pieces, "p") == std::optional<std::string>(big));
  CHECK(scan_all(*reader, column::pieces).size() == 1);
}

TEST_CASE("kv_store: rocksdb opens a format 1 store (no pieces family): a reader as it is, a writer adds it") {
  temp_dir dir;
  const std::string path = dir.file("db");
  make_plain_rocksdb(path, {"default", "fragments", "manifests", "tape", "ledger", "contributions", "evals"});
  {
    auto reader = must_open(path, {open_mode::read_only, false});
    CHECK(must_get(*reader, column::tape, "key") == std::optional<std::string>("value"));
    CHECK_FALSE(must_get(*reader, column::pieces, "key"));  // a family it lacks is empty
    CHECK(scan_all(*reader, column::pieces).empty());
  }
  {
    auto writer = must_open(path, {open_mode::existing, false});
    write_batch b;
    b.put(column::pieces, "key", "piece");
    must_write(*writer, b);
  }
  auto reader = must_open(path, {open_mode::read_only, false});
  CHECK(must_get(*reader, column::pieces, "key") == std::optional<std::string>("piece"));
  CHECK(must_get(*reader, column::fragments, "key") == std::optional<std::string>("value"));
}

TEST_CASE("kv_store: a batch is applied all at once and a scan sees one view") {
  temp_dir dir;
  std::unique_ptr<kv_store> kv;
  SUBCASE("memory") { kv = make_memory_kv(); }
  SUBCASE("rocksdb") { kv = must_open(dir.file("db")); }

  // The writer keeps a == b == c in every batch; a reader scanning must never see them differ.
  constexpr int batches = 400;
  std::atomic<bool> done{false};
  std::atomic<int> torn_views{0}, views{0};
  std::thread reader([&] {
    while (!done.load()) {
      pairs seen;  // no doctest assertions off the main thread
      if (!kv->scan(column::tape, {}, {}, [&](std::string_view k, std::string_view v) {
            seen.emplace_back(k, v);
            return true;
          })) {
        ++torn_views;
        continue;
      }
      if (seen.empty()) continue;
      ++views;
      if (seen.size() != 3 || seen[0].second != seen[1].second || seen[1].second != seen[2].second) ++torn_views;
    }
  });
  for (int i = 0; i < batches; ++i) {
    write_batch b;
    const std::string v = std::to_string(i) + std::string(static_cast<std::size_t>(i % 50), 'x');
    b.put(column::tape, "a", v);
    b.put(column::tape, "b", v);
    b.put(column::tape, "c", v);
    b.put(column::ledger, "count", std::to_string(i));
    must_write(*kv, b);
  }
  done = true;
  reader.join();
  CHECK(torn_views.load() == 0);
  INFO("views: " << views.load());
  CHECK(must_get(*kv, column::ledger, "count") == std::optional<std::string>(std::to_string(batches - 1)));
}

TEST_CASE("kv_store: scan visits from up to (not including) to, in unsigned byte order, and stops early") {
  temp_dir dir;
  std::unique_ptr<kv_store> kv;
  SUBCASE("memory") { kv = make_memory_kv(); }
  SUBCASE("rocksdb") { kv = must_open(dir.file("db")); }

  const std::vector<std::string> ordered = {std::string("\0", 1), "a", "ab", "b", "\x7f", "\x80", "\xff", "\xff\xff"};
  write_batch b;
  for (auto it = ordered.rbegin(); it != ordered.rend(); ++it) b.put(column::manifests, *it, "v" + *it);
  b.put(column::tape, "a", "other column");
  must_write(*kv, b);

  auto keys = [](const pairs& p) {
    std::vector<std::string> k;
    for (const auto& [key, value] : p) k.push_back(key);
    return k;
  };
  const pairs all = scan_all(*kv, column::manifests);
  CHECK(keys(all) == ordered);
  for (const auto& [k, v] : all) CHECK(v == "v" + k);
  CHECK(keys(scan_all(*kv, column::manifests, "a", "\x80")) == std::vector<std::string>{"a", "ab", "b", "\x7f"});
  CHECK(keys(scan_all(*kv, column::manifests, "aa", "b")) == std::vector<std::string>{"ab"});
  CHECK(keys(scan_all(*kv, column::manifests, "\x80")) == std::vector<std::string>{"\x80", "\xff", "\xff\xff"});
  CHECK(scan_all(*kv, column::manifests, "b", "b").empty());
  CHECK(scan_all(*kv, column::manifests, "c", "a").empty());  // from > to: empty, not an error
  CHECK(keys(scan_all(*kv, column::manifests, {}, {}, 2)) == std::vector<std::string>{std::string("\0", 1), "a"});
  CHECK(scan_all(*kv, column::evals).empty());
  CHECK(keys(scan_all(*kv, column::tape)) == std::vector<std::string>{"a"});

  // The visitor may write to the store: the scan keeps its own view.
  int visited = 0;
  const status st = kv->scan(column::manifests, {}, {}, [&](std::string_view, std::string_view) {
    write_batch w;
    w.put(column::manifests, "zzz" + std::to_string(visited), "added during scan");
    CHECK(kv->write(w));
    ++visited;
    return true;
  });
  CHECK(st);
  CHECK(visited == static_cast<int>(ordered.size()));
}

TEST_CASE("kv_store: last returns the greatest key of a column") {
  temp_dir dir;
  std::unique_ptr<kv_store> kv;
  SUBCASE("memory") { kv = make_memory_kv(); }
  SUBCASE("rocksdb") { kv = must_open(dir.file("db")); }

  auto last = [&](column c) {
    auto v = kv->last(c);
    REQUIRE(v);
    return *v;
  };
  CHECK_FALSE(last(column::tape));
  write_batch b;
  for (std::uint64_t seq : {5, 300, 2, 70000}) b.put(column::tape, be64(seq), "round " + std::to_string(seq));
  b.put(column::evals, be64(1000000), "not the tape");
  must_write(*kv, b);
  auto top = last(column::tape);
  REQUIRE(top);
  CHECK(read_be64(top->first) == 70000);
  CHECK(top->second == "round 70000");
  write_batch del;
  del.del(column::tape, be64(70000));
  must_write(*kv, del);
  top = last(column::tape);
  REQUIRE(top);
  CHECK(read_be64(top->first) == 300);
}

// ---- RocksDB: files, modes and foreign directories ------------------------------------

TEST_CASE("kv_store: rocksdb data survives reopening, in every mode") {
  temp_dir dir;
  const std::string path = dir.file("db");
  {
    auto kv = must_open(path, {open_mode::create, true});
    write_batch b;
    b.put(column::meta, "format", "1");
    b.put(column::fragments, be32(3) + be64(7), std::string(1 << 16, 'p'));
    b.del(column::meta, "nothing");
    must_write(*kv, b);
    CHECK(kv->flush());
  }
  for (open_mode mode : {open_mode::existing, open_mode::read_only, open_mode::create}) {
    CAPTURE(static_cast<int>(mode));
    auto kv = must_open(path, {mode, false});
    CHECK(must_get(*kv, column::meta, "format") == std::optional<std::string>("1"));
    CHECK(must_get(*kv, column::fragments, be32(3) + be64(7)) == std::optional<std::string>(std::string(1 << 16, 'p')));
  }
  {  // and a second reopen after a write made through an `existing` handle
    auto kv = must_open(path, {open_mode::existing, false});
    write_batch b;
    b.put(column::tape, be64(1), "round 1");
    must_write(*kv, b);
  }
  auto kv = must_open(path, {open_mode::read_only, false});
  CHECK(must_get(*kv, column::tape, be64(1)) == std::optional<std::string>("round 1"));
}

TEST_CASE("kv_store: rocksdb existing and read_only modes need a database and create nothing") {
  temp_dir dir;
  for (open_mode mode : {open_mode::existing, open_mode::read_only}) {
    CAPTURE(static_cast<int>(mode));
    const std::string missing = dir.file("missing/deeper");
    auto kv = open_rocksdb(missing, {mode, false});
    REQUIRE_FALSE(kv);
    CHECK(kv.err().code == errc::not_found);
    CHECK(contains(kv.err().message, missing));
    CHECK_FALSE(fs::exists(dir.file("missing")));

    // An empty directory, and one with files that are not a database.
    const std::string empty = dir.file("empty");
    fs::create_directories(empty);
    const std::string foreign = dir.file("foreign");
    fs::create_directories(foreign);
    std::ofstream(foreign + "/notes.txt") << "hello";
    for (const std::string& p : {empty, foreign}) {
      CAPTURE(p);
      const auto before = listing(p);
      auto opened = open_rocksdb(p, {mode, false});
      REQUIRE_FALSE(opened);
      CHECK(opened.err().code == errc::not_found);
      CHECK(contains(opened.err().message, p));
      CHECK(listing(p) == before);
    }
  }
  // A file where the directory should be.
  const std::string file = dir.file("a_file");
  std::ofstream(file) << "x";
  auto kv = open_rocksdb(file, {open_mode::create, false});
  REQUIRE_FALSE(kv);
  CHECK(kv.err().code == errc::invalid_input);
  CHECK(contains(kv.err().message, file));
}

TEST_CASE("kv_store: rocksdb read_only never modifies the directory") {
  temp_dir dir;
  const std::string path = dir.file("db");
  {
    auto kv = must_open(path);
    write_batch b;
    for (std::uint32_t i = 0; i < 100; ++i) b.put(column::fragments, be32(i), std::string(1000, static_cast<char>(i)));
    must_write(*kv, b);
  }  // closed with the data only in the log: the reader has to replay it
  const auto before = listing(path);
  {
    auto kv = must_open(path, {open_mode::read_only, false});
    CHECK(scan_all(*kv, column::fragments).size() == 100);
    CHECK(must_get(*kv, column::fragments, be32(42)) == std::optional<std::string>(std::string(1000, char(42))));
    CHECK(kv->last(column::fragments));
    write_batch b;
    b.put(column::meta, "x", "y");
    const status st = kv->write(b);
    REQUIRE_FALSE(st);
    CHECK(contains(st.err().message, path));
    CHECK(kv->flush());
  }
  CHECK(listing(path) == before);
}

TEST_CASE("kv_store: rocksdb refuses a database with other column families") {
  temp_dir dir;
  std::vector<std::string> ours = {"default", "fragments", "manifests", "tape", "ledger", "contributions", "evals"};
  std::vector<std::string> with_extra = ours;
  with_extra.push_back("users");
  const std::vector<std::pair<std::string, std::vector<std::string>>> foreign = {
      {"other_families", {"default", "users", "orders"}},
      {"extra_family", with_extra},
      {"default_only_with_data", {"default"}},
      {"some_of_ours_with_data", {"default", "tape"}},
  };
  for (const auto& [name, families] : foreign) {
    CAPTURE(name);
    const std::string path = dir.file(name);
    make_plain_rocksdb(path, families);
    const auto before = listing(path);
    for (open_mode mode : {open_mode::create, open_mode::existing, open_mode::read_only}) {
      CAPTURE(static_cast<int>(mode));
      auto kv = open_rocksdb(path, {mode, false});
      REQUIRE_FALSE(kv);
      CHECK(kv.err().code == errc::invalid_input);
      CHECK(contains(kv.err().message, "not an archipelago store"));
      CHECK(contains(kv.err().message, path));
    }
    CHECK(listing(path) == before);
  }
}

TEST_CASE("kv_store: rocksdb create mode completes a store whose creation was interrupted") {
  // A crash between creating the column families leaves some of ours, all empty.
  temp_dir dir;
  const std::string path = dir.file("db");
  {
    rocksdb::DBOptions options;
    options.create_if_missing = true;
    options.create_missing_column_families = true;
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {{"default", {}}, {"fragments", {}}};
    rocksdb::DB* db = nullptr;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    REQUIRE(rocksdb::DB::Open(options, path, descriptors, &handles, &db).ok());
    for (auto* h : handles) CHECK(db->DestroyColumnFamilyHandle(h).ok());
    delete db;
  }
  for (open_mode mode : {open_mode::existing, open_mode::read_only}) {
    auto kv = open_rocksdb(path, {mode, false});
    REQUIRE_FALSE(kv);
    CHECK(kv.err().code == errc::invalid_input);
  }
  auto kv = must_open(path, {open_mode::create, false});
  write_batch b;
  b.put(column::evals, "k", "v");
  must_write(*kv, b);
  kv.reset();
  CHECK(must_get(*must_open(path, {open_mode::existing, false}), column::evals, "k") == std::optional<std::string>("v"));
}

TEST_CASE("kv_store: rocksdb read_only works beside a read-write handle and sees committed data") {
  temp_dir dir;
  const std::string path = dir.file("db");
  auto writer = must_open(path);
  write_batch b;
  b.put(column::tape, be64(1), "round 1");
  b.put(column::meta, "format", "1");
  must_write(*writer, b);

  auto reader = must_open(path, {open_mode::read_only, false});
  CHECK(must_get(*reader, column::tape, be64(1)) == std::optional<std::string>("round 1"));
  CHECK(must_get(*reader, column::meta, "format") == std::optional<std::string>("1"));

  // The writer goes on writing while the reader is open, and a later reader sees it.
  write_batch more;
  more.put(column::tape, be64(2), "round 2");
  must_write(*writer, more);
  CHECK(must_get(*writer, column::tape, be64(2)) == std::optional<std::string>("round 2"));
  auto later = must_open(path, {open_mode::read_only, false});
  CHECK(scan_all(*later, column::tape).size() == 2);

  // A second read-write handle is refused (RocksDB's lock), naming the path.
  auto second = open_rocksdb(path, {open_mode::existing, false});
  REQUIRE_FALSE(second);
  CHECK(second.err().code == errc::io_error);
  CHECK(contains(second.err().message, path));
}

// ---- faulty_kv ------------------------------------------------------------------------

TEST_CASE("kv_store: faulty_kv with error rate 1 fails every write and applies nothing") {
  auto inner = std::shared_ptr<kv_store>(make_memory_kv());
  write_batch seed_data;
  seed_data.put(column::ledger, "existing", "1");
  must_write(*inner, seed_data);

  faulty_kv kv(inner, fault_plan{.seed = 11, .write_error_rate = 1.0});
  for (int i = 0; i < 20; ++i) {
    write_batch b;
    b.put(column::ledger, "k" + std::to_string(i), "v");
    b.del(column::ledger, "existing");
    const status st = i % 2 ? kv.write(b) : kv.write_unlogged(b);  // past the log or not, the same faults
    REQUIRE_FALSE(st);
    CHECK(st.err().code == errc::io_error);
    CHECK(contains(st.err().message, "injected write error"));
  }
  CHECK(dump(*inner) == dump(kv));  // reads pass through
  CHECK(scan_all(kv, column::ledger) == pairs{{"existing", "1"}});
  CHECK(must_get(kv, column::ledger, "existing") == std::optional<std::string>("1"));
  CHECK(kv.last(column::ledger)->value().first == "existing");
  CHECK(kv.flush());
  CHECK(kv.flush_memtables());
  const fault_counters c = kv.counters();
  CHECK(c.writes == 20);
  CHECK(c.write_errors == 20);
  CHECK(c.torn_writes == 0);
}

TEST_CASE("kv_store: faulty_kv torn writes fail and leave only a prefix, its last value cut short") {
  for (std::uint64_t seed : {1, 2, 3}) {
    CAPTURE(seed);
    auto inner = std::shared_ptr<kv_store>(make_memory_kv());
    faulty_kv kv(inner, fault_plan{.seed = seed, .torn_write_rate = 1.0});
    prng workload(derive_seed(seed, 1));
    int truncated = 0, nothing_applied = 0;
    constexpr int rounds = 200;
    for (int r = 0; r < rounds; ++r) {
      CAPTURE(r);
      // A batch of puts of fresh keys and deletes of keys that exist beforehand.
      const auto n = 1 + workload.below(6);
      write_batch batch;
      for (std::uint32_t i = 0; i < n; ++i) {
        const std::string key = be32(static_cast<std::uint32_t>(r)) + be32(i);
        const auto c = static_cast<column>(workload.below(column_count));
        if (workload.below(3) == 0) {
          write_batch pre;
          pre.put(c, key, "old");
          must_write(*inner, pre);
          batch.del(c, key);
        } else {
          batch.put(c, key, std::string(workload.below(40), static_cast<char>('a' + i)));
        }
      }
      const status st = kv.write(batch);
      REQUIRE_FALSE(st);
      CHECK(st.err().code == errc::io_error);
      CHECK(contains(st.err().message, "injected torn write"));

      // Which ops took effect: they must form a strict prefix of the batch.
      std::vector<bool> applied;
      for (const auto& o : batch.ops) {
        const auto v = must_get(*inner, o.col, o.key);
        applied.push_back(o.value ? v.has_value() : !v.has_value());
      }
      std::size_t prefix = 0;
      while (prefix < applied.size() && applied[prefix]) ++prefix;
      for (std::size_t i = prefix; i < applied.size(); ++i) REQUIRE_FALSE(applied[i]);
      REQUIRE(prefix < batch.ops.size());
      if (prefix == 0) ++nothing_applied;
      for (std::size_t i = 0; i < prefix; ++i) {
        const auto& o = batch.ops[i];
        if (!o.value) continue;
        const std::string got = *must_get(*inner, o.col, o.key);
        if (i + 1 < prefix || o.value->empty()) {
          CHECK(got == *o.value);
        } else {
          CHECK(got.size() < o.value->size());
          CHECK(o.value->compare(0, got.size(), got) == 0);
          ++truncated;
        }
      }
    }
    CHECK(kv.counters().torn_writes == rounds);
    CHECK(kv.counters().writes == rounds);
    CHECK(truncated > 0);
    CHECK(nothing_applied > 0);
  }
}

TEST_CASE("kv_store: faulty_kv is reproducible from its seed") {
  // The same seed and workload give the same outcomes, counters and contents.
  auto run = [](std::uint64_t seed) {
    auto inner = std::shared_ptr<kv_store>(make_memory_kv());
    faulty_kv kv(inner, fault_plan{.seed = seed, .write_error_rate = 0.3, .torn_write_rate = 0.3});
    prng workload(1234);  // the workload stays fixed; only the faults follow the seed
    std::string outcome;
    for (int w = 0; w < 100; ++w) {
      write_batch b;
      const auto n = 1 + workload.below(5);
      for (std::uint64_t i = 0; i < n; ++i)
        b.put(static_cast<column>(workload.below(column_count)), be64(workload.below(50)),
              std::string(1 + workload.below(30), 'v'));
      const status st = kv.write(b);
      outcome += st ? "ok;" : st.err().message + ";";
    }
    const fault_counters c = kv.counters();
    return std::tuple{outcome, dump(*inner), c.writes, c.write_errors, c.torn_writes};
  };
  for (std::uint64_t seed : {5, 6}) {
    CAPTURE(seed);
    const auto a = run(seed), b = run(seed);
    CHECK(a == b);
    CHECK(std::get<2>(a) == 100);
    CHECK(std::get<3>(a) > 0);
    CHECK(std::get<4>(a) > 0);
  }
  CHECK(run(5) != run(6));
}

TEST_CASE("kv_store: faulty_kv fails every write after fail_after_writes successes") {
  {
    auto inner = std::shared_ptr<kv_store>(make_memory_kv());
    faulty_kv kv(inner, fault_plan{.seed = 3, .fail_after_writes = 3});
    for (int i = 0; i < 10; ++i) {
      CAPTURE(i);
      write_batch b;
      b.put(column::tape, be64(static_cast<std::uint64_t>(i)), "r");
      const status st = kv.write(b);
      CHECK(static_cast<bool>(st) == (i < 3));
      if (!st) CHECK(st.err().code == errc::io_error);
    }
    CHECK(scan_all(*inner, column::tape).size() == 3);
    const fault_counters c = kv.counters();
    CHECK(c.writes == 10);
    CHECK(c.write_errors == 7);
  }
  {  // injected failures do not count as successes: the disk dies after 5 good writes
    const std::uint64_t seed = 8;
    CAPTURE(seed);
    auto inner = std::shared_ptr<kv_store>(make_memory_kv());
    faulty_kv kv(inner, fault_plan{.seed = seed, .write_error_rate = 0.5, .fail_after_writes = 5});
    int successes = 0, last_success = -1;
    for (int i = 0; i < 200; ++i) {
      write_batch b;
      b.put(column::tape, be64(static_cast<std::uint64_t>(i)), "r");
      if (kv.write(b)) {
        ++successes;
        last_success = i;
      }
    }
    CHECK(successes == 5);
    CHECK(last_success > 4);  // some injected errors came before the fifth success
    CHECK(scan_all(*inner, column::tape).size() == 5);
  }
}

TEST_CASE("kv_store: faulty_kv over rocksdb leaves a torn prefix on disk") {
  temp_dir dir;
  const std::string path = dir.file("db");
  const std::uint64_t seed = 4;
  CAPTURE(seed);
  write_batch b;
  for (std::uint32_t i = 0; i < 8; ++i) b.put(column::fragments, be32(i), std::string(100, 'f'));
  std::size_t survivors = 0;
  {
    faulty_kv kv(std::shared_ptr<kv_store>(must_open(path)), fault_plan{.seed = seed, .torn_write_rate = 1.0});
    CHECK_FALSE(kv.write(b));
    survivors = scan_all(kv, column::fragments).size();
    CHECK(survivors < b.ops.size());
    CHECK(survivors > 0);  // this seed tears after a few ops, so the prefix is not trivially empty
  }
  auto kv = must_open(path, {open_mode::existing, false});
  const pairs after = scan_all(*kv, column::fragments);
  REQUIRE(after.size() == survivors);
  for (std::size_t i = 0; i < after.size(); ++i) {
    CAPTURE(i);
    CHECK(after[i].first == be32(static_cast<std::uint32_t>(i)));
    if (i + 1 < after.size()) CHECK(after[i].second.size() == 100);
    else CHECK(after[i].second.size() < 100);  // the last value of the prefix was cut short
  }
}
