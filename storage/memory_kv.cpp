#include <map>
#include <mutex>

#include "storage/kv_store.hpp"

namespace archipelago::storage {
namespace {

// Values are immutable and shared, so a scan can take a consistent view by
// copying keys and pointers (not values) under the lock, then visit without it:
// the visitor may call back into the store, and a long scan blocks no writer.
using value_ptr = std::shared_ptr<const std::string>;
using column_map = std::map<std::string, value_ptr, std::less<>>;  // std::string orders as unsigned bytes

class memory_kv final : public kv_store {
 public:
  status write(const write_batch& batch) override {
    // Build the values outside the lock; apply all ops under it, so readers see all or none.
    std::vector<value_ptr> values;
    values.reserve(batch.ops.size());
    for (const auto& o : batch.ops)
      values.push_back(o.value ? std::make_shared<const std::string>(*o.value) : nullptr);
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < batch.ops.size(); ++i) {
      const auto& o = batch.ops[i];
      column_map& m = columns_[index(o.col)];
      if (values[i]) {
        m.insert_or_assign(o.key, std::move(values[i]));
      } else if (o.range_end) {
        if (o.key < *o.range_end) m.erase(m.lower_bound(o.key), m.lower_bound(*o.range_end));
      } else {
        m.erase(o.key);
      }
    }
    return status::ok();
  }
  status write_unlogged(const write_batch& batch) override { return write(batch); }

  expected<std::optional<std::string>> get(column c, std::string_view key) const override {
    value_ptr v;
    {
      std::lock_guard lock(mutex_);
      const column_map& m = columns_[index(c)];
      auto it = m.find(key);
      if (it == m.end()) return std::optional<std::string>{};
      v = it->second;
    }
    return std::optional<std::string>{*v};
  }

  status scan(column c, std::string_view from, std::string_view to,
              const std::function<bool(std::string_view, std::string_view)>& visit) const override {
    std::vector<std::pair<std::string, value_ptr>> view;
    {
      std::lock_guard lock(mutex_);
      const column_map& m = columns_[index(c)];
      // Compare against `to` rather than iterate to lower_bound(to): from > to is an empty range.
      for (auto it = m.lower_bound(from); it != m.end() && (to.empty() || it->first < to); ++it)
        view.emplace_back(it->first, it->second);
    }
    for (const auto& [key, value] : view)
      if (!visit(key, *value)) break;
    return status::ok();
  }

  expected<std::optional<std::pair<std::string, std::string>>> last(column c) const override {
    std::lock_guard lock(mutex_);
    const column_map& m = columns_[index(c)];
    if (m.empty()) return std::optional<std::pair<std::string, std::string>>{};
    const auto& [key, value] = *m.rbegin();
    return std::optional<std::pair<std::string, std::string>>{std::pair{key, *value}};
  }

  status flush() override { return status::ok(); }
  status flush_memtables() override { return status::ok(); }

 private:
  static std::size_t index(column c) { return static_cast<std::size_t>(c); }

  mutable std::mutex mutex_;
  column_map columns_[column_count];
};

}  // namespace

std::unique_ptr<kv_store> make_memory_kv() { return std::make_unique<memory_kv>(); }

}  // namespace archipelago::storage
