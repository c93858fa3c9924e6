#pragma once
// bench wire: the node transport against raw ZeroMQ measured in the same run,
// on the same context (one I/O thread), endpoint kind and high-water mark.
// A shared machine is noisy, so the transport and its baseline
// alternate within each round and the median per-round ratio is reported:
//   1. throughput of 4 MiB fp32 fragments (pre-encoded, so the encoder is not
//      measured) vs raw PUSH/PULL carrying the same zero-copy payload, and vs
//      raw PUSH/PULL that also hashes each message as the transport's decoder;
//   2. small-message round trip (a Progress envelope echoed from the handler)
//      vs a raw DEALER/ROUTER echo of 64 bytes;
//   3. the link shaper's accuracy at 100 Mbit/s and 20 ms one way, against the
//      configured link;
//   4. what CURVE costs over tcp: the transport with and without it, and raw
//      ZeroMQ PUSH/PULL with and without it for reference.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_hooks.hpp"
#include "core/error.hpp"

namespace archipelago {

struct wire_options {
  int rounds = 7;
  int messages = 200;  // 4 MiB fragments per throughput sample
  std::string endpoint = "tcp";  // or inproc
  int hwm = 0;  // on every socket, ours and the baselines'; 0: the transport's default
};

/// The transport's default high-water mark, in messages.
int default_wire_hwm();

/// Rounds of (subject, baseline), alternating which goes first so a drift in
/// the machine's load hits both sides alike.
struct paired_rounds {
  std::vector<double> ours, base, ratio;
};

struct shaping_result {
  std::size_t probe_bytes = 0;
  double expected_latency_ms = 0, latency_ms = 0, latency_error_pct = 0;
  double unshaped_latency_ms = 0;  // the same probes on an unshaped link: the transport's own delay
  std::vector<double> latency_samples_ms;
  int rate_messages = 0;
  std::size_t rate_message_bytes = 0;
  double rate_seconds = 0, rate_bytes_per_s = 0, rate_error_pct = 0, end_to_end_bytes_per_s = 0;
};

struct curve_result {
  paired_rounds transport, raw;  // ours = with CURVE, base = without
  std::uint64_t accepted = 0, refused = 0;
};

struct wire_result {
  int hwm = 0;
  std::uint64_t fragment_bytes = 0;
  double load_before = 0, load_after = 0;
  std::uint64_t retries = 0;  // sends refused by a full outbox and retried
  paired_rounds tput;         // GB/s of fragment payload: transport vs raw PUSH/PULL
  paired_rounds tput_hashed;  // base: raw PUSH/PULL hashing each message; ratio: transport / that
  paired_rounds rtt;          // median round trip per round, microseconds
  int pings = 0;              // per round and side
  std::size_t envelope_bytes = 0, raw_ping_bytes = 0;
  shaping_result shaping;
  std::size_t curve_messages = 0;
  std::optional<curve_result> curve;  // empty when CURVE's figure failed (curve_error says why)
  std::string curve_error;
};

/// All four figures; a failure of CURVE's is kept in the result, any other is returned.
expected<wire_result> run_wire_bench(const wire_options& o, const bench_hooks& hooks);

}  // namespace archipelago
