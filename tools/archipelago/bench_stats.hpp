#pragma once
// Small statistics and formatting shared by the bench subcommands.

#include <algorithm>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_common.hpp"

namespace archipelago::cli {

using seconds_clock = std::chrono::steady_clock;

inline double since(seconds_clock::time_point t0) {
  return std::chrono::duration<double>(seconds_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Linear interpolation between order statistics (numpy's default); q in [0, 1].
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(at));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

/// The values printed with `format`, separated by spaces.
inline std::string listed(const std::vector<double>& v, const char* format) {
  std::string out;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, format, x);
    out += (out.empty() ? "" : " ") + std::string(buf);
  }
  return out;
}

/// A JSON array of the values, in json_line's number format.
inline std::string json_array(const std::vector<double>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string one = json_line().add("x", v[i]).str();  // {"x":1.23}
    out += (i ? "," : "") + one.substr(5, one.size() - 6);
  }
  return out + "]";
}

/// The 1-minute load average, so a reader can tell a busy machine from a slow one.
inline double load_average() {
  double load[1] = {std::nan("")};
  return getloadavg(load, 1) == 1 ? load[0] : std::nan("");
}

}  // namespace archipelago::cli
