#!/usr/bin/env python3
"""Integration: `archipelago set` changes K and the grace factor of a running mesh
over tcp:// with CURVE. A broker, a shard and two learners (`archipelago node`
processes, each with its own keypair); an admin key on the allow-list sets K=2
and grace=1.5: the broker answers with the first round under them, /status shows
them and every merged round from then on has both learners; `replay tape` shows
the change at the round it took effect. The broker refuses K above the learners
with the reason; a knob in the mesh agreement hash is refused before anything is
sent; with a learner's key (archipelago_test_peer, an attacker with its own key)
a Reconfigure claiming to come from the admin is refused as an impersonation, and
one in the learner's own name as not permitted: both counted, K unchanged. Then the
broker is SIGKILLed and restarted on its store: it leads with K=2 and grace=1.5
again (from its tape), /status shows them and every merged round after has both learners.

Usage: live_set_test.py ARCHIPELAGO_BINARY ARCHIPELAGO_TEST_PEER
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports  # noqa: E402
import node_procs  # noqa: E402
from node_procs import PROCS, check, fail  # noqa: E402
from node_procs import wait_for  # noqa: E402

BINARY = os.path.abspath(sys.argv[1])
TEST_PEER = os.path.abspath(sys.argv[2])
WORK = tempfile.mkdtemp(prefix="archipelago-live-set-")
KEYS = os.path.join(WORK, "keys")


def run_cli(*args, timeout=60):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout)


broker_port, shard_port, l0_port, l1_port, metrics_port = free_ports(5)
BROKER = f"tcp://127.0.0.1:{broker_port}"
COMMON = ["--broker", BROKER, "--shards", f"tcp://127.0.0.1:{shard_port}", "--learners", "2", "--steps", "100000",
          "--set", "mesh.shards=1", "--set", f"wire.allow={KEYS}", "--set", "mesh.step_time_ms=30"]


def start(name, args):
    node_procs.start(BINARY, WORK, name, [*args, *COMMON])


def status():
    return node_procs.status(metrics_port)


try:
    os.makedirs(KEYS)
    for name in ["broker", "shard-0", "learner-0", "learner-1", "learner-5", "admin"]:
        r = run_cli("keygen", "--name", name, "--dir", KEYS)
        check(r.returncode == 0, f"keygen {name}: {r.stderr}")
    start("broker", ["--role", "broker", "--db", os.path.join(WORK, "broker-db"), "--metrics-host", "127.0.0.1",
                     "--metrics-port", str(metrics_port)])
    start("shard", ["--role", "shard", "--index", "0", "--db", os.path.join(WORK, "shard-db")])
    for i, port in enumerate([l0_port, l1_port]):
        start(f"learner-{i}", ["--role", "learner", "--index", str(i), "--listen", f"tcp://127.0.0.1:{port}"])
    wait_for("rounds closing", lambda: status()["rounds_closed"] >= 10, 120)

    admin = ["--broker", BROKER, "--key", os.path.join(KEYS, "admin.key"), "--set", f"wire.allow={KEYS}"]
    r = run_cli("set", "K=2", "grace=1.5", *admin, "--json")
    check(r.returncode == 0, f"set K=2 grace=1.5: exit {r.returncode}: {r.stdout} {r.stderr}")
    answer = json.loads(r.stdout.splitlines()[-1])
    check(answer["accepted"] and answer["settings"] == "mesh.quorum=2 mesh.grace_factor=1.5", f"set: {answer}")
    first = answer["first_round"]
    s = status()
    check(s["quorum"] == 2 and s["grace_factor"] == 1.5 and "mesh.quorum=2" in s["settings_live"], f"/status: {s}")
    check(any("set live from round" in e["text"] for e in s["events"]), f"/status events: {s['events']}")

    r = run_cli("set", "K=3", *admin)
    check(r.returncode == 1 and "must not exceed mesh.learners" in r.stdout, f"set K=3: {r.returncode} {r.stdout} {r.stderr}")
    r = run_cli("set", "mesh.rounds_in_flight=3", *admin)
    check(r.returncode == 2 and "mesh agreement hash" in r.stderr, f"set rounds_in_flight: {r.returncode} {r.stderr}")
    # A learner key (learner-5: no learner of this mesh) sends a Reconfigure claiming the admin
    # (an impersonation), then in its own name (not permitted).
    # (`archipelago set --key learner-0.key` stops before sending: that key is not bound to an admin.)
    r = run_cli("set", "K=1", "--broker", BROKER, "--key", os.path.join(KEYS, "learner-5.key"), "--set", f"wire.allow={KEYS}")
    check(r.returncode == 2 and "bound to learner-5" in r.stderr, f"set with a learner's key: {r.returncode} {r.stderr}")
    keys = {}
    for name in ["learner-5", "broker"]:
        with open(os.path.join(KEYS, name + ".key")) as f:
            keys[name] = dict(line.split(" = ") for line in f.read().splitlines() if " = " in line)
    for claim in ["admin/0", None]:
        peer = subprocess.Popen([TEST_PEER, "--self", "learner/5", "--bind", "tcp://127.0.0.1:0",
                                 "--peer", f"sync_broker/0={BROKER}", "--send", "reconfigure",
                                 "--curve-secret", keys["learner-5"]["secret"].strip('"'),
                                 "--curve-public", keys["learner-5"]["public"].strip('"'),
                                 "--server-key", keys["broker"]["public"].strip('"'),
                                 "--allow", "broker=" + keys["broker"]["public"].strip('"')]
                                + (["--claim", claim] if claim else []), stdout=subprocess.DEVNULL)
        time.sleep(3)
        peer.send_signal(signal.SIGTERM)
        peer.wait(timeout=30)
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
        text = page.read().decode()
    for reason in ["impersonation", "not_permitted"]:
        check(any(line.startswith("archipelago_wire_rejected_total") and f'reason="{reason}"' in line
                  and float(line.rsplit(" ", 1)[1]) >= 1 for line in text.splitlines()),
              f"the broker did not count the learner key's Reconfigure as {reason}")
    check(status()["quorum"] == 2, "K changed by a refused request")

    # Every merged round from `first` on has both learners.
    later = wait_for("20 rounds under K = 2", lambda: [x for x in status()["recent_rounds"]
                                                      if x["round"] >= first and x["quorum_ms"] >= 0][:20]
                     if len([x for x in status()["recent_rounds"] if x["round"] >= first]) >= 20 else None, 120)
    check(all(x["members"] == 2 for x in later), f"rounds under K = 2: {later}")

    # The broker dies (SIGKILL) and restarts on its store: it leads with the change its tape
    # records (K = 2, γ = 1.5), not the configuration's K = 1, and hands it in its Welcomes.
    last_before = max(x["round"] for x in status()["recent_rounds"])
    PROCS["broker"][0].send_signal(signal.SIGKILL)
    PROCS["broker"][0].wait(timeout=30)
    start("broker-restarted", ["--role", "broker", "--db", os.path.join(WORK, "broker-db"), "--metrics-host",
                               "127.0.0.1", "--metrics-port", str(metrics_port)])
    s = wait_for("the restarted broker's /status", lambda: status(), 60)
    check(s["quorum"] == 2 and s["grace_factor"] == 1.5 and "mesh.quorum=2" in s["settings_live"],
          f"/status after the restart: quorum {s['quorum']}, grace {s['grace_factor']}, live {s['settings_live']}")
    restarted = wait_for("20 rounds after the restart", lambda: [x for x in status()["recent_rounds"]
                                                                 if x["round"] > last_before and x["quorum_ms"] >= 0][:20]
                         if len([x for x in status()["recent_rounds"] if x["round"] > last_before
                                 and x["quorum_ms"] >= 0]) >= 20 else None, 120)
    check(all(x["members"] == 2 for x in restarted), f"rounds after the broker's restart: {restarted}")
    PROCS["broker"] = PROCS.pop("broker-restarted")

    for name in ["learner-0", "learner-1", "shard", "broker"]:
        PROCS[name][0].send_signal(signal.SIGTERM)
        PROCS[name][0].wait(timeout=60)
    r = run_cli("replay", "tape", "--db", os.path.join(WORK, "broker-db"), "--json")
    check(r.returncode == 0, f"replay tape: {r.returncode} {r.stderr}")
    check(f"-- set live from round {first}: mesh.quorum=2 mesh.grace_factor=1.5" in r.stdout,
          f"replay tape does not show the change:\n{r.stdout[-3000:]}")
    print(f"PASS: set K=2 grace=1.5 from round {first}, in force again after the broker's restart; refusals and "
          f"the impersonation counted")
finally:
    for proc, _ in PROCS.values():
        if proc.poll() is None:
            proc.kill()
    shutil.rmtree(WORK, ignore_errors=True)
