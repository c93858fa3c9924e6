"""archipelago: a model of your own as a learner of an archipelago mesh.

A training loop of any framework joins a running mesh (a sync broker and its
parameter shards, `archipelago node` processes) beside native learners:

    learner = archipelago.Learner(config="mesh.toml", index=0,
                                  broker="tcp://127.0.0.1:7000",
                                  shards=["tcp://127.0.0.1:7001"])
    learner.adopt(model)          # or learner.bind(named float32 arrays): copies
    learner.wait_ready()          # every fragment of the global model installed
    for step in range(steps):
        ...forward, backward, optimizer.step()...
        learner.after_step(tokens)  # Progress, contributions, merged fragments in
    learner.close()               # leaves as a SIGTERMed native learner does

The mesh's model is a layout: named float32 tensors with shapes, the layout file
named by the configuration's model.layout (or the built-in GPT's). The package
never imports PyTorch: it sees numpy arrays (a CPU tensor's .numpy() is a view).
"""

import json
import time

import numpy as np

from . import _native

__all__ = ["Learner", "DataShard", "layout_of", "write_layout", "mesh_layout", "gpt_layout", "load_safetensors",
           "training", "scheduled_lr", "eval_windows", "gpt_loss_and_gradients", "gpt_train_steps"]


def _overrides(knobs):
    """{"mesh.mode": "decoupled", ...} or ["KEY=VALUE", ...] as KEY=VALUE assignments."""
    if knobs is None:
        return []
    if isinstance(knobs, dict):
        return [f"{k}={v if not isinstance(v, bool) else str(v).lower()}" for k, v in knobs.items()]
    return list(knobs)


def _init_law(values):
    """A layout file's init law that draws values like these (their spread, not the values)."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    if flat.size == 0 or np.all(flat == flat[0]):
        return {"constant": float(flat[0]) if flat.size else 0.0}
    lo, hi = float(flat.min()), float(flat.max())
    std = float(flat.std())
    # A uniform law's std is bound/sqrt(3): PyTorch's default Linear and Conv init.
    if abs(lo + hi) < 0.1 * (hi - lo) and abs(std * np.sqrt(3) - hi) < 0.05 * hi:
        return {"uniform": hi}
    return {"normal": std}


def layout_of(named_arrays, kinds=None):
    """A layout file's dict from named arrays, in their order (e.g. a PyTorch
    model's {name: p.detach().numpy() for name, p in model.named_parameters()}).
    `kinds`: {name: "embedding" | "matrix" | "vector"} where the default (vector
    for one dimension, matrix otherwise) is not what you want; embeddings get
    fragments of their own. Init laws follow the arrays' values (constant, or the
    spread of a normal or uniform draw), so the shards start from a model like yours."""
    kinds = kinds or {}
    tensors = []
    for name, a in named_arrays.items():
        a = np.asarray(a)
        kind = kinds.get(name, "vector" if a.ndim == 1 else "matrix")
        tensors.append({"name": name, "shape": list(a.shape), "kind": kind, "init": _init_law(a)})
    return {"tensors": tensors}


def write_layout(path, named_arrays, kinds=None):
    """Writes layout_of(named_arrays, kinds) to `path`; returns its fingerprint."""
    text = json.dumps(layout_of(named_arrays, kinds), indent=1)
    fingerprint = _native.check_layout_json(text)
    with open(path, "w") as f:
        f.write(text + "\n")
    return fingerprint


def mesh_layout(config="", knobs=None):
    """The mesh's layout (model.layout's file, or the GPT of the model.* knobs) as a dict."""
    return json.loads(_native.layout_json(config, _overrides(knobs)))


def gpt_layout(size="nano"):
    """The native GPT's layout for a preset: what a PyTorch GPT must match to train beside native learners."""
    return mesh_layout("", {"model.size": size})


def training(config="", index=0, knobs=None):
    """What native learner `index` of the mesh trains with, to train the same way:
    {lr, min_lr_ratio, warmup_steps, weight_decay (matrices only), beta1, beta2, eps,
    clip_norm (global gradient norm), steps (train.steps, the schedule's length),
    batch, threads, step_time_ms and slowdown (a step lasts at least step_time_ms,
    times slowdown), context, n_head}."""
    return dict(_native.training(config, _overrides(knobs), index))


def scheduled_lr(t, step):
    """The native learning rate at `step` (0-based) for training(...) `t`: linear
    warm-up, then cosine decay to lr * min_lr_ratio at t["steps"] (core/adamw.cpp)."""
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    low = t["lr"] * t["min_lr_ratio"]
    progress = min(1.0, (step - t["warmup_steps"]) / max(1, t["steps"] - t["warmup_steps"]))
    return low + (t["lr"] - low) * 0.5 * (1.0 + np.cos(np.pi * progress))


def eval_windows(config="", knobs=None):
    """The held-out windows a native evaluation (`archipelago replay eval`) scores:
    (inputs, targets) int64 [windows, context] and first_scored [windows]; window w
    counts the loss of positions first_scored[w].. only. The mean over those is the
    eval loss in nats/byte, comparable to the native figure."""
    return _native.eval_windows(config, _overrides(knobs))


def gpt_loss_and_gradients(params, inputs, targets, config="", knobs=None):
    """The native GPT's loss and {name: gradient} at `params` ({name: float32 array}) on one
    batch (int64 [batch, context]): to check a port of the GPT against the real one."""
    loss, grads = _native.gpt_loss_and_gradients(config, _overrides(knobs), params, inputs, targets)
    return loss, dict(grads)


def gpt_train_steps(params, inputs, targets, first_step=0, config="", knobs=None):
    """The native learner's inner steps (forward, backward, clipped AdamW at the scheduled
    rate) from `params` on the batches inputs[k], targets[k] (int64 [steps, batch, context]),
    at schedule steps first_step, first_step + 1, ...: (losses, {name: parameters after})."""
    losses, after = _native.gpt_train_steps(config, _overrides(knobs), params, inputs, targets, first_step)
    return list(losses), dict(after)


def load_safetensors(path):
    """{name: float32 numpy array} of a safetensors file (`archipelago replay export --format
    safetensors`), in file order: a small reader, since Debian has no safetensors package and
    torch 1.13 cannot read the format. model.load_state_dict({k: torch.from_numpy(v) ...})."""
    with open(path, "rb") as f:
        blob = f.read()
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name!r} is {t['dtype']}, not F32")
        begin, end = t["data_offsets"]
        out[name] = np.frombuffer(blob, np.float32, (end - begin) // 4, 8 + size + begin).reshape(t["shape"]).copy()
    return out


class DataShard:
    """Learner `index`'s share of the mesh's data: the split and sampler native learners use
    (data.*, mesh.learners, model.context and train.seed of the configuration)."""

    def __init__(self, config="", index=0, knobs=None, incarnation=1):
        self._shard = _native.DataShard(config, _overrides(knobs), index, incarnation)
        self.context = self._shard.context

    def next(self, batch):
        """(inputs, targets): int64 arrays [batch, context], targets one byte ahead."""
        return self._shard.next(batch)

    def heldout(self, windows=64):
        """Up to `windows` held-out windows (inputs, targets), the same for every learner."""
        return self._shard.heldout(windows)


class Learner:
    """Learner `index` of the mesh configured by `config` (a TOML file) and `knobs`
    (overrides, as the command line's --set), joining the broker and shards at the
    given endpoints. The real learner wire layer runs underneath: Join, the fetch
    of every fragment (the model starts from the mesh's global model), Progress,
    contributions to the owning shards, merged fragments installed between steps,
    CURVE keys (wire.curve, wire.key_file, wire.allow) and the mesh policy's
    waits. metrics_port >= 0 serves Prometheus text on 127.0.0.1 (0: any port)."""

    def __init__(self, config="", index=0, broker="tcp://127.0.0.1:7000", shards=(), knobs=None,
                 listen="tcp://127.0.0.1:0", tokens_per_step=0, metrics_port=-1, log_level="warn"):
        self._native = _native.NativeLearner(config, _overrides(knobs), index, broker, list(shards), listen,
                                             tokens_per_step, metrics_port, log_level)
        self.names = self._native.names()

    # -- the parameters ------------------------------------------------------------
    def array(self, name):
        """A float32 numpy view of one tensor in the learner's own buffer (no copy)."""
        return self._native.array(name)

    def arrays(self):
        """{name: view} of every tensor, in layout order."""
        return {n: self._native.array(n) for n in self.names}

    def adopt(self, module):
        """A PyTorch module (or anything with named_parameters()) takes the learner's
        buffer as its parameters' storage: each parameter's .data becomes a tensor
        over the learner's view (torch.from_numpy, found through the parameter
        itself), so nothing is copied per step. Names and shapes must match the layout.
        Call it before building the optimizer."""
        params = dict(module.named_parameters())
        self._check_names(params)
        for name, p in params.items():
            view = self._native.array(name)
            if tuple(p.shape) != view.shape:
                raise ValueError(f"adopt: '{name}' has shape {list(p.shape)}, the layout says {list(view.shape)}")
            view[...] = p.detach().numpy()
            p.data = _from_numpy(p, view)

    def bind(self, named_arrays):
        """Copy mode: your own float32 arrays (e.g. {n: p.detach().numpy()} of CPU
        parameters). They are copied into the learner's buffer once per step
        and the fragments the mesh merged are copied back."""
        self._check_names(named_arrays)
        self._native.bind(dict(named_arrays))

    def _check_names(self, named):
        """The model's tensor names, in order, are the layout's; else the first difference."""
        names = list(named)
        for i in range(max(len(names), len(self.names))):
            a = self.names[i] if i < len(self.names) else None
            b = names[i] if i < len(names) else None
            if a != b:
                raise ValueError(f"tensor {i}: the layout has {a!r}, the model has {b!r}")

    # -- the loop ------------------------------------------------------------------
    def wait_ready(self, timeout_s=120.0):
        """Blocks until every fragment of the global model is installed (your
        arrays hold it). Raises RuntimeError if the mesh refused this learner
        (e.g. a different layout: the message names the first difference)."""
        if not self._native.wait_ready(timeout_s):
            raise TimeoutError(f"no global model within {timeout_s} s: is the mesh up at the given endpoints?")

    def after_step(self, tokens, step_s=None):
        """Call once per optimizer step, with the tokens it trained on. step_s: the
        step's time for the ledger (default: the time since the last call)."""
        self._native.after_step(int(tokens), -1.0 if step_s is None else float(step_s))

    def poll(self):
        """Handles what arrived meanwhile without a step (e.g. during a long evaluation)."""
        self._native.poll()

    def status(self):
        """This incarnation's figures: steps, tokens, contributions, versions, ..."""
        return self._native.status()

    def node_status(self):
        """The node status a native learner serves on GET /node (JSON as a dict)."""
        return json.loads(self._native.node_json())

    @property
    def slowdown(self):
        """The chaos monkey's slow-down in force on this learner (1.0: none). A drill's straggler
        faults reach a loop of your own only through this: a native learner stretches each step
        by it; do the same (sleep (slowdown - 1) x your step's time) to take part in the drill."""
        return self._native.slowdown()

    @property
    def schedule_step(self):
        """Where the mesh's learning-rate schedule stands for a restarted learner (0 at a first start)."""
        return self._native.status()["schedule_step"]

    def close(self, reason="closed", flush=True):
        """Leaves the mesh (Leave to the broker; the transport drains, bounded). With the
        mesh's mesh.flush and `flush`, first waits (bounded by mesh.round_timeout_s) until
        every fragment's work is merged; pass flush=False when stopping early (a signal)."""
        self._native.close(reason, flush)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(flush=exc_type is None)
        return False


def _from_numpy(param, view):
    """torch.from_numpy without importing torch: the function lives in the parameter's module."""
    import sys
    return sys.modules[type(param).__module__.split(".")[0]].from_numpy(view)
