#pragma once
// The token ledger's totals (docs/concepts/accounting.md): every processed token ends in
// exactly one bucket. The broker's ledger keeps them per learner incarnation;
// reports, manifests and the commands read them.

#include <cstdint>
#include <string>

namespace archipelago {

/// Tokens are token-shares: a step's tokens split over the fragments it trained
/// (in proportion to their parameters), each share in one bucket.
struct ledger_totals {
  std::uint64_t processed = 0, merged = 0, late = 0, overwritten = 0, lost = 0, rejected = 0;  // tokens
  std::uint64_t steps = 0;
  double step_time_s = 0;         // summed over every reported step
  double merged_step_time_s = 0;  // ... weighted by the step's merged share
  bool balanced() const { return merged + late + overwritten + lost + rejected == processed; }
  ledger_totals& operator+=(const ledger_totals& o);
};

/// Goodput (docs/design/algorithm.md §9): the share of `learners` learners' time over `span_s` seconds
/// that went into steps whose work was merged — the ledger's merged step time over
/// learners × span, so work that was late, overwritten, lost or rejected earns nothing.
/// 0 for no learners or an empty span.
double ledger_goodput(const ledger_totals& l, double learners, double span_s);

/// {"merged":…,"late":…,"overwritten":…,"lost":…,"rejected":…,"processed":…} in tokens.
std::string ledger_json(const ledger_totals& l);

}  // namespace archipelago
