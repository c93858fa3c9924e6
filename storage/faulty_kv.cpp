#include <mutex>

#include "core/prng.hpp"
#include "storage/kv_store.hpp"

namespace archipelago::storage {

// Writes are serialized under one mutex, inner write included, so the sequence of
// random draws follows the order of writes and a seed reproduces every fault.
// Counters: `writes` counts calls to write() and write_unlogged(); `write_errors` the writes failed
// whole (the error rate and the dying disk); `torn_writes` the torn ones.
struct faulty_kv::impl {
  explicit impl(fault_plan p) : plan(p), rng(p.seed) {}
  fault_plan plan;
  prng rng;
  std::uint64_t successful_writes = 0;
  fault_counters counters;
  mutable std::mutex mutex;
};

faulty_kv::faulty_kv(std::shared_ptr<kv_store> inner, fault_plan plan)
    : inner_(std::move(inner)), impl_(std::make_unique<impl>(plan)) {}

faulty_kv::~faulty_kv() = default;

status faulty_kv::write(const write_batch& batch) { return write(batch, false); }
status faulty_kv::write_unlogged(const write_batch& batch) { return write(batch, true); }

status faulty_kv::write(const write_batch& batch, bool unlogged) {
  auto pass = [&](const write_batch& b) { return unlogged ? inner_->write_unlogged(b) : inner_->write(b); };
  std::lock_guard lock(impl_->mutex);
  impl& s = *impl_;
  ++s.counters.writes;
  if (s.plan.fail_after_writes > 0 && s.successful_writes >= s.plan.fail_after_writes) {
    ++s.counters.write_errors;
    return make_error(errc::io_error, "injected write error (disk failed after " +
                                          std::to_string(s.plan.fail_after_writes) + " writes)");
  }
  // One draw decides the fate of the write, so the rates do not shift each other's streams.
  const double u = s.rng.uniform();
  if (u < s.plan.write_error_rate) {
    ++s.counters.write_errors;
    return make_error(errc::io_error, "injected write error");
  }
  if (u < s.plan.write_error_rate + s.plan.torn_write_rate) {
    ++s.counters.torn_writes;
    if (!batch.ops.empty()) {
      // A strict prefix, possibly empty; its last value cut short as a half-written record would be.
      write_batch prefix;
      const auto length = s.rng.below(batch.ops.size());
      prefix.ops.assign(batch.ops.begin(), batch.ops.begin() + static_cast<std::ptrdiff_t>(length));
      if (!prefix.ops.empty() && prefix.ops.back().value && !prefix.ops.back().value->empty()) {
        std::string& value = *prefix.ops.back().value;
        value.resize(s.rng.below(value.size()));
      }
      if (!prefix.ops.empty()) {
        if (status st = pass(prefix); !st)
          return make_error(errc::io_error, "injected torn write (then: " + st.err().to_string() + ")");
      }
    }
    return make_error(errc::io_error, "injected torn write");
  }
  status st = pass(batch);
  if (st) ++s.successful_writes;
  return st;
}

void faulty_kv::set_write_error_rate(double rate) {
  std::lock_guard lock(impl_->mutex);
  impl_->plan.write_error_rate = rate;
}

expected<std::optional<std::string>> faulty_kv::get(column c, std::string_view key) const {
  return inner_->get(c, key);
}

status faulty_kv::scan(column c, std::string_view from, std::string_view to,
                       const std::function<bool(std::string_view, std::string_view)>& visit) const {
  return inner_->scan(c, from, to, visit);
}

expected<std::optional<std::pair<std::string, std::string>>> faulty_kv::last(column c) const {
  return inner_->last(c);
}

status faulty_kv::flush() { return inner_->flush(); }
status faulty_kv::flush_memtables() { return inner_->flush_memtables(); }

fault_counters faulty_kv::counters() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->counters;
}

}  // namespace archipelago::storage
