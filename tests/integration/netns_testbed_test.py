#!/usr/bin/env python3
"""Integration: a mesh trained across network namespaces joined by shaped WAN
links (deploy/netns/testbed.py; needs root, as CI has).

Four hosts around a hub: the broker and its shard in one namespace, a learner
in each of three others; every access link 100 Mbit/s (tbf) with 5 ms one-way
delay (the relay), learner 2's 50 Mbit/s and 10 ms. Checks:
  - the shaping is in effect: on each learner's link to the broker the TCP
    round trip is at least the configured one (and not far above it), and the
    throughput is at most the tbf rate (and a fair share of it);
  - the mesh trained: every learner finished its steps, rounds happened, the
    broker's ledger is exact, every host's link carried traffic, the eval loss fell;
  - the control lane (nothing is killed; every node is stopped at once): on 3 Mbit/s
    links with mini-model fragments flowing for SLOW_S seconds, every heartbeat's
    round trip stays under SLOW_RTT_BOUND_MS (the tbf queue holds at most about
    0.75 s of a 3 Mbit/s link, one way; heartbeats never queue behind fragments)
    and no node declares a live peer dead;
  - nothing is left behind: no namespace of the bed, no process it started, no
    link of the bed in the root namespace; also after a SIGTERM mid-run, and after
    `up` followed by `cleanup`.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

TESTBED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "netns", "testbed.py")
PREFIX = "archtest"
STEPS = 200
SLOW_S = 30  # the links stay saturated throughout: the first model alone is ~7 MB per learner at 3 Mbit/s
SLOW_RTT_BOUND_MS = 2000


class Failure(Exception):
    pass


def check(condition, what, summary=None):
    if not condition:
        raise Failure(what + ("\n" + json.dumps(summary, indent=1) if summary is not None else ""))


def namespaces_of(prefix):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix + "-")]


def root_links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def testbed(binary, relay, logs, command, *args, timeout=150):
    cmd = [sys.executable, TESTBED, command, "--binary", binary, "--relay", relay, "--prefix", PREFIX,
           "--logs", logs, "--json", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise Failure(f"{' '.join(cmd)} exited {out.returncode} without a summary\n{out.stdout}\n{out.stderr}")
    return out.returncode, json.loads(lines[-1]), out.stdout


def no_leftovers(summary, links_before, when):
    check(summary.get("left_behind") == [], f"{when}: the test bed reports namespaces left behind", summary)
    left = namespaces_of(summary["bed"])
    check(not left, f"{when}: namespaces left behind: {left}")
    running = [p for p in summary.get("pids", []) if alive(p)]
    check(not running, f"{when}: processes the test bed started still run: {running}")
    # Other jobs may add links of their own; the bed's are named wan and hN.
    ours = [link for link in set(root_links()) - set(links_before) if re.match(r"(wan|h\d+)(@|$)", link)]
    check(not ours, f"{when}: the bed's links appeared in the root namespace: {ours}")


def train_across_the_bed(binary, relay, tmp, links_before):
    code, s, text = testbed(binary, relay, os.path.join(tmp, "run"), "run", "--learners", "3", "--steps",
                            str(STEPS), "--rate-mbit", "100", "--delay-ms", "5", "--link", "l2=50/10",
                            "--probe-all", "--curve", "--set", "data.eval_tokens=16384", "--set", "data.batch=16",
                            "--set", "data.synthetic_bytes=2097152")
    print(text)
    check(code == 0 and not s["failure"], f"the run failed (exit {code})", s)
    for host, m in s["measured"].items():
        check(m["rtt_ms"] >= m["rtt_configured_ms"],
              f"{host}: measured RTT {m['rtt_ms']} ms is below the configured {m['rtt_configured_ms']} ms", s)
        check(m["rtt_ms"] <= m["rtt_configured_ms"] + 20,
              f"{host}: measured RTT {m['rtt_ms']} ms is far above the configured {m['rtt_configured_ms']} ms", s)
        # tbf's burst lets a 1 s transfer exceed the rate by a few per cent at most.
        check(m["mbit_s"] <= 1.05 * m["cap_mbit_s"],
              f"{host}: {m['mbit_s']:.1f} Mbit/s through a {m['cap_mbit_s']} Mbit/s link", s)
        # A loose floor: other jobs on the machine slow the probe's Python ends down.
        check(m["mbit_s"] >= 0.1 * m["cap_mbit_s"],
              f"{host}: only {m['mbit_s']:.1f} Mbit/s through a {m['cap_mbit_s']} Mbit/s link", s)
    check(sorted(s["measured"]) == ["l0", "l1", "l2"], "every learner host's link was probed", s)
    check(s["learners_finished"] == 3, "every learner finished its steps", s)
    check(s["rounds"] > 0, "rounds happened", s)
    check(s["ledger_exact"], "the broker's ledger is exact (balanced, and each learner's tokens)", s)
    for host, t in s["traffic"].items():
        check(t["sent_bytes"] > 0 and t["received_bytes"] > 0, f"{host}'s link carried the mesh's traffic", s)
    check((s["relay"] or {}).get("packets", 0) > 0, "the relay delayed packets", s)
    loss = s["eval_loss"]
    check(loss and loss["end"] < 0.9 * loss["start"], "the eval loss fell by more than 10 %", s)
    no_leftovers(s, links_before, "after the run")
    return s


def slow_links_with_fragments(binary, relay, tmp, links_before):
    """3 Mbit/s links with 1.8 MB mini-model fragments flowing (joining learners fetch all 24 of each, which
    alone fills the links for minutes): the control lane keeps every peer alive."""
    code, s, text = testbed(binary, relay, os.path.join(tmp, "slow"), "run", "--learners", "3", "--steps",
                            "1000000", "--duration", str(SLOW_S), "--rate-mbit", "3", "--delay-ms", "5",
                            "--probe-seconds", "0", "--curve", "--set", "model.size=mini", "--set", "data.batch=4",
                            "--set", "data.synthetic_bytes=2097152", "--set", "data.eval_tokens=4096",
                            timeout=SLOW_S + 180)
    print(text)
    check(code == 0 and not s["failure"], f"the slow run failed (exit {code})", s)
    shard = s["traffic"]["broker"]["sent_bytes"]
    check(shard > 4 * 1024 * 1024, f"fragments flowed from the shard's host ({shard} bytes)", s)
    check(s["peers_declared_dead"] == 0, "no node declared a live peer dead while fragments filled the links", s)
    check(0 < s["control_rtt_max_ms"] < SLOW_RTT_BOUND_MS,
          f"the longest heartbeat round trip, {s['control_rtt_max_ms']} ms, is under {SLOW_RTT_BOUND_MS} ms", s)
    no_leftovers(s, links_before, "after the slow run")
    return s


def interrupted_mid_run(binary, relay, tmp, links_before):
    """SIGTERM while the learners train: the bed must tear itself down."""
    logs = os.path.join(tmp, "signal")
    cmd = [sys.executable, TESTBED, "run", "--binary", binary, "--relay", relay, "--prefix", PREFIX,
           "--logs", logs, "--json", "--learners", "3", "--steps", "1000000", "--probe-seconds", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        # Learners run once their logs show a step.
        while time.time() < deadline and proc.poll() is None:
            logs_there = [f for f in os.listdir(logs) if f.startswith("learner")] if os.path.isdir(logs) else []
            if len(logs_there) == 3 and all(os.path.getsize(os.path.join(logs, f)) > 0 for f in logs_there):
                break
            time.sleep(0.2)
        if proc.poll() is not None:
            raise Failure(f"the long run ended early (exit {proc.returncode}): {proc.communicate()}")
        check(time.time() < deadline, "the long run's learners did not start within 30 s")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    s = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    check(proc.returncode == 1 and "interrupted by signal" in (s["failure"] or ""),
          f"SIGTERM ends the run with exit 1 and says so (exit {proc.returncode}, stderr {err!r})", s)
    no_leftovers(s, links_before, "after SIGTERM")


def up_then_cleanup(binary, relay, tmp, links_before):
    code, s, text = testbed(binary, relay, os.path.join(tmp, "up"), "up", "--learners", "1", timeout=60)
    check(code == 0, f"up failed (exit {code})\n{text}", s)
    check(len(namespaces_of(s["bed"])) == 3, "up leaves the hub and two hosts", s)
    out = subprocess.run([sys.executable, TESTBED, "cleanup", "--prefix", PREFIX, "--json"], capture_output=True,
                         text=True, timeout=60)
    check(out.returncode == 0, f"cleanup failed: {out.stdout}\n{out.stderr}")
    removed = json.loads(out.stdout.splitlines()[-1])["removed"]
    check(sorted(removed) == sorted(f"{s['bed']}-{h}" for h in ("hub", "broker", "l0")),
          f"cleanup removed the bed's namespaces: {removed}")
    s["left_behind"] = []
    no_leftovers(s, links_before, "after cleanup")


def main():
    if os.geteuid() != 0:
        sys.exit("FAIL: the network-namespace test bed needs root (CI runs as root); run this test as root")
    binary, relay = os.environ["ARCHIPELAGO"], os.environ["ARCHIPELAGO_WAN_RELAY"]
    stale = namespaces_of(PREFIX)
    if stale:  # an earlier run killed with SIGKILL cannot clean up after itself
        subprocess.run([sys.executable, TESTBED, "cleanup", "--prefix", PREFIX], check=True, timeout=60)
    links_before = root_links()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="archipelago-netns-test-") as tmp:
        try:
            s = train_across_the_bed(binary, relay, tmp, links_before)
            slow = slow_links_with_fragments(binary, relay, tmp, links_before)
            interrupted_mid_run(binary, relay, tmp, links_before)
            up_then_cleanup(binary, relay, tmp, links_before)
        except Failure as e:
            sys.exit(f"FAIL: {e}")
        finally:
            if namespaces_of(PREFIX):  # never leave a failed test's bed behind
                subprocess.run([sys.executable, TESTBED, "cleanup", "--prefix", PREFIX], timeout=60)
    links = ", ".join(f"{h} {m['rtt_ms']:.1f} ms / {m['mbit_s']:.1f} Mbit/s" for h, m in s["measured"].items())
    print(f"PASS in {time.time() - t0:.0f} s: {STEPS} steps x 3 learners across 4 namespaces ({links}); "
          f"{s['rounds']} rounds, eval loss {s['eval_loss']['start']:.3f} -> {s['eval_loss']['end']:.3f}, "
          f"ledger exact; at 3 Mbit/s with mini fragments for {SLOW_S} s: {slow['peers_declared_dead']} peers declared dead, longest "
          f"heartbeat round trip {slow['control_rtt_max_ms']:.0f} ms; nothing left behind")


if __name__ == "__main__":
    main()
