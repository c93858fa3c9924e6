#!/usr/bin/python3
"""PyTorch DDP (gloo) reference for archipelago's `dp` mode (benchmark baseline only).

Trains the model of torch_reference.py (the same architecture as the C++ engine, imported from
it, not copied) data-parallel over N ranks on this machine: each rank is a process with its own
threads, ranks meet over gloo on 127.0.0.1, and DistributedDataParallel all-reduces (averages)
the gradients of every step; each rank then runs the same AdamW, clipping included. With
--ranks 2 --batch 32 the global batch is 64 sequences, as `archipelago run --mode dp
--learners 2` with data.batch 32.

Reported per step (median over the timed steps, after --warmup untimed ones): wall time, and
the bytes this rank's TCP sockets sent, measured from the kernel's per-socket counters
(`ss -ti`, bytes_sent) before and after the timed steps. For comparison the script also prints
the gradient buffer (params x 4 bytes) and what a ring all-reduce sends per rank,
2 (n-1)/n x buffer.

Run it with the system interpreter (Debian's python3-torch); BLAS tuning goes in the
environment (docs/design/baselines.md §1):

    OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=SkylakeX \\
        /usr/bin/python3 tools/bench/ddp_reference.py --ranks 2 --threads 1 --json

The last stdout line is one JSON object (--json). `archipelago bench ddp` runs this script
between runs of its own dp mode and reports the ratios.
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402  (the model, data and malloc tuning)


def socket_bytes_sent(pid):
    """Sum of bytes_sent over the TCP sockets of process `pid` (ss -tinp): the bytes the kernel
    took from this process's sockets, headers excluded. None if ss is unavailable."""
    try:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total, mine = 0, False
    # ss prints each socket on one line and its TCP info on the next (indented).
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            mine = f"pid={pid}," in line
            continue
        if mine:
            m = re.search(r"bytes_sent:(\d+)", line)
            if m:
                total += int(m.group(1))
    return total


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.mallopt:
        ref.tune_malloc()
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.ranks)
    T, C, L, H, _ = ref.PRESETS[args.model]
    model = ref.GPT(T, C, L, H, False, args.seed)  # same seed: every rank starts equal
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                            foreach=True)
    all_params = list(model.parameters())
    corpus = ref.make_corpus("markov", 1 << 20, args.seed)
    batcher = ref.Batcher(corpus, args.batch, T, args.seed + 1000 * args.rank)  # own data
    total = args.warmup + args.steps
    batches = [batcher.next() for _ in range(total)]

    times, losses = [], []
    sent0 = None
    dist.barrier()
    for i in range(total):
        if i == args.warmup:
            dist.barrier()
            sent0 = socket_bytes_sent(os.getpid())
            wall0 = time.perf_counter()
        x, y = batches[i]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ddp(x, y)
        loss.backward()  # DDP all-reduces the gradients here, bucket by bucket
        ref.clip_grad_norm_foreach_(all_params, 1.0)
        opt.step()
        t1 = time.perf_counter()
        losses.append(loss.item())
        if i >= args.warmup:
            times.append(t1 - t0)
    wall = time.perf_counter() - wall0
    sent1 = socket_bytes_sent(os.getpid())
    dist.barrier()
    # Every rank's figures to rank 0.
    mine = torch.tensor([statistics.median(times), wall / len(times),
                         float((sent1 - sent0) if sent0 is not None and sent1 is not None else -1)],
                        dtype=torch.float64)
    gathered = [torch.zeros(3, dtype=torch.float64) for _ in range(args.ranks)]
    dist.all_gather(gathered, mine)
    dist.destroy_process_group()
    if args.rank != 0:
        return
    n = args.ranks
    buffer_bytes = params * 4
    sent = [g[2].item() / len(times) for g in gathered]
    result = {
        "command": "ddp_reference",
        "model": args.model,
        "params": params,
        "ranks": n,
        "threads_per_rank": args.threads,
        "batch_per_rank": args.batch,
        "global_batch": n * args.batch,
        "tokens_per_step": n * args.batch * T,
        "steps": len(times),
        "warmup": args.warmup,
        "step_ms_median": round(max(g[0].item() for g in gathered) * 1e3, 3),
        "step_ms_mean_wall": round(max(g[1].item() for g in gathered) * 1e3, 3),
        "step_ms_median_per_rank": [round(g[0].item() * 1e3, 3) for g in gathered],
        "bytes_sent_per_step_per_rank": [round(s) for s in sent],
        "bytes_sent_per_step": round(sum(sent)) if all(s >= 0 for s in sent) else None,
        "gradient_bytes": buffer_bytes,
        "ring_bytes_per_step_per_rank": round(2 * (n - 1) / n * buffer_bytes),
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "bucket_mb": args.bucket_mb,
        "torch_version": torch.__version__,
        "blas": ref.blas_info()["short"],
    }
    if args.json:
        print(json.dumps(result, separators=(",", ":")))
    else:
        print(f"DDP gloo {n} ranks x {args.threads} thread(s), batch {args.batch}/rank, model "
              f"{args.model} ({params:,} params)")
        print(f"step {result['step_ms_median']:.2f} ms median (slowest rank) over {len(times)} steps")
        print(f"bytes sent per step per rank {result['bytes_sent_per_step_per_rank']} "
              f"(ring all-reduce of {buffer_bytes:,} gradient bytes: "
              f"{result['ring_bytes_per_step_per_rank']:,})")
        print(f"loss {result['loss_first']:.4f} -> {result['loss_last']:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(ref.PRESETS), default="nano")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    ap.add_argument("--batch", type=int, default=32, help="sequences per step per rank")
    ap.add_argument("--steps", type=int, default=40, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size (its default)")
    ap.add_argument("--mallopt", action="store_true", help="keep freed memory in the process")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before the ranks are killed")
    ap.add_argument("--json", action="store_true", help="print one JSON line (last line)")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ranks < 1 or args.threads < 1 or args.batch < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--ranks, --threads, --batch and --steps must be >= 1 and --warmup >= 0")

    if args.rank is not None:
        run_rank(args)
        return
    # The launcher: one process per rank, rank 0's output is the result.
    port = free_port()
    base = [sys.executable, os.path.abspath(__file__)] + [a for a in sys.argv[1:]]
    procs = []
    for r in range(args.ranks):
        procs.append(subprocess.Popen(base + ["--rank", str(r), "--port", str(port)],
                                      stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL))
    try:
        out, _ = procs[0].communicate(timeout=args.timeout)
        codes = [procs[0].returncode] + [p.wait(timeout=60) for p in procs[1:]]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        print(f"error: the DDP ranks did not finish within {args.timeout} s", file=sys.stderr)
        sys.exit(4)
    sys.stdout.write(out.decode())
    if any(codes):
        print(f"error: a rank failed (exit codes {codes})", file=sys.stderr)
        sys.exit(5)


if __name__ == "__main__":
    main()
