#include "core/error.hpp"

namespace archipelago {

const char* to_string(errc code) {
  switch (code) {
    case errc::invalid_input: return "invalid input";
    case errc::not_found: return "not found";
    case errc::io_error: return "i/o error";
    case errc::corrupt_data: return "corrupt data";
    case errc::unsupported: return "unsupported";
    case errc::timeout: return "timeout";
    case errc::overloaded: return "overloaded";
    case errc::disconnected: return "disconnected";
    case errc::internal: return "internal error";
  }
  return "unknown error";
}

reaction reaction_for(errc code) {
  switch (code) {
    case errc::invalid_input:
    case errc::not_found:
    case errc::unsupported: return reaction::fix_input;
    case errc::timeout:
    case errc::overloaded:
    case errc::io_error: return reaction::retry_call;
    case errc::disconnected: return reaction::retry_round;
    case errc::corrupt_data:
    case errc::internal: return reaction::stop;
  }
  return reaction::stop;
}

std::string error::to_string() const {
  return std::string(archipelago::to_string(code)) + ": " + message;
}

}  // namespace archipelago
