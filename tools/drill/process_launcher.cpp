#include "drill/process_launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace archipelago {
namespace {

/// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z'...); '?' if unreadable.
char proc_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? '?' : text[paren + 2];
}

/// Whether a listener could bind 127.0.0.1:`port` right now.
bool loopback_port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return free;
}

std::string exit_text(int status) {
  return "status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

}  // namespace

process_launcher::process_launcher(std::vector<node_child> children, std::string logs_dir,
                                   std::function<double()> drill_time)
    : children_(std::move(children)), logs_(std::move(logs_dir)), drill_time_(std::move(drill_time)),
      thread_([this] { loop(); }) {}

process_launcher::~process_launcher() {
  stop_all(std::chrono::seconds(0));
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

expected<pid_t> process_launcher::start(std::size_t i) {
  std::packaged_task<expected<pid_t>()> task([this, i] { return spawn(children_[i]); });
  auto result = task.get_future();
  {
    std::lock_guard lock(mutex_);
    if (children_[i].pid >= 0) return children_[i].pid;
    if (children_[i].lost) return make_error(errc::invalid_input, children_[i].name + "'s host is lost: it is never started again");
    jobs_.push_back(std::move(task));
  }
  wake_.notify_all();
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    return make_error(errc::timeout, "the launcher's thread did not start the process within 30 s");
  return result.get();
}

void process_launcher::kill(std::size_t i) {
  std::lock_guard lock(mutex_);
  node_child& c = children_[i];
  if (c.pid < 0) return;
  const pid_t pid = c.pid;
  ::kill(pid, SIGKILL);
  reap(c, std::chrono::seconds(10));
  event(c, "kill", pid, "SIGKILL; " + std::string(c.pid < 0 ? "reaped" : "NOT reaped"));
  c.paused = false;
}

void process_launcher::lose_host(std::size_t i) {
  std::lock_guard lock(mutex_);
  node_child& c = children_[i];
  if (c.lost) return;
  c.lost = true;
  const pid_t pid = c.pid;
  if (pid >= 0) {
    ::kill(pid, SIGKILL);
    reap(c, std::chrono::seconds(10));
    c.paused = false;
  }
  std::error_code ec;
  const bool had_store = !c.db.empty() && std::filesystem::exists(c.db, ec);
  if (!c.db.empty()) std::filesystem::remove_all(c.db, ec);
  event(c, "lost", pid,
        std::string(pid < 0 ? "not running" : c.pid < 0 ? "SIGKILL; reaped" : "SIGKILL; NOT reaped") + "; store " +
            (c.db.empty() ? "none" : c.db + (ec ? " NOT removed: " + ec.message() : had_store ? " removed" : " absent")));
}

void process_launcher::pause(std::size_t i, nanos duration) {
  {
    std::lock_guard lock(mutex_);
    node_child& c = children_[i];
    if (c.pid < 0 || c.paused) return;
    ::kill(c.pid, SIGSTOP);
    // SIGSTOP lands asynchronously: the process is seen stopped within a moment.
    char state = '?';
    for (int k = 0; k < 200 && (state = proc_state(c.pid)) != 'T'; ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    c.paused = true;
    c.resume_at = std::chrono::steady_clock::now() + std::chrono::nanoseconds(duration);
    event(c, "stop", c.pid, std::string("SIGSTOP; /proc state ") + state);
  }
  wake_.notify_all();
}

status process_launcher::reap_exited() {
  std::lock_guard lock(mutex_);
  for (node_child& c : children_) {
    if (c.pid < 0 || c.paused) continue;
    int st = 0;
    if (::waitpid(c.pid, &st, WNOHANG) != c.pid) continue;
    const bool learner_done = c.target.kind == role::learner && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    event(c, "exit", c.pid, exit_text(st));
    c.pid = -1;
    c.exited = true;
    c.status = st;
    if (!learner_done)
      return make_error(errc::io_error, c.name + " exited on its own (status " + std::to_string(st) +
                                            "); the end of its log " + c.log + ":\n" + log_tail(c.log));
  }
  return {};
}

void process_launcher::stop_all(std::chrono::seconds grace) {
  std::lock_guard lock(mutex_);
  for (node_child& c : children_)
    if (c.pid >= 0 && c.paused) {
      ::kill(c.pid, SIGCONT);
      c.paused = false;
      event(c, "cont", c.pid, "teardown");
    }
  for (role r : {role::learner, role::parameter_shard, role::sync_broker}) {
    for (node_child& c : children_)
      if (c.target.kind == r && c.pid >= 0) ::kill(c.pid, SIGTERM);
    for (node_child& c : children_) {
      if (c.target.kind != r || c.pid < 0) continue;
      const pid_t pid = c.pid;
      reap(c, grace);
      if (c.pid >= 0) {
        ::kill(c.pid, SIGKILL);
        reap(c, std::chrono::seconds(10));
        event(c, "kill", pid, "teardown: no exit within the grace time");
      } else {
        event(c, "exit", pid, exit_text(c.status));
      }
    }
  }
}

std::size_t process_launcher::find(const fault_target& t) const {
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < children_.size(); ++i) {
    const node_child& c = children_[i];
    if (c.target.kind == t.kind && c.target.index == t.index) return i;
  }
  return npos;
}

std::vector<node_child> process_launcher::children() const {
  std::lock_guard lock(mutex_);
  return children_;
}

bool process_launcher::learners_done() const {
  std::lock_guard lock(mutex_);
  return std::all_of(children_.begin(), children_.end(),
                     [](const node_child& c) { return c.target.kind != role::learner || (c.pid < 0 && c.exited); });
}

std::vector<drill_process_event> process_launcher::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

void process_launcher::event(const node_child& c, const char* action, pid_t pid, std::string detail) {
  events_.push_back({drill_time_(), c.name, action, std::move(detail), static_cast<int>(pid)});
}

/// Waits (bounded) for the child to end; c.pid is -1 once reaped.
void process_launcher::reap(node_child& c, std::chrono::steady_clock::duration bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(c.pid, &st, WNOHANG);
    if (r == c.pid || (r < 0 && errno == ECHILD)) {
      c.pid = -1;
      c.status = st;
      return;
    }
    if (std::chrono::steady_clock::now() >= until) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

/// fork + exec on the launcher's own thread; the child is in a process group of
/// its own (a Ctrl-C reaches the drill, which stops it) and dies with the drill.
expected<pid_t> process_launcher::spawn(node_child& c) {
  std::lock_guard lock(mutex_);
  c.spawned_ms = static_cast<std::uint64_t>(wall_clock_ns() / 1'000'000);
  c.log = logs_ + "/" + c.name + "." + std::to_string(c.starts + 1) + ".log";
  const int fd = ::open(c.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(errc::io_error, "cannot create " + c.log);
  std::vector<char*> argv;
  for (auto& a : c.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    return make_error(errc::io_error, "fork failed for " + c.name);
  }
  if (pid == 0) {  // only async-signal-safe calls from here to exec
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fd);
  c.pid = pid;
  ++c.starts;
  c.exited = false;
  event(c, "start", pid, c.starts > 1 ? "restart " + std::to_string(c.starts - 1) : "");
  return pid;
}

void process_launcher::loop() {
  std::unique_lock lock(mutex_);
  while (!quit_) {
    while (!jobs_.empty()) {
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
    auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    for (node_child& c : children_)
      if (c.paused && c.pid >= 0) {
        if (c.resume_at <= std::chrono::steady_clock::now()) {
          ::kill(c.pid, SIGCONT);
          c.paused = false;
          event(c, "cont", c.pid, std::string("SIGCONT; /proc state ") + proc_state(c.pid));
        } else {
          next = std::min(next, c.resume_at);
        }
      }
    wake_.wait_until(lock, next);
  }
}

expected<std::vector<int>> free_loopback_ports(std::size_t count) {
  constexpr int lowest = 10000;
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  const int span = ephemeral_low - lowest;
  if (span < static_cast<int>(count)) return make_error(errc::io_error, "no loopback ports below the ephemeral range");
  std::vector<int> out;
  // Probing starts at a place set by the pid, so that two drills at once rarely meet.
  const int start = static_cast<int>((static_cast<long>(::getpid()) * 7919) % span);
  for (int k = 0; k < span && out.size() < count; ++k)
    if (const int port = lowest + (start + k) % span; loopback_port_free(port)) out.push_back(port);
  if (out.size() < count) return make_error(errc::io_error, "cannot find " + std::to_string(count) + " free loopback ports");
  return out;
}

std::optional<std::string> http_get(int port, const char* path, int timeout_ms) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(0, 300'000);
  c.set_read_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  c.set_write_timeout(1, 0);
  auto res = c.Get(path);
  if (!res || res->status != 200) return std::nullopt;
  return res->body;
}

std::string log_tail(const std::string& path, std::size_t bytes) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

}  // namespace archipelago
