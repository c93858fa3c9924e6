#include "parameter_shard/shard_snapshots.hpp"

#include "core/clock.hpp"
#include "parameter_shard/shard_wire.hpp"

namespace archipelago {

storage::fragment_state stored_state(fragment_index p, fragment_outer_state&& s, std::int64_t time_ns) {
  return {p.value, s.version, s.round.value, time_ns, std::move(s.theta), std::move(s.momentum),
          std::move(s.adam_m), std::move(s.adam_v), s.adam_steps};
}

fragment_outer_state outer_state_of(storage::fragment_state&& f) {
  return {f.version, round_number{f.round}, std::move(f.theta), std::move(f.momentum),
          std::move(f.adam_m), std::move(f.adam_v), f.adam_steps};
}

storage::commit_job initial_commit(const mesh_setup& setup, const std::vector<float>& params) {
  std::vector<fragment_index> all;
  for (std::uint32_t p = 0; p < setup.fragments(); ++p) all.push_back({p});
  const shard_core core(setup.layout, setup.plan, all, shard_settings(setup), params.data());
  storage::commit_job job;
  job.time_ns = wall_clock_ns();
  for (fragment_index p : all) job.fragments.push_back(stored_state(p, core.outer_state(p), job.time_ns));
  return job;
}

}  // namespace archipelago
