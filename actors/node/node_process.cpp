#include "node/node_process.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

#include "node/mesh_actors.hpp"
#include "node/mesh_snapshots.hpp"
#include "node/metrics_server.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {

expected<node_result> run_node(const config& cfg, const node_options& o,
                               const std::function<void(const std::string&)>& progress,
                               const std::function<bool()>& stop_requested) {
  auto policy = resolve_policy(cfg);
  if (!policy) return policy.err();
  if (o.broker_endpoint.empty()) return make_error(errc::invalid_input, "--broker: the broker's endpoint is required");
  if (static_cast<int>(o.shard_endpoints.size()) != policy->shards)
    return make_error(errc::invalid_input, "--shards lists " + std::to_string(o.shard_endpoints.size()) +
                                               " endpoints; the configuration has " +
                                               std::to_string(policy->shards) + " shard(s)");
  if (o.kind == role::parameter_shard && o.index >= o.shard_endpoints.size())
    return make_error(errc::invalid_input, "--index " + std::to_string(o.index) + ": there are only " +
                                               std::to_string(o.shard_endpoints.size()) + " shards");
  if (o.kind == role::learner && o.index >= static_cast<std::uint32_t>(cfg.mesh.learners))
    return make_error(errc::invalid_input, "--index " + std::to_string(o.index) + ": mesh.learners is " +
                                               std::to_string(cfg.mesh.learners));

  mesh_setup setup = make_mesh_setup(cfg, *policy);
  setup.broker_endpoint = o.broker_endpoint;
  setup.shard_endpoints = o.shard_endpoints;
  setup.learner_endpoints.assign(o.index + 1, o.listen.empty() ? "tcp://127.0.0.1:0" : o.listen);
  // The broker and a shard bind --listen, when given, instead of their own entry of
  // --broker / --shards, which stays the address the others dial: behind a DNS name
  // (ZeroMQ binds no names) they listen on tcp://0.0.0.0:PORT.
  if (!o.listen.empty() && o.kind == role::sync_broker) setup.broker_endpoint = o.listen;
  if (!o.listen.empty() && o.kind == role::parameter_shard) setup.shard_endpoints[o.index] = o.listen;

  // A restarted process is a new incarnation: wall-clock milliseconds only grow.
  const incarnation inc{static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count())};

  std::optional<dataset> data;
  if (o.kind != role::sync_broker) {
    auto loaded = load_dataset(cfg.data, cfg.mesh.learners, setup.shape.context, cfg.train.seed);
    if (!loaded) return loaded.err();
    data = std::move(*loaded);
  }

  std::optional<recovered_store> store;
  if (!o.db.empty()) {
    if (o.kind == role::learner) return make_error(errc::invalid_input, "--db: learners keep no snapshots");
    // A drill's shard (wire.accept_chaos): its writes can be made to fail (the chaos monkey's storage faults).
    auto opened = open_mesh_store(o.db, setup, cfg.wire.accept_chaos && o.kind == role::parameter_shard);
    if (!opened) return opened.err();
    for (const auto& d : opened->dropped) std::fprintf(stderr, "archipelago node: recovery of %s: %s\n", o.db.c_str(), d.c_str());
    store = std::move(*opened);
  }

  mesh_stats stats;
  steady_clock_source clock;
  node_result out;
  if (store && store->head) out.resumed_version = store->head->mesh_version;
  out.inc = inc;
  out.started_unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    caf::actor_system_config sys_cfg;
    sys_cfg.set("scheduler.max-threads", 2);
    caf::actor_system sys{sys_cfg};
    // After the system, so it is gone first; its actor is gone before it (below).
    std::unique_ptr<storage::snapshot_writer> writer;
    snapshot_context snaps;
    if (store) {
      writer = std::make_unique<storage::snapshot_writer>(
          store->store, storage::writer_options{static_cast<std::size_t>(cfg.storage.queue_mb) << 20});
      snaps.writer = writer.get();
      snaps.record_contributions = o.record_contributions;
      snaps.restore_store = store->store.get();
      snaps.resume_from = store->head;
      snaps.broker_recovery = o.kind == role::sync_broker;
      if (store->disk)
        snaps.set_storage_failing = [disk = store->disk](bool failing) { disk->set_write_error_rate(failing ? 1 : 0); };
    }
    caf::scoped_actor self{sys};
    // Bound before the role starts, so a port in use stops nothing; serves until the role has ended.
    served_roles served;
    std::unique_ptr<metrics_server> metrics;
    if (o.metrics.port >= 0) {
      auto started = metrics_server::start(o.metrics, served.pages(sys, o.kind == role::sync_broker));
      if (!started) return started.err();
      metrics = std::move(*started);
    }
    caf::actor actor;
    switch (o.kind) {
      case role::sync_broker:
        out.address = broker_address;
        actor = spawn_broker(sys, setup, stats, clock, store ? &snaps : nullptr, inc);
        break;
      case role::parameter_shard: {
        out.address = {role::parameter_shard, o.index};
        // Every shard derives the same seeded initialisation and keeps its fragments of it.
        actor = spawn_shard(sys, setup, o.index, initial_global_params(setup, *data), stats, clock,
                            store ? &snaps : nullptr, inc);
        break;
      }
      default:
        out.address = {role::learner, o.index};
        actor = spawn_learner(sys, setup, o.index, *data, stats, clock, inc);
        break;
    }
    self->monitor(actor);
    {
      std::lock_guard lock(served.mutex);
      served.roles = {actor};
      if (o.kind == role::sync_broker) served.broker = actor;
    }
    bool ended = false;  // the actor quit on its own (its transport failed to start)
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    while (!ended && !stop_requested() && !(o.kind == role::learner && stats.learners_done.load() > 0)) {
      self->receive([&](const caf::down_msg&) { ended = true; },
                    caf::after(std::chrono::milliseconds(500)) >> [] {});
      if (progress) {
        char line[256];
        std::snprintf(line, sizeof line, "%.0fs  %s  steps %llu  rounds %llu  published %llu", elapsed(),
                      out.address.to_string().c_str(), static_cast<unsigned long long>(stats.steps.load()),
                      static_cast<unsigned long long>(stats.rounds_closed.load()),
                      static_cast<unsigned long long>(stats.published.load()));
        progress(line);
      }
    }
    if (ended) {
      std::lock_guard lock(stats.report_mutex);
      if (!stats.refusal.empty()) return make_error(errc::invalid_input, stats.refusal);
      return make_error(errc::io_error, out.address.to_string() + " could not start (see above)");
    }
    out.wall_s = elapsed();
    if (o.kind == role::sync_broker)
      self->request(actor, std::chrono::seconds(10), report_atom::value).receive([](bool) {}, [](caf::error&) {});
    if (o.kind == role::learner) stop_learners(self, {actor}, stats);  // a signal: leave after this step
    if (writer) {  // a shard's last versions become durable and the broker hears of them
      (void)writer->drain(std::chrono::seconds(30));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    self->send_exit(actor, caf::exit_reason::user_shutdown);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(10)) >> [] {});
    if (writer) {
      if (auto ok = writer->drain(std::chrono::seconds(60)); !ok)
        std::fprintf(stderr, "archipelago node: %s\n", ok.err().message.c_str());
      writer.reset();
      out.mesh_version = store->store->last_mesh_version();
    }
  }
  out.steps = stats.steps;
  out.tokens = stats.tokens;
  out.budget_overruns = stats.budget_overruns;
  out.wait_s = static_cast<double>(stats.wait_ns.load()) * 1e-9;
  out.rounds = stats.rounds_closed;
  out.published = stats.published;
  out.rejected = stats.rejected;
  out.committed = stats.committed;
  std::lock_guard lock(stats.report_mutex);
  out.broker = stats.report;
  return out;
}

}  // namespace archipelago
