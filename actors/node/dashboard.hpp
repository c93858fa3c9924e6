#pragma once
// The live dashboard (GET / on the broker's --metrics-port, and on `run`'s): one
// self-contained HTML page — no external script, font or stylesheet, since the
// machines need not reach anything — whose small script polls /status every
// second (and /evals, where the process evaluates the model) and draws the mesh:
// goodput, uptime, fragment availability, rounds per second, members per round
// against live learners, time to quorum and grace, eval loss against tokens,
// every learner and shard, the last rounds, and recent events.

namespace archipelago {

const char* dashboard_page();

}  // namespace archipelago
