#include "transport/chaos_command.hpp"

#include <cmath>


namespace archipelago {

using transport::decoded_envelope;
using transport::envelope_builder;

const char* to_string(contribution_attack a) {
  switch (a) {
    case contribution_attack::none: return "none";
    case contribution_attack::scaled: return "scaled";
    case contribution_attack::sign_flip: return "sign_flip";
    case contribution_attack::random: return "random";
    case contribution_attack::stale: return "stale";
    case contribution_attack::sideways: return "sideways";
  }
  return "?";
}

void encode_chaos_order(envelope_builder& b, node_address target, const chaos_order& order) {
  auto c = b.body().initChaosCommand();
  transport::set_address(c.initTarget(), target);
  switch (order.kind) {
    case chaos_order::what::shape_link: {
      c.setKind(wire::ChaosKind::SHAPE_LINK);
      transport::set_address(c.initPeer(), order.peer);
      auto l = c.initLink();
      l.setBandwidthBytesPerS(order.link.bandwidth_bytes_per_s);
      l.setLatencyNs(order.link.latency_ns);
      l.setJitterNs(order.link.jitter_ns);
      l.setLoss(order.link.loss);
      l.setDuplicate(order.link.duplicate);
      l.setReorder(order.link.reorder);
      l.setCorrupt(order.link.corrupt);
      break;
    }
    case chaos_order::what::slow_down:
      c.setKind(wire::ChaosKind::SLOW_DOWN);
      c.setFactor(order.factor);
      break;
    case chaos_order::what::storage_fault:
      c.setKind(wire::ChaosKind::STORAGE_FAULT);
      c.setDurationMs(static_cast<std::uint64_t>(order.duration_ns / 1'000'000));
      break;
    case chaos_order::what::heal: c.setKind(wire::ChaosKind::HEAL); break;
    case chaos_order::what::impersonate:
      c.setKind(wire::ChaosKind::IMPERSONATE);
      transport::set_address(c.initPeer(), order.peer);
      c.setDurationMs(static_cast<std::uint64_t>(order.duration_ns / 1'000'000));
      break;
    case chaos_order::what::lie_tokens:
      c.setKind(wire::ChaosKind::LIE_TOKENS);
      c.setFactor(order.factor);
      break;
    case chaos_order::what::attack:
      c.setKind(wire::ChaosKind::ATTACK);
      c.setAttack(static_cast<wire::AttackKind>(order.attack));
      c.setFactor(order.factor);
      break;
  }
}

expected<chaos_order> decode_chaos_order(const decoded_envelope& env) {
  if (env.body() != wire::Envelope::Body::CHAOS_COMMAND)
    return make_error(errc::invalid_input, "not a ChaosCommand");
  auto c = env.root().getBody().getChaosCommand();
  chaos_order o;
  switch (c.getKind()) {
    case wire::ChaosKind::SHAPE_LINK: {
      o.kind = chaos_order::what::shape_link;
      const auto peer = c.getPeer();
      if (static_cast<std::uint16_t>(peer.getRole()) > static_cast<std::uint16_t>(wire::Role::CHAOS_MONKEY))
        return make_error(errc::invalid_input, "ChaosCommand names a peer of unknown role");
      o.peer = {static_cast<role>(peer.getRole()), peer.getIndex()};
      const auto l = c.getLink();
      o.link.bandwidth_bytes_per_s = l.getBandwidthBytesPerS();
      o.link.latency_ns = l.getLatencyNs();
      o.link.jitter_ns = l.getJitterNs();
      o.link.loss = l.getLoss();
      o.link.duplicate = l.getDuplicate();
      o.link.reorder = l.getReorder();
      o.link.corrupt = l.getCorrupt();
      if (auto ok = validate(o.link); !ok) return make_error(errc::invalid_input, "ChaosCommand link: " + ok.err().message);
      break;
    }
    case wire::ChaosKind::SLOW_DOWN:
      o.kind = chaos_order::what::slow_down;
      o.factor = c.getFactor();
      if (!std::isfinite(o.factor) || o.factor < 1 || o.factor > 1000)
        return make_error(errc::invalid_input, "ChaosCommand slow-down factor must be in [1, 1000]");
      break;
    case wire::ChaosKind::STORAGE_FAULT:
      o.kind = chaos_order::what::storage_fault;
      if (c.getDurationMs() > 86'400'000) return make_error(errc::invalid_input, "ChaosCommand storage fault longer than a day");
      o.duration_ns = static_cast<nanos>(c.getDurationMs()) * 1'000'000;
      break;
    case wire::ChaosKind::HEAL: o.kind = chaos_order::what::heal; break;
    case wire::ChaosKind::IMPERSONATE: {
      o.kind = chaos_order::what::impersonate;
      const auto peer = c.getPeer();
      if (static_cast<std::uint16_t>(peer.getRole()) > static_cast<std::uint16_t>(wire::Role::CHAOS_MONKEY))
        return make_error(errc::invalid_input, "ChaosCommand names a peer of unknown role");
      o.peer = {static_cast<role>(peer.getRole()), peer.getIndex()};
      if (c.getDurationMs() > 86'400'000) return make_error(errc::invalid_input, "ChaosCommand impersonation longer than a day");
      o.duration_ns = static_cast<nanos>(c.getDurationMs()) * 1'000'000;
      break;
    }
    case wire::ChaosKind::LIE_TOKENS:
      o.kind = chaos_order::what::lie_tokens;
      o.factor = c.getFactor();
      if (!std::isfinite(o.factor) || o.factor < 1 || o.factor > 1e6)
        return make_error(errc::invalid_input, "ChaosCommand token lie factor must be in [1, 10^6]");
      break;
    case wire::ChaosKind::ATTACK:
      o.kind = chaos_order::what::attack;
      if (static_cast<std::uint16_t>(c.getAttack()) > static_cast<std::uint16_t>(wire::AttackKind::SIDEWAYS))
        return make_error(errc::invalid_input, "ChaosCommand of an unknown attack kind");
      o.attack = static_cast<contribution_attack>(c.getAttack());
      o.factor = c.getFactor();
      if (!std::isfinite(o.factor) || std::fabs(o.factor) > 1e6)
        return make_error(errc::invalid_input, "ChaosCommand attack factor must be in [-1e6, 1e6]");
      break;
    default:  // crash and pause are the launcher's, never a node's own business
      return make_error(errc::invalid_input, "ChaosCommand of a kind a node does not carry out itself");
  }
  return o;
}

std::optional<chaos_order> chaos_receiver::on_command(const decoded_envelope& env, transport::message_port& wire,
                                                      logger& log, nanos now) {
  const node_address self = wire.self();
  auto refuse = [&](const std::string& why) -> std::optional<chaos_order> {
    ++refused;
    log.warn("chaos.refused", "archipelago %s: ignored a ChaosCommand from %s: %s", self.to_string().c_str(),
             env.sender().to_string().c_str(), why.c_str());
    return std::nullopt;
  };
  if (env.sender().kind != role::chaos_monkey) {
    ++refused_sender;
    return refuse("only the chaos monkey sends chaos commands");
  }
  if (!accept) return refuse("wire.accept_chaos is off (only fault drills obey the chaos monkey)");
  auto order = decode_chaos_order(env);
  if (!order) return refuse(order.err().message);
  const auto target = env.root().getBody().getChaosCommand().getTarget();
  if (target.getIndex() != self.index || static_cast<std::uint16_t>(target.getRole()) != static_cast<std::uint16_t>(self.kind))
    return refuse("it was meant for another node");
  switch (order->kind) {
    case chaos_order::what::shape_link:
      if (!wire.set_link(order->peer, order->link)) return refuse("no link to " + order->peer.to_string());
      shaped.insert(order->peer);
      break;
    case chaos_order::what::slow_down: slowdown = order->factor; break;
    case chaos_order::what::storage_fault: storage_failing_until = now + order->duration_ns; break;
    case chaos_order::what::attack:
      if (self.kind != role::learner) return refuse("only a learner carries out an attack");
      attack = order->attack;
      attack_factor = order->factor;
      break;
    case chaos_order::what::heal:
      for (node_address peer : shaped) (void)wire.set_link(peer, wire.default_link());
      shaped.clear();
      slowdown = 1;
      attack = contribution_attack::none;
      attack_factor = 1;
      storage_failing_until = 0;
      impersonate.reset();
      token_lie = 1;
      break;
    case chaos_order::what::impersonate:
      if (order->duration_ns > 0) impersonate = order->peer;
      else impersonate.reset();
      break;
    case chaos_order::what::lie_tokens: token_lie = order->factor; break;
  }
  ++obeyed;
  return *order;
}

}  // namespace archipelago
