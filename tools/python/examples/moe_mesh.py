#!/usr/bin/env python3
"""A mixture of experts through the package: a small PyTorch MoE byte model,
trained by learners of a mesh, beside a dense model trained the same way in a
mesh of its own.

    PYTHONPATH=build/python /usr/bin/python3 tools/python/examples/moe_mesh.py --steps 300

The MoE model: byte embeddings of a causal window mixed by one dense layer, then
a switch layer (a router picks one of --experts experts per token, the expert's
output scaled by its router probability, plus the input) and a linear head; the
loss is the cross-entropy plus the switch load-balancing loss (--aux). Each
expert is ONE tensor, `experts.E` of shape [2, hidden, width] (its two matrices
stacked), so the fragment plan, which packs whole tensors, keeps every expert in
one fragment: with --fragments = experts + 3 (the default), each expert has a
fragment of its own and the shards merge expert E only with expert E of the other
learners. The dense model is the same without the router: one FFN tensor of the
same shape, i.e. the parameters each token goes through are the same in both.

Per model it writes the layout (archipelago.write_layout) and a configuration,
starts a broker and two shards (`archipelago node`, --db), runs each learner in
a process of its own (this script with --learner I: the plain PyTorch loop with
adopt, wait_ready, after_step, close), stops the mesh and checks the broker's
ledger against every learner's report. The two meshes run side by side. It prints both models' held-out loss
before and after (every learner trains the same steps on batches of the same
size: equal tokens), the MoE learners' share of tokens per expert, and each
expert's fragment (the plan `archipelago replay export` reports with the global model).
--json prints one JSON line last.
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
KINDS = {"trunk.embed.weight": "embedding"}


class Trunk(nn.Module):
    """Embeddings of the bytes t-window+1..t, concatenated and mixed by one GELU layer."""

    def __init__(self, window, width):
        super().__init__()
        self.window = window
        self.embed = nn.Embedding(256, width)
        self.mix = nn.Linear(window * width, width)

    def forward(self, x):
        e = self.embed(x)
        t = x.shape[1]
        return F.gelu(self.mix(torch.cat([F.pad(e, (0, 0, i, 0))[:, :t] for i in range(self.window)], dim=-1)))


def ffn(w, h):
    """A two-matrix GELU FFN whose weights are one [2, hidden, width] tensor."""
    return F.gelu(h @ w[0].t()) @ w[1]


class SwitchMoE(nn.Module):
    """Top-1 routing (Switch Transformer): each token goes through one expert."""

    def __init__(self, experts=4, window=4, width=32, hidden=128):
        super().__init__()
        self.trunk = Trunk(window, width)
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ParameterList(
            nn.Parameter(torch.randn(2, hidden, width) * width ** -0.5) for _ in range(experts))
        self.head = nn.Linear(width, 256)

    def forward(self, x):
        h = self.trunk(x).reshape(-1, self.router.in_features)
        probs = F.softmax(self.router(h), dim=-1)
        gate, choice = probs.max(dim=-1)
        out = torch.zeros_like(h)
        for e, w in enumerate(self.experts):
            rows = (choice == e).nonzero(as_tuple=True)[0]
            if rows.numel():
                out[rows] = gate[rows, None] * ffn(w, h[rows])
        # Switch's load-balancing loss: experts x sum over experts of (share of tokens) x (mean probability).
        share = torch.bincount(choice, minlength=len(self.experts)).float() / choice.numel()
        aux = len(self.experts) * torch.sum(share * probs.mean(dim=0))
        return self.head(h + out).reshape(*x.shape, 256), aux, share


class Dense(nn.Module):
    """The same network with one FFN every token goes through."""

    def __init__(self, window=4, width=32, hidden=128):
        super().__init__()
        self.trunk = Trunk(window, width)
        self.ffn = nn.Parameter(torch.randn(2, hidden, width) * width ** -0.5)
        self.head = nn.Linear(width, 256)

    def forward(self, x):
        h = self.trunk(x)
        return self.head(h + ffn(self.ffn, h)), torch.zeros(()), None


def make_model(a):
    return SwitchMoE(a.experts) if a.model == "moe" else Dense()


def losses_of(model, x, y):
    logits, aux, share = model(x)
    return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)), aux, share


def evaluate(model, heldout):
    with torch.no_grad():
        return float(losses_of(model, torch.from_numpy(heldout[0]), torch.from_numpy(heldout[1]))[0])


def run_learner(a):
    """One learner: a plain PyTorch loop with the package's calls."""
    torch.manual_seed(a.learner)
    torch.set_num_threads(1)
    model = make_model(a)
    knobs = {"wire.curve": False}
    data = archipelago.DataShard(a.config, a.learner, knobs, incarnation=int(time.time() * 1000))
    heldout = data.heldout(64)
    learner = archipelago.Learner(a.config, a.learner, a.broker, a.shards.split(","), knobs,
                                  tokens_per_step=a.batch * data.context)
    learner.adopt(model)
    learner.wait_ready()  # the global model: expert E is the same expert in every learner
    ready = os.path.join(a.barrier, f"ready-{a.model}-{a.learner}")
    open(ready, "w").close()  # every learner starts stepping together
    deadline = time.time() + 180
    while sum(f.startswith(f"ready-{a.model}-") for f in os.listdir(a.barrier)) < a.learners and \
            time.time() < deadline:
        learner.poll()
        time.sleep(0.05)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    start_loss = evaluate(model, heldout)
    losses, shares = [], torch.zeros(a.experts)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        x, y = data.next(a.batch)
        loss, aux, share = losses_of(model, torch.from_numpy(x), torch.from_numpy(y))
        opt.zero_grad()
        (loss + a.aux * aux).backward()
        opt.step()
        losses.append(float(loss))
        if share is not None:
            shares += share
        learner.after_step(a.batch * data.context)
    wall = time.perf_counter() - t0
    s = learner.status()
    report = {"index": a.learner, "model": a.model, "steps": len(losses), "steps_per_s": len(losses) / wall,
              "heldout_start": start_loss, "heldout_end": evaluate(model, heldout),
              "train_first": sum(losses[:20]) / 20, "train_last": sum(losses[-20:]) / 20,
              "incarnation": s["incarnation"], "tokens": s["tokens"], "contributions": s["contributions"],
              "versions": s["versions"]}
    if a.model == "moe":
        report["expert_share"] = [round(float(v) / len(losses), 4) for v in shares]
    learner.close("steps done")
    print(json.dumps(report), flush=True)


def write_mesh_files(a, folder):
    """The model's layout and a mesh configuration; returns the configuration's path."""
    layout = os.path.join(folder, f"{a.model}-layout.json")
    archipelago.write_layout(layout, {n: p.detach().numpy() for n, p in make_model(a).named_parameters()}, KINDS)
    fragments = a.fragments or (a.experts + 3 if a.model == "moe" else 4)
    config = os.path.join(folder, f"{a.model}-mesh.toml")
    with open(config, "w") as f:
        f.write(f'[model]\nlayout = "{layout}"\ncontext = 32\n\n'
                f'[mesh]\nlearners = {a.learners}\nfragments = {fragments}\nshards = 2\nflush = true\n'
                f'rebase = true\n\n[train]\nseed = {a.seed}\n\n[data]\nsynthetic_bytes = 2000000\n')
    return config


def fragments_of(binary, db):
    """{tensor name: fragment} of the mesh's fragment plan, from the export of its last cut
    (`archipelago replay export`, which also writes the global model to db/model.safetensors)."""
    out = subprocess.run([binary, "replay", "--db", db, "export", "head", "--format", "safetensors", "--out",
                          os.path.join(db, "model.safetensors"), "--json"], capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"replay export of {db} failed: {out.stdout}{out.stderr}")
    return {name: f for f, names in enumerate(json.loads(lines[-1])["fragments"]) for name in names}


def start_mesh(a, model, folder):
    """One model's mesh and its learner processes, started."""
    a = argparse.Namespace(**{**vars(a), "model": model})
    config = write_mesh_files(a, folder)
    db = tempfile.mkdtemp(prefix=f"db-{model}-", dir=folder)
    logs = os.path.join(folder, model)  # each mesh's node logs apart: they share names
    os.makedirs(logs)
    mesh = LocalMesh(a.binary, config, shards=2, logs=logs, db=db).start()
    time.sleep(0.5)
    mesh.check_alive()
    procs = []
    for i in range(a.learners):
        cmd = [sys.executable, os.path.abspath(__file__), "--learner", str(i), "--model", model, "--config", config,
               "--broker", mesh.broker, "--shards", ",".join(mesh.shards), "--learners", str(a.learners),
               "--barrier", folder, "--steps", str(a.steps), "--batch", str(a.batch), "--lr", str(a.lr),
               "--experts", str(a.experts), "--aux", str(a.aux)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    return {"args": a, "mesh": mesh, "db": db, "procs": procs, "t0": time.time(), "load": os.getloadavg()[0]}


def finish_mesh(run, folder):
    """Waits for a started mesh's learners, stops it; returns its figures."""
    a, mesh = run["args"], run["mesh"]
    try:
        reports = learner_reports(run["procs"], a.timeout, f"a {a.model} learner", folder)
    finally:
        nodes = mesh.stop()
        run["stopped"] = True
    wall = time.time() - run["t0"]
    broker = nodes.get("broker-0") or {}
    balanced, matches, ledger = ledger_check(broker, reports)
    return {"model": a.model, "learners": reports, "rounds": broker.get("rounds", 0), "ledger": ledger,
            "ledger_balanced": balanced, "ledger_matches_learners": matches, "wall_s": wall,
            "params": sum(p.numel() for p in make_model(a).parameters()),
            "fragment_of": fragments_of(a.binary, run["db"]),
            "load": [round(run["load"], 2), round(os.getloadavg()[0], 2)]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300, help="every learner's steps (both models: equal tokens)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--aux", type=float, default=0.05, help="weight of the load-balancing loss")
    ap.add_argument("--fragments", type=int, default=0, help="mesh.fragments (0: experts + 3 for the MoE, 4 dense)")
    ap.add_argument("--seed", type=int, default=1, help="train.seed: the global model's initialisation, the data")
    ap.add_argument("--only", choices=["moe", "dense"], help="train one model only")
    ap.add_argument("--timeout", type=float, default=300, help="bound on one learner's run (s)")
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "archipelago"))
    ap.add_argument("--json", action="store_true")
    # A learner process (started by the launcher part below).
    ap.add_argument("--learner", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="moe", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--broker", help=argparse.SUPPRESS)
    ap.add_argument("--shards", help=argparse.SUPPRESS)
    ap.add_argument("--barrier", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.learner >= 0:
        return run_learner(a)

    folder = tempfile.mkdtemp(prefix="archipelago-moe-")
    # The two meshes train side by side.
    started = {}
    try:
        for model in ["moe", "dense"]:
            if not a.only or model == a.only:
                started[model] = start_mesh(a, model, folder)
        runs = {model: finish_mesh(run, folder) for model, run in started.items()}
    finally:  # a mesh not finished (an error) is stopped, its learners killed
        for run in started.values():
            if not run.get("stopped"):
                run["mesh"].stop()
                for p in run["procs"]:
                    if p.poll() is None:
                        p.kill()
    for model, r in runs.items():
        for l in r["learners"]:
            print(f"{model} learner/{l['index']}: {l['steps']} steps at {l['steps_per_s']:.1f}/s, held-out loss "
                  f"{l['heldout_start']:.3f} -> {l['heldout_end']:.3f} nats/byte, {l['contributions']} contributions"
                  + (f", tokens per expert {l['expert_share']}" if "expert_share" in l else ""))
        print(f"{model}: {r['params']} parameters, {r['rounds']} rounds in {r['wall_s']:.0f} s; ledger {r['ledger']} "
              f"balanced={r['ledger_balanced']} matches learners={r['ledger_matches_learners']}")
        if model == "moe":
            print("fragment of each expert: " +
                  ", ".join(f"experts.{e} -> {r['fragment_of'][f'experts.{e}']}" for e in range(a.experts)))
    if "moe" in runs and "dense" in runs:
        end = {m: sum(l["heldout_end"] for l in r["learners"]) / len(r["learners"]) for m, r in runs.items()}
        print(f"held-out loss at equal tokens (mean over learners): MoE {end['moe']:.3f}, dense {end['dense']:.3f} "
              f"nats/byte; logs in {folder}")
    if a.json:
        print(json.dumps({"command": "moe_mesh", "steps": a.steps, "batch": a.batch, "experts": a.experts,
                          "runs": runs, "logs": folder}))
    return 0 if all(r["ledger_balanced"] and r["ledger_matches_learners"] for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
