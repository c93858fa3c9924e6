#include "bench/snapshot_bench.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>

#include "bench/bench_mesh.hpp"
#include "bench/bench_stats.hpp"
#include "bench/snapshot_baseline.hpp"
#include "core/clock.hpp"
#include "core/config.hpp"
#include "core/mesh_setup.hpp"
#include "core/prng.hpp"
#include "node/mesh_snapshots.hpp"
#include "parameter_shard/shard_snapshots.hpp"
#include "parameter_shard/shard_wire.hpp"
#include "storage/snapshot_store.hpp"
#include "storage/snapshot_writer.hpp"

namespace archipelago {
namespace {

namespace fs = std::filesystem;

/// A fresh directory under `parent`, removed with everything in it on destruction.
class scratch_dir {
 public:
  static expected<std::unique_ptr<scratch_dir>> make(const std::string& parent, const std::string& tag) {
    std::string pattern = (fs::path(parent) / ("archipelago-bench-snapshot-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      return make_error(errc::io_error,
                        "cannot create a temporary directory under " + parent + ": " + std::strerror(errno));
    return std::unique_ptr<scratch_dir>(new scratch_dir(pattern));
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  /// A path inside it that does not exist yet (RocksDB creates it).
  std::string sub(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  explicit scratch_dir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

/// A field of /proc/self/io ("write_bytes": what this process, every thread,
/// caused to be written to storage so far); 0 where the kernel has no such file.
std::uint64_t process_io(const std::string& field) {
  std::ifstream in("/proc/self/io");
  std::string name;
  std::uint64_t value = 0;
  while (in >> name >> value)
    if (name == field + ":") return value;
  return 0;
}

/// A field of /proc/self/status in kB ("VmRSS", "VmHWM"); 0 where missing.
std::uint64_t status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream fields(line.substr(field.size() + 1));
      std::uint64_t kb = 0;
      fields >> kb;
      return kb;
    }
  return 0;
}

/// Starts measuring the peak resident set afresh (Linux: clear_refs 5 resets VmHWM to VmRSS).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

std::uint64_t bytes_on_disk(const std::string& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

// ---- 1. round latency, snapshots on vs off ------------------------------------------

expected<mesh_run> run_mesh(const config& cfg, const std::string& db, const bench_hooks& hooks,
                            const std::string& label) {
  mesh_snapshots snaps;
  snaps.db = db;
  auto s = run_bench_mesh(cfg, hooks, "bench snapshot: " + label, 90, mesh_eval{}, snaps);
  if (!s) return s.err();
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

/// One run of a pair: with snapshots into a fresh store, or without.
expected<mesh_run> run_side(const config& cfg, bool snapshots, const std::string& label, const std::string& parent,
                            const bench_hooks& hooks) {
  hooks.begin("bench snapshot: " + label);
  std::unique_ptr<scratch_dir> dir;
  if (snapshots) {
    auto d = scratch_dir::make(parent, "mesh");
    if (!d) return d.err();
    dir = std::move(*d);
  }
  auto r = run_mesh(cfg, dir ? dir->sub("db") : std::string(), hooks, label);
  if (!r) return r.err();
  if (snapshots && r->mesh_version < 2)
    return make_error(errc::internal, label + ": no snapshot beyond the initial one was committed");
  return r;
}

/// The mesh of the latency figures (--model, decoupled, --learners, --steps).
expected<config> latency_config(const snapshot_options& o) {
  config cfg;
  cfg.model.size = o.model;
  cfg.mesh.mode = "decoupled";
  cfg.mesh.learners = o.learners;
  cfg.train.steps = o.steps;
  cfg.storage.sync = o.sync;
  if (auto ok = validate_mesh(cfg); !ok) return ok.err();
  return cfg;
}

/// Pairs of mesh runs, one side with `on` set and one without, in the order off,
/// on; then on, off; ... `side(on)` says how a side runs: its configuration, whether
/// it snapshots, its label.
struct side_setup {
  config cfg;
  bool snapshots = false;
  std::string label;
};
expected<latency_result> run_pairs(int pairs, const std::function<side_setup(bool on)>& side,
                                   const std::string& parent, const bench_hooks& hooks) {
  latency_result out;
  for (int pair = 0; pair < pairs; ++pair) {
    mesh_run sides[2];  // off, on
    for (int k = 0; k < 2; ++k) {
      if (hooks.stopped()) return interrupted();
      const bool on = (k == 0) == (pair % 2 == 1);
      const side_setup s = side(on);
      const std::string label = "mesh run " + std::to_string(2 * pair + k + 1) + "/" + std::to_string(2 * pairs) +
                                " (" + s.label + ")";
      auto r = run_side(s.cfg, s.snapshots, label, parent, hooks);
      if (!r) return r.err();
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

/// A model option: a layout file (a path ending in .json) or a preset name.
bool is_layout_file(const std::string& model) { return model.size() > 5 && model.ends_with(".json"); }

expected<model_fixture> make_fixture(const std::string& model, int fragments, int shards = 0) {
  model_fixture f;
  if (is_layout_file(model)) f.cfg.model.layout = model;
  else f.cfg.model.size = model;
  if (fragments > 0) f.cfg.mesh.fragments = fragments;
  if (shards > 0) f.cfg.mesh.shards = shards;
  f.cfg.mesh.mode = "decoupled";
  auto policy = resolve_policy(f.cfg);
  if (!policy) return policy.err();
  if (auto ok = validate_mesh(f.cfg); !ok) return ok.err();
  f.setup = make_mesh_setup(f.cfg, *policy);
  f.params.resize(f.setup.layout.total_floats);
  prng rng(42);
  for (float& x : f.params) x = static_cast<float>(rng.uniform() * 0.1 - 0.05);
  return f;
}

/// What one store sample wrote and how long it took.
struct store_sample_out {
  std::vector<batch_shape> setup_batches, timed_batches;  // the initial commits'; the timed commits'
  std::uint64_t payload = 0;  // theta + momentum (+ Adam moments) floats committed, in bytes
  double seconds = 0;         // in commit() plus the final flushes (log, then memtables)
  double kv_seconds = 0;      // of that, in RocksDB's write and flushes
  std::uint64_t written = 0;  // bytes the process wrote to disk meanwhile
  std::vector<double> commit_s;  // each timed commit's seconds
  std::uint64_t peak_rss_kb = 0;  // the peak resident set above the sample's start
  std::uint64_t disk_bytes = 0;   // the store's directory at the end
};

/// The `k`-th timed commit: one fragment state, built outside the timed part, as
/// a shard hands it over ready.
storage::commit_job nth_commit(const storage::commit_job& initial, int k) {
  const std::size_t fragments = initial.fragments.size();
  const storage::fragment_write& from = initial.fragments[static_cast<std::size_t>(k) % fragments];
  storage::fragment_state s{from.fragment, 0, 0, 0, {from.theta.begin(), from.theta.end()},
                            {from.momentum.begin(), from.momentum.end()}, {from.adam_m.begin(), from.adam_m.end()},
                            {from.adam_v.begin(), from.adam_v.end()}, from.adam_steps};
  s.version = static_cast<std::uint64_t>(k) / fragments + 1;
  s.round = static_cast<std::uint64_t>(k) + 1;
  s.theta[0] += 1e-3f * static_cast<float>(k);  // each version differs
  storage::commit_job job;
  job.time_ns = s.time_ns = wall_clock_ns();
  job.fragments.push_back(storage::owned_write(std::move(s)));
  return job;
}

/// Commits `commits` one-fragment jobs through the snapshot store in a new store at `path`.
expected<store_sample_out> store_sample(const model_fixture& f, const storage::commit_job& initial, int commits,
                                        bool sync, const std::string& path, const bench_hooks& hooks,
                                        const std::string& label) {
  auto kv = storage::open_rocksdb(path, {storage::open_mode::create, sync});
  if (!kv) return kv.err();
  auto recorder = std::make_shared<recording_kv>(std::move(*kv));
  auto store = storage::snapshot_store::create(recorder, store_info_of(f.setup), retention_of(f.cfg));
  if (!store) return store.err();
  // The initial states one fragment per commit (a model of real size in one batch
  // is several copies of it in memory), settled on disk before the timed part.
  for (const auto& state : initial.fragments) {
    storage::commit_job one;
    one.fragments.push_back(state);
    one.time_ns = initial.time_ns;
    if (auto v = (*store)->commit(one); !v) return v.err();
  }
  if (auto ok = recorder->flush_memtables(); !ok) return ok.err();
  store_sample_out out;
  out.setup_batches = recorder->take();
  (void)recorder->take_write_seconds();
  const std::uint64_t rss_kb = status_kb("VmRSS");
  reset_peak_rss();
  const std::uint64_t written = process_io("write_bytes");
  for (int k = 0; k < commits; ++k) {
    if (hooks.stopped()) return interrupted();
    if (k % 8 == 0) hooks.update(label + ": commit " + std::to_string(k + 1) + "/" + std::to_string(commits));
    const storage::commit_job job = nth_commit(initial, k);
    out.payload += job.fragments.back().bytes();
    const auto t0 = seconds_clock::now();
    auto v = (*store)->commit(job);
    out.commit_s.push_back(since(t0));
    out.seconds += out.commit_s.back();
    if (!v) return v.err();
  }
  const auto t0 = seconds_clock::now();
  if (auto ok = recorder->flush(); !ok) return ok.err();
  if (auto ok = recorder->flush_memtables(); !ok) return ok.err();
  const double flush_s = since(t0);
  out.seconds += flush_s;
  out.written = process_io("write_bytes") - written;
  const std::uint64_t peak_kb = status_kb("VmHWM");
  out.peak_rss_kb = peak_kb > rss_kb ? peak_kb - rss_kb : 0;
  out.timed_batches = recorder->take();
  out.kv_seconds = recorder->take_write_seconds() + flush_s;
  out.disk_bytes = bytes_on_disk(path);
  return out;
}

/// The disk itself: every timed batch's bytes appended to a new file at `path` in
/// 8 MiB writes, fdatasync'd at the end (with `sync`, after every batch's bytes,
/// as a synced commit would be). Returns the seconds.
expected<double> disk_write_sample(const std::vector<batch_shape>& timed, bool sync, const std::string& path,
                                   const bench_hooks& hooks) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(errc::io_error, "cannot create " + path + ": " + std::strerror(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_at_end{fd};
  std::vector<char> chunk(std::size_t{8} << 20);
  prng rng(11);
  for (char& c : chunk) c = static_cast<char>(rng.next());
  auto failed = [&](const char* what) {
    return make_error(errc::io_error, std::string(what) + " of " + path + ": " + std::strerror(errno));
  };
  const auto t0 = seconds_clock::now();
  for (const batch_shape& b : timed) {
    if (hooks.stopped()) return interrupted();
    for (std::uint64_t left = b.bytes(); left > 0;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, chunk.size()));
      const ssize_t w = ::write(fd, chunk.data(), n);
      if (w <= 0) return failed("write");
      left -= static_cast<std::uint64_t>(w);
    }
    if (sync && ::fdatasync(fd) != 0) return failed("fdatasync");
  }
  if (::fdatasync(fd) != 0) return failed("fdatasync");
  return since(t0);
}

/// One round of the write figure: the store, both RocksDB baselines and the disk,
/// the order rotating round by round; each in a fresh directory.
status write_round(write_result& out, const snapshot_options& o, const model_fixture& f,
                   const storage::commit_job& initial, const store_sample_out& recorded, int round,
                   const std::string& parent, const bench_hooks& hooks) {
  constexpr int sides = 4;  // store, plain, plain into the store's families, the disk
  double mbps[sides] = {};
  for (int k = 0; k < sides; ++k) {
    if (hooks.stopped()) return interrupted();
    const int side = (k + round) % sides;
    static const char* const names[] = {" (snapshot store)", " (plain RocksDB)", " (plain RocksDB, store's families)",
                                        " (the disk: a file)"};
    const std::string label = "bench snapshot: write round " + std::to_string(round + 1) + "/" +
                              std::to_string(o.rounds) + names[side];
    hooks.begin(label);
    auto dir = scratch_dir::make(parent, "write");
    if (!dir) return dir.err();
    const std::uint64_t written = process_io("write_bytes");
    expected<double> seconds = 0.0;
    if (side == 3) {
      seconds = disk_write_sample(recorded.timed_batches, o.sync, (*dir)->sub("file"), hooks);
    } else if (side > 0) {
      seconds = plain_write_sample(recorded.setup_batches, recorded.timed_batches, o.sync, side == 2,
                                   (*dir)->sub("db"), hooks, label);
      if (side == 1 && seconds)
        out.plain_amplification.push_back(static_cast<double>(process_io("write_bytes") - written) /
                                          static_cast<double>(out.payload_bytes));
    } else if (auto s = store_sample(f, initial, o.commits, o.sync, (*dir)->sub("db"), hooks, label); s) {
      out.kv_share.push_back(s->kv_seconds / s->seconds);
      out.store_amplification.push_back(static_cast<double>(s->written) / static_cast<double>(out.payload_bytes));
      out.store_peak_rss_mb.push_back(static_cast<double>(s->peak_rss_kb) / 1024);
      out.store_disk_mb.push_back(static_cast<double>(s->disk_bytes) * 1e-6);
      seconds = s->seconds;
    } else {
      seconds = s.err();
    }
    if (!seconds) return seconds.err();
    mbps[side] = static_cast<double>(out.timed_bytes) / *seconds * 1e-6;
  }
  out.store_mbps.push_back(mbps[0]);
  out.plain_mbps.push_back(mbps[1]);
  out.families_mbps.push_back(mbps[2]);
  out.disk_mbps.push_back(mbps[3]);
  out.ratio.push_back(mbps[0] / mbps[1]);
  out.families_ratio.push_back(mbps[0] / mbps[2]);
  out.disk_ratio.push_back(mbps[0] / mbps[3]);
  return {};
}

// ---- 3. restore ----------------------------------------------------------------------------

/// Open read-only, pick the newest valid manifest, read the parameters; checks
/// them against what was written.
expected<double> restore_sample(const model_fixture& f, const std::string& path, restore_layout& out) {
  const auto t0 = seconds_clock::now();
  auto store = open_store_read_only(path);
  if (!store) return store.err();
  const double opened = since(t0);
  std::vector<storage::fragment_state> states;  // read and verified once, by the pick
  auto m = pick_manifest(**store, std::nullopt, &states);
  if (!m) return m.err();
  const double picked = since(t0);
  auto params = storage::snapshot_store::params_from(*m, states, f.setup.layout, f.setup.plan);
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

/// One snapshot of the fixture, committed as open_mesh_store creates a run's
/// store, with a recorder in between to count the fragment records' bytes.
status write_one_snapshot(restore_result& out, const model_fixture& f, bool sync, const std::string& path) {
  auto kv = storage::open_rocksdb(path, {storage::open_mode::create, sync});
  if (!kv) return kv.err();
  auto recorder = std::make_shared<recording_kv>(std::move(*kv));
  auto store = storage::snapshot_store::create(recorder, store_info_of(f.setup), retention_of(f.cfg));
  if (!store) return store.err();
  if (auto v = (*store)->commit(initial_commit(f.setup, f.params, wall_clock_ns())); !v) return v.err();
  if (auto ok = recorder->flush(); !ok) return ok.err();
  for (const auto& b : recorder->take())
    for (const auto& p : b.puts)
      if (p.col == storage::column::fragments || p.col == storage::column::pieces) out.fragment_bytes += p.value_bytes;
  return {};
}

/// Rounds of (store, plain) restores of one layout, the order alternating.
status restore_rounds(restore_layout& layout, bool flushed, const snapshot_options& o, const model_fixture& f,
                      const std::string& path, std::vector<char>& buffer, const bench_hooks& hooks) {
  for (int round = 0; round < o.rounds; ++round) {
    double seconds[2] = {};  // store, plain
    for (int k = 0; k < 2; ++k) {
      if (hooks.stopped()) return interrupted();
      const bool plain = (k == 1) == (round % 2 == 0);
      hooks.update("bench snapshot: restore" + std::string(flushed ? " (flushed)" : "") + " round " +
                   std::to_string(round + 1) + "/" + std::to_string(o.rounds) +
                   (plain ? " (plain RocksDB)" : " (snapshot store)"));
      auto s = plain ? plain_restore_sample(path, buffer, layout) : restore_sample(f, path, layout);
      if (!s) return s.err();
      seconds[plain] = *s;
    }
    layout.store_s.push_back(seconds[0]);
    layout.plain_s.push_back(seconds[1]);
    layout.ratio.push_back(seconds[0] / seconds[1]);
  }
  return {};
}

// ---- 5. a shard's memory --------------------------------------------------------------

/// A port whose messages go nowhere (their bytes are counted).
class discard_port final : public transport::message_port {
 public:
  explicit discard_port(node_address self) : self_(self) {}
  node_address self() const override { return self_; }
  const std::string& endpoint() const override { return endpoint_; }
  status add_peer(node_address, const std::string&) override { return {}; }
  transport::envelope_builder make_envelope(std::uint64_t round) override {
    return transport::envelope_builder(self_, incarnation{1}, ++sequence_, round, epoch_);
  }
  status send(node_address, transport::encoded_message&& m) override {
    sent_bytes += m.total_bytes();
    return {};
  }
  status broadcast(const std::vector<node_address>& peers, transport::encoded_message&& m) override {
    sent_bytes += m.total_bytes() * peers.size();
    return {};
  }
  status set_link(node_address, const link_profile&) override { return {}; }
  const link_profile& default_link() const override { return link_; }
  std::uint64_t broker_epoch() const override { return epoch_; }
  void raise_broker_epoch(std::uint64_t epoch) override { epoch_ = std::max(epoch_, epoch); }
  std::uint64_t sent_bytes = 0;

 private:
  node_address self_;
  std::string endpoint_;
  link_profile link_;
  std::uint64_t sequence_ = 0, epoch_ = 0;
};

/// The shard's versions through the snapshot writer, as the actor shell hands
/// them over; the writer's answers wait in a queue for the bench's thread.
class writer_store final : public shard_store {
 public:
  /// The writer it goes through (set once made; it must go before the store does).
  storage::snapshot_writer* writer = nullptr;

  void commit(shard_commit c) override {
    storage::commit_job job;
    job.time_ns = wall_clock_ns();
    const published_fragment p = c.published;
    job.fragments.push_back(stored_write(p.fragment, std::move(c.state), job.time_ns));
    auto done = [this, p](const expected<std::uint64_t>& v) { answer_with(p, v.has_value()); };
    if (!writer->submit(std::move(job), std::move(done))) answer_with(p, false);  // refused: the queue was full
  }

  struct answer {
    fragment_index fragment;
    std::uint64_t version;
    round_number round;
    bool ok;
  };
  /// The answers so far; waits up to `bound` for one when `wait`.
  std::deque<answer> take(bool wait, std::chrono::milliseconds bound) {
    std::unique_lock lock(mutex_);
    if (wait) ready_.wait_for(lock, bound, [&] { return !answers_.empty(); });
    return std::exchange(answers_, {});
  }

 private:
  void answer_with(const published_fragment& p, bool ok) {
    std::lock_guard lock(mutex_);
    answers_.push_back({p.fragment, p.version, p.round, ok});
    ready_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<answer> answers_;
};

/// The frames of a message, as the receiving transport holds them.
struct received {
  transport::encoded_message message;
  std::unique_ptr<transport::decoded_envelope> envelope;
};
expected<received> receive(transport::encoded_message m) {
  received r{std::move(m), nullptr};
  std::vector<transport::frame_view> frames;
  frames.push_back({reinterpret_cast<const std::uint8_t*>(r.message.envelope.begin()),
                    r.message.envelope.size() * sizeof(capnp::word)});
  for (const auto& t : r.message.tensors) frames.push_back({t.data(), t.size()});
  auto decoded = transport::decode_envelope(frames);
  if (!decoded) return make_error(errc::internal, "bench shard: a message it built does not decode: " + decoded.message());
  r.envelope = decoded.take();
  return r;
}

/// --dir, or $TMPDIR, or /tmp; it must be a directory.
expected<std::string> parent_dir(const snapshot_options& o) {
  std::string parent = o.dir;
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp && *tmp ? tmp : "/tmp";
  }
  if (std::error_code ec; !fs::is_directory(parent, ec))
    return make_error(errc::invalid_input, "--dir " + parent + " is not a directory");
  return parent;
}

}  // namespace

bool wants(const snapshot_options& o, const std::string& part) {
  return std::find(o.parts.begin(), o.parts.end(), part) != o.parts.end();
}

std::vector<double> latency_result::pooled(bool snapshots, bool open) const {
  std::vector<double> all;
  for (const auto& r : snapshots ? on : off) {
    const auto& v = open ? r.open_ms : r.close_ms;
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

double latency_result::tokens(bool snapshots) const {
  std::vector<double> v;
  for (const auto& r : snapshots ? on : off) v.push_back(r.tokens_per_s);
  return median(v);
}

expected<latency_result> measure_latency(const snapshot_options& o, const std::string& parent, const bench_hooks& hooks) {
  auto cfg = latency_config(o);
  if (!cfg) return cfg.err();
  return run_pairs(
      o.pairs, [&](bool on) { return side_setup{*cfg, on, on ? "snapshots on" : "snapshots off"}; }, parent, hooks);
}

expected<sync_result> measure_sync(const snapshot_options& o, const std::string& parent, const bench_hooks& hooks) {
  auto cfg = latency_config(o);
  if (!cfg) return cfg.err();
  sync_result out;
  auto latency = run_pairs(
      o.pairs,
      [&](bool on) {
        config c = *cfg;
        c.storage.sync = on;
        return side_setup{c, true, on ? "storage.sync = true" : "storage.sync = false"};
      },
      parent, hooks);
  if (!latency) return latency.err();
  out.latency = std::move(*latency);
  // Commits of the write model, not synced and synced, the order alternating.
  auto f = make_fixture(o.write_model, o.fragments);
  if (!f) return f.err();
  const storage::commit_job initial = initial_commit(f->setup, f->params, wall_clock_ns());
  for (int round = 0; round < o.rounds; ++round) {
    double mbps[2] = {};
    for (int k = 0; k < 2; ++k) {
      if (hooks.stopped()) return interrupted();
      const bool sync = (k == 0) == (round % 2 == 1);
      const std::string label = "bench snapshot: sync round " + std::to_string(round + 1) + "/" +
                                std::to_string(o.rounds) + (sync ? " (storage.sync = true)" : " (storage.sync = false)");
      hooks.begin(label);
      auto dir = scratch_dir::make(parent, "sync");
      if (!dir) return dir.err();
      auto s = store_sample(*f, initial, o.commits, sync, (*dir)->sub("db"), hooks, label);
      if (!s) return s.err();
      std::uint64_t bytes = 0;
      for (const auto& b : s->timed_batches) bytes += b.bytes();
      mbps[sync] = static_cast<double>(bytes) / s->seconds * 1e-6;
      auto& ms = sync ? out.commit_ms_on : out.commit_ms_off;
      for (double c : s->commit_s) ms.push_back(c * 1e3);
    }
    out.commit_mbps_off.push_back(mbps[0]);
    out.commit_mbps_on.push_back(mbps[1]);
    out.commit_ratio.push_back(mbps[1] / mbps[0]);
  }
  return out;
}

expected<write_result> measure_writes(const snapshot_options& o, const std::string& parent, const bench_hooks& hooks) {
  auto f = make_fixture(o.write_model, o.fragments);
  if (!f) return f.err();
  const storage::commit_job initial = initial_commit(f->setup, f->params, wall_clock_ns());
  write_result out;
  out.fragments = initial.fragments.size();
  // An untimed store sample first: it records the batches the baselines repeat,
  // and warms up what a process does once (heap growth, RocksDB's first open).
  const std::string label = "bench snapshot: write warm-up (snapshot store)";
  hooks.begin(label);
  auto dir = scratch_dir::make(parent, "write");
  if (!dir) return dir.err();
  auto recorded = store_sample(*f, initial, o.commits, o.sync, (*dir)->sub("db"), hooks, label);
  dir->reset();
  if (!recorded) return recorded.err();
  out.payload_bytes = recorded->payload;
  for (const auto& b : recorded->timed_batches) {
    out.timed_bytes += b.bytes();
    out.deletes += b.deletes;
  }
  for (int round = 0; round < o.rounds; ++round)
    if (auto ok = write_round(out, o, *f, initial, *recorded, round, parent, hooks); !ok) return ok.err();
  return out;
}

expected<restore_result> measure_restore(const snapshot_options& o, const std::string& parent,
                                         const bench_hooks& hooks) {
  auto f = make_fixture(o.restore_model, o.fragments);
  if (!f) return f.err();
  restore_result out;
  out.params = f->setup.layout.param_count;
  out.fragments = f->setup.plan.fragments.size();
  auto dir = scratch_dir::make(parent, "restore");
  if (!dir) return dir.err();
  const std::string path = (*dir)->sub("db");
  hooks.begin("bench snapshot: restore: writing one snapshot of " + o.restore_model);
  // Closed before the restores: they open it as a resumed or replayed run would.
  if (auto ok = write_one_snapshot(out, *f, o.sync, path); !ok) return ok.err();
  out.disk_bytes = bytes_on_disk(path);
  std::vector<char> buffer(out.fragment_bytes, 1);  // the baseline's destination, touched
  if (auto ok = restore_rounds(out.logged, false, o, *f, path, buffer, hooks); !ok) return ok.err();
  if (auto ok = flush_to_tables(path); !ok) return ok.err();
  if (auto ok = restore_rounds(out.flushed, true, o, *f, path, buffer, hooks); !ok) return ok.err();
  return out;
}

expected<shard_memory_result> measure_shard_memory(const snapshot_options& o, const std::string& parent,
                                                   const bench_hooks& hooks) {
  if (!hooks.log) return make_error(errc::internal, "bench snapshot: the shard part needs a logger");
  logger& log = *hooks.log;
  hooks.begin("bench snapshot: shard memory (" + o.write_model + ")");
  reset_peak_rss();
  const double rss_start = static_cast<double>(status_kb("VmRSS")) * 1024;
  const auto started = seconds_clock::now();
  auto fixture = make_fixture(o.write_model, o.fragments, o.shards);  // the whole model's initial values
  if (!fixture) return fixture.err();
  const mesh_setup& setup = fixture->setup;
  const std::uint32_t index = 0;
  shard_memory_result out;
  out.initial_mb = static_cast<double>(fixture->params.size()) * 4e-6;
  auto dir = scratch_dir::make(parent, "shard");
  if (!dir) return dir.err();
  auto opened = open_mesh_store((*dir)->sub("db"), setup);
  if (!opened) return opened.err();
  writer_store store;  // before the writer: its answers reach the store until the writer is gone
  storage::snapshot_writer writer(opened->store, log,
                                  storage::writer_options{static_cast<std::size_t>(setup.cfg.storage.queue_mb) << 20});
  store.writer = &writer;
  discard_port port({role::parameter_shard, index});
  shard_wire shard(setup, index, incarnation{1}, port, log, &store, shard_settings(setup), fixture->params.data());
  std::vector<float>().swap(fixture->params);  // as a node process does once its shard holds its fragments
  const std::vector<fragment_index>& owned = shard.owned();
  for (fragment_index p : owned) out.owned_params += shard.core().value(p).size();
  if (auto ok = writer.submit(initial_writes(shard.core(), owned, wall_clock_ns())); !ok) return ok.err();
  shard.start();
  // The start's peak holds the whole model's initial values; the rounds' peak is the steady state.
  out.start_peak_mb = (static_cast<double>(status_kb("VmHWM")) * 1024 - rss_start) * 1e-6;
  reset_peak_rss();

  // Rounds go to the owned fragments in turn, τ = 2 open at once; the next waits
  // while `backlog` versions are not durable (the broker's back-pressure).
  const int tau = 2, backlog = std::max(1, static_cast<int>(setup.cfg.storage.backlog));
  const int rounds = 2 * static_cast<int>(owned.size());
  const std::uint64_t epoch = broker_epoch_of(1, 0);
  int undurable = 0;
  std::size_t largest = 0;
  for (fragment_index p : owned) largest = std::max(largest, shard.core().value(p).size());
  auto delta = std::make_shared<std::vector<float>>(largest);  // the bench's own: one learner's at a time
  out.bench_buffer_mb = static_cast<double>(largest) * 4e-6;
  auto settle = [&](bool wait) -> status {
    for (const auto& a : store.take(wait, std::chrono::milliseconds(200))) {
      if (!a.ok) return make_error(errc::io_error, "bench shard: a commit failed or was refused (see the log)");
      shard.on_committed(a.fragment, a.version, a.round);
      --undurable;
      ++out.versions_committed;
    }
    return {};
  };
  auto contribute = [&](int r) -> status {
    const fragment_index p = owned[static_cast<std::size_t>(r) % owned.size()];
    const std::size_t n = shard.core().value(p).size();
    for (int m = 0; m < o.learners; ++m) {
      std::vector<float>& d = *delta;
      d.resize(n);
      const auto salt = static_cast<std::uint32_t>(97 * m + 31 * r);
      for (std::size_t i = 0; i < n; ++i)
        d[i] = static_cast<float>(((static_cast<std::uint32_t>(i) * 2654435761u + salt) >> 20) & 1023) * 1e-6f - 5e-4f;
      transport::envelope_builder b({role::learner, static_cast<std::uint32_t>(m)}, incarnation{1},
                                    static_cast<std::uint64_t>(r) + 1, static_cast<std::uint64_t>(r));
      auto c = b.body().initContribution();
      c.setFragment(p.value);
      c.setSteps(1);
      c.setTokens(1000);
      c.setBrokerEpoch(epoch);
      b.add_fp32("fragment/" + std::to_string(p.value), delta);
      auto got = receive(b.finish());
      if (!got) return got.err();
      (void)shard.on_message(*got->envelope, 0);
    }
    return {};
  };
  auto close = [&](int r) -> status {
    const fragment_index p = owned[static_cast<std::size_t>(r) % owned.size()];
    transport::envelope_builder b(broker_address, incarnation{1}, static_cast<std::uint64_t>(r) + 1,
                                  static_cast<std::uint64_t>(r), epoch);
    auto close = b.body().initRoundClose();
    close.setFragment(p.value);
    close.setQuorumNs(1);
    auto members = close.initMembers(static_cast<unsigned>(o.learners));
    for (int m = 0; m < o.learners; ++m) {
      members[static_cast<unsigned>(m)].setLearner(static_cast<std::uint32_t>(m));
      members[static_cast<unsigned>(m)].setIncarnation(1);
      members[static_cast<unsigned>(m)].setWeight(1000.0 * 1000.0);
      members[static_cast<unsigned>(m)].setTokens(1000);
      members[static_cast<unsigned>(m)].setSteps(1);
    }
    auto got = receive(b.finish());
    if (!got) return got.err();
    (void)shard.on_message(*got->envelope, 0);
    ++undurable;
    return {};
  };
  for (int r = 0; r < rounds + tau - 1; ++r) {
    if (hooks.stopped()) return interrupted();
    hooks.update("bench snapshot: shard memory, round " + std::to_string(r + 1) + "/" + std::to_string(rounds));
    if (r < rounds) {
      while (undurable >= backlog)
        if (auto ok = settle(true); !ok) return ok.err();
      if (auto ok = contribute(r); !ok) return ok.err();
    }
    if (r >= tau - 1)
      if (auto ok = close(r - (tau - 1)); !ok) return ok.err();
    if (auto ok = settle(false); !ok) return ok.err();
  }
  if (auto ok = writer.drain(std::chrono::minutes(10)); !ok) return ok.err();
  if (auto ok = settle(false); !ok) return ok.err();
  out.rounds = static_cast<std::size_t>(rounds);
  out.seconds = since(started);
  const auto per_param = [&](double mb) { return mb * 1e6 / static_cast<double>(out.owned_params); };
  out.peak_mb = (static_cast<double>(status_kb("VmHWM")) * 1024 - rss_start) * 1e-6;
  out.end_mb = (static_cast<double>(status_kb("VmRSS")) * 1024 - rss_start) * 1e-6;
  out.start_peak_bytes_per_param = per_param(out.start_peak_mb);
  out.peak_bytes_per_param = per_param(out.peak_mb);
  out.end_bytes_per_param = per_param(out.end_mb);
  out.fragments_owned = owned.size();
  out.sent_mb = static_cast<double>(port.sent_bytes) * 1e-6;
  return out;
}

expected<snapshot_result> run_snapshot_bench(const snapshot_options& o, const bench_hooks& hooks) {
  auto parent = parent_dir(o);
  if (!parent) return parent.err();
  for (const auto* model : {&o.model, &o.write_model, &o.restore_model}) {
    if (model != &o.model && is_layout_file(*model)) {
      if (auto layout = load_layout_file(*model); !layout) return layout.err();
    } else if (auto shape = model_preset(*model); !shape) {
      return shape.err();
    }
  }
  snapshot_result r;
  r.load_before = load_average();
  const auto started = seconds_clock::now();
  if (wants(o, "latency")) {
    auto x = measure_latency(o, *parent, hooks);
    if (!x) return x.err();
    r.latency = std::move(*x);
  }
  if (wants(o, "write")) {
    auto x = measure_writes(o, *parent, hooks);
    if (!x) return x.err();
    r.write = std::move(*x);
  }
  if (wants(o, "restore")) {
    auto x = measure_restore(o, *parent, hooks);
    if (!x) return x.err();
    r.restore = std::move(*x);
  }
  if (wants(o, "sync")) {
    auto x = measure_sync(o, *parent, hooks);
    if (!x) return x.err();
    r.sync = std::move(*x);
  }
  if (wants(o, "shard")) {
    auto x = measure_shard_memory(o, *parent, hooks);
    if (!x) return x.err();
    r.shard = std::move(*x);
  }
  r.load_after = load_average();
  r.wall_s = since(started);
  return r;
}

}  // namespace archipelago
