#pragma once
// The tests' logger: what the code under test logs goes to stderr, as a
// process's would, rate-limited by kind. Tests that check lines make their own
// logger on a manual clock with a string stream.

#include "core/clock.hpp"
#include "core/log.hpp"

namespace archipelago::test_logging {

inline logger& test_log() {
  static steady_clock_source clock;
  static logger log(log_options{}, clock);
  return log;
}

}  // namespace archipelago::test_logging
