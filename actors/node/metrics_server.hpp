#pragma once
// A node's HTTP side door (`--metrics-port`): GET /metrics serves Prometheus
// text, GET /node the process's roles' own figures (a JSON array of node
// statuses, core/node_status.hpp), GET /status the broker's view of the mesh as
// JSON, and where there is one, GET / the live dashboard over it (dashboard.hpp)
// and GET /evals the eval curve. It runs on threads
// of its own and only calls the handlers it was given; httplib stays out of
// every other translation unit.

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/error.hpp"
#include "core/log.hpp"

namespace archipelago {

/// Where a node serves /metrics and /status (`--metrics-port`): port -1 nowhere, 0 any free port.
struct metrics_endpoint {
  std::string host = "0.0.0.0";
  int port = -1;
};

class metrics_server {
 public:
  struct handlers {
    std::function<std::string()> metrics;
    /// nullopt: this node has no status page (only the broker has one): 404.
    std::function<std::optional<std::string>()> status;
    /// A JSON array of the node statuses of this process's roles.
    std::function<std::string()> nodes;
    /// The global model's eval loss so far, [[tokens, nats/byte], ...]: a process that
    /// evaluates it (`run`). Empty: 404.
    std::function<std::string()> evals;
  };

  /// Binds host:port (port 0: any free one) and serves until destroyed. A port
  /// in use or a bad host is invalid_input naming it.
  /// Says where it listens on `log` ("metrics on http://HOST:PORT/metrics"), for whoever asked for port 0.
  static expected<std::unique_ptr<metrics_server>> start(const metrics_endpoint& where, handlers h, logger& log);
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  int port() const;

 private:
  struct impl;
  explicit metrics_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace archipelago
