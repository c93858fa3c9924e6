#!/usr/bin/env python3
"""Integration: cold restart of a mesh of `archipelago node` processes. A broker
and two shards, each with its store (laid out as deploy/launch.py --db lays them:
DIR/broker, DIR/shard-I), and two learners train; every process is SIGKILLed at
once, then started again on the same stores.

Checked:
- before the restart, `replay --db DIR check` passes on the killed stores, and
  each shard's store holds a newest version (`replay --db DIR/shard-I list`);
- no shard rolls back: each restarted shard resumes from exactly its store's
  newest version (its node summary's resumed_version), and its store's versions
  after the restart go on above it;
- the global model (`replay --db DIR eval head`) of the restarted broker and
  shards, before any learner is back, evaluates within 1 % of the head at the
  kill; with the learners back, each shard commits 20 more versions and the
  head evaluates below the one at the kill (it keeps learning).

Usage: node_cold_restart_test.py ARCHIPELAGO_BINARY
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import Mesh, last_json  # noqa: E402

BINARY = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(prefix="archipelago-node-cold-restart-")
DB = os.path.join(WORK, "db")
SHARDS, LEARNERS = 2, 2
KNOBS = ["mesh.shards=2", "data.synthetic_bytes=1048576", "data.eval_tokens=8192", "data.batch=4",
         "train.threads=1", "mesh.step_time_ms=20"]
mesh = None


def fail(message):
    if mesh:
        mesh.stop_all(signal.SIGKILL)
        for name, (_, log) in mesh.processes.items():
            with open(log) as f:
                sys.stderr.write(f"--- {name} ---\n{f.read()[-2000:]}\n")
    sys.exit(f"FAIL: {message}")


def check(condition, message):
    if not condition:
        fail(message)


def replay(dbs, *args, may_fail=False):
    """The JSON line of `replay`; None if it failed and `may_fail` (a store not created yet)."""
    cmd = [BINARY, "replay"] + [x for db in dbs for x in ("--db", db)] + list(args) + ["--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0 and may_fail:
        return None
    check(out.returncode == 0, f"{' '.join(cmd[1:])}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def shard_db(s):
    return os.path.join(DB, f"shard-{s}")


def newest_versions(starting=True):
    """Each shard store's newest version, read beside its live writer (None: none yet;
    while `starting`, a store its shard has not made yet too)."""
    out = []
    for s in range(SHARDS):
        listed = replay([shard_db(s)], "list", may_fail=starting)
        out.append(listed["rows"][-1]["version"] if listed and listed["rows"] else None)
    return out


def wait_for(what, predicate, bound_s):
    deadline = time.time() + bound_s
    while time.time() < deadline:
        for name, (proc, log) in mesh.processes.items():
            check(proc.poll() is None, f"{what}: {name} exited ({proc.returncode}); log {log}")
        value = predicate()
        if value:
            return value
        time.sleep(1)
    fail(f"{what}: not within {bound_s} s")


try:
    args = argparse.Namespace(learners=LEARNERS, shards=SHARDS, standbys=0, mode="decoupled", steps=100000,
                              set=KNOBS, curve=True, shared_learner_key=False, db=DB, resume_from=None,
                              binary=BINARY, log_format="text", log_level="warn")
    mesh = Mesh(args)
    t0 = time.time()
    mesh.start("broker")
    for s in range(SHARDS):
        mesh.start("shard", s)
    time.sleep(0.5)
    for i in range(LEARNERS):
        mesh.start("learner", i)
    # Until each shard has committed 200 versions of its own.
    wait_for("200 versions per shard", lambda: all(v is not None and v >= 200 for v in newest_versions()), 150)
    for proc, _ in mesh.processes.values():  # every node at once
        proc.send_signal(signal.SIGKILL)
    for proc, _ in mesh.processes.values():
        proc.wait()
    trained_s = time.time() - t0

    check(replay([DB], "check")["ok"], "replay check of the killed stores")
    killed = newest_versions(starting=False)
    at_kill = replay([DB], "eval", "head")["eval_loss"]
    first = replay([DB], "eval", "0")["eval_loss"]
    check(at_kill < first, f"the model learned before the kill: eval {at_kill} at the head, {first} at cut 0")

    # The broker and the shards first: each shard restores its store's newest version, and
    # with no learner yet, the head the restarted mesh holds is the one at the kill.
    mesh.start("broker")
    for s in range(SHARDS):
        mesh.start("shard", s)
    time.sleep(3)
    restored = replay([DB], "eval", "head")["eval_loss"]
    check(abs(restored - at_kill) <= 0.01 * at_kill, f"the restarted mesh's head evaluates {restored}, {at_kill} "
                                                     "at the kill")
    t1 = time.time()
    for i in range(LEARNERS):
        mesh.start("learner", i)
    wait_for("20 more versions per shard",
             lambda: all(v is not None and v >= k + 20 for v, k in zip(newest_versions(), killed)), 90)
    restarted_s = time.time() - t1
    mesh.stop_all()
    for s in range(SHARDS):
        summary = last_json(mesh.processes[f"shard-{s}"][1])
        check(summary is not None, f"shard {s}: no summary")
        check(summary["resumed_version"] == killed[s],
              f"shard {s} resumed from version {summary['resumed_version']}, its store's newest was {killed[s]}")
        check(summary["mesh_version"] >= killed[s] + 20, f"shard {s}: {summary['mesh_version']} after the restart")
    check(replay([DB], "check")["ok"], "replay check after the restart")
    after = replay([DB], "eval", "head")["eval_loss"]
    check(after < at_kill, f"eval {after:.4f} after the restart, {at_kill:.4f} at the kill: it learns on")
    print(f"node cold restart: shards' newest versions at the kill {killed}, resumed from exactly them; eval loss "
          f"{first:.4f} at cut 0, {at_kill:.4f} at the kill ({trained_s:.0f} s of training), {restored:.4f} for the "
          f"restarted shards' head ({100 * (restored - at_kill) / at_kill:+.2f} %), {after:.4f} with "
          f"{[v - k for v, k in zip(newest_versions(starting=False), killed)]} more versions {restarted_s:.0f} s after the "
          f"learners restarted")
    print("PASS: every node SIGKILLed at once and restarted on its store: no shard rolled back, the model "
          "evaluates as before and keeps learning")
finally:
    if mesh:
        mesh.stop_all(signal.SIGKILL)
        shutil.rmtree(mesh.logs, ignore_errors=True)
    shutil.rmtree(WORK, ignore_errors=True)
