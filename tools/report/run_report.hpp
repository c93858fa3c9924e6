#pragma once
// A run's report: one self-contained HTML page with SVG plots — eval loss
// against tokens and against time, goodput and uptime over time, per-learner
// activity — and the run's headline figures.

#include <string>

#include "core/config.hpp"
#include "node/local_mesh.hpp"

namespace archipelago {

std::string run_report_html(const mesh_summary& s, const config& cfg);

}  // namespace archipelago
