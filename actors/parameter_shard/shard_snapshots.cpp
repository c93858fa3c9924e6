#include "parameter_shard/shard_snapshots.hpp"

#include <algorithm>
#include <span>

#include "parameter_shard/shard_wire.hpp"

namespace archipelago {

storage::fragment_write stored_write(fragment_index p, fragment_outer_state&& s, std::int64_t time_ns) {
  auto held = std::make_shared<const fragment_outer_state>(std::move(s));
  const fragment_outer_state& h = *held;
  return {p.value,  h.version, h.round.value, time_ns,        *h.theta, *h.momentum, h.adam_m,
          h.adam_v, h.adam_steps, held,       h.adam_m.empty()};  // borrowed unless it holds copies (Adam's)
}

fragment_outer_state outer_state_of(storage::fragment_state&& f) {
  return {f.version,          round_number{f.round}, shared_floats(std::move(f.theta)), shared_floats(std::move(f.momentum)),
          std::move(f.adam_m), std::move(f.adam_v),  f.adam_steps};
}

storage::commit_job initial_writes(const shard_core& core, const std::vector<fragment_index>& owned,
                                   std::int64_t time_ns) {
  std::size_t largest = 0;
  for (fragment_index p : owned) largest = std::max(largest, core.value(p).size());
  auto zeros = std::make_shared<const std::vector<float>>(largest, 0.f);
  storage::commit_job job;
  job.time_ns = time_ns;
  for (fragment_index p : owned) {
    struct held {
      std::shared_ptr<const std::vector<float>> theta, zeros;
    };
    auto h = std::make_shared<const held>(held{core.shared_value(p), zeros});
    const std::span<const float> zero = std::span<const float>(*zeros).first(h->theta->size());
    storage::fragment_write w{p.value, core.version(p), 0, time_ns, *h->theta, {}, {}, {}, 0, h, true};
    // The Nesterov buffer starts at zero; in gradient mode (no buffer) AdamW's moments do.
    if (core.momentum(p).empty()) w.adam_m = w.adam_v = zero;
    else w.momentum = zero;
    job.fragments.push_back(std::move(w));
  }
  return job;
}

storage::commit_job initial_commit(const mesh_setup& setup, const std::vector<float>& params, std::int64_t time_ns) {
  std::vector<fragment_index> all;
  for (std::uint32_t p = 0; p < setup.fragments(); ++p) all.push_back({p});
  const shard_core core(setup.layout, setup.plan, all, shard_settings(setup), params.data());
  return initial_writes(core, all, time_ns);
}

}  // namespace archipelago
