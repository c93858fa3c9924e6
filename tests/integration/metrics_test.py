#!/usr/bin/env python3
"""Integration: live metrics, status and draining of a mesh of `archipelago
node` processes on loopback (tcp://, real RocksDB).

Each process serves --metrics-port. While the learners train, every node's
/metrics page must pass promtool's strict parser and linter (`promtool check
metrics`, the Prometheus project's own) and carry the figures of its role;
`archipelago status` must show the mesh. Then SIGTERM drains: a learner leaves
mid-run and exits 0 with its summary, the broker shows it as left; once the
others are done the shard exits 0 with its last version durable in its store,
and the broker exits 0 with a balanced ledger. Bad input: a port in use, a
status address that is not HOST:PORT, nobody listening, a learner's /status.

Usage: metrics_test.py ARCHIPELAGO_BINARY
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports  # noqa: E402  (deploy/launch.py: ports below the ephemeral range)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import node_procs  # noqa: E402
from node_procs import PROCS, check, fail  # noqa: E402

BINARY = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(prefix="archipelago-metrics-")
broker_port, shard_port, *metrics_ports = free_ports(7)
BROKER = f"tcp://127.0.0.1:{broker_port}"
SHARD = f"tcp://127.0.0.1:{shard_port}"
COMMON = ["--broker", BROKER, "--shards", SHARD, "--learners", "3", "--steps", "400",
          "--set", "mesh.shards=1", "--set", "wire.curve=false", "--set", "mesh.step_time_ms=40", "--json"]
METRICS = {"broker": metrics_ports[0], "shard": metrics_ports[1],
           "learner-0": metrics_ports[2], "learner-1": metrics_ports[3], "learner-2": metrics_ports[4]}


def start(role, index=0, extra=()):
    name = role if role != "learner" else f"learner-{index}"
    node_procs.start(BINARY, WORK, name, ["--role", role, "--index", str(index), "--metrics-host", "127.0.0.1",
                                          "--metrics-port", str(METRICS[name]), *COMMON, *extra])


def get(port, path, timeout=10):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def samples(page):
    """name{labels} -> value, for the content checks (promtool judged the syntax)."""
    out = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def value(page_samples, name, **labels):
    for key, v in page_samples.items():
        if key == name or key.startswith(name + "{"):
            if all(f'{k}="{val}"' in key for k, val in labels.items()):
                return v
    return None


def summary(name):
    proc, log = PROCS[name]
    with open(log) as f:
        lines = [line for line in f.read().splitlines() if line.startswith("{")]
    check(lines, f"{name} printed no JSON summary")
    return json.loads(lines[-1])


def wait_exit(name, bound_s):
    proc, _ = PROCS[name]
    try:
        return proc.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        fail(f"{name} did not exit within {bound_s} s")


def run_cli(*args, timeout=30):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout)


try:
    promtool = shutil.which("promtool")
    check(promtool, "promtool not found (Debian package prometheus; tools/setup.sh test installs it)")
    start("broker")
    start("shard", 0, ["--db", os.path.join(WORK, "shard-db")])
    for i in range(3):
        start("learner", i)

    # Every node answers /metrics once its role runs; wait (bounded) until the learners train.
    deadline = time.time() + 60
    while True:
        try:
            page = samples(get(METRICS["learner-0"], "/metrics")[2])
            if (value(page, "archipelago_learner_steps_total") or 0) >= 20:
                break
        except (urllib.error.URLError, ConnectionError, ValueError):
            pass
        check(time.time() < deadline, "learner 0 did not reach 20 steps within 60 s")
        time.sleep(0.5)

    pages = {}
    for name, port in METRICS.items():
        status, content_type, body = get(port, "/metrics")
        check(status == 200 and content_type.startswith("text/plain; version=0.0.4"),
              f"{name} /metrics: status {status}, content type {content_type!r}")
        lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30)
        check(lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(),
              f"{name}: promtool check metrics refused the page:\n{lint.stdout}{lint.stderr}\n{body[:2000]}")
        pages[name] = samples(body)
        check(value(pages[name], "archipelago_scrape_missing_actors") == 0, f"{name}: its actor did not answer the scrape")

    b, s, l0 = pages["broker"], pages["shard"], pages["learner-0"]
    check(value(b, "archipelago_node_info", role="sync_broker", index="0") == 1, "broker: node_info")
    check(value(b, "archipelago_rounds_opened_total") > 0, "broker: no round opened")
    check(sum(v for k, v in b.items() if k.startswith("archipelago_rounds_closed_total")) > 0, "broker: no round closed")
    check(value(b, "archipelago_learners_live") == 3, f"broker: learners live {value(b, 'archipelago_learners_live')}")
    check(value(b, "archipelago_ledger_balanced") == 1, "broker: ledger not balanced")
    check(value(b, "archipelago_ledger_tokens_total", bucket="processed") > 0, "broker: no tokens in the ledger")
    check(0 < value(b, "archipelago_goodput") <= 1.0, f"broker: goodput {value(b, 'archipelago_goodput')}")
    check(value(b, "archipelago_quorum_min") == 1, "broker: quorum K")
    check(value(b, "archipelago_fragment_version", fragment="0") >= 1, "broker: fragment 0 never published")
    check(value(b, "archipelago_wire_received_bytes_total", peer="learner/1") > 0, "broker: no bytes from learner/1")
    check(value(s, "archipelago_shard_published_total") > 0, "shard: nothing published")
    check(value(s, "archipelago_shard_contributions_total", outcome="merged") > 0, "shard: nothing merged")
    check(value(s, "archipelago_snapshot_commits_total") > 0, "shard: no snapshot committed")
    check(value(s, "archipelago_snapshot_commit_seconds_total") > 0, "shard: no snapshot latency")
    check(value(s, "archipelago_wire_sent_bytes_total", peer="learner/2") > 100_000,
          "shard: fragments to learner/2 not counted")
    check(value(l0, "archipelago_learner_steps_total") >= 20, "learner 0: steps")
    check(0.03 < value(l0, "archipelago_learner_step_seconds") < 5, "learner 0: step time (paced at 40 ms)")
    check(value(l0, "archipelago_learner_contributions_total") > 0, "learner 0: no contribution sent")
    check(value(l0, "archipelago_wire_sent_bytes_total", peer="parameter_shard/0") > 0, "learner 0: bytes to the shard")

    # The status page and the status command.
    status, content_type, body = get(METRICS["broker"], "/status")
    doc = json.loads(body)
    check(status == 200 and content_type == "application/json", "broker /status")
    check([m["learner"] for m in doc["learners"]] == [0, 1, 2] and all(m["state"] == "live" for m in doc["learners"]),
          f"/status learners: {doc['learners']}")
    check(doc["ledger_balanced"] and doc["rounds_closed"] > 0 and len(doc["fragment_versions"]) == 24,
          f"/status: {body[:500]}")
    out = run_cli("status", "--broker", f"127.0.0.1:{METRICS['broker']}", "--json")
    check(out.returncode == 0 and json.loads(out.stdout.splitlines()[-1])["learners_configured"] == 3,
          f"status --json: {out.returncode} {out.stdout} {out.stderr}")
    out = run_cli("status", "--broker", f"http://127.0.0.1:{METRICS['broker']}/", "--once")
    check(out.returncode == 0 and re.search(r"^\s+2\s+\d+\s+live", out.stdout, re.M) and "fragment versions" in out.stdout,
          f"status --once:\n{out.stdout}{out.stderr}")

    # Bad input.
    try:
        get(METRICS["learner-1"], "/status")
        fail("a learner's /status answered")
    except urllib.error.HTTPError as e:
        check(e.code == 404, f"a learner's /status: {e.code}")
    out = run_cli("status", "--broker", "nonsense")
    check(out.returncode == 2 and "HOST:PORT" in out.stderr, f"status --broker nonsense: {out.returncode} {out.stderr}")
    (dead_port,) = free_ports(1)
    out = run_cli("status", "--broker", f"127.0.0.1:{dead_port}", "--timeout", "2")
    check(out.returncode != 0 and f"127.0.0.1:{dead_port}" in out.stderr, f"status, nobody listening: {out.stderr}")
    out = run_cli("node", "--role", "learner", "--index", "2", "--metrics-host", "127.0.0.1",
                  "--metrics-port", str(METRICS["shard"]), *COMMON, timeout=60)
    check(out.returncode == 2 and f"--metrics-port {METRICS['shard']}" in out.stderr,
          f"a metrics port in use: {out.returncode} {out.stderr}")

    # SIGTERM drains a learner mid-run: it leaves after its step, exits 0, and says so.
    PROCS["learner-1"][0].send_signal(signal.SIGTERM)
    check(wait_exit("learner-1", 30) == 0, "learner 1 did not exit 0 on SIGTERM")
    left = summary("learner-1")
    check(0 < left["steps"] < 400, f"learner 1 drained after {left['steps']} steps")
    for name in ("learner-0", "learner-2"):
        check(wait_exit(name, 180) == 0, f"{name} failed")
        check(summary(name)["steps"] == 400, f"{name} steps")
    doc = json.loads(get(METRICS["broker"], "/status")[2])
    check(next(m for m in doc["learners"] if m["learner"] == 1)["state"] == "left", f"learner 1 after SIGTERM: {doc}")

    # ... the shard flushes its snapshots, the broker its ledger; both exit 0.
    PROCS["shard"][0].send_signal(signal.SIGTERM)
    check(wait_exit("shard", 90) == 0, "the shard did not exit 0 on SIGTERM")
    shard = summary("shard")
    listed = run_cli("replay", "--db", os.path.join(WORK, "shard-db"), "list", "--json")
    check(listed.returncode == 0, f"replay list: {listed.stderr}")
    newest = json.loads(listed.stdout.splitlines()[-1])
    check(shard["mesh_version"] > 0 and shard["published"] > 0, f"shard summary: {shard}")
    check(str(shard["mesh_version"]) in listed.stdout, f"the shard's last version {shard['mesh_version']} is not in its store")
    PROCS["broker"][0].send_signal(signal.SIGTERM)
    check(wait_exit("broker", 30) == 0, "the broker did not exit 0 on SIGTERM")
    broker = summary("broker")
    check(broker["ledger_balanced"] and broker["rounds"] > 0, f"broker summary: {broker}")
    print(f"OK: promtool accepted {len(pages)} pages ({sum(len(p) for p in pages.values())} samples); "
          f"status shows the mesh; learner 1 drained after {left['steps']} steps; shard flushed version "
          f"{shard['mesh_version']}; broker {broker['rounds']} rounds, ledger balanced")
finally:
    for proc, _ in PROCS.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shutil.rmtree(WORK, ignore_errors=True)
