#!/usr/bin/env python3
"""Deployment: docs/guides/multi-host.md run word for word on three hosts (root only).

The hosts are network namespaces joined by the WAN test bed's links (deploy/netns/testbed.py:
tbf rate limits, the relay's delay: 20 ms between any two hosts), each with a root filesystem
of its own: a copy of the root where deb_install_test.py installed the package with apt
(ctest fixture deb_root), so every host runs the installed `/usr/bin/archipelago`. Each host's
/etc/hosts names the others (hostA, hostB, hostC). Every runnable block of the guide runs in
order on the hosts it names: foreground blocks must exit 0; each line of a background block
is a process left running. `scp HOST:PATH ...` is the one stand-in: no SSH server runs in
the bed, so scp copies between the hosts' roots (tests/integration/scp_between_roots.py);
everything else is the guide's own command.

Checked along the way, against what the guide says:
  - after the keys are made and copied: each host holds the secret keys of exactly the
    identities it runs, and the public key of every identity;
  - the mesh trains: the broker on hostA leads (the lease in etcd), the standby on hostB
    follows, learners 0 and 1 are members and rounds close; `archipelago status` on hostC
    lists them;
  - adding a learner: learner 2 joins and its contributions are merged; removing it
    (SIGTERM, as the guide says) drains it: it exits 0 and the broker marks it departed;
  - stopping (SIGTERM in the guide's order): every process exits 0; the leader's ledger is
    balanced and holds exactly the tokens each learner reports; no namespace, mount or
    process of the test is left behind.

Usage: multi_host_guide_test.py WORK_DIR   (the deb_install_test.py work directory; exit 77: not root)
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "deploy", "netns"))
import deb_root  # noqa: E402
import testbed  # noqa: E402  (deploy/netns/testbed.py: the bed's namespaces and links)
from guide_blocks import runnable_blocks  # noqa: E402

GUIDE = os.path.join(REPO, "docs", "guides", "multi-host.md")
HOSTS = ("hostA", "hostB", "hostC")
IDENTITIES = {"hostA": ["broker", "shard-0"], "hostB": ["learner-0", "broker-1"], "hostC": ["learner-1", "learner-2"]}
SUBNET = "10.216"
WAIT_S = 120  # bound on every wait for the mesh (a loaded 2-core machine)


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


def wait_until(what, bound_s, probe):
    deadline = time.time() + bound_s
    last = None
    while time.time() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise Failure(f"{what}: not within {bound_s} s")


class Hosts:
    def __init__(self, work, installed_root):
        self.work = work
        self.dir = os.path.join(work, "hosts")
        self.installed = installed_root
        self.bed = None
        self.mounts = deb_root.Mounts()
        self.procs = []  # (host, command, Popen, log)

    def up(self):
        os.makedirs(self.dir)
        for h in HOSTS:  # hard links: a host's root costs seconds; files written later are its own
            deb_root.run(["cp", "-al", self.installed, self.root(h)], 300, f"copying the root for {h}")
        bed_name = testbed.new_bed_name("archguide")
        hosts = [testbed.Host(bed_name, h, i, 1000, 5) for i, h in enumerate(HOSTS)]  # 1 Gbit/s, 20 ms RTT
        relay = os.path.join(self.installed, "usr/bin/archipelago_wan_relay")  # the package's
        args = types.SimpleNamespace(subnet=SUBNET, mtu=9000, relay=relay)
        self.bed = testbed.Testbed(bed_name, hosts, args)
        self.bed.up(self.work)
        names = "".join(f"{h.addr(SUBNET)} {h.name}\n" for h in hosts)
        for h in HOSTS:
            root = self.root(h)
            for name, text in (("etc/hosts", f"127.0.0.1 localhost\n{names}"), ("etc/hostname", h + "\n")):
                path = os.path.join(root, name)
                if os.path.lexists(path):
                    os.unlink(path)  # a hard link to the installed root's file: replaced, not written through
                with open(path, "w") as f:
                    f.write(text)
            self.mounts.system(root)
            self.mounts.bind(self.dir, os.path.join(root, "run/hosts"))
            scp = os.path.join(root, "usr/local/bin/scp")
            shutil.copy(os.path.join(HERE, "scp_between_roots.py"), scp)
            os.chmod(scp, 0o755)

    def root(self, host):
        return os.path.join(self.dir, host)

    def ns(self, host):
        return self.bed.hosts[HOSTS.index(host)].ns

    def run(self, host, script, timeout=120):
        out = subprocess.run(deb_root.in_root(self.root(host), script, self.ns(host)), capture_output=True,
                             text=True, timeout=timeout)
        if out.returncode != 0:
            raise Failure(f"on {host}: {script!r} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out.stdout

    def start(self, host, command):
        log = os.path.join(self.work, f"{host}-{len(self.procs)}.log")
        with open(log, "w") as out:
            argv = deb_root.in_root(self.root(host), "exec " + command, self.ns(host))
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((host, command, proc, log))
        return proc

    def status(self):
        """The leader's status document (archipelago status --json on hostC), or None."""
        out = subprocess.run(deb_root.in_root(self.root("hostC"), "archipelago status --broker hostA:9464,hostB:9464 "
                                              "--json --timeout 3", self.ns("hostC")),
                             capture_output=True, text=True, timeout=30)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if out.returncode == 0 and lines else None

    def process(self, pattern):
        found = [p for p in self.procs if re.search(pattern, p[1])]
        check(len(found) == 1, f"one process started for {pattern!r}, found {len(found)}")
        return found[0]

    def stop(self, pattern, sig=signal.SIGTERM, bound_s=30):
        host, command, proc, log = self.process(pattern)
        proc.send_signal(sig)
        try:
            proc.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            raise Failure(f"{host}: `{command[:60]}...` did not stop within {bound_s} s of signal {sig}; log {log}")
        return proc.returncode, open(log).read()

    def down(self):
        for _, _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        try:
            if self.bed:
                self.bed.down()
        finally:
            self.mounts.undo()


def learners(doc):
    """The newest incarnation of each learner in a status document."""
    out = {}
    for m in (doc or {}).get("learners", []):
        if m["learner"] not in out or m["incarnation"] > out[m["learner"]]["incarnation"]:
            out[m["learner"]] = m
    return out


def training(doc, started):
    """The document when the broker on hostA leads, rounds closed and every started learner
    is live with merged work; else None."""
    ok = doc and doc.get("leading") and doc.get("broker") == 0 and doc.get("rounds_closed", 0) > 0 and all(
        learners(doc).get(i, {}).get("state") == "live" and learners(doc)[i].get("merged_tokens", 0) > 0
        for i in started)
    return doc if ok else None


def check_key_placement(hosts):
    every_pub = sorted(f"{name}.pub" for names in IDENTITIES.values() for name in names)
    for h in HOSTS:
        files = sorted(os.listdir(os.path.join(hosts.root(h), "etc/archipelago/keys")))
        keys = sorted(f for f in files if f.endswith(".key"))
        check(keys == sorted(f"{n}.key" for n in IDENTITIES[h]), f"{h} holds the secret keys {keys}")
        check(sorted(f for f in files if f.endswith(".pub")) == every_pub, f"{h} holds the public keys {files}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if os.geteuid() != 0:
        print("multi_host_guide_test: needs root (namespaces, chroot); skipped")
        return 77
    fixture = os.path.abspath(sys.argv[1])
    ready = os.path.join(fixture, "root.ready")
    check(os.path.exists(ready), f"{ready} is missing: run deploy/deb_install first (the ctest fixture does)")
    work = os.path.join(fixture, "guide")
    deb_root.remove_tree(work)
    os.makedirs(work)
    blocks = [b for b in runnable_blocks(GUIDE) if not b.install]
    t0 = time.time()
    hosts = Hosts(work, os.path.join(fixture, "root"))
    try:
        hosts.up()
        print(f"three hosts up in {time.time() - t0:.1f} s: {hosts.bed.bed}", flush=True)
        status_runs = 0
        for b in blocks:
            print(f"guide {b!r} on {', '.join(b.hosts)}", flush=True)
            if b.background:
                for host in b.hosts:
                    for command in b.commands():
                        hosts.start(host, command)
                first = b.commands()[0]
                if first.startswith("etcd "):  # its health page, from hostB (the standby's host)
                    probe = "python3 -c \"import urllib.request as u; u.urlopen('http://hostA:2379/health', timeout=2)\""
                    wait_until("etcd answering on hostA", WAIT_S, lambda: subprocess.run(
                        deb_root.in_root(hosts.root("hostB"), probe, hosts.ns("hostB")), capture_output=True).returncode == 0)
                continue
            if "archipelago status" in b.text:
                # The status the guide shows: wait for the learners started so far to be members.
                started = [int(i) for _, c, _, _ in hosts.procs for i in re.findall(r"--role learner --index (\d+)", c)]
                doc = wait_until(f"learners {started} live with merged work, rounds closed", WAIT_S,
                                 lambda: training(hosts.status(), started))
                check([r.get("leading") for r in doc["brokers"]] == [True, False],
                      f"the broker on hostA leads and the standby follows: {doc['brokers']}")
            for host in b.hosts:
                out = hosts.run(host, b.text)
                if "archipelago status" in b.text:
                    status_runs += 1
                    for i in started:
                        check(re.search(rf"^\s+{i}\s+\d+\s+live\b", out, re.M), f"status lists learner {i}:\n{out}")
            if "scp " in b.text:
                check_key_placement(hosts)
        check(status_runs == 2, f"the guide's two status blocks ran ({status_runs})")

        # Removing a learner, as the guide says: SIGTERM drains it.
        tokens = {}
        for i in (2, 0, 1):  # learner 2 removed while the others train; then the stop in the guide's order
            code, log = hosts.stop(rf"--role learner --index {i}\b")
            check(code == 0, f"learner {i} exited {code} after SIGTERM:\n{log[-2000:]}")
            m = re.search(r"incarnation \d+\): \d+ steps, (\d+) tokens", log)
            check(m, f"learner {i}'s summary line:\n{log[-1000:]}")
            tokens[i] = int(m.group(1))
            if i == 2:
                wait_until("learner 2 gone from the rounds (state left)", WAIT_S,
                           lambda: learners(hosts.status()).get(2, {}).get("state") == "left")
        final = wait_until("every learner's leaving counted", WAIT_S, lambda: (
            lambda d: d if d and all(learners(d).get(i, {}).get("state") == "left" for i in tokens) else None)(
            hosts.status()))
        ledger = final["ledger"]
        check(final.get("ledger_balanced") is True and ledger["processed"] == sum(tokens.values()),
              f"the leader's ledger {ledger} holds exactly the learners' {tokens} tokens")
        check(ledger["merged"] > 0, f"work was merged: {ledger}")
        for pattern in (r"--standby", r"--role broker --config", r"--role shard", r"^etcd "):
            code, log = hosts.stop(pattern)
            # Our nodes exit 0 on SIGTERM; Debian's etcd shuts down cleanly ("received terminated
            # signal, shutting down") and then dies of the signal it re-raises.
            clean = (0, -signal.SIGTERM) if pattern == r"^etcd " else (0,)
            check(code in clean, f"`{pattern}` exited {code}:\n{log[-2000:]}")
        print(f"ok: the guide ran on three hosts from the package in {time.time() - t0:.0f} s; ledger {ledger}; "
              f"learners' tokens {tokens}")
        return 0
    finally:
        hosts.down()
        left = [ns for ns in testbed.namespaces() if ns.startswith(hosts.bed.bed)] if hosts.bed else []
        if left:
            print(f"FAILED: namespaces left behind: {left}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (Failure, deb_root.RootError, testbed.TestbedError) as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
