// The parameter shard's CAF shell: contributions in, arrival notices to the
// broker; on the broker's close, merge, outer step and broadcast of the new
// fragment; FetchFragment answered for joiners (Clone pattern).

#include <cmath>
#include <map>

#include "chaos_monkey/chaos_command.hpp"
#include "node/mesh_actors.hpp"
#include "node/node_metrics.hpp"
#include "node/mesh_snapshots.hpp"
#include "parameter_shard/shard_core.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {
namespace {

using namespace transport;

struct shard_state {
  std::unique_ptr<shard_core> core;
  std::unique_ptr<node_transport> wire;
  std::vector<node_address> learners;  // broadcast list (learners that fetched)
  std::map<node_address, std::pair<std::string, std::uint64_t>> endpoints;  // learner → (endpoint, incarnation)
  std::vector<fragment_index> owned;
  std::uint32_t index = 0;
  chaos_receiver chaos;                  // link shaping and storage faults from the chaos monkey
  std::uint64_t disk_generation = 0;     // invalidates the end of an earlier storage fault
  std::uint64_t broker_incarnation = 0;  // as last seen; 0: not yet
  nanos started_ns = 0;
  std::uint64_t published = 0;           // versions this incarnation published
  static inline const char* name = "parameter_shard";
};

storage::stored_ledger stored(const shard_ledger& l) {
  return {l.merged_tokens, l.late_tokens, l.rejected_tokens, l.unmerged_tokens, 0};
}

/// Resumes every owned fragment from the manifest; with a writer and no
/// manifest yet, commits the initial state instead.
status start_snapshots(shard_core& core, const std::vector<fragment_index>& owned, const snapshot_context& snaps) {
  if (snaps.restore_store && snaps.resume_from && !snaps.resume_from->entries.empty()) {
    for (fragment_index p : owned) {
      const storage::manifest_entry* e = snaps.resume_from->find(p.value);
      if (!e)
        return make_error(errc::invalid_input, "the snapshot has no fragment " + std::to_string(p.value) +
                                                   ": it was written by another shard or mesh");
      auto f = snaps.restore_store->read_fragment(p.value, e->version);
      if (!f) return f.err();
      if (auto ok = core.restore(p, outer_state_of(std::move(*f))); !ok) return ok;
    }
    return {};
  }
  if (!snaps.writer) return {};
  storage::commit_job initial;
  initial.time_ns = wall_clock_ns();
  for (fragment_index p : owned) initial.fragments.push_back(stored_state(p, core.outer_state(p), initial.time_ns));
  return snaps.writer->submit(std::move(initial));
}

/// Announces this incarnation to the broker: at start (after a shard restart the
/// broker drops the rounds the last one held) and to a restarted broker.
void send_join(shard_state& st, const mesh_setup& setup) {
  auto b = st.wire->make_envelope();
  auto join = b.body().initJoin();
  join.setLayoutFingerprint(setup.layout.fingerprint());
  join.setConfigHash(mesh_agreement_hash(setup.cfg));
  (void)st.wire->send(broker_address, b.finish());
}

/// A message from the broker, or a contribution to one of its rounds. A higher
/// incarnation than the one known is a restarted broker: the rounds the old one
/// opened never close, so their buffered contributions go (shard_core::
/// on_broker_restarted), and the new broker learns this shard's incarnation.
void broker_seen(shard_state& st, const mesh_setup& setup, std::uint64_t inc) {
  if (inc <= st.broker_incarnation) return;
  if (st.broker_incarnation != 0) {
    // Reconnect now: the old broker's socket may be dead for good (an inproc:// pipe
    // never reconnects), and a broker back within the liveness timeout never looked dead.
    (void)st.wire->add_peer(broker_address, setup.broker_endpoint);
    const std::size_t dropped = st.core->on_broker_restarted();
    std::fprintf(stderr, "archipelago shard %u: the broker restarted (incarnation %llu); %zu buffered contribution(s) "
                         "of its rounds dropped\n", st.index, static_cast<unsigned long long>(inc), dropped);
  }
  st.broker_incarnation = inc;
  send_join(st, setup);
}

caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, const mesh_setup* setup, std::uint32_t index,
                          std::vector<float> initial, mesh_stats* stats, const clock_source* clock,
                          const snapshot_context* snaps, incarnation inc) {
  auto& st = self->state;
  st.index = index;
  st.started_ns = clock->now();
  for (std::uint32_t p = 0; p < setup->shard_of_fragment.size(); ++p)
    if (setup->shard_of_fragment[p] == index) st.owned.push_back({p});
  shard_config sc;
  sc.outer = {setup->cfg.mesh.outer_lr, setup->cfg.mesh.outer_momentum};
  sc.gradient_mode = setup->policy.send_gradients;
  sc.merge_mean = setup->cfg.mesh.merge == "mean";
  sc.adamw_outer = setup->cfg.optimizer;
  sc.schedule_steps = setup->cfg.train.steps;
  sc.record_merges = snaps && snaps->writer && snaps->record_contributions;
  st.core = std::make_unique<shard_core>(setup->layout, setup->plan, st.owned, sc, initial.data());
  if (snaps)
    if (auto ok = start_snapshots(*st.core, st.owned, *snaps); !ok) {
      std::fprintf(stderr, "archipelago shard %u: snapshots: %s\n", index, ok.err().to_string().c_str());
      self->quit(caf::exit_reason::user_shutdown);
      return {};
    }
  st.wire = start_mesh_wire(self, *setup, {role::parameter_shard, index}, setup->shard_endpoints[index], *clock, inc);
  if (!st.wire) return {};
  st.chaos.accept = setup->cfg.wire.accept_chaos;
  (void)st.wire->add_peer(broker_address, setup->broker_endpoint);
  send_join(st, *setup);

  auto fragment_message = [self](fragment_index p, std::uint64_t round) {
    auto& st = self->state;
    auto b = st.wire->make_envelope(round);
    auto u = b.body().initFragmentUpdate();
    u.setFragment(p.value);
    u.setVersion(st.core->version(p));
    const auto& value = st.core->value(p);
    (void)b.add_tensor_values("fragment/" + std::to_string(p.value), value.data(), value.size(),
                              tensor_encoding::fp32);
    return b.finish();
  };

  // Commits a new version off the round's path; the broker hears of it once durable.
  auto commit = [self, stats, snaps](published_fragment&& published) {
    auto& st = self->state;
    storage::commit_job job;
    job.time_ns = wall_clock_ns();
    job.fragments.push_back(stored_state(published.fragment, st.core->outer_state(published.fragment), job.time_ns));
    if (!published.merged.empty()) {
      storage::merge_record m{published.fragment.value, published.version, published.round.value, {}};
      for (auto& c : published.merged)
        m.contributions.push_back({c.from.learner.value, c.from.inc.value, c.steps, c.tokens, std::move(c.delta)});
      job.merges.push_back(std::move(m));
    }
    job.ledger = stored(st.core->ledger());
    job.learner_steps = snaps->learner_steps ? snaps->learner_steps() : 0;
    job.ledger.processed = snaps->tokens ? snaps->tokens() : 0;
    auto done = [shard = caf::actor_cast<caf::actor>(self), p = published.fragment.value, v = published.version,
                 r = published.round.value](const expected<std::uint64_t>& mesh_version) {
      if (mesh_version) caf::anon_send(shard, committed_atom::value, p, v, r);
    };
    if (auto ok = snaps->writer->submit(std::move(job), std::move(done)); !ok) {
      const std::uint64_t n = ++stats->snapshot_errors;
      if (n <= 10 || n % 1000 == 0)
        std::fprintf(stderr, "archipelago shard %u: version %llu of fragment %u not snapshotted: %s\n", st.index,
                     static_cast<unsigned long long>(published.version), published.fragment.value,
                     ok.err().message.c_str());
    }
  };

  return {
      // The broker speaks again after a silence (a restart, or a healed partition):
      // announce this shard again. Other peers' liveness matters to the broker only.
      [self, setup](peer_atom, std::uint8_t kind, std::uint32_t, bool alive) {
        if (alive && kind == static_cast<std::uint8_t>(role::sync_broker)) send_join(self->state, *setup);
      },
      [self, stats](committed_atom, std::uint32_t p, std::uint64_t version, std::uint64_t round) {
        if (p < stats->committed_version.size()) {
          auto& highest = stats->committed_version[p];
          for (std::uint64_t seen = highest.load(); seen < version && !highest.compare_exchange_weak(seen, version);) {
          }
        }
        auto b = self->state.wire->make_envelope(round);
        auto u = b.body().initFragmentUpdate();
        u.setFragment(p);
        u.setVersion(version);
        u.setCommitted(true);
        (void)self->state.wire->send(broker_address, b.finish());
      },
      [self, clock, snaps, inc](metrics_atom, const metrics_page& page) {
        const auto& st = self->state;
        const node_address me{role::parameter_shard, st.index};
        add_node_metrics(*page, me, inc, clock->now() - st.started_ns, st.wire->counters());
        const metric_labels l = role_labels(me);
        for (fragment_index p : st.owned) {
          metric_labels f = l;
          f.emplace_back("fragment", std::to_string(p.value));
          page->gauge("archipelago_fragment_version", "The version of each fragment this node holds.",
                      static_cast<double>(st.core->version(p)), f);
        }
        page->counter("archipelago_shard_published_total", "Fragment versions this incarnation merged and published.",
                      static_cast<double>(st.published), l);
        page->gauge("archipelago_shard_subscribers", "Learners the shard broadcasts new versions to.",
                    static_cast<double>(st.learners.size()), l);
        const shard_ledger& led = st.core->ledger();
        auto bucket = [&](const char* name, std::uint64_t contributions, std::uint64_t tokens) {
          metric_labels b = l;
          b.emplace_back("outcome", name);
          page->counter("archipelago_shard_contributions_total", "Contributions received, by outcome.",
                        static_cast<double>(contributions), b);
          page->counter("archipelago_shard_contribution_tokens_total", "Tokens of the contributions received, by outcome.",
                        static_cast<double>(tokens), b);
        };
        bucket("merged", led.merged, led.merged_tokens);
        bucket("late", led.late, led.late_tokens);
        bucket("rejected", led.rejected, led.rejected_tokens);
        bucket("unmerged", led.unmerged, led.unmerged_tokens);
        if (snaps && snaps->writer) {
          const storage::writer_stats w = snaps->writer->stats();
          page->counter("archipelago_snapshot_commits_total", "Snapshot batches committed to the store.",
                        static_cast<double>(w.commits), l);
          page->counter("archipelago_snapshot_commit_seconds_total", "Time spent committing snapshots (rate over commits: mean latency).",
                        w.commit_seconds_total, l);
          page->gauge("archipelago_snapshot_last_commit_seconds", "The last snapshot commit's latency.", w.last_commit_seconds, l);
          page->counter("archipelago_snapshot_failures_total", "Snapshot jobs that failed or were refused (queue full).",
                        static_cast<double>(w.failed + w.refused), l);
          page->gauge("archipelago_snapshot_queued_bytes", "Snapshot bytes waiting for the writer.",
                      static_cast<double>(w.queued_bytes), l);
        }
        return true;
      },
      [self](values_atom) {
        std::vector<std::uint32_t> fragments;
        std::vector<std::vector<float>> values;
        for (fragment_index p : self->state.owned) {
          fragments.push_back(p.value);
          values.push_back(self->state.core->value(p));
        }
        return caf::make_message(fragments, values);
      },
      // The end of a storage fault (unless a later one superseded it).
      [self, snaps](disk_atom, std::uint64_t generation) {
        if (generation == self->state.disk_generation && snaps && snaps->set_storage_failing)
          snaps->set_storage_failing(false);
      },
      [self, setup, stats, snaps, clock, commit, fragment_message](const inbound_ptr& m) {
        auto& st = self->state;
        const auto& env = *m->envelope;
        const node_address from = env.sender();
        auto body = env.root().getBody();
        if (from.kind == role::sync_broker) broker_seen(st, *setup, env.header().getIncarnation());
        switch (env.body()) {
          case wire::Envelope::Body::CHAOS_COMMAND: {
            auto order = st.chaos.on_command(env, *st.wire, st.wire->config().default_link, clock->now());
            if (!order || !snaps || !snaps->set_storage_failing) break;
            if (order->kind == chaos_order::what::storage_fault) {
              snaps->set_storage_failing(order->duration_ns > 0);
              self->delayed_send(self, std::chrono::nanoseconds(order->duration_ns), disk_atom::value, ++st.disk_generation);
            } else if (order->kind == chaos_order::what::heal) {
              ++st.disk_generation;
              snaps->set_storage_failing(false);
            }
            break;
          }
          case wire::Envelope::Body::CONTRIBUTION: {
            auto c = body.getContribution();
            const fragment_index p{c.getFragment()};
            std::vector<float> delta;
            std::string why;
            contribution_verdict verdict = contribution_verdict::rejected;
            // A round of a broker newer than the one known: that broker restarted.
            const std::uint64_t round_broker = c.getBrokerIncarnation();
            broker_seen(st, *setup, round_broker);
            if (round_broker != 0 && round_broker < st.broker_incarnation) {
              verdict = st.core->on_earlier_broker_round(c.getTokens());  // its round died with its broker
            } else if (env.tensor_count() == 1 && st.core->owns(p) &&
                env.tensor_info(0).getElementCount() == st.core->value(p).size()) {
              delta.resize(env.tensor_info(0).getElementCount());
              if (env.decode_tensor_values(0, delta.data()))
                verdict = st.core->on_contribution(round_number{env.header().getRound()}, p,
                                                   {{from.index}, incarnation{env.header().getIncarnation()}},
                                                   c.getSteps(), c.getTokens(), std::move(delta), &why);
            }
            if (verdict == contribution_verdict::rejected) {
              // Logged with a budget (the first 10, then every 1000th): a bad learner cannot flood stderr.
              const std::uint64_t n = ++stats->rejected;
              if (n <= 10 || n % 1000 == 0)
                std::fprintf(stderr, "archipelago shard %u: rejected round %llu from %s: %s (%llu rejected so far)\n",
                             self->state.index, static_cast<unsigned long long>(env.header().getRound()),
                             from.to_string().c_str(), why.empty() ? "undecodable tensor" : why.c_str(),
                             static_cast<unsigned long long>(n));
            }
            if (verdict == contribution_verdict::duplicate) break;
            // Arrival notice: the broker admits buffered ones to the round; all go to the ledger.
            auto b = st.wire->make_envelope(env.header().getRound());
            auto notice = b.body().initContribution();
            notice.setFragment(p.value);
            notice.setSteps(c.getSteps());
            notice.setTokens(c.getTokens());
            notice.setLearner(from.index);
            notice.setLearnerIncarnation(env.header().getIncarnation());
            notice.setStep(c.getStep());
            notice.setBrokerIncarnation(round_broker);
            notice.setVerdict(verdict == contribution_verdict::buffered ? wire::Verdict::BUFFERED
                              : verdict == contribution_verdict::late   ? wire::Verdict::LATE
                                                                        : wire::Verdict::REJECTED);
            (void)st.wire->send(broker_address, b.finish());
            break;
          }
          case wire::Envelope::Body::ROUND_CLOSE: {
            auto close = body.getRoundClose();
            const round_number r{env.header().getRound()};
            const fragment_index p{close.getFragment()};
            std::vector<learner_ref> members;
            if (close.getQuorumNs() >= 0)
              for (auto mb : close.getMembers()) members.push_back({{mb.getLearner()}, incarnation{mb.getIncarnation()}});
            auto published = st.core->on_round_close(r, p, members);
            if (!published) {
              std::fprintf(stderr, "archipelago shard %u: round %llu not merged: %s\n", st.index,
                           static_cast<unsigned long long>(r.value), published.err().message.c_str());
              break;
            }
            if (!published->has_value()) break;
            ++stats->published;
            ++st.published;
            stats->bytes_sent += st.core->value(p).size() * 4 * st.learners.size();
            (void)st.wire->broadcast(st.learners, fragment_message(p, r.value));
            auto b = st.wire->make_envelope(r.value);
            auto u = b.body().initFragmentUpdate();
            u.setFragment(p.value);
            u.setVersion((*published)->version);
            (void)st.wire->send(broker_address, b.finish());
            if (snaps && snaps->writer) commit(std::move(**published));
            break;
          }
          case wire::Envelope::Body::FETCH_FRAGMENT: {
            auto f = body.getFetchFragment();
            // A restarted learner comes back, maybe at a new endpoint: re-point it. At the
            // same endpoint too (a fixed port, inproc://): the old connection may be dead.
            auto& [endpoint, known_inc] = st.endpoints[from];
            const std::uint64_t inc = env.header().getIncarnation();
            if (endpoint != f.getReplyEndpoint().cStr() || inc > known_inc) {
              if (endpoint.empty()) st.learners.push_back(from);
              endpoint = f.getReplyEndpoint().cStr();
              known_inc = inc;
              (void)st.wire->add_peer(from, endpoint);
            }
            if (st.core->owns({f.getFragment()})) (void)st.wire->send(from, fragment_message({f.getFragment()}, 0));
            break;
          }
          default: break;
        }
      },
  };
}

}  // namespace

caf::actor spawn_shard(caf::actor_system& sys, const mesh_setup& setup, std::uint32_t index,
                       const std::vector<float>& initial_params, mesh_stats& stats, const clock_source& clock,
                       const snapshot_context* snapshots, incarnation inc) {
  return sys.spawn(shard_actor, &setup, index, initial_params, &stats, &clock, snapshots, inc);
}

}  // namespace archipelago
