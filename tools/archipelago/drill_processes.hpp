#pragma once
// `archipelago drill --processes`: the drill's mesh as separate `archipelago
// node` processes on loopback tcp:// — the broker and every shard on their own
// snapshot store (--db), the learners on fixed ports, all with
// wire.accept_chaos and --metrics-port. The chaos monkey runs in the drill's
// process with its own transport and sends its ChaosCommands over tcp:// as in
// one process; process faults go to the launcher here, which owns the children:
// crash = SIGKILL, restart = the same command again (a new incarnation; a shard
// or the broker restarts on its store), pause = SIGSTOP, SIGCONT after the
// fault's length. The samples come from the broker's /status and every node's
// /metrics; the eval loss from Θ read out of the shards' stores at the end.
// Every child is stopped and reaped on the way out: done, error or a signal.

#include <functional>

#include "node/drill.hpp"

namespace archipelago::cli {

/// Runs the plan of `options` (and its fault-free reference, unless turned off)
/// against a mesh of processes of `binary` (an `archipelago` executable).
expected<drill_report> run_process_drill(const config& cfg, const drill_options& options, const std::string& binary,
                                         const mesh_progress& progress, const std::function<bool()>& stop_requested);

}  // namespace archipelago::cli
