#pragma once
// Where a node listens and dials, checked where an endpoint enters: a peer's Join,
// FetchFragment or Reconfigure (the endpoint it asks to be reached at), the launch
// configuration (--broker, --shards, --listen), and the transport itself before it
// binds or connects. ZeroMQ throws on an endpoint it cannot parse, and a connect
// that throws on the I/O thread leaves a node deaf; so an endpoint a node stores
// or dials is one of:
//   tcp://HOST:PORT    HOST a DNS name (letters, digits, '-', '.': at most 253
//                      characters, labels of 1 to 63), a dotted IPv4 address, or
//                      an IPv6 address in brackets; PORT 1 to 65535
//   inproc://NAME      NAME of 1 to 200 characters: letters, digits and . _ - : / +
// at most max_endpoint_bytes long. Where to bind also takes "*" as the host and
// 0 or "*" as the port (any free one). Pure.

#include <cstddef>
#include <string_view>

#include "core/error.hpp"

namespace archipelago::transport {

inline constexpr std::size_t max_endpoint_bytes = 256;

/// An endpoint a node may dial; invalid_input naming what is wrong with it otherwise.
status check_endpoint(std::string_view endpoint);
/// An endpoint a node may bind to (a host or port of "*", port 0 allowed).
status check_bind_endpoint(std::string_view endpoint);

}  // namespace archipelago::transport
