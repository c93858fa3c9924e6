// archipelago bench compute: the learner engine's throughput (forward + backward
// + AdamW) as tokens/s and GFLOP/s, against baselines measured in the same run:
// a plain Eigen GEMM of the model's largest matrix shape (this machine's
// practical peak) and, with --against-torch, the PyTorch reference of the same
// architecture (tools/bench/torch_reference.py) as installed and tuned.

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "bench_stats.hpp"
#include "cli_common.hpp"
#include "cmd_bench_ablate.hpp"
#include "cmd_bench_snapshot.hpp"
#include "cmd_bench_wan.hpp"
#include "cmd_bench_wire.hpp"
#include "commands.hpp"
#include "core/prng.hpp"
#include "core/adamw.hpp"
#include "learner/model/gpt.hpp"
#include "learner/model/trainer.hpp"


namespace archipelago::cli {
namespace {

struct compute_options {
  std::string model = "nano";
  int threads = 2;
  int batch = 32;
  int steps = 0;   // timed steps; 0 picks by model size
  int warmup = 3;
  bool against_torch = false;
  bool profile = false;
  int rounds = 3;  // with --against-torch
  std::string python = "/usr/bin/python3";
  std::string torch_script = ARCHIPELAGO_SOURCE_DIR "/tools/bench/torch_reference.py";
  bool json = false;
};

/// The number after "key": in a one-line JSON object (enough for our own output).
double json_number(const std::string& line, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  const auto at = line.find(needle);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(line.c_str() + at + needle.size(), nullptr);
}

std::string json_string(const std::string& line, const std::string& key) {
  const std::string needle = "\"" + key + "\": \"";
  auto at = line.find(needle);
  std::size_t skip = needle.size();
  if (at == std::string::npos) {
    at = line.find("\"" + key + "\":\"");
    skip = key.size() + 4;
  }
  if (at == std::string::npos) return "";
  const auto end = line.find('"', at + skip);
  return line.substr(at + skip, end - at - skip);
}

/// One PyTorch configuration, run once per round.
struct torch_config {
  std::string label;
  std::string env;
  std::string args;  // extra script arguments
  std::vector<double> tokens_per_s;  // per round
  std::vector<double> ratio;         // engine / this, per round
  std::string blas;
  std::string error;
};

/// Runs the PyTorch reference once under `env`; its last stdout line is JSON.
void run_torch(torch_config& run, const compute_options& o, int steps) {
  const std::string cmd = "env " + run.env + " " + o.python + " " + o.torch_script + " --model " +
                          o.model + " --threads " + std::to_string(o.threads) + " --batch " +
                          std::to_string(o.batch) + " --steps " + std::to_string(steps) +
                          " --warmup " + std::to_string(o.warmup) + run.args + " --json 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    run.error = "cannot start " + o.python;
    return;
  }
  std::string output, last;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) {
    output += buf.data();
    std::string line(buf.data());
    if (!line.empty() && line.front() == '{') last = line;
  }
  const int rc = pclose(pipe);
  if (rc != 0 || last.empty()) {
    run.error = "PyTorch reference failed (exit " + std::to_string(rc) + "): " +
                output.substr(output.size() > 400 ? output.size() - 400 : 0);
    return;
  }
  run.tokens_per_s.push_back(json_number(last, "tokens_per_s"));
  run.blas = json_string(last, "blas");
}

int run_compute(const compute_options& o) {
  auto shape = model_preset(o.model);
  if (!shape) return report(shape.err());
  if (o.threads < 1) return report(make_error(errc::invalid_input, "--threads must be at least 1"));
  if (o.batch < 1) return report(make_error(errc::invalid_input, "--batch must be at least 1"));
  if (o.against_torch && !std::filesystem::exists(o.torch_script))
    return report(make_error(errc::not_found, "PyTorch reference '" + o.torch_script + "' not found (--torch-script)"));
  const int steps = o.steps > 0 ? o.steps : (o.model == "mini" ? 6 : o.model == "micro" ? 15 : 40);
  set_compute_threads(o.threads);

  const param_layout layout = make_layout(*shape);
  gpt<float> model(layout);
  model.init(1);
  optimizer_config opt;
  adamw optim(layout, opt);
  const int t = shape->context;
  const std::size_t n_tokens = static_cast<std::size_t>(o.batch) * t;
  std::vector<std::int32_t> in(n_tokens), out(n_tokens);
  prng rng(1);
  for (std::size_t i = 0; i < n_tokens; ++i) {
    in[i] = static_cast<std::int32_t>(rng.below(256));
    out[i] = static_cast<std::int32_t>(rng.below(256));
  }
  step_profile profile;
  double optimizer_s = 0;
  auto model_step = [&] {
    const auto t0 = seconds_clock::now();
    model.forward_backward(in.data(), out.data(), o.batch);
    const auto t1 = seconds_clock::now();
    optim.step(model.params(), model.grads(), 1e-3);
    optimizer_s += since(t1);
    return since(t0);
  };

  // The matched GEMM: the model's largest product, [N, C] x [C, 4C].
  using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Index gn = static_cast<Eigen::Index>(n_tokens), gk = shape->d_model, gm = 4 * shape->d_model;
  row_matrix a = row_matrix::Random(gn, gk), b = row_matrix::Random(gk, gm), c(gn, gm);
  const double gemm_flops = 2.0 * gn * gk * gm;
  auto gemm_sample = [&] {
    // Repeat so one sample lasts about as long as a few milliseconds at least.
    const int reps = std::max(1, static_cast<int>(2e8 / gemm_flops));
    const auto t0 = seconds_clock::now();
    for (int r = 0; r < reps; ++r) c.noalias() = a * b;
    return since(t0) / reps;
  };

  progress_line progress;
  for (int i = 0; i < o.warmup; ++i) {
    model_step();
    gemm_sample();
  }
  optimizer_s = 0;
  if (o.profile) model.set_profile(&profile);
  std::vector<double> step_s, gemm_s;
  auto measure = [&](int count) {
    for (int i = 0; i < count; ++i) {
      if (stop_requested.load()) return;
      step_s.push_back(model_step());
      gemm_s.push_back(gemm_sample());
      progress.update("bench compute " + o.model + ": sample " + std::to_string(step_s.size()));
    }
  };
  install_stop_handlers();

  std::vector<torch_config> torch_runs;
  if (o.against_torch) {
    // "as installed" is what `apt-get install python3-torch` gives (the pthread
    // OpenBLAS, core type auto-detected); "tuned" follows MACHINE.md §6 (the
    // OpenMP OpenBLAS with its AVX-512 kernels forced) and keeps freed buffers
    // in the heap (--mallopt), the best tuning found here.
    const std::string blas_dir = "/usr/lib/x86_64-linux-gnu/openblas-";
    const std::string clean_env = "-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_NUM_THREADS";
    torch_runs.resize(2);
    torch_runs[0].label = "tuned";
    torch_runs[0].env = std::filesystem::exists(blas_dir + "openmp")
                            ? clean_env + " LD_LIBRARY_PATH=" + blas_dir + "openmp OPENBLAS_CORETYPE=SkylakeX"
                            : clean_env + " OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1";
    torch_runs[0].args = " --mallopt";  // heap-served buffers, as archipelago's own main does
    torch_runs[1].label = "as_installed";
    torch_runs[1].env = std::filesystem::exists(blas_dir + "pthread")
                            ? clean_env + " LD_LIBRARY_PATH=" + blas_dir + "pthread"
                            : clean_env;
  }
  // Rounds of (ours, then each PyTorch configuration); a ratio is taken within
  // each round and the median ratio reported, so a drift in the load of this
  // shared machine affects both sides of a ratio alike.
  const int rounds = o.against_torch ? o.rounds : 1;
  for (int r = 0; r < rounds && !stop_requested.load(); ++r) {
    const std::size_t first = step_s.size();
    measure(steps);
    progress.finish();
    const double ours = static_cast<double>(n_tokens) /
                        median(std::vector<double>(step_s.begin() + first, step_s.end()));
    for (auto& run : torch_runs) {
      if (!run.error.empty() || stop_requested.load()) continue;
      std::fprintf(stderr, "round %d/%d: PyTorch reference (%s)...\n", r + 1, rounds, run.label.c_str());
      run_torch(run, o, steps);
      if (!run.error.empty()) std::fprintf(stderr, "archipelago: %s\n", run.error.c_str());
      else run.ratio.push_back(ours / run.tokens_per_s.back());
    }
  }
  progress.finish();
  if (step_s.empty()) return report(make_error(errc::internal, "interrupted before any sample"));

  const double step_med = median(step_s), step_best = *std::min_element(step_s.begin(), step_s.end());
  const double gemm_med = median(gemm_s);
  const double flops = model.flops_per_step(o.batch);
  const double tokens_per_s = static_cast<double>(n_tokens) / step_med;
  const double model_gflops = flops / step_med * 1e-9;
  const double gemm_gflops = gemm_flops / gemm_med * 1e-9;
  const double ratio_gemm = model_gflops / gemm_gflops;

  std::printf("bench compute: model %s (%zu parameters), batch %d x %d tokens, %d threads, "
              "-march=%s (Eigen: %s)\n",
              o.model.c_str(), layout.param_count, o.batch, t, o.threads, ARCHIPELAGO_BUILD_MARCH,
              Eigen::SimdInstructionSetsInUse());
  std::printf("  engine   step %.2f ms median (best %.2f) over %zu steps: %.0f tokens/s, %.1f GFLOP/s\n",
              step_med * 1e3, step_best * 1e3, step_s.size(), tokens_per_s, model_gflops);
  std::printf("  GEMM     [%ld x %ld] x [%ld x %ld] %.3f ms median: %.1f GFLOP/s\n",
              static_cast<long>(gn), static_cast<long>(gk), static_cast<long>(gk),
              static_cast<long>(gm), gemm_med * 1e3, gemm_gflops);
  std::printf("  ratio    engine / matched GEMM = %.2f\n", ratio_gemm);
  if (o.profile) {
    double total = 0;
    for (double x : step_s) total += x;
    std::printf("  profile  (share of %.2f ms per step; profiling adds timer reads)\n", total / step_s.size() * 1e3);
    auto row = [&](const char* name, double seconds) {
      std::printf("    %-12s %8.2f ms  %5.1f%%\n", name, seconds / step_s.size() * 1e3, 100 * seconds / total);
    };
    double covered = optimizer_s;
    for (int p = 0; p < step_profile::phase_count; ++p) {
      row(step_profile::name(p), profile.seconds[p]);
      covered += profile.seconds[p];
    }
    row("AdamW", optimizer_s);
    row("other", total - covered);
  }
  double ratio_torch = std::nan(""), ratio_installed = std::nan("");
  for (const auto& run : torch_runs) {
    if (run.ratio.empty()) continue;
    const double ratio = median(run.ratio);
    std::string per_round;
    for (double x : run.ratio) per_round += (per_round.empty() ? "" : " ") + std::to_string(x).substr(0, 4);
    std::printf("  PyTorch  %-12s %.0f tokens/s median of %zu rounds (BLAS %s)\n"
                "           engine / PyTorch = %.2f (per round: %s)\n",
                run.label.c_str(), median(run.tokens_per_s), run.tokens_per_s.size(),
                run.blas.c_str(), ratio, per_round.c_str());
    if (run.label == "tuned") ratio_torch = ratio;
    else ratio_installed = ratio;
  }

  if (o.json) {
    json_line j;
    j.add("command", "bench compute")
        .add("model", o.model)
        .add("params", static_cast<std::int64_t>(layout.param_count))
        .add("threads", o.threads)
        .add("batch", o.batch)
        .add("context", t)
        .add("march", ARCHIPELAGO_BUILD_MARCH)
        .add("simd", Eigen::SimdInstructionSetsInUse())
        .add("steps", static_cast<std::int64_t>(step_s.size()))
        .add("step_ms_median", step_med * 1e3)
        .add("tokens_per_s", tokens_per_s)
        .add("gflops", model_gflops)
        .add("gemm_gflops", gemm_gflops)
        .add("ratio_vs_gemm", ratio_gemm);
    if (o.against_torch) {
      for (const auto& run : torch_runs)
        j.add("torch_" + run.label + "_tokens_per_s", median(run.tokens_per_s));
      j.add("rounds", rounds);
      j.add("ratio_vs_torch", ratio_torch).add("ratio_vs_torch_as_installed", ratio_installed);
    }
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_bench_command(CLI::App& app) {
  auto o = std::make_shared<compute_options>();
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks, each a ratio against a baseline measured in the same run");
  bench->require_subcommand(1);
  add_bench_wire(*bench);
  add_bench_snapshot(*bench);
  add_bench_wan(*bench);
  add_bench_ablate(*bench);
  CLI::App* compute = bench->add_subcommand("compute", "Learner engine throughput vs a matched GEMM (and PyTorch)");
  compute->add_option("--model", o->model, "nano, micro or mini")->required();
  compute->add_option("--threads", o->threads, "Compute threads (default 2)");
  compute->add_option("--batch", o->batch, "Sequences per step (default 32)");
  compute->add_option("--steps", o->steps, "Timed steps (default: 40 nano, 15 micro, 6 mini)");
  compute->add_option("--warmup", o->warmup, "Untimed warm-up steps (default 3)");
  compute->add_flag("--against-torch", o->against_torch, "Also run the PyTorch reference, as installed and tuned");
  compute->add_option("--rounds", o->rounds, "Rounds of (engine, PyTorch) with --against-torch (default 3)")
      ->check(CLI::Range(1, 100));
  compute->add_flag("--profile", o->profile, "Show where a step's time goes, phase by phase");
  compute->add_option("--python", o->python, "Python interpreter with torch (default /usr/bin/python3)");
  compute->add_option("--torch-script", o->torch_script, "Path of torch_reference.py");
  compute->add_flag("--json", o->json, "Print a one-line JSON summary last");
  return [o, compute, bench] {
    if (compute->parsed()) return run_compute(*o);
    if (bench->get_subcommand("snapshot")->parsed()) return run_bench_snapshot();
    if (bench->get_subcommand("wan")->parsed() || bench->get_subcommand("ddp")->parsed()) return run_bench_wan();
    if (bench->get_subcommand("ablate")->parsed()) return run_bench_ablate();
    return run_bench_wire();
  };
}

}  // namespace archipelago::cli
