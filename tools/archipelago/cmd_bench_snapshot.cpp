// archipelago bench snapshot: what versioned snapshots (storage/) cost, each
// figure against a baseline measured in the same run. This machine class is
// shared and noisy, so every figure alternates with its baseline, the order
// changes from one round to the next, and ratios are taken within a round:
//   1. round latency of the one-process mesh (run_local_mesh) with snapshots on
//      (--db in a fresh directory) vs off: p50 and p99 of close → publication
//      as the broker saw it (broker_report::round_latency_ms), pooled over the
//      runs of each side; tokens/s too;
//   2. write throughput: snapshot_store::commit of one fragment state per commit
//      (as a shard commits) vs a plain RocksDB write loop of the same bytes — the
//      store's puts (keys, value sizes) again, one WriteBatch per commit, with the
//      store's RocksDB options and sync setting, into one column family and,
//      to tell the layout's cost from the snapshot layer's, into the store's;
//   3. restore of a model: open the store read-only, pick the newest valid
//      manifest, read_params (every checksum verified) vs opening the same
//      directory with plain RocksDB and copying the same value bytes out; once
//      as the writer left it (its tail in RocksDB's log) and once flushed.
// Temporary stores live under --dir (default $TMPDIR or /tmp) and are removed.

#include "cmd_bench_snapshot.hpp"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_stats.hpp"
#include "cli_common.hpp"
#include "core/prng.hpp"
#include "node/local_mesh.hpp"
#include "core/mesh_setup.hpp"
#include "node/mesh_snapshots.hpp"
#include "parameter_shard/shard_snapshots.hpp"
#include "storage/kv_store.hpp"
#include "storage/rocksdb_options.hpp"
#include "storage/snapshot_store.hpp"

namespace archipelago::cli {
namespace {

namespace fs = std::filesystem;
struct snapshot_options {
  bool json = false;
  std::vector<std::string> parts{"latency", "write", "restore"};
  std::string dir;  // parent of the temporary stores; empty: $TMPDIR or /tmp
  bool sync = false;
  // 1. latency
  std::string model = "nano";
  int learners = 4;
  std::int64_t steps = 300;
  int pairs = 2;
  // 2. write
  std::string write_model = "mini";
  int commits = 96;
  // 2. and 3.
  int rounds = 3;
  // 3. restore
  std::string restore_model = "mini";
  CLI::App* command = nullptr;  // the `snapshot` subcommand, to know whether it was parsed
};

snapshot_options& options() {
  static snapshot_options o;
  return o;
}

const char* goal(bool met) { return met ? "met" : "NOT met"; }

error interrupted() { return make_error(errc::internal, "interrupted"); }

// ---- temporary directories ----------------------------------------------------

/// A fresh directory under `parent`, removed with everything in it on destruction.
class scratch_dir {
 public:
  static expected<std::unique_ptr<scratch_dir>> make(const std::string& parent, const std::string& tag) {
    std::string pattern = (fs::path(parent) / ("archipelago-bench-snapshot-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      return make_error(errc::io_error, "cannot create a temporary directory under " + parent + ": " +
                                            std::strerror(errno));
    return std::unique_ptr<scratch_dir>(new scratch_dir(pattern));
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  const std::string& path() const { return path_; }
  /// A path inside it that does not exist yet (RocksDB creates it).
  std::string sub(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  explicit scratch_dir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

std::uint64_t bytes_on_disk(const std::string& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

// ---- a kv store that records what it is asked to write --------------------------

struct put_shape {
  storage::column col;
  std::string key;  // keys are short: kept, so the baseline's keys sort (and compact) as the store's
  std::size_t value_bytes = 0;
};
struct batch_shape {
  std::vector<put_shape> puts;
  std::size_t deletes = 0;
  std::uint64_t bytes() const {
    std::uint64_t b = 0;
    for (const auto& p : puts) b += p.key.size() + p.value_bytes;
    return b;
  }
};

/// Forwards to another kv store and records every successful batch's puts
/// (column, key, value size): what the baseline writes again. Also sums
/// the time spent in the inner store's write().
class recording_kv final : public storage::kv_store {
 public:
  explicit recording_kv(std::unique_ptr<storage::kv_store> inner) : inner_(std::move(inner)) {}

  status write(const storage::write_batch& batch) override {
    batch_shape shape;
    for (const auto& op : batch.ops)
      if (op.value) shape.puts.push_back({op.col, op.key, op.value->size()});
      else ++shape.deletes;
    const auto t0 = seconds_clock::now();
    status s = inner_->write(batch);
    const double seconds = since(t0);
    std::lock_guard lock(mutex_);
    write_seconds_ += seconds;
    if (s) batches_.push_back(std::move(shape));
    return s;
  }
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

  /// The batches recorded since the last call.
  std::vector<batch_shape> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(batches_, {});
  }
  /// Seconds spent in the inner store's write() since the last call.
  double take_write_seconds() {
    std::lock_guard lock(mutex_);
    return std::exchange(write_seconds_, 0.0);
  }

 private:
  std::unique_ptr<storage::kv_store> inner_;
  std::mutex mutex_;
  std::vector<batch_shape> batches_;
  double write_seconds_ = 0;
};

// ---- the plain RocksDB baseline ---------------------------------------------------

// The baseline opens its databases with the store's own options (storage/rocksdb_options.hpp),
// so it differs from the store by the snapshot layer only.

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
    for (int c = 1; c < storage::column_count; ++c) out->names.push_back(storage::to_string(static_cast<storage::column>(c)));
  if (read_only) {
    if (auto s = rocksdb::DB::ListColumnFamilies(storage::db_options(storage::open_mode::read_only), path, &out->names); !s.ok())
      return rocksdb_error("list column families of " + path, s);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const auto& n : out->names) families.emplace_back(n, storage::family_options());
  rocksdb::DBOptions options = storage::db_options(read_only ? storage::open_mode::read_only : storage::open_mode::create);
  options.create_missing_column_families = !read_only;
  const rocksdb::Status s = read_only
                                ? rocksdb::DB::OpenForReadOnly(options, path, families, &out->handles, &out->db)
                                : rocksdb::DB::Open(options, path, families, &out->handles, &out->db);
  if (!s.ok()) return rocksdb_error("open " + path, s);
  return out;
}

// ---- 1. round latency, snapshots on vs off ------------------------------------------

struct mesh_run {
  std::vector<double> close_ms, open_ms;  // per published round
  double tokens_per_s = 0;
  std::uint64_t rounds = 0, published = 0, mesh_version = 0, snapshot_errors = 0, disk_bytes = 0;
};

expected<mesh_run> run_mesh(const config& cfg, const std::string& db, progress_line& progress,
                            const std::string& label) {
  mesh_snapshots snaps;
  snaps.db = db;
  auto s = run_local_mesh(
      cfg,
      [&](const std::string& line) {
        progress.update("bench snapshot: " + label + ": " + line.substr(0, std::min<std::size_t>(line.size(), 90)));
      },
      [] { return stop_requested.load(); }, snaps);
  if (!s) return s.err();
  if (stop_requested.load()) return interrupted();
  mesh_run r;
  r.close_ms = s->broker.round_latency_ms;
  r.open_ms = s->broker.round_open_to_published_ms;
  // The learners' span on the broker's clock: the loop of run_local_mesh polls every 0.5 s.
  const nanos span = s->broker.last_leave_ns - s->broker.first_join_ns;
  const double span_s = s->broker.first_join_ns >= 0 && span > 0 ? static_cast<double>(span) * 1e-9 : s->wall_s;
  r.tokens_per_s = static_cast<double>(s->tokens) / span_s;
  r.rounds = s->rounds;
  r.published = s->published;
  r.mesh_version = s->mesh_version;
  r.snapshot_errors = s->snapshot_errors;
  if (!db.empty()) r.disk_bytes = bytes_on_disk(db);
  if (r.close_ms.empty())
    return make_error(errc::internal, label + ": the broker reported no published round (" +
                                          std::to_string(s->rounds) + " rounds closed)");
  return r;
}

struct latency_result {
  std::vector<mesh_run> off, on;  // in pair order
  std::vector<double> p50_ratio, p99_ratio, tokens_ratio;  // per pair
  std::vector<double> pooled(bool snapshots, bool open) const {
    std::vector<double> all;
    for (const auto& r : snapshots ? on : off) {
      const auto& v = open ? r.open_ms : r.close_ms;
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }
  double tokens(bool snapshots) const {
    std::vector<double> v;
    for (const auto& r : snapshots ? on : off) v.push_back(r.tokens_per_s);
    return median(v);
  }
};

expected<latency_result> measure_latency(const snapshot_options& o, const std::string& parent, progress_line& progress) {
  config cfg;
  cfg.model.size = o.model;
  cfg.mesh.mode = "decoupled";
  cfg.mesh.learners = o.learners;
  cfg.train.steps = o.steps;
  cfg.storage.sync = o.sync;
  if (auto ok = validate_mesh(cfg); !ok) return ok.err();
  latency_result out;
  const int runs = 2 * o.pairs;
  for (int pair = 0; pair < o.pairs; ++pair) {
    mesh_run sides[2];  // off, on
    for (int k = 0; k < 2; ++k) {
      if (stop_requested.load()) return interrupted();
      const bool on = (k == 0) == (pair % 2 == 1);  // off, on; then on, off; ...
      const int number = 2 * pair + k + 1;
      const std::string label = "mesh run " + std::to_string(number) + "/" + std::to_string(runs) +
                                (on ? " (snapshots on)" : " (snapshots off)");
      progress.update("bench snapshot: " + label, true);
      std::unique_ptr<scratch_dir> dir;
      if (on) {
        auto d = scratch_dir::make(parent, "mesh");
        if (!d) return d.err();
        dir = std::move(*d);
      }
      auto r = run_mesh(cfg, dir ? dir->sub("db") : std::string(), progress, label);
      if (!r) return r.err();
      if (on && r->mesh_version < 2)
        return make_error(errc::internal, label + ": no snapshot beyond the initial one was committed");
      sides[on] = std::move(*r);
    }
    out.p50_ratio.push_back(percentile(sides[1].close_ms, 0.5) / percentile(sides[0].close_ms, 0.5));
    out.p99_ratio.push_back(percentile(sides[1].close_ms, 0.99) / percentile(sides[0].close_ms, 0.99));
    out.tokens_ratio.push_back(sides[1].tokens_per_s / sides[0].tokens_per_s);
    out.off.push_back(std::move(sides[0]));
    out.on.push_back(std::move(sides[1]));
  }
  return out;
}

// ---- 2. write throughput --------------------------------------------------------------

/// A mesh setup of `model` in decoupled mode (theta + Nesterov momentum per fragment)
/// and random parameters for it.
struct model_fixture {
  config cfg;
  mesh_setup setup;
  std::vector<float> params;
};

expected<model_fixture> make_fixture(const std::string& model) {
  model_fixture f;
  f.cfg.model.size = model;
  f.cfg.mesh.mode = "decoupled";
  auto policy = resolve_policy(f.cfg);
  if (!policy) return policy.err();
  f.setup = make_mesh_setup(f.cfg, *policy);
  f.params.resize(f.setup.layout.total_floats);
  prng rng(42);
  for (float& x : f.params) x = static_cast<float>(rng.uniform() * 0.1 - 0.05);
  return f;
}

struct write_result {
  std::size_t fragments = 0;
  std::uint64_t payload_bytes = 0;  // theta + momentum floats of the timed commits
  std::uint64_t timed_bytes = 0;    // keys + values put by the timed commits
  std::size_t deletes = 0;          // retention's deletes in the timed commits (the baseline has none)
  std::vector<double> store_mbps, plain_mbps, ratio;  // per round; plain: one column family
  std::vector<double> families_mbps, families_ratio;   // plain into the store's column families
  std::vector<double> kv_share;  // of the store's time, the share spent in RocksDB's write (per round)
};

/// Commits `commits` one-fragment jobs through the snapshot store; returns the
/// seconds spent in commit() plus the final flush, and the batches written.
expected<double> store_sample(const model_fixture& f, const storage::commit_job& initial, int commits, bool sync,
                              const std::string& path, std::vector<batch_shape>& setup_batches,
                              std::vector<batch_shape>& timed_batches, std::uint64_t& payload, double& kv_seconds,
                              progress_line& progress, const std::string& label) {
  auto kv = storage::open_rocksdb(path, {storage::open_mode::create, sync});
  if (!kv) return kv.err();
  auto recorder = std::make_shared<recording_kv>(std::move(*kv));
  auto store = storage::snapshot_store::create(recorder, store_info_of(f.setup), retention_of(f.cfg));
  if (!store) return store.err();
  if (auto v = (*store)->commit(initial); !v) return v.err();
  setup_batches = recorder->take();
  (void)recorder->take_write_seconds();
  const std::size_t fragments = initial.fragments.size();
  double seconds = 0;
  payload = 0;
  for (int k = 0; k < commits; ++k) {
    if (stop_requested.load()) return interrupted();
    if (k % 8 == 0) progress.update(label + ": commit " + std::to_string(k + 1) + "/" + std::to_string(commits));
    storage::commit_job job;  // built outside the timed part, as a shard hands it over ready
    job.fragments.push_back(initial.fragments[static_cast<std::size_t>(k) % fragments]);
    storage::fragment_state& s = job.fragments.back();
    s.version = static_cast<std::uint64_t>(k) / fragments + 1;
    s.round = static_cast<std::uint64_t>(k) + 1;
    s.theta[0] += 1e-3f * static_cast<float>(k);  // each version differs
    job.time_ns = s.time_ns = wall_clock_ns();
    payload += (s.theta.size() + s.momentum.size() + s.adam_m.size() + s.adam_v.size()) * sizeof(float);
    const auto t0 = seconds_clock::now();
    auto v = (*store)->commit(job);
    seconds += since(t0);
    if (!v) return v.err();
  }
  const auto t0 = seconds_clock::now();
  if (auto ok = recorder->flush(); !ok) return ok.err();
  const double flush_s = since(t0);
  seconds += flush_s;
  timed_batches = recorder->take();
  kv_seconds = recorder->take_write_seconds() + flush_s;
  return seconds;
}

/// The baseline: the same puts (keys and value sizes, one WriteBatch per commit)
/// into a plain RocksDB database — into its default column family, or with
/// `store_families` into the same families as the store's; the setup batches
/// are written untimed first.
expected<double> plain_sample(const std::vector<batch_shape>& setup_batches, const std::vector<batch_shape>& timed,
                              bool sync, bool store_families, const std::string& path, progress_line& progress,
                              const std::string& label) {
  auto db = open_plain(path, false, store_families);
  if (!db) return db.err();
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
  double seconds = 0;
  for (std::size_t k = 0; k < timed.size(); ++k) {
    if (stop_requested.load()) return interrupted();
    if (k % 8 == 0) progress.update(label + ": batch " + std::to_string(k + 1) + "/" + std::to_string(timed.size()));
    const auto t0 = seconds_clock::now();
    auto ok = write(timed[k]);
    seconds += since(t0);
    if (!ok) return ok.err();
  }
  const auto t0 = seconds_clock::now();
  if (auto s = (*db)->db->FlushWAL(true); !s.ok()) return rocksdb_error("flush", s);
  seconds += since(t0);
  return seconds;
}

expected<write_result> measure_writes(const snapshot_options& o, const std::string& parent, progress_line& progress) {
  auto f = make_fixture(o.write_model);
  if (!f) return f.err();
  const storage::commit_job initial = initial_commit(f->setup, f->params);
  write_result out;
  out.fragments = initial.fragments.size();
  // An untimed store sample first: it records the batches the baselines repeat,
  // and warms up what a process does once (heap growth, RocksDB's first open).
  std::vector<batch_shape> setup_batches, timed;
  {
    const std::string label = "bench snapshot: write warm-up (snapshot store)";
    progress.update(label, true);
    auto dir = scratch_dir::make(parent, "write");
    if (!dir) return dir.err();
    double kv_seconds = 0;
    auto seconds = store_sample(*f, initial, o.commits, o.sync, (*dir)->sub("db"), setup_batches, timed,
                                out.payload_bytes, kv_seconds, progress, label);
    if (!seconds) return seconds.err();
    for (const auto& b : timed) {
      out.timed_bytes += b.bytes();
      out.deletes += b.deletes;
    }
  }
  for (int round = 0; round < o.rounds; ++round) {
    double mbps[3] = {};  // store, plain, plain into the store's families
    for (int k = 0; k < 3; ++k) {
      if (stop_requested.load()) return interrupted();
      const int side = (k + round) % 3;  // the order rotates round by round
      static const char* const names[] = {" (snapshot store)", " (plain RocksDB)", " (plain RocksDB, store's families)"};
      const std::string label = "bench snapshot: write round " + std::to_string(round + 1) + "/" +
                                std::to_string(o.rounds) + names[side];
      progress.update(label, true);
      auto dir = scratch_dir::make(parent, "write");
      if (!dir) return dir.err();
      expected<double> seconds = 0.0;
      if (side > 0) {
        seconds = plain_sample(setup_batches, timed, o.sync, side == 2, (*dir)->sub("db"), progress, label);
      } else {
        std::vector<batch_shape> s_batches, t_batches;
        std::uint64_t payload = 0;
        double kv_seconds = 0;
        seconds = store_sample(*f, initial, o.commits, o.sync, (*dir)->sub("db"), s_batches, t_batches, payload,
                               kv_seconds, progress, label);
        if (seconds) out.kv_share.push_back(kv_seconds / *seconds);
      }
      if (!seconds) return seconds.err();
      mbps[side] = static_cast<double>(out.timed_bytes) / *seconds * 1e-6;
    }
    out.store_mbps.push_back(mbps[0]);
    out.plain_mbps.push_back(mbps[1]);
    out.families_mbps.push_back(mbps[2]);
    out.ratio.push_back(mbps[0] / mbps[1]);
    out.families_ratio.push_back(mbps[0] / mbps[2]);
  }
  return out;
}

// ---- 3. restore ----------------------------------------------------------------------------

/// One layout of the store on disk, restored `rounds` times by each side.
struct restore_layout {
  std::vector<double> store_s, open_s, pick_s, read_s;  // open read-only + pick + read_params
  std::vector<double> plain_s, plain_open_s, plain_read_s;
  std::vector<double> ratio;  // store / plain, per round
};

struct restore_result {
  std::size_t params = 0, fragments = 0;
  std::uint64_t fragment_bytes = 0;  // the fragment records' values in the store
  std::uint64_t disk_bytes = 0;
  restore_layout logged, flushed;    // as the writer left it; memtables flushed to table files
};

/// Open read-only, pick the newest valid manifest, read the parameters; checks
/// them against what was written.
expected<double> restore_sample(const model_fixture& f, const std::string& path, restore_layout& out) {
  const auto t0 = seconds_clock::now();
  auto store = open_store_read_only(path);
  if (!store) return store.err();
  const double opened = since(t0);
  auto m = pick_manifest(**store, std::nullopt);
  if (!m) return m.err();
  const double picked = since(t0);
  auto params = (*store)->read_params(*m, f.setup.layout, f.setup.plan);
  if (!params) return params.err();
  const double seconds = since(t0);
  for (const auto& t : f.setup.layout.tensors)
    if (std::memcmp(params->data() + t.offset, f.params.data() + t.offset, t.size() * sizeof(float)) != 0)
      return make_error(errc::internal, "restored tensor " + t.name + " differs from the one written");
  out.open_s.push_back(opened);
  out.pick_s.push_back(picked - opened);
  out.read_s.push_back(seconds - picked);
  return seconds;
}

/// Plain RocksDB: open the same directory read-only and copy every value of the
/// fragments column family into `buffer` (block checksums verified, as the store
/// reads). The buffer is allocated and touched beforehand, so that the page
/// faults of fresh memory do not count against the baseline.
expected<double> plain_restore_sample(const std::string& path, std::vector<char>& buffer, restore_layout& out) {
  const auto t0 = seconds_clock::now();
  auto db = open_plain(path, true);
  if (!db) return db.err();
  const double opened = since(t0);
  const auto family = std::find((*db)->names.begin(), (*db)->names.end(), "fragments");
  if (family == (*db)->names.end()) return make_error(errc::internal, path + " has no fragments column family");
  rocksdb::ColumnFamilyHandle* handle = (*db)->handles[static_cast<std::size_t>(family - (*db)->names.begin())];
  std::uint64_t at = 0;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
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
  const double seconds = since(t0);
  if (at != buffer.size())
    return make_error(errc::internal, "plain RocksDB read " + std::to_string(at) + " bytes of fragment records, the store wrote " +
                                          std::to_string(buffer.size()));
  out.plain_open_s.push_back(opened);
  out.plain_read_s.push_back(seconds - opened);
  return seconds;
}

/// Writes every column family's memtable to table files (what RocksDB does by
/// itself as memtables fill), so that an open has no log to replay.
status flush_to_tables(const std::string& path) {
  auto db = std::make_unique<plain_db>();
  if (auto s = rocksdb::DB::ListColumnFamilies(storage::db_options(storage::open_mode::read_only), path, &db->names); !s.ok())
    return rocksdb_error("list column families of " + path, s);
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const auto& n : db->names) families.emplace_back(n, storage::family_options());
  if (auto s = rocksdb::DB::Open(storage::db_options(storage::open_mode::create), path, families, &db->handles, &db->db); !s.ok())
    return rocksdb_error("open " + path, s);
  rocksdb::FlushOptions fo;
  fo.wait = true;
  if (auto s = db->db->Flush(fo, db->handles); !s.ok()) return rocksdb_error("flush of " + path, s);
  return {};
}

expected<restore_result> measure_restore(const snapshot_options& o, const std::string& parent, progress_line& progress) {
  auto f = make_fixture(o.restore_model);
  if (!f) return f.err();
  restore_result out;
  out.params = f->setup.layout.param_count;
  out.fragments = f->setup.plan.fragments.size();
  auto dir = scratch_dir::make(parent, "restore");
  if (!dir) return dir.err();
  const std::string path = (*dir)->sub("db");
  progress.update("bench snapshot: restore: writing one snapshot of " + o.restore_model, true);
  {
    // As open_mesh_store creates a run's store, with a recorder in between to count the bytes.
    auto kv = storage::open_rocksdb(path, {storage::open_mode::create, o.sync});
    if (!kv) return kv.err();
    auto recorder = std::make_shared<recording_kv>(std::move(*kv));
    auto store = storage::snapshot_store::create(recorder, store_info_of(f->setup), retention_of(f->cfg));
    if (!store) return store.err();
    if (auto v = (*store)->commit(initial_commit(f->setup, f->params)); !v) return v.err();
    if (auto ok = recorder->flush(); !ok) return ok.err();
    for (const auto& b : recorder->take())
      for (const auto& p : b.puts)
        if (p.col == storage::column::fragments) out.fragment_bytes += p.value_bytes;
  }  // closed: what follows opens it as a resumed or replayed run would
  out.disk_bytes = bytes_on_disk(path);
  std::vector<char> buffer(out.fragment_bytes, 1);  // the baseline's destination, touched
  for (restore_layout* layout : {&out.logged, &out.flushed}) {
    const bool flushed = layout == &out.flushed;
    if (flushed)
      if (auto ok = flush_to_tables(path); !ok) return ok.err();
    for (int round = 0; round < o.rounds; ++round) {
      double seconds[2] = {};  // store, plain
      for (int k = 0; k < 2; ++k) {
        if (stop_requested.load()) return interrupted();
        const bool plain = (k == 1) == (round % 2 == 0);
        progress.update("bench snapshot: restore" + std::string(flushed ? " (flushed)" : "") + " round " +
                        std::to_string(round + 1) + "/" + std::to_string(o.rounds) +
                        (plain ? " (plain RocksDB)" : " (snapshot store)"));
        auto s = plain ? plain_restore_sample(path, buffer, *layout) : restore_sample(*f, path, *layout);
        if (!s) return s.err();
        seconds[plain] = *s;
      }
      layout->store_s.push_back(seconds[0]);
      layout->plain_s.push_back(seconds[1]);
      layout->ratio.push_back(seconds[0] / seconds[1]);
    }
  }
  return out;
}

// ---- the command -----------------------------------------------------------------------------

bool wants(const snapshot_options& o, const std::string& part) {
  return std::find(o.parts.begin(), o.parts.end(), part) != o.parts.end();
}

int run_snapshot() {
  const snapshot_options& o = options();
  install_stop_handlers();
  progress_line progress(20);
  auto fail = [&](const error& e) {
    progress.finish();
    return report(e);
  };
  std::string parent = o.dir;
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp && *tmp ? tmp : "/tmp";
  }
  if (std::error_code ec; !fs::is_directory(parent, ec))
    return fail(make_error(errc::invalid_input, "--dir " + parent + " is not a directory"));
  for (const auto* model : {&o.model, &o.write_model, &o.restore_model})
    if (auto shape = model_preset(*model); !shape) return fail(shape.err());
  const double load_before = load_average();
  const auto started = seconds_clock::now();

  std::optional<latency_result> lat;
  std::optional<write_result> wr;
  std::optional<restore_result> rs;
  if (wants(o, "latency")) {
    auto r = measure_latency(o, parent, progress);
    if (!r) return fail(r.err());
    lat = std::move(*r);
  }
  if (wants(o, "write")) {
    auto r = measure_writes(o, parent, progress);
    if (!r) return fail(r.err());
    wr = std::move(*r);
  }
  if (wants(o, "restore")) {
    auto r = measure_restore(o, parent, progress);
    if (!r) return fail(r.err());
    rs = std::move(*r);
  }
  progress.finish();
  const double load_after = load_average();
  const double total_s = since(started);

  // -- report ---------------------------------------------------------------------------
  std::printf("bench snapshot: %u CPUs, load average %.2f before, %.2f after; %.0f s; RocksDB writes %s\n",
              std::thread::hardware_concurrency(), load_before, load_after, total_s,
              o.sync ? "fsync'd (--sync)" : "not fsync'd (storage.sync = false)");
  json_line j;
  j.add("command", "bench snapshot")
      .add("cpus", static_cast<int>(std::thread::hardware_concurrency()))
      .add("load_before", load_before)
      .add("load_after", load_after)
      .add("wall_s", total_s)
      .add("sync", o.sync);
  bool latency_met = true;
  std::uint64_t snapshot_errors = 0;
  if (lat) {
    const auto off = lat->pooled(false, false), on = lat->pooled(true, false);
    const auto off_open = lat->pooled(false, true), on_open = lat->pooled(true, true);
    const double p50_off = percentile(off, 0.5), p50_on = percentile(on, 0.5);
    const double p99_off = percentile(off, 0.99), p99_on = percentile(on, 0.99);
    const double p50_ratio = p50_on / p50_off, p99_ratio = p99_on / p99_off;
    const double o50_off = percentile(off_open, 0.5), o50_on = percentile(on_open, 0.5);
    const double o99_off = percentile(off_open, 0.99), o99_on = percentile(on_open, 0.99);
    const double tok_off = lat->tokens(false), tok_on = lat->tokens(true), tok_ratio = median(lat->tokens_ratio);
    latency_met = p50_ratio <= 1.1 && p99_ratio <= 1.1;
    std::uint64_t versions = 0, disk = 0;
    for (const auto& r : lat->on) {
      versions += r.mesh_version;
      disk += r.disk_bytes;
      snapshot_errors += r.snapshot_errors;
    }
    const double runs_on = static_cast<double>(lat->on.size());
    std::printf("  round latency   model %s, decoupled, %d learners x %lld steps; %d pair%s of runs (off/on, then on/off)\n",
                o.model.c_str(), o.learners, static_cast<long long>(o.steps), o.pairs, o.pairs == 1 ? "" : "s");
    std::printf("                  close -> published at the broker, %zu rounds off, %zu on (pooled):\n", off.size(),
                on.size());
    std::printf("                    p50  off %.3f ms, on %.3f ms: on/off = %.3f (per pair: %s) [goal <= 1.1: %s]\n",
                p50_off, p50_on, p50_ratio, listed(lat->p50_ratio, "%.3f").c_str(), goal(p50_ratio <= 1.1));
    std::printf("                    p99  off %.3f ms, on %.3f ms: on/off = %.3f (per pair: %s) [goal <= 1.1: %s]\n",
                p99_off, p99_on, p99_ratio, listed(lat->p99_ratio, "%.3f").c_str(), goal(p99_ratio <= 1.1));
    std::printf("                  open -> published: p50 off %.1f ms, on %.1f ms (%.3f); p99 off %.1f ms, on %.1f ms (%.3f)\n",
                o50_off, o50_on, o50_on / o50_off, o99_off, o99_on, o99_on / o99_off);
    std::printf("                  tokens/s: off %.0f, on %.0f: on/off = %.3f (per pair: %s)\n", tok_off, tok_on,
                tok_ratio, listed(lat->tokens_ratio, "%.3f").c_str());
    std::printf("                  snapshots on: %.0f mesh versions committed per run, %.1f MB on disk, %llu failed or "
                "skipped\n",
                static_cast<double>(versions) / runs_on, static_cast<double>(disk) / runs_on * 1e-6,
                static_cast<unsigned long long>(snapshot_errors));
    j.add("model", o.model)
        .add("learners", o.learners)
        .add("steps", static_cast<std::int64_t>(o.steps))
        .add("pairs", o.pairs)
        .add("latency_rounds_off", static_cast<std::uint64_t>(off.size()))
        .add("latency_rounds_on", static_cast<std::uint64_t>(on.size()))
        .add("latency_p50_ms_off", p50_off)
        .add("latency_p50_ms_on", p50_on)
        .add("latency_p50_ratio", p50_ratio)
        .add_raw("latency_p50_ratio_per_pair", json_array(lat->p50_ratio))
        .add("latency_p99_ms_off", p99_off)
        .add("latency_p99_ms_on", p99_on)
        .add("latency_p99_ratio", p99_ratio)
        .add_raw("latency_p99_ratio_per_pair", json_array(lat->p99_ratio))
        .add("latency_goal_met", latency_met)
        .add("open_to_published_p50_ms_off", o50_off)
        .add("open_to_published_p50_ms_on", o50_on)
        .add("open_to_published_p99_ms_off", o99_off)
        .add("open_to_published_p99_ms_on", o99_on)
        .add("tokens_per_s_off", tok_off)
        .add("tokens_per_s_on", tok_on)
        .add("tokens_per_s_ratio", tok_ratio)
        .add_raw("tokens_per_s_ratio_per_pair", json_array(lat->tokens_ratio))
        .add("mesh_versions_per_run", static_cast<double>(versions) / runs_on)
        .add("snapshot_disk_mb_per_run", static_cast<double>(disk) / runs_on * 1e-6)
        .add("snapshot_errors", snapshot_errors);
  }
  if (wr) {
    const double store = median(wr->store_mbps), plain = median(wr->plain_mbps), ratio = median(wr->ratio);
    const double families = median(wr->families_mbps), families_ratio = median(wr->families_ratio);
    std::printf("  write           model %s: %d commits of one fragment state (theta + momentum; %zu fragments), "
                "%.1f MB per round, %d rounds\n",
                o.write_model.c_str(), o.commits, wr->fragments, static_cast<double>(wr->timed_bytes) * 1e-6, o.rounds);
    std::printf("                  snapshot_store::commit %.0f MB/s; plain RocksDB, one WriteBatch of the same puts per "
                "commit: %.0f MB/s (medians)\n",
                store, plain);
    std::printf("                  store / plain = %.3f (per round: %s)\n", ratio, listed(wr->ratio, "%.3f").c_str());
    std::printf("                  plain RocksDB putting into the store's column families %.0f MB/s: store / that = %.3f "
                "(per round: %s)\n",
                families, families_ratio, listed(wr->families_ratio, "%.3f").c_str());
    std::printf("                  of the store's time %.0f %% went to RocksDB's write (the rest: encoding, checksums, "
                "bookkeeping); its commits also deleted %zu old records (retention)\n",
                100 * median(wr->kv_share), wr->deletes);
    j.add("write_model", o.write_model)
        .add("write_commits", o.commits)
        .add("write_rounds", o.rounds)
        .add("write_fragments", static_cast<std::uint64_t>(wr->fragments))
        .add("write_mb", static_cast<double>(wr->timed_bytes) * 1e-6)
        .add("write_payload_mb", static_cast<double>(wr->payload_bytes) * 1e-6)
        .add("write_store_mbps", store)
        .add("write_plain_mbps", plain)
        .add("write_ratio", ratio)
        .add_raw("write_ratio_per_round", json_array(wr->ratio))
        .add("write_plain_families_mbps", families)
        .add("write_ratio_vs_families", families_ratio)
        .add_raw("write_ratio_vs_families_per_round", json_array(wr->families_ratio))
        .add("write_store_rocksdb_share", median(wr->kv_share))
        .add("write_deletes", static_cast<std::uint64_t>(wr->deletes));
  }
  if (rs) {
    const double mb = static_cast<double>(rs->fragment_bytes) * 1e-6;
    std::printf("  restore         model %s: %zu parameters, %zu fragments, %.1f MB of fragment records (%.1f MB on "
                "disk), page cache warm, %d rounds\n",
                o.restore_model.c_str(), rs->params, rs->fragments, mb, static_cast<double>(rs->disk_bytes) * 1e-6,
                o.rounds);
    j.add("restore_model", o.restore_model)
        .add("restore_params", static_cast<std::uint64_t>(rs->params))
        .add("restore_fragments", static_cast<std::uint64_t>(rs->fragments))
        .add("restore_mb", mb)
        .add("restore_disk_mb", static_cast<double>(rs->disk_bytes) * 1e-6);
    for (const restore_layout* layout : {&rs->logged, &rs->flushed}) {
      const bool flushed = layout == &rs->flushed;
      const double store = median(layout->store_s), plain = median(layout->plain_s), ratio = median(layout->ratio);
      std::printf("                  %s\n", flushed ? "after flushing the memtables to table files (no log to replay):"
                                                    : "as the writer left it (its last writes in RocksDB's log, replayed "
                                                      "at every open):");
      std::printf("                    store: open read-only %.3f s + newest valid manifest %.3f s + read_params %.3f s "
                  "= %.3f s\n",
                  median(layout->open_s), median(layout->pick_s), median(layout->read_s), store);
      std::printf("                    plain RocksDB: open %.3f s + copy of the same values %.3f s = %.3f s\n",
                  median(layout->plain_open_s), median(layout->plain_read_s), plain);
      std::printf("                    store / plain = %.2f (per round: %s; lower is better)\n", ratio,
                  listed(layout->ratio, "%.2f").c_str());
      const std::string prefix = flushed ? "restore_flushed_" : "restore_";
      j.add(prefix + "s", store)
          .add(prefix + "open_s", median(layout->open_s))
          .add(prefix + "pick_s", median(layout->pick_s))
          .add(prefix + "read_s", median(layout->read_s))
          .add(prefix + "plain_s", plain)
          .add(prefix + "plain_open_s", median(layout->plain_open_s))
          .add(prefix + "plain_read_s", median(layout->plain_read_s))
          .add(prefix + "ratio", ratio)
          .add_raw(prefix + "ratio_per_round", json_array(layout->ratio));
    }
  }
  if (snapshot_errors > 0)
    std::fprintf(stderr, "archipelago: %llu snapshot versions failed or were skipped in the runs with snapshots on\n",
                 static_cast<unsigned long long>(snapshot_errors));
  if (o.json) std::printf("%s\n", j.str().c_str());
  return snapshot_errors > 0 ? exit_failure : exit_ok;
}

}  // namespace

void add_bench_snapshot(CLI::App& bench) {
  snapshot_options& o = options();
  CLI::App* cmd = o.command = bench.add_subcommand(
      "snapshot", "Snapshots' cost: round latency on vs off, commit throughput vs plain RocksDB, restore time");
  cmd->add_option("--parts", o.parts, "Which figures, comma-separated: latency,write,restore (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"latency", "write", "restore"}));
  cmd->add_option("--model", o.model, "Model of the mesh runs (default nano)");
  cmd->add_option("--learners", o.learners, "Learners of the mesh runs (default 4)")->check(CLI::Range(1, 64));
  cmd->add_option("--steps", o.steps, "Inner steps per learner in each mesh run (default 300)")
      ->check(CLI::Range(std::int64_t{5}, std::int64_t{1000000}));
  cmd->add_option("--pairs", o.pairs, "Pairs of mesh runs, one with snapshots and one without (default 2)")
      ->check(CLI::Range(1, 20));
  cmd->add_option("--write-model", o.write_model, "Model whose fragment states are committed (default mini)");
  cmd->add_option("--commits", o.commits, "One-fragment commits per write sample (default 96)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--rounds", o.rounds, "Rounds of (store, plain RocksDB) for write and restore (default 3)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--restore-model", o.restore_model, "Model restored (default mini)");
  cmd->add_flag("--sync", o.sync, "fsync every write, the store's and the baseline's (storage.sync = true)");
  cmd->add_option("--dir", o.dir, "Where the temporary stores go (default: $TMPDIR or /tmp); removed at the end");
  cmd->add_flag("--json", o.json, "Print a one-line JSON summary last");
}

int run_bench_snapshot() {
  if (options().command == nullptr || !options().command->parsed()) return exit_bad_input;
  return run_snapshot();
}

}  // namespace archipelago::cli
