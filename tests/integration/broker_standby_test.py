#!/usr/bin/env python3
"""Integration, standby broker: a mesh of `archipelago node` processes — the primary
broker and a standby (`--standby`), each on its own --db, two shards on theirs, three
learners — with the default liveness settings (heartbeat 1 s, dead after 3 silent).

1. The primary's host is lost: its process is SIGKILLed and its store directory
   deleted. The standby takes over from the copy the primary sent it (BrokerState):
   a round of its new epoch is committed on its tape within TAKEOVER_BOUND_S of the
   kill (the time is printed), and no shard's fragment version ever goes back.
2. A new primary (an empty store: the host replaced) starts while the standby leads:
   it follows. The standby (now the leader) is paused with SIGSTOP — to everyone else
   it is partitioned away — until the primary takes over; then it is resumed
   (SIGCONT) with its old epoch and must step down.
3. The learners leave on SIGTERM, never restarted. Across both brokers' tapes, the
   versions of each fragment grow with the epoch that closed their rounds: no broker
   merged anything after a newer epoch had (fencing), and an epoch names one broker.
   The new primary's store, empty when it started, holds every round of the first
   primary (the standby's tape log, sent to it from what it acknowledged), each once.
   The last leader's ledger balances and holds exactly the tokens each learner reports.

Environment: ARCHIPELAGO (the binary), STANDBY_STEPS (default 2500).
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_crash_test import Failure, check_ledger, leave, read, shard_heads, tape  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports, last_json  # noqa: E402

LEARNERS = 3
STEP_MS = 20
TAKEOVER_BOUND_S = 15.0  # kill → the standby's first committed round (measured ~5 s on a quiet machine)
RUN_BOUND_S = 170.0


def wait_until(what, bound_s, check, alive):
    deadline = time.time() + bound_s
    while time.time() < deadline:
        alive()
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise Failure(f"{what}: not within {bound_s:.0f} s")


class Mesh:
    def __init__(self, binary, work, steps):
        self.binary, self.work, self.steps = binary, work, steps
        ports = free_ports(4)
        self.db = {name: os.path.join(work, name) for name in ("primary", "standby", "shard0", "shard1")}
        self.common = ["--broker", f"tcp://127.0.0.1:{ports[0]},tcp://127.0.0.1:{ports[1]}",
                       "--shards", f"tcp://127.0.0.1:{ports[2]},tcp://127.0.0.1:{ports[3]}",
                       "--learners", str(LEARNERS), "--steps", str(steps), "--set", "mesh.shards=2",
                       "--set", "wire.curve=false", "--set", f"mesh.step_time_ms={STEP_MS}", "--set", "data.batch=4",
                       "--set", "data.synthetic_bytes=1048576", "--json"]
        self.started = time.time()
        self.procs = {}

    def start(self, name, role, index, *extra):
        path = os.path.join(self.work, f"{name}.{len(self.procs)}.log")
        with open(path, "w") as log:
            proc = subprocess.Popen([self.binary, "node", "--role", role, "--index", str(index), *self.common, *extra],
                                    stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = (proc, path)

    def alive(self, *brokers):
        for name, (proc, path) in self.procs.items():
            if name.startswith("learner") and proc.poll() == 0:
                raise Failure(f"{name} finished its {self.steps} steps before the faults were done (a slow "
                              f"machine? raise STANDBY_STEPS); log {path}")
            if (name.startswith(("shard", "learner")) or name in brokers) and proc.poll() is not None:
                raise Failure(f"{name} exited ({proc.returncode}); log {path}")
        if time.time() - self.started > RUN_BOUND_S:
            raise Failure(f"the test ran over its bound of {RUN_BOUND_S:.0f} s")

    def log(self, name):
        return read(self.procs[name][1])

    def start_all(self):
        """The primary and the standby on their stores, two shards on theirs, then the learners."""
        self.start("primary", "broker", 0, "--db", self.db["primary"])
        self.start("standby", "broker", 1, "--standby", "--db", self.db["standby"])
        for s in range(2):
            self.start(f"shard{s}", "shard", s, "--db", self.db[f"shard{s}"])
        time.sleep(0.5)
        for i in range(LEARNERS):
            self.start(f"learner{i}", "learner", i)

    def finish(self, brokers):
        """The learners leave on SIGTERM; the shards and `brokers` stop on SIGTERM. The primary
        leads at its end, and its ledger balances and holds exactly the learners' own counts."""
        reports = leave([self.procs[f"learner{i}"] for i in range(LEARNERS)], 30)
        names = ["shard0", "shard1", *brokers]
        for name in names:
            self.procs[name][0].send_signal(signal.SIGTERM)
        for name in names:
            proc, path = self.procs[name]
            proc.wait(timeout=30)
            if proc.returncode != 0:
                raise Failure(f"{name} exited {proc.returncode}; log {path}")
        final = last_json(self.procs["primary"][1])
        if not final or not final.get("leading"):
            raise Failure(f"the primary did not lead at its end: {final}; log {self.procs['primary'][1]}")
        check_ledger(final, reports)
        return final

    def stop_all(self):
        for proc, _ in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def check_versions_grow_with_epoch(seen, meaning):
    """`seen`: (fragment, version) -> the epoch that closed its round. Per fragment, a newer version
    never comes from an older epoch; a violation is reported as `meaning`."""
    newest = {}
    for (fragment, version), epoch in sorted(seen.items()):
        if epoch < newest.get(fragment, 0):
            raise Failure(f"fragment {fragment} version {version} was closed in epoch {epoch}, after a version "
                          f"of epoch {newest[fragment]}: {meaning}")
        newest[fragment] = epoch


def epoch_rounds(mesh, db, broker):
    """Tape records of `db` closed by broker index `broker`."""
    return [r for r in tape(mesh.binary, db) if r["broker"] == broker and r["epoch"] > 0]


def main():
    binary = os.environ["ARCHIPELAGO"]
    steps = int(os.environ.get("STANDBY_STEPS", "2500"))
    work = tempfile.mkdtemp(prefix="archipelago-standby-")
    mesh = Mesh(binary, work, steps)
    try:
        mesh.start_all()
        both = lambda: mesh.alive("primary", "standby")  # noqa: E731
        wait_until("the primary's first committed round", 40, lambda: epoch_rounds(mesh, mesh.db["primary"], 0), both)
        # The standby holds the leader's copy: its tape fills with the primary's rounds.
        wait_until("the primary's rounds on the standby's tape", 10,
                   lambda: len(epoch_rounds(mesh, mesh.db["standby"], 0)) >= 3, both)
        time.sleep(1.5)  # a ledger copy or two

        # 1. The primary's host is gone: SIGKILL, store deleted.
        heads = [shard_heads(binary, mesh.db[f"shard{s}"]) for s in range(2)]
        proc, _ = mesh.procs["primary"]
        killed_at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        shutil.rmtree(mesh.db["primary"])
        standby_only = lambda: mesh.alive("standby")  # noqa: E731
        rounds = wait_until("a round committed by the standby after the primary's host was lost", TAKEOVER_BOUND_S,
                            lambda: epoch_rounds(mesh, mesh.db["standby"], 1), standby_only)
        takeover_s = time.time() - killed_at
        standby_epoch = rounds[0]["epoch"]
        after = [shard_heads(binary, mesh.db[f"shard{s}"]) for s in range(2)]
        for s in range(2):
            for p, v in heads[s][1].items():
                if after[s][1].get(p, -1) < v:
                    raise Failure(f"shard {s} fragment {p} went back from {v} to {after[s][1].get(p)}")

        # 2. A new primary host (empty store) follows; the leader is cut off (SIGSTOP) until the
        #    primary takes over, then comes back with its old epoch and must step down.
        mesh.start("primary", "broker", 0, "--db", mesh.db["primary"])
        time.sleep(5)  # longer than its listening (the 3 s liveness window): it heard of the standby's epoch
        if "leading in epoch" in mesh.log("primary"):
            raise Failure(f"the new primary led while the standby did; log {mesh.procs['primary'][1]}")
        standby, _ = mesh.procs["standby"]
        standby.send_signal(signal.SIGSTOP)
        paused_at = time.time()
        wait_until("the primary taking over from the paused standby", TAKEOVER_BOUND_S,
                   lambda: "leading in epoch" in mesh.log("primary"), lambda: mesh.alive("primary"))
        wait_until("a round committed by the new primary", TAKEOVER_BOUND_S,
                   lambda: epoch_rounds(mesh, mesh.db["primary"], 0), lambda: mesh.alive("primary"))
        second_takeover_s = time.time() - paused_at
        standby.send_signal(signal.SIGCONT)
        wait_until("the resumed standby stepping down", 15, lambda: "stepping down" in mesh.log("standby"),
                   lambda: mesh.alive("primary", "standby"))

        # 3. The learners leave under the new primary (it committed a round).
        final = mesh.finish(["standby", "primary"])

        # Fencing, on the tapes of both stores: per fragment, a newer version never comes from an older epoch.
        seen = {}
        for db in (mesh.db["primary"], mesh.db["standby"]):
            for r in tape(binary, db):
                if r["epoch"] == 0:
                    raise Failure(f"a tape record without its broker epoch: {r}")
                seen[(r["fragment"], r["version"])] = r["epoch"]
        epochs = sorted({e for e in seen.values()})
        if len(epochs) < 3:
            raise Failure(f"expected the rounds of three epochs (primary, standby, new primary), saw {epochs}")
        check_versions_grow_with_epoch(seen, "a deposed broker merged")
        # The new primary started from an empty store: the first primary's rounds reached it from
        # the standby's tape log (sent from what it acknowledged), each once.
        new_primary = [r["round"] for r in tape(binary, mesh.db["primary"])]
        first_rounds = {r["round"] for r in tape(binary, mesh.db["standby"]) if r["epoch"] < standby_epoch}
        if not first_rounds or first_rounds - set(new_primary) or len(new_primary) != len(set(new_primary)):
            raise Failure(f"the new primary's tape lacks {len(first_rounds - set(new_primary))} of the first primary's "
                          f"{len(first_rounds)} rounds, or holds a round twice")
        refused = sum(read(mesh.procs[f"shard{s}"][1]).count("refused") for s in range(2))
        ledger = final["ledger"]
        print(f"ok: primary SIGKILLed and its store deleted → standby (epoch {standby_epoch}) committed its first "
              f"round {takeover_s:.1f} s later (heartbeat 1 s, dead after 3 s); a new primary followed it, took over "
              f"{second_takeover_s:.1f} s after the standby was paused, and the resumed standby stepped down "
              f"(shards refused {refused} message(s) of its old epoch); epochs {len(epochs)}, fragment versions "
              f"monotonic in epoch across both tapes; the new primary's store holds the first primary's "
              f"{len(first_rounds)} rounds, copied by the standby; ledger merged {ledger['merged']}, lost {ledger['lost']} of "
              f"{ledger['processed']} tokens, balanced, equal to the learners' counts")
    except Failure as f:
        print(f"FAIL (logs in {work}): {f}", flush=True)
        sys.exit(1)
    finally:
        mesh.stop_all()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
