#pragma once
// The two-sided 95 % quantile of Student's t, and the confidence interval of a
// mean built on it: what the benches and the goodput simulation report over seeds.

#include <cmath>
#include <vector>

#include "core/invariant.hpp"

namespace archipelago {

/// For `df` degrees of freedom (df >= 1).
inline double t95(int df) {
  static constexpr double table[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                     2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                     2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  ARCHIPELAGO_INVARIANT(df >= 1, "t quantile: at least one degree of freedom");
  if (df <= 30) return table[df - 1];
  // Beyond 30: the normal quantile with the first correction term of the t expansion.
  const double z = 1.959964;
  return z + (z * z * z + z) / (4.0 * df);
}

/// Half the width of the 95 % confidence interval of the mean of `all` (Student's t:
/// t95(n - 1) × s / √n); 0 for fewer than two values. NaN values are left out.
inline double ci95(const std::vector<double>& all) {
  std::vector<double> v;
  for (double x : all)
    if (!std::isnan(x)) v.push_back(x);
  if (v.size() < 2) return 0;
  double m = 0;
  for (double x : v) m += x;
  m /= static_cast<double>(v.size());
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  const auto df = static_cast<int>(v.size()) - 1;
  return t95(df) * std::sqrt(ss / df) / std::sqrt(static_cast<double>(v.size()));
}

}  // namespace archipelago
