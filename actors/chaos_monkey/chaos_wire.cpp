#include "chaos_monkey/chaos_wire.hpp"

#include <algorithm>
#include <cstdio>

namespace archipelago {
namespace {

node_address address_of(const fault_target& t) { return {t.kind, t.index}; }

/// Every node of the mesh but `self`; a learner talks to the brokers and the shards only.
std::vector<node_address> peers_of(const mesh_setup& setup, node_address self) {
  std::vector<node_address> out;
  for (std::uint32_t b = 0; b < setup.brokers(); ++b)
    if (self != broker_at(b)) out.push_back(broker_at(b));
  for (std::uint32_t s = 0; s < setup.shard_endpoints.size(); ++s)
    if (self != node_address{role::parameter_shard, s}) out.push_back({role::parameter_shard, s});
  if (self.kind != role::learner)
    for (std::uint32_t l = 0; l < setup.learner_endpoints.size(); ++l) out.push_back({role::learner, l});
  return out;
}

link_profile shaped(const link_profile& normal, const link_fault& f) {
  link_profile p = normal;
  if (f.loss > 0) p.loss = f.loss;
  if (f.duplicate > 0) p.duplicate = f.duplicate;
  if (f.reorder > 0) p.reorder = f.reorder;
  if (f.corrupt > 0) p.corrupt = f.corrupt;
  if (f.delay_ms > 0) p.latency_ns = static_cast<nanos>(f.delay_ms * 1e6);
  if (f.bandwidth_mbit > 0) p.bandwidth_bytes_per_s = f.bandwidth_mbit * 1e6 / 8;
  return p;
}

/// The nodes a group of targets names ("learners": every learner).
std::vector<node_address> addresses(const mesh_setup& setup, const std::vector<fault_target>& targets) {
  std::vector<node_address> out;
  for (const auto& t : targets)
    if (t.every_learner)
      for (std::uint32_t l = 0; l < setup.learner_endpoints.size(); ++l) out.push_back({role::learner, l});
    else
      out.push_back(address_of(t));
  return out;
}

std::string seconds(nanos ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3gs", static_cast<double>(ns) * 1e-9);
  return text;
}

}  // namespace

chaos_wire::chaos_wire(const mesh_setup& setup, std::vector<planned_fault> timeline, nanos safety_ns,
                       transport::message_port& port, process_control& control, chaos_log& log)
    : setup_(setup), core_(std::move(timeline), safety_ns), safety_ns_(safety_ns), port_(port), control_(control),
      log_(log), active_(core_.timeline().size(), false) {}

void chaos_wire::start() {
  for (std::uint32_t b = 0; b < setup_.brokers(); ++b) reconnect(broker_at(b));
  for (std::uint32_t s = 0; s < setup_.shard_endpoints.size(); ++s) reconnect({role::parameter_shard, s});
  for (std::uint32_t l = 0; l < setup_.learner_endpoints.size(); ++l) reconnect({role::learner, l});
}

/// Sockets to the node's endpoint, made anew. Also after every restart the
/// monkey orders: its sockets to the predecessor are gone (an inproc:// pipe
/// is not re-established, and nodes never heartbeat the monkey, so it would
/// never find them silent).
void chaos_wire::reconnect(node_address n) {
  if (n.kind == role::sync_broker && n.index < setup_.brokers()) (void)port_.add_peer(n, setup_.broker_endpoint_of(n.index));
  if (n.kind == role::parameter_shard && n.index < setup_.shard_endpoints.size())
    (void)port_.add_peer(n, setup_.shard_endpoints[n.index]);
  if (n.kind == role::learner && n.index < setup_.learner_endpoints.size())
    (void)port_.add_peer(n, setup_.learner_endpoints[n.index]);
}

nanos chaos_wire::tick(nanos since_start) {
  for (const chaos_action& a : core_.tick(since_start)) {
    if (a.action != chaos_action::what::skip) carry_out(a, since_start);
    std::lock_guard lock(log_.mutex);
    log_.events.push_back({a.at_ns, a.action, a.fault});
  }
  count_down();
  const nanos next = core_.next_due();
  if (next < 0 && !log_.healed) {  // belt and braces: every node back to normal
    for (node_address n : peers_of(setup_, {role::chaos_monkey, 0})) command(n, {});
    log_.healed = true;
  }
  return next;
}

void chaos_wire::command(node_address target, const chaos_order& order) {
  auto b = port_.make_envelope();
  encode_chaos_order(b, target, order);
  if (port_.send(target, b.finish())) ++log_.commands_sent;
  else ++log_.commands_failed;
}

/// Shapes both directions of every link between the nodes of `a` and those of `b`.
void chaos_wire::shape_between(const std::vector<node_address>& a, const std::vector<node_address>& b,
                               const link_profile& profile) {
  for (node_address x : a)
    for (node_address y : b) {
      if (x == y || (x.kind == role::learner && y.kind == role::learner)) continue;  // learners never talk
      chaos_order o;
      o.kind = chaos_order::what::shape_link;
      o.link = profile;
      o.peer = y;
      command(x, o);
      o.peer = x;
      command(y, o);
    }
}

/// Carries out one inject or repair.
void chaos_wire::carry_out(const chaos_action& a, nanos since_start) {
  const planned_fault& f = core_.timeline()[a.fault];
  const bool inject = a.action == chaos_action::what::inject;
  // A pause or a storage fault never outlasts the safety phase.
  const nanos bounded_ns = std::max<nanos>(0, std::min(f.for_ns, safety_ns_ - since_start));
  active_[a.fault] = inject;
  switch (f.kind) {
    case fault_kind::crash:
    case fault_kind::shard_crash:
    case fault_kind::broker_crash:
      for (const auto& t : f.targets) {
        if (inject) {
          control_.crash(t);
        } else {
          control_.restart(t);
          reconnect(address_of(t));
          reapply(t);
        }
      }
      break;
    case fault_kind::broker_host_lost:  // nothing to repair: a standby leads from here on
      active_[a.fault] = false;
      if (inject)
        for (const auto& t : f.targets) control_.lose_host(t);
      break;
    case fault_kind::pause:  // the launcher resumes it itself
      if (inject)
        for (const auto& t : f.targets) control_.pause(t, bounded_ns);
      break;
    case fault_kind::slow:
    case fault_kind::partition:
    case fault_kind::link:
    case fault_kind::attack_scaled:
    case fault_kind::attack_sign_flip:
    case fault_kind::attack_random:
    case fault_kind::attack_stale:
    case fault_kind::attack_sideways: shape(f, inject, std::nullopt); break;
    case fault_kind::storage_errors:
      for (const auto& t : f.targets) {
        chaos_order o;
        o.kind = chaos_order::what::storage_fault;
        o.duration_ns = inject ? bounded_ns : 0;
        command({role::parameter_shard, t.index}, o);
      }
      break;
    case fault_kind::impersonate:
    case fault_kind::lie_tokens:  // attackers: the learner carries them out with its own key
      for (node_address n : addresses(setup_, f.targets)) {
        chaos_order o;
        o.kind = f.kind == fault_kind::impersonate ? chaos_order::what::impersonate : chaos_order::what::lie_tokens;
        o.peer = address_of(f.as);
        o.duration_ns = inject ? std::max<nanos>(1'000'000, bounded_ns) : 0;
        o.factor = inject ? std::max(1.0, f.factor) : 1.0;
        command(n, o);
      }
      break;
  }
}

void chaos_wire::shape(const planned_fault& f, bool inject, std::optional<node_address> only) {
  const link_profile& normal = port_.default_link();
  auto with = [&](std::vector<node_address> nodes) {  // narrowed to `only` when given
    if (only) std::erase_if(nodes, [&](node_address n) { return n != *only; });
    return nodes;
  };
  switch (f.kind) {
    case fault_kind::slow:
      for (node_address n : with(addresses(setup_, f.targets))) {
        chaos_order o;
        o.kind = chaos_order::what::slow_down;
        o.factor = inject ? std::max(1.0, f.factor) : 1.0;
        command(n, o);
      }
      break;
    case fault_kind::attack_scaled:
    case fault_kind::attack_sign_flip:
    case fault_kind::attack_random:
    case fault_kind::attack_stale:
    case fault_kind::attack_sideways:
      for (node_address n : with(addresses(setup_, f.targets))) {
        chaos_order o;
        o.kind = chaos_order::what::attack;
        o.attack = !inject                                    ? contribution_attack::none
                   : f.kind == fault_kind::attack_scaled    ? contribution_attack::scaled
                   : f.kind == fault_kind::attack_sign_flip ? contribution_attack::sign_flip
                   : f.kind == fault_kind::attack_random    ? contribution_attack::random
                   : f.kind == fault_kind::attack_stale     ? contribution_attack::stale
                                                            : contribution_attack::sideways;
        o.factor = f.factor;
        command(n, o);
      }
      break;
    case fault_kind::partition: {
      link_profile cut = normal;
      cut.loss = 1;
      for (std::size_t i = 0; i < f.groups.size(); ++i)
        for (std::size_t j = 0; j < f.groups.size(); ++j)
          if (i != j && (only || i < j))  // both ways once; a restarted node on either side
            shape_between(with(addresses(setup_, f.groups[i])), addresses(setup_, f.groups[j]), inject ? cut : normal);
      break;
    }
    case fault_kind::link:
      for (node_address t : addresses(setup_, f.targets)) {
        const link_profile p = inject ? shaped(normal, f.link) : normal;
        if (!only || *only == t) shape_between({t}, peers_of(setup_, t), p);
        else shape_between({t}, with(peers_of(setup_, t)), p);
      }
      break;
    default: break;
  }
}

void chaos_wire::reapply(const fault_target& restarted) {
  const node_address n = address_of(restarted);
  const auto& timeline = core_.timeline();
  for (std::size_t i = 0; i < timeline.size(); ++i)
    if (active_[i]) shape(timeline[i], true, n);
}

/// What is down now, from the faults still active.
void chaos_wire::count_down() {
  std::vector<bool> learner_down(setup_.learner_endpoints.size(), false), shard_down(setup_.shard_endpoints.size(), false);
  bool broker_down = false;
  const auto& timeline = core_.timeline();
  for (std::size_t i = 0; i < timeline.size(); ++i) {
    if (!active_[i]) continue;
    const planned_fault& f = timeline[i];
    switch (f.kind) {
      case fault_kind::crash:
      case fault_kind::pause:
        for (const auto& t : f.targets)
          if (t.index < learner_down.size()) learner_down[t.index] = true;
        break;
      case fault_kind::shard_crash:
        for (const auto& t : f.targets)
          if (t.index < shard_down.size()) shard_down[t.index] = true;
        break;
      case fault_kind::broker_crash: broker_down = true; break;
      case fault_kind::partition:  // learners in a group without the broker are cut off
        for (const auto& group : f.groups) {
          const bool has_broker = std::any_of(group.begin(), group.end(),
                                              [](const fault_target& t) { return t.kind == role::sync_broker; });
          if (has_broker) continue;
          for (const auto& t : group)
            if (t.kind == role::learner && t.index < learner_down.size()) learner_down[t.index] = true;
        }
        break;
      default: break;
    }
  }
  log_.learners_down = static_cast<int>(std::count(learner_down.begin(), learner_down.end(), true));
  log_.shards_down = static_cast<int>(std::count(shard_down.begin(), shard_down.end(), true));
  log_.broker_down = broker_down;
}

std::string describe(const planned_fault& f) {
  std::string out = to_string(f.kind);
  auto list = [](const std::vector<fault_target>& targets) {
    std::string s;
    for (const auto& t : targets) {
      if (!s.empty()) s += ", ";
      s += t.to_string();
    }
    return s;
  };
  if (f.kind == fault_kind::partition) {
    for (std::size_t i = 0; i < f.groups.size(); ++i) {
      out += i ? " | {" : " {";
      out += list(f.groups[i]);
      out += "}";
    }
  } else {
    out += " ";
    out += list(f.targets);
  }
  if (f.kind == fault_kind::impersonate) out += " as " + f.as.to_string();
  if (f.kind == fault_kind::slow || f.kind == fault_kind::lie_tokens || f.kind == fault_kind::attack_scaled ||
      f.kind == fault_kind::attack_sideways) {
    char factor[24];
    std::snprintf(factor, sizeof factor, " x%g", f.factor);
    out += factor;
  }
  if (f.kind == fault_kind::link) {
    char text[160];
    std::snprintf(text, sizeof text, " loss=%g dup=%g reorder=%g corrupt=%g delay=%gms bw=%gMbit", f.link.loss,
                  f.link.duplicate, f.link.reorder, f.link.corrupt, f.link.delay_ms, f.link.bandwidth_mbit);
    out += text;
  }
  if (f.for_ns > 0) out += " for " + seconds(f.for_ns);
  return out;
}

}  // namespace archipelago
