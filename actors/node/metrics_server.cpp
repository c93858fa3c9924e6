#include "node/metrics_server.hpp"

#include <httplib.h>

#include <thread>

#include "node/dashboard.hpp"

namespace archipelago {

struct metrics_server::impl {
  httplib::Server server;
  std::thread thread;
  int port = 0;
};

expected<std::unique_ptr<metrics_server>> metrics_server::start(const metrics_endpoint& where, handlers h,
                                                                logger& log) {
  const std::string& host = where.host;
  const int port = where.port;
  auto p = std::make_unique<impl>();
  auto& srv = p->server;
  // Scrapes are rare and small: two worker threads, and no request waits long.
  srv.new_task_queue = [] { return new httplib::ThreadPool(2); };
  srv.set_read_timeout(5, 0);
  srv.set_write_timeout(5, 0);
  srv.set_keep_alive_max_count(10);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which a
  // second node on the same port would bind too and take half the scrapes.
  srv.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  srv.Get("/metrics", [m = h.metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(m(), "text/plain; version=0.0.4; charset=utf-8");
  });
  srv.Get("/status", [s = h.status](const httplib::Request&, httplib::Response& res) {
    auto body = s ? s() : std::nullopt;
    if (!body) {
      res.status = 404;
      res.set_content("this node has no status page: ask the broker's --metrics-port\n", "text/plain");
      return;
    }
    res.set_content(*body, "application/json");
  });
  srv.Get("/node", [n = h.nodes](const httplib::Request&, httplib::Response& res) {
    res.set_content(n ? n() : "[]", "application/json");
  });
  srv.Get("/evals", [e = h.evals](const httplib::Request&, httplib::Response& res) {
    if (!e) {
      res.status = 404;
      res.set_content("this process does not evaluate the model\n", "text/plain");
      return;
    }
    res.set_content(e(), "application/json");
  });
  srv.Get("/", [dashboard = static_cast<bool>(h.status)](const httplib::Request&, httplib::Response& res) {
    if (dashboard) return res.set_content(dashboard_page(), "text/html; charset=utf-8");
    res.set_content("archipelago node: /metrics (Prometheus), /node (this process's roles: their own figures); "
                    "the broker's node also serves / (a live dashboard) and /status (its view of the mesh)\n",
                    "text/plain");
  });
  if (port == 0) {
    p->port = srv.bind_to_any_port(host);
    if (p->port < 0) return make_error(errc::invalid_input, "--metrics-port: cannot listen on " + host);
  } else {
    if (!srv.bind_to_port(host, port))
      return make_error(errc::invalid_input, "--metrics-port " + std::to_string(port) + ": cannot listen on " + host +
                                                 ":" + std::to_string(port) + " (in use?)");
    p->port = port;
  }
  p->thread = std::thread([&srv] { srv.listen_after_bind(); });
  log.info("node.metrics", "archipelago: metrics on http://%s:%d/metrics", host.c_str(), p->port);
  return std::unique_ptr<metrics_server>(new metrics_server(std::move(p)));
}

metrics_server::metrics_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

metrics_server::~metrics_server() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int metrics_server::port() const { return impl_->port; }

}  // namespace archipelago
