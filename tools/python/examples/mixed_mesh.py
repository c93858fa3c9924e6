#!/usr/bin/env python3
"""A mixed mesh: native learners and PyTorch learners (torch_gpt.py, the native
GPT in PyTorch) of one layout train one global model, against an all-native mesh
run the same way with the same token budget.

    PYTHONPATH=build/python /usr/bin/python3 tools/python/examples/mixed_mesh.py --steps 300 --seeds 1,2 --json

Per seed, two runs (alternating which goes first): a broker and the shards
(`archipelago node`, --db, as LocalMesh) with 4 learners of the nano GPT — learners
0 and 1 `archipelago node --role learner`, 2 and 3 PyTorch (mixed), or all four
native (native). Every learner trains train.steps = --steps steps of the same batch,
so both runs train on the same number of tokens. After the learners finish, the
mesh stops and `archipelago replay --db DIR eval head` gives the global model's
eval loss (nats/byte on the held-out windows). The broker's ledger is checked
against every learner's own report (archipelago.mesh.ledger_check).

In the mixed run the exported global model is also loaded into the PyTorch GPT
and evaluated on the same windows (archipelago.eval_windows): the two figures
agree when the PyTorch GPT computes the native function. --json prints one JSON
line last: per seed both eval losses and their ratio, the equivalence check,
ledgers, and the load average.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

import archipelago
from archipelago.mesh import LocalMesh, ledger_check

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)
import torch_gpt  # noqa: E402


def write_config(folder, steps, seed, learners, shards, synthetic_bytes, step_time_ms):
    path = os.path.join(folder, f"mesh-{seed}.toml")
    with open(path, "w") as f:
        f.write(f'[model]\nsize = "nano"\n\n[mesh]\nlearners = {learners}\nshards = {shards}\n'
                f'step_time_ms = {step_time_ms}\n\n[train]\nsteps = {steps}\nseed = {seed}\n\n'
                f'[data]\nsynthetic_bytes = {synthetic_bytes}\n')
    return path


def run_mesh(binary, config, torch_learners, shards, learners, folder, timeout_s):
    """One mesh until every learner finished its steps; returns its figures."""
    db = tempfile.mkdtemp(prefix="db-", dir=folder)
    mesh = LocalMesh(binary, config, shards=shards, logs=folder, db=db).start()
    pythons, reports = {}, []
    t0 = time.time()
    try:
        time.sleep(0.5)
        mesh.check_alive()
        for i in range(learners):
            if i in torch_learners:
                log = open(os.path.join(folder, f"torch-learner-{i}.log"), "w")
                pythons[i] = (subprocess.Popen([sys.executable, os.path.join(HERE, "torch_gpt.py"), "--config", config,
                                                "--index", str(i), "--broker", mesh.broker, "--shards",
                                                ",".join(mesh.shards), "--set", "wire.curve=false"],
                                               stdout=subprocess.PIPE, stderr=log, text=True), log)
            else:
                mesh.start_node("learner", i)
        natives = [p for name, (p, _) in mesh.processes.items() if name.startswith("learner")]
        deadline = time.time() + timeout_s
        for i, (p, log) in pythons.items():
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
            log.close()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"PyTorch learner {i} exited with {p.returncode}; its log: {log.name}")
            reports.append(dict(json.loads(lines[-1]), kind="pytorch"))
        for p in natives:
            p.wait(timeout=max(1, deadline - time.time()))
    finally:
        for p, _ in pythons.values():
            if p.poll() is None:
                p.kill()
        wall = time.time() - t0
        nodes = mesh.stop()
    for i in range(learners):
        if i not in torch_learners:
            r = nodes.get(f"learner-{i}")
            if not r:
                raise RuntimeError(f"native learner {i} printed no summary; logs in {folder}")
            reports.append(dict(r, kind="native"))
    broker = nodes.get("broker-0") or {}
    balanced, matches, ledger = ledger_check(broker, reports)
    merged = {}  # per learner (every incarnation), the tokens of its merged contributions
    for rec in broker.get("learners", []):
        merged[rec["learner"]] = merged.get(rec["learner"], 0) + rec["merged"]
    ev = subprocess.run([binary, "replay", "--db", db, "eval", "head", "--json"], capture_output=True, text=True,
                        timeout=120)
    lines = [line for line in ev.stdout.splitlines() if line.startswith("{")]
    if ev.returncode != 0 or not lines:
        raise RuntimeError(f"replay eval of {db} failed: {ev.stdout}{ev.stderr}")
    return {"eval_loss": json.loads(lines[-1])["eval_loss"], "db": db, "wall_s": wall, "rounds": broker.get("rounds", 0),
            "ledger": ledger, "ledger_balanced": balanced, "ledger_matches_learners": matches,
            "merged_tokens": merged,
            "learners": sorted((dict({k: r.get(k) for k in ("index", "kind", "incarnation", "steps", "tokens")},
                                     steps_per_s=r.get("steps_per_s") or r["steps"] / max(r.get("wall_s", 0), 1e-9))
                                for r in reports), key=lambda r: r["index"])}


def torch_eval_of(binary, config, db, folder):
    """The stored global model loaded into the PyTorch GPT, scored on the native eval windows."""
    out = os.path.join(folder, "head.safetensors")
    subprocess.run([binary, "replay", "--db", db, "export", "head", "--format", "safetensors", "--out", out],
                   check=True, capture_output=True, timeout=120)
    t = archipelago.training(config, 0)
    model = torch_gpt.GPT(archipelago.mesh_layout(config), t["n_head"])
    model.load_state_dict({k: torch.from_numpy(v) for k, v in archipelago.load_safetensors(out).items()})
    return torch_gpt.eval_loss(model, archipelago.eval_windows(config))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="train.steps: every learner's steps (default 300)")
    ap.add_argument("--seeds", default="1", help="comma-separated train.seed values, one pair of runs each")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--step-time-ms", type=float, default=0,
                    help="mesh.step_time_ms: every learner's step lasts at least this (a common pace; 0: unpaced)")
    ap.add_argument("--synthetic-bytes", type=int, default=2000000)
    ap.add_argument("--only", choices=["mixed", "native"], help="run one kind of mesh only")
    ap.add_argument("--timeout", type=float, default=600, help="bound on one mesh's run (s)")
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "archipelago"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    learners, torch_learners = 4, {2, 3}
    folder = tempfile.mkdtemp(prefix="archipelago-mixed-")
    runs = []
    for n, seed in enumerate(int(s) for s in a.seeds.split(",")):
        config = write_config(folder, a.steps, seed, learners, a.shards, a.synthetic_bytes, a.step_time_ms)
        kinds = ["mixed", "native"] if n % 2 == 0 else ["native", "mixed"]
        result = {"seed": seed}
        for kind in kinds:
            if a.only and kind != a.only:
                continue
            load_before = os.getloadavg()
            r = run_mesh(a.binary, config, torch_learners if kind == "mixed" else set(), a.shards, learners, folder,
                         a.timeout)
            r["load"] = [round(x, 2) for x in (*load_before, *os.getloadavg())]
            if kind == "mixed":
                r["torch_eval_loss"] = torch_eval_of(a.binary, config, r["db"], folder)
            result[kind] = r
            pace = ", ".join(f"{l['kind'][0]}{l['index']} {l['steps_per_s']:.1f}" for l in r["learners"])
            print(f"seed {seed} {kind}: eval loss {r['eval_loss']:.4f} nats/byte after {r['ledger'].get('processed')} "
                  f"tokens, {r['rounds']} rounds, {r['wall_s']:.0f} s (steps/s: {pace}), "
                  f"ledger balanced={r['ledger_balanced']} "
                  f"matches learners={r['ledger_matches_learners']}, load {r['load'][0]:.2f} -> {r['load'][3]:.2f}"
                  + (f"; the same model in the PyTorch GPT: {r['torch_eval_loss']:.4f}" if kind == "mixed" else ""),
                  flush=True)
        if "mixed" in result and "native" in result:
            result["ratio"] = result["mixed"]["eval_loss"] / result["native"]["eval_loss"]
            print(f"seed {seed}: mixed / all-native eval loss = {result['ratio']:.4f}", flush=True)
        runs.append(result)
    ratios = [r["ratio"] for r in runs if "ratio" in r]
    if ratios:
        print(f"mixed / all-native eval loss over {len(ratios)} seed(s): mean {sum(ratios) / len(ratios):.4f}, "
              f"worst {max(ratios):.4f} (bar: <= 1.02); logs in {folder}")
    if a.json:
        print(json.dumps({"command": "mixed_mesh", "steps": a.steps, "step_time_ms": a.step_time_ms, "learners": learners,
                          "pytorch_learners": sorted(torch_learners), "runs": runs,
                          "ratio_mean": sum(ratios) / len(ratios) if ratios else None,
                          "ratio_worst": max(ratios) if ratios else None, "logs": folder}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
