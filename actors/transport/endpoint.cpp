#include "transport/endpoint.hpp"

#include <algorithm>
#include <cctype>
#include <string>

namespace archipelago::transport {
namespace {

bool is_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

bool ipv4(std::string_view host) {
  int octets = 0;
  for (std::size_t at = 0; at <= host.size(); ++octets) {
    const std::size_t dot = std::min(host.find('.', at), host.size());
    const std::string_view part = host.substr(at, dot - at);
    if (!is_digits(part) || part.size() > 3 || (part.size() > 1 && part[0] == '0') || std::stoi(std::string(part)) > 255)
      return false;
    at = dot + 1;
  }
  return octets == 4;
}

bool ipv6(std::string_view host) {
  if (host.size() < 4 || host.front() != '[' || host.back() != ']' || host.size() > 47) return false;
  const std::string_view inner = host.substr(1, host.size() - 2);
  return inner.find(':') != std::string_view::npos &&
         std::all_of(inner.begin(), inner.end(),
                     [](unsigned char c) { return std::isxdigit(c) != 0 || c == ':' || c == '.'; });
}

bool dns_name(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (std::size_t at = 0; at <= host.size();) {
    const std::size_t dot = std::min(host.find('.', at), host.size());
    const std::string_view label = host.substr(at, dot - at);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    if (!std::all_of(label.begin(), label.end(), [](unsigned char c) { return std::isalnum(c) != 0 || c == '-'; }))
      return false;
    at = dot + 1;
  }
  // All digits and dots is an IPv4 address or nothing: "1.2.3" is not a name.
  return !std::all_of(host.begin(), host.end(), [](unsigned char c) { return std::isdigit(c) != 0 || c == '.'; });
}

status bad(std::string_view endpoint, const std::string& why) {
  // Quoted as far as it is printable and short: it may be anything a peer sent.
  std::string shown;
  for (char c : endpoint.substr(0, 64)) shown += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  if (endpoint.size() > 64) shown += "...";
  return status(make_error(errc::invalid_input, "endpoint '" + shown + "': " + why));
}

status check(std::string_view endpoint, bool bind) {
  if (endpoint.empty()) return bad(endpoint, "empty");
  if (endpoint.size() > max_endpoint_bytes)
    return bad(endpoint, std::to_string(endpoint.size()) + " bytes, at most " + std::to_string(max_endpoint_bytes));
  if (endpoint.starts_with("inproc://")) {
    const std::string_view name = endpoint.substr(9);
    if (name.empty() || name.size() > 200) return bad(endpoint, "an inproc:// name has 1 to 200 characters");
    if (!std::all_of(name.begin(), name.end(), [](unsigned char c) {
          return std::isalnum(c) != 0 || c == '.' || c == '_' || c == '-' || c == ':' || c == '/' || c == '+';
        }))
      return bad(endpoint, "an inproc:// name holds letters, digits and . _ - : / + only");
    return {};
  }
  if (!endpoint.starts_with("tcp://")) return bad(endpoint, "not tcp://HOST:PORT or inproc://NAME");
  const std::string_view rest = endpoint.substr(6);
  const std::size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) return bad(endpoint, "no :PORT");
  const std::string_view host = rest.substr(0, colon), port = rest.substr(colon + 1);
  if (!(ipv4(host) || ipv6(host) || dns_name(host) || (bind && host == "*")))
    return bad(endpoint, "the host is not a DNS name, an IPv4 address or an [IPv6] address");
  if (bind && port == "*") return {};
  if (!is_digits(port) || port.size() > 5 || std::stoi(std::string(port)) > 65535 ||
      (std::stoi(std::string(port)) == 0 && !bind))
    return bad(endpoint, bind ? "the port is not 0 to 65535 or *" : "the port is not 1 to 65535");
  return {};
}

}  // namespace

status check_endpoint(std::string_view endpoint) { return check(endpoint, false); }
status check_bind_endpoint(std::string_view endpoint) { return check(endpoint, true); }

}  // namespace archipelago::transport
