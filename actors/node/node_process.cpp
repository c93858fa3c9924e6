#include "node/node_process.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "learner/model/trainer.hpp"
#include "node/mesh_snapshots.hpp"
#include "node/metrics_server.hpp"
#include "node/process_roles.hpp"
#include "node/role_handles.hpp"
#include "storage/snapshot_writer.hpp"
#include "transport/actor_bridge.hpp"

namespace archipelago {
namespace {

status check_options(const config& cfg, const sync_policy& policy, const node_options& o) {
  if (o.broker_endpoints.empty()) return make_error(errc::invalid_input, "--broker: the broker's endpoint is required");
  if (cfg.mesh.warm_start > 0 && policy.mode != "dp")
    return make_error(errc::invalid_input, "mesh.warm_start: the synchronous warm start runs on the one-process mesh "
                                           "(run, bench) only, not across nodes");
  if (o.broker_endpoints.size() > max_brokers)
    return make_error(errc::invalid_input, "--broker lists " + std::to_string(o.broker_endpoints.size()) +
                                               " brokers; at most " + std::to_string(max_brokers));
  if (o.standby && o.kind != role::sync_broker) return make_error(errc::invalid_input, "--standby: only a broker is one");
  if (o.kind == role::sync_broker && o.standby && (o.index == 0 || o.index >= o.broker_endpoints.size()))
    return make_error(errc::invalid_input, "--standby --index " + std::to_string(o.index) + ": a standby is broker 1 to " +
                                               std::to_string(o.broker_endpoints.size() - 1) + " of --broker");
  if (o.kind == role::sync_broker && !o.standby && o.index != 0)
    return make_error(errc::invalid_input, "--index " + std::to_string(o.index) + ": the primary broker is broker 0 "
                                           "(a standby takes --standby)");
  if (static_cast<int>(o.shard_endpoints.size()) != policy.shards)
    return make_error(errc::invalid_input, "--shards lists " + std::to_string(o.shard_endpoints.size()) +
                                               " endpoints; the configuration has " + std::to_string(policy.shards) +
                                               " shard(s)");
  if (o.kind == role::parameter_shard && o.index >= o.shard_endpoints.size())
    return make_error(errc::invalid_input, "--index " + std::to_string(o.index) + ": there are only " +
                                               std::to_string(o.shard_endpoints.size()) + " shards");
  if (o.kind == role::learner && o.index >= static_cast<std::uint32_t>(cfg.mesh.learners))
    return make_error(errc::invalid_input, "--index " + std::to_string(o.index) + ": mesh.learners is " +
                                               std::to_string(cfg.mesh.learners));
  if (!o.db.empty() && o.kind == role::learner) return make_error(errc::invalid_input, "--db: learners keep no snapshots");
  if (!o.resume_from.empty() && o.kind == role::parameter_shard && o.db.empty())
    return make_error(errc::invalid_input, "--resume-from: a shard needs --db, the store its fragments are copied into");
  if (o.kind == role::learner && !cfg.model.layout.empty())
    return make_error(errc::invalid_input, "model.layout: a native learner trains only the GPT; a model of your own "
                                           "joins through the Python package (tools/python)");
  return {};
}

/// The node's setup: every process gets the same configuration and endpoints.
mesh_setup node_setup(const config& cfg, const sync_policy& policy, const node_options& o) {
  mesh_setup setup = make_mesh_setup(cfg, policy);
  setup.broker_endpoint = o.broker_endpoints.front();
  setup.standby_endpoints.assign(o.broker_endpoints.begin() + 1, o.broker_endpoints.end());
  setup.shard_endpoints = o.shard_endpoints;
  setup.learner_endpoints.assign(o.index + 1, o.listen.empty() ? "tcp://127.0.0.1:0" : o.listen);
  // The broker and a shard bind --listen, when given, instead of their own entry of
  // --broker / --shards, which stays the address the others dial: behind a DNS name
  // (ZeroMQ binds no names) they listen on tcp://0.0.0.0:PORT.
  if (!o.listen.empty() && o.kind == role::sync_broker)
    (o.index == 0 ? setup.broker_endpoint : setup.standby_endpoints[o.index - 1]) = o.listen;
  if (!o.listen.empty() && o.kind == role::parameter_shard) setup.shard_endpoints[o.index] = o.listen;
  return setup;
}

/// The role's store (--db), opened and recovered. A drill's shard (wire.accept_chaos):
/// its writes can be made to fail (the chaos monkey's storage faults). A broker with
/// standbys and no --db keeps the leader's copy (a standby) and its round lease in
/// memory: a takeover reads them back as a restart would.
expected<std::optional<recovered_store>> open_node_store(const config& cfg, const mesh_setup& setup, const node_options& o,
                                                         logger& log) {
  if (o.db.empty() && o.kind == role::sync_broker && setup.brokers() > 1) {
    auto kept = storage::snapshot_store::create(std::shared_ptr<storage::kv_store>(storage::make_memory_kv()),
                                                store_info_of(setup), retention_of(cfg));
    if (!kept) return kept.err();
    return std::optional<recovered_store>{recovered_store{std::move(*kept), std::nullopt, {}, nullptr, {}}};
  }
  if (o.db.empty()) return std::optional<recovered_store>{};
  auto opened = open_mesh_store(o.db, setup, cfg.wire.accept_chaos && o.kind == role::parameter_shard);
  if (!opened) return opened.err();
  for (const auto& d : opened->dropped)
    log.warn("node.recovery", "archipelago node: recovery of %s: %s", o.db.c_str(), d.c_str());
  return std::optional<recovered_store>{std::move(*opened)};
}

/// The newest snapshot of --resume-from (with `states`: its fragment states, read
/// and verified); a store of another model is refused.
expected<storage::manifest> resume_point(const mesh_setup& setup, const std::string& dir,
                                         std::vector<storage::fragment_state>* states) {
  auto source = open_store_read_only(dir);
  if (!source) return source.err();
  if ((*source)->info().layout_fingerprint != setup.layout.fingerprint())
    return make_error(errc::invalid_input, "--resume-from " + dir + " holds another model (model.* knobs differ)");
  auto m = pick_manifest(**source, std::nullopt, states);
  if (!m) return make_error(m.err().code, "--resume-from " + dir + ": " + m.err().message);
  return m;
}

/// A shard's new store seeded from --resume-from: its fragments' states, as they
/// are there, become its first version (what a restore then starts from). The
/// counts stay 0, as every manifest a node shard writes: it does not know them.
status seed_shard_store(const mesh_setup& setup, const node_options& o, recovered_store& store) {
  std::vector<storage::fragment_state> states;
  auto m = resume_point(setup, o.resume_from, &states);
  if (!m) return m.err();
  std::vector<storage::fragment_state> mine;
  for (auto& f : states)
    if (f.fragment < setup.fragments() && setup.shard_of_fragment[f.fragment] == o.index) mine.push_back(std::move(f));
  storage::commit_job job;
  for (const auto& f : mine) job.fragments.push_back(storage::borrowed_write(f));
  const auto expected_count = static_cast<std::size_t>(
      std::count(setup.shard_of_fragment.begin(), setup.shard_of_fragment.end(), o.index));
  if (job.fragments.size() != expected_count)
    return make_error(errc::invalid_input, "--resume-from " + o.resume_from + ": its snapshot holds " +
                                               std::to_string(job.fragments.size()) + " of shard " +
                                               std::to_string(o.index) + "'s " + std::to_string(expected_count) +
                                               " fragments");
  job.time_ns = wall_clock_ns();
  if (auto v = store.store->commit(job); !v) return make_error(v.err().code, o.db + ": " + v.err().message);
  auto head = store.store->latest_manifest();
  if (!head) return head.err();
  store.head = std::move(*head);
  store.head_states = std::move(mine);
  return {};
}

/// Waits until the role is done (a learner: its steps; its actor ended) or a stop is requested.
/// False: the actor ended on its own (its transport failed to start, or the broker refused it).
bool wait_for_role(caf::scoped_actor& self, const node_options& o, node_address address, const status_board& board,
                   const std::function<void(const std::string&)>& progress, const std::function<bool()>& stop_requested) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    bool ended = false;
    self->receive([&](const caf::down_msg&) { ended = true; }, caf::after(std::chrono::milliseconds(500)) >> [] {});
    if (ended) return false;
    if (stop_requested() || (o.kind == role::learner && board.learners_left() > 0)) return true;
    if (!progress) continue;
    const auto e = board.find(address);
    const node_counters c = e ? e->total() : node_counters{};
    char line[256];
    std::snprintf(line, sizeof line, "%.0fs  %s  steps %llu  rounds %llu  published %llu",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  address.to_string().c_str(), static_cast<unsigned long long>(c.steps),
                  static_cast<unsigned long long>(c.rounds_closed), static_cast<unsigned long long>(c.published));
    progress(line);
  }
}

/// The node's result from its status board once the role is down.
void summarize(node_result& out, const status_board& board) {
  const auto e = board.find(out.address);
  if (!e) return;
  const node_counters c = e->total();
  out.steps = c.steps;
  out.tokens = c.tokens;
  out.budget_overruns = c.budget_overruns;
  out.wait_s = static_cast<double>(c.wait_ns) * 1e-9;
  out.rounds = c.rounds_closed;
  out.published = c.published;
  out.rejected = c.rejected;
  out.committed = c.committed;
  if (e->now.report) out.broker = *e->now.report;
  out.leading = e->now.report.has_value();
  out.status = e->now;
}

}  // namespace

expected<node_result> run_node(const config& cfg, logger& log, const node_options& o,
                               const std::function<void(const std::string&)>& progress,
                               const std::function<bool()>& stop_requested) {
  auto policy = resolve_policy(cfg);
  if (!policy) return policy.err();
  if (auto ok = check_options(cfg, *policy, o); !ok) return ok.err();
  const mesh_setup setup = node_setup(cfg, *policy, o);
  // A restarted process is a new incarnation: wall-clock milliseconds only grow.
  const incarnation inc{static_cast<std::uint64_t>(wall_clock_ns() / 1'000'000)};

  std::optional<dataset> data;
  std::vector<float> initial;
  if (o.kind != role::sync_broker) {
    auto loaded = load_dataset(cfg.data, cfg.mesh.learners, setup.shape.context, cfg.train.seed);
    if (!loaded) return loaded.err();
    data = std::move(*loaded);
    // Every shard derives the same seeded initialisation and keeps its fragments of it.
    if (o.kind == role::parameter_shard) initial = initial_global_params(setup.cfg, setup.shape, *data);
  }
  auto store = open_node_store(cfg, setup, o, log);
  if (!store) return store.err();
  // --resume-from: a shard's new store seeded with its fragments; a learner's schedule
  // step; the broker numbers its rounds after every round that made the snapshot's
  // versions (a shard takes no round older than its fragment's).
  std::int64_t start_step = -1;  // the setup's
  std::optional<storage::manifest> broker_from;
  if (!o.resume_from.empty() && o.kind == role::parameter_shard && !(*store)->head) {
    if (auto ok = seed_shard_store(setup, o, **store); !ok) return ok.err();
    log.info("node.resume", "archipelago node: %s seeded from %s (version %llu)", o.db.c_str(), o.resume_from.c_str(),
             static_cast<unsigned long long>((*store)->head->mesh_version));
  } else if (!o.resume_from.empty() && o.kind != role::parameter_shard) {
    auto m = resume_point(setup, o.resume_from, nullptr);
    if (!m) return m.err();
    start_step = static_cast<std::int64_t>(m->learner_steps);
    broker_from = std::move(*m);
  }

  status_board board;
  steady_clock_source clock;
  node_result out;
  out.address = {o.kind, o.index};
  if (*store && (*store)->head) out.resumed_version = (*store)->head->mesh_version;
  out.inc = inc;
  out.started_unix_s = static_cast<double>(wall_clock_ns()) * 1e-9;
  out.started_steady_ns = clock.now();
  {
    caf::actor_system_config sys_cfg;
    sys_cfg.set("scheduler.max-threads", 2);
    caf::actor_system sys{sys_cfg};
    // After the system, so it is gone first; its actor is gone before it (below).
    std::unique_ptr<storage::snapshot_writer> writer;
    process_roles roles{sys, setup, transport::make_io_context(), clock, log, board, data ? &*data : nullptr, &initial};
    // One shard per process: once it holds its fragments, the whole initial model
    // (4 bytes per parameter of the model, not of the shard) is freed.
    roles.initial_used = [&initial] { std::vector<float>().swap(initial); };
    if (*store) {
      writer = std::make_unique<storage::snapshot_writer>(
          (*store)->store, log, storage::writer_options{static_cast<std::size_t>(cfg.storage.queue_mb) << 20});
      roles.writer = writer.get();
      roles.record_contributions = o.record_contributions;
      roles.restore_store = (*store)->store.get();
      roles.restored = &(*store)->head_states;
      if (auto disk = (*store)->disk)
        roles.set_storage_failing = [disk](bool failing) { disk->set_write_error_rate(failing ? 1 : 0); };
    }
    caf::scoped_actor self{sys};
    // Bound before the role starts, so a port in use stops nothing; serves until the role has ended.
    served_roles served;
    served.board = &board;
    std::unique_ptr<metrics_server> metrics;
    if (o.metrics.port >= 0) {
      auto started_server = metrics_server::start(o.metrics, served.pages(sys, o.kind == role::sync_broker), log);
      if (!started_server) return started_server.err();
      metrics = std::move(*started_server);
    }
    const auto head = *store ? (*store)->head : std::nullopt;
    const auto broker_start = head ? head : broker_from;
    caf::actor actor = o.kind == role::sync_broker       ? roles.broker(inc, broker_start, writer != nullptr, o.index)
                       : o.kind == role::parameter_shard ? roles.shard(o.index, inc, head)
                                                         : roles.learner(o.index, inc, start_step);
    self->monitor(actor);
    served.set({actor}, o.kind == role::sync_broker ? actor : caf::actor{});
    const auto started = std::chrono::steady_clock::now();
    if (!wait_for_role(self, o, out.address, board, progress, stop_requested)) {
      if (const auto e = board.find(out.address); e && !e->now.refusal.empty())
        return make_error(errc::invalid_input, e->now.refusal);
      return make_error(errc::io_error, out.address.to_string() + " could not start (see above)");
    }
    out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (o.kind == role::sync_broker)
      self->request(actor, std::chrono::seconds(10), report_atom::value).receive([](bool) {}, [](caf::error&) {});
    if (o.kind == role::learner) stop_learners(self, {actor}, board);  // a signal: leave after this step
    if (writer) {  // a shard's last versions become durable and the broker hears of them
      (void)writer->drain(std::chrono::seconds(30));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    end_actors(self, {actor}, std::chrono::seconds(10));
    served.set({}, {});
    if (writer) {
      if (auto ok = writer->drain(std::chrono::seconds(60)); !ok)
        log.error("node.drain", "archipelago node: %s", ok.err().message.c_str());
      writer.reset();
      out.mesh_version = (*store)->store->last_mesh_version();
    }
  }
  summarize(out, board);
  return out;
}

}  // namespace archipelago
