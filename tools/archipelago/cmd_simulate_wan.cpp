// archipelago simulate wan: the paper's 12B-over-2-5-Gbit/s claim on paper,
// from measured costs (tools/simulate/wan_plan.hpp): whether each round's
// transfer, merge and commit hide behind τ steps, and the bandwidth floor. The
// costs: the recorded kernel figures, or measured now (--measure), or bench
// scale's JSON (--costs), or flags, each later one overriding.

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "bench/bench_stats.hpp"
#include "bench/kernel_costs.hpp"
#include "cli_common.hpp"
#include "commands.hpp"
#include "simulate/wan_plan.hpp"
#include "transport/tensor_encoding.hpp"

namespace archipelago::cli {
namespace {

using namespace archipelago::wan;

struct wan_flags {
  inputs in;
  std::string encoding = "fp32", down_encoding = "fp32", dp_encoding = "bf16";
  int block_size = default_block_size;
  bool measure = false;
  std::string measure_dir = ".";
  std::string costs_file;
  // Individual costs: negative means not given.
  double merge = -1, commit = -1, after_step = -1, wire = -1;
  bool json = false;
};

/// Bytes per parameter of an encoding at `block` (a block's fp32 absmax included).
expected<double> bytes_per_param(const std::string& flag, const std::string& name, int block) {
  auto enc = parse_tensor_encoding(name);
  if (!enc) return make_error(errc::invalid_input, flag + ": " + enc.err().message);
  constexpr std::size_t n = std::size_t{1} << 24;
  return static_cast<double>(encoded_bytes(*enc, n, block)) / static_cast<double>(n);
}

std::string gbit_text(double g) {
  return std::isfinite(g) ? fmt("%.3g Gbit/s", g) : std::string("none");
}

int run_wan(wan_flags& f) {
  if (auto ok = validate_block_size(f.block_size); !ok) return report(ok.err());
  for (auto [flag, name, out] :
       {std::tuple{"--encoding", &f.encoding, &f.in.up_bytes_per_param},
        std::tuple{"--down-encoding", &f.down_encoding, &f.in.down_bytes_per_param},
        std::tuple{"--dp-encoding", &f.dp_encoding, &f.in.dp_bytes_per_param}}) {
    auto b = bytes_per_param(flag, *name, f.block_size);
    if (!b) return report(b.err());
    *out = *b;
  }
  if (f.in.fragments < 1)
    return report(make_error(errc::invalid_input, "fragments must be in [1, 1e6]"));

  // The costs, each with where it came from.
  kernel_figures kernels = recorded_kernels();
  std::string kernel_source = "recorded kernels (simulate wan --measure, 2026-12-07)";
  if (f.measure) {
    kernel_cost_options ko;
    ko.encoding = f.encoding;
    ko.block_size = f.block_size;
    ko.members = f.in.learners < 64 ? f.in.learners : 64;
    ko.disk_dir = f.measure_dir;
    std::printf("measuring the kernels on this machine (one core; load %.2f) ...\n",
                load_average());
    auto m = measure_kernel_costs(ko);
    if (!m) return report(m.err());
    kernels = {m->copy_gb_per_s, m->merge_s_per_gb, m->encode_s_per_gb, m->install_s_per_gb,
               m->disk_s_per_gb};
    std::printf(
        "  memory copy %.2f GB/s; merge (decode %s, merge %d, outer step) %.3f s/GB = %.2f of the "
        "copy's "
        "rate; encode %s %.3f s/GB; install %.3f s/GB; disk write + fdatasync %.3f s/GB (%.2f "
        "GB/s); "
        "load %.2f -> %.2f\n",
        kernels.copy_gb_per_s, f.encoding.c_str(), ko.members, kernels.merge_s_per_gb,
        m->merge_vs_copy, f.encoding.c_str(), kernels.encode_s_per_gb, kernels.install_s_per_gb,
        kernels.disk_s_per_gb, 1 / kernels.disk_s_per_gb, m->load_before, m->load_after);
    kernel_source = "measured now (--measure)";
  }
  costs c = costs_from(kernels, f.in.fragments);
  std::string src_merge = kernel_source,
              src_commit = kernel_source + ": the disk's write rate, a floor",
              src_after = kernel_source + ": encode one fragment + install one, per step",
              src_wire = "TCP/IP and Ethernet framing at MTU 1500";
  if (!f.costs_file.empty()) {
    auto from = read_costs_file(f.costs_file);
    if (!from) return report_input(from.err());
    c = *from;
    src_merge = src_commit = src_after = src_wire = f.costs_file;
  }
  for (auto [given, field, source] : {std::tuple{f.merge, &c.merge_s_per_gb, &src_merge},
                                      std::tuple{f.commit, &c.commit_s_per_gb, &src_commit},
                                      std::tuple{f.after_step, &c.after_step_s_per_gb, &src_after},
                                      std::tuple{f.wire, &c.wire_ratio, &src_wire}}) {
    if (given < 0) continue;
    *field = given;
    *source = "flag";
  }
  f.in.c = c;
  if (auto ok = validate(f.in); !ok) return report(ok.err());
  const result r = plan(f.in);
  const inputs& in = f.in;

  std::printf(
      "simulate wan: %s parameters in %d fragments (%s each), tau %d, %d learners, each with one "
      "WAN link "
      "(%g ms one way) to the shards\n",
      fmt("%.3g", in.params).c_str(), in.fragments, fmt("%.3g", r.fragment_params).c_str(), in.tau,
      in.learners, in.latency_ms);
  if (r.step_from_reference)
    std::printf(
        "step: 6 x %.3g x %.0f tokens = %.3g FLOP on %g chips x %g TFLOP/s = %.3f s (--step-s "
        "gives one)\n",
        in.params, in.tokens_per_step, r.ref_flops, in.chips, in.chip_tflops, r.step_s);
  else
    std::printf("step: %.3f s (--step-s)\n", r.step_s);
  std::printf(
      "costs: merge %.4g s/GB of contributions [%s]; commit %.4g s/GB written [%s]; after_step "
      "%.4g s per "
      "step per GB of model [%s]; wire x%.4g [%s]\n",
      c.merge_s_per_gb, src_merge.c_str(), c.commit_s_per_gb, src_commit.c_str(),
      c.after_step_s_per_gb, src_after.c_str(), c.wire_ratio, src_wire.c_str());
  std::printf(
      "per round: up %s (%s), down %s (%s); merge %.3g GB = %.3f s; commit %.3g GB = %.3f s; "
      "latency 2 x "
      "%g ms; per step on a learner: after_step %.3f s, so one step every %.3f s\n",
      human_bytes(r.up_bytes).c_str(), f.encoding.c_str(), human_bytes(r.down_bytes).c_str(),
      f.down_encoding.c_str(), r.merged_gb, c.merge_s_per_gb * r.merged_gb, r.committed_gb,
      c.commit_s_per_gb * r.committed_gb, in.latency_ms, r.after_step_s, r.period_s);
  std::printf("\n%-10s %8s %8s %8s %8s %8s %9s %7s %10s %8s %9s %8s\n", "link", "up", "down",
              "path", "budget", "slack", "busy u/d", "hidden", "sync every", "P hides", "dp step",
              "speed-up");
  for (const auto& l : r.links)
    std::printf(
        "%-10s %7.2fs %7.2fs %7.2fs %7.2fs %+7.2fs %4.2f/%4.2f %7s %7.0f st %8s %8.1fs %7.1fx\n",
        fmt("%g Gbit/s", l.gbit).c_str(), l.up_s, l.down_s, l.path_s, l.budget_s, l.slack_s,
        l.utilisation_up, l.utilisation_down, l.hidden ? "yes" : "NO", l.sync_every_steps,
        l.fragments_needed ? fmt("%.0f", l.fragments_needed).c_str() : "none", l.dp_step_s,
        l.speedup);
  std::printf(
      "\nbandwidth floor: %s per learner link (one fragment per step each way: %s; a round's path "
      "in "
      "tau steps: %s); the shards' site receives %.3g Gbit/s in all\n",
      gbit_text(r.floor_gbit).c_str(), gbit_text(r.floor_throughput_gbit).c_str(),
      gbit_text(r.floor_path_gbit).c_str(), r.syncer_gbit_per_step);
  std::printf(
      "dp: %s per step and site (ring all-reduce, %s); its exchange hides behind the step only "
      "above %s\n",
      human_bytes(r.dp_bytes_per_step).c_str(), f.dp_encoding.c_str(),
      gbit_text(r.dp_floor_gbit).c_str());
  std::printf("paper (blog): %s\n", paper_claim);
  for (const auto& l : r.links)
    std::printf("  at %g Gbit/s: ours %.1fx at equal tokens (paper > %gx); %s\n", l.gbit, l.speedup,
                paper_speedup,
                l.hidden ? "every round hidden"
                         : "rounds NOT hidden: fragments sync less often than every P steps");
  std::printf("  floors: decoupled %s (paper %g Gbit/s), dp %s (paper %g Gbit/s)\n",
              gbit_text(r.floor_gbit).c_str(), paper_decoupled_gbit,
              gbit_text(r.dp_floor_gbit).c_str(), paper_dp_gbit);

  if (f.json) {
    std::string links = "[";
    for (std::size_t i = 0; i < r.links.size(); ++i) {
      const auto& l = r.links[i];
      json_line j;
      j.add("gbit", l.gbit)
          .add("up_s", l.up_s)
          .add("down_s", l.down_s)
          .add("latency_s", l.latency_s)
          .add("merge_s", l.merge_s)
          .add("commit_s", l.commit_s)
          .add("path_s", l.path_s)
          .add("budget_s", l.budget_s)
          .add("slack_s", l.slack_s)
          .add("utilisation_up", l.utilisation_up)
          .add("utilisation_down", l.utilisation_down)
          .add("hidden", l.hidden)
          .add("sync_every_steps", l.sync_every_steps)
          .add("fragments_needed", l.fragments_needed)
          .add("dp_comm_s", l.dp_comm_s)
          .add("dp_step_s", l.dp_step_s)
          .add("speedup", l.speedup);
      links += (i ? "," : "") + j.str();
    }
    links += "]";
    json_line cj;
    cj.add("merge_s_per_gb", c.merge_s_per_gb)
        .add("commit_s_per_gb", c.commit_s_per_gb)
        .add("after_step_s_per_gb", c.after_step_s_per_gb)
        .add("wire_ratio", c.wire_ratio)
        .add("merge_source", src_merge)
        .add("commit_source", src_commit)
        .add("after_step_source", src_after)
        .add("wire_source", src_wire);
    json_line j;
    j.add("command", "simulate wan")
        .add("params", in.params)
        .add("fragments", in.fragments)
        .add("tau", in.tau)
        .add("learners", in.learners)
        .add("latency_ms", in.latency_ms)
        .add("step_s", r.step_s)
        .add("step_from_reference", r.step_from_reference)
        .add("encoding", f.encoding)
        .add("down_encoding", f.down_encoding)
        .add("dp_encoding", f.dp_encoding)
        .add("up_bytes", r.up_bytes)
        .add("down_bytes", r.down_bytes)
        .add("merged_gb", r.merged_gb)
        .add("committed_gb", r.committed_gb)
        .add("after_step_s", r.after_step_s)
        .add("period_s", r.period_s)
        .add("fixed_path_s", r.fixed_path_s)
        .add("floor_gbit", r.floor_gbit)
        .add("floor_throughput_gbit", r.floor_throughput_gbit)
        .add("floor_path_gbit", r.floor_path_gbit)
        .add("syncer_gbit", r.syncer_gbit_per_step)
        .add("dp_bytes_per_step", r.dp_bytes_per_step)
        .add("dp_floor_gbit", r.dp_floor_gbit)
        .add("paper_speedup", paper_speedup)
        .add("paper_decoupled_gbit", paper_decoupled_gbit)
        .add("paper_dp_gbit", paper_dp_gbit)
        .add_raw("costs", cj.str())
        .add_raw("links", links);
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_simulate_wan(CLI::App& simulate) {
  auto f = std::make_shared<wan_flags>();
  CLI::App* cmd = simulate.add_subcommand(
      "wan",
      "The paper's 12B over 2-5 Gbit/s on paper: does each round's transfer, merge and commit hide "
      "behind "
      "tau steps, and what bandwidth is the floor; from measured per-GB costs");
  inputs& in = f->in;
  cmd->add_option("--params", in.params, "Parameters N")->capture_default_str();
  cmd->add_option("--fragments", in.fragments,
                  "Fragments P (one round per step: each synced every P steps)")
      ->capture_default_str();
  cmd->add_option("--tau", in.tau, "Rounds in flight: steps a round's path may take")
      ->capture_default_str();
  cmd->add_option("--learners", in.learners, "Learners M, one per site")->capture_default_str();
  cmd->add_option("--gbit", in.gbit, "Link bandwidths to evaluate, Gbit/s each way")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--latency-ms", in.latency_ms, "One-way latency of a link")
      ->capture_default_str();
  cmd->add_option("--step-s", in.step_s,
                  "A learner's compute per step (0: 6 N tokens / (chips x TFLOP/s))")
      ->capture_default_str();
  cmd->add_option("--tokens-per-step", in.tokens_per_step,
                  "Reference step: tokens per learner step")
      ->capture_default_str();
  cmd->add_option("--chips", in.chips, "Reference step: accelerators per learner")
      ->capture_default_str();
  cmd->add_option("--chip-tflops", in.chip_tflops, "Reference step: sustained TFLOP/s per chip")
      ->capture_default_str();
  cmd->add_option("--encoding", f->encoding, "The contributions' encoding (wire.encoding)")
      ->capture_default_str();
  cmd->add_option("--down-encoding", f->down_encoding,
                  "The shards' broadcast of a fragment (the mesh sends fp32)")
      ->capture_default_str();
  cmd->add_option("--dp-encoding", f->dp_encoding, "dp's gradient exchange")->capture_default_str();
  cmd->add_option("--block-size", f->block_size, "Quantisation block (wire.block_size)")
      ->capture_default_str();
  cmd->add_option("--costs", f->costs_file,
                  "A JSON file of per-GB costs: merge_s_per_gb, commit_s_per_gb, "
                  "after_step_s_per_gb, wire_ratio");
  cmd->add_option("--merge-s-per-gb", f->merge,
                  "Shard: decode + merge + outer step, s per GB of fp32 contributions");
  cmd->add_option("--commit-s-per-gb", f->commit, "Shard: committing a version, s per GB written");
  cmd->add_option("--after-step-s-per-gb", f->after_step,
                  "Learner: after_step s per step per GB of the model");
  cmd->add_option("--wire-ratio", f->wire, "Bytes on the wire over the encoded payload");
  cmd->add_flag("--measure", f->measure,
                "Measure the kernels' costs on the machine at hand first and use them");
  cmd->add_option("--measure-dir", f->measure_dir, "--measure: where the disk write goes")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print a one-line JSON summary last");
  return [f](logger&) { return run_wan(*f); };
}

}  // namespace archipelago::cli
