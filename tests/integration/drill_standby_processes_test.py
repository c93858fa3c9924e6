#!/usr/bin/env python3
"""Integration: the standby-broker drills across processes (`archipelago drill --processes`).

Runs the battery's two plans with a standby (deploy/drills/broker_host_lost.toml and
broker_partition.toml) at a fifth of their time against a mesh of `archipelago node`
processes — the primary broker, a standby (`--standby --index 1`), two shards, four
learners, every node given the list of both brokers — and watches the drill's
children itself, in /proc and on each broker's /status:

- broker_host_lost: the primary's process is really gone (SIGKILLed: no process of
  it after the fault, none started again), its store directory removed; the standby
  ran as one process throughout and its /status said it leads, in a newer epoch;
- broker_partition: both brokers ran as one process each throughout (a partition
  kills nothing); the standby's /status said it leads while the primary was cut
  off; after the heal the primary's /status said it follows the standby's epoch;
- both: the drill passes (no global downtime beyond the takeover bound, no committed
  version lost, the ledger exact), the epochs on the brokers' tapes are in order with
  no merge by a deposed broker (drill_test.check_brokers), the launcher recorded the
  host's loss with its pid (process_events), and no child is left behind.

Usage: drill_standby_processes_test.py ARCHIPELAGO_BINARY
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from node_children import alive, children_of, node_status  # noqa: E402
import drill_test  # noqa: E402

BINARY = os.path.abspath(sys.argv[1])
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORK = tempfile.mkdtemp(prefix="archipelago-drill-standby-")
SCALE = "0.2"


def fail(message, output=""):
    sys.stderr.write(output[-6000:] + "\n")
    sys.exit(f"FAIL: {message} (work directory kept: {WORK})")


def check(condition, message, output=""):
    if not condition:
        fail(message, output)


def run(plan):
    """Runs the plan across processes, watching its children; returns what was seen."""
    work = os.path.join(WORK, plan + "-work")
    report_dir = os.path.join(WORK, plan + "-report")
    cmd = [BINARY, "drill", "--processes", "--plan", os.path.join(REPO, "deploy", "drills", plan + ".toml"),
           "--time-scale", SCALE, "--step-time-ms", "250", "--no-reference", "--report", report_dir,
           "--work-dir", work, "--json"]
    print("$", " ".join(cmd), flush=True)
    log = open(os.path.join(WORK, plan + ".out"), "w+")
    drill = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    pids = {}       # node -> [pids in order]
    statuses = {}   # broker node -> [(time, /status)] as it answered
    started = time.time()
    while drill.poll() is None:
        if time.time() - started > 240:
            drill.kill()
            drill.wait()
            log.seek(0)
            fail(f"{plan}: the drill did not finish within 240 s", log.read())
        for pid, (node, _, port) in children_of(drill.pid).items():
            if pid not in pids.setdefault(node, []):
                pids[node].append(pid)
            if node.startswith("broker"):
                s = node_status(port)
                if s is not None:
                    statuses.setdefault(node, []).append((time.time() - started, s))
        time.sleep(0.1)
    log.seek(0)
    output = log.read()
    left = [(node, pid) for node, ps in pids.items() for pid in ps if alive(pid)]
    check(not left, f"{plan}: child processes left behind: {left}", output)
    lines = [line for line in output.splitlines() if line.startswith("{")]
    check(lines, f"{plan}: the drill printed no JSON summary", output)
    summary = json.loads(lines[-1])
    check(drill.returncode == 0 and summary.get("passed"), f"{plan}: the drill failed (exit {drill.returncode})", output)
    with open(os.path.join(report_dir, f"{plan}-{summary['mode']}.json")) as f:
        report = json.load(f)
    return summary, report, pids, statuses, work, output


def common(plan, summary, report, pids, output):
    check(summary["processes"] is True and summary["standbys"] == 1, f"{plan}: processes with one standby", output)
    check(summary["downtime_s"] == 0, f"{plan}: global downtime {summary['downtime_s']} s", output)
    check(summary["committed_rounds_lost"] == 0, f"{plan}: committed versions lost", output)
    check(summary["ledger_exact"], f"{plan}: the ledger is not exact: {summary['ledger']}", output)
    check(len(pids) == 8, f"{plan}: 2 brokers, 2 shards, 4 learners ran: {sorted(pids)}", output)
    for node in ("shard-0", "shard-1", "learner-0", "learner-1", "learner-2", "learner-3", "broker-1"):
        check(len(pids.get(node, [])) == 1, f"{plan}: {node} ran as one process throughout: {pids}", output)
    check(len(summary["takeovers"]) == 1, f"{plan}: one takeover: {summary['takeovers']}", output)
    return drill_test.check_brokers(summary, report, output)


def leading_seen(statuses, node, epoch=None):
    return any(s.get("leading") and (epoch is None or s.get("epoch") == epoch) for _, s in statuses.get(node, []))


def main():
    begun = time.time()
    # The primary's host is lost.
    summary, report, pids, statuses, work, output = run("broker_host_lost")
    text_lost = common("broker_host_lost", summary, report, pids, output)
    takeover = summary["takeovers"][0]
    check(len(pids.get("broker", [])) == 1 and not alive(pids["broker"][0]),
          f"the primary ran as one process, now gone, never started again: {pids}", output)
    lost = [e for e in report["process_events"] if e["action"] == "lost"]
    check(len(lost) == 1 and lost[0]["node"] == "broker" and lost[0]["pid"] == pids["broker"][0] and
          "reaped" in lost[0]["detail"] and "NOT" not in lost[0]["detail"] and "removed" in lost[0]["detail"],
          f"the launcher SIGKILLed the primary's pid and removed its store: {lost}", output)
    check(not os.path.exists(os.path.join(work, "drill", "broker.db")), "the primary's store directory is gone", output)
    check(os.path.exists(os.path.join(work, "drill", "broker-1.db")), "the standby's store is there", output)
    check(not any(e["action"] == "start" and e["node"] == "broker" and e["t_s"] >= 0 for e in report["process_events"]),
          "the primary was never restarted", output)
    check(leading_seen(statuses, "broker-1", takeover["epoch"]),
          f"the standby's /status said it leads in epoch {takeover['epoch']}", output)

    # The primary partitioned from everyone, then healed.
    summary, report, pids, statuses, work, output = run("broker_partition")
    text_cut = common("broker_partition", summary, report, pids, output)
    takeover = summary["takeovers"][0]
    check(len(pids.get("broker", [])) == 1, f"the primary ran as one process throughout: {pids}", output)
    check(not any(e["action"] in ("kill", "lost") and e["t_s"] >= 0 for e in report["process_events"]),
          "a partition kills no process", output)
    check(leading_seen(statuses, "broker-1", takeover["epoch"]),
          f"the standby's /status said it leads in epoch {takeover['epoch']}", output)
    primary_after = [s for _, s in statuses.get("broker", []) if not s.get("leading") and s.get("epoch") == takeover["epoch"]]
    check(primary_after, "the primary's /status said it follows the standby's epoch after the heal", output)
    check(summary["step_downs"][0] >= 1 and summary["step_downs"][1] == 0,
          f"the primary stepped down, the standby did not: {summary['step_downs']}", output)
    print(f"ok: standby drills across processes in {time.time() - begun:.0f} s; broker_host_lost{text_lost}; "
          f"broker_partition{text_cut}")


main()
shutil.rmtree(WORK, ignore_errors=True)  # kept on a failure, for its logs
