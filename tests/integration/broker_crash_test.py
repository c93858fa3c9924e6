#!/usr/bin/env python3
"""Integration, broker recovery: a mesh of `archipelago node` processes (the broker
with --db, two shards with --db, three learners) whose broker process is killed
with SIGKILL KILLS times and restarted on the same --db after a short, seeded delay.

After every restart: the new broker numbers its rounds after every round the old
one opened (its log line "recovered ... rounds from R", R above every round on the
tape), rounds resume (new rounds on the tape, numbered from R) and the shards
publish new versions, which never go back (the tape's versions per fragment and
the shards' stores). The learners are never restarted and every one of them sees
the new broker; once the last one committed a round they leave on SIGTERM; the last
broker's ledger balances and holds exactly the tokens each learner reports, under
the learners' one incarnation.

Environment: ARCHIPELAGO (the binary), BROKER_KILLS (default 3), BROKER_CRASH_SEED
(default 1; printed on failure), BROKER_CRASH_STEPS (default from the kills).
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports, last_json  # noqa: E402  (deploy/launch.py: the mesh launcher)

LEARNERS = 3
STEP_MS = 20             # mesh.step_time_ms: a fixed pace, so the run's length is known
RESUME_BOUND_S = 25.0    # restart → a new round committed on the tape
RUN_BOUND_S = 115.0      # the whole test


class Failure(Exception):
    pass


def replay(binary, db, *args):
    """Beside a live writer: replay reads the store as a RocksDB secondary instance, so no retries."""
    out = subprocess.run([binary, "replay", "--db", db, *args, "--json"], capture_output=True, text=True,
                         timeout=60)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    raise Failure(f"replay {' '.join(args)} on {db}: exit {out.returncode}\n{out.stdout}\n{out.stderr}")


def tape(binary, db):
    return replay(binary, db, "tape")["rounds"]


def shard_head(binary, db):
    """The shard store's newest mesh version (one replay call)."""
    rows = replay(binary, db, "list")["rows"]
    return rows[-1]["version"] if rows else 0


def shard_heads(binary, db):
    """The shard store's newest manifest: its mesh version and each fragment's version, read in one
    call (`show head`): a head listed first and shown after is gone once the shard has committed
    storage.keep_last newer versions, which a fast mesh does while a loaded machine opens the store."""
    try:
        shown = replay(binary, db, "show", "head")
    except Failure:
        if not replay(binary, db, "list")["rows"]:
            return 0, {}
        raise
    return shown["version"], {e["fragment"]: e["version"] for e in shown["entries"]}


def read(path):
    with open(path) as f:
        return f.read()


class Mesh:
    """The processes of the test's mesh: a broker on its store, two shards on theirs, the learners."""

    def __init__(self, binary, work, steps, kills):
        self.binary, self.work, self.steps, self.kills = binary, work, steps, kills
        self.broker_db = os.path.join(work, "broker")
        self.shard_dbs = [os.path.join(work, f"shard{s}") for s in range(2)]
        ports = free_ports(3)
        self.common = ["--broker", f"tcp://127.0.0.1:{ports[0]}",
                       "--shards", f"tcp://127.0.0.1:{ports[1]},tcp://127.0.0.1:{ports[2]}",
                       "--learners", str(LEARNERS), "--steps", str(steps), "--set", "mesh.shards=2",
                       "--set", "wire.curve=false", "--set", f"mesh.step_time_ms={STEP_MS}", "--set", "data.batch=4",
                       # A silent broker is found within 0.6 s: learners then re-join the next one.
                       "--set", "wire.heartbeat_interval_ms=200",
                       "--set", "data.synthetic_bytes=1048576", "--json"]
        self.logs = []
        self.started = time.time()
        self.broker, self.broker_log = None, None
        self.shards, self.learners = [], []

    def start(self, role, index, *extra):
        path = os.path.join(self.work, f"{role}-{index}.{len(self.logs)}.log")
        self.logs.append(path)
        with open(path, "w") as log:
            proc = subprocess.Popen([self.binary, "node", "--role", role, "--index", str(index), *self.common, *extra],
                                    stdout=log, stderr=subprocess.STDOUT)
        return proc, path

    def start_broker(self):
        self.broker, self.broker_log = self.start("broker", 0, "--db", self.broker_db)

    def check_alive(self):
        for name, (proc, path) in [("shard", s) for s in self.shards] + [("learner", l) for l in self.learners]:
            if proc.poll() == 0 and name == "learner":
                raise Failure(f"a learner finished its {self.steps} steps before the {self.kills} kills were done (a "
                              f"slow machine? raise BROKER_CRASH_STEPS). Its log: {path}")
            if proc.poll() is not None:
                raise Failure(f"a {name} exited ({proc.returncode}) while the broker was being killed; "
                              f"it must never need a restart. Its log: {path}")
        if time.time() - self.started > RUN_BOUND_S:
            raise Failure(f"the test ran over its bound of {RUN_BOUND_S:.0f} s")

    def wait_for_round(self, at_least, since):
        """Until the tape holds a round numbered >= at_least; returns seconds since `since`."""
        deadline = time.time() + RESUME_BOUND_S
        while time.time() < deadline:
            self.check_alive()
            if self.broker.poll() is not None:
                raise Failure(f"the broker exited by itself ({self.broker.returncode}); log {self.broker_log}")
            if any(r["round"] >= at_least for r in tape(self.binary, self.broker_db)):
                return time.time() - since
            time.sleep(0.3)
        raise Failure(f"no round >= {at_least} committed within {RESUME_BOUND_S:.0f} s; logs in {self.work}")

    def stop_all(self):
        for proc, _ in ([(self.broker, self.broker_log)] if self.broker else []) + self.shards + self.learners:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def recovery_line(mesh, k):
    """The restarted broker's log line naming its incarnation, first round and restored ledger."""
    deadline = time.time() + 10
    while time.time() < deadline:
        recovered = re.search(r"recovered \(incarnation (\d+)\): rounds from (\d+); the ledger of (\d+) "
                              r"learner incarnation\(s\) restored \((\d+) tokens processed, (\d+) merged\)",
                              read(mesh.broker_log))
        if recovered:
            return recovered
        time.sleep(0.1)
    raise Failure(f"restart {k}: the broker did not report its recovery; log {mesh.broker_log}")


def kill_and_restart(mesh, k, rng, heads):
    """One SIGKILL of the broker and its restart on the same store. The new broker numbers
    after every round the old one opened (its round lease); rounds resume; the shards publish
    and commit again and no fragment goes back. Returns (its incarnation, seconds to its
    first round, the shards' heads now)."""
    time.sleep(rng.uniform(0.3, 2.0))  # a seeded point in the run
    mesh.check_alive()
    mesh.broker.send_signal(signal.SIGKILL)
    mesh.broker.wait()
    last_round = max(r["round"] for r in tape(mesh.binary, mesh.broker_db))
    at_kill = [shard_head(mesh.binary, db) for db in mesh.shard_dbs]
    time.sleep(rng.uniform(0.2, 1.5))  # the supervisor's restart delay
    mesh.check_alive()
    restarted_at = time.time()
    mesh.start_broker()
    recovered = recovery_line(mesh, k)
    inc, first_round = int(recovered.group(1)), int(recovered.group(2))
    if first_round <= last_round:
        raise Failure(f"restart {k}: rounds from {first_round}, but the tape holds round {last_round}")
    if int(recovered.group(4)) == 0:
        raise Failure(f"restart {k}: no ledger restored ({recovered.group(0)})")
    resume_s = mesh.wait_for_round(first_round, restarted_at)
    deadline = time.time() + RESUME_BOUND_S
    for s in range(2):
        while shard_head(mesh.binary, mesh.shard_dbs[s]) <= at_kill[s]:
            if time.time() > deadline:
                raise Failure(f"restart {k}: shard {s} committed nothing new since the kill (head {at_kill[s]})")
            mesh.check_alive()
            time.sleep(0.3)
    now = [shard_heads(mesh.binary, db) for db in mesh.shard_dbs]
    for s in range(2):
        for p, v in heads[s][1].items():
            if now[s][1].get(p, -1) < v:
                raise Failure(f"restart {k}: shard {s} fragment {p} went back from {v} to {now[s][1].get(p)}")
    return inc, resume_s, now


def leave(learners, bound_s):
    """SIGTERM to every learner (proc, log path): each finishes its step, says its last Progress
    and leaves, exit 0. Their reports. Sooner than waiting out a step budget sized for a slow
    machine, and the same check: the ledger must hold exactly what each one reports."""
    for proc, _ in learners:
        proc.send_signal(signal.SIGTERM)
    reports = []
    for i, (proc, path) in enumerate(learners):
        try:
            proc.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            raise Failure(f"learner {i} did not leave within {bound_s:.0f} s of SIGTERM; log {path}")
        r = last_json(path)
        if proc.returncode != 0 or not r or r.get("steps", 0) <= 0:
            raise Failure(f"learner {i} exited {proc.returncode} with {r}; log {path}")
        reports.append(r)
    return reports


def finish(mesh, incarnations):
    """The learners leave under the last broker (it committed a round), never restarted; then the
    shards and the broker stop. Returns the last broker's summary and the learners' reports."""
    reports = leave(mesh.learners, 30)
    for i, (_, path) in enumerate(mesh.learners):
        for inc in incarnations[-1:]:  # it followed the broker to its last incarnation
            if f"sync_broker/0 incarnation {inc} (epoch" not in read(path):
                raise Failure(f"learner {i} never saw broker incarnation {inc}; log {path}")
    for proc, _ in mesh.shards:
        proc.send_signal(signal.SIGTERM)
    mesh.broker.send_signal(signal.SIGTERM)
    for proc, path in mesh.shards + [(mesh.broker, mesh.broker_log)]:
        proc.wait(timeout=30)
        if proc.returncode != 0:
            raise Failure(f"exit {proc.returncode}; log {path}")
    final = last_json(mesh.broker_log)
    if not final:
        raise Failure(f"the last broker printed no result; log {mesh.broker_log}")
    return final, reports


def check_ledger(final, reports):
    """The last broker's ledger balances and holds exactly what each learner's one incarnation reports."""
    ledger = final["ledger"]
    if not final["ledger_balanced"]:
        raise Failure(f"the last broker's ledger does not balance: {ledger}")
    seen = {}
    for rec in final["learners"]:
        seen.setdefault(rec["learner"], []).append(rec)
    for i, r in enumerate(reports):
        recs = seen.get(i, [])
        if [rec["incarnation"] for rec in recs] != [r["incarnation"]]:
            raise Failure(f"learner {i} (incarnation {r['incarnation']}): the broker's ledger holds "
                          f"{[(rec['incarnation'], rec['processed']) for rec in recs]}")
        if recs[0]["processed"] != r["tokens"]:
            raise Failure(f"learner {i}: the ledger holds {recs[0]['processed']} tokens processed, the learner "
                          f"reports {r['tokens']}")
    if ledger["processed"] != sum(r["tokens"] for r in reports) or ledger["merged"] == 0:
        raise Failure(f"ledger {ledger} vs the learners' {[r['tokens'] for r in reports]}")
    if final["rounds"] == 0:
        raise Failure(f"the last broker closed no round: {final}")


def check_tape(binary, db):
    """The tape across every broker: no round number twice, versions only grow per fragment."""
    rounds = tape(binary, db)
    numbers = [r["round"] for r in rounds]
    if len(numbers) != len(set(numbers)):
        raise Failure(f"a round number was used twice on the tape: {sorted(numbers)}")
    latest = {}
    for r in rounds:
        if r["version"] <= latest.get(r["fragment"], 0):
            raise Failure(f"fragment {r['fragment']} went from version {latest[r['fragment']]} to "
                          f"{r['version']} (round {r['round']})")
        latest[r["fragment"]] = r["version"]
    return rounds


def main():
    binary = os.environ["ARCHIPELAGO"]
    kills = int(os.environ.get("BROKER_KILLS", "3"))
    seed = int(os.environ.get("BROKER_CRASH_SEED", "1"))
    # At least 22 s + 10 s per kill at the fixed pace: a kill cycle takes 3-6 s, and more than 8 s on a
    # machine loaded by other tests (800 + 400 per kill ran out once beside the Slurm test and the sims).
    steps = int(os.environ.get("BROKER_CRASH_STEPS", str(1100 + 500 * kills)))
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="archipelago-broker-crash-")
    mesh = Mesh(binary, work, steps, kills)
    try:
        mesh.start_broker()
        mesh.shards = [mesh.start("shard", s, "--db", mesh.shard_dbs[s]) for s in range(2)]
        time.sleep(0.5)
        mesh.learners = [mesh.start("learner", i) for i in range(LEARNERS)]
        mesh.wait_for_round(0, mesh.started)
        time.sleep(1.5)  # the broker's ledger reaches its store each second: kill after at least one write
        heads = [shard_heads(binary, db) for db in mesh.shard_dbs]
        incarnations, resume_s = [], []
        for k in range(1, kills + 1):
            inc, resumed, heads = kill_and_restart(mesh, k, rng, heads)
            incarnations.append(inc)
            resume_s.append(resumed)
        final, reports = finish(mesh, incarnations)
        check_ledger(final, reports)
        rounds = check_tape(binary, mesh.broker_db)
        ledger = final["ledger"]
        print(f"ok: {kills} SIGKILLs of the broker in {time.time() - mesh.started:.0f} s (seed {seed}); after each the "
              f"new incarnation numbered after the old rounds, restart → first new round committed: "
              f"{', '.join(f'{s:.1f}' for s in resume_s)} s; {len(rounds)} rounds on the tape; the learners "
              f"left on SIGTERM under the last broker: ledger merged {ledger['merged']}, late "
              f"{ledger['late']}, lost {ledger['lost']} of {ledger['processed']} tokens, balanced, equal to the "
              f"learners' counts")
    except Failure as f:
        print(f"FAIL (seed {seed}, BROKER_CRASH_SEED={seed} reproduces the kill points; logs in {work}): {f}",
              flush=True)
        sys.exit(1)
    finally:
        mesh.stop_all()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
