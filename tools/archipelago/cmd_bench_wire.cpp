// archipelago bench wire: the node transport against raw ZeroMQ measured in the
// same run — throughput, round trip, shaping accuracy, CURVE's cost
// (tools/bench/wire_bench.hpp); each figure with its per-round ratios.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.hpp"
#include "bench/wire_bench.hpp"
#include "cmd_bench.hpp"

namespace archipelago::cli {
namespace {

struct wire_flags {
  wire_options bench;
  bool json = false;
  CLI::App* command = nullptr;  // the `wire` subcommand, to know whether it was parsed
};

wire_flags& options() {
  static wire_flags o;
  return o;
}

void print_throughput(const wire_options& o, const wire_result& r) {
  const char* kind = o.endpoint == "tcp" ? "tcp loopback" : "inproc";
  const double tput_ratio = median(r.tput.ratio);
  std::printf("bench wire: %s, %d rounds, one ZeroMQ context (1 I/O thread), HWM %d messages on every socket\n"
              "  machine     load average %.2f before, %.2f after, %u CPUs\n",
              kind, o.rounds, r.hwm, r.load_before, r.load_after, std::thread::hardware_concurrency());
  std::printf("  throughput  %d x 4 MiB fp32 fragments per sample, first send to last delivery\n", o.messages);
  std::printf("              transport %.2f GB/s, raw PUSH/PULL %.2f GB/s (medians)\n", median(r.tput.ours),
              median(r.tput.base));
  std::printf("              transport / raw = %.3f (per round: %s) [goal >= 0.95: %s]\n", tput_ratio,
              listed(r.tput.ratio, "%.3f").c_str(), tput_ratio >= 0.95 ? "met" : "NOT met");
  std::printf("              raw PUSH/PULL hashing each message on receipt (XXH3-64, as the transport's decoder) "
              "%.2f GB/s;\n              transport / that = %.3f (per round: %s)\n",
              median(r.tput_hashed.base), median(r.tput_hashed.ratio), listed(r.tput_hashed.ratio, "%.3f").c_str());
  if (o.endpoint == "inproc")
    std::printf("              (raw inproc hands the zero-copy buffer over by pointer and never reads it; the transport\n"
                "              checks every fragment's XXH3 checksum, so this ratio is checksum speed vs a pointer handoff)\n");
  std::printf("              outbox-full retries: %llu\n", static_cast<unsigned long long>(r.retries));
}

void print_rtt_and_shaping(const wire_result& r) {
  std::printf("  round trip  %d pings per round: Progress envelope (%zu bytes) echoed by B's handler vs raw "
              "DEALER/ROUTER %zu bytes\n",
              r.pings, r.envelope_bytes, r.raw_ping_bytes);
  std::printf("              transport %.1f us, raw %.1f us (medians)\n", median(r.rtt.ours), median(r.rtt.base));
  std::printf("              transport / raw = %.2f (per round: %s; lower is better)\n", median(r.rtt.ratio),
              listed(r.rtt.ratio, "%.2f").c_str());
  const shaping_result& sh = r.shaping;
  std::printf("  shaping     A -> B at 100 Mbit/s, 20 ms one way [goal: within 5 %%]\n");
  const auto [low, high] = std::minmax_element(sh.latency_samples_ms.begin(), sh.latency_samples_ms.end());
  std::printf("              latency: median %.3f ms (range %.3f-%.3f) over %zu probes of %zu bytes (expected %.3f ms): "
              "%+.2f %%\n",
              sh.latency_ms, *low, *high, sh.latency_samples_ms.size(), sh.probe_bytes, sh.expected_latency_ms,
              sh.latency_error_pct);
  std::printf("              (the same probes unshaped: median %.3f ms one way; shaped - unshaped - expected = %+.3f ms)\n",
              sh.unshaped_latency_ms, sh.latency_ms - sh.unshaped_latency_ms - sh.expected_latency_ms);
  std::printf("              rate: %.4g MB/s over %.2f s (%d x %zu bytes, between first and last arrival): %+.2f %%"
              " (end to end, latency removed: %.4g MB/s)\n",
              sh.rate_bytes_per_s * 1e-6, sh.rate_seconds, sh.rate_messages, sh.rate_message_bytes, sh.rate_error_pct,
              sh.end_to_end_bytes_per_s * 1e-6);
}

void print_curve(const wire_result& r) {
  if (!r.curve) {
    std::printf("  CURVE       FAILED: %s\n", r.curve_error.c_str());
    return;
  }
  const curve_result& c = *r.curve;
  std::printf("  CURVE       tcp loopback, %zu x 4 MiB per sample, one context per end; %llu handshakes "
              "authenticated, %llu refused\n",
              r.curve_messages, static_cast<unsigned long long>(c.accepted), static_cast<unsigned long long>(c.refused));
  std::printf("              transport with CURVE %.2f GB/s, without %.2f GB/s (medians); with / without = %.3f "
              "(per round: %s)\n",
              median(c.transport.ours), median(c.transport.base), median(c.transport.ratio),
              listed(c.transport.ratio, "%.3f").c_str());
  std::printf("              raw PUSH/PULL with CURVE %.2f GB/s, without %.2f GB/s; with / without = %.3f "
              "(per round: %s)\n",
              median(c.raw.ours), median(c.raw.base), median(c.raw.ratio), listed(c.raw.ratio, "%.3f").c_str());
}

void print_json(const wire_options& o, const wire_result& r) {
  const double nan = std::nan("");
  const curve_result* c = r.curve ? &*r.curve : nullptr;
  json_line j;
  j.add("command", "bench wire")
      .add("endpoint", o.endpoint)
      .add("rounds", o.rounds)
      .add("messages", o.messages)
      .add("fragment_bytes", r.fragment_bytes)
      .add("hwm", r.hwm)
      .add("load_before", r.load_before)
      .add("load_after", r.load_after)
      .add("throughput_gbps", median(r.tput.ours))
      .add("raw_throughput_gbps", median(r.tput.base))
      .add("throughput_ratio", median(r.tput.ratio))
      .add_raw("throughput_ratio_per_round", json_array(r.tput.ratio))
      .add("raw_hashed_throughput_gbps", median(r.tput_hashed.base))
      .add("throughput_ratio_vs_hashed", median(r.tput_hashed.ratio))
      .add_raw("throughput_ratio_vs_hashed_per_round", json_array(r.tput_hashed.ratio))
      .add("overloaded_retries", r.retries)
      .add("rtt_us", median(r.rtt.ours))
      .add("raw_rtt_us", median(r.rtt.base))
      .add("rtt_ratio", median(r.rtt.ratio))
      .add_raw("rtt_ratio_per_round", json_array(r.rtt.ratio))
      .add("rtt_envelope_bytes", static_cast<std::uint64_t>(r.envelope_bytes))
      .add("raw_rtt_payload_bytes", static_cast<std::uint64_t>(r.raw_ping_bytes))
      .add("shaping_latency_ms", r.shaping.latency_ms)
      .add("shaping_latency_expected_ms", r.shaping.expected_latency_ms)
      .add("shaping_latency_error_pct", r.shaping.latency_error_pct)
      .add("unshaped_latency_ms", r.shaping.unshaped_latency_ms)
      .add("shaping_rate_bytes_per_s", r.shaping.rate_bytes_per_s)
      .add("shaping_rate_error_pct", r.shaping.rate_error_pct)
      .add("curve_throughput_gbps", c ? median(c->transport.ours) : nan)
      .add("curve_plain_throughput_gbps", c ? median(c->transport.base) : nan)
      .add("curve_throughput_ratio", c ? median(c->transport.ratio) : nan)
      .add_raw("curve_ratio_per_round", json_array(c ? c->transport.ratio : std::vector<double>{}))
      .add("raw_curve_throughput_ratio", c ? median(c->raw.ratio) : nan)
      .add_raw("raw_curve_ratio_per_round", json_array(c ? c->raw.ratio : std::vector<double>{}))
      .add("curve_messages", static_cast<std::uint64_t>(r.curve_messages))
      .add("curve_endpoint", "tcp");
  if (!c) j.add("curve_error", r.curve_error);
  std::printf("%s\n", j.str().c_str());
}

int run_wire(logger& log) {
  const wire_flags& f = options();
  install_stop_handlers();
  progress_line progress(log);
  auto r = run_wire_bench(f.bench, progress_hooks(progress, log));
  progress.finish();
  if (!r) return report(r.err());
  print_throughput(f.bench, *r);
  print_rtt_and_shaping(*r);
  print_curve(*r);
  if (f.json) print_json(f.bench, *r);
  return r->curve ? exit_ok : exit_failure;
}

}  // namespace

void add_bench_wire(CLI::App& bench) {
  wire_flags& f = options();
  wire_options& o = f.bench;
  o.hwm = default_wire_hwm();
  CLI::App* wire = f.command =
      bench.add_subcommand("wire", "Transport throughput, round trip, shaping and CURVE vs raw ZeroMQ");
  wire->add_option("--rounds", o.rounds, "Rounds of (transport, baseline) per figure (default 7)")
      ->check(CLI::Range(1, 100));
  // At most 1000: a sample's envelopes are built before it starts, and a
  // heartbeat numbered after them must stay within the receiver's 1024-message
  // duplicate window.
  wire->add_option("--messages", o.messages, "4 MiB fragments per throughput sample (default 200)")
      ->check(CLI::Range(2, 1000));
  wire->add_option("--endpoint", o.endpoint, "tcp (loopback, default) or inproc")
      ->check(CLI::IsMember({"tcp", "inproc"}));
  wire->add_option("--hwm", o.hwm,
                   "ZeroMQ high-water mark, in messages, on every socket (default: the transport's, " +
                       std::to_string(o.hwm) + ")")
      ->check(CLI::Range(1, 100000));
  wire->add_flag("--json", f.json, "Print a one-line JSON summary last");
}

int run_bench_wire(logger& log) {
  if (options().command == nullptr || !options().command->parsed()) return exit_bad_input;
  return run_wire(log);
}

}  // namespace archipelago::cli
