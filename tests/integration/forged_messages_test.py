#!/usr/bin/env python3
"""Integration, the forged-message battery: an insider cannot break the mesh.

A mesh of `archipelago node` processes over CURVE, every node with a key of its own
(keygen's names): the primary broker and a standby, two shards, learners 0 and 1.
The attacker (archipelago_test_forger) holds one valid key, learner 2's, and nothing
else. It joins as learner 2 (so that the broker and the shards dial it back), then
sends, for every body kind of schemas/envelope.capnp and both socket directions —
as a client of every node's listening socket, and back on the connections the
broker and the shards opened to it — well-formed envelopes with forged senders,
broker epochs (0, old, current, newer, of a broker not in the mesh, near 2^64),
incarnations (0, 1, its own, 2^64 − 1), steps, token counts, endpoints and fragment
numbers. Each is built to be refused, and the forger says by which node for which
reason (the transport's admission rule, or the receiving role's).

Passes when: every forged envelope is refused and counted under its reason on that
node's /metrics (archipelago_wire_rejected_total and archipelago_refused_total: the
counters grow by exactly what the forger expects, node by node, reason by reason);
no node exits; rounds never stall beyond the liveness window from the battery's start
until the learners finish (the shards' published versions, polled, never stand still
longer) and the shards keep publishing after it; no broker is deposed; the learners finish; the primary leads at its end and its ledger balances
and holds exactly the tokens learners 0 and 1 report. The primary's uptime (its
downtime bound is 1 s) is reported, not asserted: on a machine loaded by others an
honest mesh's rounds also pause that long.

The run bounds itself (RUN_BOUND_S) and ends every process it started.
Environment: ARCHIPELAGO (the binary), ARCHIPELAGO_FORGER (the attacker).
Prints one JSON line last: the battery's figures.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports, last_json  # noqa: E402

BINARY = os.environ["ARCHIPELAGO"]
FORGER = os.environ["ARCHIPELAGO_FORGER"]
LEARNERS = 3          # learner 2's key is the attacker's; learners 0 and 1 train
STEP_MS = 40          # mesh.step_time_ms: a fixed pace
STEPS = 600           # at least 24 s of steps: the battery runs while they train
LIVENESS = 5          # wire.liveness: a peer silent 5 heartbeats (5 s) is dead; the stall bound
RUN_BOUND_S = 150.0
SETTLE_BOUND_S = 30.0  # the battery sent → every refusal counted


class Failure(Exception):
    pass


def metrics(port):
    """{(family, reason): value} of a node's refusal counters."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        page = r.read().decode()
    out = {}
    for line in page.splitlines():
        for family in ("archipelago_wire_rejected_total", "archipelago_refused_total"):
            if line.startswith(family + "{") and 'reason="' in line:
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                out[reason] = out.get(reason, 0) + float(line.rsplit(" ", 1)[1])
    return out


def gauge(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
    return None


class Mesh:
    def __init__(self, work):
        self.work = work
        self.keys = os.path.join(work, "keys")
        os.makedirs(self.keys)
        for name in ["broker", "broker-1", "shard-0", "shard-1", "learner-0", "learner-1", "learner-2"]:
            r = subprocess.run([BINARY, "keygen", "--name", name, "--dir", self.keys], capture_output=True, text=True)
            if r.returncode != 0:
                raise Failure(f"keygen {name}: {r.stderr}")
        ports = free_ports(4 + LEARNERS + 6)
        self.brokers = [f"tcp://127.0.0.1:{p}" for p in ports[0:2]]
        self.shards = [f"tcp://127.0.0.1:{p}" for p in ports[2:4]]
        self.learners = [f"tcp://127.0.0.1:{p}" for p in ports[4:4 + LEARNERS]]
        self.metrics_ports = dict(zip(["sync_broker/0", "sync_broker/1", "parameter_shard/0", "parameter_shard/1",
                                       "learner/0", "learner/1"], ports[4 + LEARNERS:]))
        self.knobs = ["--set", "mesh.shards=2", "--set", f"mesh.learners={LEARNERS}", "--set", f"train.steps={STEPS}",
                      "--set", f"mesh.step_time_ms={STEP_MS}", "--set", "data.batch=4",
                      "--set", "data.synthetic_bytes=1048576", "--set", f"wire.liveness={LIVENESS}"]
        self.common = ["--broker", ",".join(self.brokers), "--shards", ",".join(self.shards),
                       "--set", f"wire.allow={self.keys}", *self.knobs, "--log-burst", "5", "--json"]
        self.procs = {}
        self.started = time.time()

    def start(self, node, role, index, *extra):
        path = os.path.join(self.work, f"{node.replace('/', '-')}.log")
        with open(path, "w") as log:
            self.procs[node] = (subprocess.Popen(
                [BINARY, "node", "--role", role, "--index", str(index), *self.common, "--metrics-host", "127.0.0.1",
                 "--metrics-port", str(self.metrics_ports[node]), *extra], stdout=log, stderr=subprocess.STDOUT), path)

    def start_all(self):
        """The primary, the shards and the learners; the standby once the primary leads (so
        that a loaded machine's slow start does not make it lead first)."""
        self.start("sync_broker/0", "broker", 0, "--db", os.path.join(self.work, "primary"))
        for s in range(2):
            self.start(f"parameter_shard/{s}", "shard", s, "--db", os.path.join(self.work, f"shard{s}"))
        time.sleep(0.5)
        for i in range(2):
            self.start(f"learner/{i}", "learner", i, "--listen", self.learners[i])

    def alive(self):
        for node, (proc, path) in self.procs.items():
            if proc.poll() is not None and not (node.startswith("learner") and proc.returncode == 0):
                raise Failure(f"{node} exited ({proc.returncode}); log {path}")
        if time.time() - self.started > RUN_BOUND_S:
            raise Failure(f"the test ran over its bound of {RUN_BOUND_S:.0f} s")

    def wait(self, what, bound_s, check):
        deadline = time.time() + bound_s
        while time.time() < deadline:
            self.alive()
            try:
                value = check()
                if value:
                    return value
            except (OSError, ValueError):
                pass  # a node not serving yet
            time.sleep(0.3)
        raise Failure(f"{what}: not within {bound_s:.0f} s; logs in {self.work}")

    def stop_all(self):
        for proc, _ in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main():
    work = tempfile.mkdtemp(prefix="archipelago-forged-")
    mesh = Mesh(work)
    forger = None
    try:
        mesh.start_all()
        primary = mesh.metrics_ports["sync_broker/0"]
        mesh.wait("the primary leading, 20 rounds opened", 60,
                  lambda: (gauge(primary, "archipelago_rounds_opened_total") or 0) >= 20)
        mesh.start("sync_broker/1", "broker", 1, "--standby", "--db", os.path.join(mesh.work, "standby"))
        standby = mesh.metrics_ports["sync_broker/1"]
        mesh.wait("the standby following the primary", 60,
                  lambda: gauge(standby, "archipelago_broker_leading") == 0 and
                  (gauge(standby, "archipelago_broker_epoch") or 0) > 0)
        epoch = gauge(primary, "archipelago_broker_epoch")
        before = {node: metrics(port) for node, port in mesh.metrics_ports.items()}
        opened_before = gauge(primary, "archipelago_rounds_opened_total")

        forger_log = os.path.join(work, "forger.log")
        with open(forger_log, "w") as err:
            forger = subprocess.Popen([FORGER, "--allow", mesh.keys, "--index", "2", "--broker", ",".join(mesh.brokers),
                                       "--shards", ",".join(mesh.shards), "--learners", ",".join(mesh.learners),
                                       *mesh.knobs], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        sent_at = time.time()
        # Rounds go on while the battery runs: the shards' published versions, polled.
        published, stall = [], {"longest_s": 0.0}

        def poll_published():
            last_change, last = time.time(), None
            # Until the test stops it, or a learner is done (rounds then wind down).
            while not stall.get("stop") and all(mesh.procs[f"learner/{i}"][0].poll() is None for i in range(2)):
                try:
                    now = sum(gauge(mesh.metrics_ports[f"parameter_shard/{s}"], "archipelago_shard_published_total") or 0
                              for s in range(2))
                except OSError:
                    now = last
                t = time.time()
                if now != last:
                    last, last_change = now, t
                    published.append((t, now))
                stall["longest_s"] = max(stall["longest_s"], t - last_change)
                time.sleep(0.25)
        poller = threading.Thread(target=poll_published, daemon=True)
        poller.start()
        line = forger.stdout.readline()
        if not line.startswith("{"):
            forger.wait(timeout=10)
            raise Failure(f"the forger exited {forger.returncode} without its summary; log {forger_log}")
        battery = json.loads(line)
        battery_s = time.time() - sent_at
        expected = battery["expected"]

        def counted():
            now = {node: metrics(port) for node, port in mesh.metrics_ports.items()}
            short = {node: {r: n for r, n in want.items() if now[node].get(r, 0) - before[node].get(r, 0) < n}
                     for node, want in expected.items()}
            return now if not any(short.values()) else None
        try:
            after = mesh.wait("every forged envelope counted", SETTLE_BOUND_S, counted)
        except Failure:
            now = {node: metrics(port) for node, port in mesh.metrics_ports.items()}
            raise Failure("refusals counted vs expected: " + json.dumps(
                {node: {r: [now[node].get(r, 0) - before[node].get(r, 0), n] for r, n in want.items()}
                 for node, want in expected.items()}))
        # Exactly: nothing else was refused meanwhile (an honest node's message, a forgery counted twice).
        observed = {node: {r: int(after[node].get(r, 0) - before[node].get(r, 0)) for r in
                           set(after[node]) | set(before[node]) if after[node].get(r, 0) != before[node].get(r, 0)}
                    for node in mesh.metrics_ports}
        for node in mesh.metrics_ports:
            if observed[node] != expected.get(node, {}):
                raise Failure(f"{node}: refusals counted {observed[node]}, the forger expects {expected.get(node, {})}")
        opened_after = gauge(primary, "archipelago_rounds_opened_total")
        published_after_battery = published[-1][1] if published else 0
        if not opened_after > opened_before or len(published) < 2:
            raise Failure("no round opened or published while the battery ran")
        if gauge(primary, "archipelago_broker_leading") != 1 or gauge(primary, "archipelago_broker_epoch") != epoch:
            raise Failure("the primary was deposed")

        # The learners finish their steps; then everything stops cleanly.
        reports = []
        for i in range(2):
            proc, path = mesh.procs[f"learner/{i}"]
            bound = max(5.0, RUN_BOUND_S - (time.time() - mesh.started) - 20)
            try:
                proc.wait(timeout=bound)
            except subprocess.TimeoutExpired:
                raise Failure(f"learner {i} did not finish its {STEPS} steps; log {path}")
            r = last_json(path)
            if proc.returncode != 0 or not r or r.get("steps") != STEPS:
                raise Failure(f"learner {i} exited {proc.returncode} with {r}; log {path}")
            reports.append(r)
        # Rounds went on, unstalled, until the learners were done (their last steps end the rounds).
        stall["stop"] = True
        poller.join()
        if stall["longest_s"] > LIVENESS:
            raise Failure(f"rounds stalled {stall['longest_s']:.1f} s between the battery and the learners' end "
                          f"(bound: the liveness window, {LIVENESS} s)")
        if not published[-1][1] > published_after_battery:
            raise Failure(f"the shards published nothing after the battery ({published_after_battery} versions)")
        forger.stdin.close()
        forger.wait(timeout=10)
        for node in ["parameter_shard/0", "parameter_shard/1", "sync_broker/1", "sync_broker/0"]:
            mesh.procs[node][0].send_signal(signal.SIGTERM)
        for node in ["parameter_shard/0", "parameter_shard/1", "sync_broker/1", "sync_broker/0"]:
            proc, path = mesh.procs[node]
            proc.wait(timeout=30)
            if proc.returncode != 0:
                raise Failure(f"{node} exited {proc.returncode}; log {path}")
        final = last_json(mesh.procs["sync_broker/0"][1])
        if not final or not final.get("leading"):
            raise Failure(f"the primary did not lead at its end: {final}")
        if not final["ledger_balanced"]:
            raise Failure(f"the ledger does not balance: {final['ledger']}")
        for i, r in enumerate(reports):
            recs = [rec for rec in final["learners"] if rec["learner"] == i]
            if [rec["processed"] for rec in recs] != [r["tokens"]]:
                raise Failure(f"learner {i}: the ledger holds {[(x['incarnation'], x['processed']) for x in recs]}, the "
                              f"learner reports {r['tokens']}")
        attacker = sum(rec["processed"] for rec in final["learners"] if rec["learner"] == 2)
        refusals = {}
        for want in expected.values():
            for reason, n in want.items():
                refusals[reason] = refusals.get(reason, 0) + n
        kinds = sorted(set(battery["kinds"].get("in", [])) | set(battery["kinds"].get("back", [])))
        summary = {"forged": battery["sent"], "body_kinds": len(kinds), "kinds_in": len(battery["kinds"].get("in", [])),
                   "kinds_back": len(battery["kinds"].get("back", [])), "refused_by_reason": refusals,
                   "refused_by_node": observed, "node_exits": 0, "uptime": final["uptime"],
                   "longest_stall_s": round(stall["longest_s"], 2),
                   "versions_published_after_battery": published[-1][1] - published_after_battery,
                   "rounds": final["rounds"], "battery_s": round(battery_s, 2), "ledger": final["ledger"],
                   "learners_tokens": [r["tokens"] for r in reports], "attacker_tokens_booked": attacker,
                   "wall_s": round(time.time() - mesh.started, 1)}
        print(f"ok: {battery['sent']} forged envelopes of {len(kinds)} body kinds in both directions, every one refused "
              f"and counted ({', '.join(f'{r} {n}' for r, n in sorted(refusals.items()))}); no node exited; longest "
              f"stall until the learners' end {stall['longest_s']:.2f} s; uptime {final['uptime']}; the ledger exact")
        print(json.dumps(summary))
    except Failure as e:
        mesh.stop_all()
        if forger and forger.poll() is None:
            forger.kill()
        for node, (_, path) in mesh.procs.items():
            with open(path) as f:
                sys.stderr.write(f"--- {node} ---\n{f.read()[-2500:]}\n")
        sys.exit(f"FAIL: {e}")
    finally:
        mesh.stop_all()
        if forger and forger.poll() is None:
            forger.kill()
            forger.wait()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
