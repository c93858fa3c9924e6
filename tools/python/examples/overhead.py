#!/usr/bin/env python3
"""The package's overhead on a PyTorch training loop: one PyTorch learner of the
native GPT (torch_gpt.py) alone in a mesh (a broker and one shard, `archipelago
node`, nothing else training), its steps/s with the package (adopt, wait_ready,
after_step every step) against the same loop without the package, alternating
the two in fresh processes, the same steps each.

    PYTHONPATH=build/python /usr/bin/python3 tools/python/examples/overhead.py --steps 150 --pairs 4 --threads 1 --json

Each run is a process of its own (this script with --worker): the same model,
data (archipelago.DataShard), optimizer and schedule; only the timed loop
counts (after joining). It prints each run's steps/s and the ratio
with-package / without (the sum of each kind's steps over the sum of its loop
times); 1.0 means no overhead. Beside it, the CPU time per step of the
learner's own process (time.process_time: every thread of it, so the package's
I/O thread too, not the broker's or the shard's), the part of the overhead
that would follow the learner to a host of its own. --json prints one JSON line last. Measure on a
quiet machine: the load average is printed beside the figures.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import archipelago
from archipelago.mesh import LocalMesh

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def worker(a):
    import torch
    sys.path.insert(0, HERE)
    import torch_gpt
    knobs = ["wire.curve=false"]
    t = archipelago.training(a.config, 0, knobs)
    torch.manual_seed(0)
    torch.set_num_threads(a.threads or t["threads"])
    model = torch_gpt.GPT(archipelago.mesh_layout(a.config, knobs), t["n_head"])
    learner = None
    if a.mode == "package":
        learner = archipelago.Learner(a.config, 0, a.broker, a.shards.split(","), knobs,
                                      tokens_per_step=t["batch"] * t["context"])
        learner.adopt(model)
    opt = torch_gpt.optimizer_for(model, t)
    if learner:
        learner.wait_ready()
    data = archipelago.DataShard(a.config, 0, knobs, incarnation=1)
    for step in range(3):  # warm-up, untimed
        torch_gpt.train_step(model, opt, t, step, *data.next(t["batch"]))
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(a.steps):
        x, y = data.next(t["batch"])
        torch_gpt.train_step(model, opt, t, step, x, y)
        if learner:
            learner.after_step(t["batch"] * t["context"])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if learner:
        learner.close("overhead run done")
    print(json.dumps({"mode": a.mode, "steps": a.steps, "wall_s": wall, "cpu_s": cpu}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="timed steps per run")
    ap.add_argument("--pairs", type=int, default=3, help="alternated pairs of runs")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of torch and of its BLAS library (OPENBLAS_NUM_THREADS) in both loops (0: the mesh "
                         "configuration's, BLAS left as it is); 1 on a 2-core machine leaves the broker and the "
                         "shard a core of their own, as on separate hosts")
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "archipelago"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["package", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--broker", help=argparse.SUPPRESS)
    ap.add_argument("--shards", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    folder = tempfile.mkdtemp(prefix="archipelago-overhead-")
    config = os.path.join(folder, "mesh.toml")
    with open(config, "w") as f:  # one learner, one shard; the step budget only sets the schedule's length
        f.write(f'[model]\nsize = "nano"\n\n[mesh]\nlearners = 1\nshards = 1\n\n[train]\nsteps = {a.steps + 3}\n\n'
                f'[data]\nsynthetic_bytes = 1000000\n')
    runs = []
    env = dict(os.environ)
    if a.threads:  # torch.set_num_threads does not reach the BLAS library's own thread pool (Debian's: OpenBLAS)
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(a.threads)
    load = os.getloadavg()
    with LocalMesh(a.binary, config, shards=1, logs=folder) as mesh:
        time.sleep(0.5)
        mesh.check_alive()
        for pair in range(a.pairs):
            for mode in (("package", "plain") if pair % 2 == 0 else ("plain", "package")):
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
                                      "--steps", str(a.steps), "--threads", str(a.threads), "--config", config, "--broker", mesh.broker,
                                      "--shards", ",".join(mesh.shards)], capture_output=True, text=True, timeout=300,
                                     env=env)
                lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
                if out.returncode != 0 or not lines:
                    sys.exit(f"a {mode} run exited {out.returncode}: {out.stderr[-2000:]}")
                r = json.loads(lines[-1])
                runs.append(r)
                print(f"{mode:8s} {r['steps'] / r['wall_s']:.2f} steps/s, {1e3 * r['cpu_s'] / r['steps']:.1f} ms CPU "
                      f"per step in the learner's process", flush=True)
    load = [round(x, 2) for x in (*load, *os.getloadavg())]
    rate = {m: sum(r["steps"] for r in runs if r["mode"] == m) / sum(r["wall_s"] for r in runs if r["mode"] == m)
            for m in ("package", "plain")}
    cpu = {m: sum(r["cpu_s"] for r in runs if r["mode"] == m) / sum(r["steps"] for r in runs if r["mode"] == m)
           for m in ("package", "plain")}
    ratio = rate["package"] / rate["plain"]
    print(f"with the package {rate['package']:.2f} steps/s, without {rate['plain']:.2f}: ratio {ratio:.3f} "
          f"(bar >= 0.95); CPU per step in the learner's process {1e3 * cpu['package']:.1f} ms with, "
          f"{1e3 * cpu['plain']:.1f} ms without (ratio {cpu['plain'] / cpu['package']:.3f}); "
          f"load {load[0]:.2f} before, {load[3]:.2f} after")
    if a.json:
        print(json.dumps({"command": "overhead", "steps": a.steps, "pairs": a.pairs, "threads": a.threads,
                          "steps_per_s_package": rate["package"], "steps_per_s_plain": rate["plain"],
                          "ratio": ratio, "cpu_s_per_step_package": cpu["package"],
                          "cpu_s_per_step_plain": cpu["plain"], "cpu_ratio": cpu["plain"] / cpu["package"],
                          "runs": runs, "load": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
