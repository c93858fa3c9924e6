// archipelago_wan_relay: the delay line of the network-namespace test bed
// (deploy/netns/testbed.py). A kernel may lack netem (docs/operating/wan-testbed.md), so the
// test bed's hub namespace routes every packet between hosts through a TUN
// device; this process reads each packet, holds it for the one-way delay of its
// source's and its destination's access links, and writes it back, where the
// kernel routes it on to the destination's veth (rate-limited there by tbf).
// Every packet is delayed, TCP's ACKs included, so congestion control sees a
// real WAN round trip.
//
//   archipelago_wan_relay --tun NAME --delay CIDR=MS [--delay CIDR=MS ...] [--max-queue-mb N]
//
// A packet's delay is the sum of the first entry matching its IPv4 source and
// the first matching its destination (0 for no match, or a non-IPv4 packet).
// Packets leave in order of their due time, ties in arrival order, so a flow
// is never reordered. The bytes held are bounded (a router's queue): beyond
// --max-queue-mb a packet is dropped. SIGTERM or SIGINT ends the relay, which
// then prints one JSON line of counters.

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <queue>
#include <string>
#include <vector>

namespace {

struct route_delay {
  std::uint32_t network = 0, mask = 0;  // host byte order
  std::int64_t delay_ns = 0;
};

struct held_packet {
  std::int64_t due_ns;
  std::uint64_t seq;
  std::vector<unsigned char> bytes;
  bool operator>(const held_packet& o) const { return due_ns != o.due_ns ? due_ns > o.due_ns : seq > o.seq; }
};

volatile std::sig_atomic_t stop_signal = 0;
void on_signal(int sig) { stop_signal = sig; }

std::int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "archipelago_wan_relay: %s\nusage: archipelago_wan_relay --tun NAME --delay CIDR=MS "
               "[--delay CIDR=MS ...] [--max-queue-mb N]\n",
               what.c_str());
  std::exit(2);
}

// "10.213.1.0/24=5.5" -> {network, mask, 5.5 ms}
route_delay parse_delay(const std::string& arg) {
  const auto slash = arg.find('/'), eq = arg.find('=');
  if (slash == std::string::npos || eq == std::string::npos || eq < slash)
    usage_error("--delay " + arg + ": expected CIDR=MS, e.g. 10.213.1.0/24=5");
  in_addr addr{};
  if (inet_pton(AF_INET, arg.substr(0, slash).c_str(), &addr) != 1)
    usage_error("--delay " + arg + ": '" + arg.substr(0, slash) + "' is not an IPv4 address");
  char* end = nullptr;
  const long bits = std::strtol(arg.c_str() + slash + 1, &end, 10);
  if (end != arg.c_str() + eq || bits < 0 || bits > 32) usage_error("--delay " + arg + ": prefix length must be 0-32");
  const double ms = std::strtod(arg.c_str() + eq + 1, &end);
  if (*end != '\0' || end == arg.c_str() + eq + 1 || !(ms >= 0 && ms <= 60'000))
    usage_error("--delay " + arg + ": the delay must be a number of milliseconds in [0, 60000]");
  route_delay r;
  r.mask = bits == 0 ? 0 : ~std::uint32_t{0} << (32 - bits);
  r.network = ntohl(addr.s_addr) & r.mask;
  r.delay_ns = static_cast<std::int64_t>(ms * 1e6);
  return r;
}

std::int64_t delay_of(const std::vector<route_delay>& routes, std::uint32_t ip) {
  for (const auto& r : routes)
    if ((ip & r.mask) == r.network) return r.delay_ns;
  return 0;
}

std::uint32_t ipv4_at(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

int main(int argc, char** argv) {
  std::string tun_name;
  std::vector<route_delay> routes;
  std::size_t max_queue_bytes = std::size_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage_error(a + ": missing its value");
    const std::string v = argv[++i];
    if (a == "--tun") tun_name = v;
    else if (a == "--delay") routes.push_back(parse_delay(v));
    else if (a == "--max-queue-mb") {
      char* end = nullptr;
      const long mb = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || mb < 1 || mb > 65536) usage_error("--max-queue-mb " + v + ": expected 1-65536");
      max_queue_bytes = static_cast<std::size_t>(mb) << 20;
    } else usage_error("unknown option " + a);
  }
  if (tun_name.empty() || tun_name.size() >= IFNAMSIZ) usage_error("--tun NAME is required (at most 15 characters)");

  // Attaches to the TUN device the test bed created in this namespace (ip tuntap add);
  // TUNSETIFF would silently create a new one where there is none.
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, tun_name.c_str(), IFNAMSIZ - 1);
  const int probe = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const bool exists = probe >= 0 && ioctl(probe, SIOCGIFINDEX, &ifr) == 0;
  if (probe >= 0) close(probe);
  if (!exists) {
    std::fprintf(stderr, "archipelago_wan_relay: no device %s in this network namespace (create it with "
                 "ip tuntap add dev %s mode tun)\n", tun_name.c_str(), tun_name.c_str());
    return 1;
  }
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "archipelago_wan_relay: cannot open /dev/net/tun: %s\n", std::strerror(errno));
    return 1;
  }
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    std::fprintf(stderr, "archipelago_wan_relay: cannot attach to TUN device %s: %s\n", tun_name.c_str(),
                 std::strerror(errno));
    return 1;
  }
  // ppoll's wake-ups are otherwise late by the default 50 µs timer slack.
  prctl(PR_SET_TIMERSLACK, 1000UL);
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // Blocked except inside ppoll, so a signal can never slip in before the wait.
  sigset_t stop_set, wait_mask;
  sigemptyset(&stop_set);
  sigaddset(&stop_set, SIGTERM);
  sigaddset(&stop_set, SIGINT);
  sigprocmask(SIG_BLOCK, &stop_set, &wait_mask);

  std::priority_queue<held_packet, std::vector<held_packet>, std::greater<>> held;
  std::uint64_t seq = 0, packets = 0, bytes = 0, dropped = 0, write_errors = 0;
  std::size_t queued_bytes = 0, max_queued_bytes = 0;
  std::vector<unsigned char> buffer(65536);
  std::printf("{\"relay\":\"ready\",\"tun\":\"%s\"}\n", tun_name.c_str());
  std::fflush(stdout);

  while (!stop_signal) {
    const std::int64_t now = now_ns();
    // Due packets first, so a burst of arrivals cannot starve departures.
    while (!held.empty() && held.top().due_ns <= now) {
      const held_packet& p = held.top();
      if (write(fd, p.bytes.data(), p.bytes.size()) < 0) ++write_errors;
      queued_bytes -= p.bytes.size();
      held.pop();
    }
    for (int burst = 0; burst < 256; ++burst) {  // bounded, so departures stay on time
      const ssize_t n = read(fd, buffer.data(), buffer.size());
      if (n < 0 && errno != EAGAIN && errno != EINTR) {  // the device or its namespace went away
        std::fprintf(stderr, "archipelago_wan_relay: read from %s: %s\n", tun_name.c_str(), std::strerror(errno));
        return 1;
      }
      if (n <= 0) break;
      ++packets;
      bytes += static_cast<std::uint64_t>(n);
      if (queued_bytes + static_cast<std::size_t>(n) > max_queue_bytes) {
        ++dropped;
        continue;
      }
      std::int64_t delay = 0;
      if (n >= 20 && (buffer[0] >> 4) == 4)
        delay = delay_of(routes, ipv4_at(&buffer[12])) + delay_of(routes, ipv4_at(&buffer[16]));
      held.push({now_ns() + delay, seq++, std::vector<unsigned char>(buffer.begin(), buffer.begin() + n)});
      queued_bytes += static_cast<std::size_t>(n);
      if (queued_bytes > max_queued_bytes) max_queued_bytes = queued_bytes;
    }
    pollfd pfd{fd, POLLIN, 0};
    timespec timeout{1, 0};
    if (!held.empty()) {
      const std::int64_t wait = held.top().due_ns - now_ns();
      if (wait <= 0) continue;
      if (wait < 1'000'000'000) timeout = {0, static_cast<long>(wait)};
    }
    if (ppoll(&pfd, 1, &timeout, &wait_mask) < 0 && errno != EINTR) {
      std::fprintf(stderr, "archipelago_wan_relay: poll: %s\n", std::strerror(errno));
      return 1;
    }
    if (pfd.revents & (POLLERR | POLLHUP | POLLNVAL)) {
      std::fprintf(stderr, "archipelago_wan_relay: the TUN device %s went away\n", tun_name.c_str());
      return 1;
    }
  }
  std::printf(
      "{\"relay\":\"stopped\",\"tun\":\"%s\",\"packets\":%llu,\"bytes\":%llu,\"dropped\":%llu,"
      "\"write_errors\":%llu,\"max_queued_bytes\":%zu}\n",
      tun_name.c_str(), static_cast<unsigned long long>(packets), static_cast<unsigned long long>(bytes),
      static_cast<unsigned long long>(dropped), static_cast<unsigned long long>(write_errors), max_queued_bytes);
  close(fd);
  return 0;
}
