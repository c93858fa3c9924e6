#include "node/local_mesh.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "learner/learner_core.hpp"
#include "node/mesh_actors.hpp"
#include "sync_broker/broker_core.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {

expected<mesh_summary> run_local_mesh(const config& base, const mesh_progress& progress,
                                      const std::function<bool()>& stop_requested) {
  if (auto ok = validate_mesh(base); !ok) return ok.err();
  if (base.mesh.mode != "decoupled")
    return make_error(errc::unsupported, "mode '" + base.mesh.mode + "' is not built yet (only decoupled runs so far)");
  mesh_setup setup;
  setup.cfg = base;
  const int m = base.mesh.learners, s = base.mesh.shards;
  // Compute threads share the cores: one learner per core at most.
  setup.cfg.train.threads = std::max(1, base.train.threads / m);
  setup.shape = *resolve_model(base.model);
  setup.layout = make_layout(setup.shape);
  setup.plan = *make_fragment_plan(setup.layout, base.mesh.fragments);
  setup.shard_of_fragment =
      round_robin_shards(static_cast<int>(setup.plan.fragments.size()), static_cast<std::uint32_t>(s));
  setup.io_context = transport::make_io_context();
  setup.broker_endpoint = "inproc://broker";
  for (int i = 0; i < s; ++i) setup.shard_endpoints.push_back("inproc://shard-" + std::to_string(i));
  for (int i = 0; i < m; ++i) setup.learner_endpoints.push_back("inproc://learner-" + std::to_string(i));

  auto data = load_dataset(base.data, m, setup.shape.context, base.train.seed);
  if (!data) return data.err();

  // The initial global model: one seeded initialisation, owned by the shards.
  std::vector<float> initial;
  {
    engine init(setup.cfg, setup.shape, *data, 0);
    initial.assign(init.model().params(), init.model().params() + init.model().buffer_size());
  }

  mesh_stats stats;
  steady_clock_source clock;
  mesh_summary out;
  {
    caf::actor_system_config sys_cfg;
    sys_cfg.set("scheduler.max-threads", 2);
    caf::actor_system sys{sys_cfg};
    std::vector<caf::actor> actors;
    for (int i = 0; i < s; ++i)
      actors.push_back(spawn_shard(sys, setup, static_cast<std::uint32_t>(i), initial, stats, clock));
    actors.push_back(spawn_broker(sys, setup, stats, clock));
    for (int i = 0; i < m; ++i) actors.push_back(spawn_learner(sys, setup, static_cast<std::uint32_t>(i), *data, stats, clock));

    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    while (stats.learners_done.load() < m && !stop_requested() &&
           (base.train.time_limit_s <= 0 || elapsed() < base.train.time_limit_s)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (progress) {
        char line[256];
        const double rounds = static_cast<double>(stats.rounds_closed.load());
        std::snprintf(line, sizeof line, "%.0fs  steps %llu  tokens %llu  rounds %llu  published %llu  members/round %.2f  late %llu",
                      elapsed(), static_cast<unsigned long long>(stats.steps.load()),
                      static_cast<unsigned long long>(stats.tokens.load()), static_cast<unsigned long long>(rounds),
                      static_cast<unsigned long long>(stats.published.load()),
                      rounds > 0 ? static_cast<double>(stats.members.load()) / rounds : 0.0,
                      static_cast<unsigned long long>(stats.late.load()));
        progress(line);
      }
    }
    out.wall_s = elapsed();

    // Gather the global model from the shards.
    std::vector<float> theta(setup.layout.total_floats, 0.f);
    learner_core scatterer(setup.layout, setup.plan, {});
    caf::scoped_actor self{sys};
    for (int i = 0; i < s; ++i) {
      self->request(actors[static_cast<std::size_t>(i)], std::chrono::seconds(10), values_atom::value)
          .receive(
              [&](const std::vector<std::uint32_t>& fragments, const std::vector<std::vector<float>>& values) {
                for (std::size_t k = 0; k < fragments.size(); ++k)
                  scatterer.scatter({fragments[k]}, values[k].data(), theta.data());
              },
              [&](caf::error&) {});
    }
    for (auto& a : actors) self->send_exit(a, caf::exit_reason::user_shutdown);
    actors.clear();

    engine evaluator(setup.cfg, setup.shape, *data, 0);
    std::copy(theta.begin(), theta.end(), evaluator.model().params());
    const eval_result r = evaluator.evaluate();
    out.eval_loss = r.loss;
    out.eval_bpb = r.bits_per_byte;
  }
  out.mode = base.mesh.mode;
  out.learners = m;
  out.shards = s;
  out.fragments = static_cast<int>(setup.plan.fragments.size());
  out.steps = stats.steps;
  out.tokens = stats.tokens;
  out.merged_tokens = stats.merged_tokens;
  out.late = stats.late;
  out.rejected = stats.rejected;
  out.rounds = stats.rounds_closed;
  out.published = stats.published;
  out.bytes_on_wire = stats.bytes_sent;
  out.mean_members = out.rounds ? static_cast<double>(stats.members.load()) / static_cast<double>(out.rounds) : 0;
  out.entropy_floor_bpb = data->entropy_floor_bpb;
  return out;
}

}  // namespace archipelago
