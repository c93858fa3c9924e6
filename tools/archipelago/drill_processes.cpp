#include "drill_processes.hpp"

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
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <future>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "learner/learner_core.hpp"
#include "learner/model/trainer.hpp"
#include "node/mesh_snapshots.hpp"
#include "transport/curve_keys.hpp"

namespace archipelago::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

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

/// `count` distinct loopback ports free right now, which the nodes bind soon after.
/// Taken below the kernel's ephemeral range (ip_local_port_range): the mesh's own
/// outgoing connections draw their local ports from that range and could take one
/// between this pick and a node's bind (a node then exits: "cannot listen ... in use").
expected<std::vector<int>> free_ports(std::size_t count) {
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

/// The samples of a Prometheus text page we read: name → [(labels, value)].
using prom_page = std::multimap<std::string, std::pair<std::string, double>>;
prom_page parse_prometheus(const std::string& text) {
  prom_page out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    if (space == std::string::npos) continue;
    std::string key = line.substr(0, space), labels;
    if (const auto brace = key.find('{'); brace != std::string::npos) {
      labels = key.substr(brace);
      key.resize(brace);
    }
    out.emplace(key, std::make_pair(labels, std::strtod(line.c_str() + space + 1, nullptr)));
  }
  return out;
}

std::string label(const std::string& labels, const std::string& key) {
  const std::string k = key + "=\"";
  const auto at = labels.find(k);
  if (at == std::string::npos) return {};
  const auto end = labels.find('"', at + k.size());
  return labels.substr(at + k.size(), end - at - k.size());
}

double metric_sum(const prom_page& page, const std::string& name) {
  double sum = 0;
  for (auto [it, end] = page.equal_range(name); it != end; ++it) sum += it->second.second;
  return sum;
}

std::uint64_t incarnation_of(const prom_page& page) {
  auto it = page.find("archipelago_node_info");
  return it == page.end() ? 0 : std::strtoull(label(it->second.first, "incarnation").c_str(), nullptr, 10);
}

/// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z'...); '?' if unreadable.
char proc_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? '?' : text[paren + 2];
}

std::string log_tail(const std::string& path, std::size_t bytes = 1500) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

std::optional<json> last_json_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::optional<json> out;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded()) out = std::move(j);
    }
  return out;
}

/// One node of the mesh: its command and its current process.
struct child {
  std::string name;  // broker, shard-0, learner-2
  fault_target target;
  std::vector<std::string> argv;
  std::string db;  // broker, shard
  int metrics_port = 0;
  pid_t pid = -1;
  int starts = 0;
  std::string log;  // the current incarnation's
  bool paused = false;
  std::chrono::steady_clock::time_point resume_at;
  bool exited = false;  // ended on its own (a learner done); its status below
  int status = 0;
  // What the sampler last saw of the current incarnation.
  std::uint64_t inc = 0, steps = 0, tokens = 0, overruns = 0;
  std::uint64_t spawned_ms = 0;  // wall-clock ms just before its fork: its incarnation is at or after it
  std::vector<std::uint64_t> versions;  // shard: per fragment of the mesh (0: not its)

  /// A learner's counters from a scrape of the current incarnation; they only grow,
  /// so a scrape older than one already taken changes nothing.
  void learner_seen(const prom_page& p) {
    auto grow = [&](std::uint64_t& v, const char* name) {
      v = std::max<std::uint64_t>(v, static_cast<std::uint64_t>(metric_sum(p, name)));
    };
    grow(steps, "archipelago_learner_steps_total");
    grow(tokens, "archipelago_learner_tokens_total");
    grow(overruns, "archipelago_learner_budget_overruns_total");
  }
};

/// The launcher of a many-process mesh: owns the children (process_control for
/// the chaos monkey). Processes are forked on one thread of its own that lives
/// as long as it, so PR_SET_PDEATHSIG kills them if the drill dies; the same
/// thread resumes paused processes when their pause is over.
class child_processes final : public process_control {
 public:
  child_processes(std::vector<child> children, std::string logs, mesh_drill& drill, const clock_source& clock,
                  std::vector<std::uint32_t> shard_of_fragment, std::size_t learners)
      : children_(std::move(children)), logs_(std::move(logs)), drill_(drill), clock_(clock),
        fragments_(shard_of_fragment.size()), shard_of_fragment_(std::move(shard_of_fragment)),
        steps_before_(learners, 0), tokens_before_(learners, 0), thread_([this] { loop(); }) {
    for (child& c : children_) c.versions.assign(fragments_, 0);
  }

  ~child_processes() override {
    stop_all(std::chrono::seconds(0));
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  /// Starts a node (on the launcher's thread); its pid, or an error.
  expected<pid_t> start(std::size_t i) {
    return on_thread([this, i] { return spawn(children_[i]); });
  }

  void crash(const fault_target& t) override {
    std::unique_lock lock(mutex_);
    child* c = find(t);
    if (!c || c->pid < 0) return;
    if (t.kind == role::learner && !c->paused) {
      // The steps it counted right before it dies (the sampler's may be up to a poll older).
      const int port = c->metrics_port;
      lock.unlock();
      auto page = http_get(port, "/metrics", 500);
      lock.lock();
      if (page) {
        const prom_page p = parse_prometheus(*page);
        c->learner_seen(p);
        if (const auto inc = incarnation_of(p)) c->inc = inc;
      }
    }
    const pid_t pid = c->pid;
    ::kill(pid, SIGKILL);
    reap(*c, std::chrono::seconds(10));
    event(*c, "kill", pid, "SIGKILL; " + std::string(c->pid < 0 ? "reaped" : "NOT reaped"));
    c->paused = false;
    if (t.kind == role::learner) {
      steps_before_[t.index] += c->steps;
      tokens_before_[t.index] += c->tokens;
      overruns_killed_ += c->overruns;
      std::lock_guard record(drill_.mutex);
      drill_.killed.push_back({t.index, c->inc, c->steps});
      killed_spans_.push_back({c->spawned_ms, wall_ms()});
    }
    if (t.kind == role::parameter_shard) durable_at_kill_[t.index] = durable_versions(*c);
    c->inc = 0;
    c->steps = c->tokens = c->overruns = 0;
  }

  void restart(const fault_target& t) override {
    child* c = nullptr;
    {
      std::lock_guard lock(mutex_);
      c = find(t);
      if (!c || c->pid >= 0) return;
    }
    const auto i = static_cast<std::size_t>(c - children_.data());
    auto pid = on_thread([this, i] { return spawn(children_[i]); });
    if (!pid) {
      std::fprintf(stderr, "archipelago drill: cannot restart %s: %s\n", c->name.c_str(), pid.err().message.c_str());
      return;
    }
    mesh_drill::restart r{t, 0, 0, 0, 0};
    {
      std::lock_guard started(drill_.log.mutex);
      r.at_ns = clock_.now() - drill_.log.started_ns;
    }
    std::lock_guard lock(mutex_);
    std::lock_guard record(drill_.mutex);
    drill_.restarts.push_back(r);
    pending_restarts_.push_back({drill_.restarts.size() - 1, i, children_[i].spawned_ms});
  }

  void pause(const fault_target& t, nanos duration) override {
    {
      std::lock_guard lock(mutex_);
      child* c = find(t);
      if (!c || c->pid < 0 || c->paused) return;
      ::kill(c->pid, SIGSTOP);
      // SIGSTOP lands asynchronously: the process is seen stopped within a moment.
      char state = '?';
      for (int k = 0; k < 200 && (state = proc_state(c->pid)) != 'T'; ++k)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      c->paused = true;
      c->resume_at = std::chrono::steady_clock::now() + std::chrono::nanoseconds(duration);
      event(*c, "stop", c->pid, std::string("SIGSTOP; /proc state ") + state);
    }
    wake_.notify_all();
  }

  /// Polls every node once: the sampler's figures, and who died on their own.
  /// An error names a node that exited unexpectedly (with its log's tail).
  status poll(drill_sample& s, std::map<std::pair<std::uint32_t, std::uint64_t>, nanos>& first_merged) {
    // The endpoints to ask, read under the lock; the asking without it (a crash may run meanwhile).
    struct ask {
      std::size_t i;
      int port;
      std::uint64_t starts;
    };
    std::vector<ask> asks;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < children_.size(); ++i) {
        child& c = children_[i];
        if (c.pid >= 0 && !c.paused) {
          int st = 0;
          if (::waitpid(c.pid, &st, WNOHANG) == c.pid) {
            const bool learner_done = c.target.kind == role::learner && WIFEXITED(st) && WEXITSTATUS(st) == 0;
            event(c, "exit", c.pid, "status " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)));
            c.pid = -1;
            c.exited = true;
            c.status = st;
            if (!learner_done)
              return make_error(errc::io_error, c.name + " exited on its own (status " + std::to_string(st) +
                                                    "); the end of its log " + c.log + ":\n" + log_tail(c.log));
            continue;
          }
          asks.push_back({i, c.metrics_port, static_cast<std::uint64_t>(c.starts)});
        }
      }
    }
    std::vector<std::optional<std::string>> pages(asks.size());
    std::optional<std::string> status_page;
    {  // every node at once: a learner answers between its steps, so one by one would add up
      std::vector<std::future<std::optional<std::string>>> asked;
      for (const ask& a : asks)
        asked.push_back(std::async(std::launch::async, [port = a.port] { return http_get(port, "/metrics", 1000); }));
      for (const ask& a : asks)
        if (children_[a.i].target.kind == role::sync_broker) status_page = http_get(a.port, "/status", 1000);
      for (std::size_t k = 0; k < asks.size(); ++k) pages[k] = asked[k].get();
    }
    std::lock_guard lock(mutex_);
    for (std::size_t k = 0; k < asks.size(); ++k) {
      child& c = children_[asks[k].i];
      if (!pages[k] || c.starts != static_cast<int>(asks[k].starts) || c.pid < 0) continue;
      const prom_page p = parse_prometheus(*pages[k]);
      const std::uint64_t inc = incarnation_of(p);
      if (c.target.kind == role::learner) {
        c.learner_seen(p);
      } else if (c.target.kind == role::parameter_shard) {
        for (auto [it, end] = p.equal_range("archipelago_fragment_version"); it != end; ++it) {
          const auto f = std::strtoul(label(it->second.first, "fragment").c_str(), nullptr, 10);
          if (f < c.versions.size()) c.versions[f] = static_cast<std::uint64_t>(it->second.second);
        }
        if (inc != 0 && inc != c.inc) shard_back(c);
      }
      if (inc) c.inc = inc;
    }
    if (status_page) {
      auto j = json::parse(*status_page, nullptr, false);
      if (!j.is_discarded()) {
        const auto binc = j.value("incarnation", std::uint64_t{0});
        const auto closed = j.value("rounds_closed", std::uint64_t{0});
        if (binc != broker_inc_) {
          rounds_before_ += rounds_seen_;  // a restarted broker counts its rounds anew
          rounds_seen_ = 0;
          broker_inc_ = binc;
        }
        rounds_seen_ = std::max(rounds_seen_, closed);
        if (j.contains("ledger")) merged_tokens_ = j["ledger"].value("merged", std::uint64_t{0});
        if (j.contains("learners"))
          for (const auto& l : j["learners"])
            if (l.value("merged_tokens", std::uint64_t{0}) > 0)
              first_merged.emplace(std::make_pair(l.value("learner", 0u), l.value("incarnation", std::uint64_t{0})),
                                   clock_.now());
      }
    }
    s.rounds = rounds_before_ + rounds_seen_;
    s.shard_committed.clear();
    s.learner_steps.clear();
    s.tokens = 0;
    for (const child& c : children_) {
      if (c.target.kind == role::parameter_shard) {
        std::uint64_t sum = 0;
        for (auto v : c.versions) sum += v;
        s.shard_committed.push_back(sum);
      }
      if (c.target.kind == role::learner) {
        const std::size_t l = c.target.index;
        s.learner_steps.push_back(steps_before_[l] + c.steps);
        s.tokens += tokens_before_[l] + c.tokens;
      }
    }
    s.published = 0;
    for (auto v : s.shard_committed) s.published += v;
    return {};
  }

  /// The end: every paused node resumed, the learners told to leave (SIGTERM: they
  /// finish their step, send Leave and print their summary), then the shards (their
  /// last versions made durable), then the broker (its ledger); whatever does not
  /// exit within `grace` is killed. Every child is reaped.
  void stop_all(std::chrono::seconds grace) {
    std::lock_guard lock(mutex_);
    for (child& c : children_)
      if (c.pid >= 0 && c.paused) {
        ::kill(c.pid, SIGCONT);
        c.paused = false;
        event(c, "cont", c.pid, "teardown");
      }
    for (role r : {role::learner, role::parameter_shard, role::sync_broker}) {
      for (child& c : children_)
        if (c.target.kind == r && c.pid >= 0) ::kill(c.pid, SIGTERM);
      for (child& c : children_)
        if (c.target.kind == r && c.pid >= 0) {
          const pid_t pid = c.pid;
          reap(c, grace);
          if (c.pid >= 0) {
            ::kill(c.pid, SIGKILL);
            reap(c, std::chrono::seconds(10));
            event(c, "kill", pid, "teardown: no exit within the grace time");
          } else {
            event(c, "exit", pid, "status " + std::to_string(WIFEXITED(c.status) ? WEXITSTATUS(c.status) : 128 + WTERMSIG(c.status)));
          }
        }
    }
  }

  std::vector<child>& children() { return children_; }
  /// Every learner has finished its steps and exited on its own (none is down for a restart).
  bool learners_done() {
    std::lock_guard lock(mutex_);
    return std::all_of(children_.begin(), children_.end(),
                       [](const child& c) { return c.target.kind != role::learner || (c.pid < 0 && c.exited); });
  }
  std::vector<drill_process_event> events() {
    std::lock_guard lock(mutex_);
    return events_;
  }
  std::uint64_t merged_tokens() {
    std::lock_guard lock(mutex_);
    return merged_tokens_;
  }

  /// Budget overruns of the killed learner incarnations (their last scrape).
  std::uint64_t overruns_killed() {
    std::lock_guard lock(mutex_);
    return overruns_killed_;
  }
  /// When each killed learner (drill.killed, in order) was started and killed, wall-clock ms.
  struct lifetime {
    std::uint64_t spawned_ms, killed_ms;
  };
  std::vector<lifetime> killed_spans() {
    std::lock_guard lock(mutex_);
    return killed_spans_;
  }

  /// Each restart's wall-clock time (ms): a node's incarnation is its start's wall-clock ms.
  struct pending_restart {
    std::size_t row, child;
    std::uint64_t spawned_ms;
  };
  std::vector<pending_restart> restarts_done() {
    std::lock_guard lock(mutex_);
    return pending_restarts_;
  }

 private:
  static std::uint64_t wall_ms() {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
  }

  child* find(const fault_target& t) {
    for (child& c : children_)
      if (c.target.kind == t.kind && (t.kind == role::sync_broker || c.target.index == t.index)) return &c;
    return nullptr;
  }

  void event(const child& c, const char* action, pid_t pid, std::string detail) {
    nanos zero = -1;
    {
      std::lock_guard started(drill_.log.mutex);
      zero = drill_.log.started_ns;
    }
    const double t = zero < 0 ? -1 : static_cast<double>(clock_.now() - zero) * 1e-9;
    events_.push_back({t, c.name, action, std::move(detail), static_cast<int>(pid)});
  }

  /// Waits (bounded) for the child to end; c.pid is -1 once reaped.
  static void reap(child& c, std::chrono::steady_clock::duration bound) {
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

  /// A shard's newest durable fragment versions, read from its store once its process is gone.
  std::vector<std::uint64_t> durable_versions(const child& c) const {
    std::vector<std::uint64_t> out(fragments_, 0);
    auto store = open_store_read_only(c.db);
    if (!store) return out;
    auto head = (*store)->latest_manifest();
    if (!head || !*head) return out;
    for (const auto& e : (*head)->entries)
      if (e.fragment < out.size() && shard_of_fragment_[e.fragment] == c.target.index) out[e.fragment] = e.version;
    return out;
  }

  /// A restarted shard's first page: the versions it restored against what its store held durable.
  void shard_back(child& c) {
    auto d = durable_at_kill_.find(c.target.index);
    if (d == durable_at_kill_.end()) return;
    for (auto& p : pending_restarts_) {
      if (p.child != static_cast<std::size_t>(&c - children_.data()) || p.row == static_cast<std::size_t>(-1)) continue;
      std::lock_guard record(drill_.mutex);
      auto& r = drill_.restarts[p.row];
      for (std::size_t f = 0; f < d->second.size() && f < c.versions.size(); ++f)
        if (d->second[f] > c.versions[f]) r.versions_lost += d->second[f] - c.versions[f];
      std::uint64_t mesh = 0;
      for (auto v : c.versions) mesh += v;
      r.restored_version = mesh;
      p.row = static_cast<std::size_t>(-1);  // checked
    }
    durable_at_kill_.erase(d);
  }

  /// fork + exec on this launcher's own thread; the child is in a process group of
  /// its own (a Ctrl-C reaches the drill, which stops it) and dies with the drill.
  expected<pid_t> spawn(child& c) {
    c.spawned_ms = wall_ms();
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
    std::lock_guard lock(mutex_);
    c.pid = pid;
    ++c.starts;
    c.exited = false;
    c.inc = c.steps = c.tokens = 0;
    event(c, "start", pid, c.starts > 1 ? "restart " + std::to_string(c.starts - 1) : "");
    return pid;
  }

  template <class F>
  expected<pid_t> on_thread(F job) {
    std::packaged_task<expected<pid_t>()> task(std::move(job));
    auto result = task.get_future();
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(task));
    }
    wake_.notify_all();
    if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
      return make_error(errc::timeout, "the launcher's thread did not start the process within 30 s");
    return result.get();
  }

  void loop() {
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
      for (child& c : children_)
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

  std::vector<child> children_;
  std::string logs_;
  mesh_drill& drill_;
  const clock_source& clock_;
  std::size_t fragments_;
  std::vector<std::uint32_t> shard_of_fragment_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<expected<pid_t>()>> jobs_;
  bool quit_ = false;
  std::vector<drill_process_event> events_;
  std::map<std::uint32_t, std::vector<std::uint64_t>> durable_at_kill_;
  std::vector<pending_restart> pending_restarts_;
  std::vector<lifetime> killed_spans_;
  std::vector<std::uint64_t> steps_before_, tokens_before_;
  std::uint64_t overruns_killed_ = 0;  // budget overruns of killed learners, as last scraped
  std::uint64_t broker_inc_ = 0, rounds_before_ = 0, rounds_seen_ = 0, merged_tokens_ = 0;
  std::thread thread_;  // last: it starts once everything above is built
};


/// Θ at the end, read out of the shards' stores (each holds its own fragments), evaluated.
expected<eval_result> evaluate_stores(const config& cfg, const mesh_setup& layout, const std::vector<std::string>& dbs) {
  auto data = load_dataset(cfg.data, cfg.mesh.learners, layout.shape.context, cfg.train.seed);
  if (!data) return data.err();
  std::vector<float> theta(layout.layout.total_floats, 0.f);
  learner_core scatterer(layout.layout, layout.plan, {});
  std::vector<bool> seen(layout.plan.fragments.size(), false);
  for (std::size_t s = 0; s < dbs.size(); ++s) {
    auto store = open_store_read_only(dbs[s]);
    if (!store) return store.err();
    auto head = (*store)->latest_manifest();
    if (!head) return head.err();
    if (!*head) return make_error(errc::not_found, dbs[s] + " holds no snapshot");
    for (const auto& e : (*head)->entries) {
      if (e.fragment >= seen.size() || layout.shard_of_fragment[e.fragment] != s) continue;
      auto f = (*store)->read_fragment(e.fragment, e.version);
      if (!f) return make_error(f.err().code, dbs[s] + ": " + f.err().message);
      scatterer.scatter({e.fragment}, f->theta.data(), theta.data());
      seen[e.fragment] = true;
    }
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end())
    return make_error(errc::not_found, "the shards' stores do not hold every fragment");
  set_compute_threads(1);
  engine evaluator(cfg, layout.shape, *data, 0);
  std::copy(theta.begin(), theta.end(), evaluator.model().params());
  return evaluator.evaluate();
}

struct process_run {
  mesh_summary summary;
  std::vector<drill_sample> samples;
  std::vector<drill_process_event> events;
};

/// One run of the mesh as processes, with the chaos monkey walking drill.timeline
/// (empty: the fault-free reference). `dir` receives the stores and the logs.
expected<process_run> run_processes(const config& cfg, const sync_policy& policy, const fs::path& dir,
                                    const std::string& binary, mesh_drill& drill, const mesh_progress& progress,
                                    const std::function<bool()>& stop_requested) {
  const int m = cfg.mesh.learners, shards = policy.shards;
  std::error_code ec;
  fs::create_directories(dir / "logs", ec);
  if (ec) return make_error(errc::io_error, "cannot create " + (dir / "logs").string() + ": " + ec.message());
  const std::string toml = (dir / "mesh.toml").string();
  std::ofstream(toml) << to_toml(cfg);

  auto picked = free_ports(static_cast<std::size_t>(2 * (1 + shards + m)));
  if (!picked) return picked.err();
  const std::vector<int>& ports = *picked;
  auto tcp = [](int port) { return "tcp://127.0.0.1:" + std::to_string(port); };
  mesh_setup setup = make_mesh_setup(cfg, policy);
  setup.broker_endpoint = tcp(ports[0]);
  std::string shard_list;
  for (int s = 0; s < shards; ++s) {
    setup.shard_endpoints.push_back(tcp(ports[1 + s]));
    shard_list += (s ? "," : "") + setup.shard_endpoints.back();
  }
  for (int l = 0; l < m; ++l) setup.learner_endpoints.push_back(tcp(ports[1 + shards + l]));

  // With wire.curve, every node gets a keypair of its own (the learners share one, as
  // learners that come and go would) and the chaos monkey one too; every node allows
  // the public keys of the run's key directory and finds its peers' there by name.
  const fs::path keys = dir / "keys";
  auto key_flags = [&](const std::string& name) -> std::vector<std::string> {
    if (!cfg.wire.curve) return {};
    return {"--set", "wire.key_file=" + (keys / (name + ".key")).string(), "--set", "wire.allow=" + keys.string()};
  };
  if (cfg.wire.curve) {
    fs::create_directories(keys, ec);
    if (ec) return make_error(errc::io_error, "cannot create " + keys.string() + ": " + ec.message());
    fs::permissions(keys, fs::perms::owner_all, ec);
    std::vector<std::string> names{"broker", "learner", "chaos"};
    for (int s = 0; s < shards; ++s) names.push_back("shard-" + std::to_string(s));
    for (const auto& name : names) {
      auto pair = transport::generate_keypair();
      if (!pair) return pair.err();
      if (auto ok = transport::save_keypair(keys.string(), name, *pair); !ok) return ok.err();
    }
    setup.cfg.wire.key_file = (keys / "chaos.key").string();
    setup.cfg.wire.allow = keys.string();
  }

  std::vector<child> children;
  std::vector<std::string> shard_dbs;
  auto add = [&](std::string name, role kind, std::uint32_t index, int slot) {
    child c;
    c.name = std::move(name);
    c.target = {kind, index};
    c.metrics_port = ports[1 + shards + m + slot];
    c.argv = {binary, "node", "--role", kind == role::sync_broker ? "broker" : kind == role::parameter_shard ? "shard" : "learner",
              "--index", std::to_string(index), "--config", toml, "--broker", setup.broker_endpoint, "--shards",
              shard_list, "--metrics-host", "127.0.0.1", "--metrics-port", std::to_string(c.metrics_port), "--json"};
    const auto curve = key_flags(kind == role::learner ? "learner" : c.name);
    c.argv.insert(c.argv.end(), curve.begin(), curve.end());
    if (kind == role::learner) {
      c.argv.insert(c.argv.end(), {"--listen", setup.learner_endpoints[index]});
    } else {
      c.db = (dir / (c.name + ".db")).string();
      c.argv.insert(c.argv.end(), {"--db", c.db});
      if (kind == role::parameter_shard) shard_dbs.push_back(c.db);
    }
    children.push_back(std::move(c));
  };
  add("broker", role::sync_broker, 0, 0);
  for (int s = 0; s < shards; ++s) add("shard-" + std::to_string(s), role::parameter_shard, static_cast<std::uint32_t>(s), 1 + s);
  for (int l = 0; l < m; ++l) add("learner-" + std::to_string(l), role::learner, static_cast<std::uint32_t>(l), 1 + shards + l);

  steady_clock_source clock;
  process_run out;
  std::map<std::pair<std::uint32_t, std::uint64_t>, nanos> first_merged;  // (learner, incarnation) → first seen merged
  const auto tokens_per_step = [&] {
    double sum = 0;
    for (int l = 0; l < m; ++l) sum += learner_profile_of(cfg, l).batch;
    return sum / m * setup.shape.context;
  }();
  const double step_s = cfg.mesh.step_time_ms * 1e-3;

  caf::actor_system_config sys_cfg;
  sys_cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{sys_cfg};
  caf::actor chaos;
  // Declared after the actor system: the launcher (whose pause/crash the chaos monkey
  // calls) outlives the chaos monkey, which is stopped below before it goes.
  auto launcher = std::make_unique<child_processes>(std::move(children), (dir / "logs").string(), drill, clock,
                                                    setup.shard_of_fragment, static_cast<std::size_t>(m));
  auto fail = [&](error e) -> error {
    if (chaos) {
      caf::scoped_actor self{sys};
      self->monitor(chaos);
      self->send_exit(chaos, caf::exit_reason::user_shutdown);
      self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(10)) >> [] {});
    }
    launcher->stop_all(std::chrono::seconds(5));
    return e;
  };
  auto wait_up = [&](std::size_t first, std::size_t count, double bound_s, const char* what) -> status {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(bound_s);
    for (std::size_t i = first; i < first + count; ++i)
      for (;;) {
        drill_sample scratch;
        if (auto ok = launcher->poll(scratch, first_merged); !ok) return ok.err();
        if (http_get(launcher->children()[i].metrics_port, "/metrics", 1000)) break;
        if (stop_requested()) return make_error(errc::timeout, "stopped by a signal while the mesh started");
        if (std::chrono::steady_clock::now() > until)
          return make_error(errc::timeout, launcher->children()[i].name + " did not serve /metrics within " +
                                               std::to_string(static_cast<int>(bound_s)) + " s (" + what + "); its log " +
                                               launcher->children()[i].log + ":\n" + log_tail(launcher->children()[i].log));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    return {};
  };
  for (std::size_t i = 0; i < 1 + static_cast<std::size_t>(shards); ++i)
    if (auto pid = launcher->start(i); !pid) return fail(pid.err());
  if (auto ok = wait_up(0, 1 + shards, 60, "broker and shards"); !ok) return fail(ok.err());
  // The run's span, for goodput, starts with the learners (the ledger counts their work from there).
  const auto learners_started = std::chrono::steady_clock::now();
  for (std::size_t i = 1 + shards; i < launcher->children().size(); ++i)
    if (auto pid = launcher->start(i); !pid) return fail(pid.err());
  if (auto ok = wait_up(1 + shards, m, 90, "learners"); !ok) return fail(ok.err());
  if (progress) progress("mesh of processes up: broker, " + std::to_string(shards) + " shards, " + std::to_string(m) + " learners");

  chaos = spawn_chaos_monkey(sys, setup, "tcp://127.0.0.1:0", drill.timeline, drill.safety_ns, *launcher, drill.log, clock);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const double run_s = cfg.train.time_limit_s;
  // As in one process: the run ends at its time limit, or once every learner has done its steps.
  while (elapsed() < run_s && !stop_requested() && !launcher->learners_done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    drill_sample s;
    if (auto ok = launcher->poll(s, first_merged); !ok) return fail(ok.err());
    nanos zero = -1;
    {
      std::lock_guard lock(drill.log.mutex);
      zero = drill.log.started_ns;
    }
    if (zero < 0) continue;
    s.t_s = static_cast<double>(clock.now() - zero) * 1e-9;
    s.merged_step_time_s = static_cast<double>(launcher->merged_tokens()) / tokens_per_step * step_s;
    s.learners_down = drill.log.learners_down.load();
    s.shards_down = drill.log.shards_down.load();
    s.broker_down = drill.log.broker_down.load();
    if (progress) {
      char line[256];
      std::snprintf(line, sizeof line, "%.0fs  rounds %llu  versions %llu  tokens %llu  down: %d learners, %d shards%s",
                    elapsed(), static_cast<unsigned long long>(s.rounds), static_cast<unsigned long long>(s.published),
                    static_cast<unsigned long long>(s.tokens), s.learners_down, s.shards_down,
                    s.broker_down ? ", broker" : "");
      progress(line);
    }
    out.samples.push_back(std::move(s));
  }
  out.summary.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - learners_started).count();
  {  // no fault and no restart from here on
    caf::scoped_actor self{sys};
    self->monitor(chaos);
    self->send_exit(chaos, caf::exit_reason::user_shutdown);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::seconds(30)) >> [] {});
    chaos = caf::actor{};
  }
  // The clocks: the broker reports wall-clock times; the drill's are steady.
  const double unix_now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const nanos steady_now = clock.now();
  launcher->stop_all(std::chrono::seconds(60));
  out.events = launcher->events();

  // The broker's last incarnation's summary: the ledger and its record of every learner incarnation.
  const auto& kids = launcher->children();
  auto broker_json = last_json_line(kids[0].log);
  if (!broker_json || !(*broker_json)["ledger"].is_object() || !(*broker_json)["learners"].is_array())
    return make_error(errc::io_error, "the broker printed no summary with its ledger; the end of its log " + kids[0].log + ":\n" +
                                          log_tail(kids[0].log));
  mesh_summary& sum = out.summary;
  broker_report& b = sum.broker;
  const json& bl = (*broker_json)["ledger"];
  b.ledger.processed = bl.value("processed", std::uint64_t{0});
  b.ledger.merged = bl.value("merged", std::uint64_t{0});
  b.ledger.late = bl.value("late", std::uint64_t{0});
  b.ledger.lost = bl.value("lost", std::uint64_t{0});
  b.ledger.rejected = bl.value("rejected", std::uint64_t{0});
  b.uptime = broker_json->value("uptime", 1.0);
  const double broker_start_unix = broker_json->value("started_unix_ms", 0.0) / 1000;
  auto steady_of = [&](double since_start_s) -> nanos {
    if (since_start_s < 0) return -1;
    return steady_now - static_cast<nanos>((unix_now - (broker_start_unix + since_start_s)) * 1e9);
  };
  const auto tps = static_cast<std::uint64_t>(std::llround(tokens_per_step));
  for (const auto& rec : (*broker_json)["learners"]) {
    learner_record r;
    r.who.learner = learner_index{rec.value("learner", 0u)};
    r.who.inc = incarnation{rec.value("incarnation", std::uint64_t{0})};
    r.ledger.processed = rec.value("processed", std::uint64_t{0});
    r.ledger.merged = rec.value("merged", std::uint64_t{0});
    r.ledger.merged_step_time_s = rec.value("merged_step_time_s", 0.0);
    r.ledger.steps = tps ? r.ledger.processed / tps : 0;
    r.joined_ns = steady_of(rec.value("joined_s", -1.0));
    r.first_merged_ns = steady_of(rec.value("first_merged_s", -1.0));
    r.left_ns = steady_of(rec.value("left_s", -1.0));
    // A restarted broker restores the ledger, not when an incarnation was first merged: the polls saw it.
    if (auto seen = first_merged.find({r.who.learner.value, r.who.inc.value}); seen != first_merged.end() &&
        (r.first_merged_ns < 0 || seen->second < r.first_merged_ns))
      r.first_merged_ns = seen->second;
    b.ledger.merged_step_time_s += r.ledger.merged_step_time_s;
    b.ledger.steps += r.ledger.steps;
    b.learners.push_back(r);
  }
  auto record = [&](std::uint32_t l, std::uint64_t inc) -> const learner_record* {
    for (const auto& r : b.learners)
      if (r.who.learner.value == l && r.who.inc.value == inc) return &r;
    return nullptr;
  };

  // Which incarnation each kill and restart was: a node's incarnation is its start's wall-clock ms.
  {
    const auto killed = launcher->killed_spans();
    const auto restarts_done = launcher->restarts_done();
    std::lock_guard lock(drill.mutex);
    for (std::size_t k = 0; k < drill.killed.size(); ++k) {
      auto& kl = drill.killed[k];
      if (kl.incarnation != 0 || k >= killed.size()) continue;
      // Never scraped: the broker's record of an incarnation that started within this
      // process's life, if it ever joined (one killed before joining has none: 0 stays).
      for (const auto& r : b.learners)
        if (r.who.learner.value == kl.learner && r.who.inc.value >= killed[k].spawned_ms &&
            r.who.inc.value <= killed[k].killed_ms)
          kl.incarnation = r.who.inc.value;
    }
    for (const auto& p : restarts_done) {
      auto& rs = drill.restarts[p.row == static_cast<std::size_t>(-1) ? 0 : p.row];
      if (p.row == static_cast<std::size_t>(-1) || rs.target.kind != role::learner) continue;
      std::uint64_t best = 0;
      for (const auto& r : b.learners)
        if (r.who.learner.value == rs.target.index && r.who.inc.value >= p.spawned_ms && (!best || r.who.inc.value < best))
          best = r.who.inc.value;
      rs.incarnation = best;
    }
  }

  // The learners' own count: every incarnation that ended with a summary, plus, for
  // the killed ones, at least what they counted last or what the broker heard.
  std::uint64_t tokens = 0, steps = 0;
  for (const auto& entry : fs::directory_iterator(dir / "logs")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("learner-", 0) != 0) continue;
    if (auto j = last_json_line(entry.path().string())) {
      tokens += j->value("tokens", std::uint64_t{0});
      steps += j->value("steps", std::uint64_t{0});
      sum.budget_overruns += j->value("budget_overruns", std::uint64_t{0});
    }
  }
  {
    std::lock_guard lock(drill.mutex);
    for (const auto& k : drill.killed) {
      const learner_record* r = record(k.learner, k.incarnation);
      const std::uint64_t st = std::max(k.steps, r ? r->ledger.steps : 0);
      steps += st;
      tokens += st * tps;
    }
  }
  sum.budget_overruns += launcher->overruns_killed();
  sum.tokens = tokens;
  sum.steps = steps;
  sum.mode = cfg.mesh.mode;
  sum.learners = m;
  sum.shards = shards;
  sum.fragments = static_cast<int>(setup.plan.fragments.size());
  sum.rounds = out.samples.empty() ? 0 : out.samples.back().rounds;
  sum.published = out.samples.empty() ? 0 : out.samples.back().published;
  sum.committed = broker_json->value("committed", std::uint64_t{0});
  sum.ledger_exact = b.ledger.balanced() && b.ledger.processed == sum.tokens;
  sum.goodput = sum.wall_s > 0 ? b.ledger.merged_step_time_s / (m * sum.wall_s) : 0;
  auto eval = evaluate_stores(cfg, setup, shard_dbs);
  if (!eval) return make_error(eval.err().code, "evaluating Θ from the shards' stores: " + eval.err().message);
  sum.eval_loss = eval->loss;
  sum.eval_bpb = eval->bits_per_byte;
  sum.eval_curve.emplace_back(b.ledger.processed, eval->loss);
  return out;
}

}  // namespace

expected<drill_report> run_process_drill(const config& base, const drill_options& o, const std::string& binary,
                                         const mesh_progress& progress, const std::function<bool()>& stop_requested) {
  auto plan = load_drill_plan(base, o);
  if (!plan) return plan.err();
  auto policy = resolve_policy(base);
  if (!policy) return policy.err();
  const double step_ms = base.mesh.step_time_ms > 0 ? base.mesh.step_time_ms : calibrate_step_time_ms(base);
  config cfg = drill_config(base, *plan, step_ms);
  if (auto ok = validate_mesh(cfg); !ok) return ok.err();
  const mesh_setup layout = make_mesh_setup(cfg, *policy);

  auto area = drill_work_area::open(o.work_dir);
  if (!area) return area.err();
  drill_report r = new_drill_report(o, cfg, *plan, *policy, step_ms);
  r.processes = true;
  if (o.reference) {
    auto d = (*area)->fresh("reference");
    if (!d) return d.err();
    mesh_drill none;
    none.safety_ns = plan->duration_ns;
    auto ref = run_processes(cfg, *policy, *d, binary, none, phase_progress(progress, "reference (no faults)"), stop_requested);
    if (!ref) {
      (*area)->keep = true;
      return make_error(ref.err().code, "the fault-free reference run: " + ref.err().message + " (logs kept in " +
                                            (*d / "logs").string() + ")");
    }
    r.reference = std::move(ref->summary);
    if (stop_requested()) return make_error(errc::timeout, "stopped by a signal during the reference run");
  }
  auto d = (*area)->fresh("drill");
  if (!d) return d.err();
  mesh_drill drill;
  drill.timeline = expand_fault_plan(*plan, cfg.mesh.learners);
  drill.safety_ns = plan->duration_ns;
  auto run = run_processes(cfg, *policy, *d, binary, drill, phase_progress(progress, "drill"), stop_requested);
  if (!run) {
    (*area)->keep = true;
    return make_error(run.err().code, "the drill: " + run.err().message + " (logs kept in " + (*d / "logs").string() + ")");
  }
  r.run = std::move(run->summary);
  r.samples = std::move(run->samples);
  r.process_events = std::move(run->events);
  r.chaos_commands = drill.log.commands_sent.load();
  r.chaos_commands_failed = drill.log.commands_failed.load();
  finish_drill_report(r, drill, cfg, layout);
  return r;
}

}  // namespace archipelago::cli
