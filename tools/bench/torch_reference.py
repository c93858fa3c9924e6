#!/usr/bin/python3
"""PyTorch reference trainer for archipelago's byte-level GPT (benchmark baseline only).

Trains the same architecture as the C++/Eigen engine with the same batch shape and thread
count, and reports per-step wall time. It is not part of the test suite.

Run it with the system interpreter (Debian's python3-torch 1.13):

    /usr/bin/python3 tools/bench/torch_reference.py --model nano --threads 2 --json

BLAS tuning must be set by the caller, in the environment, because OpenBLAS reads it when it
is loaded (see docs/design/baselines.md §1). The best tuning found on the 2-vCPU
machines is the OpenMP build of OpenBLAS (libopenblas0-openmp) with the core type forced, plus
--mallopt (keeps freed activation memory in the process instead of page-faulting it back in
every step):

    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp OPENBLAS_CORETYPE=SkylakeX \
        /usr/bin/python3 tools/bench/torch_reference.py --model micro --threads 2 --mallopt --json

Avoid the pthread OpenBLAS with 2 threads (its pool spins against torch's OpenMP pool) and
OPENBLAS_CORETYPE=Haswell (AVX2 kernels, about half the AVX-512 speed). With the pthread build,
OPENBLAS_NUM_THREADS=1 is as good for nano but makes every GEMM single-threaded, which costs
about 25-40% on micro. The script reports which BLAS library it actually loaded (core type,
threading, threads) and the relevant environment, and "cpu_util" (process CPU time / wall
time), which drops below --threads when another process took CPU time during the run.

Architecture (identical to the C++ engine):
  x = wte[tok] + wpe[pos]; n_layer pre-LN blocks:
    a = LN1(x); qkv = a @ Wqkv + bqkv (Wqkv [C,3C]: q | k | v, head h = columns h*hd..)
    y = causal softmax(q k^T / sqrt(hd)) v per head, heads concatenated
    x = x + y @ Wo + bo
    x = x + GELU_tanh(LN2(x) @ W1 + b1) @ W2 + b2
  logits = LNf(x) @ wte^T (tied) or @ lm_head [C,256] (--untied); loss = mean CE over B*T.
  AdamW lr 3e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1 on Wqkv/Wo/W1/W2 only (and lm_head is
  not decayed either), global-norm clipping to 1.0 every step.

FLOP count ("gflops" in the output): exact matmul FLOPs of one training step, counting a
multiply-add as 2 FLOPs and backward as 2x forward (so 3x forward in total):
  forward per token = n_layer * (2*C*3C + 2*C*C + 2*C*4C + 2*4C*C     # qkv, Wo, W1, W2
                                 + 2*T*C + 2*T*C)                        # QK^T, PV (dense T x T)
                      + 2*C*256                                           # unembedding
  step FLOPs = 3 * B * T * forward-per-token
The attention terms count the full T x T product that dense batched matmuls execute (the
causal half is masked, not skipped). "gflops_6n" (6 * non-embedding params * tokens) and
"gflops_causal" (attention terms halved) are reported alongside for comparison.
"""

import argparse
import ctypes
import json
import math
import os
import re
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

VOCAB = 256

PRESETS = {
    #          T    C   L  H   expected params (tied)
    "nano": (64, 64, 2, 4, 120_576),
    "micro": (128, 160, 3, 5, 989_600),
    "mini": (128, 384, 6, 6, 10_795_008),
    "small": (256, 640, 10, 10, 49_564_160),
}


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self, C, H, n_layer, gen):
        super().__init__()
        self.C, self.H, self.hd = C, H, C // H
        proj_std = 0.02 / math.sqrt(2 * n_layer)

        def mat(rows, cols, std):
            return torch.nn.Parameter(torch.empty(rows, cols).normal_(0.0, std, generator=gen))

        def vec(n, value):
            return torch.nn.Parameter(torch.full((n,), float(value)))

        self.ln1_g, self.ln1_b = vec(C, 1.0), vec(C, 0.0)
        self.w_qkv, self.b_qkv = mat(C, 3 * C, 0.02), vec(3 * C, 0.0)
        self.w_o, self.b_o = mat(C, C, proj_std), vec(C, 0.0)
        self.ln2_g, self.ln2_b = vec(C, 1.0), vec(C, 0.0)
        self.w_1, self.b_1 = mat(C, 4 * C, 0.02), vec(4 * C, 0.0)
        self.w_2, self.b_2 = mat(4 * C, C, proj_std), vec(C, 0.0)

    def matrices(self):
        return [self.w_qkv, self.w_o, self.w_1, self.w_2]

    def forward(self, x, mask):
        # x: [B*T, C] (flattened), mask: [T, T] additive causal mask (0 / -inf)
        BT, C = x.shape
        T = mask.shape[0]
        B, H, hd = BT // T, self.H, self.hd

        a = F.layer_norm(x, (C,), self.ln1_g, self.ln1_b, 1e-5)
        qkv = torch.addmm(self.b_qkv, a, self.w_qkv)  # [B*T, 3C]
        # [B, T, 3, H, hd] -> [3, B, H, T, hd]; q = cols 0..C, k = C..2C, v = 2C..3C
        qkv = qkv.view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
        q = qkv[0].reshape(B * H, T, hd)
        k = qkv[1].reshape(B * H, T, hd)
        v = qkv[2].reshape(B * H, T, hd)
        # scores = mask + scale * q @ k^T in one fused call
        att = torch.baddbmm(mask, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(hd))
        att = torch.softmax(att, dim=-1)
        y = torch.bmm(att, v)  # [B*H, T, hd]
        y = y.view(B, H, T, hd).transpose(1, 2).reshape(BT, C)  # heads concatenated
        x = x + torch.addmm(self.b_o, y, self.w_o)

        m = F.layer_norm(x, (C,), self.ln2_g, self.ln2_b, 1e-5)
        h = F.gelu(torch.addmm(self.b_1, m, self.w_1), approximate="tanh")
        x = x + torch.addmm(self.b_2, h, self.w_2)
        return x


class GPT(torch.nn.Module):
    def __init__(self, T, C, L, H, untied, seed):
        super().__init__()
        if C % H != 0:
            raise ValueError(f"d_model {C} is not divisible by n_head {H}")
        gen = torch.Generator().manual_seed(seed)
        self.T, self.C = T, C
        self.wte = torch.nn.Parameter(torch.empty(VOCAB, C).normal_(0.0, 0.02, generator=gen))
        self.wpe = torch.nn.Parameter(torch.empty(T, C).normal_(0.0, 0.02, generator=gen))
        self.blocks = torch.nn.ModuleList([Block(C, H, L, gen) for _ in range(L)])
        self.lnf_g = torch.nn.Parameter(torch.ones(C))
        self.lnf_b = torch.nn.Parameter(torch.zeros(C))
        if untied:
            self.lm_head = torch.nn.Parameter(
                torch.empty(C, VOCAB).normal_(0.0, 0.02, generator=gen))
        else:
            self.lm_head = None
        mask = torch.full((T, T), float("-inf")).triu_(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        C = self.C
        x = (F.embedding(tokens, self.wte) + self.wpe[:T]).view(B * T, C)
        mask = self.mask if T == self.T else self.mask[:T, :T].contiguous()
        for blk in self.blocks:
            x = blk(x, mask)
        x = F.layer_norm(x, (C,), self.lnf_g, self.lnf_b, 1e-5)
        if self.lm_head is None:
            logits = torch.mm(x, self.wte.t())
        else:
            logits = torch.mm(x, self.lm_head)
        return F.cross_entropy(logits, targets.reshape(-1))

    def param_groups(self, weight_decay):
        decay = [m for blk in self.blocks for m in blk.matrices()]
        decay_ids = {id(p) for p in decay}
        no_decay = [p for p in self.parameters() if id(p) not in decay_ids]
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]


def expected_params(T, C, L, untied):
    per_layer = 12 * C * C + 13 * C  # Wqkv+bqkv, Wo+bo, W1+b1, W2+b2, 2 LayerNorms
    n = VOCAB * C + T * C + L * per_layer + 2 * C
    if untied:
        n += C * VOCAB
    return n


def matmul_flops_per_token(T, C, L):
    """Forward matmul FLOPs per token (dense attention), and the attention part alone."""
    dense = 2 * C * 3 * C + 2 * C * C + 2 * C * 4 * C + 2 * 4 * C * C
    attn = 2 * T * C + 2 * T * C
    return L * (dense + attn) + 2 * C * VOCAB, L * attn


# --------------------------------------------------------------------------------------------
# Optimizer step helpers
# --------------------------------------------------------------------------------------------


def clip_grad_norm_foreach_(params, max_norm):
    """Global-norm clipping with torch._foreach ops (torch 1.13's clip_grad_norm_ has no
    foreach path). Same semantics as torch.nn.utils.clip_grad_norm_."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch._foreach_norm(grads)
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coef.item())
    return total


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def make_corpus(kind, n_bytes, seed, path=None):
    """A 1-D uint8 tensor to draw windows from. 'markov': a seeded order-1 chain where each byte
    has 4 possible successors (learnable, entropy ln 4 = 1.386 nats), so the loss visibly falls;
    'random': i.i.d. uniform bytes (loss stays near ln 256 = 5.545)."""
    gen = torch.Generator().manual_seed(seed + 1)
    if path:
        with open(path, "rb") as f:
            data = f.read()
        if len(data) < 2:
            raise SystemExit(f"error: data file {path} is too small")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    if kind == "random":
        return torch.randint(0, VOCAB, (n_bytes,), generator=gen)
    succ = torch.randint(0, VOCAB, (VOCAB, 4), generator=gen)
    choice = torch.randint(0, 4, (n_bytes,), generator=gen).tolist()
    table = succ.tolist()
    out = [0] * n_bytes
    b = int(torch.randint(0, VOCAB, (1,), generator=gen))
    for i in range(n_bytes):
        out[i] = b
        b = table[b][choice[i]]
    return torch.tensor(out, dtype=torch.long)


class Batcher:
    def __init__(self, corpus, B, T, seed):
        self.corpus, self.B, self.T = corpus, B, T
        self.gen = torch.Generator().manual_seed(seed + 2)
        if corpus.numel() < T + 2:
            raise SystemExit("error: corpus shorter than context + 1")
        self.offsets = torch.arange(T + 1)

    def next(self):
        starts = torch.randint(0, self.corpus.numel() - self.T - 1, (self.B, 1), generator=self.gen)
        win = self.corpus[starts + self.offsets]  # [B, T+1]
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def tune_malloc():
    """Stop glibc malloc from returning freed tensor memory to the kernel after every step.

    By default glibc serves large blocks with mmap and trims the heap top, so each step's
    activations come back as fresh pages: thousands of minor page faults per step (about 10 k
    for micro at batch 32, tens of ms of system time on these VMs). mallopt works at run
    time, so unlike the BLAS settings this can be done from inside the process. Equivalent to
    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=2147483647 MALLOC_TOP_PAD_=268435456.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    ok = libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # the largest value glibc accepts (64-bit)
    ok &= libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    ok &= libc.mallopt(M_TOP_PAD, 256 << 20)
    return bool(ok)


# --------------------------------------------------------------------------------------------
# BLAS reporting
# --------------------------------------------------------------------------------------------


def blas_info():
    """Which BLAS torch's matmuls actually use: torch's build info, the BLAS/OpenBLAS shared
    objects mapped into this process, and OpenBLAS's own answers (core, threading, threads)."""
    cfg = torch.__config__.show()
    found = re.search(r"BLAS_INFO=([^,\s]+)", cfg)
    build = f"BLAS_INFO={found.group(1)}" if found else "BLAS_INFO=?"
    libs = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6:
                    p = fields[5]
                    name = os.path.basename(p)
                    if ("blas" in name or "openblas" in p) and p not in libs:
                        libs.append(p)
    except OSError:
        pass
    info = {"build": build, "libs": libs}
    ob = None
    for p in libs:
        try:
            lib = ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
            lib.openblas_get_config  # noqa: B018  (raises AttributeError if absent)
            ob = lib
            break
        except (OSError, AttributeError):
            continue
    if ob is not None:
        ob.openblas_get_config.restype = ctypes.c_char_p
        ob.openblas_get_corename.restype = ctypes.c_char_p
        info["openblas_config"] = ob.openblas_get_config().decode(errors="replace").strip()
        info["openblas_core"] = ob.openblas_get_corename().decode(errors="replace")
        par = ob.openblas_get_parallel()
        info["openblas_parallel"] = {0: "sequential", 1: "pthread", 2: "openmp"}.get(par, str(par))
        info["openblas_threads"] = ob.openblas_get_num_threads()
    keys = ["OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "LD_LIBRARY_PATH"]
    keys += sorted(k for k in os.environ
                   if k.startswith(("OPENBLAS_", "OMP_", "GOMP_", "MALLOC_", "GLIBC_TUNABLES",
                                    "LD_PRELOAD"))
                   and k not in keys)
    env = {k: os.environ.get(k) for k in keys}
    info["env"] = env
    if ob is not None:
        short = (f"OpenBLAS {info['openblas_parallel']} core={info['openblas_core']} "
                 f"threads={info['openblas_threads']}")
    else:
        short = f"{build} libs={','.join(os.path.basename(p) for p in libs) or 'none'}"
    short += (f" | OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE'] or '-'}"
              f" OPENBLAS_NUM_THREADS={env['OPENBLAS_NUM_THREADS'] or '-'}"
              f" LD_LIBRARY_PATH={env['LD_LIBRARY_PATH'] or '-'}")
    info["short"] = short
    return info


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(PRESETS), default="nano")
    ap.add_argument("--context", type=int, help="override T")
    ap.add_argument("--d-model", type=int, help="override C")
    ap.add_argument("--n-layer", type=int, help="override L")
    ap.add_argument("--n-head", type=int, help="override H")
    ap.add_argument("--untied", action="store_true", help="separate lm_head [C, 256]")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--data", choices=["markov", "random"], default="markov",
                    help="synthetic bytes: learnable order-1 chain (default) or uniform")
    ap.add_argument("--data-file", help="train on windows of this file's bytes instead")
    ap.add_argument("--mallopt", action="store_true",
                    help="keep freed memory in the process (glibc mallopt) to avoid page faults "
                         "every step; off by default (plain PyTorch behaviour)")
    ap.add_argument("--autocast-bf16", action="store_true",
                    help="run forward (and so backward) under torch.autocast('cpu', bfloat16)")
    ap.add_argument("--json", action="store_true", help="print one JSON line (last line)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.threads < 1:
        ap.error("--steps, --batch and --threads must be >= 1 and --warmup >= 0")
    return ap, args


def shape_of(ap, args):
    """(T, C, L, H, overridden): the preset with the command line's overrides."""
    T0, C0, L0, H0, _ = PRESETS[args.model]
    T = args.context or T0
    C = args.d_model or C0
    L = args.n_layer or L0
    H = args.n_head or H0
    if min(T, C, L, H) < 1 or C % H != 0:
        ap.error(f"need positive sizes and d_model divisible by n_head (got C={C}, H={H})")
    return T, C, L, H, (T, C, L, H) != (T0, C0, L0, H0)


def build_model(args, T, C, L, H, overridden):
    """The model and its parameter count, checked against the formula (and the preset's)."""
    model = GPT(T, C, L, H, args.untied, args.seed)
    params = sum(p.numel() for p in model.parameters())
    expected = expected_params(T, C, L, args.untied)
    errors = []
    if params != expected:
        errors.append(f"parameter count {params} != formula {expected}")
    if not overridden:
        want = PRESETS[args.model][4] + (C * VOCAB if args.untied else 0)
        if params != want:
            errors.append(f"preset {args.model}: parameter count {params} != expected {want}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors:
        sys.exit(2)
    return model, params


def train_timed(model, args, B, T):
    """Warm-up and timed steps; (losses, step seconds, CPU use, page faults, load before)."""
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            foreach=True)
    all_params = list(model.parameters())

    corpus = make_corpus(args.data, 1 << 20, args.seed, args.data_file)
    batcher = Batcher(corpus, B, T, args.seed)
    # Pre-draw batches so data preparation is outside the timed region.
    total_steps = args.warmup + args.steps
    batches = [batcher.next() for _ in range(total_steps)]

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        if args.autocast_bf16:
            # Mixed precision as torch does it on CPU: bf16 matmuls (oneDNN), fp32 weights,
            # optimizer state and the ops autocast keeps in fp32 (softmax, LayerNorm, loss).
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        loss.backward()
        clip_grad_norm_foreach_(all_params, 1.0)
        opt.step()
        return loss

    losses, times = [], []
    load_before = os.getloadavg()[0]
    for i in range(total_steps):
        if i == args.warmup:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x, y = batches[i]
        t0 = time.perf_counter()
        loss = step(x, y)
        t1 = time.perf_counter()
        losses.append(loss.item())  # after timing; the loss is already computed at this point
        if i >= args.warmup:
            times.append(t1 - t0)
        if not math.isfinite(losses[-1]):
            print(f"error: non-finite loss at step {i}", file=sys.stderr)
            sys.exit(3)

    cpu_util = ((time.process_time() - cpu0) / (time.perf_counter() - wall0)
                if times else float("nan"))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt0 if times else 0
    return losses, times, cpu_util, faults, load_before


def make_result(args, shape, params, run, mallopt_ok):
    """The JSON summary of a run: shape, step times, FLOP rates, losses, BLAS."""
    T, C, L, H, overridden = shape
    losses, times, cpu_util, faults, load_before = run
    B = args.batch
    params_nonembedding = params - (VOCAB * C + T * C)  # (lm_head counts as non-embedding if untied)
    blas = blas_info()  # after matmuls ran, so the BLAS library is mapped

    tokens_per_step = B * T
    fwd_tok, attn_tok = matmul_flops_per_token(T, C, L)
    step_flops = 3 * tokens_per_step * fwd_tok
    step_flops_causal = 3 * tokens_per_step * (fwd_tok - attn_tok // 2)
    step_flops_6n = 6 * params_nonembedding * tokens_per_step
    med = statistics.median(times) if times else float("nan")
    best = min(times) if times else float("nan")
    gf = lambda flops, t: flops / t / 1e9 if t > 0 else float("nan")  # noqa: E731

    return {
        "model": args.model if not overridden else f"{args.model}*",
        "context": T, "d_model": C, "n_layer": L, "n_head": H, "tied": not args.untied,
        "params": params,
        "params_nonembedding": params_nonembedding,
        "batch": B,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "tokens_per_step": tokens_per_step,
        "warmup": args.warmup,
        "steps": len(times),
        "step_ms_median": round(med * 1e3, 3),
        "step_ms_best": round(best * 1e3, 3),
        "step_ms_all": [round(t * 1e3, 2) for t in times],
        "tokens_per_s": round(tokens_per_step / med, 1),
        "tokens_per_s_best": round(tokens_per_step / best, 1),
        "gflops": round(gf(step_flops, med), 2),
        "gflops_best": round(gf(step_flops, best), 2),
        "gflops_causal": round(gf(step_flops_causal, med), 2),
        "gflops_6n": round(gf(step_flops_6n, med), 2),
        "flops_per_step": step_flops,
        # process CPU time / wall time over the timed steps: about `threads` when the machine
        # is ours (OpenMP threads spin), clearly less when another process took CPU time.
        "cpu_util": round(cpu_util, 2),
        "loadavg_1min_before": round(load_before, 2),
        "mallopt": mallopt_ok,
        "minor_faults_per_step": round(faults / len(times), 1) if times else None,
        "flop_formula": "3*B*T*(L*(24*C^2+4*T*C)+2*C*256) exact matmul fwd+bwd, dense attention",
        "data": "file" if args.data_file else args.data,
        "loss_first": round(losses[0], 4),
        "loss_first_timed": round(losses[args.warmup], 4) if times else None,
        "loss_last": round(losses[-1], 4),
        "loss_decreased": losses[-1] < losses[0],
        "blas": blas["short"] + (" + autocast bf16 (mkldnn %s)" % torch.backends.mkldnn.is_available()
                                 if args.autocast_bf16 else ""),
        "autocast_bf16": bool(args.autocast_bf16),
        "blas_detail": blas,
        "torch_version": torch.__version__,
    }


def print_text(result, args):
    T, C, L, H = result["context"], result["d_model"], result["n_layer"], result["n_head"]
    print(f"model {result['model']}: T={T} C={C} L={L} H={H} "
          f"{'tied' if not args.untied else 'untied'}, {result['params']:,} params "
          f"({result['params_nonembedding']:,} non-embedding)")
    print(f"batch {result['batch']} x {T} = {result['tokens_per_step']} tokens/step, threads "
          f"{result['threads']}, {args.warmup} warm-up + {result['steps']} timed steps")
    print(f"step ms: median {result['step_ms_median']:.2f}, best {result['step_ms_best']:.2f}")
    print(f"tokens/s: median {result['tokens_per_s']:,.0f}, "
          f"best {result['tokens_per_s_best']:,.0f}")
    print(f"GFLOP/s (exact matmul, dense attn): median {result['gflops']:.1f}, "
          f"best {result['gflops_best']:.1f}  [6N: {result['gflops_6n']:.1f}]")
    print(f"loss: first {result['loss_first']:.4f} -> last {result['loss_last']:.4f} "
          f"({'decreased' if result['loss_decreased'] else 'DID NOT DECREASE'}; "
          f"data {result['data']})")
    print(f"CPU use {result['cpu_util']:.2f} cores, {result['minor_faults_per_step']} page "
          f"faults/step, mallopt {'on' if result['mallopt'] else 'off'}")
    print(f"BLAS: {result['blas']}")
    print(f"torch {result['torch_version']}")


def main():
    ap, args = parse_args()
    mallopt_ok = tune_malloc() if args.mallopt else False

    # Threads first: set_num_interop_threads fails once the inter-op pool has started.
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(args.seed)

    shape = shape_of(ap, args)
    model, params = build_model(args, *shape)
    run = train_timed(model, args, args.batch, shape[0])
    result = make_result(args, shape, params, run, mallopt_ok)
    if args.json:
        print(json.dumps(result, separators=(",", ":")))
    else:
        print_text(result, args)


if __name__ == "__main__":
    main()
