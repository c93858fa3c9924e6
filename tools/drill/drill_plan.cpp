#include "drill/drill.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "learner/model/trainer.hpp"

namespace archipelago {
namespace {

namespace fs = std::filesystem;

}  // namespace

config drill_config(const config& base, const fault_plan_spec& plan, double step_time_ms) {
  config cfg = base;
  cfg.wire.accept_chaos = true;
  cfg.mesh.step_time_ms = step_time_ms;
  const double total_s = static_cast<double>(plan.duration_ns + plan.liveness_ns) * 1e-9;
  cfg.train.time_limit_s = total_s;
  // The schedule spans the drill: a paced step never takes less than the budget.
  cfg.train.steps = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(total_s * 1000 / step_time_ms)));
  return cfg;
}

expected<fault_plan_spec> load_drill_plan(const config& cfg, const drill_options& o) {
  auto policy = resolve_policy(cfg);
  if (!policy) return policy.err();
  auto plan = parse_fault_plan(o.plan_text, o.plan_origin, cfg.mesh.learners, policy->shards);
  if (!plan) return plan.err();
  if (!(o.time_scale > 0 && o.time_scale <= 100))
    return make_error(errc::invalid_input, "the time scale must be in (0, 100], not " + std::to_string(o.time_scale));
  auto scale = [&](nanos& t) { t = static_cast<nanos>(static_cast<double>(t) * o.time_scale); };
  scale(plan->duration_ns);
  scale(plan->liveness_ns);
  for (auto& f : plan->schedule) {
    scale(f.at_ns);
    scale(f.for_ns);
  }
  scale(plan->rates.learner_mtbf_ns);
  scale(plan->rates.repair_min_ns);
  scale(plan->rates.repair_max_ns);
  return plan;
}

double calibrate_step_time_ms(const config& cfg) {
  auto shape = resolve_model(cfg.model);
  auto data = shape ? load_dataset(cfg.data, cfg.mesh.learners, shape->context, cfg.train.seed) : shape.err();
  if (!shape || !data) return 100;
  set_compute_threads(1);
  engine e(cfg, *shape, *data, 0);
  e.step();  // warm-up: first-touch of the buffers
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int steps = 5;
  for (int i = 0; i < steps; ++i) e.step();
  const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  // Every learner's step must fit beside the others', the shards' merges, the evaluations and
  // whatever else shares the machine: a third of the CPU stays idle on average.
  return std::ceil(std::max(1.5 * step_ms, 3.0 * step_ms * cfg.mesh.learners / cores));
}

drill_work_area::~drill_work_area() {
  std::error_code ec;
  if (owned && !keep) fs::remove_all(dir, ec);
}

expected<std::unique_ptr<drill_work_area>> drill_work_area::open(const std::string& work_dir) {
  auto area = std::make_unique<drill_work_area>();
  if (work_dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "archipelago-drill-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) return make_error(errc::io_error, "cannot create a temporary directory");
    area->dir = pattern;
    area->owned = true;
  } else {
    area->dir = work_dir;
    std::error_code ec;
    fs::create_directories(area->dir, ec);
    if (ec) return make_error(errc::io_error, "cannot create " + area->dir.string() + ": " + ec.message());
  }
  return area;
}

expected<fs::path> drill_work_area::fresh(const std::string& name) const {
  std::error_code ec;
  const fs::path p = dir / name;
  fs::remove_all(p, ec);
  if (ec) return make_error(errc::io_error, "cannot clear " + p.string() + ": " + ec.message());
  return p;
}

expected<prepared_drill> prepare_drill(const config& base, const drill_options& o) {
  auto plan = load_drill_plan(base, o);
  if (!plan) return plan.err();
  auto policy = resolve_policy(base);
  if (!policy) return policy.err();
  const double step_ms = base.mesh.step_time_ms > 0 ? base.mesh.step_time_ms : calibrate_step_time_ms(base);
  config cfg = drill_config(base, *plan, step_ms);
  if (auto ok = validate_mesh(cfg); !ok) return ok.err();
  auto reference_base = with_reference_mode(base, o.reference_mode);
  if (!reference_base) return reference_base.err();
  auto reference_policy = resolve_policy(*reference_base);
  if (!reference_policy) return make_error(reference_policy.err().code, "the reference mode: " + reference_policy.err().message);
  config reference_cfg = drill_config(*reference_base, *plan, step_ms);
  // The reference stops at the drill's tokens; three times the drill's time lets a
  // mode slower per token (dp waits for every learner at every step) get there too.
  reference_cfg.train.time_limit_s *= 3;
  auto area = drill_work_area::open(o.work_dir);
  if (!area) return area.err();
  prepared_drill d{std::move(*plan), *policy, cfg, *reference_policy, reference_cfg, make_mesh_setup(cfg, *policy),
                   std::move(*area), {}};
  drill_report& r = d.report;
  r.plan = o.plan_origin;
  r.mode = cfg.mesh.mode;
  r.reference_mode = reference_cfg.mesh.mode;
  r.seed = d.plan.seed;
  r.standbys = d.plan.standbys;
  r.min_participation = d.plan.min_participation;
  r.learners = cfg.mesh.learners;
  r.shards = d.policy.shards;
  r.quorum = d.policy.wait_for_all ? cfg.mesh.learners : d.policy.quorum;
  r.safety_s = static_cast<double>(d.plan.duration_ns) * 1e-9;
  r.liveness_s = static_cast<double>(d.plan.liveness_ns) * 1e-9;
  r.step_time_ms = step_ms;
  r.processes = !o.binary.empty();
  return d;
}

mesh_progress phase_progress(const mesh_progress& progress, std::string name) {
  return [&progress, name = std::move(name)](const std::string& line) {
    if (progress) progress(name + ": " + line);
  };
}

expected<config> with_reference_mode(const config& base, const std::string& mode) {
  config out = base;
  if (mode.empty()) return out;
  if (auto ok = set_knob(out, "mesh.mode", mode); !ok)
    return make_error(ok.err().code, "the reference mode: " + ok.err().message);
  if (auto ok = validate_mesh(out); !ok) return make_error(ok.err().code, "the reference mode " + mode + ": " + ok.err().message);
  return out;
}

std::string reference_phase(const drill_report& r) {
  return r.reference_mode == r.mode ? "reference (no faults)" : "reference (" + r.reference_mode + ", no faults)";
}

}  // namespace archipelago
