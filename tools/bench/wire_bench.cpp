#include "bench/wire_bench.hpp"

#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "bench/bench_stats.hpp"
#include "bench/wire_instruments.hpp"
#include "core/invariant.hpp"

namespace archipelago {
namespace {

using transport::encoded_message;
using transport::shared_bytes;
using namespace std::chrono_literals;

constexpr std::size_t fragment_floats = std::size_t{1} << 20;  // 4 MiB of fp32
constexpr int warmup_messages = 32;  // also lets the allocator settle on 4 MiB buffers
constexpr int warmup_pings = 100;
constexpr double shaped_rate = 12.5e6;           // 100 Mbit/s, in bytes/s
constexpr nanos shaped_latency_ns = 20'000'000;  // 20 ms one way
constexpr int latency_samples = 25;
constexpr auto latency_spacing = 30ms;                       // > the latency: one probe in flight at a time
constexpr std::size_t shaped_floats = std::size_t{1} << 18;  // 1 MiB messages
constexpr double shaped_seconds = 2.5;                       // the rate test lasts at least 2 s

/// What the transports of one run share: the clock, the fragment, the retry count.
struct wire_run {
  steady_clock_source clock;
  logger* log = nullptr;  // the transports' (bench_hooks::log)
  shared_bytes fragment = fp32_payload(fragment_floats);
  std::uint64_t retries = 0;
};

/// One-way delays in ms of small messages sent one at a time, `latency_spacing`
/// apart: A's send call to B's handler, read on one clock.
expected<std::vector<double>> one_way_delays(transport_pair& p, std::uint64_t& retries, const bench_hooks& hooks,
                                             const std::string& label, std::size_t& probe_bytes) {
  p.at_b.reset(true);
  std::vector<nanos> sent_ns(latency_samples);
  for (int i = 0; i < latency_samples; ++i) {
    hooks.update("bench wire: " + label + " probe " + std::to_string(i + 1) + "/" + std::to_string(latency_samples));
    const encoded_message m = progress_message(*p.a, i + 1);
    probe_bytes = m.total_bytes();
    sent_ns[i] = p.clock.now();
    if (auto s = send_retrying(*p.a, wire_node_b, m, retries, p.clock, sent_ns[i] + ping_limit_ns); !s)
      return s.err();
    std::this_thread::sleep_for(latency_spacing);
  }
  if (!p.at_b.wait_count(latency_samples, ping_limit_ns))
    return make_error(errc::timeout, label + ": " + std::to_string(p.at_b.seen()) + " of " +
                                         std::to_string(latency_samples) + " probes arrived");
  std::vector<double> delays_ms;
  std::lock_guard<std::mutex> lock(p.at_b.mutex);
  for (auto [round, at] : p.at_b.arrivals)
    if (round >= 1 && round <= static_cast<std::uint64_t>(latency_samples))
      delays_ms.push_back(static_cast<double>(at - sent_ns[round - 1]) * 1e-6);
  return delays_ms;
}

/// The delivery rate of 1 MiB messages sent back to back over the shaped link.
status measure_shaped_rate(shaping_result& r, transport_pair& p, std::uint64_t& retries, const bench_hooks& hooks) {
  hooks.update("bench wire: shaping rate, " + std::to_string(shaped_seconds).substr(0, 3) + " s at 100 Mbit/s");
  const shared_bytes payload = fp32_payload(shaped_floats);
  std::vector<encoded_message> batch;
  r.rate_message_bytes = fragment_message(*p.a, 0, payload).total_bytes();
  r.rate_messages = static_cast<int>(std::ceil(shaped_seconds * shaped_rate / r.rate_message_bytes));
  for (int i = 0; i < r.rate_messages; ++i) batch.push_back(fragment_message(*p.a, i + 1, payload));
  p.at_b.reset(false);
  const nanos limit = static_cast<nanos>(2 * shaped_seconds * 1e9) + 5'000'000'000;
  const nanos start_ns = p.clock.now();
  for (const auto& m : batch)
    if (auto s = send_retrying(*p.a, wire_node_b, m, retries, p.clock, start_ns + limit); !s) return s.err();
  if (!p.at_b.wait_count(r.rate_messages, limit))
    return make_error(errc::timeout, "shaping: " + std::to_string(p.at_b.seen()) + " of " +
                                         std::to_string(r.rate_messages) + " 1 MiB messages arrived within " +
                                         fmt("%.0fs", to_seconds(limit)));
  std::lock_guard<std::mutex> lock(p.at_b.mutex);
  // Steady state: the bytes after the first message over the time between the
  // first and last arrivals, which leaves the latency out.
  r.rate_seconds = to_seconds(p.at_b.last_ns - p.at_b.first_ns);
  r.rate_bytes_per_s = static_cast<double>((r.rate_messages - 1) * r.rate_message_bytes) / r.rate_seconds;
  r.rate_error_pct = (r.rate_bytes_per_s / shaped_rate - 1) * 100;
  r.end_to_end_bytes_per_s = static_cast<double>(r.rate_messages * r.rate_message_bytes) /
                             (to_seconds(p.at_b.last_ns - start_ns) - to_seconds(shaped_latency_ns));
  return {};
}

/// Shapes A → B to 100 Mbit/s and 20 ms; measures the one-way delay of spaced
/// small messages (and, as a reference, the same without shaping) and the
/// delivery rate of 1 MiB messages sent back to back.
expected<shaping_result> measure_shaping(transport_pair& p, std::uint64_t& retries, const bench_hooks& hooks) {
  shaping_result r;
  auto unshaped = one_way_delays(p, retries, hooks, "unshaped one-way", r.probe_bytes);
  if (!unshaped) return unshaped.err();
  r.unshaped_latency_ms = median(*unshaped);

  link_profile link;
  link.bandwidth_bytes_per_s = shaped_rate;
  link.latency_ns = shaped_latency_ns;
  if (auto s = p.a->set_link(wire_node_b, link); !s) return s.err();
  auto shaped = one_way_delays(p, retries, hooks, "shaped one-way", r.probe_bytes);
  if (!shaped) return shaped.err();
  r.latency_samples_ms = std::move(*shaped);
  if (r.latency_samples_ms.empty()) return make_error(errc::internal, "shaped one-way: no probe matched its send time");
  // What the shaper promises: serialisation at the link rate, then the latency.
  r.expected_latency_ms = (static_cast<double>(shaped_latency_ns) + r.probe_bytes / shaped_rate * 1e9) * 1e-6;
  r.latency_ms = median(r.latency_samples_ms);
  r.latency_error_pct = (r.latency_ms / r.expected_latency_ms - 1) * 100;
  if (auto ok = measure_shaped_rate(r, p, retries, hooks); !ok) return ok.err();
  return r;
}

/// Rounds of transport and raw throughput, with and without CURVE, in every order.
status curve_rounds(curve_result& r, wire_run& w, transport_pair& plain, transport_pair& secure, raw_pipe& raw_plain,
                    raw_pipe& raw_secure, std::size_t messages, int rounds, const bench_hooks& hooks) {
  const double bytes = static_cast<double>(messages * w.fragment.size());
  for (int round = 0; round < rounds; ++round) {
    double gbps[2][2] = {};  // [transport, raw][without, with]
    for (int side = 0; side < 4; ++side) {
      if (hooks.stopped()) return interrupted();
      const bool on = (side % 2 == 0) == (round % 2 == 0);
      const bool raw = side >= 2;
      hooks.update("bench wire: CURVE round " + std::to_string(round + 1) + "/" + std::to_string(rounds) +
                   (raw ? " (raw ZeroMQ" : " (transport") + (on ? ", with CURVE)" : ", without)"));
      auto s = raw ? (on ? raw_secure : raw_plain).run(messages, w.fragment, w.clock)
                   : transport_throughput(on ? secure : plain, messages, w.fragment, w.retries);
      if (!s) return on ? make_error(s.err().code, "with CURVE: " + s.err().message) : s.err();
      gbps[raw][on] = bytes / *s * 1e-9;
    }
    for (int raw = 0; raw < 2; ++raw) {
      paired_rounds& pr = raw ? r.raw : r.transport;
      pr.ours.push_back(gbps[raw][1]);
      pr.base.push_back(gbps[raw][0]);
      pr.ratio.push_back(gbps[raw][1] / gbps[raw][0]);
    }
  }
  return {};
}

/// Transport throughput with and without CURVE, and raw ZeroMQ PUSH/PULL's, in
/// interleaved rounds. Each end gets its own context, as two node processes
/// would: CURVE encrypts on the sender's I/O thread and decrypts on the
/// receiver's, and one shared I/O thread would do both and overstate the cost.
/// The raw sockets get contexts of their own, without the transports' ZAP handlers.
expected<curve_result> measure_curve(wire_run& w, std::size_t messages, int rounds, int hwm, const bench_hooks& hooks) {
  if (!transport::curve_available()) return make_error(errc::unsupported, "libzmq was built without CURVE");
  auto ctx = [] { return transport::make_io_context(); };
  auto plain = start_pair(w.clock, *w.log, {ctx(), ctx(), "tcp", messages, false, hwm});
  if (!plain) return plain.err();
  auto secure = start_pair(w.clock, *w.log, {ctx(), ctx(), "tcp", messages, true, hwm});
  if (!secure) return secure.err();
  curve_keys keys;
  if (zmq_curve_keypair(keys.server_public, keys.server_secret) != 0 ||
      zmq_curve_keypair(keys.client_public, keys.client_secret) != 0)
    return make_error(errc::internal, "zmq_curve_keypair failed");
  auto raw_send = ctx(), raw_recv = ctx();
  raw_pipe raw_plain(*raw_send, *raw_recv, "tcp://127.0.0.1:0", hwm, nullptr);
  raw_pipe raw_secure(*raw_send, *raw_recv, "tcp://127.0.0.1:0", hwm, &keys);

  hooks.update("bench wire: CURVE warm-up (handshakes)");
  auto with_curve = [](const error& e) { return make_error(e.code, "with CURVE: " + e.message); };
  if (auto s = transport_rtt(**secure, 10, w.retries); !s) return with_curve(s.err());
  if (auto s = transport_rtt(**plain, 10, w.retries); !s) return s.err();
  if (auto s = transport_throughput(**secure, warmup_messages, w.fragment, w.retries); !s) return with_curve(s.err());
  if (auto s = transport_throughput(**plain, warmup_messages, w.fragment, w.retries); !s) return s.err();
  if (auto s = raw_secure.run(warmup_messages, w.fragment, w.clock); !s) return with_curve(s.err());
  if (auto s = raw_plain.run(warmup_messages, w.fragment, w.clock); !s) return s.err();

  curve_result r;
  if (auto ok = curve_rounds(r, w, **plain, **secure, raw_plain, raw_secure, messages, rounds, hooks); !ok)
    return ok.err();
  const auto ca = (*secure)->a->counters(), cb = (*secure)->b->counters();
  r.accepted = ca.curve_accepted + cb.curve_accepted;
  r.refused = ca.curve_refused + cb.curve_refused;
  if (r.accepted == 0)
    return make_error(errc::internal, "with CURVE: no handshake was authenticated, so CURVE was not in use");
  return r;
}

/// 1. Throughput, in GB/s of fragment payload (envelopes not counted), against
/// raw PUSH/PULL and, to tell the transport's overhead from the cost of its
/// integrity check, raw PUSH/PULL that hashes every message on receipt.
status throughput_rounds(wire_result& r, wire_run& w, transport_pair& p, raw_pipe& pipe, const wire_options& o,
                         const bench_hooks& hooks) {
  const auto messages = static_cast<std::size_t>(o.messages);
  const double sample_bytes = static_cast<double>(messages * w.fragment.size());
  for (int round = 0; round < o.rounds; ++round) {
    double gbps[3] = {};  // transport, raw, raw + XXH3
    for (int k = 0; k < 3; ++k) {
      if (hooks.stopped()) return interrupted();
      const int side = (k + round) % 3;  // rotate the order round by round
      static const char* const names[] = {" (transport)", " (raw ZeroMQ)", " (raw ZeroMQ + XXH3)"};
      hooks.update("bench wire: throughput round " + std::to_string(round + 1) + "/" + std::to_string(o.rounds) +
                   names[side]);
      auto s = side == 0 ? transport_throughput(p, messages, w.fragment, w.retries)
                         : pipe.run(messages, w.fragment, w.clock, side == 2);
      if (!s) return s.err();
      gbps[side] = sample_bytes / *s * 1e-9;
    }
    r.tput.ours.push_back(gbps[0]);
    r.tput.base.push_back(gbps[1]);
    r.tput.ratio.push_back(gbps[0] / gbps[1]);
    r.tput_hashed.base.push_back(gbps[2]);
    r.tput_hashed.ratio.push_back(gbps[0] / gbps[2]);
  }
  const std::uint64_t dropped = p.a->counters().peer_queue_full;
  if (dropped > 0)
    return make_error(errc::internal,
                      "transport dropped " + std::to_string(dropped) + " fragments at a full peer queue");
  return {};
}

/// 2. Small-message round trip, median per round.
status rtt_rounds(wire_result& r, wire_run& w, transport_pair& p, raw_echo& echo, const wire_options& o,
                  const bench_hooks& hooks) {
  r.pings = wire_pings;
  r.raw_ping_bytes = raw_ping_bytes;
  r.envelope_bytes = progress_message(*p.a, 1).total_bytes();
  for (int round = 0; round < o.rounds; ++round) {
    double ours = 0, base = 0;
    for (int side = 0; side < 2; ++side) {
      if (hooks.stopped()) return interrupted();
      const bool ours_now = (side == 0) == (round % 2 == 0);
      hooks.update("bench wire: round trip round " + std::to_string(round + 1) + "/" + std::to_string(o.rounds) +
                   (ours_now ? " (transport)" : " (raw ZeroMQ)"));
      auto s = ours_now ? transport_rtt(p, wire_pings, w.retries) : echo.run(wire_pings, w.clock);
      if (!s) return s.err();
      (ours_now ? ours : base) = median(*s);
    }
    r.rtt.ours.push_back(ours);
    r.rtt.base.push_back(base);
    r.rtt.ratio.push_back(ours / base);
  }
  return {};
}

/// 3. Shaping accuracy, on a fresh pair so no earlier state is on the link.
status shaping_figure(wire_result& r, wire_run& w, const transport::io_context& context, const wire_options& o,
                      const bench_hooks& hooks) {
  if (hooks.stopped()) return interrupted();
  auto shaped_pair = start_pair(w.clock, *w.log, {context, context, o.endpoint, 0, false, r.hwm});
  if (!shaped_pair) return shaped_pair.err();
  if (auto s = transport_rtt(**shaped_pair, 10, w.retries); !s) return s.err();  // connected
  auto shaping = measure_shaping(**shaped_pair, w.retries, hooks);
  if (!shaping) return shaping.err();
  r.shaping = std::move(*shaping);
  return {};
}

/// The four figures; ZeroMQ's exceptions are caught by the caller.
status measure_all(wire_result& r, wire_run& w, const wire_options& o, const bench_hooks& hooks) {
  const auto messages = static_cast<std::size_t>(o.messages);
  // One context, as in a node process: for inproc both transports must share
  // it, and the baselines use it too, so all sides get the same I/O thread.
  auto context = transport::make_io_context();
  auto pair = start_pair(w.clock, *w.log, {context, context, o.endpoint, messages, false, r.hwm});
  if (!pair) return pair.err();
  transport_pair& p = **pair;
  raw_pipe pipe(*context, *context, endpoint_for(o.endpoint, "pull"), r.hwm, nullptr);
  raw_echo echo(*context, endpoint_for(o.endpoint, "router"), r.hwm);

  // Warm-up: connects every socket and touches every code path once.
  hooks.update("bench wire: warming up");
  if (auto s = transport_throughput(p, warmup_messages, w.fragment, w.retries); !s) return s.err();
  if (auto s = pipe.run(warmup_messages, w.fragment, w.clock); !s) return s.err();
  if (auto s = transport_rtt(p, warmup_pings, w.retries); !s) return s.err();
  if (auto s = echo.run(warmup_pings, w.clock); !s) return s.err();

  if (auto ok = throughput_rounds(r, w, p, pipe, o, hooks); !ok) return ok;
  if (auto ok = rtt_rounds(r, w, p, echo, o, hooks); !ok) return ok;
  if (auto ok = shaping_figure(r, w, context, o, hooks); !ok) return ok;
  // 4. CURVE's cost, on tcp only (inproc skips the ZMTP handshake, so CURVE
  // never applies there). A failure here is reported with the other figures.
  if (hooks.stopped()) return interrupted();
  r.curve_messages = std::max<std::size_t>(10, messages / 4);
  auto curve = measure_curve(w, r.curve_messages, o.rounds, r.hwm, hooks);
  if (curve) r.curve = std::move(*curve);
  else r.curve_error = curve.err().to_string();
  return {};
}

}  // namespace

int default_wire_hwm() { return transport::transport_config{}.socket_hwm; }

expected<wire_result> run_wire_bench(const wire_options& o, const bench_hooks& hooks) {
  if (o.rounds < 1 || o.messages < 2)
    return make_error(errc::invalid_input, "--rounds must be at least 1 and --messages at least 2");
  if (o.endpoint != "tcp" && o.endpoint != "inproc")
    return make_error(errc::invalid_input, "--endpoint must be tcp or inproc, not '" + o.endpoint + "'");
  ARCHIPELAGO_INVARIANT(hooks.log != nullptr, "bench wire: the caller's logger for the transports");
  wire_run w;
  w.log = hooks.log;
  wire_result r;
  r.hwm = o.hwm > 0 ? o.hwm : default_wire_hwm();
  r.fragment_bytes = w.fragment.size();
  r.load_before = load_average();
  try {
    if (auto ok = measure_all(r, w, o, hooks); !ok) return ok.err();
  } catch (const zmq::error_t& e) {
    return make_error(errc::io_error, std::string("ZeroMQ: ") + e.what());
  }
  r.retries = w.retries;
  r.load_after = load_average();
  return r;
}

}  // namespace archipelago
