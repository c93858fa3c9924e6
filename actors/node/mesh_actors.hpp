#pragma once
// The thin CAF shells of the mesh roles. Each owns its pure state core and a
// node_transport; inbound messages arrive in its mailbox (transport/caf_bridge).

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.hpp"
#include "core/prometheus_text.hpp"
#include "learner/model/trainer.hpp"
#include "node/mesh_setup.hpp"
#include "node/metrics_server.hpp"
#include "storage/snapshot_store.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {
/// A page an actor adds its metrics to (metrics_atom) while the asker waits for its answer.
using metrics_page = std::shared_ptr<prometheus_text>;
}  // namespace archipelago
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(archipelago::metrics_page)

namespace archipelago {
namespace storage {
class snapshot_writer;
}

using tick_atom = caf::atom_constant<caf::atom("tick")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using values_atom = caf::atom_constant<caf::atom("values")>;
using report_atom = caf::atom_constant<caf::atom("report")>;
using wake_atom = caf::atom_constant<caf::atom("wake")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using committed_atom = caf::atom_constant<caf::atom("committed")>;
using pause_atom = caf::atom_constant<caf::atom("pause")>;
using disk_atom = caf::atom_constant<caf::atom("disk")>;
/// (metrics_atom, metrics_page) → true: the actor adds its figures to the page (GET /metrics).
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
/// (status_atom) → std::string: the broker's view of the mesh as one JSON object (GET /status).
using status_atom = caf::atom_constant<caf::atom("status")>;

/// Snapshots for the shards and the broker of this process (storage/).
struct snapshot_context {
  storage::snapshot_writer* writer = nullptr;  // null: no snapshots
  bool record_contributions = false;           // record what every merge merged (replay verify)
  const storage::snapshot_store* restore_store = nullptr;  // shards restore the fragments
  std::optional<storage::manifest> resume_from;            // this manifest of it names
  std::function<std::uint64_t()> learner_steps;  // mean inner steps per learner, for manifests; may be empty
  std::function<std::uint64_t()> tokens;         // tokens the learners processed, for manifests; may be empty
  /// A node broker (`node --role broker --db`): its store is its own, kept across
  /// its restarts. It restores the ledger and the round lease at start and leases
  /// round numbers ahead (a restarted broker numbers after its predecessor's rounds).
  /// Off in `run`, whose store also serves resumed runs with new learners.
  bool broker_recovery = false;
  /// The store's writes fail (true) or work again (false): the chaos monkey's
  /// storage fault, carried out on the disk this process owns. May be empty.
  std::function<void(bool failing)> set_storage_failing;
};

/// Starts the node transport of `self` at `address`, listening on `endpoint`,
/// its inbound messages and peer events delivered to `self`. On failure it reports the error,
/// ends the actor and returns null.
inline std::unique_ptr<transport::node_transport> start_mesh_wire(caf::scheduled_actor* self, const mesh_setup& setup,
                                                                  node_address address, const std::string& endpoint,
                                                                  const clock_source& clock,
                                                                  incarnation inc = incarnation{1}) {
  auto settings = transport::transport_config_from(setup.cfg, address, inc, endpoint);
  if (settings) {
    settings->context = setup.io_context;
    const auto actor = caf::actor_cast<caf::actor>(self);
    auto wire = transport::node_transport::start(*settings, clock, transport::deliver_to(actor),
                                                 transport::deliver_peer_events_to(actor));
    if (wire) return std::move(*wire);
    settings = wire.err();
  }
  std::fprintf(stderr, "archipelago %s: %s\n", address.to_string().c_str(), settings.err().message.c_str());
  self->quit(caf::exit_reason::user_shutdown);
  return nullptr;
}

/// The sync broker (event-based). `setup`, `stats` and `clock` outlive it. It
/// writes its accounting to stats.report every 250 ms and when asked (report_atom → true).
/// With snapshots, it writes each round the shards committed to the tape, and the ledger.
caf::actor spawn_broker(caf::actor_system& sys, const mesh_setup& setup, mesh_stats& stats,
                        const clock_source& clock, const snapshot_context* snapshots = nullptr,
                        incarnation inc = incarnation{1});
/// Parameter shard `index` (event-based); answers values_atom with its fragments' Θ.
/// With snapshots, it resumes its fragments from snapshots->resume_from (or commits
/// the initial ones) and commits every new version off the round's path; the
/// broker hears of a version once it is durable.
caf::actor spawn_shard(caf::actor_system& sys, const mesh_setup& setup, std::uint32_t index,
                       const std::vector<float>& initial_params, mesh_stats& stats, const clock_source& clock,
                       const snapshot_context* snapshots = nullptr, incarnation inc = incarnation{1});
/// Learner `index` (detached: its compute has a thread of its own). It trains
/// `steps` inner steps, then leaves; `data` outlives it. A restarted learner
/// has a higher incarnation; `start_step` (>= 0) starts its learning-rate
/// schedule there instead of at setup.start_step. stop_atom makes it leave
/// after its current step (its last Progress and contributions go out first);
/// pause_atom freezes it for a duration (a one-process SIGSTOP).
caf::actor spawn_learner(caf::actor_system& sys, const mesh_setup& setup, std::uint32_t index,
                         const dataset& data, mesh_stats& stats, const clock_source& clock,
                         incarnation inc = incarnation{1}, std::int64_t start_step = -1);

/// Asks running learners to leave after their current step (stop_atom) and
/// waits, bounded, until all of `learners` are done; then gives their Leave
/// and last Progress a moment to reach the broker.
inline void stop_learners(caf::scoped_actor& self, const std::vector<caf::actor>& learners, mesh_stats& stats) {
  for (const auto& a : learners) self->send(a, stop_atom::value);
  const auto total = static_cast<int>(learners.size());
  for (int waited_ms = 0; stats.learners_done.load() < total && waited_ms < 10'000; waited_ms += 20)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

/// One /metrics page of `actors` (the roles of this process): each is asked in
/// turn and waited for at most `bound` (a learner answers between two steps);
/// one that does not answer in time is left out and counted.
inline std::string scrape_metrics(caf::actor_system& sys, const std::vector<caf::actor>& actors,
                                  std::chrono::milliseconds bound = std::chrono::seconds(3)) {
  auto page = std::make_shared<prometheus_text>();
  int missing = 0;
  caf::scoped_actor self{sys};
  for (const auto& a : actors) {
    if (!a) continue;
    self->request(a, bound, metrics_atom::value, page).receive([](bool) {}, [&](caf::error&) { ++missing; });
  }
  page->gauge("archipelago_scrape_missing_actors", "Actors of this process that did not answer this scrape in time.",
              missing);
  return page->str();
}

/// The broker's /status page; nullopt if it did not answer within `bound`.
inline std::optional<std::string> broker_status(caf::actor_system& sys, const caf::actor& broker,
                                                std::chrono::milliseconds bound = std::chrono::seconds(3)) {
  std::optional<std::string> out;
  if (!broker) return out;
  caf::scoped_actor self{sys};
  self->request(broker, bound, status_atom::value).receive([&](std::string& s) { out = std::move(s); },
                                                            [](caf::error&) {});
  return out;
}

/// The roles of a process that its metrics server asks, filled in once they are
/// spawned (the server is bound before: a port in use stops nothing).
struct served_roles {
  std::mutex mutex;
  std::vector<caf::actor> roles;  // guarded by mutex
  caf::actor broker;              // /status; guarded by mutex; none: 404

  std::vector<caf::actor> all() {
    std::lock_guard lock(mutex);
    return roles;
  }
  caf::actor status_source() {
    std::lock_guard lock(mutex);
    return broker;
  }
  /// The handlers of a metrics_server; `sys` and this outlive it.
  metrics_server::handlers pages(caf::actor_system& sys, bool with_status) {
    metrics_server::handlers h;
    h.metrics = [this, &sys] { return scrape_metrics(sys, all()); };
    if (with_status) h.status = [this, &sys] { return broker_status(sys, status_source()); };
    return h;
  }
};

}  // namespace archipelago
