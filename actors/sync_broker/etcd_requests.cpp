#include "sync_broker/etcd_requests.hpp"

#include <sodium.h>

#include <nlohmann/json.hpp>

namespace archipelago {

namespace etcd_requests {
namespace {

using nlohmann::json;

std::string decode64(const std::string& text) {
  std::string out(text.size(), '\0');
  std::size_t n = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), text.data(), text.size(), nullptr,
                        &n, nullptr, sodium_base64_VARIANT_ORIGINAL) != 0)
    return {};
  out.resize(n);
  return out;
}

expected<json> parse(const std::string& body, const char* what) {
  auto doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return make_error(errc::corrupt_data, std::string("etcd's answer to ") + what + " is not a JSON object");
  if (doc.contains("error") || doc.contains("code"))  // the gateway's error document
    return make_error(errc::invalid_input, std::string("etcd refused ") + what + ": " +
                                               doc.value("message", doc.value("error", std::string("?"))));
  return doc;
}

/// etcd's JSON carries 64-bit integers as strings, and leaves zeros out.
std::int64_t integer(const json& doc, const char* key) {
  if (!doc.contains(key)) return 0;
  const json& v = doc[key];
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (!v.is_string()) return 0;
  try {
    return std::stoll(v.get<std::string>());
  } catch (const std::exception&) {
    return 0;
  }
}

std::uint64_t epoch_value(const json& kv) {
  try {
    return std::stoull(decode64(kv.value("value", std::string())));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

std::string base64(std::string_view bytes) {
  std::string out(sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                    sodium_base64_VARIANT_ORIGINAL);
  out.resize(out.size() - 1);  // the terminating NUL
  return out;
}

std::string range_keys(const std::string& prefix) {
  // [PREFIX/, PREFIX0): '0' follows '/', so the range holds exactly the mesh's keys.
  return json{{"key", base64(prefix + "/")}, {"range_end", base64(prefix + "0")}}.dump();
}

expected<keys_seen> read_keys(const std::string& body, const std::string& prefix) {
  auto doc = parse(body, "a range");
  if (!doc) return doc.err();
  keys_seen seen;
  for (const json& kv : doc->value("kvs", json::array())) {
    const std::string key = decode64(kv.value("key", std::string()));
    if (key == prefix + "/leader") {
      seen.leader_epoch = epoch_value(kv);
    } else if (key == prefix + "/epoch") {
      seen.epoch = epoch_value(kv);
      seen.epoch_mod_revision = integer(kv, "mod_revision");
    }
  }
  return seen;
}

std::string grant(std::int64_t ttl_s) { return json{{"TTL", ttl_s}}.dump(); }

expected<std::int64_t> read_grant(const std::string& body) {
  auto doc = parse(body, "a lease grant");
  if (!doc) return doc.err();
  const std::int64_t id = integer(*doc, "ID");
  if (id == 0) return make_error(errc::corrupt_data, "etcd granted no lease ID");
  return id;
}

std::string campaign(const std::string& prefix, std::int64_t lease_id, std::uint64_t epoch,
                     std::int64_t epoch_mod_revision) {
  const std::string leader = base64(prefix + "/leader"), epoch_key = base64(prefix + "/epoch");
  const std::string value = base64(std::to_string(epoch));
  return json{
      {"compare",
       json::array({json{{"key", leader}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}},
                    json{{"key", epoch_key}, {"target", "MOD"}, {"result", "EQUAL"},
                         {"mod_revision", std::to_string(epoch_mod_revision)}}})},
      {"success", json::array({json{{"request_put", {{"key", leader}, {"value", value},
                                                     {"lease", std::to_string(lease_id)}}}},
                               json{{"request_put", {{"key", epoch_key}, {"value", value}}}}})}}
      .dump();
}

expected<bool> read_campaign(const std::string& body) {
  auto doc = parse(body, "a campaign");
  if (!doc) return doc.err();
  return doc->value("succeeded", false);
}

std::string lease_id(std::int64_t id) { return json{{"ID", std::to_string(id)}}.dump(); }

expected<std::int64_t> read_keepalive(const std::string& body) {
  auto doc = parse(body, "a lease renewal");
  if (!doc) return doc.err();
  // One message of the renewal stream: {"result": {"ID": ..., "TTL": ...}}; no TTL: expired.
  return integer(doc->value("result", json::object()), "TTL");
}

}  // namespace etcd_requests

}  // namespace archipelago
