// A version of one store, or a cut of a mesh's stores, written as a store of its
// own: the starting point `run --resume` and `node --resume-from` read.

#include <filesystem>

#include "core/clock.hpp"
#include "node/mesh_snapshots.hpp"
#include "replay/replay.hpp"

namespace archipelago {

expected<std::uint64_t> save_point(const mesh_setup& setup, const saved_point& p, const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec))
    return make_error(errc::invalid_input, dir + " already exists: save into a new directory");
  if (p.states.size() != setup.fragments())
    return make_error(errc::invalid_input, "the point to save has " + std::to_string(p.states.size()) +
                                               " fragments, the model " + std::to_string(setup.fragments()));
  mesh_setup own = setup;
  own.cfg.wire.key_file.clear();  // each node's own identity: not the saved run's
  auto opened = open_mesh_store(dir, own);
  if (!opened) return opened.err();
  storage::commit_job job;
  for (const auto& f : p.states) job.fragments.push_back(storage::borrowed_write(f));
  job.learner_steps = p.learner_steps;
  job.ledger.processed = p.tokens;
  job.time_ns = wall_clock_ns();
  auto v = opened->store->commit(job);
  if (!v) return make_error(v.err().code, dir + ": " + v.err().message);
  return *v;
}

}  // namespace archipelago
