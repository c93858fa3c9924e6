#include "transport/wire_metrics.hpp"

#include <algorithm>

namespace archipelago {

metric_labels role_labels(node_address self) {
  return {{"role", to_string(self.kind)}, {"index", std::to_string(self.index)}};
}

void add_node_metrics(prometheus_text& page, node_address self, incarnation inc, nanos up_ns,
                      const transport::transport_counters& wire, const logger* logs) {
  const metric_labels me = role_labels(self);
  auto with = [&](std::string key, std::string value) {
    metric_labels l = me;
    l.emplace_back(std::move(key), std::move(value));
    return l;
  };
  page.gauge("archipelago_node_info", "One per actor: its role, index and incarnation (a restart is a new one).", 1,
             with("incarnation", std::to_string(inc.value)));
  page.gauge("archipelago_node_uptime_seconds", "Time since this incarnation started.",
             static_cast<double>(up_ns) * 1e-9, me);
  if (logs)
    for (const auto& [outcome, n] : {std::pair{"written", logs->lines_written()}, std::pair{"suppressed", logs->lines_suppressed()}})
      page.counter("archipelago_log_lines_total",
                   "Log lines of this process: written (rate-limit summaries included), or suppressed by the "
                   "per-kind rate limit (counted, never formatted). The process's logger: every actor of a process "
                   "shows the same figures.",
                   static_cast<double>(n), with("outcome", outcome));
  for (const auto& [peer, link] : wire.links) {
    const metric_labels l = with("peer", peer.to_string());
    page.counter("archipelago_wire_sent_bytes_total", "Bytes sent to a peer (frames as written to its socket).",
                 static_cast<double>(link.sent_bytes), l);
    page.counter("archipelago_wire_received_bytes_total", "Bytes of valid messages received from a peer.",
                 static_cast<double>(link.received_bytes), l);
    page.counter("archipelago_wire_sent_messages_total", "Messages sent to a peer, heartbeats included.",
                 static_cast<double>(link.sent_messages), l);
    page.counter("archipelago_wire_received_messages_total", "Valid messages received from a peer, heartbeats included.",
                 static_cast<double>(link.received_messages), l);
    if (link.rtt_samples > 0) {
      page.gauge("archipelago_wire_control_rtt_seconds", "The control lane's last round trip to a peer (heartbeat echo).",
                 static_cast<double>(link.rtt_last_ns) * 1e-9, l);
      page.gauge("archipelago_wire_control_rtt_max_seconds", "The control lane's longest round trip to a peer so far.",
                 static_cast<double>(link.rtt_max_ns) * 1e-9, l);
    }
    if (link.bulk_window_bytes > 0) {
      page.gauge("archipelago_wire_bulk_window_bytes",
                 "The bulk (tensor) connection's send buffer to a peer, as it follows its queueing delay.",
                 static_cast<double>(link.bulk_window_bytes), l);
      page.gauge("archipelago_wire_bulk_queue_delay_max_seconds",
                 "The longest queueing delay (smoothed RTT above the minimum) the bulk connection to a peer saw.",
                 static_cast<double>(link.bulk_queue_delay_max_ns) * 1e-9, l);
    }
  }
  for (int r = 0; r < static_cast<int>(transport::reject_reason::count_); ++r) {
    metric_labels l = me;
    l.emplace_back("reason", transport::to_string(static_cast<transport::reject_reason>(r)));
    page.counter("archipelago_wire_rejected_total",
                 "Inbound messages refused, by reason: malformed, oversized or corrupt; impersonation (the header "
                 "claims another sender than the connection's CURVE key is bound to); not_permitted (a body the "
                 "sender's role may not send).",
                 static_cast<double>(wire.rejected[r]), l);
  }
  page.counter("archipelago_wire_duplicates_total", "Inbound messages dropped as duplicates or from an old incarnation.",
               static_cast<double>(wire.duplicates + wire.stale_incarnation + wire.too_old), me);
  page.counter("archipelago_wire_peers_lost_total", "Peers declared silent (no control message or heartbeat within the liveness window).",
               static_cast<double>(wire.peers_died), me);
  page.counter("archipelago_wire_reconnects_total", "Reconnection attempts to silent peers.",
               static_cast<double>(wire.reconnects), me);
  page.counter("archipelago_wire_dropped_total", "Outbound messages dropped: the outbox or a peer's queue was full.",
               static_cast<double>(wire.outbox_full + wire.peer_queue_full), me);
  for (const auto& [outcome, n] : {std::pair{"accepted", wire.curve_accepted}, std::pair{"refused", wire.curve_refused}}) {
    metric_labels l = me;
    l.emplace_back("outcome", outcome);
    page.counter("archipelago_wire_curve_handshakes_total",
                 "CURVE handshakes of clients with this node: accepted, or refused (a key not on the allow-list).",
                 static_cast<double>(n), l);
  }
}

void count_wire(node_counters& counts, const transport::transport_counters& wire) {
  counts.peers_lost = wire.peers_died;
  for (int r = 0; r < static_cast<int>(transport::reject_reason::count_); ++r)
    if (wire.rejected[r] != 0) counts.refused[transport::to_string(static_cast<transport::reject_reason>(r))] = wire.rejected[r];
  for (const auto& [peer, link] : wire.links)
    counts.control_rtt_max_ns = std::max<std::uint64_t>(counts.control_rtt_max_ns, static_cast<std::uint64_t>(link.rtt_max_ns));
}

}  // namespace archipelago
