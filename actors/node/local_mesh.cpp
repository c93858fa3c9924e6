#include "node/local_mesh.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "learner/learner_core.hpp"
#include "node/mesh_actors.hpp"
#include "transport/caf_bridge.hpp"

namespace archipelago {
namespace {

/// The global model Θ, gathered from the shards (values_atom).
std::vector<float> gather_global(caf::scoped_actor& self, const std::vector<caf::actor>& shards,
                                 const mesh_setup& setup) {
  std::vector<float> theta(setup.layout.total_floats, 0.f);
  learner_core scatterer(setup.layout, setup.plan, {});
  for (const auto& shard : shards) {
    self->request(shard, std::chrono::seconds(10), values_atom::value)
        .receive(
            [&](const std::vector<std::uint32_t>& fragments, const std::vector<std::vector<float>>& values) {
              for (std::size_t k = 0; k < fragments.size(); ++k)
                scatterer.scatter({fragments[k]}, values[k].data(), theta.data());
            },
            [&](caf::error&) {});
  }
  return theta;
}

}  // namespace

expected<mesh_summary> run_local_mesh(const config& base, const mesh_progress& progress,
                                      const std::function<bool()>& stop_requested) {
  auto policy = resolve_policy(base);
  if (!policy) return policy.err();
  mesh_setup setup = make_mesh_setup(base, *policy);
  const int m = base.mesh.learners, s = policy->shards;
  setup.broker_endpoint = "inproc://broker";
  for (int i = 0; i < s; ++i) setup.shard_endpoints.push_back("inproc://shard-" + std::to_string(i));
  for (int i = 0; i < m; ++i) setup.learner_endpoints.push_back("inproc://learner-" + std::to_string(i));

  auto data = load_dataset(base.data, m, setup.shape.context, base.train.seed);
  if (!data) return data.err();

  const std::vector<float> initial = initial_global_params(setup, *data);
  // Evaluations of Θ run on this thread, with one compute thread.
  engine evaluator(setup.cfg, setup.shape, *data, 0);
  set_compute_threads(1);
  auto evaluate = [&](const std::vector<float>& theta) {
    std::copy(theta.begin(), theta.end(), evaluator.model().params());
    return evaluator.evaluate();
  };

  mesh_stats stats;
  steady_clock_source clock;
  mesh_summary out;
  nanos stopped_ns = 0;
  bool all_done = false;
  {
    caf::actor_system_config sys_cfg;
    sys_cfg.set("scheduler.max-threads", 2);
    caf::actor_system sys{sys_cfg};
    std::vector<caf::actor> shards, actors;
    for (int i = 0; i < s; ++i)
      shards.push_back(spawn_shard(sys, setup, static_cast<std::uint32_t>(i), initial, stats, clock));
    caf::actor broker = spawn_broker(sys, setup, stats, clock);
    for (int i = 0; i < m; ++i) actors.push_back(spawn_learner(sys, setup, static_cast<std::uint32_t>(i), *data, stats, clock));
    caf::scoped_actor self{sys};

    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    double last_eval_s = 0, last_loss = std::nan("");
    constexpr double eval_period_s = 20;
    while (stats.learners_done.load() < m && !stop_requested() &&
           (base.train.time_limit_s <= 0 || elapsed() < base.train.time_limit_s)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (elapsed() - last_eval_s >= eval_period_s) {
        last_eval_s = elapsed();
        const std::uint64_t tokens = stats.tokens.load();
        last_loss = evaluate(gather_global(self, shards, setup)).loss;
        out.eval_curve.emplace_back(tokens, last_loss);
      }
      if (progress) {
        broker_report r;
        {
          std::lock_guard lock(stats.report_mutex);
          r = stats.report;
        }
        const double rounds = static_cast<double>(stats.rounds_closed.load());
        const double span_s = r.first_join_ns < 0 ? 0 : static_cast<double>(clock.now() - r.first_join_ns) * 1e-9;
        char eval[32] = "-";  // until the first evaluation, every 20 s
        if (!std::isnan(last_loss)) std::snprintf(eval, sizeof eval, "%.3f", last_loss);
        char line[320];
        std::snprintf(line, sizeof line,
                      "%.0fs  round %.0f  version %llu  tokens %llu  eval %s  goodput %.1f%%  uptime %.1f%%  "
                      "members %.2f  quorum %.0fms  grace %.0fms  late %llu",
                      elapsed(), rounds, static_cast<unsigned long long>(stats.published.load()),
                      static_cast<unsigned long long>(stats.tokens.load()), eval,
                      span_s > 0 ? 100 * r.ledger.merged_step_time_s / (m * span_s) : 0.0, 100 * r.uptime,
                      rounds > 0 ? static_cast<double>(stats.members.load()) / rounds : 0.0, r.xi_quorum_ms,
                      r.last_grace_ms, static_cast<unsigned long long>(r.ledger.late));
        progress(line);
      }
    }
    out.wall_s = elapsed();
    stopped_ns = clock.now();
    all_done = stats.learners_done.load() == m;

    // Learners still running (a stop or time limit) leave after their current
    // step, so the broker's last report covers every step they took.
    stop_learners(self, actors, stats);
    for (auto& a : actors) self->send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& a : actors) {
      self->monitor(a);
      self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(30)) >> [] {});
    }
    self->request(broker, std::chrono::seconds(10), report_atom::value).receive([](bool) {}, [](caf::error&) {});
    const std::vector<float> theta = gather_global(self, shards, setup);
    self->send_exit(broker, caf::exit_reason::user_shutdown);
    for (auto& a : shards) self->send_exit(a, caf::exit_reason::user_shutdown);
    actors.clear();
    shards.clear();

    const eval_result r = evaluate(theta);
    out.global_params = theta;
    out.eval_loss = r.loss;
    out.eval_bpb = r.bits_per_byte;
    out.eval_curve.emplace_back(stats.tokens.load(), r.loss);
  }
  {
    std::lock_guard lock(stats.report_mutex);
    out.broker = stats.report;
  }
  out.mode = base.mesh.mode;
  out.learners = m;
  out.shards = s;
  out.fragments = static_cast<int>(setup.plan.fragments.size());
  out.steps = stats.steps;
  out.tokens = stats.tokens;
  out.rounds = stats.rounds_closed;
  out.published = stats.published;
  out.bytes_on_wire = stats.bytes_sent;
  out.refetches = stats.refetches;
  out.mean_members = out.rounds ? static_cast<double>(stats.members.load()) / static_cast<double>(out.rounds) : 0;
  out.entropy_floor_bpb = data->entropy_floor_bpb;
  const ledger_totals& l = out.broker.ledger;
  // The learners' span: from the first Join to the last Leave, or to the stop
  // when a time limit or a signal ended the run.
  const nanos end_ns = all_done && out.broker.last_leave_ns > 0 ? out.broker.last_leave_ns : stopped_ns;
  const double span_s = out.broker.first_join_ns >= 0 && end_ns > out.broker.first_join_ns
                            ? static_cast<double>(end_ns - out.broker.first_join_ns) * 1e-9
                            : out.wall_s;
  out.goodput = l.merged_step_time_s / (m * span_s);
  out.wait_share = static_cast<double>(stats.wait_ns.load()) * 1e-9 / (m * span_s);
  out.ledger_exact = l.balanced() && l.processed == out.tokens;
  return out;
}

}  // namespace archipelago
