#pragma once
// Time is passed in. State cores take timestamps as arguments; only shells and
// commands hold a clock, and tests hold a manual one.

#include <chrono>
#include <cstdint>

namespace archipelago {

/// Nanoseconds on a monotonic timeline (not wall-clock time).
using nanos = std::int64_t;

class clock_source {
 public:
  virtual ~clock_source() = default;
  virtual nanos now() const = 0;
};

class steady_clock_source final : public clock_source {
 public:
  nanos now() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

/// A clock that moves only when told to.
class manual_clock final : public clock_source {
 public:
  explicit manual_clock(nanos start = 0) : now_(start) {}
  nanos now() const override { return now_; }
  void advance(nanos delta) { now_ += delta; }
  void set(nanos t) { now_ = t; }

 private:
  nanos now_;
};

/// Wall-clock time (nanoseconds since the Unix epoch): what snapshots, the tape
/// and process incarnations are stamped with. Shells and storage read it; cores never do.
inline std::int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline double to_seconds(nanos t) { return static_cast<double>(t) * 1e-9; }

}  // namespace archipelago
