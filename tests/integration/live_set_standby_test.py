#!/usr/bin/env python3
"""Integration: a live change survives a takeover. A primary broker and a standby
(`--standby --index 1`, each on its own --db), a shard and two learners
(`archipelago node` processes over tcp:// with CURVE); an admin key sets K=2 and
grace=1.5 on the primary, then the primary's host is lost (SIGKILL). The standby
takes over from its copy of the tape and leads with K=2 and grace=1.5 (its
/status), not the configuration's K=1, and every merged round it closes has both
learners.

Usage: live_set_standby_test.py ARCHIPELAGO_BINARY
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports  # noqa: E402
import node_procs  # noqa: E402
from node_procs import PROCS, check, fail  # noqa: E402
from node_procs import status  # noqa: E402

BINARY = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(prefix="archipelago-live-set-standby-")
KEYS = os.path.join(WORK, "keys")


primary_port, standby_port, shard_port, primary_metrics, standby_metrics = free_ports(5)
PRIMARY = f"tcp://127.0.0.1:{primary_port}"
COMMON = ["--broker", f"{PRIMARY},tcp://127.0.0.1:{standby_port}", "--shards", f"tcp://127.0.0.1:{shard_port}",
          "--learners", "2", "--steps", "100000", "--set", "mesh.shards=1", "--set", f"wire.allow={KEYS}",
          "--set", "mesh.step_time_ms=30"]


def start(name, args):
    node_procs.start(BINARY, WORK, name, [*args, *COMMON])


def wait_for(what, predicate, bound_s):  # a standby's /status lacks fields while it follows
    return node_procs.wait_for(what, predicate, bound_s, (*node_procs.NOT_YET, KeyError))


try:
    os.makedirs(KEYS)
    for name in ["broker", "broker-1", "shard-0", "learner-0", "learner-1", "admin"]:
        r = subprocess.run([BINARY, "keygen", "--name", name, "--dir", KEYS], capture_output=True, text=True)
        check(r.returncode == 0, f"keygen {name}: {r.stderr}")
    start("primary", ["--role", "broker", "--db", os.path.join(WORK, "primary-db"), "--metrics-host", "127.0.0.1",
                      "--metrics-port", str(primary_metrics)])
    start("standby", ["--role", "broker", "--standby", "--index", "1", "--db", os.path.join(WORK, "standby-db"),
                      "--metrics-host", "127.0.0.1", "--metrics-port", str(standby_metrics)])
    start("shard", ["--role", "shard", "--index", "0", "--db", os.path.join(WORK, "shard-db")])
    for i in range(2):
        start(f"learner-{i}", ["--role", "learner", "--index", str(i)])
    wait_for("the primary leading, 10 rounds closed", lambda: status(primary_metrics)["rounds_closed"] >= 10, 120)

    r = subprocess.run([BINARY, "set", "K=2", "grace=1.5", "--broker", PRIMARY, "--key", os.path.join(KEYS, "admin.key"),
                        "--set", f"wire.allow={KEYS}", "--json"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"set K=2 grace=1.5: exit {r.returncode}: {r.stdout} {r.stderr}")
    first = json.loads(r.stdout.splitlines()[-1])["first_round"]
    # The change taped (with a round committed after it) and copied to the standby (BrokerState, about each second).
    wait_for("10 merged rounds under K = 2", lambda: len([x for x in status(primary_metrics)["recent_rounds"]
                                                          if x["round"] >= first and x["quorum_ms"] >= 0]) >= 10, 120)
    time.sleep(3)
    PROCS["primary"][0].send_signal(signal.SIGKILL)  # its host lost
    PROCS["primary"][0].wait(timeout=30)
    s = wait_for("the standby leading", lambda: (lambda s: s if s.get("leading", True) and "quorum" in s else None)(
        status(standby_metrics)), 60)
    check(s["quorum"] == 2 and s["grace_factor"] == 1.5 and "mesh.quorum=2" in s["settings_live"],
          f"the standby leads with quorum {s['quorum']}, grace {s['grace_factor']}, live '{s['settings_live']}'")
    rounds = wait_for("20 merged rounds under the standby",
                      lambda: (lambda x: x if len(x) >= 20 else None)(
                          [x for x in status(standby_metrics)["recent_rounds"] if x["quorum_ms"] >= 0]), 120)
    check(all(x["members"] == 2 for x in rounds), f"rounds the standby closed: {rounds}")
    print(f"PASS: set K=2 grace=1.5 from round {first} on the primary; the standby took over with them in force, "
          f"{len(rounds)} merged rounds of 2 members")
finally:
    for proc, _ in PROCS.values():
        if proc.poll() is None:
            proc.kill()
    shutil.rmtree(WORK, ignore_errors=True)
