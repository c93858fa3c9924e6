#pragma once
// What a role refused because of who sent a message or what it claims:
// a fragment from a shard that does not own it, a chaos command from a node that
// is not the chaos monkey, a contribution that claims more than the broker bounds.
// Counted by reason; /metrics shows archipelago_refused_total{reason=...}.

#include <cstdint>
#include <map>
#include <string>

#include "core/prometheus_text.hpp"

namespace archipelago {

struct refusal_counts {
  std::map<std::string, std::uint64_t> by_reason;

  void count(const std::string& reason) { ++by_reason[reason]; }
  std::uint64_t of(const std::string& reason) const {
    auto it = by_reason.find(reason);
    return it == by_reason.end() ? 0 : it->second;
  }
  std::uint64_t total() const {
    std::uint64_t n = 0;
    for (const auto& [reason, k] : by_reason) n += k;
    return n;
  }
  /// Adds these counts to a node status's (node_counters::refused).
  void add_to(std::map<std::string, std::uint64_t>& refused) const {
    for (const auto& [reason, n] : by_reason)
      if (n != 0) refused[reason] += n;
  }
  void add_metrics(prometheus_text& page, const metric_labels& labels) const {
    for (const auto& [reason, n] : by_reason) {
      metric_labels l = labels;
      l.emplace_back("reason", reason);
      page.counter("archipelago_refused_total",
                   "Messages a role refused for who sent them or what they claim, by reason: not_owner (a fragment "
                   "from a shard that does not own it), chaos_sender (a chaos command not from the chaos monkey), "
                   "claim_exceeds_bound (a contribution claiming more tokens or steps than the broker bounds).",
                   static_cast<double>(n), l);
    }
  }
};

/// "impersonation 3, robust_reject 40" (by reason, in order), or "none".
inline std::string describe_refusals(const std::map<std::string, std::uint64_t>& refused) {
  std::string out;
  for (const auto& [reason, n] : refused) out += (out.empty() ? "" : ", ") + reason + " " + std::to_string(n);
  return out.empty() ? "none" : out;
}

}  // namespace archipelago
