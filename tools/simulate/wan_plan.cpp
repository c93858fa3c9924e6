#include "simulate/wan_plan.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/invariant.hpp"

namespace archipelago::wan {

kernel_figures recorded_kernels() {
  // `archipelago simulate wan --measure` on the project machine (2 vCPUs, AMD
  // EPYC, shared: load average 16-23), seven runs; each kernel's fastest, the
  // least disturbed (docs/benchmarks/results/2026-12-07-simulate-12b.md). One
  // core, fp32 contributions of 32 MiB, 4 members, median of 5 rounds each.
  kernel_figures k;
  k.copy_gb_per_s = 3.96;
  k.merge_s_per_gb = 2.483;
  k.encode_s_per_gb = 0.429;
  k.install_s_per_gb = 0.252;
  k.disk_s_per_gb = 6.603;
  return k;
}

costs costs_from(const kernel_figures& k, int fragments) {
  ARCHIPELAGO_INVARIANT(fragments >= 1, "wan plan: at least one fragment");
  costs c;
  c.merge_s_per_gb = k.merge_s_per_gb;
  c.commit_s_per_gb = k.disk_s_per_gb;
  c.after_step_s_per_gb = (k.encode_s_per_gb + k.install_s_per_gb) / fragments;
  c.wire_ratio = wire_framing_ratio;
  return c;
}

namespace {

constexpr double gb = 1e9;
constexpr double infinity = std::numeric_limits<double>::infinity();

error bad(const std::string& what) { return make_error(errc::invalid_input, what); }

bool positive(double v) { return std::isfinite(v) && v > 0; }
bool non_negative(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

expected<costs> read_costs_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return bad("--costs " + path + ": cannot be read");
  nlohmann::json last;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.front() != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) last = std::move(j);
  }
  if (last.is_null())
    return bad("--costs " + path +
               ": no line holds a JSON object (bench scale --json prints one last)");
  const nlohmann::json* from = &last;
  if (auto sizes = last.find("sizes");
      sizes != last.end() && sizes->is_array() && !sizes->empty()) {
    const nlohmann::json* largest = nullptr;
    for (const auto& s : *sizes)
      if (s.is_object() && s.contains("params") && s["params"].is_number() &&
          (!largest || s["params"].get<double>() > (*largest)["params"].get<double>()))
        largest = &s;
    if (!largest)
      return bad("--costs " + path + ": its \"sizes\" entries have no numeric \"params\"");
    from = largest;
  }
  double values[std::size(cost_fields)];
  for (std::size_t i = 0; i < std::size(cost_fields); ++i) {
    auto it = from->find(cost_fields[i]);
    if (it == from->end() || !it->is_number())
      return bad("--costs " + path + ": no numeric field \"" + cost_fields[i] + "\"" +
                 (from == &last ? "" : " in its largest \"sizes\" entry"));
    values[i] = it->get<double>();
  }
  costs c{values[0], values[1], values[2], values[3]};
  if (!non_negative(c.merge_s_per_gb) || !non_negative(c.commit_s_per_gb) ||
      !non_negative(c.after_step_s_per_gb) || !(std::isfinite(c.wire_ratio) && c.wire_ratio >= 1))
    return bad("--costs " + path + ": the costs must be finite and >= 0, the wire ratio >= 1");
  return c;
}

status validate(const inputs& in) {
  if (!(positive(in.params) && in.params <= 1e15)) return bad("params must be in (0, 1e15]");
  if (in.fragments < 1 || in.fragments > 1000000) return bad("fragments must be in [1, 1e6]");
  if (in.tau < 1 || in.tau > 64) return bad("tau must be in [1, 64]");
  if (in.learners < 1 || in.learners > 100000) return bad("learners must be in [1, 1e5]");
  if (in.gbit.empty()) return bad("give at least one link bandwidth");
  for (double g : in.gbit)
    if (!(positive(g) && g <= 1e6)) return bad("link bandwidths must be in (0, 1e6] Gbit/s");
  if (!(non_negative(in.latency_ms) && in.latency_ms <= 1e6))
    return bad("latency-ms must be in [0, 1e6]");
  if (!(non_negative(in.step_s) && in.step_s <= 1e6))
    return bad("step-s must be in [0, 1e6] (0: from the reference)");
  if (in.step_s == 0 &&
      !(positive(in.tokens_per_step) && positive(in.chips) && positive(in.chip_tflops)))
    return bad("tokens-per-step, chips and chip-tflops must be positive (they give the step time)");
  for (double b : {in.up_bytes_per_param, in.down_bytes_per_param, in.dp_bytes_per_param})
    if (!(positive(b) && b <= 8)) return bad("bytes per parameter must be in (0, 8]");
  const costs& c = in.c;
  if (!non_negative(c.merge_s_per_gb) || !non_negative(c.commit_s_per_gb) ||
      !non_negative(c.after_step_s_per_gb))
    return bad("merge, commit and after_step costs must be finite and >= 0 s per GB");
  if (!(std::isfinite(c.wire_ratio) && c.wire_ratio >= 1 && c.wire_ratio <= 100))
    return bad("wire-ratio must be in [1, 100]");
  return status::ok();
}

namespace {

// What one round costs at P fragments, independent of the link.
struct round_cost {
  double up_bytes, down_bytes, merge_s, commit_s, fixed_s;
};

round_cost round_at(const inputs& in, double fragments) {
  const double n = in.params / fragments;
  round_cost r;
  r.up_bytes = n * in.up_bytes_per_param * in.c.wire_ratio;
  r.down_bytes = n * in.down_bytes_per_param * in.c.wire_ratio;
  r.merge_s = in.c.merge_s_per_gb * in.learners * n * 4 / gb;
  r.commit_s = in.c.commit_s_per_gb * n * 8 / gb;
  r.fixed_s = r.merge_s + r.commit_s + 2 * in.latency_ms / 1e3;
  return r;
}

bool hides(const inputs& in, const round_cost& r, double bytes_per_s, double period_s) {
  const double up = r.up_bytes / bytes_per_s, down = r.down_bytes / bytes_per_s;
  return up <= period_s && down <= period_s && up + down + r.fixed_s <= in.tau * period_s;
}

}  // namespace

result plan(const inputs& in) {
  ARCHIPELAGO_INVARIANT(validate(in), "wan plan: validated inputs");
  result out;
  out.step_from_reference = in.step_s == 0;
  if (out.step_from_reference) {
    out.ref_flops = 6 * in.params * in.tokens_per_step;
    out.step_s = out.ref_flops / (in.chips * in.chip_tflops * 1e12);
  } else {
    out.step_s = in.step_s;
  }
  out.after_step_s = in.c.after_step_s_per_gb * in.params * 4 / gb;
  out.period_s = out.step_s + out.after_step_s;
  out.fragment_params = in.params / in.fragments;
  const round_cost r = round_at(in, in.fragments);
  out.up_bytes = r.up_bytes;
  out.down_bytes = r.down_bytes;
  out.merged_gb = in.learners * out.fragment_params * 4 / gb;
  out.committed_gb = out.fragment_params * 8 / gb;
  out.fixed_path_s = r.fixed_s;
  out.syncer_gbit_per_step = in.learners * r.up_bytes * 8 / gb / out.period_s;
  out.floor_throughput_gbit = std::max(r.up_bytes, r.down_bytes) * 8 / gb / out.period_s;
  const double room = in.tau * out.period_s - r.fixed_s;
  out.floor_path_gbit = room > 0 ? (r.up_bytes + r.down_bytes) * 8 / gb / room : infinity;
  out.floor_gbit = std::max(out.floor_throughput_gbit, out.floor_path_gbit);
  out.dp_bytes_per_step =
      in.learners > 1 ? 2.0 * (in.learners - 1) / in.learners * in.params * in.dp_bytes_per_param
                      : 0;
  out.dp_floor_gbit = out.dp_bytes_per_step * 8 / gb / out.step_s;

  for (double gbit : in.gbit) {
    const double bps = gbit * gb / 8;
    link_result l;
    l.gbit = gbit;
    l.up_s = r.up_bytes / bps;
    l.down_s = r.down_bytes / bps;
    l.latency_s = 2 * in.latency_ms / 1e3;
    l.merge_s = r.merge_s;
    l.commit_s = r.commit_s;
    l.path_s = l.up_s + l.down_s + r.fixed_s;
    l.budget_s = in.tau * out.period_s;
    l.slack_s = l.budget_s - l.path_s;
    l.utilisation_up = l.up_s / out.period_s;
    l.utilisation_down = l.down_s / out.period_s;
    l.hidden = hides(in, r, bps, out.period_s);
    // Rounds are paced by the slowest of: the learners' steps, each link's one
    // fragment per round, and τ paths in flight.
    const double pace =
        std::max({1.0, l.utilisation_up, l.utilisation_down, l.path_s / l.budget_s});
    l.sync_every_steps = in.fragments * pace;
    // Fragments shrink every per-round cost: the least P that hides, by bisection
    // over a doubling bound (hiding is monotone in P).
    l.fragments_needed = 0;
    int hi = 1;
    while (hi <= 1000000 && !hides(in, round_at(in, hi), bps, out.period_s)) hi *= 2;
    if (hi <= 1000000 || hides(in, round_at(in, 1000000), bps, out.period_s)) {
      hi = std::min(hi, 1000000);
      int lo = hi / 2;  // does not hide (or 0)
      while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (hides(in, round_at(in, mid), bps, out.period_s) ? hi : lo) = mid;
      }
      l.fragments_needed = hi;
    }
    l.dp_comm_s = out.dp_bytes_per_step / bps;
    l.dp_step_s = out.step_s + l.dp_comm_s;
    l.speedup = l.dp_step_s / out.period_s;
    out.links.push_back(l);
  }
  return out;
}

}  // namespace archipelago::wan
