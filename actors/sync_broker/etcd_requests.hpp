#pragma once
// etcd's v3 JSON API (3.4, POST /v3/...), as the brokers' lease (etcd_lease)
// speaks it: the request bodies and the reading of the answers. Pure: no
// sockets; keys and values are base64 in etcd's JSON, 64-bit integers strings.

#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace archipelago {

namespace etcd_requests {
std::string base64(std::string_view bytes);
/// What a range of the mesh's two keys says.
struct keys_seen {
  std::uint64_t leader_epoch = 0;  // 0: no leader key (no broker holds the lease)
  std::uint64_t epoch = 0;         // the newest epoch granted; 0: none yet
  std::int64_t epoch_mod_revision = 0;  // the epoch key's, for the campaign's compare (0: absent)
};
std::string range_keys(const std::string& prefix);
expected<keys_seen> read_keys(const std::string& body, const std::string& prefix);
std::string grant(std::int64_t ttl_s);
expected<std::int64_t> read_grant(const std::string& body);  // the lease's ID
std::string campaign(const std::string& prefix, std::int64_t lease_id, std::uint64_t epoch,
                     std::int64_t epoch_mod_revision);
expected<bool> read_campaign(const std::string& body);  // true: this broker leads now
std::string lease_id(std::int64_t id);                  // keepalive and revoke
expected<std::int64_t> read_keepalive(const std::string& body);  // the TTL left; 0: the lease is gone
}  // namespace etcd_requests

}  // namespace archipelago
