#pragma once
// Errors are values at every boundary. Each error carries a code that tells the
// caller how to react; programmer errors are checked invariants (core/invariant.hpp),
// not error values.

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/invariant.hpp"

namespace archipelago {

enum class errc : std::uint8_t {
  invalid_input,   // bad flag, config value, file content: fix the input
  not_found,       // a named file, key or version does not exist
  io_error,        // the operating system refused a read or write
  corrupt_data,    // a checksum or format check failed: never use the data
  unsupported,     // valid but not supported here (CPU, format version)
  timeout,         // a bounded wait ran out: retry the call
  overloaded,      // a bounded queue is full: retry later
  disconnected,    // the peer is gone: retry the round
  internal,        // a bug surfaced as a value (should not happen)
};

/// What the caller should do about an error.
enum class reaction : std::uint8_t {
  fix_input,    // report and exit: the user must change something
  retry_call,   // the same call may succeed later
  retry_round,  // give up this round; the next one may succeed
  stop,         // continuing could lose or corrupt committed data
};

const char* to_string(errc code);
reaction reaction_for(errc code);

struct error {
  errc code = errc::internal;
  std::string message;

  reaction how() const { return reaction_for(code); }
  /// "<code>: <message>", one line.
  std::string to_string() const;
};

inline error make_error(errc code, std::string message) {
  return error{code, std::move(message)};
}

/// A value or an error. Minimal on purpose: C++20 has no std::expected.
template <class T>
class [[nodiscard]] expected {
 public:
  expected(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  expected(error err) : state_(std::in_place_index<1>, std::move(err)) {}

  bool has_value() const { return state_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & {
    ARCHIPELAGO_INVARIANT(has_value(), "expected: value() of an error");
    return std::get<0>(state_);
  }
  const T& value() const& {
    ARCHIPELAGO_INVARIANT(has_value(), "expected: value() of an error");
    return std::get<0>(state_);
  }
  T&& value() && {
    ARCHIPELAGO_INVARIANT(has_value(), "expected: value() of an error");
    return std::get<0>(std::move(state_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const error& err() const {
    ARCHIPELAGO_INVARIANT(!has_value(), "expected: err() of a value");
    return std::get<1>(state_);
  }

 private:
  std::variant<T, error> state_;
};

/// Success or an error, for operations without a result.
class [[nodiscard]] status {
 public:
  status() = default;
  status(error err) : err_(std::move(err)), failed_(true) {}
  static status ok() { return {}; }

  bool has_value() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const error& err() const {
    ARCHIPELAGO_INVARIANT(failed_, "status: err() of a success");
    return err_;
  }

 private:
  error err_;
  bool failed_ = false;
};

}  // namespace archipelago
