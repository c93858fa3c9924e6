#!/usr/bin/env python3
"""Integration: a fault drill across processes (`archipelago drill --processes`).

A short plan of its own against a mesh of `archipelago node` processes on
loopback: a learner SIGKILLed and restarted, a learner paused (SIGSTOP /
SIGCONT), a learner partitioned off by ChaosCommands over tcp://, a lossy slow
link, a shard SIGKILLed and restarted on its store. While the drill runs, this
test watches the drill's children itself in /proc and the broker's /status:

- the killed learner's process is really gone and a new pid runs after the restart;
  the shard likewise; the new learner starts its learning-rate schedule where the
  mesh is (the broker's Welcome), not at step 0;
- the paused learner's process was really stopped (/proc state T), and runs again;
- the partitioned learner went silent at the broker (ChaosCommands took effect);
- the drill passes: no committed round lost, the ledger exact, zero global
  downtime while >= K learners live, the restarted learner merged again;
- the wire runs with CURVE (keys made for the run): the nodes accept handshakes;
- no child process is left behind; nor after a Ctrl-C (SIGINT) mid-drill.

Usage: drill_processes_test.py ARCHIPELAGO_BINARY
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from node_children import alive, children_of, node_status  # noqa: E402

BINARY = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(prefix="archipelago-drill-processes-")
PLAN = """
seed = 5
duration = "24s"
liveness = "8s"

[[fault]]
at = "3s"
kind = "crash"
target = "learner/1"
for = "3s"

[[fault]]
at = "4s"
kind = "pause"
target = "learner/2"
for = "3s"

[[fault]]
at = "9s"
kind = "partition"
for = "5s"
groups = [["learner/0"], ["learner/1", "learner/2", "broker", "shard/0", "shard/1"]]

[[fault]]
at = "12s"
kind = "shard_crash"
target = "shard/1"
for = "2s"

[[fault]]
at = "16s"
kind = "link"
target = "learner/2"
for = "5s"
delay_ms = 100
loss = 0.05
"""


def fail(message, drill_output=""):
    sys.stderr.write(drill_output[-6000:] + "\n")
    sys.exit(f"FAIL: {message} (work directory kept: {WORK})")


def check(condition, message, drill_output=""):
    if not condition:
        fail(message, drill_output)


def metrics(port):
    """A node's /metrics as [(series with labels, value)]; None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return None
    return [(line.rsplit(" ", 1)[0], float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines() if line and not line.startswith("#")]


def curve_accepted(port):
    """CURVE handshakes the node accepted; None if it does not answer."""
    page = metrics(port)
    if page is None:
        return None
    return sum(v for k, v in page if k.startswith("archipelago_wire_curve_handshakes_total{") and 'outcome="accepted"' in k)


def learner_schedule(port):
    """(schedule step, this incarnation's steps) of a learner; None if it does not answer yet."""
    values = {k.split("{")[0]: v for k, v in metrics(port) or []
              if k.split("{")[0] in ("archipelago_learner_schedule_step", "archipelago_learner_steps_total")}
    if len(values) < 2:
        return None
    return values["archipelago_learner_schedule_step"], values["archipelago_learner_steps_total"]


def run_drill(name, interrupt_after_s=None, bound_s=100):
    """Runs the plan; watches the children until the drill exits. Returns what was seen."""
    plan = os.path.join(WORK, f"{name}.toml")
    with open(plan, "w") as f:
        f.write(PLAN)
    cmd = [BINARY, "drill", "--processes", "--plan", plan, "--learners", "3", "--step-time-ms", "150",
           "--no-reference", "--report", os.path.join(WORK, f"{name}-report"),
           "--work-dir", os.path.join(WORK, f"{name}-work"), "--json"]
    log = open(os.path.join(WORK, f"{name}.out"), "w+")
    drill = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    seen = {}         # node -> [pids in order]
    stopped = set()   # nodes seen in state T
    silent_max = {}   # learner -> the longest silence the broker reported
    first_child_at = None  # when all 6 nodes were first seen
    start_step = {}   # learner pid -> where its schedule started (schedule step - its own steps)
    curve = {}        # node -> the most CURVE handshakes it accepted
    deadline = time.time() + bound_s
    interrupted = False
    while drill.poll() is None:
        if time.time() > deadline:
            drill.kill()
            drill.wait()
            log.seek(0)
            fail(f"the drill did not finish within {bound_s} s", log.read())
        kids = children_of(drill.pid)
        for pid, (node, state, port) in kids.items():
            pids = seen.setdefault(node, [])
            if pid not in pids:
                pids.append(pid)
            if state == "T":
                stopped.add(node)
            if node.startswith("learner") and pid not in start_step:
                schedule = learner_schedule(port)
                if schedule and schedule[1] > 0:
                    start_step[pid] = schedule[0] - schedule[1]
            if node in ("broker", "shard-0"):
                accepted = curve_accepted(port)
                if accepted is not None:
                    curve[node] = max(curve.get(node, 0), accepted)
            if node == "broker":
                status = node_status(port)
                for l in (status or {}).get("learners", []):
                    if l["state"] != "left":
                        key = l["learner"]
                        silent_max[key] = max(silent_max.get(key, 0), l["last_seen_s"])
        if len(seen) == 6 and first_child_at is None:  # every node started
            first_child_at = time.time()
        if interrupt_after_s and first_child_at and not interrupted and time.time() - first_child_at > interrupt_after_s:
            drill.send_signal(signal.SIGINT)
            interrupted = True
            deadline = min(deadline, time.time() + 60)  # a Ctrl-C ends it promptly
        time.sleep(0.05)
    log.seek(0)
    output = log.read()
    left = [(node, pid) for node, pids in seen.items() for pid in pids if alive(pid)]
    check(not left, f"{name}: child processes left behind after the drill exited: {left}", output)
    return drill.returncode, output, seen, stopped, silent_max, start_step, curve


def main():
    started = time.time()
    code, output, seen, stopped, silent, start_step, curve = run_drill("drill")
    lines = [line for line in output.splitlines() if line.startswith("{")]
    check(lines, "the drill printed no JSON summary", output)
    summary = json.loads(lines[-1])
    check(code == 0 and summary.get("passed"), f"the drill failed (exit {code})", output)
    check(summary.get("processes") is True, "the summary says processes: true", output)
    check(summary["faults_injected"] == 5, f"5 faults injected, not {summary['faults_injected']}", output)
    check(summary["committed_rounds_lost"] == 0, "no committed round lost", output)
    check(summary["ledger_exact"], "the ledger is exact", output)
    check(summary["downtime_s"] == 0, "no global downtime while >= K learners live", output)
    check(summary["rounds"] > 20, f"rounds went on ({summary['rounds']})", output)

    # The kill and the restarts, as this test saw the processes.
    check(len(seen.get("learner-1", [])) >= 2, f"learner-1 ran as a new process after its kill: {seen}", output)
    check(len(seen.get("shard-1", [])) >= 2, f"shard-1 ran as a new process after its kill: {seen}", output)
    for node in ("broker", "shard-0", "learner-0", "learner-2"):
        check(len(seen.get(node, [])) == 1, f"{node} ran as one process throughout: {seen}", output)
    # The wire ran with CURVE: broker and shard accepted handshakes (3 learners, the chaos monkey, ...).
    check(curve.get("broker", 0) >= 4 and curve.get("shard-0", 0) >= 3, f"CURVE handshakes accepted: {curve}", output)
    # The restarted learner took up the mesh's learning-rate schedule (the broker's Welcome),
    # about 6 s of 150 ms steps in, not its warm-up at step 0; the first incarnations start at 0.
    first, restarted = seen["learner-1"][0], seen["learner-1"][-1]
    check(start_step.get(first) == 0, f"learner-1's first process started its schedule at 0 ({start_step})", output)
    check(start_step.get(restarted, 0) >= 15,
          f"learner-1's new process started its schedule at the mesh's position, not 0 ({start_step})", output)
    check("learner-2" in stopped, f"learner-2 was seen stopped (state T) while paused; stopped: {stopped}", output)
    check(silent.get(0, 0) >= 2.0, f"the broker heard nothing from partitioned learner 0 for >= 2 s ({silent})", output)

    # The report's own record: the pids, the SIGSTOP seen in /proc, the restarted learner merged again.
    report_dir = os.path.join(WORK, "drill-report")
    report = json.load(open(os.path.join(report_dir, [f for f in os.listdir(report_dir) if f.endswith(".json")][0])))
    events = report["process_events"]
    kills = [e for e in events if e["action"] == "kill" and e["t_s"] >= 0]
    check({e["node"] for e in kills} == {"learner-1", "shard-1"}, f"SIGKILLs went to learner-1 and shard-1: {kills}", output)
    check(all("reaped" in e["detail"] and "NOT" not in e["detail"] for e in kills), f"killed processes reaped: {kills}", output)
    check(kills[0]["pid"] == seen["learner-1"][0], "the SIGKILLed pid was learner-1's first process", output)
    check(any(e["action"] == "stop" and e["node"] == "learner-2" and e["detail"].endswith("T") for e in events),
          "the launcher saw learner-2 in state T after SIGSTOP", output)
    check(any(e["action"] == "cont" and e["node"] == "learner-2" for e in events), "learner-2 got SIGCONT", output)
    crash_row = [f for f in report["faults"] if f["what"].startswith("crash learner/1")][0]
    check(crash_row["rejoin_s"] is not None and 0 <= crash_row["rejoin_s"] < 15,
          f"the restarted learner was merged again ({crash_row})", output)
    shard_row = [f for f in report["faults"] if f["what"].startswith("shard_crash")][0]
    check(shard_row["rejoin_s"] is not None and shard_row["rejoin_s"] >= 0, f"the restarted shard published again ({shard_row})", output)
    check(report["eval_loss"] > 0, "Θ was evaluated from the shards' stores", output)

    # Ctrl-C mid-drill: the drill stops its children and exits; none is left behind.
    code, output, seen_interrupted, _, _, _, _ = run_drill("interrupted", interrupt_after_s=5)
    check(code != 0, f"an interrupted drill does not pass (exit {code})", output)
    check(len(seen_interrupted) == 6, f"all 6 nodes ran before the interrupt: {sorted(seen_interrupted)}", output)
    print(f"ok: drill across processes in {time.time() - started:.0f} s; rounds {summary['rounds']}, "
          f"goodput {summary['goodput']:.3f}, ledger {summary['ledger']}; pids {seen}; schedule starts {start_step}; CURVE handshakes accepted {curve}")


main()
shutil.rmtree(WORK, ignore_errors=True)  # kept on a failure, for its logs
