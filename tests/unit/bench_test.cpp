// The bench library (tools/bench): its statistics, the reference scripts' JSON,
// the ablations' variants and their comparison by seed, the WAN race's
// arithmetic; and four tiny real measurements — the nano engine against its
// matched GEMM, the transport's round trip and throughput over inproc:// against
// raw ZeroMQ, snapshot commits and a restore against plain RocksDB, a round's
// kernels per GB (simulate wan --measure).

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "../test_log.hpp"
#include "bench/ablate_bench.hpp"
#include "bench/bench_mesh.hpp"
#include "bench/bench_stats.hpp"
#include "bench/compute_bench.hpp"
#include "bench/ddp_bench.hpp"
#include "bench/kernel_costs.hpp"
#include "bench/parity_bench.hpp"
#include "bench/reference_script.hpp"
#include "bench/snapshot_bench.hpp"
#include "bench/wan_bench.hpp"
#include "bench/wire_instruments.hpp"
#include "core/layout.hpp"
#include "learner/model/trainer.hpp"
#include "temp_dir.hpp"

using namespace archipelago;

namespace {

bool finite_positive(double x) { return std::isfinite(x) && x > 0; }

std::size_t nano_params() { return make_layout(*model_preset("nano")).param_count; }

ablate_options ablation(const std::string& which) {
  ablate_options o;
  o.which = which;
  return o;
}

const ablate_variant& named(const ablate_plan& plan, const std::string& name) {
  for (const auto& v : plan.variants)
    if (v.name == name) return v;
  FAIL("no variant " << name);
  return plan.variants.front();
}

/// One outcome per variant of `plan`, with these losses per seed (in variant order).
std::vector<ablate_outcome> outcomes_with(const std::vector<std::vector<double>>& losses) {
  std::vector<ablate_outcome> out(losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) out[i].loss = losses[i];
  return out;
}

}  // namespace

// ---- statistics and formatting ------------------------------------------------------

TEST_CASE("bench: median, percentile, mean and spread") {
  CHECK(std::isnan(median({})));
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 3, 2}) == 2.5);
  CHECK(percentile({1, 2, 3, 4}, 0.5) == doctest::Approx(2.5));
  CHECK(percentile({30, 10, 20}, 0.25) == doctest::Approx(15));  // numpy: between the 1st and 2nd order statistic
  CHECK(percentile({5, 9, 7}, 0) == 5);
  CHECK(percentile({5, 9, 7}, 1) == 9);
  std::vector<double> hundred;
  for (int i = 100; i >= 0; --i) hundred.push_back(i);
  CHECK(percentile(hundred, 0.99) == doctest::Approx(99));
  CHECK(std::isnan(percentile({}, 0.5)));
  CHECK(mean({1, 2, 3, 6}) == 3);
  CHECK(std::isnan(mean({})));
  CHECK(spread({1, 5, 3}) == 2);
  CHECK(spread({7}) == 0);
}

TEST_CASE("bench: figures as text and as JSON") {
  CHECK(listed({1.5, 2.25}, "%.2f") == "1.50 2.25");
  CHECK(listed({}, "%.2f").empty());
  CHECK(json_array({1.5, std::nan(""), -2}) == "[1.5,null,-2]");
  CHECK(json_array({}) == "[]");
  CHECK(fmt("%.1f x", 2.25) == "2.2 x");
  CHECK(human_bytes(999) == "999 B");
  CHECK(human_bytes(1500) == "1.5 kB");
  CHECK(human_bytes(2.5e6) == "2.5 MB");
  CHECK(human_bytes(2.5e9) == "2.50 GB");
}

// ---- the reference scripts' output -----------------------------------------------------

TEST_CASE("bench: numbers and strings from a reference's JSON line") {
  const std::string spaced = R"({"model": "nano", "tokens_per_s": 12345.5, "blas": "OpenBLAS 0.3.21", "n": -2e3})";
  CHECK(json_number(spaced, "tokens_per_s") == 12345.5);
  CHECK(json_number(spaced, "n") == -2000);
  CHECK(json_string(spaced, "blas") == "OpenBLAS 0.3.21");
  CHECK(json_string(spaced, "model") == "nano");
  const std::string compact = R"({"blas":"mkl","tokens_per_s":7})";
  CHECK(json_string(compact, "blas") == "mkl");
  CHECK(json_number(compact, "tokens_per_s") == 7);
  CHECK(std::isnan(json_number(compact, "missing")));
  CHECK(json_string(compact, "missing").empty());
}

TEST_CASE("bench: a reference script's last JSON line, or its failure with the output's tail") {
  auto two = last_json_line(R"(printf 'noise\n{"a": 1}\nmore\n{"b": 2}\n')", "printf", "the test script", 100);
  REQUIRE(two);
  CHECK(json_number(*two, "b") == 2);
  CHECK(std::isnan(json_number(*two, "a")));

  // A line longer than one read of the pipe is still one line.
  auto long_line = last_json_line(R"(printf '{"k": 7, "pad": "'; head -c 10000 /dev/zero | tr '\0' x; printf '"}\n')",
                                  "printf", "the test script", 100);
  REQUIRE(long_line);
  CHECK(long_line->size() > 10000);
  CHECK(json_number(*long_line, "k") == 7);

  auto failed = last_json_line("echo oops-before-the-end; exit 3", "sh", "the test script", 100);
  REQUIRE_FALSE(failed);
  CHECK(failed.err().message.find("the test script failed (exit") == 0);
  CHECK(failed.err().message.find("oops-before-the-end") != std::string::npos);

  auto tail = last_json_line("echo 0123456789abcdef; exit 1", "sh", "x", 6);
  REQUIRE_FALSE(tail);
  CHECK(tail.err().message.ends_with("bcdef\n"));
  CHECK(tail.err().message.find("0123") == std::string::npos);

  CHECK_FALSE(last_json_line("echo no json here", "sh", "x", 100));
}

// ---- ablations: variants, comparisons, claims ------------------------------------------

TEST_CASE("bench ablate: loss_at interpolates along a curve and is NaN outside it") {
  const std::vector<std::pair<double, double>> curve{{0, 5}, {100, 3}, {200, 2}};
  CHECK(loss_at(curve, 50) == doctest::Approx(4));
  CHECK(loss_at(curve, 150) == doctest::Approx(2.5));
  CHECK(loss_at(curve, 100) == doctest::Approx(3));
  CHECK(loss_at(curve, 0) == doctest::Approx(5));
  CHECK(loss_at(curve, 200) == doctest::Approx(2));
  CHECK(std::isnan(loss_at(curve, 250)));
  CHECK(std::isnan(loss_at(curve, -1)));
  CHECK(std::isnan(loss_at({}, 10)));
  CHECK(loss_at({{10, 4}, {10, 3}}, 10) == 3);  // two points at the same tokens: the later
}

TEST_CASE("bench ablate: merge gives every M the same tokens and its own reference") {
  ablate_options o = ablation("merge");
  ablate_plan plan = plan_ablation(o);
  REQUIRE(plan.variants.size() == 4);
  CHECK(plan.second_reference.empty());
  for (const auto& v : plan.variants) {
    CHECK(v.learners * v.steps == 8 * 600);
    CHECK(v.reference == (v.name == "mean"));
    config c;
    v.apply(c);
    CHECK(c.mesh.merge == v.name);
  }
  CHECK(plan.variants[0].group == "M=8");
  CHECK(plan.variants[2].group == "M=16");
  CHECK(plan.variants[0].paper == "eval avg 54.1");

  o.merge_learners = {3, 4};
  o.steps = 40;
  plan = plan_ablation(o);
  REQUIRE(plan.variants.size() == 4);
  CHECK(plan.variants[0].steps == 40);
  CHECK(plan.variants[2].steps == 30);
  CHECK(plan.variants[2].paper.empty());  // the paper has no figure at M = 4
}

TEST_CASE("bench ablate: encoding compares against fp32 and the paper's bf16") {
  ablate_options o = ablation("encoding");
  ablate_plan plan = plan_ablation(o);
  REQUIRE(plan.variants.size() == 5);
  CHECK(plan.second_reference == "bf16");
  CHECK(named(plan, "fp32").reference);
  CHECK_FALSE(named(plan, "bf16").reference);
  config c;
  named(plan, "int4").apply(c);
  CHECK(c.wire.encoding == "int4");
  CHECK(named(plan, "int2").steps == 1000);

  o.encodings = {"int8", "int2"};  // without fp32 the first is the reference
  plan = plan_ablation(o);
  CHECK(plan.variants[0].reference);
  CHECK_FALSE(plan.variants[1].reference);
}

TEST_CASE("bench ablate: quorum variants share a wall time, dp runs its whole schedule") {
  CHECK(heterogeneous_slowdown(4) == "1,1,2,2");
  CHECK(heterogeneous_slowdown(5) == "1,1,2,2,2");
  CHECK(heterogeneous_slowdown(2) == "1,2");

  ablate_options o = ablation("quorum");
  ablate_plan plan = plan_ablation(o);
  std::vector<std::string> names;
  for (const auto& v : plan.variants) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{"K=1 + grace", "K=1, no grace", "K=M", "K=M lock-step", "dp"});
  config base;
  REQUIRE(configure_variants(plan, o, base));
  REQUIRE(plan.configs.size() == 5);
  for (const auto& c : plan.configs) CHECK(c.mesh.learner_slowdown == "1,1,2,2");
  CHECK(plan.configs[1].mesh.grace == false);
  CHECK(plan.configs[2].mesh.quorum == 4);
  CHECK(plan.configs[3].mesh.mode == "streaming");
  CHECK(plan.configs[3].mesh.inner_steps == plan.configs[3].mesh.fragments);
  CHECK(plan.configs[3].mesh.mix == 0);
  CHECK(plan.configs[4].mesh.mode == "dp");

  pace_variants(plan, o, {{4, 20.0}});
  for (std::size_t i = 0; i < plan.configs.size(); ++i) {
    CHECK(plan.configs[i].mesh.step_time_ms == 20);
    // Just before the fast learners finish 1000 steps of 20 ms; dp has no limit.
    CHECK(plan.configs[i].train.time_limit_s == doctest::Approx(i < 4 ? 0.95 * 1000 * 0.020 : 0));
  }
}

TEST_CASE("bench ablate: fragments refer to the default P, and an impossible P is named") {
  ablate_options o = ablation("fragments");
  ablate_plan plan = plan_ablation(o);
  CHECK(named(plan, "P=" + std::to_string(config{}.mesh.fragments)).reference);
  CHECK_FALSE(named(plan, "P=2").reference);

  o.fragments = {2, 4000};
  o.steps = 5;
  plan = plan_ablation(o);
  CHECK(plan.variants[0].reference);  // no default P among them: the first
  auto bad = configure_variants(plan, o, config{});
  REQUIRE_FALSE(bad);
  CHECK(bad.err().code == errc::invalid_input);
  CHECK(bad.err().message.find("variant P=4000: ") == 0);
}

TEST_CASE("bench ablate: losses paired by seed with the references, and the encoding claims judged") {
  ablate_options o = ablation("encoding");
  o.encodings = {"fp32", "bf16", "int4", "int2"};
  const ablate_plan plan = plan_ablation(o);
  std::vector<ablate_outcome> out = outcomes_with({{2.0, 2.2}, {2.02, 2.2}, {2.03, 2.21}, {3.0, 3.3}});
  pair_by_seed(plan, out, 2);
  CHECK(out[0].rel == std::vector<double>{0, 0});
  REQUIRE(out[3].rel.size() == 2);
  CHECK(out[3].rel[0] == doctest::Approx(50));
  CHECK(out[3].rel[1] == doctest::Approx(50));
  REQUIRE(out[2].rel_second.size() == 2);
  CHECK(out[2].rel_second[0] == doctest::Approx(100 * (2.03 / 2.02 - 1)));
  CHECK(out[2].rel_second[1] == doctest::Approx(100 * (2.21 / 2.2 - 1)));

  auto claims = ablate_claims(o, plan, out);
  REQUIRE(claims.size() == 2);
  CHECK(claims[0].text.find("int4 ≈ bf16") == 0);
  CHECK(claims[0].reproduced);
  CHECK(claims[1].text.find("2-bit breaks") == 0);
  CHECK(claims[1].reproduced);

  out = outcomes_with({{2.0}, {2.0}, {2.1}, {2.01}});  // int4 5 % worse, int2 harmless: neither holds
  pair_by_seed(plan, out, 1);
  claims = ablate_claims(o, plan, out);
  REQUIRE(claims.size() == 2);
  CHECK_FALSE(claims[0].reproduced);
  CHECK_FALSE(claims[1].reproduced);
}

TEST_CASE("bench ablate: the quorum claims, dp's loss read off its curve at the same tokens") {
  const ablate_options o = ablation("quorum");
  const ablate_plan plan = plan_ablation(o);
  std::vector<ablate_outcome> out = outcomes_with({{4.0}, {4.2}, {4.1}, {4.3}, {3.0}});
  const double goodput[] = {0.99, 0.99, 0.80, 0.70, 0.60};
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].goodput = {goodput[i]};
    out[i].tokens = {500};
    out[i].curves = {{{0, 5}, {500, out[i].loss[0]}}};
  }
  out[4].tokens = {1000};
  out[4].curves = {{{0, 5}, {1000, 3}}};  // dp at 500 tokens: 4.0, as K=1 + grace
  pair_by_seed(plan, out, 1);
  const auto claims = ablate_claims(o, plan, out);
  REQUIRE(claims.size() == 5);
  for (const auto& c : claims) CHECK_MESSAGE(c.reproduced, c.text);
  CHECK(claims[4].text.find("+0.00 % vs dp") != std::string::npos);
  CHECK(ablate_claims(ablation("fragments"), plan_ablation(ablation("fragments")), {}).empty());
}

TEST_CASE("bench ablate: the plot has a chart per group and a line per variant") {
  ablate_options o = ablation("merge");
  o.merge_learners = {2, 4};
  const ablate_plan plan = plan_ablation(o);
  std::vector<ablate_outcome> out(plan.variants.size());
  for (auto& x : out) x.curves = {{{0, 5}, {100, 4}, {200, 3.5}}};
  const std::string svg = ablation_plot("merge", plan.variants, out);
  CHECK(svg.find("<svg") != std::string::npos);
  CHECK(svg.find("M=2") != std::string::npos);
  CHECK(svg.find("M=4") != std::string::npos);
  CHECK(svg.find("rda") != std::string::npos);
}

// ---- the WAN race's arithmetic ---------------------------------------------------------------

TEST_CASE("bench wan: the options' bounds and the race's defaults") {
  wan_options o;
  CHECK(check_wan_options(o));
  o.modes = {"decoupled", "dp"};
  auto bad = check_wan_options(o);
  REQUIRE_FALSE(bad);
  CHECK(bad.err().message.find("'dp' is not one of diloco") != std::string::npos);
  o = wan_options{};
  o.ref_gbit = 0;
  CHECK_FALSE(check_wan_options(o));
  o = wan_options{};
  o.dp_steps = o.steps + 1;
  CHECK_FALSE(check_wan_options(o));

  o = wan_options{};
  o.learners = 3;
  const config d = wan_defaults(o);
  CHECK(d.mesh.shards == 1);  // one capped link up and one down per learner
  CHECK(d.mesh.learners == 3);
  CHECK(d.train.threads == 3);
  CHECK(d.train.steps == o.steps);
  CHECK(d.data.eval_tokens == o.eval_tokens);
}

TEST_CASE("bench wan: the cap gives our dp the reference's communication/compute ratio") {
  const wan_options o;
  const config cfg = wan_defaults(o);
  auto scale = measure_scale(o, cfg);
  REQUIRE(scale);
  wan_scale s = *scale;
  const double ref_compute_s = 6 * 12e9 * 1048576 / (256 * 200e12);
  CHECK(s.ref_compute_s == doctest::Approx(ref_compute_s));
  CHECK(s.ref_bytes == doctest::Approx(24e9));  // 12e9 bf16 values
  CHECK(s.ours_params == nano_params());
  CHECK(s.ours_bytes == doctest::Approx(4.0 * static_cast<double>(nano_params())));

  const double step_s = 0.05;
  set_step_time(s, o, step_s);
  REQUIRE(s.links.size() == 2);
  CHECK(s.links[0].gbit == 2);
  CHECK(s.links[1].gbit == 5);
  const wan_scale::link& five = s.links[1];
  CHECK(five.comm_s == doctest::Approx(24e9 / (5e9 / 8)));  // 38.4 s per direction
  CHECK(five.ratio == doctest::Approx(five.comm_s / ref_compute_s));
  // At the cap, our fp32 exchange takes `ratio` times our step, as the 12B model's takes at 5 Gbit/s.
  const double our_comm_s = s.ours_bytes / (five.cap_mbit * 1e6 / 8);
  CHECK(our_comm_s / step_s == doctest::Approx(five.ratio));
  CHECK(s.links[0].cap_mbit == doctest::Approx(0.4 * five.cap_mbit));  // 2/5 the link, 2/5 the cap
  CHECK(s.race.cap_mbit == doctest::Approx(five.cap_mbit));              // ref_gbit 5
  CHECK(s.latency_ms == doctest::Approx(20 * step_s / ref_compute_s));

  const double cap = five.cap_mbit;
  set_step_time(s, o, 2 * step_s);  // a slower step: a narrower cap for the same ratio
  CHECK(s.race.cap_mbit == doctest::Approx(cap / 2));
}

TEST_CASE("bench wan: seconds per round from a run's timeline") {
  mesh_summary s;
  const double t[] = {0, 1, 2, 3};
  const std::uint64_t rounds[] = {0, 2, 4, 8};
  for (int i = 0; i < 4; ++i) {
    run_sample x;
    x.t_s = t[i];
    x.rounds = rounds[i];
    s.timeline.push_back(x);
  }
  CHECK(seconds_per_round(s, 1) == doctest::Approx(2.0 / 6));  // from t = 1 (2 rounds) to t = 3 (8 rounds)
  CHECK(seconds_per_round(s, 0) == doctest::Approx(3.0 / 8));
  CHECK(std::isnan(seconds_per_round(s, 5)));  // from 8 rounds on, none closed
  CHECK(std::isnan(seconds_per_round(mesh_summary{}, 1)));
}

TEST_CASE("bench wan: the race plot shows every mode, dp projected, and the target") {
  race_result dp;
  dp.mode = "dp";
  dp.projected = true;
  dp.curve = {{0, 5}, {50, 4}, {500, 3}};  // far beyond the race: cut at its end
  race_result decoupled;
  decoupled.mode = "decoupled";
  decoupled.curve = {{0, 5}, {10, 3.5}, {20, 3.2}};
  const std::string svg = race_plot({dp, decoupled}, 3.3);
  CHECK(svg.find("dp (projected)") != std::string::npos);
  CHECK(svg.find("decoupled") != std::string::npos);
  CHECK(svg.find("target") != std::string::npos);
}

// ---- tiny real measurements ------------------------------------------------------------------

TEST_CASE("bench compute: the nano engine against its matched GEMM, two timed steps") {
  compute_options o;
  o.model = "nano";
  o.threads = 1;
  o.batch = 4;
  o.steps = 2;
  o.warmup = 1;
  o.rounds = 1;
  o.peak_s = 0.01;
  int progress_lines = 0;
  bench_hooks hooks;
  hooks.progress = [&](const std::string&) { ++progress_lines; };
  auto r = run_compute_bench(o, hooks);
  REQUIRE(r);
  CHECK(r->step_s.size() == 2);
  CHECK(r->gemm_s.size() == 2);
  // The engine, then each other backend: two samples each.
  CHECK(progress_lines == 2 * (1 + static_cast<int>(r->others.size())));
  CHECK(r->params == nano_params());
  CHECK(r->tokens_per_step == static_cast<std::size_t>(4 * model_preset("nano")->context));
  CHECK(finite_positive(r->tokens_per_s()));
  CHECK(finite_positive(r->gflops()));
  CHECK(finite_positive(r->gemm_gflops()));
  CHECK(finite_positive(r->ratio_vs_gemm()));
  CHECK(r->step_best_s() <= r->step_median_s());
  CHECK(r->torch.empty());
  CHECK(r->gemm_m == 4 * r->gemm_k);  // [N, C] x [C, 4C]
  // The same GEMM through oneDNN, the Eigen engine, the CPU's peak.
  CHECK(r->sgemm_s.size() == 2);
  CHECK(finite_positive(r->sgemm_gflops()));
  CHECK(r->best_sgemm_gflops() >= r->gemm_gflops());
  // One round: its ratio to the best GEMM is the run's.
  REQUIRE(r->round_vs_best_sgemm.size() == 1);
  CHECK(r->round_vs_best_sgemm.front() == doctest::Approx(r->ratio_vs_best_sgemm()));
  REQUIRE(r->other(dense_backend::eigen) != nullptr);
  CHECK(r->other(dense_backend::eigen)->ratio.size() == 1);
  CHECK(finite_positive(r->backend_tokens_per_s(dense_backend::eigen)));
  REQUIRE(r->peaks.size() == 1);
  CHECK(finite_positive(r->fp32_peak_gflops()));
  CHECK(r->gflops() < r->fp32_peak_gflops());
  const bool bf16 = detect_gemm_cpu().bf16;
  CHECK((r->other(dense_backend::bf16) != nullptr) == bf16);
  CHECK(r->bf16_gemm_s.size() == (bf16 ? 2u : 0u));
  // The peak loop asks the CPU, not oneDNN (whose ISA ONEDNN_MAX_CPU_ISA may cap).
  if (bf16) CHECK(finite_positive(r->bf16_peak_gflops()));
  // With AMX its tile loop is the bf16 peak, well above the vector dot products'.
  const cpu_peak& peak = r->peaks.front();
  if (peak.amx_bf16_gflops > 0) {
    CHECK(r->bf16_peak_gflops() == peak.amx_bf16_gflops);
    CHECK(peak.amx_bf16_gflops > peak.bf16_gflops);
    CHECK(std::string(peak.bf16_isa()) == "amx");
  }
  CHECK(std::isnan(r->thread_efficiency()));  // one thread: nothing to compare

  // Two threads: the engine on one thread too, for the efficiency.
  o.threads = 2;
  o.peak_s = 0;
  r = run_compute_bench(o, {});
  REQUIRE(r);
  CHECK(r->one_thread_step_s.size() == 2);
  CHECK(finite_positive(r->thread_efficiency()));
  CHECK(r->peaks.empty());
  CHECK(std::isnan(r->fp32_peak_gflops()));
  set_compute_threads(2);
}

TEST_CASE("bench compute: bad options and a stop before the first sample are errors") {
  compute_options o;
  o.threads = 0;
  auto r = run_compute_bench(o, {});
  REQUIRE_FALSE(r);
  CHECK(r.err().code == errc::invalid_input);
  o = compute_options{};
  o.model = "huge";
  CHECK_FALSE(run_compute_bench(o, {}));
  o = compute_options{};
  o.against_torch = true;
  o.torch_script = "/nonexistent/torch_reference.py";
  r = run_compute_bench(o, {});
  REQUIRE_FALSE(r);
  CHECK(r.err().code == errc::not_found);
  // Without OpenBLAS, PyTorch would run the reference BLAS: no "tuned" ratio against that.
  o.torch_script = ARCHIPELAGO_SOURCE_DIR "/tools/bench/torch_reference.py";
  o.tuned_blas_dir = "/nonexistent/openblas-openmp";
  r = run_compute_bench(o, {});
  REQUIRE_FALSE(r);
  CHECK(r.err().code == errc::not_found);
  CHECK(r.err().message.find("libopenblas0-openmp") != std::string::npos);
  // The DDP reference loads Debian's libblas.so.3: it must resolve to an OpenBLAS too.
  ddp_options d;
  d.script = ARCHIPELAGO_SOURCE_DIR "/tools/bench/ddp_reference.py";
  d.blas_library = "/nonexistent/libblas.so.3";
  auto ddp = run_ddp_bench(d, {});
  REQUIRE_FALSE(ddp);
  CHECK(ddp.err().code == errc::not_found);
  CHECK(ddp.err().message.find("libopenblas0-openmp") != std::string::npos);

  o = compute_options{};
  o.batch = 1;
  o.warmup = 0;
  bench_hooks stop;
  stop.stop = [] { return true; };
  r = run_compute_bench(o, stop);
  REQUIRE_FALSE(r);
  CHECK(r.err().message == "interrupted before any sample");
}

TEST_CASE("bench wire: the transport's round trip and throughput over inproc:// against raw ZeroMQ") {
  steady_clock_source clock;
  auto context = transport::make_io_context();
  auto pair = start_pair(clock, archipelago::test_logging::test_log(), {context, context, "inproc", 8, false, 0});
  REQUIRE(pair);
  raw_echo echo(*context, endpoint_for("inproc", "router"), 64);
  raw_pipe pipe(*context, *context, endpoint_for("inproc", "pull"), 64, nullptr);
  std::uint64_t retries = 0;

  auto ours = transport_rtt(**pair, 20, retries);
  REQUIRE(ours);
  auto raw = echo.run(20, clock);
  REQUIRE(raw);
  REQUIRE(ours->size() == 20);
  REQUIRE(raw->size() == 20);
  for (double us : *ours) CHECK(finite_positive(us));
  for (double us : *raw) CHECK(finite_positive(us));
  CHECK(finite_positive(median(*ours) / median(*raw)));
  CHECK((*pair)->echo_failures.load() == 0);

  const auto payload = fp32_payload(std::size_t{1} << 16);  // 256 KiB
  auto ours_s = transport_throughput(**pair, 4, payload, retries);
  REQUIRE(ours_s);
  auto raw_s = pipe.run(4, payload, clock, true);
  REQUIRE(raw_s);
  CHECK(finite_positive(*ours_s));
  CHECK(finite_positive(*raw_s));
  CHECK(finite_positive(*raw_s / *ours_s));
  CHECK((*pair)->at_b.seen() == 4);
}

TEST_CASE("bench snapshot: commits and a restore of the nano model against plain RocksDB") {
  archipelago::testing::temp_dir dir("archipelago_bench_snapshot");
  snapshot_options o;
  o.parts = {"write", "restore"};
  o.dir = dir.path();
  o.write_model = o.restore_model = "nano";
  o.commits = 4;
  o.rounds = 1;
  auto r = run_snapshot_bench(o, {});
  REQUIRE(r);
  CHECK_FALSE(r->latency);
  REQUIRE(r->write);
  REQUIRE(r->restore);
  const write_result& w = *r->write;
  CHECK(w.fragments > 0);
  CHECK(w.timed_bytes > w.payload_bytes);  // the values, plus keys and the manifests
  REQUIRE(w.ratio.size() == 1);
  CHECK(finite_positive(w.store_mbps[0]));
  CHECK(finite_positive(w.plain_mbps[0]));
  CHECK(finite_positive(w.ratio[0]));
  CHECK(finite_positive(w.families_ratio[0]));
  REQUIRE(w.disk_ratio.size() == 1);
  CHECK(finite_positive(w.disk_mbps[0]));
  CHECK(finite_positive(w.disk_ratio[0]));
  // Every sample ends with its bytes on disk: at least the payload was written.
  CHECK(w.store_amplification[0] >= 1);
  CHECK(w.plain_amplification[0] >= 1);
  CHECK(w.store_disk_mb[0] > 0);
  const restore_result& rs = *r->restore;
  CHECK(rs.params == nano_params());
  CHECK(rs.fragment_bytes >= rs.params * sizeof(float));
  for (const restore_layout* layout : {&rs.logged, &rs.flushed}) {
    REQUIRE(layout->ratio.size() == 1);
    CHECK(finite_positive(layout->ratio[0]));
    CHECK(layout->open_s[0] + layout->pick_s[0] + layout->read_s[0] == doctest::Approx(layout->store_s[0]));
  }
  CHECK(std::filesystem::is_empty(dir.path()));  // every temporary store removed

  // A layout file's model, in the fragments asked for.
  const std::string layout = dir.file("layout.json");
  std::ofstream(layout) << R"({"tensors": [{"name": "a", "shape": [64, 32]}, {"name": "b", "shape": [48, 32]},
                                          {"name": "e", "shape": [16, 8], "kind": "embedding"}]})";
  o.parts = {"write"};
  o.write_model = layout;
  o.fragments = 3;
  auto from_file = run_snapshot_bench(o, {});
  REQUIRE(from_file);
  CHECK(from_file->write->fragments == 3);
  // Theta and momentum of fragments 0, 1, 2 and 0 again (a, b, the embedding, a).
  CHECK(from_file->write->payload_bytes == 2 * sizeof(float) * (64 * 32 + 48 * 32 + 16 * 8 + 64 * 32));
  std::filesystem::remove(layout);
  CHECK(std::filesystem::is_empty(dir.path()));

  // One shard's memory: its real wire layer, writer and store through rounds of every fragment it owns.
  o.parts = {"shard"};
  o.write_model = "nano";
  o.fragments = 0;
  o.learners = 2;
  bench_hooks logged;
  logged.log = &archipelago::test_logging::test_log();
  auto shard = run_snapshot_bench(o, logged);
  REQUIRE(shard);
  REQUIRE(shard->shard);
  const shard_memory_result& m = *shard->shard;
  CHECK(m.fragments_owned > 0);
  CHECK(m.owned_params > 0);
  CHECK(m.rounds == 2 * m.fragments_owned);
  CHECK(m.versions_committed == m.rounds);  // every round merged, and its version made durable
  CHECK(finite_positive(m.initial_mb));
  CHECK(std::isfinite(m.peak_bytes_per_param));
  CHECK(std::filesystem::is_empty(dir.path()));
  CHECK_FALSE(run_snapshot_bench(o, {}));  // it needs a logger

  o.parts = {"write"};
  o.write_model = dir.file("none.json");
  auto missing = run_snapshot_bench(o, {});
  REQUIRE_FALSE(missing);
  CHECK(missing.err().message.find("none.json") != std::string::npos);

  o.dir = dir.file("missing");
  o.write_model = "nano";
  auto bad = run_snapshot_bench(o, {});
  REQUIRE_FALSE(bad);
  CHECK(bad.err().message.find("is not a directory") != std::string::npos);
}

TEST_CASE("bench parity: a variant is LABEL=MODE,KEY=VALUE,..., checked before any run") {
  auto v = parse_parity_variant("rebase=decoupled,mesh.rebase=true,mesh.outer_lr=0.5");
  REQUIRE(v);
  CHECK(v->label == "rebase");
  CHECK(v->mode == "decoupled");
  CHECK(v->settings == std::vector<std::string>{"mesh.rebase=true", "mesh.outer_lr=0.5"});
  CHECK(parse_parity_variant("plain=dp")->settings.empty());
  CHECK_FALSE(parse_parity_variant("decoupled"));                 // no label
  CHECK_FALSE(parse_parity_variant("x=async"));                   // not a mode
  CHECK_FALSE(parse_parity_variant("x=decoupled,mesh.rebase"));   // a setting without a value
  parity_options o;
  o.modes = {"dp", "decoupled"};
  o.variants = {*parse_parity_variant("decoupled=decoupled,mesh.rebase=true")};
  CHECK_FALSE(check_parity(o, config{}));  // the label repeats a mode
  o.variants = {*parse_parity_variant("both=decoupled,mesh.rebase=true,mesh.mix=0.5")};
  auto refused = check_parity(o, config{});
  REQUIRE_FALSE(refused);
  CHECK(refused.err().message.find("both") != std::string::npos);
  o.variants = {*parse_parity_variant("r=decoupled,mesh.no_such_knob=1")};
  CHECK_FALSE(check_parity(o, config{}));
  o.variants = {*parse_parity_variant("r=decoupled,mesh.rebase=true")};
  CHECK(check_parity(o, config{}));
}

TEST_CASE("bench parity: a variant's own train.steps overrides --steps (a longer budget past dp's)") {
  parity_options o;
  o.steps = 1000;
  o.learners = 3;
  const auto plain = parity_arm_config(o, config{}, {"decoupled", "decoupled", {}}, "a.txt");
  REQUIRE(plain);
  CHECK(plain->train.steps == 1000);
  CHECK(plain->mesh.learners == 3);
  CHECK(plain->data.corpus == "a.txt");
  const auto longer = parity_arm_config(o, config{}, *parse_parity_variant("long=decoupled,train.steps=1050"), "");
  REQUIRE(longer);
  CHECK(longer->train.steps == 1050);
  CHECK(longer->mesh.mode == "decoupled");
}

TEST_CASE("bench parity: a sweep is LABEL=MODE,KEY=V1|V2,..., expanded to every combination") {
  auto s = parse_parity_sweep("dl=diloco,mesh.merge=mean,mesh.outer_lr=0.4|0.7,mesh.inner_steps=10|30|50");
  REQUIRE(s);
  CHECK(s->label == "dl");
  CHECK(s->mode == "diloco");
  REQUIRE(s->axes.size() == 3);
  CHECK(s->axes[1].second == std::vector<std::string>{"0.4", "0.7"});
  const auto arms = expand_sweep(*s, 1500, 32);
  REQUIRE(arms.size() == 6);
  CHECK(arms[0].label == "dl:mean:0.4:10");
  CHECK(arms[5].label == "dl:mean:0.7:50");  // the last axis varies fastest
  CHECK(arms[4].settings ==
        std::vector<std::string>{"mesh.merge=mean", "mesh.outer_lr=0.7", "mesh.inner_steps=30"});
  for (const auto& a : arms) CHECK(a.mode == "diloco");
  // A batch axis keeps the tokens equal.
  const auto batches = expand_sweep(*parse_parity_sweep("b=decoupled,data.batch=16|64"), 1500, 32);
  REQUIRE(batches.size() == 2);
  CHECK(batches[0].settings == std::vector<std::string>{"data.batch=16", "train.steps=3000"});
  CHECK(batches[1].settings == std::vector<std::string>{"data.batch=64", "train.steps=750"});
  CHECK_FALSE(parse_parity_sweep("x=diloco"));                    // no axis
  CHECK_FALSE(parse_parity_sweep("x=diloco,mesh.outer_lr=0.4||1"));  // an empty value
  CHECK_FALSE(parse_parity_sweep("x=diloco,mesh.outer_lr=|1"));
  CHECK_FALSE(parse_parity_sweep("x=async,mesh.outer_lr=1"));     // not a mode
  CHECK_FALSE(parse_parity_variant("x=decoupled,mesh.outer_lr="));  // an empty value in a variant too
  // Each grid point is checked like a variant before any run.
  parity_options o;
  o.modes = {"dp"};
  for (auto& a : expand_sweep(*parse_parity_sweep("m=decoupled,mesh.outer_momentum=0.5|1.5"), 1500, 32))
    o.variants.push_back(a);
  CHECK_FALSE(check_parity(o, config{}));  // μ 1.5 is out of bounds
}

TEST_CASE("bench kernels: a round's kernels per GB, each positive, the merge slower than a copy") {
  testing::temp_dir dir("kernel-costs");
  kernel_cost_options o;
  o.fragment_mib = 1;
  o.rounds = 3;
  o.encoding = "bf16";
  o.disk_dir = dir.path();
  auto r = measure_kernel_costs(o);
  REQUIRE(r);
  CHECK(r->copy_gb_per_s > 0);
  CHECK(r->encode_s_per_gb > 0);
  CHECK(r->install_s_per_gb == doctest::Approx(1 / r->copy_gb_per_s));
  CHECK(r->disk_s_per_gb > 0);
  // Decoding, RDA's passes and the outer step read each byte more than once.
  CHECK(r->merge_s_per_gb > r->install_s_per_gb);
  CHECK(r->merge_vs_copy == doctest::Approx((1 / r->merge_s_per_gb) / r->copy_gb_per_s));
  CHECK(std::filesystem::is_empty(dir.path()));  // the disk probe removed its file
  o.encoding = "int3";
  CHECK_FALSE(measure_kernel_costs(o));
  o.encoding = "fp32";
  o.disk_dir = dir.file("absent");
  auto missing = measure_kernel_costs(o);
  REQUIRE_FALSE(missing);
  CHECK(missing.err().message.find("absent") != std::string::npos);
}
