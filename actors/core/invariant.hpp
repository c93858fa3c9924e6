#pragma once
// Checked invariants: programmer errors caught in every build, the shipped one
// included (assert is compiled out by NDEBUG, and every build here is Release).
// A broken invariant is a bug, never bad input: bad input is an error value
// (core/error.hpp) naming what was wrong. The check costs one predicted branch;
// a failure writes one line in the logger's text format to stderr, where the
// process's logger writes (kind "invariant": its name, the condition, file and
// line), and aborts, so a core dump keeps the state that broke it.
//
//   ARCHIPELAGO_INVARIANT(steps >= 1, "merge: at least one outer step");
//
// The name says what must hold, in words a bug report can quote.

namespace archipelago {

/// Writes the failure line and aborts. Called only by ARCHIPELAGO_INVARIANT.
[[noreturn, gnu::cold, gnu::noinline]] void invariant_failed(const char* name, const char* condition,
                                                              const char* file, int line) noexcept;

}  // namespace archipelago

#define ARCHIPELAGO_INVARIANT(condition, name)                                        \
  do {                                                                                \
    if (!(condition)) [[unlikely]]                                                    \
      ::archipelago::invariant_failed(name, #condition, __FILE__, __LINE__);          \
  } while (false)
