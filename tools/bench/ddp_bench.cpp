#include "bench/ddp_bench.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench/bench_mesh.hpp"
#include "bench/reference_script.hpp"

namespace archipelago {
namespace {

/// Runs the DDP reference once; its last stdout line is JSON.
expected<nlohmann::json> run_ddp_reference(const ddp_options& o) {
  // docs/design/baselines.md §1: one OpenBLAS thread per rank, its AVX-512 kernels forced.
  const std::string cmd = "env -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=SkylakeX " + o.python +
                          " " + o.script + " --model " + o.model + " --ranks " + std::to_string(o.ranks) +
                          " --threads 1 --batch " + std::to_string(o.batch) + " --steps " + std::to_string(o.steps) +
                          " --warmup " + std::to_string(o.warmup) + " --mallopt --json";
  auto last = last_json_line(cmd, o.python, "the DDP reference", 600);
  if (!last) return last.err();
  try {
    return nlohmann::json::parse(*last);
  } catch (const std::exception& e) {
    return make_error(errc::internal, std::string("the DDP reference printed bad JSON: ") + e.what());
  }
}

/// Our dp once: its step time in ms after the warm-up, and its bytes per step.
status run_ours(ddp_result& r, const config& cfg, const ddp_options& o, const std::string& round,
                const bench_hooks& hooks) {
  const std::string label = round + ": archipelago dp";
  hooks.begin("bench: " + label);
  auto s = run_bench_mesh(cfg, hooks, label, 100, mesh_eval{1e9, 0});
  if (!s) return s.err();
  const double ms = seconds_per_round(*s, static_cast<std::uint64_t>(o.warmup)) * 1e3;
  if (std::isnan(ms)) return make_error(errc::internal, "our dp closed too few rounds to time");
  r.ours_ms.push_back(ms);
  r.ours_bytes.push_back(static_cast<double>(s->bytes_on_wire) /
                         static_cast<double>(std::max<std::uint64_t>(1, s->rounds)));
  return {};
}

/// DDP once: its mean wall-clock step in ms, its median step and its bytes.
status run_theirs(ddp_result& r, const ddp_options& o, const std::string& round, const bench_hooks& hooks) {
  hooks.begin("bench ddp: " + round + ": PyTorch DDP (gloo)");
  auto j = run_ddp_reference(o);
  if (!j) return j.err();
  if (hooks.stopped()) return interrupted();
  try {
    r.torch_ms.push_back((*j)["step_ms_mean_wall"].get<double>());
    r.torch_median_ms.push_back((*j)["step_ms_median"].get<double>());
    const auto& sent = (*j)["bytes_sent_per_step"];
    r.torch_bytes.push_back(sent.is_number() ? sent.get<double>() : std::nan(""));
    r.torch_ring = (*j)["ring_bytes_per_step_per_rank"].get<double>() * o.ranks;
    r.blas = (*j)["blas"].get<std::string>();
  } catch (const std::exception& e) {
    return make_error(errc::internal, std::string("the DDP reference's JSON lacks a figure: ") + e.what());
  }
  return {};
}

}  // namespace

config ddp_mesh_config(const ddp_options& o) {
  config cfg;
  cfg.model.size = o.model;
  cfg.mesh.mode = "dp";
  cfg.mesh.learners = o.ranks;
  cfg.train.threads = o.ranks;  // one compute thread per learner, as one per rank
  cfg.data.batch = o.batch;
  cfg.train.steps = o.warmup + o.steps;
  cfg.data.eval_tokens = 4096;  // only the final evaluation, after the timing
  return cfg;
}

expected<ddp_result> run_ddp_bench(const ddp_options& o, const bench_hooks& hooks) {
  if (o.ranks < 1 || o.batch < 1 || o.steps < 10 || o.warmup < 1 || o.rounds < 1)
    return make_error(errc::invalid_input,
                      "--ranks, --batch and --rounds must be at least 1, --steps at least 10, --warmup at least 1");
  if (!std::filesystem::exists(o.script))
    return make_error(errc::not_found, "DDP reference '" + o.script + "' not found (--script)");
  if (auto ok = require_openblas(o.blas_library, "the DDP reference"); !ok) return ok.err();
  const config cfg = ddp_mesh_config(o);
  if (auto ok = validate_mesh(cfg); !ok) return ok.err();
  ddp_result r;
  for (int n = 0; n < o.rounds; ++n) {
    const std::string round = "round " + std::to_string(n + 1) + "/" + std::to_string(o.rounds);
    // The order alternates, so a drift in this shared machine's load favours neither side.
    for (int k = 0; k < 2; ++k) {
      const bool ours = (k == 0) == (n % 2 == 0);
      if (auto ok = ours ? run_ours(r, cfg, o, round, hooks) : run_theirs(r, o, round, hooks); !ok) return ok.err();
    }
    r.ratio.push_back(r.ours_ms.back() / r.torch_ms.back());
  }
  return r;
}

}  // namespace archipelago
