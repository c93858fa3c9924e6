#!/usr/bin/env python3
"""Bring your own model: a small PyTorch byte model (not archipelago's GPT),
trained by a plain PyTorch loop, joins a mesh as learners beside one another.

Run from the build tree (PYTHONPATH=build/python):

    PYTHONPATH=build/python /usr/bin/python3 tools/python/examples/byom_mesh.py --learners 2 --steps 300

It writes the model's layout file (archipelago.write_layout), starts a broker and
two shards (`archipelago node`, model.layout = that file), runs each learner in a
process of its own (this script with --learner I), stops the mesh and prints the
learners' held-out loss before and after, and the broker's token ledger against
what every learner reports. --json prints one JSON line last.

--copy binds the model's arrays (copied once per step) instead of adopting the
learner's buffer; --alone trains the same loop without the package (the binding's
overhead: compare its steps/s with a learner's).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import archipelago
from archipelago.mesh import LocalMesh, learner_reports, ledger_check

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


class ByteMLP(nn.Module):
    """Predicts byte t+1 from bytes t-k+1..t: embeddings of a causal window, two
    GELU layers (the second residual), a linear head."""

    def __init__(self, window=4, width=32, hidden=128):
        super().__init__()
        self.window = window
        self.embed = nn.Embedding(256, width)
        self.fc1 = nn.Linear(window * width, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 256)

    def forward(self, x):
        e = self.embed(x)
        t = x.shape[1]
        h = torch.cat([F.pad(e, (0, 0, i, 0))[:, :t] for i in range(self.window)], dim=-1)
        h = F.gelu(self.fc1(h))
        h = F.gelu(self.fc2(h)) + h
        return self.head(h)


KINDS = {"embed.weight": "embedding"}


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))


def evaluate(model, heldout):
    with torch.no_grad():
        return float(loss_of(model, torch.from_numpy(heldout[0]), torch.from_numpy(heldout[1])))


def run_learner(a):
    """One learner: the plain loop, with the package's three calls (or none, --alone)."""
    torch.manual_seed(a.learner)
    torch.set_num_threads(1)
    model = ByteMLP()
    knobs = {"wire.curve": False}
    data = archipelago.DataShard(a.config, a.learner, knobs, incarnation=int(time.time() * 1000))
    heldout = data.heldout(64)
    learner = None
    if not a.alone:
        learner = archipelago.Learner(a.config, a.learner, a.broker, a.shards.split(","), knobs,
                                      tokens_per_step=a.batch * data.context)
        if a.copy:
            learner.bind({n: p.detach().numpy() for n, p in model.named_parameters()})
        else:
            learner.adopt(model)
        learner.wait_ready()
        if a.barrier:  # every learner starts stepping together (imports take seconds on a loaded machine)
            open(os.path.join(a.barrier, f"ready-{a.learner}"), "w").close()
            deadline = time.time() + 180
            while sum(f.startswith("ready-") for f in os.listdir(a.barrier)) < a.learners and time.time() < deadline:
                learner.poll()
                time.sleep(0.05)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    start_loss = evaluate(model, heldout)
    losses = []
    in_package = 0.0  # seconds inside after_step
    t0 = time.perf_counter()
    stop = os.path.join(a.barrier, "stop") if a.barrier else None
    for step in range(a.steps):
        if stop and step % 10 == 0 and os.path.exists(stop):  # the launcher ends the run early
            break
        x, y = data.next(a.batch)
        loss = loss_of(model, torch.from_numpy(x), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        if a.nan_at == step:  # a gradient blows up: AdamW's moments carry the NaN on
            model.fc1.weight.grad[0, 0] = float("nan")
        opt.step()
        losses.append(float(loss))
        if learner:
            t = time.perf_counter()
            learner.after_step(a.batch * data.context)
            in_package += time.perf_counter() - t
    wall = time.perf_counter() - t0
    report = {"index": a.learner, "steps": len(losses), "steps_per_s": len(losses) / wall,
              "after_step_share": in_package / wall,
              "heldout_start": start_loss, "heldout_end": evaluate(model, heldout),
              "train_first": sum(losses[:20]) / 20, "train_last": sum(losses[-20:]) / 20}
    if learner:
        s = learner.status()
        report.update(incarnation=s["incarnation"], tokens=s["tokens"], contributions=s["contributions"],
                      non_finite=s["non_finite"], versions=s["versions"])
        learner.close("steps done")
    print(json.dumps(report), flush=True)


def write_mesh_files(learners, folder, mesh_settings=()):
    """The layout and a configuration for `learners` learners; `mesh_settings`: ["KEY=VALUE", ...] of [mesh]."""
    layout = os.path.join(folder, "layout.json")
    archipelago.write_layout(layout, {n: p.detach().numpy() for n, p in ByteMLP().named_parameters()}, KINDS)
    config = os.path.join(folder, "mesh.toml")
    extra = "".join(f"{k.strip()} = {v.strip()}\n" for k, v in (m.split("=", 1) for m in mesh_settings))
    with open(config, "w") as f:
        f.write(f'[model]\nlayout = "{layout}"\ncontext = 32\n\n'
                f'[mesh]\nlearners = {learners}\nfragments = 4\nshards = 2\n{extra}\n'
                f'[data]\nsynthetic_bytes = 2000000\n')
    return config


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "archipelago"))
    ap.add_argument("--copy", action="store_true", help="bind the model's arrays (copies) instead of adopting")
    ap.add_argument("--alone", action="store_true", help="one learner, no package, no mesh (the overhead's baseline)")
    ap.add_argument("--nan-at", type=int, default=-1, metavar="STEP", help="learner 0 puts a NaN in its model here")
    ap.add_argument("--mesh", action="append", default=[], metavar="KEY=VALUE",
                    help="a [mesh] setting of the configuration (e.g. flush=true); repeatable")
    ap.add_argument("--db", metavar="DIR", help="the broker and shards keep their stores here (archipelago replay)")
    ap.add_argument("--json", action="store_true")
    # A learner process (started by the launcher part below).
    ap.add_argument("--learner", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--broker", help=argparse.SUPPRESS)
    ap.add_argument("--shards", help=argparse.SUPPRESS)
    ap.add_argument("--barrier", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.learner >= 0:
        return run_learner(a)

    folder = tempfile.mkdtemp(prefix="archipelago-byom-")
    a.config = write_mesh_files(a.learners, folder, a.mesh)
    common = ["--config", a.config, "--steps", str(a.steps), "--batch", str(a.batch), "--lr", str(a.lr)]
    if a.alone:  # in a process of its own, as a learner runs (not in this one, which built a model already)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--learner", "0", "--alone", *common],
                             stdout=subprocess.PIPE, text=True, check=True).stdout
        print(out.strip().splitlines()[-1])
        return 0
    mesh = LocalMesh(a.binary, a.config, shards=2, logs=folder, db=a.db).start()
    procs = []
    try:
        time.sleep(0.5)
        mesh.check_alive()
        for i in range(a.learners):
            cmd = [sys.executable, os.path.abspath(__file__), "--learner", str(i), *common, "--broker", mesh.broker,
                   "--shards", ",".join(mesh.shards), "--learners", str(a.learners), "--barrier", folder]
            cmd += ["--copy"] if a.copy else []
            cmd += ["--nan-at", str(a.nan_at)] if a.nan_at >= 0 and i == 0 else []
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        reports = learner_reports(procs, 600, logs=folder)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        nodes = mesh.stop()
    broker = nodes.get("broker-0") or {}
    balanced, matches, ledger = ledger_check(broker, reports)
    rejected = sum((nodes.get(f"shard-{s}") or {}).get("rejected", 0) for s in range(2))
    for r in reports:
        print(f"learner/{r['index']}: {r['steps']} steps at {r['steps_per_s']:.1f}/s "
              f"({100 * r['after_step_share']:.1f} % of it in after_step), held-out loss "
              f"{r['heldout_start']:.3f} -> {r['heldout_end']:.3f} nats/byte, {r['contributions']} contributions, "
              f"{r['non_finite']} held back (not finite)")
    print(f"broker: {broker.get('rounds', 0)} rounds; ledger {ledger} balanced={balanced} "
          f"matches learners={matches}; shards rejected {rejected} contribution(s); logs in {folder}")
    if a.json:
        print(json.dumps({"command": "byom_mesh", "learners": reports, "rounds": broker.get("rounds", 0),
                          "ledger": ledger, "ledger_balanced": balanced, "ledger_matches_learners": matches,
                          "rejected": rejected, "logs": folder}))
    return 0 if balanced and matches else 1


if __name__ == "__main__":
    sys.exit(main())
