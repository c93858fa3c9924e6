#!/usr/bin/env python3
"""The drill battery in its short form, and bad plans refused before anything starts.

  drill_test.py PLAN        runs deploy/drills/PLAN.toml through `archipelago drill`
                            at DRILL_TIME_SCALE (default 0.2) and checks the report:
                            faults injected, no global downtime while >= K learners
                            live, no committed version lost, the ledger exact, every
                            fault repaired (a lost host: never), restarted nodes back
                            at work; with standbys (the plan's `standbys`), every
                            leader taken away followed by a standby within the
                            takeover bound, the epochs on the brokers' tapes in
                            order with no merge by a deposed broker, and a
                            partitioned leader stepping down after the heal.
  drill_test.py --bad-plans plans with an unknown fault, an unknown target, a negative
                            duration or a malformed time, a lost broker host without a
                            standby, a standby the plan lacks, exit 2 naming the line,
                            and nothing is started (no report written); so is an
                            unknown --reference-mode, or one without the reference.
  drill_test.py --dp-reference
                            the crash storm under decoupled against a fault-free dp
                            reference (--reference-mode dp): the reference is dp, it
                            ran to the drill's tokens, and the gap is reported against it.
  drill_test.py --robust=KIND
                            the attacker plan deploy/drills/attacks/KIND.toml with
                            mesh.robust on and its fault-free reference (robust on too)
                            at DRILL_TIME_SCALE: the drill passed (no downtime, the ledger
                            exact), the screen meant for the attacker rejected its work
                            (ROBUST_SCREEN: the refusal reason), no honest learner's work
                            was rejected, and the eval loss within ROBUST_MAX_GAP of the
                            reference's at equal tokens.
"""

import json
import os
import subprocess
import sys
import tempfile

ARCHIPELAGO = os.environ.get("ARCHIPELAGO", "build/archipelago")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCALE = os.environ.get("DRILL_TIME_SCALE", "0.2")


def fail(message, log=""):
    print("FAIL:", message)
    if log:
        print(log[-6000:])
    sys.exit(1)


def run_drill(name, out, args, timeout):
    """`archipelago drill` on deploy/drills/NAME.toml with `args`, its report into `out`:
    the process, its JSON summary and its output."""
    plan = os.path.join(REPO, "deploy", "drills", name + ".toml")
    # A fixed, generous compute budget: a short drill must not depend on a calibration
    # taken while other tests load the machine.
    cmd = [ARCHIPELAGO, "drill", "--plan", plan, "--step-time-ms", os.environ.get("DRILL_STEP_MS", "250"),
           "--report", out, "--json"] + args
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    log = p.stdout + p.stderr
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        fail(f"no JSON line (exit {p.returncode})", log)
    return p, json.loads(lines[-1]), log


def run_plan(name):
    with tempfile.TemporaryDirectory(prefix="archipelago-drill-test-") as out:
        p, s, log = run_drill(name, out, ["--time-scale", SCALE, "--no-reference"], 900)
        print(p.stdout[-3000:])
        with open(os.path.join(out, f"{name}-{s['mode']}.json")) as f:
            report = json.load(f)
        html = os.path.join(out, name + ".html")
        if not os.path.exists(html) or "<svg" not in open(html).read():
            fail("no HTML report with plots", log)

    if s["faults_injected"] <= 0:
        fail("the plan injected no fault", log)
    if s["downtime_s"] > 0:
        fail(f"global downtime {s['downtime_s']} s while >= K learners were live", log)
    if s["committed_rounds_lost"] != 0:
        fail(f"{s['committed_rounds_lost']} committed versions lost", log)
    if not s["ledger_exact"]:
        fail(f"ledger not exact: {s['ledger']} + {s['unreported_tokens']} unreported vs {s['tokens']}", log)
    if s["rounds"] <= 0 or s["published"] <= 0:
        fail("no round was merged", log)
    restarts = [f for f in report["faults"] if f["what"].startswith(("crash", "shard_crash", "broker_crash"))
                and not f["skipped"]]
    for f in report["faults"]:
        if not f["skipped"] and f["repaired_s"] is None and not f["what"].startswith("broker_host_lost"):
            fail(f"fault never repaired: {f}", log)
    faulted = [f for f in report["faults"] if not f["skipped"]]
    for f in restarts:
        # Back at work within 6 s, unless a fault hit the same node again before that (a crash
        # storm at a fifth of its time restarts a learner and kills it again a second later).
        target = f["what"].split()[1]
        hit_again = any(g is not f and target in g["what"] and f["repaired_s"] <= g["at_s"] < f["repaired_s"] + 6
                        for g in faulted)
        if f["rejoin_s"] is None and not hit_again:
            fail(f"restarted node never back at work: {f}", log)
    # The liveness phase: after the heal, versions keep coming until the end.
    samples = report["samples"]
    healed_at = s["safety_s"]
    after = [x for x in samples if x["t_s"] >= healed_at]
    if len(after) < 2 or after[-1]["published"] <= after[0]["published"]:
        fail("no new version in the liveness phase", log)
    takeovers = check_brokers(s, report, log)
    if p.returncode != 0:
        fail(f"drill exited {p.returncode}", log)
    print(f"ok: {name}: {s['faults_injected']} faults, goodput {s['goodput']:.3f}, rounds {s['rounds']}{takeovers}")


def check_brokers(s, report, log):
    """With standbys: who led in which epoch, the takeovers, no merge by a deposed broker."""
    if s["deposed_merges"] != 0 or s["epochs_interleaved"] != 0:
        fail(f"a deposed broker merged: {s['deposed_merges']} out of epoch order, {s['epochs_interleaved']} interleaved", log)
    if s["standbys"] == 0:
        return ""
    epochs = s["epochs"]
    if [e["epoch"] for e in epochs] != sorted(e["epoch"] for e in epochs) or len(epochs) < 2:
        fail(f"expected the rounds of two epochs or more, in order: {epochs}", log)
    for e in epochs:  # an epoch names its leader: its low byte
        if e["broker"] != e["epoch"] & 0xFF:
            fail(f"epoch {e['epoch']} closed by broker/{e['broker']}", log)
    for earlier, later in zip(epochs, epochs[1:]):  # one leader at a time
        if later["first_closed_s"] < earlier["last_closed_s"]:
            fail(f"epoch {later['epoch']} began closing rounds before epoch {earlier['epoch']} ended: {epochs}", log)
    if not s["takeovers"]:
        fail("a plan with standbys took no leader away (no takeover to judge)", log)
    text = []
    for t in s["takeovers"]:
        what = report["faults"][t["fault"]]["what"]
        if t["broker"] is None or t["broker"] < 0 or t["broker"] == t["deposed"]:
            fail(f"no standby took over after {what}: {t}", log)
        if t["back_s"] is None or t["back_s"] > s["takeover_bound_s"]:
            fail(f"after {what} the first version under the standby came {t['back_s']} s later, over the bound "
                 f"{s['takeover_bound_s']} s", log)
        if not any(e["epoch"] == t["epoch"] and e["broker"] == t["broker"] for e in epochs):
            fail(f"the new leader's epoch {t['epoch']} is not on the tapes: {epochs}", log)
        if what.startswith("partition"):
            if t["stepped_down_s"] is None or s["step_downs"][t["deposed"]] < 1:
                fail(f"the partitioned broker/{t['deposed']} never stepped down after the heal: {t}", log)
        if what.startswith("broker_host_lost") and any(e["broker"] == t["deposed"] and e["epoch"] > t["epoch"] for e in epochs):
            fail(f"broker/{t['deposed']}, whose host was lost, led again: {epochs}", log)
        text.append(f"{what}: broker/{t['broker']} leads, a new version {t['back_s']:.2f} s after the fault "
                    f"(first merged round {t['first_round_s']:.2f} s; bound {s['takeover_bound_s']:.1f} s)" +
                    (f", broker/{t['deposed']} stepped down {t['stepped_down_s']:.2f} s after the heal"
                     if t["stepped_down_s"] is not None else ""))
    return "; " + "; ".join(text)


BAD_PLANS = {
    "unknown fault": ('seed = 1\nduration = "10s"\n\n[[fault]]\nat = "1s"\nkind = "explode"\ntarget = "learner/0"\n',
                      "plan.toml:6", "explode"),
    "unknown target": ('seed = 1\nduration = "10s"\n\n[[fault]]\nat = "1s"\nkind = "crash"\ntarget = "learner/9"\nfor = "1s"\n',
                       "plan.toml:7", "learner/9"),
    "negative duration": ('seed = 1\nduration = "10s"\n\n[[fault]]\nat = "1s"\nkind = "pause"\ntarget = "learner/0"\n'
                          'for = "-2s"\n', "plan.toml:8", "-2s"),
    "malformed time": ('seed = 1\nduration = "10s"\n\n[[fault]]\nat = "soon"\nkind = "crash"\ntarget = "learner/0"\nfor = "1s"\n',
                       "plan.toml:5", "soon"),
    "lost broker host without a standby": ('seed = 1\nduration = "10s"\n\n[[fault]]\nat = "1s"\nkind = "broker_host_lost"\n'
                                           'target = "broker"\n', "plan.toml:4", "needs a standby"),
    "a standby the plan lacks": ('seed = 1\nduration = "10s"\nstandbys = 1\n\n[[fault]]\nat = "1s"\nkind = "partition"\n'
                                 'for = "1s"\ngroups = [["broker"], ["broker/2"]]\n', "plan.toml:9", "broker/2"),
    "a lost host restarted": ('seed = 1\nduration = "10s"\nstandbys = 1\n\n[[fault]]\nat = "1s"\nkind = "broker_host_lost"\n'
                              'target = "broker"\nfor = "2s"\n', "plan.toml:9", "never restarted"),
}


def bad_plans():
    with tempfile.TemporaryDirectory(prefix="archipelago-drill-bad-") as d:
        for what, (text, where, quoted) in BAD_PLANS.items():
            plan = os.path.join(d, "plan.toml")
            with open(plan, "w") as f:
                f.write(text)
            report = os.path.join(d, "report-" + what.replace(" ", "-"))
            p = subprocess.run([ARCHIPELAGO, "drill", "--plan", plan, "--report", report], capture_output=True,
                               text=True, timeout=60)
            if p.returncode != 2:
                fail(f"{what}: exit {p.returncode}, expected 2", p.stdout + p.stderr)
            if where not in p.stderr or quoted not in p.stderr:
                fail(f"{what}: the error does not name {where} and {quoted!r}", p.stderr)
            if os.path.exists(report) or "reference" in p.stdout:
                fail(f"{what}: something started before the plan was refused", p.stdout)
            print(f"ok: {what}: {p.stderr.strip()}")
        p = subprocess.run([ARCHIPELAGO, "drill", "--plan", os.path.join(d, "missing.toml")], capture_output=True,
                           text=True, timeout=60)
        if p.returncode != 2 or "missing.toml" not in p.stderr:
            fail("a missing plan file is not refused by name", p.stderr)
        print(f"ok: missing plan: {p.stderr.strip()}")
        plan = os.path.join(REPO, "deploy", "drills", "crash_storm.toml")
        for args, quoted in ((["--reference-mode", "bogus"], "bogus"),
                             (["--reference-mode", "dp", "--no-reference"], "--no-reference")):
            report = os.path.join(d, "report-reference")
            p = subprocess.run([ARCHIPELAGO, "drill", "--plan", plan, "--report", report] + args, capture_output=True,
                               text=True, timeout=60)
            if p.returncode != 2 or quoted not in p.stderr or os.path.exists(report):
                fail(f"{' '.join(args)}: exit {p.returncode}, expected 2 naming {quoted!r} before anything starts",
                     p.stdout + p.stderr)
            print(f"ok: {' '.join(args)}: {p.stderr.strip()}")


def dp_reference():
    with tempfile.TemporaryDirectory(prefix="archipelago-drill-dp-reference-") as out:
        # Only the comparison is checked here, not its size: --max-eval-gap lets any gap pass.
        p, s, log = run_drill("crash_storm", out, ["--time-scale", "0.1", "--reference-mode", "dp", "--max-eval-gap", "100"],
                              600)
        if p.returncode != 0:
            fail(f"drill exited {p.returncode}", log)
        html = open(os.path.join(out, "crash_storm.html")).read()
    if s["mode"] != "decoupled" or s["reference_mode"] != "dp":
        fail(f"mode {s['mode']}, reference {s['reference_mode']}: expected decoupled against dp", log)
    tokens, reference_tokens = s["tokens"], s["reference_tokens"]
    # dp is slower per token than the drill's decoupled mesh at the same pace: the reference
    # must still reach the drill's tokens (its time bound is longer), overshooting by little.
    if not tokens <= reference_tokens <= 1.25 * tokens:
        fail(f"the dp reference processed {reference_tokens} tokens against the drill's {tokens}", log)
    ref_loss = s["reference_eval_loss"]
    if not (ref_loss is not None and 0 < ref_loss < 10):
        fail(f"no eval loss for the dp reference: {ref_loss}", log)
    if abs(s["eval_gap"] - (s["eval_loss"] - ref_loss) / ref_loss) > 1e-9:
        fail(f"eval_gap {s['eval_gap']} is not the drill's loss against the dp reference's", log)
    if "fault-free reference (dp)" not in html or "fault-free dp reference" not in p.stdout:
        fail("the report does not name the dp reference", log)
    print(f"ok: decoupled under the crash storm {s['eval_loss']:.4f} against dp without faults {ref_loss:.4f} "
          f"({100 * s['eval_gap']:+.2f} %), tokens {tokens} and {reference_tokens}")


def robust(kind):
    reason = os.environ["ROBUST_SCREEN"]
    max_gap = float(os.environ.get("ROBUST_MAX_GAP", "0.05"))
    with tempfile.TemporaryDirectory(prefix="archipelago-drill-robust-") as out:
        p, s, log = run_drill(os.path.join("attacks", kind), out,
                              ["--time-scale", SCALE, "--set", "mesh.robust=true", "--max-eval-gap", str(max_gap),
                               "--log-level", "warn"], 600)
        print(p.stdout[-2000:])
    if s["downtime_s"] > 0 or s["committed_rounds_lost"] != 0 or not s["ledger_exact"]:
        fail(f"downtime {s['downtime_s']} s, {s['committed_rounds_lost']} versions lost, ledger exact "
             f"{s['ledger_exact']}", log)
    refused = s["refused"].get(reason, 0)
    if refused <= 0:
        fail(f"the robust screen rejected none of the attacker's contributions ({reason}: {s['refused']})", log)
    # Every contribution the screens set apart is named in the shards' log: the attacker's.
    honest = [l for l in log.splitlines() if "shard.screened_out" in l and "from learner/3:" not in l]
    if honest:
        fail(f"{len(honest)} honest contributions screened out, e.g. {honest[0]}", log)
    if s["eval_gap"] is None or s["eval_gap"] > max_gap:
        fail(f"eval loss {s['eval_loss']} vs the fault-free reference's {s['reference_eval_loss']}: "
             f"gap {s['eval_gap']} above {max_gap}", log)
    if p.returncode != 0:
        fail(f"drill exited {p.returncode}", log)
    print(f"ok: {kind} with mesh.robust: {refused} contributions rejected ({reason}), eval {s['eval_loss']:.4f} "
          f"against {s['reference_eval_loss']:.4f} ({100 * s['eval_gap']:+.2f} %), tokens {s['tokens']} and "
          f"{s['reference_tokens']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--bad-plans":
        bad_plans()
    elif sys.argv[1] == "--dp-reference":
        dp_reference()
    elif sys.argv[1].startswith("--robust="):
        robust(sys.argv[1].split("=", 1)[1])
    else:
        run_plan(sys.argv[1])
