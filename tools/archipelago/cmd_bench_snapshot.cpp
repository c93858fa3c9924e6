// archipelago bench snapshot: what versioned snapshots cost — round latency with
// snapshots on vs off, commit throughput vs plain RocksDB and the disk, restore time vs a
// plain RocksDB read (tools/bench/snapshot_bench.hpp); each figure printed with
// its per-round ratios, all of them in one --json line.

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.hpp"
#include "bench/snapshot_bench.hpp"
#include "cmd_bench.hpp"

namespace archipelago::cli {
namespace {

struct snapshot_flags {
  snapshot_options bench;
  bool json = false;
  CLI::App* command = nullptr;  // the `snapshot` subcommand, to know whether it was parsed
};

snapshot_flags& options() {
  static snapshot_flags o;
  return o;
}

/// The close → published percentiles, pooled over each side's runs.
struct latency_figures {
  std::vector<double> off, on;
  double p50_off, p50_on, p99_off, p99_on, p50_ratio, p99_ratio;
  double o50_off, o50_on, o99_off, o99_on;  // open → published
  double tok_off, tok_on, tok_ratio;
  std::uint64_t versions = 0, disk = 0, snapshot_errors = 0;
  double runs_on = 0;
};

latency_figures figures_of(const latency_result& lat) {
  latency_figures x;
  x.off = lat.pooled(false, false);
  x.on = lat.pooled(true, false);
  const auto off_open = lat.pooled(false, true), on_open = lat.pooled(true, true);
  x.p50_off = percentile(x.off, 0.5), x.p50_on = percentile(x.on, 0.5);
  x.p99_off = percentile(x.off, 0.99), x.p99_on = percentile(x.on, 0.99);
  x.p50_ratio = x.p50_on / x.p50_off, x.p99_ratio = x.p99_on / x.p99_off;
  x.o50_off = percentile(off_open, 0.5), x.o50_on = percentile(on_open, 0.5);
  x.o99_off = percentile(off_open, 0.99), x.o99_on = percentile(on_open, 0.99);
  x.tok_off = lat.tokens(false), x.tok_on = lat.tokens(true), x.tok_ratio = median(lat.tokens_ratio);
  for (const auto& r : lat.on) {
    x.versions += r.mesh_version;
    x.disk += r.disk_bytes;
  }
  for (const auto* side : {&lat.off, &lat.on})  // the sync figure snapshots on both sides
    for (const auto& r : *side) x.snapshot_errors += r.snapshot_errors;
  x.runs_on = static_cast<double>(lat.on.size());
  return x;
}

void print_latency(const snapshot_options& o, const latency_result& lat, const latency_figures& x) {
  std::printf("  round latency   model %s, decoupled, %d learners x %lld steps; %d pair%s of runs (off/on, then on/off)\n",
              o.model.c_str(), o.learners, static_cast<long long>(o.steps), o.pairs, o.pairs == 1 ? "" : "s");
  // Durable before visible: with snapshots on, a version is broadcast once its write is done,
  // so the write is on this path — these ratios are that guarantee's cost.
  std::printf("                  close -> published at the broker, %zu rounds off, %zu on (pooled; on: the write\n"
              "                  is on this path, a version is broadcast once durable):\n",
              x.off.size(), x.on.size());
  std::printf("                    p50  off %.3f ms, on %.3f ms: on/off = %.3f (per pair: %s)\n", x.p50_off, x.p50_on,
              x.p50_ratio, listed(lat.p50_ratio, "%.3f").c_str());
  std::printf("                    p99  off %.3f ms, on %.3f ms: on/off = %.3f (per pair: %s)\n", x.p99_off, x.p99_on,
              x.p99_ratio, listed(lat.p99_ratio, "%.3f").c_str());
  std::printf("                  open -> published: p50 off %.1f ms, on %.1f ms (%.3f); p99 off %.1f ms, on %.1f ms (%.3f)\n",
              x.o50_off, x.o50_on, x.o50_on / x.o50_off, x.o99_off, x.o99_on, x.o99_on / x.o99_off);
  std::printf("                  tokens/s: off %.0f, on %.0f: on/off = %.3f (per pair: %s)\n", x.tok_off, x.tok_on,
              x.tok_ratio, listed(lat.tokens_ratio, "%.3f").c_str());
  std::printf("                  snapshots on: %.0f mesh versions committed per run, %.1f MB on disk, %llu failed or "
              "skipped\n",
              static_cast<double>(x.versions) / x.runs_on, static_cast<double>(x.disk) / x.runs_on * 1e-6,
              static_cast<unsigned long long>(x.snapshot_errors));
}

void add_latency_json(json_line& j, const snapshot_options& o, const latency_result& lat, const latency_figures& x) {
  j.add("model", o.model)
      .add("learners", o.learners)
      .add("steps", static_cast<std::int64_t>(o.steps))
      .add("pairs", o.pairs)
      .add("latency_rounds_off", static_cast<std::uint64_t>(x.off.size()))
      .add("latency_rounds_on", static_cast<std::uint64_t>(x.on.size()))
      .add("latency_p50_ms_off", x.p50_off)
      .add("latency_p50_ms_on", x.p50_on)
      .add("latency_p50_ratio", x.p50_ratio)
      .add_raw("latency_p50_ratio_per_pair", json_array(lat.p50_ratio))
      .add("latency_p99_ms_off", x.p99_off)
      .add("latency_p99_ms_on", x.p99_on)
      .add("latency_p99_ratio", x.p99_ratio)
      .add_raw("latency_p99_ratio_per_pair", json_array(lat.p99_ratio))
      .add("open_to_published_p50_ms_off", x.o50_off)
      .add("open_to_published_p50_ms_on", x.o50_on)
      .add("open_to_published_p99_ms_off", x.o99_off)
      .add("open_to_published_p99_ms_on", x.o99_on)
      .add("tokens_per_s_off", x.tok_off)
      .add("tokens_per_s_on", x.tok_on)
      .add("tokens_per_s_ratio", x.tok_ratio)
      .add_raw("tokens_per_s_ratio_per_pair", json_array(lat.tokens_ratio))
      .add("mesh_versions_per_run", static_cast<double>(x.versions) / x.runs_on)
      .add("snapshot_disk_mb_per_run", static_cast<double>(x.disk) / x.runs_on * 1e-6)
      .add("snapshot_errors", x.snapshot_errors);
}

void report_write(json_line& j, const snapshot_options& o, const write_result& wr) {
  const double store = median(wr.store_mbps), plain = median(wr.plain_mbps), ratio = median(wr.ratio);
  const double families = median(wr.families_mbps), families_ratio = median(wr.families_ratio);
  std::printf("  write           model %s: %d commits of one fragment state (theta + momentum; %zu fragments), "
              "%.1f MB per round, %d rounds\n",
              o.write_model.c_str(), o.commits, wr.fragments, static_cast<double>(wr.timed_bytes) * 1e-6, o.rounds);
  std::printf("                  snapshot_store::commit %.0f MB/s; plain RocksDB, one WriteBatch of the same puts per "
              "commit: %.0f MB/s (medians)\n",
              store, plain);
  std::printf("                  store / plain = %.3f (per round: %s)\n", ratio, listed(wr.ratio, "%.3f").c_str());
  std::printf("                  plain RocksDB putting into the store's column families %.0f MB/s: store / that = %.3f "
              "(per round: %s)\n",
              families, families_ratio, listed(wr.families_ratio, "%.3f").c_str());
  std::printf("                  of the store's time %.0f %% went to RocksDB's write (the rest: encoding, checksums, "
              "bookkeeping); its commits also deleted %zu old records (retention)\n",
              100 * median(wr.kv_share), wr.deletes);
  const double disk = median(wr.disk_mbps), disk_ratio = median(wr.disk_ratio);
  std::printf("                  the disk: the same bytes appended to a file %.0f MB/s: store / disk = %.3f (per round: %s)\n",
              disk, disk_ratio, listed(wr.disk_ratio, "%.3f").c_str());
  std::printf("                  written to disk per payload byte: store %.2f, plain RocksDB %.2f; the store's peak RSS "
              "+%.0f MB, its directory %.0f MB at the end (medians)\n",
              median(wr.store_amplification), median(wr.plain_amplification), median(wr.store_peak_rss_mb),
              median(wr.store_disk_mb));
  j.add("write_model", o.write_model)
      .add("write_commits", o.commits)
      .add("write_rounds", o.rounds)
      .add("write_fragments", static_cast<std::uint64_t>(wr.fragments))
      .add("write_mb", static_cast<double>(wr.timed_bytes) * 1e-6)
      .add("write_payload_mb", static_cast<double>(wr.payload_bytes) * 1e-6)
      .add("write_store_mbps", store)
      .add("write_plain_mbps", plain)
      .add("write_ratio", ratio)
      .add_raw("write_ratio_per_round", json_array(wr.ratio))
      .add("write_plain_families_mbps", families)
      .add("write_ratio_vs_families", families_ratio)
      .add_raw("write_ratio_vs_families_per_round", json_array(wr.families_ratio))
      .add("write_store_rocksdb_share", median(wr.kv_share))
      .add("write_deletes", static_cast<std::uint64_t>(wr.deletes))
      .add("write_disk_mbps", disk)
      .add("write_ratio_vs_disk", disk_ratio)
      .add_raw("write_ratio_vs_disk_per_round", json_array(wr.disk_ratio))
      .add("write_store_amplification", median(wr.store_amplification))
      .add("write_plain_amplification", median(wr.plain_amplification))
      .add("write_store_peak_rss_mb", median(wr.store_peak_rss_mb))
      .add("write_store_disk_mb", median(wr.store_disk_mb));
}

void report_sync(json_line& j, const snapshot_options& o, const sync_result& s) {
  const latency_figures x = figures_of(s.latency);
  std::printf("  sync            model %s, %d learners x %lld steps, snapshots on in every run; %d pair%s of runs "
              "(storage.sync false/true, then true/false)\n",
              o.model.c_str(), o.learners, static_cast<long long>(o.steps), o.pairs, o.pairs == 1 ? "" : "s");
  std::printf("                  close -> published, %zu rounds unsynced, %zu synced (pooled):\n", x.off.size(),
              x.on.size());
  std::printf("                    p50  false %.3f ms, true %.3f ms: true/false = %.3f (per pair: %s)\n", x.p50_off,
              x.p50_on, x.p50_ratio, listed(s.latency.p50_ratio, "%.3f").c_str());
  std::printf("                    p99  false %.3f ms, true %.3f ms: true/false = %.3f (per pair: %s)\n", x.p99_off,
              x.p99_on, x.p99_ratio, listed(s.latency.p99_ratio, "%.3f").c_str());
  std::printf("                  tokens/s: false %.0f, true %.0f: true/false = %.3f (per pair: %s)\n", x.tok_off,
              x.tok_on, x.tok_ratio, listed(s.latency.tokens_ratio, "%.3f").c_str());
  const double off = median(s.commit_mbps_off), on = median(s.commit_mbps_on), ratio = median(s.commit_ratio);
  std::printf("                  commits of model %s (%d per round, %d rounds): false %.0f MB/s, true %.0f MB/s: "
              "true/false = %.3f (per round: %s)\n",
              o.write_model.c_str(), o.commits, o.rounds, off, on, ratio, listed(s.commit_ratio, "%.3f").c_str());
  std::printf("                  commit latency p50 false %.1f ms, true %.1f ms; p99 false %.1f ms, true %.1f ms\n",
              percentile(s.commit_ms_off, 0.5), percentile(s.commit_ms_on, 0.5), percentile(s.commit_ms_off, 0.99),
              percentile(s.commit_ms_on, 0.99));
  j.add("sync_latency_p50_ms_false", x.p50_off)
      .add("sync_latency_p50_ms_true", x.p50_on)
      .add("sync_latency_p50_ratio", x.p50_ratio)
      .add_raw("sync_latency_p50_ratio_per_pair", json_array(s.latency.p50_ratio))
      .add("sync_latency_p99_ms_false", x.p99_off)
      .add("sync_latency_p99_ms_true", x.p99_on)
      .add("sync_latency_p99_ratio", x.p99_ratio)
      .add_raw("sync_latency_p99_ratio_per_pair", json_array(s.latency.p99_ratio))
      .add("sync_open_to_published_p50_ms_false", x.o50_off)
      .add("sync_open_to_published_p50_ms_true", x.o50_on)
      .add("sync_tokens_per_s_false", x.tok_off)
      .add("sync_tokens_per_s_true", x.tok_on)
      .add("sync_tokens_per_s_ratio", x.tok_ratio)
      .add("sync_snapshot_errors", x.snapshot_errors)
      .add("sync_commit_mbps_false", off)
      .add("sync_commit_mbps_true", on)
      .add("sync_commit_ratio", ratio)
      .add_raw("sync_commit_ratio_per_round", json_array(s.commit_ratio))
      .add("sync_commit_p50_ms_false", percentile(s.commit_ms_off, 0.5))
      .add("sync_commit_p50_ms_true", percentile(s.commit_ms_on, 0.5))
      .add("sync_commit_p99_ms_false", percentile(s.commit_ms_off, 0.99))
      .add("sync_commit_p99_ms_true", percentile(s.commit_ms_on, 0.99));
}

void report_shard(json_line& j, const snapshot_options& o, const shard_memory_result& s) {
  std::printf("  shard memory    model %s, shard 0 owns %zu fragments, %zu parameters; %d learners, %zu rounds, %zu "
              "versions committed, %.0f s\n",
              o.write_model.c_str(), s.fragments_owned, s.owned_params, o.learners, s.rounds, s.versions_committed,
              s.seconds);
  std::printf("                  resident above the process before: start peak %.0f MB (%.2f bytes per owned "
              "parameter; the whole model's initial values, %.0f MB, then freed)\n",
              s.start_peak_mb, s.start_peak_bytes_per_param, s.initial_mb);
  std::printf("                  in the rounds: peak %.0f MB (%.2f bytes per owned parameter), at the end %.0f MB "
              "(%.2f); the bench's own delta buffer, counted: %.0f MB\n",
              s.peak_mb, s.peak_bytes_per_param, s.end_mb, s.end_bytes_per_param, s.bench_buffer_mb);
  j.add("shard_model", o.write_model)
      .add("shard_owned_params", static_cast<std::uint64_t>(s.owned_params))
      .add("shard_fragments_owned", static_cast<std::uint64_t>(s.fragments_owned))
      .add("shard_learners", o.learners)
      .add("shard_rounds", static_cast<std::uint64_t>(s.rounds))
      .add("shard_versions_committed", static_cast<std::uint64_t>(s.versions_committed))
      .add("shard_initial_mb", s.initial_mb)
      .add("shard_bench_buffer_mb", s.bench_buffer_mb)
      .add("shard_start_peak_mb", s.start_peak_mb)
      .add("shard_peak_mb", s.peak_mb)
      .add("shard_end_mb", s.end_mb)
      .add("shard_start_peak_bytes_per_param", s.start_peak_bytes_per_param)
      .add("shard_peak_bytes_per_param", s.peak_bytes_per_param)
      .add("shard_end_bytes_per_param", s.end_bytes_per_param)
      .add("shard_seconds", s.seconds);
}

void report_restore_layout(json_line& j, const restore_layout& layout, bool flushed) {
  const double store = median(layout.store_s), plain = median(layout.plain_s), ratio = median(layout.ratio);
  std::printf("                  %s\n", flushed ? "after flushing the memtables to table files (no log to replay):"
                                                : "as the writer left it (its last writes in RocksDB's log, replayed "
                                                  "at every open):");
  std::printf("                    store: open read-only %.3f s + newest valid manifest with its states %.3f s + params_from %.3f s "
              "= %.3f s\n",
              median(layout.open_s), median(layout.pick_s), median(layout.read_s), store);
  std::printf("                    plain RocksDB: open %.3f s + copy of the same values %.3f s = %.3f s\n",
              median(layout.plain_open_s), median(layout.plain_read_s), plain);
  std::printf("                    store / plain = %.2f (per round: %s; lower is better)\n", ratio,
              listed(layout.ratio, "%.2f").c_str());
  const std::string prefix = flushed ? "restore_flushed_" : "restore_";
  j.add(prefix + "s", store)
      .add(prefix + "open_s", median(layout.open_s))
      .add(prefix + "pick_s", median(layout.pick_s))
      .add(prefix + "read_s", median(layout.read_s))
      .add(prefix + "plain_s", plain)
      .add(prefix + "plain_open_s", median(layout.plain_open_s))
      .add(prefix + "plain_read_s", median(layout.plain_read_s))
      .add(prefix + "ratio", ratio)
      .add_raw(prefix + "ratio_per_round", json_array(layout.ratio));
}

void report_restore(json_line& j, const snapshot_options& o, const restore_result& rs) {
  const double mb = static_cast<double>(rs.fragment_bytes) * 1e-6;
  std::printf("  restore         model %s: %zu parameters, %zu fragments, %.1f MB of fragment records (%.1f MB on "
              "disk), page cache warm, %d rounds\n",
              o.restore_model.c_str(), rs.params, rs.fragments, mb, static_cast<double>(rs.disk_bytes) * 1e-6,
              o.rounds);
  j.add("restore_model", o.restore_model)
      .add("restore_params", static_cast<std::uint64_t>(rs.params))
      .add("restore_fragments", static_cast<std::uint64_t>(rs.fragments))
      .add("restore_mb", mb)
      .add("restore_disk_mb", static_cast<double>(rs.disk_bytes) * 1e-6);
  report_restore_layout(j, rs.logged, false);
  report_restore_layout(j, rs.flushed, true);
}

int run_snapshot(logger& log) {
  const snapshot_flags& f = options();
  const snapshot_options& o = f.bench;
  install_stop_handlers();
  progress_line progress(log, 20);
  auto r = run_snapshot_bench(o, progress_hooks(progress, log));
  progress.finish();
  if (!r) return report(r.err());
  std::printf("bench snapshot: %u CPUs, load average %.2f before, %.2f after; %.0f s; RocksDB writes %s\n",
              std::thread::hardware_concurrency(), r->load_before, r->load_after, r->wall_s,
              o.sync ? "fsync'd (--sync)" : "not fsync'd (storage.sync = false)");
  json_line j;
  j.add("command", "bench snapshot")
      .add("cpus", static_cast<int>(std::thread::hardware_concurrency()))
      .add("load_before", r->load_before)
      .add("load_after", r->load_after)
      .add("wall_s", r->wall_s)
      .add("sync", o.sync);
  std::uint64_t snapshot_errors = 0;
  if (r->latency) {
    const latency_figures x = figures_of(*r->latency);
    print_latency(o, *r->latency, x);
    add_latency_json(j, o, *r->latency, x);
    snapshot_errors = x.snapshot_errors;
  }
  if (r->write) report_write(j, o, *r->write);
  if (r->restore) report_restore(j, o, *r->restore);
  if (r->shard) report_shard(j, o, *r->shard);
  if (r->sync) {
    report_sync(j, o, *r->sync);
    snapshot_errors += figures_of(r->sync->latency).snapshot_errors;
  }
  if (snapshot_errors > 0)
    log.error("bench.snapshot_errors",
              "archipelago: %llu snapshot versions failed or were skipped in the runs with snapshots on",
              static_cast<unsigned long long>(snapshot_errors));
  if (f.json) std::printf("%s\n", j.str().c_str());
  return snapshot_errors > 0 ? exit_failure : exit_ok;
}

}  // namespace

void add_bench_snapshot(CLI::App& bench) {
  snapshot_flags& f = options();
  snapshot_options& o = f.bench;
  CLI::App* cmd = f.command = bench.add_subcommand(
      "snapshot", "Snapshots' cost: round latency on vs off, commit throughput vs plain RocksDB, restore time");
  cmd->add_option("--parts", o.parts,
                  "Which figures, comma-separated: latency,write,restore,sync,shard (default: latency,write,restore; "
                  "sync: storage.sync true against false; shard: one shard's memory per owned parameter)")
      ->delimiter(',')
      ->check(CLI::IsMember({"latency", "write", "restore", "sync", "shard"}));
  cmd->add_option("--model", o.model, "Model of the mesh runs (default nano)");
  cmd->add_option("--learners", o.learners, "Learners of the mesh runs and of the shard part (default 4)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--steps", o.steps, "Inner steps per learner in each mesh run (default 300)")
      ->check(CLI::Range(std::int64_t{5}, std::int64_t{1000000}));
  cmd->add_option("--pairs", o.pairs, "Pairs of mesh runs, one with snapshots and one without (default 2)")
      ->check(CLI::Range(1, 20));
  cmd->add_option("--write-model", o.write_model,
                  "Model whose fragment states are committed: a preset or a layout file (*.json; default mini)");
  cmd->add_option("--commits", o.commits, "One-fragment commits per write sample (default 96)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--rounds", o.rounds, "Rounds of (store, plain RocksDB) for write and restore (default 3)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--restore-model", o.restore_model, "Model restored: a preset or a layout file (default mini)");
  cmd->add_option("--fragments", o.fragments, "Fragments P of the write and restore models (default: mesh.fragments)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--shards", o.shards, "Shards of the write model in the shard part, which runs shard 0 (default: mesh.shards)")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--sync", o.sync, "fsync every write, the store's and the baseline's (storage.sync = true)");
  cmd->add_option("--dir", o.dir, "Where the temporary stores go (default: $TMPDIR or /tmp); removed at the end");
  cmd->add_flag("--json", f.json, "Print a one-line JSON summary last");
}

int run_bench_snapshot(logger& log) {
  if (options().command == nullptr || !options().command->parsed()) return exit_bad_input;
  return run_snapshot(log);
}

}  // namespace archipelago::cli
