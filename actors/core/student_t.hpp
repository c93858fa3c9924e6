#pragma once
// The two-sided 95 % quantile of Student's t, for the confidence intervals the
// benches and the goodput simulation report over seeds.

#include <cassert>

namespace archipelago {

/// For `df` degrees of freedom (df >= 1).
inline double t95(int df) {
  static constexpr double table[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                     2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                     2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  assert(df >= 1);
  if (df <= 30) return table[df - 1];
  // Beyond 30: the normal quantile with the first correction term of the t expansion.
  const double z = 1.959964;
  return z + (z * z * z + z) / (4.0 * df);
}

}  // namespace archipelago
