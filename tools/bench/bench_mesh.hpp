#pragma once
// The one-process mesh (run_local_mesh) as the benches run it: its status lines
// shown under a label, stopped by the bench's hooks, and timed from its timeline.

#include <cstddef>
#include <cstdint>
#include <string>

#include "bench/bench_hooks.hpp"
#include "core/config.hpp"
#include "node/local_mesh.hpp"

namespace archipelago {

/// Runs the mesh; each of its status lines shown as "<label>: <line>", the line
/// cut to `line_chars`. interrupted() when the hooks asked to stop.
expected<mesh_summary> run_bench_mesh(const config& cfg, const bench_hooks& hooks, const std::string& label,
                                      std::size_t line_chars, const mesh_eval& eval = {},
                                      const mesh_snapshots& snapshots = {});

/// Seconds per round in the steady part of a run, from its half-second timeline:
/// from the first sample with at least `from_rounds` rounds closed to the last
/// sample. NaN when fewer than two rounds closed in between.
double seconds_per_round(const mesh_summary& s, std::uint64_t from_rounds);

}  // namespace archipelago
