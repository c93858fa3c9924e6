#!/usr/bin/env python3
"""Integration: a live change during `archipelago run`. A one-process mesh with
snapshots (`run --db`, four learners, K = 1 with a short grace) also binds its
broker on tcp:// for operators (`run --admin`, CURVE with the broker's key and an
admin key on wire.allow); `archipelago set K=4 grace=2` mid-run is answered with
the first round under the new values. After the run, `replay --db DB tape --json`
shows the change at that round, every taped round from it on has all four
learners as members, and the rounds before it fewer on average. `set` with a
learner's key stops before sending; a Contribution sent to the admin endpoint
with a learner's own key is refused (it hears Reconfigure only); the endpoint
refuses to bind without wire.curve, and a port in use ends the run with the reason.

Usage: run_live_set_test.py ARCHIPELAGO_BINARY ARCHIPELAGO_TEST_PEER
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports  # noqa: E402

BINARY = os.path.abspath(sys.argv[1])
TEST_PEER = os.path.abspath(sys.argv[2])
WORK = tempfile.mkdtemp(prefix="archipelago-run-live-set-")
KEYS = os.path.join(WORK, "keys")
DB = os.path.join(WORK, "db")
LOG = os.path.join(WORK, "run.log")
RUN = []  # the run, then the test peer


def fail(message):
    for proc in RUN:
        if proc.poll() is None:
            proc.kill()
    if os.path.exists(LOG):
        sys.stderr.write(f"--- run ---\n{log_text()[-3000:]}\n")
    sys.exit(f"FAIL: {message}")


def log_text():
    with open(LOG) as f:
        return f.read()


def check(condition, message):
    if not condition:
        fail(message)


def run_cli(*args, timeout=60):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout)


def wait_for(what, predicate, bound_s):
    deadline = time.time() + bound_s
    while time.time() < deadline:
        check(RUN[0].poll() is None, f"{what}: the run exited ({RUN[0].returncode})")
        try:
            value = predicate()
            if value:
                return value
        except (urllib.error.URLError, ConnectionError, ValueError):
            pass
        time.sleep(0.5)
    fail(f"{what}: not within {bound_s} s")


admin_port, metrics_port = free_ports(2)
ADMIN = f"tcp://127.0.0.1:{admin_port}"


def status():
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/status", timeout=10) as r:
        return json.loads(r.read())


try:
    os.makedirs(KEYS)
    for name in ["broker", "admin", "learner-0"]:
        r = run_cli("keygen", "--name", name, "--dir", KEYS)
        check(r.returncode == 0, f"keygen {name}: {r.stderr}")
    # Without CURVE the admin endpoint is refused: no weaker path than `node --role broker`.
    r = run_cli("run", "--learners", "2", "--steps", "10", "--out", "", "--report", "", "--admin", ADMIN,
                "--set", "wire.curve=false")
    check(r.returncode != 0 and "wire.curve" in r.stderr, f"run --admin without CURVE: {r.returncode} {r.stderr}")
    # An admin endpoint it cannot bind (the port in use) ends the run with the reason.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", admin_port))
        taken.listen()
        r = run_cli("run", "--learners", "2", "--steps", "10", "--out", "", "--report", "", "--admin", ADMIN,
                    "--set", f"wire.allow={KEYS}", timeout=120)
    check(r.returncode == 2 and "Address already in use" in r.stderr and "could not listen" in r.stderr,
          f"run --admin on a port in use: {r.returncode} {r.stderr[-1000:]}")

    with open(LOG, "w") as out:
        RUN.append(subprocess.Popen(
            [BINARY, "run", "--learners", "4", "--steps", "100000", "--db", DB, "--out", "", "--report", "",
             "--admin", ADMIN, "--set", f"wire.allow={KEYS}", "--set", "mesh.step_time_ms=20",
             "--set", "mesh.grace_factor=0.1", "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
             "--json"], stdout=out, stderr=subprocess.STDOUT))
    wait_for("40 rounds closing", lambda: status()["rounds_closed"] >= 40, 120)

    admin = ["--broker", ADMIN, "--set", f"wire.allow={KEYS}"]
    # A learner's key is not an admin: `set` stops before sending (the key is bound to learner-0).
    r = run_cli("set", "K=2", *admin, "--key", os.path.join(KEYS, "learner-0.key"))
    check(r.returncode == 2 and "bound to learner-0" in r.stderr, f"set with a learner's key: {r.returncode} {r.stderr}")
    r = run_cli("set", "K=4", "grace=2", *admin, "--key", os.path.join(KEYS, "admin.key"), "--json")
    check(r.returncode == 0, f"set K=4 grace=2: exit {r.returncode}: {r.stdout} {r.stderr}")
    answer = json.loads(r.stdout.splitlines()[-1])
    check(answer["accepted"] and answer["settings"] == "mesh.quorum=4 mesh.grace_factor=2", f"set: {answer}")
    first = answer["first_round"]
    # The admin endpoint hears Reconfigure only: learner-0's own key (archipelago_test_peer)
    # sending a Contribution there, in its own name, is refused and logged.
    keys = {}
    for name in ["learner-0", "broker"]:
        with open(os.path.join(KEYS, name + ".key")) as f:
            keys[name] = dict(line.split(" = ") for line in f.read().splitlines() if " = " in line)
    RUN.append(subprocess.Popen([TEST_PEER, "--self", "learner/0", "--bind", "tcp://127.0.0.1:0",
                                 "--peer", f"sync_broker/0={ADMIN}", "--send", "contribution",
                                 "--curve-secret", keys["learner-0"]["secret"].strip('"'),
                                 "--curve-public", keys["learner-0"]["public"].strip('"'),
                                 "--server-key", keys["broker"]["public"].strip('"'),
                                 "--allow", "broker=" + keys["broker"]["public"].strip('"')], stdout=subprocess.DEVNULL))
    wait_for("the admin endpoint refusing a learner's Contribution",
             lambda: "refused Contribution from learner/0 on the admin endpoint" in log_text(), 30)
    RUN[1].send_signal(signal.SIGTERM)
    RUN[1].wait(timeout=30)
    s = status()
    check(s["quorum"] == 4 and s["grace_factor"] == 2, f"/status after the change: quorum {s['quorum']}, "
                                                        f"grace {s['grace_factor']}")
    wait_for("40 rounds closed under K = 4",
             lambda: len([x for x in status()["recent_rounds"] if x["round"] >= first and x["quorum_ms"] >= 0]) >= 40,
             120)
    RUN[0].send_signal(signal.SIGTERM)
    check(RUN[0].wait(timeout=120) == 0, f"run exited {RUN[0].returncode}")

    r = run_cli("replay", "--db", DB, "tape", "--json")
    check(r.returncode == 0, f"replay tape: {r.returncode} {r.stderr}")
    rounds = json.loads(r.stdout.splitlines()[-1])["rounds"]
    noted = [t for t in rounds if "settings" in t]
    check(len(noted) == 1 and noted[0]["settings"] == f"from round {first}: mesh.quorum=4 mesh.grace_factor=2",
          f"the tape's settings records: {noted}")
    check(f"-- set live from round {first}: mesh.quorum=4 mesh.grace_factor=2" in r.stdout,
          "replay tape does not show the change")
    before = [len(t["members"]) for t in rounds if t["round"] < first]
    after = [len(t["members"]) for t in rounds if t["round"] >= first]
    check(len(before) >= 20 and len(after) >= 20, f"{len(before)} taped rounds before round {first}, {len(after)} after")
    check(all(n == 4 for n in after), f"rounds from {first} with fewer than 4 members: "
                                      f"{[(t['round'], len(t['members'])) for t in rounds if t['round'] >= first and len(t['members']) < 4]}")
    mean_before = sum(before) / len(before)
    check(mean_before < 3.5, f"members per round before the change: {mean_before:.2f} (K = 1 with a short grace)")
    print(f"members per round: {mean_before:.2f} over {len(before)} taped rounds before round {first} "
          f"(K=1, grace 0.1), {sum(after) / len(after):.2f} over {len(after)} from it (K=4, grace 2)")
    print(f"PASS: run --admin: set K=4 grace=2 from round {first}, on the tape there, every round from it merged 4")
finally:
    for proc in RUN:
        if proc.poll() is None:
            proc.kill()
    shutil.rmtree(WORK, ignore_errors=True)
