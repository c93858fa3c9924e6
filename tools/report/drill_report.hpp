#pragma once
// A drill's report as files: the full JSON (every sample, fault and figure) and
// a self-contained HTML page with SVG plots — rounds per second and goodput over
// time with the faults marked, per-learner activity, eval loss against the
// fault-free reference.

#include <string>
#include <vector>

#include "drill/drill.hpp"

namespace archipelago {

/// The headline figures of one drill as JSON object members (no braces), shared
/// by the summary line and the report file.
std::string drill_summary_json(const drill_report& r);
/// The whole report as one JSON document.
std::string drill_report_json(const drill_report& r);
/// One HTML page for the drills of one plan (one per mode).
std::string drill_report_html(const std::vector<drill_report>& drills);

/// The eval loss's relative difference to the reference; NaN without one.
double eval_gap(const drill_report& r);

}  // namespace archipelago
