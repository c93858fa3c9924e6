#pragma once
// Small statistics and formatting shared by the benches: order statistics for
// per-round ratios, the mean and spread over seeds (the confidence interval, ci95, is core's:
// core/student_t.hpp), and the JSON and text forms of figures.

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

/// The finite values (NaN marks a seed that never reached something).
inline std::vector<double> finite(const std::vector<double>& v) {
  std::vector<double> out;
  for (double x : v)
    if (std::isfinite(x)) out.push_back(x);
  return out;
}

/// Every value times `k` (fractions as percentages).
inline std::vector<double> scaled(std::vector<double> v, double k) {
  for (double& x : v) x *= k;
  return v;
}

/// "mean ± half" with printf formats (`half_format`: `format` when null); just the mean
/// for one value, "—" for none. `half` is the spread or a confidence interval's half width.
inline std::string mean_pm(const std::vector<double>& v, double half, const char* format,
                           const char* half_format = nullptr) {
  if (v.empty()) return "—";
  char a[48], b[48];
  std::snprintf(a, sizeof a, format, mean(v));
  if (v.size() < 2) return a;
  std::snprintf(b, sizeof b, half_format ? half_format : format, half);
  return std::string(a) + " ± " + b;
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
