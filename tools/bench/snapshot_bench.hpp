#pragma once
// bench snapshot: what versioned snapshots (storage/) cost, each figure against
// a baseline measured in the same run. A shared machine is noisy,
// so every figure alternates with its baseline, the order changes from one
// round to the next, and ratios are taken within a round:
//   1. round latency of the one-process mesh (run_local_mesh) with snapshots on
//      (a store in a fresh directory) vs off: p50 and p99 of close → publication
//      as the broker saw it (broker_report::round_latency_ms), pooled over the
//      runs of each side; tokens/s too;
//   2. write throughput: snapshot_store::commit of one fragment state per commit
//      (as a shard commits) vs a plain RocksDB write loop of the same bytes — the
//      store's puts (keys, value sizes) again, one WriteBatch per commit, with the
//      store's RocksDB options and sync setting, into one column family and,
//      to tell the layout's cost from the snapshot layer's, into the store's —
//      and vs the disk itself: the same bytes appended to a file (fdatasync at
//      the end, or after every commit's bytes with --sync). Each sample ends with
//      everything on disk (the store's memtables flushed, the file synced), so a
//      sustained load's background work (flushes, compactions) is in its time;
//      the bytes the process wrote to disk meanwhile (/proc/self/io) over the
//      payload are its write amplification, and its peak RSS is measured;
//   3. restore of a model: open the store read-only, pick the newest valid
//      manifest (reading and verifying every fragment state once), lay the
//      states out as parameters (params_from) vs opening the same
//      directory with plain RocksDB and copying the same value bytes out; once
//      as the writer left it (its tail in RocksDB's log) and once flushed;
//   4. (part `sync`, not among the default parts) what storage.sync = true costs
//      against false: the round latency pairs of 1. with snapshots on in both
//      runs, one fsyncing every commit; and the write model's commits, each
//      commit's latency and their throughput, synced and not, alternating;
//   5. (part `shard`, not among the default parts) what one parameter shard holds
//      per parameter it owns: its wire layer and core, the writer and a RocksDB
//      store, --learners contributions per round of the write model's fragments
//      it owns (shard 0 of --shards), τ = 2 rounds open, storage.backlog versions
//      (at least 1) not yet durable at most; the resident set's peak at the start (the whole
//      model's initial values, freed once the shard holds its own), in the
//      rounds and at the end, above the process's before, per owned parameter.
// Temporary stores live under snapshot_options::dir and are removed.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_hooks.hpp"
#include "core/error.hpp"

namespace archipelago {

struct snapshot_options {
  std::vector<std::string> parts{"latency", "write", "restore"};  // also: sync, shard
  std::string dir;  // parent of the temporary stores; empty: $TMPDIR or /tmp
  bool sync = false;  // fsync every write, the store's and the baseline's
  // 1. latency
  std::string model = "nano";
  int learners = 4;
  std::int64_t steps = 300;
  int pairs = 2;  // pairs of mesh runs, one with snapshots and one without
  // 2. write; a model is a preset name or a layout file (model.layout, a path ending in .json)
  std::string write_model = "mini";
  int commits = 96;  // one-fragment commits per sample
  int shards = 0;     // 5. shards of the write model (the bench is shard 0); 0: mesh.shards
  int fragments = 0;  // P of the write and restore models; 0: the configuration's default
  // 2. and 3.
  int rounds = 3;
  // 3. restore
  std::string restore_model = "mini";
};

/// Whether `part` (latency, write, restore) is among the options' parts.
bool wants(const snapshot_options& o, const std::string& part);

/// One mesh run, as its broker saw it.
struct mesh_run {
  std::vector<double> close_ms, open_ms;  // per published round
  double tokens_per_s = 0;
  std::uint64_t rounds = 0, published = 0, mesh_version = 0, snapshot_errors = 0, disk_bytes = 0;
};

struct latency_result {
  std::vector<mesh_run> off, on;                           // in pair order
  std::vector<double> p50_ratio, p99_ratio, tokens_ratio;  // per pair
  /// Every round's latency of one side: close → published, or open → published.
  std::vector<double> pooled(bool snapshots, bool open) const;
  /// The median tokens/s of one side's runs.
  double tokens(bool snapshots) const;
};

struct write_result {
  std::size_t fragments = 0;
  std::uint64_t payload_bytes = 0;  // theta + momentum floats of the timed commits
  std::uint64_t timed_bytes = 0;    // keys + values put by the timed commits
  std::size_t deletes = 0;          // retention's deletes in the timed commits (the baseline has none)
  std::vector<double> store_mbps, plain_mbps, ratio;  // per round; plain: one column family
  std::vector<double> families_mbps, families_ratio;  // plain into the store's column families
  std::vector<double> kv_share;  // of the store's time, the share spent in RocksDB's write (per round)
  std::vector<double> disk_mbps, disk_ratio;  // the same bytes appended to a file; store / that (per round)
  /// Bytes the process wrote to disk during a sample over the payload it committed (per round).
  std::vector<double> store_amplification, plain_amplification;
  std::vector<double> store_peak_rss_mb;  // the sample's peak resident set above its start (per round)
  std::vector<double> store_disk_mb;      // the store's directory at the end of its sample (per round)
};

/// One layout of the store on disk, restored `rounds` times by each side.
struct restore_layout {
  std::vector<double> store_s, open_s, pick_s, read_s;  // open read-only + pick + read_params
  std::vector<double> plain_s, plain_open_s, plain_read_s;
  std::vector<double> ratio;  // store / plain, per round
};

struct restore_result {
  std::size_t params = 0, fragments = 0;
  std::uint64_t fragment_bytes = 0;  // the fragment records' values in the store (heads and pieces)
  std::uint64_t disk_bytes = 0;
  restore_layout logged, flushed;  // as the writer left it; memtables flushed to table files
};

/// One parameter shard's memory (part `shard`); MB are 10^6 bytes above the process's before it.
struct shard_memory_result {
  std::size_t owned_params = 0, fragments_owned = 0, rounds = 0, versions_committed = 0;
  double initial_mb = 0;       // the whole model's initial values (freed once the shard holds its own)
  double bench_buffer_mb = 0;  // the bench's own delta buffer (one learner's contribution), counted in the figures
  double start_peak_mb = 0, peak_mb = 0, end_mb = 0;
  double start_peak_bytes_per_param = 0, peak_bytes_per_param = 0, end_bytes_per_param = 0;
  double sent_mb = 0, seconds = 0;
};

/// storage.sync = true (on) against false (off), both with snapshots.
struct sync_result {
  latency_result latency;  // off: storage.sync = false; on: true
  std::vector<double> commit_mbps_off, commit_mbps_on, commit_ratio;  // per round; ratio: on / off
  std::vector<double> commit_ms_off, commit_ms_on;  // every timed commit's latency, pooled
};

struct snapshot_result {
  std::optional<latency_result> latency;
  std::optional<sync_result> sync;
  std::optional<shard_memory_result> shard;
  std::optional<write_result> write;
  std::optional<restore_result> restore;
  double load_before = 0, load_after = 0, wall_s = 0;
};

/// The parts the options ask for, in order latency, write, restore.
expected<snapshot_result> run_snapshot_bench(const snapshot_options& o, const bench_hooks& hooks);

/// Each part alone, its temporary stores under `parent`.
expected<latency_result> measure_latency(const snapshot_options& o, const std::string& parent, const bench_hooks& hooks);
expected<write_result> measure_writes(const snapshot_options& o, const std::string& parent, const bench_hooks& hooks);
expected<restore_result> measure_restore(const snapshot_options& o, const std::string& parent,
                                         const bench_hooks& hooks);
expected<sync_result> measure_sync(const snapshot_options& o, const std::string& parent, const bench_hooks& hooks);
expected<shard_memory_result> measure_shard_memory(const snapshot_options& o, const std::string& parent,
                                                   const bench_hooks& hooks);

}  // namespace archipelago
