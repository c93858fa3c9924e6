#pragma once
// The drill's mesh as separate `archipelago node` processes on loopback tcp://
// (drill_options::binary): the broker and every shard on their own snapshot
// store (--db), the learners on fixed ports, all with wire.accept_chaos and
// --metrics-port. The chaos monkey runs in the drill's process with its own
// transport and sends its ChaosCommands over tcp:// as in one process; process
// faults go to the launcher (process_launcher.hpp), which owns the children.
// The drill mirrors every node's GET /node onto its status board while the
// mesh runs, and each node's final status (its `node --json` summary) at the
// end; the eval loss comes from Θ read out of the shards' stores.

#include <functional>

#include "drill/drill.hpp"

namespace archipelago {

/// The run (and its reference) of run_drill across processes.
expected<drill_report> run_process_drill(const config& cfg, logger& log, const drill_options& options,
                                         const mesh_progress& progress, const std::function<bool()>& stop_requested);

}  // namespace archipelago
