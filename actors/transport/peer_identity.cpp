#include "transport/peer_identity.hpp"

#include <charconv>
#include <utility>

#include "core/mesh_setup.hpp"

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

std::optional<node_address> address_of_routing_id(std::string_view routing_id) {
  if (routing_id.ends_with("+bulk")) routing_id.remove_suffix(5);
  const std::size_t slash = routing_id.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const auto index = parse_index(routing_id.substr(slash + 1));
  if (!index) return std::nullopt;
  for (role r : {role::learner, role::sync_broker, role::parameter_shard, role::chaos_monkey, role::admin})
    if (routing_id.substr(0, slash) == to_string(r)) return node_address{r, *index};
  return std::nullopt;
}

std::string routing_id_of(node_address node, bool bulk) { return node.to_string() + (bulk ? "+bulk" : ""); }

std::optional<admission_refusal> admit_envelope(const connection_identity& from, const decoded_envelope& env,
                                                const mesh_bounds& bounds, bool check_roles) {
  const node_address claimed = env.sender();
  const auto body = env.body();
  switch (from.how) {
    case connection_identity::kind::key:
      if (auto no = check_sender(from.key_name, claimed, body); no && no->impersonation)
        return admission_refusal{reject_reason::impersonation, no->message};
      break;
    case connection_identity::kind::dialled:
      if (claimed != from.peer)
        return admission_refusal{reject_reason::impersonation, "on the connection to " + from.peer.to_string() +
                                                                   ", a message claims to be " + claimed.to_string()};
      // This node's sockets carry its requests out; the peer's ROUTER answers on them only
      // to refuse one (an Error). Anything else is the peer speaking where it may not.
      if (body != wire::Envelope::Body::ERROR)
        return admission_refusal{reject_reason::wrong_direction,
                                 std::string(body_name(body)) + " from " + claimed.to_string() +
                                     " on a connection this node opened (only an Error travels back on one)"};
      break;
    case connection_identity::kind::routing: {
      const auto id = address_of_routing_id(from.routing_id);
      if (!id || *id != claimed)
        return admission_refusal{reject_reason::impersonation,
                                 "the connection of " + (id ? id->to_string() : std::string("an unnamed client")) +
                                     " claims to be " + claimed.to_string()};
      break;
    }
  }
  if (check_roles && !role_may_send(claimed.kind, body))
    return admission_refusal{reject_reason::not_permitted,
                             std::string(to_string(claimed.kind)) + " may not send " + body_name(body)};
  const std::uint32_t size = claimed.kind == role::learner           ? bounds.learners
                             : claimed.kind == role::parameter_shard ? bounds.shards
                             : claimed.kind == role::sync_broker     ? bounds.brokers
                                                                     : 0;
  if (size != 0 && claimed.index >= size)
    return admission_refusal{reject_reason::unknown_sender, claimed.to_string() + " is not in the mesh (" +
                                                                std::to_string(size) + " " + to_string(claimed.kind) +
                                                                "(s))"};
  if (const std::uint64_t epoch = env.header().getBrokerEpoch(); bounds.brokers != 0 && !epoch_can_exist(epoch, bounds.brokers))
    return admission_refusal{reject_reason::bad_epoch,
                             "broker epoch " + std::to_string(epoch) + " (broker/" + std::to_string(leader_of_epoch(epoch)) +
                                 ", incarnation " + std::to_string(epoch >> 8) + ") cannot exist in a mesh of " +
                                 std::to_string(bounds.brokers) + " broker(s)"};
  return std::nullopt;
}

}  // namespace archipelago::transport
