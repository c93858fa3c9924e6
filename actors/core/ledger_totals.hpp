#pragma once
// The token ledger's totals (ALGORITHM.md §9): every processed token ends in
// exactly one bucket. The broker's ledger keeps them per learner incarnation;
// reports, manifests and the commands read them.

#include <cstdint>
#include <string>

namespace archipelago {

struct ledger_totals {
  std::uint64_t processed = 0, merged = 0, late = 0, lost = 0, rejected = 0;  // tokens
  std::uint64_t steps = 0;
  double step_time_s = 0;         // summed over every reported step
  double merged_step_time_s = 0;  // ... over the steps whose tokens were merged
  bool balanced() const { return merged + late + lost + rejected == processed; }
};

/// {"merged":…,"late":…,"lost":…,"rejected":…,"processed":…} in tokens.
std::string ledger_json(const ledger_totals& l);

}  // namespace archipelago
