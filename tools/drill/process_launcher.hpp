#pragma once
// The processes of a mesh of `archipelago node` children: started with fork +
// exec on a thread of the launcher's own that lives as long as it (so
// PR_SET_PDEATHSIG kills them if the drill dies), killed with SIGKILL, paused
// with SIGSTOP and resumed with SIGCONT by that thread, reaped, stopped in
// order at the end; a lost host's store is removed with it. Every action is
// recorded with its pid and what /proc showed. Also the few things a launcher needs to reach its children: free
// loopback ports, an HTTP GET, their logs.

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chaos_monkey/fault_plan.hpp"
#include "core/error.hpp"
#include "drill/drill.hpp"

namespace archipelago {

/// One node of the mesh: its command and its current process.
struct node_child {
  std::string name;  // broker, shard-0, learner-2
  fault_target target;
  std::vector<std::string> argv;
  std::string db;  // broker, shard
  int metrics_port = 0;
  pid_t pid = -1;
  int starts = 0;
  std::string log;  // the current process's
  bool paused = false;
  std::chrono::steady_clock::time_point resume_at;
  bool exited = false;  // ended on its own (a learner done); its status below
  bool lost = false;    // its host is lost (lose_host): never started again
  int status = 0;
  std::uint64_t spawned_ms = 0;  // wall-clock ms just before its fork: its incarnation is at or after it
};

class process_launcher {
 public:
  /// Logs go to `logs_dir`/NAME.START.log; `drill_time` stamps the events (seconds, negative before the drill).
  process_launcher(std::vector<node_child> children, std::string logs_dir, std::function<double()> drill_time);
  ~process_launcher();
  process_launcher(const process_launcher&) = delete;
  process_launcher& operator=(const process_launcher&) = delete;

  /// Starts child `i` (on the launcher's thread); its pid, or an error.
  expected<pid_t> start(std::size_t i);
  /// SIGKILL and reap.
  void kill(std::size_t i);
  /// Its host is lost: SIGKILL, reap, its store directory (node_child::db) removed;
  /// start() refuses it from then on.
  void lose_host(std::size_t i);
  /// SIGSTOP now (seen in /proc), SIGCONT after `duration` by the launcher's thread.
  void pause(std::size_t i, nanos duration);
  /// Reaps children that ended on their own: a learner done (exit 0) is fine;
  /// any other exit is an error naming the node with its log's tail.
  status reap_exited();
  /// The end: every paused child resumed, then SIGTERM to the learners (they finish
  /// their step, send Leave and print their summary), then the shards (their last
  /// versions made durable), then the broker; a child that does not exit within
  /// `grace` is killed. Every child is reaped.
  void stop_all(std::chrono::seconds grace);

  /// The child for a fault's target; npos if none.
  std::size_t find(const fault_target& t) const;
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  /// A copy of every child, as it is now.
  std::vector<node_child> children() const;
  /// Every learner finished its steps and exited on its own (none is down for a restart).
  bool learners_done() const;
  std::vector<drill_process_event> events() const;

 private:
  expected<pid_t> spawn(node_child& c);
  void event(const node_child& c, const char* action, pid_t pid, std::string detail);
  static void reap(node_child& c, std::chrono::steady_clock::duration bound);
  void loop();

  std::vector<node_child> children_;  // guarded by mutex_
  std::string logs_;
  std::function<double()> drill_time_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<expected<pid_t>()>> jobs_;
  bool quit_ = false;
  std::vector<drill_process_event> events_;
  std::thread thread_;  // last: it starts once everything above is built
};

/// `count` distinct loopback ports free right now, which the nodes bind soon after.
/// Taken below the kernel's ephemeral range (ip_local_port_range): the mesh's own
/// outgoing connections draw their local ports from that range and could take one
/// between this pick and a node's bind (a node then exits: "cannot listen ... in use").
expected<std::vector<int>> free_loopback_ports(std::size_t count);

/// GET http://127.0.0.1:PORT/PATH within `timeout_ms`; nullopt unless it answers 200.
std::optional<std::string> http_get(int port, const char* path, int timeout_ms);

/// The last `bytes` of a log file.
std::string log_tail(const std::string& path, std::size_t bytes = 1500);

}  // namespace archipelago
