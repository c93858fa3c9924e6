#!/usr/bin/python3
"""Integration: PyTorch learners of a model of their own (the Python package,
tools/python) in a mesh of `archipelago node` processes over tcp:// loopback.

Run by ctest with Debian's /usr/bin/python3 (python3-torch) and
PYTHONPATH=build/python. One case per argument:

  train    the example (tools/python/examples/byom_mesh.py): two PyTorch learners of a
           byte MLP train (held-out loss falls), the broker's ledger is balanced and
           holds exactly the tokens each learner reports, every fragment advanced; the
           snapshot `replay export` writes loads into the PyTorch model (load_state_dict).
  layout   a learner whose layout file differs from the mesh's is refused, the
           refusal naming the first differing tensor; a model whose names differ
           from the layout is refused by the package before it joins.
  nan      a NaN in learner 0's model: its contributions are held back (the wire layer
           never sends a non-finite delta) and counted; none reaches a shard, the other
           learner's held-out loss still falls, the ledger stays exact.
  rejoin   a PyTorch learner SIGKILLed mid-run restarts as a new incarnation, gets the
           global model and contributes again; the ledger stays exact.
  mixed    the mixed mesh (tools/python/examples/mixed_mesh.py --only mixed): two native
           learners and two PyTorch learners of the native GPT (torch_gpt.py) train one
           model; its eval loss (`replay eval`) falls well below the initial model's, the
           broker merged work of every learner, the ledger is exact, and the PyTorch GPT
           scores the exported global model as the native evaluation does.
  port     torch_gpt.py --check: the PyTorch GPT against the native one from the same
           parameters and batches: the same loss and gradients, and after 30 inner steps
           (AdamW, clipping, schedule) the same loss and parameters.
  stop     LocalMesh.stop with stand-in nodes that record their SIGTERM and exit (a shard
           taking 0.3 s to stop, as one does making its last versions durable): every
           shard has exited before the broker is signalled, so the broker hears a shard's
           last publish before it reports (signalled together, it booked that step lost).
  drill    `archipelago drill --processes` of deploy/drills/crash_storm.toml (short form,
           --time-scale 0.4) with learner 3 a PyTorch learner (--learner-command): the drill
           SIGKILLs and restarts it like the native ones, every restart of it is back at work
           (a merged contribution: its rejoin time in the report), the drill passes (no
           downtime, ledger exact).
  moe      the mixture-of-experts example (tools/python/examples/moe_mesh.py): a switch MoE
           and a dense model, each trained by two PyTorch learners in a mesh of its own;
           every learner's held-out loss falls, each ledger is balanced and holds exactly
           each learner's tokens, each expert is one fragment of its own in the store, and
           the router sends tokens to every expert.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "tools", "python", "examples")
EXAMPLE = os.path.join(EXAMPLES, "byom_mesh.py")
BINARY = os.environ["ARCHIPELAGO"]


def fail(what, detail=""):
    sys.exit(f"FAIL: {what}\n{detail}")


def example(*args, timeout=240):
    cmd = [sys.executable, EXAMPLE, "--binary", BINARY, "--json", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        fail(f"{' '.join(cmd)} exited {out.returncode} without a summary", out.stdout + out.stderr)
    return json.loads(lines[-1]), out


def case_train():
    db = tempfile.mkdtemp(prefix="archipelago-pytrain-")
    r, out = example("--learners", "2", "--steps", "300", "--db", db, "--mesh", "flush=true", "--mesh", "rebase=true")
    if not (r["ledger_balanced"] and r["ledger_matches_learners"]):
        fail("the ledger is balanced and holds exactly each learner's tokens", json.dumps(r))
    # mesh.flush: close() waited until every fragment's work was merged (under rebase no
    # step is overwritten either, so none can end unaccounted).
    if r["ledger"]["lost"] != 0:
        fail("with mesh.flush no token-share is lost at the end", json.dumps(r["ledger"]))
    for l in r["learners"]:
        if not l["heldout_end"] < l["heldout_start"] - 0.5:
            fail(f"learner/{l['index']}'s held-out loss fell by more than 0.5 nats/byte", json.dumps(l))
        if l["contributions"] < 10 or min(l["versions"]) < 2:
            fail(f"learner/{l['index']} contributed and received every fragment again", json.dumps(l))
    if r["rejected"] != 0:
        fail("no contribution of a healthy model is rejected", json.dumps(r))
    # The global model exported (replay) loads into the user's PyTorch model under its own names.
    out_file = os.path.join(db, "model.safetensors")
    subprocess.run([BINARY, "replay", "--db", db, "export", "head", "--format", "safetensors", "--out", out_file],
                   check=True, capture_output=True, timeout=60)
    import archipelago
    import torch
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import byom_mesh
    model = byom_mesh.ByteMLP()
    tensors = archipelago.load_safetensors(out_file)
    if list(tensors) != [n for n, _ in model.named_parameters()]:
        fail("the export holds the model's tensors under their names, in order", str(list(tensors)))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    print(f"ok train: {[round(l['heldout_start'], 2) for l in r['learners']]} -> "
          f"{[round(l['heldout_end'], 2) for l in r['learners']]}, ledger {r['ledger']}")


def case_nan():
    r, out = example("--learners", "2", "--steps", "200", "--nan-at", "40")
    sick, healthy = r["learners"]
    if sick["non_finite"] < 1:
        fail("the NaN learner held back its non-finite contributions and counted them", json.dumps(sick))
    if r["rejected"] != 0:
        fail("no non-finite contribution reached a shard", json.dumps(r))
    if not (r["ledger_balanced"] and r["ledger_matches_learners"]):
        fail("the ledger stays exact around the held-back contributions", json.dumps(r))
    if not healthy["heldout_end"] < healthy["heldout_start"] - 0.5 or healthy["heldout_end"] != healthy["heldout_end"]:
        fail("the healthy learner still learns: the NaN never reached the global model", json.dumps(healthy))
    print(f"ok nan: {sick['non_finite']} contribution(s) held back, ledger {r['ledger']}")


def mesh_files(folder, layout_shapes):
    """A config whose model.layout is a two-tensor file with these shapes."""
    layout = os.path.join(folder, f"layout-{len(os.listdir(folder))}.json")
    with open(layout, "w") as f:
        json.dump({"tensors": [{"name": n, "shape": s} for n, s in layout_shapes]}, f)
    config = os.path.join(folder, f"mesh-{len(os.listdir(folder))}.toml")
    with open(config, "w") as f:
        f.write(f'[model]\nlayout = "{layout}"\ncontext = 16\n\n[mesh]\nlearners = 2\nfragments = 2\nshards = 1\n\n'
                f'[data]\nsynthetic_bytes = 200000\n')
    return config


def case_layout():
    import archipelago
    from archipelago.mesh import LocalMesh
    import numpy as np
    folder = tempfile.mkdtemp(prefix="archipelago-pylayout-")
    mesh_config = mesh_files(folder, [("w1", [8, 16]), ("w2", [16, 4]), ("b", [4])])
    other_config = mesh_files(folder, [("w1", [8, 16]), ("w2", [16, 5]), ("b", [4])])
    with LocalMesh(BINARY, mesh_config, shards=1, logs=folder) as mesh:
        time.sleep(0.5)
        mesh.check_alive()
        wrong = archipelago.Learner(other_config, 0, mesh.broker, mesh.shards, {"wire.curve": False})
        try:
            wrong.wait_ready(60)
            fail("a learner of another layout was refused")
        except RuntimeError as e:
            refusal = str(e)
            expected = "tensor 1: 'w2 [16,4] matrix' in the mesh, 'w2 [16,5] matrix' in the joiner"
            if expected not in refusal:
                fail(f"the refusal names the first difference ({expected!r})", refusal)
        wrong.close()
        right = archipelago.Learner(mesh_config, 1, mesh.broker, mesh.shards, {"wire.curve": False})
        try:
            right.bind({"w1": np.zeros((8, 16), np.float32), "w3": np.zeros((16, 4), np.float32),
                        "b": np.zeros(4, np.float32)})
            fail("arrays named otherwise than the layout are refused")
        except ValueError as e:
            if "tensor 1: the layout has 'w2', the model has 'w3'" not in str(e):
                fail("the package names the first differing name", str(e))
        arrays = {"w1": np.zeros((8, 16), np.float32), "w2": np.zeros((16, 4), np.float32),
                  "b": np.zeros(4, np.float32)}
        right.bind(arrays)
        right.wait_ready(60)
        if not np.any(arrays["w1"] != 0):
            fail("the global model (the shards' init) was installed into the bound arrays")
        right.close()
    print(f"ok layout: {refusal}")


def case_rejoin():
    folder = tempfile.mkdtemp(prefix="archipelago-pyrejoin-")
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import archipelago
    from archipelago.mesh import LocalMesh, ledger_check
    import byom_mesh

    config = byom_mesh.write_mesh_files(2, folder)
    reports = []
    with LocalMesh(BINARY, config, shards=2, logs=folder) as mesh:
        time.sleep(0.5)
        mesh.check_alive()

        def learner(i, steps):
            cmd = [sys.executable, EXAMPLE, "--learner", str(i), "--config", config, "--broker", mesh.broker,
                   "--shards", ",".join(mesh.shards), "--steps", str(steps), "--learners", "1", "--barrier", folder]
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

        # The steady learner steps until the restarted one is done: rounds go on meanwhile
        # (with no learner alive, a round opened before waits for mesh.round_timeout_s).
        steady = learner(0, 100000)
        victim = learner(1, 100000)
        deadline = time.time() + 90
        while not all(os.path.exists(os.path.join(folder, f"ready-{i}")) for i in (0, 1)) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(3)  # both step and contribute
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        restarted = learner(1, 150)
        restarted_at = time.time()
        for p in (restarted, steady):
            if p is steady:
                open(os.path.join(folder, "stop"), "w").close()
            out, _ = p.communicate(timeout=180)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if p.returncode != 0 or not lines:
                fail(f"a learner exited with {p.returncode}", out)
            reports.append(json.loads(lines[-1]))
        nodes = mesh.stop()
    broker = nodes.get("broker-0") or {}
    balanced, matches, ledger = ledger_check(broker, reports)
    back = reports[0]
    if back["contributions"] < 5:
        fail("the restarted learner contributed again", json.dumps(back))
    incarnations = [r for r in broker.get("learners", []) if r["learner"] == 1]
    if len(incarnations) < 2 or not all(r["first_merged_s"] >= 0 for r in incarnations) or \
            not any(r["incarnation"] == back["incarnation"] for r in incarnations):
        fail("the broker merged work of both incarnations of learner/1", json.dumps(broker.get("learners")))
    if not (balanced and matches):
        fail("the ledger is balanced and holds exactly the finished learners' tokens", json.dumps(broker))
    new = next(r for r in incarnations if r["incarnation"] == back["incarnation"])
    rejoin_s = broker["started_unix_ms"] / 1000 + new["first_merged_s"] - restarted_at
    print(f"ok rejoin: restart to first merged contribution {rejoin_s:.2f} s "
          f"(process start, torch import and data included), ledger {ledger}")


def case_mixed():
    import math
    cmd = [sys.executable, os.path.join(EXAMPLES, "mixed_mesh.py"), "--binary", BINARY, "--only", "mixed",
           "--steps", "150", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        fail(f"{' '.join(cmd)} exited {out.returncode} without a summary", out.stdout + out.stderr)
    r = json.loads(lines[-1])["runs"][0]["mixed"]
    # The shards start from the native init (N(0, 0.02)): about ln 256 nats/byte.
    if not r["eval_loss"] < math.log(256) - 1.5:
        fail("the global model's eval loss fell by more than 1.5 nats/byte from the initial ~5.55", json.dumps(r))
    kinds = {l["index"]: l["kind"] for l in r["learners"]}
    if kinds != {0: "native", 1: "native", 2: "pytorch", 3: "pytorch"}:
        fail("learners 0 and 1 are native, 2 and 3 PyTorch", json.dumps(r["learners"]))
    if sorted(int(i) for i, merged in r["merged_tokens"].items() if merged > 0) != [0, 1, 2, 3]:
        fail("the broker merged contributions of every learner, native and PyTorch", json.dumps(r["merged_tokens"]))
    if not (r["ledger_balanced"] and r["ledger_matches_learners"]):
        fail("the ledger is balanced and holds exactly each learner's tokens", json.dumps(r))
    if not all(l["tokens"] == 150 * 32 * 64 for l in r["learners"]):
        fail("every learner trained its 150 steps of 32 x 64 tokens", json.dumps(r["learners"]))
    if not abs(r["torch_eval_loss"] - r["eval_loss"]) < 1e-3 * r["eval_loss"]:
        fail("the PyTorch GPT computes the native function: the same model, the same eval loss", json.dumps(r))
    print(f"ok mixed: eval loss {r['eval_loss']:.4f} (PyTorch GPT on the same model {r['torch_eval_loss']:.4f}), "
          f"merged tokens {r['merged_tokens']}, ledger {r['ledger']}, {r['wall_s']:.0f} s")


def case_port():
    cmd = [sys.executable, os.path.join(EXAMPLES, "torch_gpt.py"), "--check"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        fail(f"{' '.join(cmd)} exited {out.returncode} without a summary", out.stdout + out.stderr)
    r = json.loads(lines[-1])
    if not abs(r["loss"] - r["native_loss"]) < 1e-5 * r["native_loss"] or not r["gradient_rel_diff"] < 1e-4:
        fail("one batch: the native loss and every gradient (float32 rounding apart)", json.dumps(r))
    if not abs(r["last_loss"] - r["native_last_loss"]) < 1e-3 * r["native_last_loss"] or not r["param_rel_diff"] < 0.05:
        fail("30 inner steps: the native loss and parameters (float32 rounding apart)", json.dumps(r))
    print(f"ok port: {out.stdout.splitlines()[0]}")


def case_drill():
    folder = tempfile.mkdtemp(prefix="archipelago-pydrill-")
    plan = os.path.join(HERE, "..", "..", "deploy", "drills", "crash_storm.toml")
    command = f"{sys.executable} {os.path.abspath(os.path.join(EXAMPLES, 'torch_gpt.py'))}"
    cmd = [BINARY, "drill", "--plan", plan, "--processes", "--time-scale", "0.4", "--no-reference",
           "--learner-command", f"3={command}", "--report", folder, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        fail(f"{' '.join(cmd)} exited {out.returncode} without a summary", out.stdout[-3000:] + out.stderr[-3000:])
    r = json.loads(lines[-1])
    if r.get("learner_commands") != {"3": command}:
        fail("the drill names the learner that ran a program of its own", json.dumps(r.get("learner_commands")))
    if not (r["passed"] and r["ledger_exact"] and out.returncode == 0):
        fail("the drill passes with a PyTorch learner: no downtime, no committed round lost, ledger exact",
             out.stdout[-3000:])
    with open(os.path.join(folder, "crash_storm-decoupled.json")) as f:
        report = json.load(f)
    faults = report["faults"]
    mine = [f for f in faults if f["what"].startswith("crash learner/3 ")]
    if not mine:
        fail("the plan's kill schedule reaches learner 3", json.dumps(faults))
    restarted = [f for f in mine if f["repaired_s"] is not None]  # null: not restarted within the run
    back = [f for f in restarted if f["rejoin_s"] is not None]
    if not back or not all(f["rejoin_s"] >= 0 for f in back):
        fail("a restart of the PyTorch learner was back at work (a merged contribution)", json.dumps(mine))
    # Every restarted incarnation that joined with time left merged: a Python process
    # importing PyTorch on a loaded machine may join only seconds before the run ends.
    end_s = max(i["left_s"] or 0 for i in report["incarnations"])
    later = sorted((i for i in report["incarnations"] if i["learner"] == 3), key=lambda i: i["incarnation"])[1:]
    if any(i["first_merged_s"] is None and i["joined_s"] is not None and i["joined_s"] < end_s - 8 for i in later):
        fail("every restarted incarnation of the PyTorch learner that joined 8 s before the end had a merged "
             "contribution", json.dumps(later))
    print(f"ok drill: learner/3 (PyTorch) killed {len(mine)} time(s), back at work after "
          f"{[round(f['rejoin_s'], 2) for f in back]} s; ledger {r['ledger']}")


def case_moe():
    steps = 120
    cmd = [sys.executable, os.path.join(EXAMPLES, "moe_mesh.py"), "--binary", BINARY, "--steps", str(steps), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        fail(f"{' '.join(cmd)} exited {out.returncode} without a summary", out.stdout + out.stderr)
    r = json.loads(lines[-1])
    for model in ("moe", "dense"):
        run = r["runs"][model]
        if not (run["ledger_balanced"] and run["ledger_matches_learners"]):
            fail(f"{model}: the ledger is balanced and holds exactly each learner's tokens", json.dumps(run))
        for l in run["learners"]:
            if not l["heldout_end"] < l["heldout_start"] - 0.5:
                fail(f"{model} learner/{l['index']}'s held-out loss fell by more than 0.5 nats/byte", json.dumps(l))
            if l["tokens"] != steps * 16 * 32 or l["contributions"] < 10:
                fail(f"{model} learner/{l['index']} trained its steps and contributed", json.dumps(l))
    moe = r["runs"]["moe"]
    experts = [moe["fragment_of"][f"experts.{e}"] for e in range(r["experts"])]
    shared = [n for n, f in moe["fragment_of"].items() if f in experts and not n.startswith("experts.")]
    if len(set(experts)) != len(experts) or shared:
        fail("every expert is one fragment of its own", json.dumps(moe["fragment_of"]))
    for l in moe["learners"]:
        if min(l["expert_share"]) < 0.02:
            fail(f"learner/{l['index']}'s router sends tokens to every expert", json.dumps(l))
    print(f"ok moe: held-out loss MoE {[round(l['heldout_end'], 3) for l in moe['learners']]}, dense "
          f"{[round(l['heldout_end'], 3) for l in r['runs']['dense']['learners']]}; experts in fragments {experts}; "
          f"ledgers {moe['ledger']} {r['runs']['dense']['ledger']}; {max(moe['wall_s'], r['runs']['dense']['wall_s']):.0f} s "
          f"side by side")


STAND_IN_NODE = """#!/usr/bin/python3
import os, signal, sys, time
name = sys.argv[sys.argv.index("--role") + 1] + "-" + sys.argv[sys.argv.index("--index") + 1]
def note(what):
    with open(os.environ["STOP_RECORD"], "a") as f:
        f.write(name + " " + what + "\\n")
def stop(*_):
    note("signalled")
    time.sleep(0.3 if name.startswith("shard") else 0)  # a shard drains its store
    note("exited")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
note("started")
while True:
    time.sleep(1)
"""


def case_stop():
    from archipelago.mesh import LocalMesh
    folder = tempfile.mkdtemp(prefix="archipelago-pystop-")
    node, record = os.path.join(folder, "node.py"), os.path.join(folder, "record")
    with open(node, "w") as f:
        f.write(STAND_IN_NODE)
    os.chmod(node, 0o755)
    os.environ["STOP_RECORD"] = record
    mesh = LocalMesh(node, os.path.join(folder, "mesh.toml"), shards=2, logs=folder).start()
    deadline = time.time() + 30
    while time.time() < deadline and (not os.path.exists(record) or len(open(record).read().splitlines()) < 3):
        time.sleep(0.05)
    mesh.stop()
    events = open(record).read().splitlines()
    if len(events) != 9:
        fail("every stand-in node started, was signalled and exited", "\n".join(events))
    broker_signalled = events.index("broker-0 signalled")
    if any(events.index(f"shard-{s} exited") > broker_signalled for s in range(2)):
        fail("LocalMesh.stop signals the broker only once every shard has exited", "\n".join(events))
    print("ok stop: " + ", ".join(events))


if __name__ == "__main__":
    {"train": case_train, "layout": case_layout, "nan": case_nan, "rejoin": case_rejoin,
     "mixed": case_mixed, "port": case_port, "drill": case_drill, "moe": case_moe,
     "stop": case_stop}[sys.argv[1]]()
