#include "core/ledger_totals.hpp"

#include "core/json_line.hpp"

namespace archipelago {

std::string ledger_json(const ledger_totals& l) {
  json_line j;
  j.add("merged", static_cast<std::int64_t>(l.merged))
      .add("late", static_cast<std::int64_t>(l.late))
      .add("lost", static_cast<std::int64_t>(l.lost))
      .add("rejected", static_cast<std::int64_t>(l.rejected))
      .add("processed", static_cast<std::int64_t>(l.processed));
  return j.str();
}

}  // namespace archipelago
