#include "core/ledger_totals.hpp"

#include "core/json_line.hpp"

namespace archipelago {

ledger_totals& ledger_totals::operator+=(const ledger_totals& o) {
  processed += o.processed;
  merged += o.merged;
  late += o.late;
  overwritten += o.overwritten;
  lost += o.lost;
  rejected += o.rejected;
  steps += o.steps;
  step_time_s += o.step_time_s;
  merged_step_time_s += o.merged_step_time_s;
  return *this;
}

double ledger_goodput(const ledger_totals& l, double learners, double span_s) {
  return learners > 0 && span_s > 0 ? l.merged_step_time_s / (learners * span_s) : 0.0;
}

std::string ledger_json(const ledger_totals& l) {
  json_line j;
  j.add("merged", static_cast<std::int64_t>(l.merged))
      .add("late", static_cast<std::int64_t>(l.late))
      .add("overwritten", static_cast<std::int64_t>(l.overwritten))
      .add("lost", static_cast<std::int64_t>(l.lost))
      .add("rejected", static_cast<std::int64_t>(l.rejected))
      .add("processed", static_cast<std::int64_t>(l.processed));
  return j.str();
}

}  // namespace archipelago
