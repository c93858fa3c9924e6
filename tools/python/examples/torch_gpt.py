#!/usr/bin/env python3
"""archipelago's native GPT (actors/learner/model/gpt.cpp) in PyTorch: the same
parameters (names, shapes, order: archipelago.gpt_layout), the same function
(byte embeddings plus learned positions, pre-LayerNorm blocks with causal
multi-head attention and a tanh-GELU MLP, final LayerNorm, logits through the tied
embedding or lm_head, mean cross-entropy in nats/byte) and the native learner's
training (AdamW with decay on matrices only, global-norm clipping, warm-up then
cosine schedule, its batch and step budget: archipelago.training). So a PyTorch
learner trains beside native learners of the same mesh as one of them.

As a program it is one PyTorch learner of a running mesh (what mixed_mesh.py and
`archipelago drill --processes --learner-command` start):

    PYTHONPATH=build/python /usr/bin/python3 tools/python/examples/torch_gpt.py \\
        --config mesh.toml --index 2 --broker tcp://127.0.0.1:7000 --shards tcp://127.0.0.1:7001

It joins, trains until the schedule's train.steps (a restarted learner continues
from the mesh's schedule step, as a native one does), leaves, and prints one JSON
line: {index, incarnation, steps, tokens, contributions, ..., status} (status: the
node status a native learner prints). SIGTERM leaves early as a native learner does;
it takes the arguments of `archipelago node --role learner` (--listen, --set
KEY=VALUE, --metrics-port: Prometheus text and GET /node, as a native learner's).

`torch_gpt.py --check` compares the port with the native GPT (archipelago.
gpt_loss_and_gradients, gpt_train_steps) from the same parameters and batches: one
batch's loss and gradients, then 30 inner steps; one JSON line last.
"""

import argparse
import json
import math
import signal
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import archipelago


class _Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.g = nn.Parameter(torch.ones(c))
        self.b = nn.Parameter(torch.zeros(c))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.g, self.b, 1e-5)


class _Attention(nn.Module):
    """Weights are [in, out] (x @ W), as the native buffer holds them; q, k, v are
    wqkv's column thirds, head h their columns h*hd..(h+1)*hd."""

    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.wqkv = nn.Parameter(torch.zeros(c, 3 * c))
        self.bqkv = nn.Parameter(torch.zeros(3 * c))
        self.wo = nn.Parameter(torch.zeros(c, c))
        self.bo = nn.Parameter(torch.zeros(c))

    def forward(self, x):
        b, t, c = x.shape
        hd = c // self.n_head
        q, k, v = (x @ self.wqkv + self.bqkv).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        return y.transpose(1, 2).reshape(b, t, c) @ self.wo + self.bo


class _Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = nn.Parameter(torch.zeros(c, 4 * c))
        self.b1 = nn.Parameter(torch.zeros(4 * c))
        self.w2 = nn.Parameter(torch.zeros(4 * c, c))
        self.b2 = nn.Parameter(torch.zeros(c))

    def forward(self, x):
        return F.gelu(x @ self.w1 + self.b1, approximate="tanh") @ self.w2 + self.b2


class _Block(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.ln1 = _Norm(c)
        self.attn = _Attention(c, n_head)
        self.ln2 = _Norm(c)
        self.mlp = _Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The GPT of a layout (archipelago.gpt_layout / mesh_layout) with n_head heads
    (archipelago.training(...)["n_head"]). Parameters start as the native init's
    laws (N(0, 0.02), residual projections scaled by 1/sqrt(2L)); a learner's
    adopt() and wait_ready() replace them with the mesh's global model anyway."""

    def __init__(self, layout, n_head):
        super().__init__()
        shapes = {t["name"]: t["shape"] for t in layout["tensors"]}
        self.kinds = {t["name"]: t.get("kind", "matrix") for t in layout["tensors"]}
        self.names = [t["name"] for t in layout["tensors"]]
        vocab, c = shapes["wte"]
        n_layer = sum(1 for n in shapes if n.endswith(".ln1.g"))
        self.wte = nn.Parameter(torch.randn(vocab, c) * 0.02)
        self.wpe = nn.Parameter(torch.randn(shapes["wpe"][0], c) * 0.02)
        for layer in range(n_layer):
            setattr(self, f"h{layer}", _Block(c, n_head))
        self.lnf = _Norm(c)
        self.lm_head = nn.Parameter(torch.randn(c, vocab) * 0.02) if "lm_head" in shapes else None
        for name, p in self.named_parameters():
            if self.kinds[name] == "matrix":
                residual = name.endswith("attn.wo") or name.endswith("mlp.w2")
                nn.init.normal_(p, 0.0, 0.02 / (math.sqrt(2 * n_layer) if residual else 1.0))
        self.blocks = [getattr(self, f"h{layer}") for layer in range(n_layer)]
        mine = [n for n, _ in self.named_parameters()]
        if mine != self.names:
            raise ValueError(f"not the native GPT's layout: {self.names} vs {mine}")

    def named_parameters(self, prefix="", recurse=True, **kw):
        """In layout order (lm_head, a parameter of the root, comes last, as in the layout)."""
        params = dict(super().named_parameters(prefix, recurse, **kw))
        if prefix or set(params) != set(getattr(self, "names", ())):
            return iter(params.items())
        return iter([(n, params[n]) for n in self.names])

    def forward(self, x):
        h = self.wte[x] + self.wpe[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.lnf(h) @ (self.wte.t() if self.lm_head is None else self.lm_head)

    def loss(self, x, y):
        """Mean cross-entropy in nats per byte, as the native forward_backward."""
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def optimizer_for(model, t):
    """AdamW as the native learner's: weight decay on matrices only (embeddings and
    vectors none), the configuration's betas and eps; the rate is set per step."""
    decay = [p for n, p in model.named_parameters() if model.kinds[n] == "matrix"]
    rest = [p for n, p in model.named_parameters() if model.kinds[n] != "matrix"]
    return torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])


def train_step(model, opt, t, step, x, y):
    """One native inner step at schedule step `step`: forward, backward, the global
    gradient norm clipped to clip_norm, AdamW at the scheduled rate. Returns the loss."""
    loss = model.loss(torch.from_numpy(x), torch.from_numpy(y))
    opt.zero_grad(set_to_none=False)
    loss.backward()
    if t["clip_norm"] > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["clip_norm"])
    lr = archipelago.scheduled_lr(t, step)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    return float(loss)


def eval_loss(model, windows, rows=256):
    """The native eval loss (nats/byte) over archipelago.eval_windows(...)."""
    inputs, targets, first = windows
    total, count = 0.0, 0
    with torch.no_grad():
        for r in range(0, len(inputs), rows):
            x, y = torch.from_numpy(inputs[r:r + rows]), torch.from_numpy(targets[r:r + rows])
            logits = model(x).double()
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
            scored = torch.arange(x.shape[1])[None, :] >= torch.from_numpy(first[r:r + rows]).long()[:, None]
            total += float(nll.view(x.shape)[scored].sum())
            count += int(scored.sum())
    return total / count


def run_learner(config, index, broker, shards, knobs, listen="tcp://127.0.0.1:0", metrics_port=-1, join_s=120):
    """One PyTorch learner process: join, train to the schedule's end (or SIGTERM), leave."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append("stopped"))
    t = archipelago.training(config, index, knobs)
    torch.manual_seed(index)
    torch.set_num_threads(t["threads"])
    model = GPT(archipelago.mesh_layout(config, knobs), t["n_head"])
    learner = archipelago.Learner(config, index, broker, shards, knobs, listen=listen,
                                  tokens_per_step=t["batch"] * t["context"], metrics_port=metrics_port)
    learner.adopt(model)
    opt = optimizer_for(model, t)
    # The data a native learner of this index and incarnation draws; made while the
    # Join and the fragments are on their way (the transport queues them meanwhile).
    data = archipelago.DataShard(config, index, knobs, incarnation=learner.status()["incarnation"])
    deadline = time.time() + join_s
    while not stop:  # in short waits, so that SIGTERM is seen while joining
        try:
            learner.wait_ready(1.0)
            break
        except TimeoutError:
            if time.time() > deadline:
                raise
    first_step = step = learner.schedule_step
    losses = []
    t0 = time.perf_counter()
    budget_s = t["step_time_ms"] / 1000
    while step < t["steps"] and not stop:
        begun = time.perf_counter()
        x, y = data.next(t["batch"])
        losses.append(train_step(model, opt, t, step, x, y))
        # The native learner's pace: a step lasts at least the compute budget, times its slow-down
        # (the configured one, and the chaos monkey's while a drill slows this learner).
        paced = max(budget_s, time.perf_counter() - begun) * t["slowdown"] * learner.slowdown
        time.sleep(max(0.0, paced - (time.perf_counter() - begun)))
        learner.after_step(t["batch"] * t["context"], max(paced, time.perf_counter() - begun))
        step += 1
    wall = time.perf_counter() - t0
    s, node = learner.status(), learner.node_status()  # before close: the transport's counters go with it
    learner.close(stop[0] if stop else "steps done", flush=not stop)
    n = len(losses)
    return {"command": "torch_gpt", "role": "learner", "index": index, "incarnation": s["incarnation"],
            "first_step": first_step, "steps": n, "steps_per_s": n / wall if wall > 0 else 0.0, "tokens": s["tokens"],
            "contributions": s["contributions"], "non_finite": s["non_finite"], "versions": s["versions"],
            "train_first": sum(losses[:10]) / max(1, min(10, n)), "train_last": sum(losses[-10:]) / max(1, min(10, n)),
            "status": node}


def check_against_native(steps=30, batch=8, seed=3):
    """The port against the native GPT, from the same parameters and batches: the loss and
    every gradient of one batch, then `steps` inner steps (AdamW, clipping, schedule)."""
    import numpy as np
    torch.manual_seed(seed)
    knobs = [f"train.steps={steps}", "optimizer.warmup_steps=5"]
    t = archipelago.training("", 0, knobs)
    model = GPT(archipelago.gpt_layout(), t["n_head"])
    with torch.no_grad():  # off the init, so that gains and biases count too
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    data = archipelago.DataShard("", 0, knobs, incarnation=seed)
    batches = [data.next(batch) for _ in range(steps)]
    native_loss, native_grads = archipelago.gpt_loss_and_gradients(params, *batches[0], knobs=knobs)
    loss = model.loss(torch.from_numpy(batches[0][0]), torch.from_numpy(batches[0][1]))
    loss.backward()
    grad_diff = max(float(np.abs(p.grad.numpy() - native_grads[n]).max() / (np.abs(native_grads[n]).max() + 1e-30))
                    for n, p in model.named_parameters())
    xs, ys = (np.stack(z) for z in zip(*batches))
    native_losses, after = archipelago.gpt_train_steps(params, xs, ys, 0, knobs=knobs)
    opt = optimizer_for(model, t)
    losses = [train_step(model, opt, t, k, xs[k], ys[k]) for k in range(steps)]
    param_diff = max(float(np.abs(p.detach().numpy() - after[n]).max() / (np.abs(after[n] - params[n]).max() + 1e-30))
                     for n, p in model.named_parameters())
    return {"command": "torch_gpt check", "loss": float(loss), "native_loss": native_loss,
            "gradient_rel_diff": grad_diff, "steps": steps, "last_loss": losses[-1],
            "native_last_loss": native_losses[-1], "param_rel_diff": param_diff}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare the port with the native GPT (no mesh) and exit")
    # The arguments `archipelago node --role learner` takes, so that a launcher (the
    # drill's --learner-command) starts this program as it starts a native learner.
    ap.add_argument("--role", default="learner", choices=["learner"])
    ap.add_argument("--config")
    ap.add_argument("--index", type=int)
    ap.add_argument("--broker", help="the broker's endpoint (then its standbys', comma-separated)")
    ap.add_argument("--shards", help="comma-separated shard endpoints")
    ap.add_argument("--listen", default="tcp://127.0.0.1:0")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--metrics-host", default="127.0.0.1", choices=["127.0.0.1"], help="(the package serves loopback)")
    ap.add_argument("--metrics-port", type=int, default=-1, help="Prometheus text and GET /node (0: any port)")
    ap.add_argument("--json", action="store_true", help="(always on: the report is one JSON line)")
    a = ap.parse_args()
    if a.check:
        r = check_against_native()
        print(f"loss {r['loss']:.6f} (native {r['native_loss']:.6f}), gradients within {r['gradient_rel_diff']:.1e} "
              f"of the largest; after {r['steps']} steps loss {r['last_loss']:.5f} (native "
              f"{r['native_last_loss']:.5f}), parameters within {r['param_rel_diff']:.1e} of their largest move")
        print(json.dumps(r))
        return 0
    missing = [f for f in ("config", "index", "broker", "shards") if getattr(a, f) is None]
    if missing:
        ap.error("a learner needs " + ", ".join("--" + f for f in missing))
    report = run_learner(a.config, a.index, a.broker, a.shards.split(","), a.set, a.listen, a.metrics_port)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
