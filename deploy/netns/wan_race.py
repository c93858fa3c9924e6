#!/usr/bin/env python3
"""The WAN race over real links: PyTorch DDP (gloo), archipelago's dp and decoupled
(and diloco, streaming) train the same model on the same data across the network-
namespace test bed (testbed.py: one host per learner, tbf on every access link, every
packet delayed by the relay), each to the same eval loss, and each *raced*, not projected.

The caps follow `archipelago bench wan`'s arithmetic: dp's bytes per direction per step
(the fp32 gradient) take as many times a step's compute time as a 12B model's bf16
gradient takes on a --ref-gbit link against its compute time on 256 accelerators. The
compute time of a step is archipelago dp's, measured first without a cap (M learners of one
thread each, as in the races; the fastest engine of the race, so the widest cap: the
cap can only favour the conventional baselines). Every learner host gets that cap; the
broker host (broker and one parameter shard, the synchroniser's site) gets M times it, so
that every learner has one capped link each way, as in `bench wan`. DDP's ranks talk to
each other directly (a ring of M = 2 is one link pair), over the same capped access links.

  1. PyTorch DDP (gloo) trains --target-steps steps of the --schedule-steps schedule: the
     GPT of tools/python/examples/torch_gpt.py (the native GPT's layout and function), the
     native learners' data shards, AdamW, clipping and schedule (the python package), global
     batch M x data.batch; DDP averages the gradients in the backward pass, both directions
     of the ring at once (the bandwidth-optimal all-reduce). Rank 0 evaluates every
     --eval-every steps on the native held-out windows (the clock stops while it does, and
     both ranks meet at a barrier before it restarts). Its loss after --target-steps is the
     **target**; its time to the target is its training time up to the first evaluation at
     or below it.
  2. archipelago dp, then decoupled (any other --modes, and --variant NAME=MODE,KEY=VALUE,...
     races of a mode with knobs of its own): `archipelago node` processes
     across a fresh bed (CURVE on), the same schedule, batch and threads, the shard keeping
     every version in its store. dp stops once its learners are --dp-stop x --target-steps
     steps in (or after --dp-seconds); the others after --mode-seconds. Afterwards the stored
     versions are evaluated (`replay eval`, the native held-out windows): the time to the
     target is the first version at or below it, from its time stamp, counted from the
     moment the learner processes were started (their start-up included: never less than
     happened).

Every bed: MTU 1500 and a tbf burst of 5 ms at the rate (a larger one would let a good part of
a message through a link of a few Mbit/s at line speed). Prints a table (time to the target,
tokens there, bytes on the links during the race, how many times sooner than DDP and dp each race got there) and with --json one line last; --plot FILE.svg draws
eval loss against seconds (log scale), one line per mode, the target dashed. Needs root,
build/archipelago, build/archipelago_wan_relay, build/python (WITH_TORCH=1 tools/setup.sh)
and Debian's python3-torch.

  deploy/netns/wan_race.py --json                      # about 15-25 minutes at the 5 Gbit/s equivalent
  deploy/netns/wan_race.py --target-steps 40 --schedule-steps 200 --modes ddp,decoupled
"""

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import testbed as tb  # noqa: E402

REPO = tb.REPO
DDP_PORT = 29500
METRICS_PORT = 9100
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch
MODES = ("ddp", "dp", "diloco", "streaming", "decoupled")


# ---- the arithmetic (bench wan's) ----------------------------------------------------

def reference_ratio(a):
    """dp's transfer time per direction over its compute time per step, for the reference model."""
    compute_s = 6 * a.ref_params * a.ref_tokens / (a.ref_chips * a.ref_chip_tflops * 1e12)
    transfer_s = a.ref_params * a.ref_bytes_per_param * 8 / (a.ref_gbit * 1e9)
    return transfer_s / compute_s, compute_s


def knobs_of(a):
    k = [f"mesh.learners={a.learners}", f"train.steps={a.schedule_steps}", f"data.batch={a.batch}",
         "train.threads=1", f"train.seed={a.seed}"]
    if a.corpus:
        k.append(f"data.corpus={os.path.abspath(a.corpus)}")
    return k + a.set


def measure_compute(a, knobs, work):
    """archipelago dp's time per step without a cap, M learners computing at once (bench wan's)."""
    cmd = [a.binary, "run", "--mode", "dp", "--out", os.path.join(work, "dp.ckpt"),
           "--report", os.path.join(work, "dp.html"), "--json"]
    # A short schedule of its own: the schedule moves the loss, not the pace.
    for k in knobs + [f"train.steps={a.compute_steps}", "train.eval_every=0"]:
        cmd += ["--set", k]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=work)
    r = tb.last_json_text(out.stdout)
    if out.returncode != 0 or not r or not r.get("rounds"):
        raise tb.TestbedError(f"measuring dp's step: {' '.join(cmd)}: {out.stderr.strip()[-400:]}")
    return r["wall_s"] / r["rounds"]


def torch_settings():
    """The environment of the PyTorch processes: the python package, and PyTorch tuned as in
    `bench ddp` (one BLAS thread per rank, its AVX-512 kernels where the CPU has them)."""
    env = {"PYTHONPATH": os.pathsep.join([os.path.join(REPO, "build", "python"),
                                          os.path.join(REPO, "tools", "python", "examples")]),
           "OPENBLAS_NUM_THREADS": "1"}
    with open("/proc/cpuinfo") as f:
        if " avx512f" in f.read():
            env["OPENBLAS_CORETYPE"] = "SkylakeX"
    return env


def params_of(knobs):
    """The model's parameter count, from the python package's reading of the knobs."""
    count = ("import math, sys, archipelago\n"
             "print(sum(math.prod(t['shape']) for t in archipelago.mesh_layout('', sys.argv[1:])['tensors']))")
    out = subprocess.run([PYTHON, "-c", count, *knobs],
                         capture_output=True, text=True, env={**os.environ, **torch_settings()}, timeout=120)
    if out.returncode != 0:
        raise tb.TestbedError(f"the python package (build/python; WITH_TORCH=1 tools/setup.sh): {out.stderr.strip()[-400:]}")
    return int(out.stdout.strip())


# ---- one DDP rank (runs inside its host's namespace) ----------------------------------

def ddp_rank(a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    import archipelago
    import torch_gpt

    knobs = a.knobs
    t = archipelago.training("", a.rank, knobs)
    torch.set_num_threads(t["threads"])
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(a.seed)
    model = torch_gpt.GPT(archipelago.mesh_layout("", knobs), t["n_head"])
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    ddp = DDP(model)  # rank 0's parameters go to every rank
    opt = torch_gpt.optimizer_for(model, t)
    data = archipelago.DataShard("", a.rank, knobs, incarnation=1)
    windows = archipelago.eval_windows("", knobs) if a.rank == 0 else None
    curve, clock, step_s = [], 0.0, []
    if a.rank == 0:
        curve.append([0.0, 0, torch_gpt.eval_loss(model, windows)])
    dist.barrier()
    for step in range(a.steps):
        begun = time.perf_counter()
        x, y = data.next(t["batch"])
        logits = ddp(torch.from_numpy(x))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()  # the all-reduce, bucket by bucket
        if t["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["clip_norm"])
        for group in opt.param_groups:
            group["lr"] = archipelago.scheduled_lr(t, step)
        opt.step()
        step_s.append(time.perf_counter() - begun)
        clock += step_s[-1]
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            if a.rank == 0:
                curve.append([round(clock, 3), step + 1, torch_gpt.eval_loss(model, windows)])
            dist.barrier()  # the clock restarts with every rank at the same point
    dist.destroy_process_group()
    if a.rank == 0:
        step_s.sort()
        print(json.dumps({"curve": curve, "steps": a.steps, "train_s": round(clock, 3),
                          "step_ms_median": round(1e3 * step_s[len(step_s) // 2], 2),
                          "tokens_per_step": a.world * t["batch"] * t["context"], "torch": torch.__version__}))


# ---- the races --------------------------------------------------------------------

class Race:
    """One bed per race, torn down after it (also on failure and on signals)."""

    def __init__(self, a, cap_mbit, delay_ms, work):
        self.a, self.cap_mbit, self.delay_ms, self.work = a, cap_mbit, delay_ms, work

    def bed(self, race):
        a = self.a
        name = tb.new_bed_name(a.prefix)
        hosts = [tb.Host(name, "broker", 0, self.cap_mbit * a.learners, self.delay_ms)]
        hosts += [tb.Host(name, f"l{i}", i + 1, self.cap_mbit, self.delay_ms) for i in range(a.learners)]
        log_dir = os.path.join(self.work, race)
        os.makedirs(log_dir, exist_ok=True)
        bed = tb.Testbed(name, hosts, argparse.Namespace(subnet=a.subnet, mtu=a.mtu, relay=a.relay, burst_ms=5))
        return bed, log_dir

    def traffic(self, bed, before, after):
        return {h.name: after[h.name]["sent"] - before[h.name]["sent"] for h in bed.hosts}

    def run(self, name, mode, extra, target):
        bed, log_dir = self.bed(name)
        try:
            bed.up(log_dir)
            return self.ddp(bed, log_dir) if mode == "ddp" else self.mesh(bed, log_dir, mode, extra, target)
        finally:
            bed.down()

    def ddp(self, bed, log_dir):
        a = self.a
        master = f"{bed.hosts[1].addr(bed.subnet)}:{DDP_PORT}"
        before = bed.counters()
        procs = []
        for r in range(a.learners):
            # Gloo would take the address the host name resolves to (loopback): the access link instead.
            cmd = ["env", "-u", "OPENBLAS_L2_SIZE", f"GLOO_SOCKET_IFNAME={tb.HOST_IF}",
                   *[f"{k}={v}" for k, v in torch_settings().items()],
                   PYTHON, os.path.abspath(__file__), "_ddp-rank", "--rank", str(r), "--world", str(a.learners),
                   "--master", master, "--steps", str(a.target_steps), "--eval-every", str(a.eval_every),
                   "--seed", str(a.seed), "--timeout", str(a.dp_seconds), "--"] + knobs_of(a)
            procs.append(bed.spawn(bed.hosts[1 + r].ns, cmd, os.path.join(log_dir, f"rank-{r}.log")))
        deadline = time.time() + a.dp_seconds
        while any(p.poll() is None for p in procs):
            if time.time() > deadline:
                raise tb.TestbedError(f"DDP did not finish within --dp-seconds {a.dp_seconds:.0f} s; logs in {log_dir}")
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                raise tb.TestbedError(f"DDP rank {failed[0]} exited with {procs[failed[0]].returncode}; "
                                      f"its log: {os.path.join(log_dir, f'rank-{failed[0]}.log')}")
            time.sleep(0.2)
        r = tb.last_json(os.path.join(log_dir, "rank-0.log"))
        if not r:
            raise tb.TestbedError(f"DDP rank 0 printed no result; its log: {os.path.join(log_dir, 'rank-0.log')}")
        curve = [(s, step * r["tokens_per_step"], loss) for s, step, loss in r["curve"]]
        return {"curve": curve, "bytes": self.traffic(bed, before, bed.counters()), "train_s": r["train_s"],
                "step_ms_median": r["step_ms_median"], "steps_per_learner": r["steps"], "torch": r["torch"]}

    def mesh(self, bed, log_dir, mode, extra, target):
        a = self.a
        stop_steps = math.ceil(a.dp_stop * a.target_steps) if mode == "dp" else None
        args = argparse.Namespace(shards=1, learners=a.learners, steps=a.schedule_steps, mode=mode, curve=True,
                                  binary=a.binary, timeout=a.dp_seconds + 60,
                                  duration=a.dp_seconds if mode == "dp" else a.mode_seconds,
                                  set=knobs_of(a) + extra + ["storage.keep_last=1000000"])

        def learner_steps():
            h = bed.hosts[1]
            out = subprocess.run(["ip", "netns", "exec", h.ns, "curl", "-s", "-m", "2",
                                  f"http://{h.addr(bed.subnet)}:{METRICS_PORT}/metrics"],
                                 capture_output=True, text=True, timeout=10)
            m = re.search(r"^archipelago_learner_steps_total(?:\{[^}]*\})? ([0-9.e+]+)$", out.stdout, re.M)
            return float(m.group(1)) if m else 0.0
        should_stop = (lambda t0: learner_steps() >= stop_steps) if stop_steps else None
        before = bed.counters()
        failure, reports, _, train_s, t0 = tb.run_mesh(bed, args, log_dir, ["--metrics-port", str(METRICS_PORT)],
                                                       should_stop)
        sent = self.traffic(bed, before, bed.counters())
        if failure:
            raise tb.TestbedError(f"{mode}: {failure}")
        # A dp version is one step of every learner; a decoupled one a fragment's merge (the
        # shard's store does not keep the ledger: no token count for those).
        first = reports.get("learner-0") or {}
        step_tokens = a.learners * first.get("tokens", 0) // max(1, first.get("steps", 0))
        curve = evaluate_versions(a.binary, os.path.join(log_dir, "shard-0.db"), t0, target,
                                  (lambda v: v * step_tokens) if mode == "dp" else (lambda v: None))
        steps = [(reports.get(f"learner-{i}") or {}).get("steps", 0) for i in range(a.learners)]
        return {"curve": curve, "bytes": sent, "train_s": round(train_s, 2), "steps_per_learner": max(steps)}


def evaluate_versions(binary, db, t0, target, tokens_of, grid=16):
    """(seconds since t0, tokens_of(version), eval loss) of the versions evaluated: a grid over
    the stored versions, then bisection between the last grid point above the target and the
    first at or below it, so that the curve holds the first version found at or below it."""
    def replay(*args):
        out = subprocess.run([binary, "replay", "--db", db, *args, "--json"], capture_output=True, text=True,
                             timeout=300)
        r = tb.last_json_text(out.stdout)
        if out.returncode != 0 or not r:
            raise tb.TestbedError(f"replay {' '.join(args)} on {db}: {out.stderr.strip()[-300:]}")
        return r
    rows = sorted(replay("list")["rows"], key=lambda r: r["version"])
    if not rows:
        raise tb.TestbedError(f"the shard's store {db} holds no version")
    losses = {}

    def evaluate(indices):
        todo = [i for i in indices if i not in losses]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for i, r in zip(todo, pool.map(lambda i: replay("eval", str(rows[i]["version"])), todo)):
                losses[i] = r["eval_loss"]
    n = len(rows)
    evaluate(sorted({round(k * (n - 1) / (grid - 1)) for k in range(grid)}))
    hits = [i for i in sorted(losses) if losses[i] <= target]
    if hits:
        lo = max([i for i in losses if i < hits[0]], default=None)
        hi = hits[0]
        while lo is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            evaluate([mid])
            if losses[mid] <= target:
                hi = mid
            else:
                lo = mid
    return [(max(0.0, round(rows[i]["time_ns"] / 1e9 - t0, 3)), tokens_of(rows[i]["version"]), losses[i])
            for i in sorted(losses)]


def first_at_or_below(curve, target):
    return next(((s, tok, loss) for s, tok, loss in curve if loss <= target), None)


def plot(path, results, target):
    """Eval loss against seconds (log scale), one polyline per mode, the target dashed."""
    W, H, L, R, T, B = 720, 420, 70, 150, 20, 50
    pts = [(max(s, 0.5), loss) for r in results.values() for s, _, loss in r["curve"]]
    x0, x1 = math.log10(min(p[0] for p in pts)), math.log10(max(p[0] for p in pts))
    y0, y1 = min(min(p[1] for p in pts), target), max(p[1] for p in pts)
    x1, y1 = max(x1, x0 + 1e-9), max(y1, y0 + 1e-9)
    X = lambda s: L + (math.log10(max(s, 0.5)) - x0) / (x1 - x0) * (W - L - R)  # noqa: E731
    Y = lambda v: T + (y1 - v) / (y1 - y0) * (H - T - B)  # noqa: E731
    colors = {"ddp": "#d62728", "dp": "#ff7f0e", "diloco": "#2ca02c", "streaming": "#9467bd", "decoupled": "#1f77b4"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{Y(target):.1f}" x2="{W - R}" y2="{Y(target):.1f}" stroke="#444" stroke-dasharray="4 3"/>',
           f'<text x="{W - R + 4}" y="{Y(target) + 4:.1f}">target {target:.4f}</text>']
    for k in range(math.floor(x0), math.ceil(x1) + 1):
        for m in (1, 2, 5):
            s = m * 10 ** k
            if x0 <= math.log10(s) <= x1:
                out.append(f'<line x1="{X(s):.1f}" y1="{H - B}" x2="{X(s):.1f}" y2="{H - B + 4}" stroke="black"/>'
                           f'<text x="{X(s):.1f}" y="{H - B + 16}" text-anchor="middle">{s:g}</text>')
    for k in range(6):
        v = y0 + k * (y1 - y0) / 5
        out.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    out += [f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
            f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
            f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">seconds of training (log scale)</text>',
            f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" '
            f'text-anchor="middle">eval loss (nats/byte)</text>']
    others = ["#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
    for i, (name, r) in enumerate(results.items()):
        c = colors.get(name) or others[i % len(others)]
        line = " ".join(f"{X(s):.1f},{Y(loss):.1f}" for s, _, loss in r["curve"])
        out.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="1.8"/>')
        out.append(f'<text x="{W - R + 4}" y="{T + 40 + 16 * i}" fill="{c}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if len(sys.argv) > 1 and sys.argv[1] == "_ddp-rank":
        p = argparse.ArgumentParser()
        for flag, kind in (("--rank", int), ("--world", int), ("--master", str), ("--steps", int),
                           ("--eval-every", int), ("--seed", int), ("--timeout", float)):
            p.add_argument(flag, type=kind, required=True)
        p.add_argument("knobs", nargs="*")
        return ddp_rank(p.parse_args(sys.argv[2:]))
    ap.add_argument("--learners", type=int, default=2, help="learners (DDP ranks), one host each (default 2)")
    ap.add_argument("--modes", default="ddp,dp,decoupled",
                    help=f"comma-separated, from {','.join(MODES)}; ddp sets the target and comes first "
                         "(unless --target)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=MODE,KEY=VALUE,...",
                    help="one more race of an archipelago mode with knobs of its own, e.g. "
                         "lr9e-3=decoupled,optimizer.lr=0.009 (repeatable)")
    ap.add_argument("--target", type=float, help="the eval loss to race to, instead of DDP's (e.g. an earlier race's)")
    ap.add_argument("--target-steps", type=int, default=250, help="DDP's steps: its loss there is the target")
    ap.add_argument("--schedule-steps", type=int, default=800, help="the schedule every mode runs (train.steps)")
    ap.add_argument("--batch", type=int, default=32, help="data.batch: sequences per learner step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", help="data.corpus (default: the built-in synthetic corpus)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a knob for every mode")
    ap.add_argument("--eval-every", type=int, default=10, help="DDP's steps between evaluations")
    ap.add_argument("--dp-stop", type=float, default=1.3, help="dp stops after this many times --target-steps")
    ap.add_argument("--dp-seconds", type=float, default=1800, help="bound on DDP's and dp's races")
    ap.add_argument("--mode-seconds", type=float, default=120, help="how long diloco, streaming, decoupled race")
    ap.add_argument("--compute-steps", type=int, default=60, help="dp steps that measure a step's compute time")
    ap.add_argument("--ref-gbit", type=float, default=5.0, help="the reference WAN link (2-5 in the paper)")
    ap.add_argument("--ref-params", type=float, default=12e9)
    ap.add_argument("--ref-bytes-per-param", type=float, default=2)
    ap.add_argument("--ref-tokens", type=float, default=1048576, help="the reference's tokens per step")
    ap.add_argument("--ref-chips", type=float, default=256)
    ap.add_argument("--ref-chip-tflops", type=float, default=200)
    ap.add_argument("--ref-latency-ms", type=float, default=20, help="the reference's one-way latency")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--subnet", default="10.214")
    ap.add_argument("--prefix", default="archrace")
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "archipelago"))
    ap.add_argument("--logs", help="directory for every race's logs and stores (default: a new temporary one)")
    ap.add_argument("--plot", metavar="FILE.svg")
    ap.add_argument("--json", action="store_true", help="print a one-line JSON summary last")
    a = ap.parse_args()
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if any(m not in MODES for m in a.modes) or len(set(a.modes)) != len(a.modes):
        ap.error(f"--modes {','.join(a.modes)}: distinct modes from {','.join(MODES)}")
    races = [(m, m, []) for m in a.modes]  # (name, mode, its own knobs)
    for v in a.variant:
        name, _, rest = v.partition("=")
        mode, *extra = rest.split(",")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or mode not in MODES[1:] or name in [r[0] for r in races] or \
                not all("=" in k for k in extra):
            ap.error(f"--variant {v!r}: NAME=MODE,KEY=VALUE,... with a new NAME and MODE one of {','.join(MODES[1:])}")
        races.append((name, mode, extra))
    if a.target is None and (not races or races[0][1] != "ddp"):
        ap.error("without --target, ddp must race first: its final loss is the target")
    positive = ("ref_gbit", "ref_params", "ref_bytes_per_param", "ref_tokens", "ref_chips", "ref_chip_tflops",
                "dp_seconds", "mode_seconds")
    bad = [k for k in positive if not getattr(a, k) > 0] + (["ref_latency_ms"] if a.ref_latency_ms < 0 else []) + \
        (["dp_stop"] if a.dp_stop < 1 else []) + (["compute_steps"] if a.compute_steps < 5 else [])
    if bad:
        ap.error(f"--{bad[0].replace('_', '-')} {getattr(a, bad[0])}: out of range (positive; --dp-stop >= 1, "
                 f"--compute-steps >= 5)")
    if not 1280 <= a.mtu <= 65000:
        ap.error(f"--mtu {a.mtu}: 1280-65000")
    if a.learners < 2 or a.target_steps < 1 or a.schedule_steps < a.target_steps or a.eval_every < 1:
        ap.error("--learners >= 2, --target-steps >= 1, --schedule-steps >= --target-steps, --eval-every >= 1")
    if os.geteuid() != 0:
        ap.error("network namespaces need root (run as root, or with sudo)")
    a.relay = os.path.join(os.path.dirname(os.path.abspath(a.binary)), "archipelago_wan_relay")
    for exe in (a.binary, a.relay):
        if not os.access(exe, os.X_OK):
            ap.error(f"{exe} is not an executable (build first, or pass --binary)")

    def on_signal(sig, _):
        raise tb.Interrupted()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    work = a.logs or tempfile.mkdtemp(prefix="wan-race-")
    os.makedirs(work, exist_ok=True)
    knobs = knobs_of(a)
    summary = {"command": "wan_race", "races": [r[0] for r in races], "learners": a.learners, "logs": work, "failure": None}
    try:
        params = params_of(knobs)
        step_s = measure_compute(a, knobs, work)
        ratio, ref_compute_s = reference_ratio(a)
        cap_mbit = params * 4 * 8 / (ratio * step_s) / 1e6
        one_way_ms = a.ref_latency_ms * step_s / ref_compute_s
        print(f"dp's step without a cap: {1e3 * step_s:.1f} ms ({a.learners} learners x 1 thread, batch {a.batch}); "
              f"{params:,} parameters = {4 * params / 1e3:.1f} kB per direction per step", flush=True)
        print(f"the {a.ref_gbit:g} Gbit/s reference: a step's transfer is {ratio:.1f} x its compute -> every learner "
              f"host {cap_mbit:.3f} Mbit/s, the broker host {a.learners * cap_mbit:.3f} Mbit/s, one-way "
              f"{one_way_ms:.2f} ms between hosts", flush=True)
        summary.update({"params": params, "compute_step_ms": round(1e3 * step_s, 2), "ratio": round(ratio, 2),
                        "cap_mbit": round(cap_mbit, 4), "one_way_ms": round(one_way_ms, 3),
                        "ref_gbit": a.ref_gbit, "target_steps": a.target_steps, "schedule_steps": a.schedule_steps})
        race = Race(a, cap_mbit, one_way_ms / 2, work)  # a delay per access link: two links between hosts
        results, target = {}, a.target
        for name, mode, extra in races:
            t = time.time()
            r = race.run(name, mode, extra, target)
            if mode == "ddp" and a.target is None:
                target = r["curve"][-1][2]
                print(f"target: eval loss {target:.4f}, DDP's after {a.target_steps} steps", flush=True)
            summary["target"] = target
            hit = first_at_or_below(r["curve"], target)
            r["time_to_target_s"], r["tokens_to_target"] = (hit[0], hit[1]) if hit else (None, None)
            r["final_loss"] = r["curve"][-1][2]
            r["bytes_total"] = sum(r["bytes"].values())
            r["race_wall_s"] = round(time.time() - t, 1)
            r.update({"mode": mode, "knobs": extra})
            results[name] = r
            where = f"{hit[0]:.1f} s" + (f", {hit[1]:,} tokens" if hit[1] is not None else "") if hit else \
                f"not reached (best {min(c[2] for c in r['curve']):.4f})"
            print(f"{name}: to the target {where}; {r['bytes_total'] / 1e6:.1f} MB on the links; "
                  f"race {r['race_wall_s']:.0f} s", flush=True)
        baselines = [b for b in ("ddp", "dp") if results.get(b, {}).get("time_to_target_s")]
        print("\n| race | time to target | tokens to target | steps per learner (run) | bytes on the links | "
              "final loss | " + " | ".join(f"x faster than {b}" for b in baselines) + " |\n|---|---|---|---|---|---|" +
              "---|" * len(baselines))
        for name, r in results.items():
            s = r["time_to_target_s"]
            r["faster_than"] = {b: round(results[b]["time_to_target_s"] / s, 2) for b in baselines if s}
            tokens = f"{r['tokens_to_target']:,}" if r["tokens_to_target"] is not None else "-"
            reached = f"{s:.1f} s | {tokens}" if s is not None else "not reached | -"
            print(f"| {name} | {reached} | {r['steps_per_learner']} | {r['bytes_total'] / 1e6:.1f} MB | "
                  f"{r['final_loss']:.4f} | " + " | ".join(f"{r['faster_than'][b]:.1f}x" if b in r["faster_than"]
                                                            else "-" for b in baselines) + " |")
        summary["results"] = results
        if a.plot:
            plot(a.plot, results, target)
    except tb.Interrupted:
        summary["failure"] = "interrupted"
    except (tb.TestbedError, subprocess.SubprocessError, OSError) as e:
        summary["failure"] = str(e)
    if summary["failure"]:
        print(f"wan_race: {summary['failure']}", file=sys.stderr)
    if a.json:
        print(json.dumps(summary, separators=(",", ":")))
    return 1 if summary["failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
