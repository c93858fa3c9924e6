#include "transport/peer_identity.hpp"

#include <charconv>
#include <utility>

namespace archipelago::transport {

namespace {

std::optional<std::uint32_t> parse_index(std::string_view digits) {
  if (digits.empty() || digits.size() > 9 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  std::uint32_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
  return v;
}

}  // namespace

const char* body_name(wire::Envelope::Body::Which body) {
  using B = wire::Envelope::Body;
  switch (body) {
    case B::JOIN: return "Join";
    case B::WELCOME: return "Welcome";
    case B::HEARTBEAT: return "Heartbeat";
    case B::LEAVE: return "Leave";
    case B::PROGRESS: return "Progress";
    case B::ROUND_OPEN: return "RoundOpen";
    case B::CONTRIBUTION: return "Contribution";
    case B::ROUND_CLOSE: return "RoundClose";
    case B::FRAGMENT_UPDATE: return "FragmentUpdate";
    case B::FETCH_FRAGMENT: return "FetchFragment";
    case B::CHAOS_COMMAND: return "ChaosCommand";
    case B::ERROR: return "Error";
    case B::ACK: return "Ack";
    case B::BROKER_STATE: return "BrokerState";
    case B::RECONFIGURE: return "Reconfigure";
  }
  return "unknown";
}

std::string key_identity::name() const {
  switch (kind) {
    case role::sync_broker: return !index || *index == 0 ? "broker" : "broker-" + std::to_string(*index);
    case role::parameter_shard: return "shard-" + (index ? std::to_string(*index) : std::string("?"));
    case role::learner: return index ? "learner-" + std::to_string(*index) : "learner";
    case role::chaos_monkey: return "chaos";
    case role::admin: return "admin";
  }
  return "?";
}

expected<key_identity> identity_of_key_name(std::string_view name) {
  if (name == "broker") return key_identity{role::sync_broker, 0u};
  if (name == "learner") return key_identity{role::learner, std::nullopt};
  if (name == "chaos") return key_identity{role::chaos_monkey, std::nullopt};
  if (name == "admin") return key_identity{role::admin, std::nullopt};
  constexpr std::pair<std::string_view, role> prefixes[] = {
      {"broker-", role::sync_broker}, {"shard-", role::parameter_shard}, {"learner-", role::learner}};
  for (auto [prefix, kind] : prefixes) {
    if (!name.starts_with(prefix)) continue;
    if (auto i = parse_index(name.substr(prefix.size()))) return key_identity{kind, *i};
    break;
  }
  return make_error(errc::invalid_input, "key name '" + std::string(name.substr(0, 64)) +
                                             "' names no identity (broker, broker-I, shard-I, learner-I, learner, chaos, admin)");
}

std::string key_name_of(node_address node) {
  switch (node.kind) {
    case role::sync_broker: return key_identity{node.kind, node.index}.name();
    case role::parameter_shard: return "shard-" + std::to_string(node.index);
    case role::learner: return "learner-" + std::to_string(node.index);
    case role::chaos_monkey: return "chaos";
    case role::admin: return "admin";
  }
  return "?";
}

bool identity_admits(const key_identity& id, node_address claimed) {
  return id.kind == claimed.kind && (!id.index || *id.index == claimed.index);
}

bool role_may_send(role sender, wire::Envelope::Body::Which body) {
  using B = wire::Envelope::Body;
  switch (body) {
    case B::HEARTBEAT:
    case B::LEAVE:
    case B::ERROR:
    case B::ACK: return true;
    case B::WELCOME:
    case B::ROUND_OPEN:
    case B::ROUND_CLOSE:
    case B::BROKER_STATE: return sender == role::sync_broker;
    case B::FRAGMENT_UPDATE: return sender == role::parameter_shard;
    case B::PROGRESS:
    case B::FETCH_FRAGMENT: return sender == role::learner;
    case B::CONTRIBUTION: return sender == role::learner || sender == role::parameter_shard;
    case B::JOIN: return sender != role::chaos_monkey && sender != role::admin;
    case B::CHAOS_COMMAND: return sender == role::chaos_monkey;
    // An operator's change; the broker forwards an accepted one to its shards.
    case B::RECONFIGURE: return sender == role::admin || sender == role::sync_broker;
  }
  return false;
}

std::optional<refusal> check_sender(std::string_view key_name, node_address claimed,
                                    wire::Envelope::Body::Which body) {
  auto id = identity_of_key_name(key_name);
  if (!id) return refusal{true, "the key " + id.err().message + ", yet claims to be " + claimed.to_string()};
  if (!identity_admits(*id, claimed))
    return refusal{true, "the key of " + id->name() + " claims to be " + claimed.to_string()};
  if (!role_may_send(claimed.kind, body))
    return refusal{false, std::string(to_string(claimed.kind)) + " may not send " + body_name(body)};
  return std::nullopt;
}

}  // namespace archipelago::transport
