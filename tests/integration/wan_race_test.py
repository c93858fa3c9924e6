#!/usr/bin/env python3
"""Integration: the WAN race over real links (deploy/netns/wan_race.py; root, Debian's
python3-torch and the python package), on a small budget: PyTorch DDP over gloo, dp and
decoupled across network namespaces with tbf-capped, relay-delayed links. Checks that
  - the caps follow the arithmetic (a step's transfer is 26 x its compute at the 5 Gbit/s
    reference, the broker host has M times a learner host's cap);
  - DDP trained over the links: its loss fell, it sent about one gradient per rank per
    step (a ring all-reduce of 2 ranks: at least 0.9 x and at most 2 x the fp32 gradient);
  - dp was raced, not projected: it ran past DDP's steps up to --dp-stop x them, each
    step moving about a gradient up and the parameters down per learner, and its curve fell;
  - decoupled reached DDP's final loss, sooner than DDP, moving fewer bytes than dp;
  - the report is one JSON line with a plot, and nothing of the beds is left behind.
"""

import json
import os
import subprocess
import sys
import tempfile

RACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "netns", "wan_race.py")
PREFIX = "archracetest"
TARGET_STEPS = 12


def check(condition, what, summary=None):
    if not condition:
        print(f"FAILED: {what}" + ("\n" + json.dumps(summary, indent=1) if summary is not None else ""))
        sys.exit(1)


def main():
    if os.geteuid() != 0:
        print("wan_race_test: network namespaces need root (CI runs as root)")
        return 1
    binary = os.environ["ARCHIPELAGO"]
    with tempfile.TemporaryDirectory(prefix="wan-race-test-") as tmp:
        plot = os.path.join(tmp, "race.svg")
        cmd = [sys.executable, RACE, "--binary", binary, "--prefix", PREFIX, "--logs", os.path.join(tmp, "logs"),
               "--modes", "ddp,dp,decoupled", "--target-steps", str(TARGET_STEPS), "--schedule-steps", "80",
               "--eval-every", "4", "--mode-seconds", "25", "--dp-seconds", "300", "--compute-steps", "30",
               "--set", "data.eval_tokens=16384", "--set", "data.synthetic_bytes=2097152", "--plot", plot, "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        print(out.stdout[-4000:], out.stderr[-2000:], sep="\n")
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        check(lines, f"{' '.join(cmd)} printed no JSON line (exit {out.returncode})")
        s = json.loads(lines[-1])
        check(out.returncode == 0 and s["failure"] is None, f"the race failed (exit {out.returncode})", s)
        check(abs(s["ratio"] - 26.04) < 0.05, "at 5 Gbit/s a step's transfer is 26.0 x its compute", s)
        expected_cap = s["params"] * 32 / (s["ratio"] * s["compute_step_ms"] / 1e3) / 1e6
        check(abs(s["cap_mbit"] - expected_cap) < 0.01 * expected_cap, "the cap follows the arithmetic", s)
        r = s["results"]
        gradient = 4 * s["params"]
        ddp = r["ddp"]
        check(ddp["steps_per_learner"] == TARGET_STEPS and ddp["curve"][-1][2] < ddp["curve"][0][2],
              "DDP trained its steps and its eval loss fell", s)
        check(s["target"] == ddp["curve"][-1][2], "the target is DDP's final eval loss", s)
        per_rank_step = (ddp["bytes"]["l0"] + ddp["bytes"]["l1"]) / 2 / TARGET_STEPS
        check(0.9 * gradient <= per_rank_step <= 2 * gradient,
              f"DDP sent {per_rank_step:.0f} bytes per rank and step (gradient {gradient})", s)
        check(ddp["bytes"]["broker"] < 0.01 * (ddp["bytes"]["l0"] + ddp["bytes"]["l1"]),
              "DDP's ranks talk to each other, not through the broker host", s)
        dp = r["dp"]
        check(dp["steps_per_learner"] >= TARGET_STEPS, f"dp ran at least DDP's {TARGET_STEPS} steps", s)
        per_learner_step = (dp["bytes"]["l0"] + dp["bytes"]["l1"]) / 2 / dp["steps_per_learner"]
        check(0.8 * gradient <= per_learner_step <= 2 * gradient,
              f"each dp learner sent about a gradient per step ({per_learner_step:.0f} bytes)", s)
        check(dp["curve"][-1][2] < dp["curve"][0][2], "dp's eval loss fell", s)
        dec = r["decoupled"]
        check(dec["time_to_target_s"] is not None, "decoupled reached DDP's final loss", s)
        check(dec["time_to_target_s"] < ddp["time_to_target_s"], "decoupled reached it sooner than DDP", s)
        check(dec["bytes_total"] < dp["bytes_total"], "decoupled moved fewer bytes than dp", s)
        check(dec["faster_than"]["ddp"] > 1 and dec["faster_than"]["ddp"] == round(ddp["time_to_target_s"] /
              dec["time_to_target_s"], 2), "decoupled's speed-up over DDP is reported", s)
        with open(plot) as f:
            svg = f.read()
        check(svg.startswith("<svg") and svg.count("<polyline") == 3, "the plot has a line per mode", s)
        left = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if ns.startswith(PREFIX + "-")]
        check(not left, f"namespaces left behind: {left}")
    print(f"wan race: target {s['target']:.4f} after {TARGET_STEPS} DDP steps; DDP {ddp['time_to_target_s']:.1f} s, "
          f"dp {dp['time_to_target_s']} s, decoupled {dec['time_to_target_s']:.1f} s (cap {s['cap_mbit']:.2f} Mbit/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
