#pragma once
// Writes snapshots on a thread of its own: shards and the broker hand their
// records to a bounded queue and go on; one thread commits them. Jobs queued
// together become one atomic batch and one manifest. A full queue refuses the
// job (errc::overloaded) instead of blocking the caller.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>

#include "core/log.hpp"
#include "storage/snapshot_store.hpp"

namespace archipelago::storage {

struct writer_options {
  std::size_t max_queue_bytes = std::size_t{256} << 20;  // Default: 256 MiB of queued records
};

struct writer_stats {
  std::uint64_t commits = 0;         // batches written
  std::uint64_t jobs_committed = 0;  // commit jobs in them
  std::uint64_t refused = 0;         // jobs refused because the queue was full
  std::uint64_t failed = 0;          // jobs whose write failed
  std::uint64_t bytes = 0;           // fragment state bytes committed (their floats)
  std::uint64_t queued_bytes = 0;    // bytes the queue holds (a borrowed state is none: see job_bytes)
  double commit_seconds_total = 0;  // time in the store's commit (a RocksDB write batch), summed
  double last_commit_seconds = 0;
};

class snapshot_writer {
 public:
  /// Called on the writer's thread once the job is durable (the new mesh version) or failed.
  using done_fn = std::function<void(const expected<std::uint64_t>&)>;

  /// Failed writes are counted (stats) and said on `log`, which outlives the writer.
  snapshot_writer(std::shared_ptr<snapshot_store> store, logger& log, writer_options options = {});
  /// Writes what is queued, then stops.
  ~snapshot_writer();
  snapshot_writer(const snapshot_writer&) = delete;
  snapshot_writer& operator=(const snapshot_writer&) = delete;

  status submit(commit_job job, done_fn done = {});
  status submit(tape_record record);
  status submit(std::vector<learner_ledger> ledgers);
  status submit(eval_record record);
  /// Waits until everything submitted before the call is written (or failed); timeout otherwise.
  status drain(std::chrono::milliseconds bound);

  writer_stats stats() const;
  snapshot_store& store() { return *store_; }

 private:
  struct commit_item {
    commit_job job;
    done_fn done;
  };
  using item = std::variant<commit_item, tape_record, std::vector<learner_ledger>, eval_record>;
  status enqueue(item it, std::size_t bytes);
  void run();

  std::shared_ptr<snapshot_store> store_;
  logger& log_;
  writer_options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::pair<item, std::size_t>> queue_;
  std::uint64_t submitted_ = 0, finished_ = 0;
  bool stopping_ = false;
  writer_stats stats_;
  std::thread thread_;
};

}  // namespace archipelago::storage
