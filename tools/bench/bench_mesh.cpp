#include "bench/bench_mesh.hpp"

#include <algorithm>
#include <cmath>

#include "core/invariant.hpp"

namespace archipelago {

expected<mesh_summary> run_bench_mesh(const config& cfg, const bench_hooks& hooks, const std::string& label,
                                      std::size_t line_chars, const mesh_eval& eval, const mesh_snapshots& snapshots) {
  ARCHIPELAGO_INVARIANT(hooks.log != nullptr, "bench mesh: the caller's logger (a mesh always logs)");
  auto s = run_local_mesh(
      cfg, *hooks.log, [&](const std::string& line) { hooks.update(label + ": " + line.substr(0, std::min(line.size(), line_chars))); },
      [&] { return hooks.stopped(); }, snapshots, nullptr, {}, eval);
  if (!s) return s.err();
  if (hooks.stopped()) return interrupted();
  return s;
}

double seconds_per_round(const mesh_summary& s, std::uint64_t from_rounds) {
  const run_sample* first = nullptr;
  const run_sample* last = nullptr;
  for (const auto& x : s.timeline) {
    if (x.rounds >= from_rounds && first == nullptr) first = &x;
    last = &x;
  }
  if (first == nullptr || last == nullptr || last->rounds < first->rounds + 2) return std::nan("");
  return (last->t_s - first->t_s) / static_cast<double>(last->rounds - first->rounds);
}

}  // namespace archipelago
