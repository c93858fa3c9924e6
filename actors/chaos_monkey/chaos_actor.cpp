#include "chaos_monkey/chaos_actor.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "chaos_monkey/chaos_command.hpp"
#include "transport/caf_bridge.hpp"
#include "transport/transport.hpp"

namespace archipelago {
namespace {

using namespace transport;
using tick_atom = caf::atom_constant<caf::atom("tick")>;

node_address address_of(const fault_target& t) { return {t.kind, t.kind == role::sync_broker ? 0 : t.index}; }

struct chaos_state {
  std::unique_ptr<chaos_core> core;
  std::unique_ptr<node_transport> wire;
  nanos started_ns = 0;
  std::vector<bool> active;  // per fault of the timeline: injected, not yet repaired
  link_profile normal;       // the mesh's configured link, restored on repair
  static inline const char* name = "chaos_monkey";
};
using chaos_self = caf::stateful_actor<chaos_state, caf::event_based_actor>;

/// Every node of the mesh but `self`; a learner talks to the broker and the shards only.
std::vector<node_address> peers_of(const mesh_setup& setup, node_address self) {
  std::vector<node_address> out;
  if (self != broker_address) out.push_back(broker_address);
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

void command(chaos_self* self, chaos_log& log, node_address target, const chaos_order& order) {
  auto b = self->state.wire->make_envelope();
  encode_chaos_order(b, target, order);
  if (self->state.wire->send(target, b.finish())) ++log.commands_sent;
  else ++log.commands_failed;
}

/// Shapes both directions of every link between the nodes of `a` and those of `b`.
void shape_between(chaos_self* self, chaos_log& log, const std::vector<node_address>& a,
                   const std::vector<node_address>& b, const link_profile& profile) {
  for (node_address x : a)
    for (node_address y : b) {
      if (x == y || (x.kind == role::learner && y.kind == role::learner)) continue;  // learners never talk
      chaos_order o;
      o.kind = chaos_order::what::shape_link;
      o.link = profile;
      o.peer = y;
      command(self, log, x, o);
      o.peer = x;
      command(self, log, y, o);
    }
}

std::vector<node_address> addresses(const std::vector<fault_target>& targets) {
  std::vector<node_address> out;
  for (const auto& t : targets) out.push_back(address_of(t));
  return out;
}

/// Carries out one inject or repair.
void carry_out(chaos_self* self, const mesh_setup& setup, process_control& control, chaos_log& log,
               const chaos_action& a, nanos now_since_start, nanos safety_ns) {
  auto& st = self->state;
  const planned_fault& f = st.core->timeline()[a.fault];
  const bool inject = a.action == chaos_action::what::inject;
  st.active[a.fault] = inject;
  switch (f.kind) {
    case fault_kind::crash:
    case fault_kind::shard_crash:
    case fault_kind::broker_crash:
      for (const auto& t : f.targets) inject ? control.crash(t) : control.restart(t);
      break;
    case fault_kind::pause:
      // The launcher resumes it itself; a pause never outlasts the safety phase.
      if (inject)
        for (const auto& t : f.targets)
          control.pause(t, std::max<nanos>(0, std::min(f.for_ns, safety_ns - now_since_start)));
      break;
    case fault_kind::slow:
      for (const auto& t : f.targets) {
        chaos_order o;
        o.kind = chaos_order::what::slow_down;
        o.factor = inject ? std::max(1.0, f.factor) : 1.0;
        command(self, log, address_of(t), o);
      }
      break;
    case fault_kind::partition: {
      const link_profile cut = [&] {
        link_profile p = st.normal;
        p.loss = 1;
        return p;
      }();
      for (std::size_t i = 0; i < f.groups.size(); ++i)
        for (std::size_t j = i + 1; j < f.groups.size(); ++j)
          shape_between(self, log, addresses(f.groups[i]), addresses(f.groups[j]), inject ? cut : st.normal);
      break;
    }
    case fault_kind::link:
      for (const auto& t : f.targets)
        shape_between(self, log, {address_of(t)}, peers_of(setup, address_of(t)),
                      inject ? shaped(st.normal, f.link) : st.normal);
      break;
    case fault_kind::storage_errors:
      for (const auto& t : f.targets) {
        chaos_order o;
        o.kind = chaos_order::what::storage_fault;
        o.duration_ns = inject ? std::max<nanos>(0, std::min(f.for_ns, safety_ns - now_since_start)) : 0;
        command(self, log, {role::parameter_shard, t.index}, o);
      }
      break;
  }
}

/// What is down now, from the faults still active.
void count_down(const chaos_state& st, const mesh_setup& setup, chaos_log& log) {
  std::vector<bool> learner_down(setup.learner_endpoints.size(), false), shard_down(setup.shard_endpoints.size(), false);
  bool broker_down = false;
  const auto& timeline = st.core->timeline();
  for (std::size_t i = 0; i < timeline.size(); ++i) {
    if (!st.active[i]) continue;
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
      case fault_kind::partition: {  // learners in a group without the broker are cut off
        for (const auto& group : f.groups) {
          const bool has_broker = std::any_of(group.begin(), group.end(),
                                              [](const fault_target& t) { return t.kind == role::sync_broker; });
          if (has_broker) continue;
          for (const auto& t : group)
            if (t.kind == role::learner && t.index < learner_down.size()) learner_down[t.index] = true;
        }
        break;
      }
      default: break;
    }
  }
  log.learners_down = static_cast<int>(std::count(learner_down.begin(), learner_down.end(), true));
  log.shards_down = static_cast<int>(std::count(shard_down.begin(), shard_down.end(), true));
  log.broker_down = broker_down;
}

caf::behavior chaos_actor(chaos_self* self, const mesh_setup* setup, std::string endpoint,
                          std::vector<planned_fault> timeline, nanos safety_ns, process_control* control,
                          chaos_log* log, const clock_source* clock) {
  auto& st = self->state;
  st.active.assign(timeline.size(), false);
  st.core = std::make_unique<chaos_core>(std::move(timeline), safety_ns);
  auto settings = transport_config_from(setup->cfg, {role::chaos_monkey, 0}, incarnation{1}, endpoint);
  if (settings) {
    settings->context = setup->io_context;
    // The nodes do not heartbeat back to the chaos monkey: it must never declare them dead.
    settings->heartbeat.interval_ns = 3'600'000'000'000;
    st.normal = settings->default_link;
    auto wire = node_transport::start(*settings, *clock, [](std::shared_ptr<const inbound_message>) {});
    if (wire) st.wire = std::move(*wire);
    else settings = wire.err();
  }
  if (!st.wire) {
    std::fprintf(stderr, "archipelago chaos monkey: %s\n", settings.err().message.c_str());
    self->quit(caf::exit_reason::user_shutdown);
    return {};
  }
  (void)st.wire->add_peer(broker_address, setup->broker_endpoint);
  for (std::uint32_t s = 0; s < setup->shard_endpoints.size(); ++s)
    (void)st.wire->add_peer({role::parameter_shard, s}, setup->shard_endpoints[s]);
  for (std::uint32_t l = 0; l < setup->learner_endpoints.size(); ++l)
    (void)st.wire->add_peer({role::learner, l}, setup->learner_endpoints[l]);
  st.started_ns = clock->now();
  {
    std::lock_guard lock(log->mutex);
    log->started_ns = st.started_ns;
  }
  self->send(self, tick_atom::value);
  return {
      [self, setup, safety_ns, control, log, clock](tick_atom) {
        auto& st = self->state;
        const nanos now = clock->now() - st.started_ns;
        for (const chaos_action& a : st.core->tick(now)) {
          if (a.action != chaos_action::what::skip) carry_out(self, *setup, *control, *log, a, now, safety_ns);
          std::lock_guard lock(log->mutex);
          log->events.push_back({a.at_ns, a.action, a.fault});
        }
        count_down(st, *setup, *log);
        const nanos next = st.core->next_due();
        if (next < 0) {
          if (!log->healed) {  // belt and braces: every node back to normal
            for (node_address n : peers_of(*setup, {role::chaos_monkey, 0})) command(self, *log, n, {});
            log->healed = true;
          }
          return;
        }
        self->delayed_send(self, std::chrono::nanoseconds(std::max<nanos>(next - now, 1'000'000)), tick_atom::value);
      },
  };
}

std::string seconds(nanos ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3gs", static_cast<double>(ns) * 1e-9);
  return text;
}

}  // namespace

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
  if (f.kind == fault_kind::slow) {
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

caf::actor spawn_chaos_monkey(caf::actor_system& sys, const mesh_setup& setup, std::string endpoint,
                              std::vector<planned_fault> timeline, nanos safety_ns, process_control& control,
                              chaos_log& log, const clock_source& clock) {
  return sys.spawn<caf::detached>(chaos_actor, &setup, std::move(endpoint), std::move(timeline), safety_ns, &control,
                                  &log, &clock);
}

}  // namespace archipelago
