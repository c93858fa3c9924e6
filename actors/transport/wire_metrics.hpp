#pragma once
// The part of a node's Prometheus page (GET /metrics) every role shares: its
// identity and uptime, and its transport's links. Each role adds its own
// figures after these.

#include "core/clock.hpp"
#include "core/ids.hpp"
#include "core/node_status.hpp"
#include "core/prometheus_text.hpp"
#include "transport/transport.hpp"

namespace archipelago {

/// {role, index}: the labels every sample of one actor carries.
metric_labels role_labels(node_address self);

/// The actor's identity and uptime, and its transport: bytes and messages per
/// link (peer), rejected and duplicate messages, peers lost, reconnects; with
/// `logs`, the lines its process's logger wrote and those its rate limit cut.
void add_node_metrics(prometheus_text& page, node_address self, incarnation inc, nanos up_ns,
                      const transport::transport_counters& wire, const logger* logs = nullptr);

/// The transport's figures a node's status carries: peers declared dead, the
/// control lane's longest round trip, inbound messages rejected by reason.
void count_wire(node_counters& counts, const transport::transport_counters& wire);

}  // namespace archipelago
