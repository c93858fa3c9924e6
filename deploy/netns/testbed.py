#!/usr/bin/env python3
"""A multi-host WAN test bed on one machine: network namespaces, veth links,
tbf rate limits, and a userspace delay relay (needs root).

One namespace per host -- BED-broker (the sync broker and the parameter
shards) and BED-l0 .. BED-l{M-1} (one learner each) -- each joined by a veth
pair to a hub namespace, BED-hub, which routes between them. Every access link
has a rate (tbf on both ends of its veth: the host's upload and its download)
and a one-way delay: the hub sends every packet between hosts through a TUN
device served by archipelago_wan_relay, which holds it for the delay of its
source's plus its destination's access link (no netem: a kernel may lack it, see
docs/operating/wan-testbed.md). Hosts A and B thus see an RTT of 2 * (delay_A + delay_B).

  testbed.py run  [--learners 3] [--steps 300] [--rate-mbit 1000] [--delay-ms 5] [--json]
      build the bed, measure a link (RTT, throughput), train a mesh across the
      hosts, print what happened, tear everything down (also on failure or signal)
  testbed.py up   [...]      build the bed and leave it (ip netns exec BED-l0 ...)
  testbed.py down BED        tear one bed down: its processes, namespaces, links
  testbed.py cleanup [--prefix archnet]   tear down every bed of a prefix (leftovers)

Example:
  deploy/netns/testbed.py run --learners 3 --steps 300 --rate-mbit 100 --delay-ms 10 \\
      --link l2=20/40 --json
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from launch import last_json  # noqa: E402  (deploy/launch.py)

BROKER_PORT = 7000      # the broker; shard s listens on BROKER_PORT + 1 + s
LEARNER_PORT = 7100
PROBE_PORT = 7999
HOST_IF = "wan"         # the host's end of its access link (and the hub's TUN device)
TUN_TXQUEUE = 10000     # packets the kernel may queue for the relay
TCP_COUNTERS = ("TcpRetransSegs", "TcpExtTCPTimeouts")


class TestbedError(Exception):
    pass


class Interrupted(Exception):
    pass


def sh(*cmd, check=True, timeout=30):
    """Runs a setup command; a failure names the command and what it printed."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise TestbedError(f"'{cmd[0]}' not found (apt-get install iproute2)")
    except subprocess.TimeoutExpired:
        raise TestbedError(f"'{' '.join(cmd)}' did not finish within {timeout} s")
    if check and out.returncode != 0:
        raise TestbedError(f"'{' '.join(cmd)}' failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def namespaces():
    return [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]


def bed_pattern(bed):
    return re.compile(re.escape(bed) + r"-(hub|broker|l\d+)$")


def teardown(names, grace_s=5.0):
    """Ends every process inside the namespaces (SIGTERM, then SIGKILL after
    grace_s), then deletes them; their veths and TUN devices go with them."""
    pids = set()
    for ns in names:
        pids.update(int(p) for p in sh("ip", "netns", "pids", ns, check=False).split())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace_s
    while pids and time.time() < deadline:
        pids = {p for p in pids if os.path.exists(f"/proc/{p}") and not zombie(p)}
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for ns in names:
        sh("ip", "netns", "del", ns, check=False)
    left = sorted(set(names) & set(namespaces()))
    if left:
        raise TestbedError(f"could not delete namespaces {left}")


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


class Host:
    def __init__(self, bed, name, index, rate_mbit, delay_ms):
        self.name = name                      # broker, l0, l1, ...
        self.ns = f"{bed}-{name}"
        self.index = index                    # its /24: 10.B.index.0
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms              # one-way, this access link
        self.hub_if = f"h{index}"

    def addr(self, subnet):
        return f"{subnet}.{self.index}.2"


class Testbed:
    """The namespaces, links and relay of one bed. Everything lives inside the
    bed's namespaces (nothing is created in the root namespace), so deleting
    them removes every link, and `ip netns pids` finds every process."""

    def __init__(self, bed, hosts, args):
        self.bed = bed
        self.hosts = hosts
        self.subnet = args.subnet
        self.mtu = args.mtu
        self.relay_binary = args.relay
        self.burst_ms = getattr(args, "burst_ms", None)  # None: the default burst (see add_host)
        self.hub = f"{bed}-hub"
        self.relay = None
        self.relay_log = None
        self.processes = []  # every Popen started in the bed

    def names(self):
        return [self.hub] + [h.ns for h in self.hosts]

    def up(self, log_dir):
        existing = set(namespaces())
        if existing & set(self.names()):
            raise TestbedError(f"namespaces of bed {self.bed} exist already (testbed.py down {self.bed})")
        sh("ip", "netns", "add", self.hub)
        sh("ip", "-n", self.hub, "link", "set", "lo", "up")
        for h in self.hosts:
            self.add_host(h)
        # The TUN device the relay serves; the hub sends every packet from a host into it.
        sh("ip", "-n", self.hub, "tuntap", "add", "dev", HOST_IF, "mode", "tun")
        sh("ip", "-n", self.hub, "link", "set", HOST_IF, "mtu", str(self.mtu), "txqueuelen", str(TUN_TXQUEUE), "up")
        sh("ip", "-n", self.hub, "route", "add", "default", "dev", HOST_IF, "table", "100")
        for h in self.hosts:
            # From a host: to the relay. From the relay: the main table, to the destination's veth.
            sh("ip", "-n", self.hub, "rule", "add", "iif", h.hub_if, "lookup", "100", "pref", "100")
        # Packets come back from the TUN device with sources routed elsewhere: no reverse-path filter.
        self.sysctl(self.hub, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                    f"net.ipv4.conf.{HOST_IF}.rp_filter=0", "net.ipv4.conf.all.send_redirects=0",
                    "net.ipv6.conf.all.disable_ipv6=1", "net.ipv4.ip_forward=1")
        self.start_relay(log_dir)

    def add_host(self, h):
        sh("ip", "netns", "add", h.ns)
        sh("ip", "link", "add", HOST_IF, "netns", h.ns, "mtu", str(self.mtu), "type", "veth",
           "peer", "name", h.hub_if, "netns", self.hub, "mtu", str(self.mtu))
        sh("ip", "-n", h.ns, "addr", "add", f"{h.addr(self.subnet)}/24", "dev", HOST_IF)
        sh("ip", "-n", self.hub, "addr", "add", f"{self.subnet}.{h.index}.1/24", "dev", h.hub_if)
        for ns, dev in ((h.ns, "lo"), (h.ns, HOST_IF), (self.hub, h.hub_if)):
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", h.ns, "route", "add", "default", "via", f"{self.subnet}.{h.index}.1")
        # tbf: exact (docs/operating/wan-testbed.md). The burst must hold the
        # largest packet; about 5 ms at the rate beyond that keeps the rate exact over short spans.
        # burst_ms (the WAN race) bounds it by time instead of the 256 KiB floor, which on a
        # link of a few Mbit/s would let half a megabyte pass at line speed.
        rate_bytes_s = h.rate_mbit * 1e6 / 8
        if self.burst_ms is None:
            burst = int(max(4 * self.mtu, 256 * 1024, rate_bytes_s * 0.005))
        else:
            burst = int(max(4 * self.mtu, rate_bytes_s * self.burst_ms / 1e3))
        for ns, dev in ((h.ns, HOST_IF), (self.hub, h.hub_if)):
            sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{h.rate_mbit}mbit",
               "burst", str(burst), "latency", "50ms")
        # Bandwidth x delay can exceed the default 4 MiB TCP window; ZeroMQ leaves buffers to autotuning.
        self.sysctl(h.ns, "net.ipv4.tcp_wmem=4096 65536 33554432", "net.ipv4.tcp_rmem=4096 131072 33554432",
                    "net.ipv6.conf.all.disable_ipv6=1")

    @staticmethod
    def sysctl(ns, *settings):
        sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", *settings)

    def start_relay(self, log_dir):
        cmd = [self.relay_binary, "--tun", HOST_IF]
        for h in self.hosts:
            cmd += ["--delay", f"{self.subnet}.{h.index}.0/24={h.delay_ms}"]
        self.relay_log = os.path.join(log_dir, "relay.log")
        self.relay = self.spawn(self.hub, cmd, self.relay_log)
        deadline = time.time() + 10
        while time.time() < deadline:
            if (last_json(self.relay_log) or {}).get("relay") == "ready":
                return
            if self.relay.poll() is not None:
                raise TestbedError(f"the relay exited with {self.relay.returncode}: {open(self.relay_log).read()}")
            time.sleep(0.02)
        raise TestbedError("the relay did not start within 10 s")

    def stop_relay(self):
        """The relay's counters (its last line), after it stopped."""
        if self.relay and self.relay.poll() is None:
            self.relay.send_signal(signal.SIGTERM)
            try:
                self.relay.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait()
        return last_json(self.relay_log) if self.relay_log else None

    def spawn(self, ns, cmd, log):
        # A session of its own: a terminal's Ctrl-C reaches the test bed, which stops things in order.
        with open(log, "w") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.processes.append(proc)
        return proc

    def counters(self):
        """Bytes and tbf drops per host: sent = its upload, received = its download."""
        out = {}
        for h in self.hosts:
            link = json.loads(sh("ip", "-j", "-s", "-n", h.ns, "link", "show", "dev", HOST_IF))[0]["stats64"]
            up = json.loads(sh("tc", "-j", "-s", "-n", h.ns, "qdisc", "show", "dev", HOST_IF))[0]
            down = json.loads(sh("tc", "-j", "-s", "-n", self.hub, "qdisc", "show", "dev", h.hub_if))[0]
            tcp = json.loads(sh("ip", "netns", "exec", h.ns, "nstat", "-asz", "--json", *TCP_COUNTERS))["kernel"]
            out[h.name] = {"sent": link["tx"]["bytes"], "received": link["rx"]["bytes"],
                           "drops": up.get("drops", 0) + down.get("drops", 0), "tcp": tcp}
        return out

    def down(self):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut it short
            signal.signal(sig, signal.SIG_IGN)
        self.stop_relay()
        teardown([ns for ns in self.names() if ns in namespaces()])
        for proc in self.processes:
            if proc.poll() is None:
                proc.wait(timeout=5)


# ---- link probe: RTT and throughput between two hosts ----------------------------

def probe_serve(args):
    """Serves probe connections; each is read to its end, then answered with the
    bytes received and the span from first to last byte (the receiver's view)."""
    srv = socket.create_server((args.host, args.port))
    srv.settimeout(30)
    print(json.dumps({"probe": "ready"}), flush=True)
    served = 0
    while served < args.connections:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(30)
            total, first, last = 0, None, None
            while True:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                last = time.monotonic()
                first = first or last
                total += len(chunk)
            if total:  # RTT probes connect and close without data
                conn.sendall(json.dumps({"bytes": total, "span_s": last - first}).encode())
                served += 1


def probe_send(args):
    rtts = []
    for _ in range(args.rtt_samples):
        t0 = time.monotonic()
        with socket.create_connection((args.host, args.port), timeout=10):
            rtts.append(time.monotonic() - t0)  # connect() returns after the SYN-ACK: one round trip
    with socket.create_connection((args.host, args.port), timeout=30) as conn:
        block = b"\0" * (1 << 20)
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)
        reply = json.loads(conn.recv(4096).decode())
    span = reply["span_s"]
    print(json.dumps({"rtt_ms": [round(r * 1e3, 3) for r in rtts], "bytes": reply["bytes"], "span_s": span,
                      "mbit_s": reply["bytes"] * 8 / span / 1e6 if span > 0 else None}))


def measure_links(bed, server, clients, seconds, log_dir):
    """From each client host to the server host: TCP connect RTT (5 samples; the
    minimum is reported) and the throughput of a `seconds`-long transfer."""
    me = os.path.abspath(__file__)
    log = os.path.join(log_dir, "probe-server.log")
    srv = bed.spawn(server.ns, [sys.executable, me, "_probe-serve", "--host", server.addr(bed.subnet),
                                "--port", str(PROBE_PORT), "--connections", str(len(clients))], log)
    deadline = time.time() + 10
    while (last_json(log) or {}).get("probe") != "ready":
        if srv.poll() is not None or time.time() > deadline:
            raise TestbedError(f"the probe server did not start: {open(log).read()}")
        time.sleep(0.02)
    results = {}
    try:
        for c in clients:
            out = subprocess.run(["ip", "netns", "exec", c.ns, sys.executable, me, "_probe-send", "--host",
                                  server.addr(bed.subnet), "--port", str(PROBE_PORT), "--seconds", str(seconds)],
                                 capture_output=True, text=True, timeout=seconds + 30)
            r = last_json_text(out.stdout)
            if out.returncode != 0 or not r:
                raise TestbedError(f"link probe {c.name} -> {server.name} failed: {out.stderr.strip()}")
            results[c.name] = {"to": server.name, "rtt_ms": min(r["rtt_ms"]),
                               "rtt_configured_ms": 2 * (c.delay_ms + server.delay_ms),
                               "mbit_s": r["mbit_s"], "cap_mbit_s": min(c.rate_mbit, server.rate_mbit)}
    finally:
        if len(results) < len(clients):  # it still waits for the probes that failed
            srv.kill()
        srv.wait(timeout=10)
    return results


def last_json_text(text):
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


# ---- the mesh across the bed ----------------------------------------------------

def run_mesh(bed, args, log_dir, learner_args=(), should_stop=None):
    """Starts the broker and shards on the broker host and a learner on each other host, and
    waits until the learners finish (or --duration, --timeout, a failure, or should_stop(t0)
    returning True, asked about once a second); then stops every node in order."""
    broker_host, learner_hosts = bed.hosts[0], bed.hosts[1:]
    broker_ip = broker_host.addr(bed.subnet)
    broker_ep = f"tcp://{broker_ip}:{BROKER_PORT}"
    shard_eps = ",".join(f"tcp://{broker_ip}:{BROKER_PORT + 1 + s}" for s in range(args.shards))
    common = ["--broker", broker_ep, "--shards", shard_eps, "--learners", str(args.learners), "--steps",
              str(args.steps), "--mode", args.mode, "--set", f"mesh.shards={args.shards}", "--json"]
    keys = make_keys(args, log_dir) if args.curve else None
    common += ["--set", "wire.curve=true", "--set", f"wire.allow={keys}"] if keys else ["--set", "wire.curve=false"]
    for knob in args.set:
        common += ["--set", knob]
    roles = {}  # name -> (Popen, log)

    def start(name, ns, role, index, *extra):
        log = os.path.join(log_dir, f"{name}.log")
        cmd = [args.binary, "node", "--role", role, "--index", str(index), *common, *extra]
        if keys:
            cmd += ["--set", f"wire.key_file={os.path.join(keys, name + '.key')}"]
        roles[name] = (bed.spawn(ns, cmd, log), log)

    start("broker", broker_host.ns, "broker", 0)
    for s in range(args.shards):
        start(f"shard-{s}", broker_host.ns, "shard", s, "--db", os.path.join(log_dir, f"shard-{s}.db"))
    time.sleep(0.5)
    before = bed.counters()
    t0 = time.time()
    for i, h in enumerate(learner_hosts):
        start(f"learner-{i}", h.ns, "learner", i, "--listen", f"tcp://{h.addr(bed.subnet)}:{LEARNER_PORT}",
              *learner_args)
    failure = None
    asked = t0
    while True:
        if args.duration and time.time() - t0 >= args.duration:
            break
        if should_stop and time.time() - asked >= 1.0:
            asked = time.time()
            if should_stop(t0):
                break
        if time.time() - t0 > args.timeout:
            failure = f"the learners did not finish within --timeout {args.timeout:.0f} s"
            break
        failed = [(n, p.returncode, log) for n, (p, log) in roles.items() if p.poll() not in (None, 0)]
        if failed:
            failure = f"{failed[0][0]} exited with {failed[0][1]}; its log: {failed[0][2]}"
            break
        if all(roles[f"learner-{i}"][0].poll() == 0 for i in range(args.learners)):
            break
        time.sleep(0.1)
    train_s = time.time() - t0
    after = bed.counters()
    # Learners first (each leaves after its step and reports it), then the shards and the broker.
    for group in ([n for n in roles if n.startswith("learner-")], [n for n in roles if not n.startswith("learner-")]):
        for name in group:
            if roles[name][0].poll() is None:
                roles[name][0].send_signal(signal.SIGTERM)
        for name in group:
            proc, log = roles[name]
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                failure = failure or f"{name} did not stop within 15 s of SIGTERM; its log: {log}"
    reports = {name: last_json(log) for name, (_, log) in roles.items()}
    traffic = {}
    for h in bed.hosts:
        sent = after[h.name]["sent"] - before[h.name]["sent"]
        received = after[h.name]["received"] - before[h.name]["received"]
        traffic[h.name] = {"sent_bytes": sent, "received_bytes": received,
                           "sent_mbit_s": round(sent * 8 / train_s / 1e6, 2),
                           "received_mbit_s": round(received * 8 / train_s / 1e6, 2),
                           "tbf_drops": after[h.name]["drops"] - before[h.name]["drops"],
                           # The host's TCP senders: segments resent, and resends after a retransmission
                           # timeout (a connection stalled at least one RTO: what starves a control lane).
                           "tcp_retransmitted": after[h.name]["tcp"]["TcpRetransSegs"] - before[h.name]["tcp"]["TcpRetransSegs"],
                           "tcp_timeouts": after[h.name]["tcp"]["TcpExtTCPTimeouts"] - before[h.name]["tcp"]["TcpExtTCPTimeouts"]}
    return failure, reports, traffic, train_s, t0


def make_keys(args, log_dir):
    """A CURVE keypair per process, named as the transport finds a peer's key on the
    allow-list (broker, shard-I, learner-I); the directory is every node's allow-list."""
    keys = os.path.join(log_dir, "keys")
    os.makedirs(keys, mode=0o700, exist_ok=True)
    names = ["broker"] + [f"shard-{s}" for s in range(args.shards)] + [f"learner-{i}" for i in range(args.learners)]
    for name in names:
        out = subprocess.run([args.binary, "keygen", "--name", name, "--dir", keys, "--force"], capture_output=True,
                             text=True, timeout=30)
        if out.returncode != 0:
            raise TestbedError(f"archipelago keygen --name {name}: {out.stderr.strip()}")
    return keys


def eval_losses(binary, db):
    """Eval loss of the first and the last version a one-shard store kept (both at once)."""
    def replay(*a):
        return subprocess.Popen([binary, "replay", "--db", db, *a, "--json"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def result(proc, what):
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise TestbedError(f"replay {what} on {db} did not finish within 120 s")
        r = last_json_text(out)
        if proc.returncode != 0 or not r:
            raise TestbedError(f"replay {what} on {db}: {err.strip()}")
        return r
    rows = result(replay("list"), "list")["rows"]
    if not rows:
        raise TestbedError(f"the shard's store {db} holds no version")
    first, last = rows[0]["version"], rows[-1]["version"]
    evals = [replay("eval", str(first)), replay("eval", str(last))]
    try:
        start, end = [result(p, "eval") for p in evals]
    finally:
        for p in evals:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"first_version": first, "last_version": last, "start": start["eval_loss"], "end": end["eval_loss"]}


# ---- commands ---------------------------------------------------------------------

def parse_link(text):
    m = re.fullmatch(r"(broker|l\d+)=([0-9.]+)(?:/([0-9.]+))?", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--link {text!r}: expected HOST=MBIT[/MS], e.g. l2=20/40 "
                                         f"(HOST is broker, l0, l1, ...)")
    return m.group(1), float(m.group(2)), None if m.group(3) is None else float(m.group(3))


def make_hosts(bed, args):
    names = ["broker"] + [f"l{i}" for i in range(args.learners)]
    hosts = [Host(bed, n, i, args.rate_mbit, args.delay_ms) for i, n in enumerate(names)]
    for name, rate, delay in args.link:
        if name not in names:
            raise TestbedError(f"--link {name}=...: no host {name} (hosts: {', '.join(names)})")
        h = hosts[names.index(name)]
        h.rate_mbit = rate
        if delay is not None:
            h.delay_ms = delay
    for h in hosts:
        if not 0.1 <= h.rate_mbit <= 100000 or not 0 <= h.delay_ms <= 10000:
            raise TestbedError(f"host {h.name}: rate {h.rate_mbit} Mbit/s (0.1-100000) or delay "
                               f"{h.delay_ms} ms (0-10000) out of range")
    return hosts


def new_bed_name(prefix):
    taken = {ns.rsplit("-", 1)[0] for ns in namespaces()}
    name, k = f"{prefix}-{os.getpid()}", 1
    while name in taken:  # a stale bed of a reused pid never clashes
        name, k = f"{prefix}-{os.getpid()}x{k}", k + 1
    return name


def describe_links(hosts):
    return {h.name: {"ns": h.ns, "rate_mbit": h.rate_mbit, "delay_ms": h.delay_ms} for h in hosts}


def print_mesh_report(s):
    ledger, loss, relay = s["ledger"], s["eval_loss"], s["relay"] or {}
    print(f"mesh: {s['learners_finished']}/{s['learners']} learners finished {s['steps']} steps ({s['mode']}, "
          f"{s['shards']} shard(s), CURVE {'on' if s['curve'] else 'off'}) in {s['train_s']:.1f} s; {s['rounds']} rounds, uptime {100 * s['uptime']:.1f} %")
    print(f"ledger: merged {ledger.get('merged', 0)}, late {ledger.get('late', 0)}, lost {ledger.get('lost', 0)}"
          f" of {ledger.get('processed', 0)} tokens; exact: {s['ledger_exact']}")
    print(f"control lane: {s['peers_declared_dead']} peers declared dead (none was killed; without --duration, learners "
          f"that finished first count), longest heartbeat round trip "
          f"{s['control_rtt_max_ms']:.1f} ms")
    for name, t in s["traffic"].items():
        print(f"  {name:>6}: sent {t['sent_bytes'] / 1e6:8.1f} MB ({t['sent_mbit_s']:7.2f} Mbit/s), received "
              f"{t['received_bytes'] / 1e6:8.1f} MB ({t['received_mbit_s']:7.2f} Mbit/s), tbf drops {t['tbf_drops']}, "
              f"TCP resent {t['tcp_retransmitted']} ({t['tcp_timeouts']} timeouts)")
    print(f"relay: {relay.get('packets', 0)} packets, {relay.get('bytes', 0) / 1e6:.1f} MB, "
          f"{relay.get('dropped', 0)} dropped, at most {relay.get('max_queued_bytes', 0) / 1e6:.2f} MB held")
    if loss:
        print(f"eval loss {loss['start']:.4f} -> {loss['end']:.4f} nats/byte "
              f"(versions {loss['first_version']} -> {loss['last_version']})")
    elif s["shards"] != 1:
        print("eval loss: only with --shards 1 (a store of one shard holds only its own fragments)")


def cmd_up(args, keep):
    bed_name = new_bed_name(args.prefix)
    hosts = make_hosts(bed_name, args)
    log_dir = args.logs or tempfile.mkdtemp(prefix=f"{bed_name}-")
    os.makedirs(log_dir, exist_ok=True)
    bed = Testbed(bed_name, hosts, args)
    interrupted = []

    def on_signal(sig, _):
        interrupted.append(sig)
        raise Interrupted()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    t_start = time.time()
    summary = {"command": "netns " + ("up" if keep else "run"), "bed": bed_name, "logs": log_dir,
               "links": describe_links(bed.hosts), "mtu": args.mtu}
    failure = None
    phases = summary["phases_s"] = {}  # where the wall time went

    def phase(name, since):
        phases[name] = round(time.time() - since, 2)
        return time.time()
    try:
        t = time.time()
        bed.up(log_dir)
        t = phase("setup", t)
        print(f"test bed {bed_name}: hub {bed.hub}; hosts " +
              ", ".join(f"{h.ns} {h.addr(bed.subnet)} ({h.rate_mbit:g} Mbit/s, {h.delay_ms:g} ms one-way)"
                        for h in bed.hosts), flush=True)
        if keep:
            print(f"left up: ip netns exec {bed.hosts[1].ns} ...; tear down with: {sys.argv[0]} down {bed_name}")
            bed.processes.clear()  # the relay stays; `down` finds it with ip netns pids
            if args.json:
                print(json.dumps(summary))
            return 0
        probe_to = [h for h in bed.hosts[1:]] if args.probe_all else bed.hosts[1:2]
        links = measure_links(bed, bed.hosts[0], probe_to, args.probe_seconds, log_dir) if args.probe_seconds > 0 \
            else {}
        for name, m in links.items():
            print(f"link {name} -> {m['to']}: RTT {m['rtt_ms']:.1f} ms (configured {m['rtt_configured_ms']:g}), "
                  f"{m['mbit_s']:.1f} Mbit/s (cap {m['cap_mbit_s']:g})", flush=True)
        summary["measured"] = links
        t = phase("probe", t)
        failure, reports, traffic, train_s, _ = run_mesh(bed, args, log_dir)
        t = phase("mesh", t)
        summary["relay"] = bed.stop_relay()
        broker = reports.get("broker") or {}
        learners = [reports.get(f"learner-{i}") or {} for i in range(args.learners)]
        seen = {(r["learner"], r["incarnation"]): r for r in broker.get("learners", [])}
        exact = bool(broker.get("ledger_balanced")) and all(
            r and seen.get((r["index"], r["incarnation"]), {}).get("processed") == r["tokens"] for r in learners)
        finished = sum(1 for r in learners if r.get("steps") == args.steps)
        # Nothing is killed here: with --duration (every node stopped at once) every peer a
        # node declared dead is a false verdict; otherwise a learner that finished first is
        # also counted once its peers find it silent.
        counts = [(r.get("status") or {}).get("counts", {}) for r in reports.values() if r]
        peers_declared_dead = sum(c.get("peers_lost", 0) for c in counts)
        control_rtt_max_ms = max([c.get("control_rtt_max_ns", 0) / 1e6 for c in counts] or [0])
        loss = None
        if args.shards == 1 and not failure:
            loss = eval_losses(args.binary, os.path.join(log_dir, "shard-0.db"))
            t = phase("eval", t)
        summary.update({"mode": args.mode, "curve": args.curve, "learners": args.learners, "shards": args.shards, "steps": args.steps,
                        "learners_finished": finished, "rounds": broker.get("rounds", 0),
                        "uptime": broker.get("uptime", 0), "ledger": broker.get("ledger", {}),
                        "ledger_exact": exact, "eval_loss": loss, "traffic": traffic, "train_s": round(train_s, 2),
                        "peers_declared_dead": peers_declared_dead, "control_rtt_max_ms": round(control_rtt_max_ms, 1)})
        print_mesh_report(summary)
    except Interrupted:
        failure = f"interrupted by signal {interrupted[-1]}"
    except TestbedError as e:
        failure = str(e)
    finally:
        if not keep or failure:
            t = time.time()
            bed.down()
            phase("teardown", t)
            left = [ns for ns in namespaces() if bed_pattern(bed_name).match(ns)]
            summary["left_behind"] = left
            if left:
                failure = failure or f"namespaces left behind: {left}"
    summary["pids"] = [p.pid for p in bed.processes]
    summary["wall_s"] = round(time.time() - t_start, 2)
    summary["failure"] = failure
    print(f"wall time {summary['wall_s']:.1f} s (" + ", ".join(f"{k} {v:g} s" for k, v in phases.items()) +
          f"); logs in {log_dir}")
    if failure:
        print(f"testbed: {failure}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 1 if failure else 0


def cmd_down(pattern, what, as_json):
    names = [ns for ns in namespaces() if pattern(ns)]
    try:
        teardown(names)
    except TestbedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    print(f"removed {len(names)} namespace(s) of {what}" + (": " + ", ".join(names) if names else ""))
    if as_json:
        print(json.dumps({"command": "netns down", "removed": names}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("run", "up"):
        p = sub.add_parser(name, help="build the bed, train across it, tear it down" if name == "run"
                           else "build the bed and leave it up")
        p.add_argument("--learners", type=int, default=3, help="learner hosts, one learner each (default 3)")
        p.add_argument("--rate-mbit", type=float, default=1000, help="every access link's rate (default 1000)")
        p.add_argument("--delay-ms", type=float, default=5,
                       help="every access link's one-way delay; host to host RTT = 4x (default 5)")
        p.add_argument("--link", action="append", type=parse_link, default=[], metavar="HOST=MBIT[/MS]",
                       help="one host's access link, e.g. l2=20/40 (repeatable)")
        p.add_argument("--mtu", type=int, default=9000,
                       help="MTU of the links (default 9000; the relay's cost is per packet)")
        p.add_argument("--subnet", default="10.213", help="the /16 the links are cut from (default 10.213)")
        p.add_argument("--prefix", default="archnet", help="namespace names: PREFIX-PID-host (default archnet)")
        p.add_argument("--logs", help="directory for logs and the shard's store (default: a new temporary one)")
        p.add_argument("--relay", help="archipelago_wan_relay (default: next to --binary)")
        p.add_argument("--binary", default=os.path.join(REPO, "build", "archipelago"))
        p.add_argument("--json", action="store_true", help="print a one-line JSON summary last")
        if name == "run":
            p.add_argument("--steps", type=int, default=300)
            p.add_argument("--shards", type=int, default=1,
                           help="parameter shards, all on the broker host (default 1; eval loss needs 1)")
            p.add_argument("--mode", default="decoupled", choices=["dp", "diloco", "streaming", "decoupled"])
            p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a knob for every node")
            p.add_argument("--probe-seconds", type=float, default=1.0,
                           help="length of the throughput probe before training; 0 = none (default 1)")
            p.add_argument("--probe-all", action="store_true", help="probe every learner host, not only l0")
            p.add_argument("--curve", action=argparse.BooleanOptionalAction, default=True,
                           help="CURVE between the nodes, a keypair each made for the run (default on)")
            p.add_argument("--timeout", type=float, default=600, metavar="SECONDS", help="bound on the training")
            p.add_argument("--duration", type=float, default=0, metavar="SECONDS",
                           help="train this long, then stop every node (SIGTERM), instead of until the learners' "
                                "steps are done")
    p = sub.add_parser("down", help="tear one bed down")
    p.add_argument("bed", help="the bed's name, e.g. archnet-1234")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("cleanup", help="tear down every bed of a prefix")
    p.add_argument("--prefix", default="archnet")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("_probe-serve")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, required=True)
    p = sub.add_parser("_probe-send")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--rtt-samples", type=int, default=5)
    args = ap.parse_args()

    if args.command == "_probe-serve":
        return probe_serve(args)
    if args.command == "_probe-send":
        return probe_send(args)
    if os.geteuid() != 0:
        ap.error("network namespaces need root (run as root, or with sudo)")
    if args.command == "down":
        return cmd_down(bed_pattern(args.bed).match, f"bed {args.bed}", args.json)
    if args.command == "cleanup":
        if not re.fullmatch(r"[A-Za-z0-9_.]+", args.prefix):
            ap.error(f"--prefix {args.prefix!r}: letters, digits, '_' and '.' only")
        pattern = re.compile(re.escape(args.prefix) + r"-[0-9x]+-(hub|broker|l\d+)$")
        return cmd_down(pattern.match, f"prefix {args.prefix}", args.json)

    if not re.fullmatch(r"[A-Za-z0-9_.]+", args.prefix):
        ap.error(f"--prefix {args.prefix!r}: letters, digits, '_' and '.' only")
    if not re.fullmatch(r"(25[0-5]|2[0-4]\d|1?\d?\d)\.(25[0-5]|2[0-4]\d|1?\d?\d)", args.subnet):
        ap.error(f"--subnet {args.subnet!r}: expected the first two octets of a /16, e.g. 10.213")
    if not 1 <= args.learners <= 250:
        ap.error(f"--learners {args.learners}: 1-250 (one host each)")
    if not 1280 <= args.mtu <= 65000:
        ap.error(f"--mtu {args.mtu}: 1280-65000")
    if not os.access(args.binary, os.X_OK):
        ap.error(f"{args.binary} is not an executable (build first, or pass --binary)")
    args.relay = args.relay or os.path.join(os.path.dirname(os.path.abspath(args.binary)), "archipelago_wan_relay")
    if not os.access(args.relay, os.X_OK):
        ap.error(f"{args.relay} is not an executable (build the archipelago_wan_relay target, or pass --relay)")
    if args.command == "run" and (args.steps < 1 or args.shards < 1):
        ap.error("--steps and --shards must be at least 1")
    try:
        return cmd_up(args, keep=args.command == "up")
    except TestbedError as e:  # make_hosts
        print(f"testbed: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
