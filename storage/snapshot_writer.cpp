#include "storage/snapshot_writer.hpp"

#include <chrono>

namespace archipelago::storage {
namespace {

/// What a job holds that exists only for it: a borrowed state (the shard's own
/// buffers, unchanged until the write is done) is no copy and does not count.
std::size_t job_bytes(const commit_job& job) {
  std::size_t bytes = 256;
  for (const auto& f : job.fragments)
    if (!f.borrowed) bytes += f.bytes();
  for (const auto& m : job.merges)
    for (const auto& c : m.contributions) bytes += 4 * c.delta.size();
  return bytes;
}

}  // namespace

snapshot_writer::snapshot_writer(std::shared_ptr<snapshot_store> store, logger& log, writer_options options)
    : store_(std::move(store)), log_(log), options_(options), thread_([this] { run(); }) {}

snapshot_writer::~snapshot_writer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

status snapshot_writer::enqueue(item it, std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return make_error(errc::disconnected, "the snapshot writer is stopping");
    if (stats_.queued_bytes + bytes > options_.max_queue_bytes && !queue_.empty()) {
      ++stats_.refused;
      return make_error(errc::overloaded, "snapshot queue full (" + std::to_string(stats_.queued_bytes >> 20) +
                                              " MiB queued): storage is slower than the rounds");
    }
    stats_.queued_bytes += bytes;
    queue_.emplace_back(std::move(it), bytes);
    ++submitted_;
  }
  wake_.notify_one();
  return {};
}

status snapshot_writer::submit(commit_job job, done_fn done) {
  const std::size_t bytes = job_bytes(job);
  return enqueue(commit_item{std::move(job), std::move(done)}, bytes);
}
status snapshot_writer::submit(tape_record record) {
  const std::size_t bytes = 256 + 48 * (record.members.size() + record.late.size());
  return enqueue(std::move(record), bytes);
}
status snapshot_writer::submit(std::vector<learner_ledger> ledgers) {
  const std::size_t bytes = 64 * ledgers.size() + 64;
  return enqueue(std::move(ledgers), bytes);
}
status snapshot_writer::submit(eval_record record) { return enqueue(record, 64); }

status snapshot_writer::drain(std::chrono::milliseconds bound) {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = submitted_;
  if (!idle_.wait_for(lock, bound, [&] { return finished_ >= target; }))
    return make_error(errc::timeout, "snapshots still queued after " + std::to_string(bound.count()) + " ms");
  return {};
}

writer_stats snapshot_writer::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void snapshot_writer::run() {
  // The writer runs at the actors' priority: a shard broadcasts a version only
  // once it is durable, so every write is on a round's path (RocksDB's own
  // compactions and flushes stay at low priority, rocksdb_kv.cpp).
  for (;;) {
    std::deque<std::pair<item, std::size_t>> batch;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      batch.swap(queue_);
    }
    // Every commit job queued together becomes one batch and one manifest.
    commit_job merged;
    std::vector<done_fn> dones;
    std::size_t commit_jobs = 0, bytes = 0, failed = 0;
    std::uint64_t payload = 0;  // the floats of the commits
    auto report = [this](const status& s) {
      if (!s) log_.error("snapshot.write_failed", "archipelago snapshot: %s", s.err().to_string().c_str());
      return s ? 0 : 1;
    };
    for (auto& [it, size] : batch) {
      bytes += size;
      if (auto* c = std::get_if<commit_item>(&it)) {
        for (auto& f : c->job.fragments) {
          payload += f.bytes();
          merged.fragments.push_back(std::move(f));
        }
        for (auto& m : c->job.merges) merged.merges.push_back(std::move(m));
        merged.ledger = c->job.ledger;
        merged.learner_steps = c->job.learner_steps;
        merged.time_ns = c->job.time_ns;
        if (c->done) dones.push_back(std::move(c->done));
        ++commit_jobs;
      } else if (auto* t = std::get_if<tape_record>(&it)) {
        failed += report(store_->put_tape(std::move(*t)));
      } else if (auto* l = std::get_if<std::vector<learner_ledger>>(&it)) {
        failed += report(store_->put_ledger(*l));
      } else {
        failed += report(store_->put_eval(std::get<eval_record>(it)));
      }
    }
    expected<std::uint64_t> version = std::uint64_t{0};
    double commit_s = 0;
    if (commit_jobs > 0) {
      const auto t0 = std::chrono::steady_clock::now();
      version = store_->commit(merged);
      commit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!version) {
        log_.error("snapshot.commit_failed", "archipelago snapshot: commit failed: %s", version.err().to_string().c_str());
        failed += commit_jobs;
      }
      for (auto& done : dones) done(version);
    }
    {
      std::lock_guard lock(mutex_);
      stats_.queued_bytes -= bytes;
      stats_.failed += failed;
      if (commit_jobs > 0 && version) {
        ++stats_.commits;
        stats_.jobs_committed += commit_jobs;
        stats_.bytes += payload;
        stats_.commit_seconds_total += commit_s;
        stats_.last_commit_seconds = commit_s;
      }
      finished_ += batch.size();
    }
    idle_.notify_all();
  }
}

}  // namespace archipelago::storage
