#pragma once
// Small statistics and formatting shared by the benches: order statistics for
// per-round ratios, the mean, spread and confidence interval over seeds, and the JSON and text forms
// of figures.

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/json_line.hpp"
#include "core/student_t.hpp"

namespace archipelago {

using seconds_clock = std::chrono::steady_clock;

inline double since(seconds_clock::time_point t0) {
  return std::chrono::duration<double>(seconds_clock::now() - t0).count();
}

/// NaN for no values.
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

/// NaN for no values.
inline double mean(const std::vector<double>& v) {
  if (v.empty()) return std::nan("");
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

/// Half the range: with 1-3 seeds an honest spread, unlike a standard deviation.
inline double spread(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return (*hi - *lo) / 2;
}

/// Half the width of the 95 % confidence interval of the mean (Student's t); 0
/// for fewer than two values. NaN values are left out.
inline double ci95(const std::vector<double>& all) {
  std::vector<double> v;
  for (double x : all)
    if (!std::isnan(x)) v.push_back(x);
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  const auto df = static_cast<int>(v.size()) - 1;
  return t95(df) * std::sqrt(ss / df) / std::sqrt(static_cast<double>(v.size()));
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

/// One number printed with `format` (printf's), as a string.
inline std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

/// Bytes in the unit that keeps them readable: "1.5 MB".
inline std::string human_bytes(double b) {
  if (b >= 1e9) return fmt("%.2f GB", b / 1e9);
  if (b >= 1e6) return fmt("%.1f MB", b / 1e6);
  if (b >= 1e3) return fmt("%.1f kB", b / 1e3);
  return fmt("%.0f B", b);
}

/// The 1-minute load average, so a reader can tell a busy machine from a slow one.
inline double load_average() {
  double load[1] = {std::nan("")};
  return getloadavg(load, 1) == 1 ? load[0] : std::nan("");
}

}  // namespace archipelago
