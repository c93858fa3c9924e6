#include "parameter_shard/shard_actor.hpp"

#include "parameter_shard/shard_snapshots.hpp"
#include "parameter_shard/shard_wire.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/actor_bridge.hpp"
#include "transport/wire_metrics.hpp"

namespace archipelago {
namespace {

using committed_atom = caf::atom_constant<caf::atom("committed")>;
/// (commit_failed_atom, fragment, version): a version's snapshot was refused or failed.
using commit_failed_atom = caf::atom_constant<caf::atom("cmtfailed")>;
using retry_atom = caf::atom_constant<caf::atom("retry")>;
/// A failed commit is tried again this much later (a failing disk is not hammered).
constexpr auto commit_retry = std::chrono::milliseconds(500);
using disk_atom = caf::atom_constant<caf::atom("disk")>;

storage::stored_ledger stored(const shard_ledger& l) {
  return {l.merged_tokens, l.late_tokens, l.rejected_tokens, l.unmerged_tokens, 0};
}

/// A shard's new versions, through the snapshot writer (the actor never waits for it);
/// once one is durable the actor hears of it (committed_atom), or of its failure.
class writer_shard_store final : public shard_store {
 public:
  writer_shard_store(const shard_actor_args& args, caf::actor shard, const bool& failing)
      : args_(args), shard_(std::move(shard)), failing_(failing) {}

  void commit(shard_commit c) override {
    if (failing_) {  // a storage fault on a store this shard shares: its own writes fail
      caf::anon_send(shard_, commit_failed_atom::value, c.published.fragment.value, c.published.version,
                     std::string("storage fault: this shard's writes fail"));
      return;
    }
    storage::commit_job job;
    job.time_ns = wall_clock_ns();
    const published_fragment& p = c.published;
    job.fragments.push_back(stored_write(p.fragment, std::move(c.state), job.time_ns));
    if (!p.merged.empty()) {
      storage::merge_record m{p.fragment.value, p.version, p.round.value, {}};
      for (auto& mc : c.published.merged)
        m.contributions.push_back({mc.from.learner.value, mc.from.inc.value, mc.steps, mc.tokens, std::move(mc.delta)});
      job.merges.push_back(std::move(m));
    }
    job.ledger = stored(c.ledger);
    job.learner_steps = args_.learner_steps ? args_.learner_steps() : 0;
    job.ledger.processed = args_.tokens ? args_.tokens() : 0;
    auto done = [shard = shard_, f = p.fragment.value, v = p.version,
                 r = p.round.value](const expected<std::uint64_t>& mesh_version) {
      if (mesh_version) caf::anon_send(shard, committed_atom::value, f, v, r);
      else caf::anon_send(shard, commit_failed_atom::value, f, v, mesh_version.err().message);
    };
    if (auto ok = args_.writer->submit(std::move(job), std::move(done)); !ok)
      caf::anon_send(shard_, commit_failed_atom::value, p.fragment.value, p.version, ok.err().message);
  }

 private:
  const shard_actor_args& args_;
  caf::actor shard_;
  const bool& failing_;
};

/// The owned fragments' outer states in the manifest to resume from.
expected<std::vector<std::pair<fragment_index, fragment_outer_state>>> read_restored(const shard_actor_args& a) {
  std::vector<std::pair<fragment_index, fragment_outer_state>> out;
  if (!a.restore_store || !a.resume_from || a.resume_from->entries.empty()) return out;
  for (fragment_index p : a.setup->fragments_of(a.index)) {
    const storage::manifest_entry* e = a.resume_from->find(p.value);
    if (!e)
      return make_error(errc::invalid_input, "the snapshot has no fragment " + std::to_string(p.value) +
                                                 ": it was written by another shard or mesh");
    const storage::fragment_state* known = nullptr;
    if (a.restored)
      for (const auto& s : *a.restored)
        if (s.fragment == p.value && s.version == e->version) known = &s;
    if (known) {  // read and verified by the recovery: once is enough
      out.emplace_back(p, outer_state_of(storage::fragment_state(*known)));
      continue;
    }
    auto f = a.restore_store->read_fragment(p.value, e->version);
    if (!f) return f.err();
    out.emplace_back(p, outer_state_of(std::move(*f)));
  }
  return out;
}

struct shard_state {
  shard_actor_args args;
  std::unique_ptr<transport::node_transport> wire;
  std::unique_ptr<writer_shard_store> store;
  std::unique_ptr<shard_wire> shard;
  std::uint64_t snapshot_errors = 0;
  std::uint64_t disk_generation = 0;  // invalidates the end of an earlier storage fault
  bool commits_failing = false;       // a storage fault without a disk of its own (set_storage_failing empty)
  bool retry_armed = false;           // a retry of failed commits is scheduled
  nanos started_ns = 0;
  static inline const char* name = "parameter_shard";

  void publish() {
    if (!args.board) return;
    node_status s = shard->status();
    s.counts.snapshot_errors = snapshot_errors;
    if (wire) count_wire(s.counts, wire->counters());
    args.board->update(s);
  }
};

using shard_self = caf::stateful_actor<shard_state>;

/// Its storage fails its writes, or works again: the disk this process owns, or
/// (sharing a store) this shard's commits alone.
void set_storage_failing(shard_state& st, bool failing) {
  if (st.args.set_storage_failing) st.args.set_storage_failing(failing);
  else st.commits_failing = failing;
}

/// The chaos monkey's storage fault, ended by a timer (or a heal).
void storage_fault(shard_self* self, const chaos_order& order) {
  auto& st = self->state;
  if (order.kind == chaos_order::what::storage_fault) {
    set_storage_failing(st, order.duration_ns > 0);
    self->delayed_send(self, std::chrono::nanoseconds(order.duration_ns), disk_atom::value, ++st.disk_generation);
  } else {
    ++st.disk_generation;
    set_storage_failing(st, false);
  }
}

/// A shard that cannot start its snapshots says why and ends.
caf::behavior fail(shard_self* self, const error& e) {
  self->state.args.logs->error("shard.snapshots", "archipelago shard %u: snapshots: %s", self->state.args.index,
                               e.to_string().c_str());
  self->quit(caf::exit_reason::user_shutdown);
  return {};
}

void add_writer_metrics(prometheus_text& page, node_address me, const storage::writer_stats& w) {
  const metric_labels l = role_labels(me);
  page.counter("archipelago_snapshot_commits_total", "Snapshot batches committed to the store.",
               static_cast<double>(w.commits), l);
  page.counter("archipelago_snapshot_commit_seconds_total", "Time spent committing snapshots (rate over commits: mean latency).",
               w.commit_seconds_total, l);
  page.gauge("archipelago_snapshot_last_commit_seconds", "The last snapshot commit's latency.", w.last_commit_seconds, l);
  page.counter("archipelago_snapshot_failures_total", "Snapshot jobs that failed or were refused (queue full).",
               static_cast<double>(w.failed + w.refused), l);
  page.gauge("archipelago_snapshot_queued_bytes", "Snapshot bytes waiting for the writer.",
             static_cast<double>(w.queued_bytes), l);
}

caf::behavior shard_actor(shard_self* self, shard_actor_args args) {
  auto& st = self->state;
  st.args = std::move(args);
  const shard_actor_args& a = st.args;
  st.started_ns = a.clock->now();
  auto restored = read_restored(a);
  if (!restored) return fail(self, restored.err());
  const node_address me{role::parameter_shard, a.index};
  st.wire = start_actor_wire(self, a.setup->cfg, a.io, me, a.inc, a.setup->shard_endpoints[a.index], *a.clock,
                             *a.logs);
  if (!st.wire) return {};
  if (a.writer)
    st.store = std::make_unique<writer_shard_store>(st.args, caf::actor_cast<caf::actor>(self), st.commits_failing);
  const bool resumed = !restored->empty();
  st.shard = std::make_unique<shard_wire>(*a.setup, a.index, a.inc, *st.wire, *a.logs, st.store.get(),
                                          shard_settings(*a.setup, a.writer && a.record_contributions),
                                          a.initial->data(), std::move(*restored));
  if (a.initial_used) a.initial_used();  // the core holds its own fragments now
  if (a.writer && !resumed) {  // a new store: every owned fragment's initial state is its first snapshot
    storage::commit_job initial = initial_writes(st.shard->core(), st.shard->owned(), wall_clock_ns());
    if (auto ok = a.writer->submit(std::move(initial)); !ok) return fail(self, ok.err());
  }
  st.shard->start();
  st.publish();
  return {
      [self](peer_atom, std::uint8_t kind, std::uint32_t index, bool alive) {
        self->state.shard->on_peer({static_cast<role>(kind), index}, alive);
      },
      [self](const inbound_ptr& m) {
        auto& st = self->state;
        if (auto order = st.shard->on_message(*m->envelope, st.args.clock->now())) storage_fault(self, *order);
        st.publish();
      },
      [self](committed_atom, std::uint32_t p, std::uint64_t version, std::uint64_t round) {
        self->state.shard->on_committed({p}, version, round_number{round});
        self->state.publish();
      },
      [self](commit_failed_atom, std::uint32_t p, std::uint64_t version, const std::string& why) {
        auto& st = self->state;
        ++st.snapshot_errors;  // for /metrics; the logger's rate limit bounds the lines of a failing disk
        st.args.logs->warn("shard.commit_failed", "archipelago shard %u: version %llu of fragment %u not snapshotted "
                           "(%s): it stays invisible and its fragment paused until a retry succeeds", st.args.index,
                           static_cast<unsigned long long>(version), p, why.c_str());
        st.shard->on_commit_failed({p}, version);
        if (!st.retry_armed) {
          st.retry_armed = true;
          self->delayed_send(self, commit_retry, retry_atom::value);
        }
      },
      [self](retry_atom) {
        self->state.retry_armed = false;
        (void)self->state.shard->retry_commits();
      },
      // The end of a storage fault (unless a later one superseded it).
      [self](disk_atom, std::uint64_t generation) {
        auto& st = self->state;
        if (generation == st.disk_generation) set_storage_failing(st, false);
      },
      [self, me](metrics_atom, const metrics_page& page) {
        const auto& st = self->state;
        add_node_metrics(*page, me, st.args.inc, st.args.clock->now() - st.started_ns, st.wire->counters(), st.args.logs);
        st.shard->add_metrics(*page);
        if (st.args.writer) add_writer_metrics(*page, me, st.args.writer->stats());
        return true;
      },
      [self](values_atom) {
        std::vector<std::uint32_t> fragments;
        std::vector<std::vector<float>> values;
        for (fragment_index p : self->state.shard->owned()) {
          fragments.push_back(p.value);
          values.push_back(self->state.shard->core().value(p));  // a copy: the caller's to keep
        }
        return caf::make_message(fragments, values);
      },
  };
}

}  // namespace

caf::actor spawn_shard(caf::actor_system& sys, shard_actor_args args) { return sys.spawn(shard_actor, std::move(args)); }

}  // namespace archipelago
