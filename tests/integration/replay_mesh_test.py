#!/usr/bin/env python3
"""Integration, replay of a whole mesh: a mesh of `archipelago node` processes (a
broker with --db, two shards with --db, two learners; deploy/launch.py --db lays
the stores out as the Slurm job does) trains; then `archipelago replay --db DIR`
reads the whole model back over the three stores.

Checked:
- `list`: the head cut (every shard store's newest manifest) is complete and is
  exactly each shard's final store version (its node summary's mesh_version);
  cut 0 (the initial model) and a middle cut matched on the broker's tape are complete.
- `export` of the head and of a middle cut, npy and safetensors, loaded by numpy:
  every fragment's values, concatenated in the fragment plan's order, hash
  (XXH3-64, Debian's libxxhash) to the checksum the shard's own store records
  for that version (`replay --db shard-I show M`, one store read alone); the
  safetensors tensors equal the npy ones bit for bit.
- `eval` of the head cut is below the initial model's; `sample` runs.
- The mesh's own evaluation (mesh.global_eval_every: learner 0 evaluates the
  global model it holds, every fragment as last received): `replay eval` of the
  cut it names (its fragment versions, V0,V1,...) gives exactly its loss, and that
  cut exported to numpy is bit for bit the shard stores' versions.
- `list` over node shards' stores: tokens and steps come from the tape (its
  merges' work), never a made-up 0: they grow from cut 0 to the head.
- `resume` of a middle cut in one process: the new run's first eval (before any
  training) is exactly `replay eval` of the cut, and its loss then falls.
- The same cut as a new mesh of nodes: `replay save` writes it as one store,
  `deploy/launch.py --resume-from` starts the shards (new stores) and learners
  from it; each shard's first version is exactly the cut's fragments (versions
  and checksums), and the new mesh's head evaluates below the cut.
- Refusals: a store of another run (another configuration), a shard's store
  given twice, and a view missing a shard (export says which).

Environment: ARCHIPELAGO (the binary), REPLAY_MESH_STEPS (default 300).
"""

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import last_json  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
KNOBS = ["mesh.shards=2", "data.synthetic_bytes=1048576", "data.eval_tokens=8192", "data.batch=4",
         "train.threads=1", "mesh.global_eval_every=100",
         # Learner 0 may finish well before learner 1: the shards keep every manifest, so its last cut is kept.
         "storage.keep_last=100000"]


class Failure(Exception):
    pass


def check(ok, what, detail=""):
    if not ok:
        raise Failure(f"{what}\n{detail}")
    print(f"ok: {what}")


def replay(binary, dbs, *args, expect=0):
    cmd = [binary, "replay"] + [x for db in dbs for x in ("--db", db)] + list(args) + ["--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != expect:
        raise Failure(f"{' '.join(cmd)}: exit {out.returncode}, expected {expect}\n{out.stdout}\n{out.stderr}")
    if expect != 0:
        return out.stderr.strip()
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


xxh = ctypes.CDLL("libxxhash.so.0")
xxh.XXH3_64bits.restype = ctypes.c_uint64
xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def check_export(binary, mesh, shard_dbs, cut, work, manifests=None):
    """Exports cut `cut` (npy and safetensors) and checks it against each shard store read alone
    (the manifests export names, which must be `manifests` when given)."""
    import numpy as np
    npy = os.path.join(work, f"npy-{cut}")
    ex = replay(binary, [mesh], "export", cut, "--format", "npy", "--out", npy)
    check(manifests is None or ex["manifests"] == manifests, f"cut {cut}: export reads the shards' manifests "
          f"{ex['manifests']}")
    manifests = ex["manifests"]
    st = os.path.join(work, f"cut-{cut}.safetensors")
    replay(binary, [mesh], "export", cut, "--format", "safetensors", "--out", st)
    arrays = {f[:-4]: np.load(os.path.join(npy, f)) for f in os.listdir(npy)}
    check(sum(a.size for a in arrays.values()) == ex["parameters"], f"cut {cut}: numpy reads {len(arrays)} tensors, "
          f"{ex['parameters']} parameters")
    # The shards' own records of the versions this cut names, one store at a time.
    truth = {}
    for db, m in zip(shard_dbs, manifests):
        for e in replay(binary, [db], "show", str(m))["entries"]:
            truth[e["fragment"]] = (e["version"], e["checksum"])
    check(sorted(truth) == list(range(len(ex["fragments"]))), f"cut {cut}: the shard stores name every fragment once")
    for p, names in enumerate(ex["fragments"]):
        data = b"".join(np.ascontiguousarray(arrays[n], dtype="<f4").tobytes() for n in names)
        version, checksum = truth[p]
        if xxh.XXH3_64bits(data, len(data)) != checksum or ex["versions"][p] != version:
            raise Failure(f"cut {cut}: fragment {p} (version {ex['versions'][p]}) differs from shard store's version "
                          f"{version}")
    print(f"ok: cut {cut}: all {len(ex['fragments'])} fragments bit for bit the shard stores' versions")
    with open(st, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        body = f.read()
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        t = np.frombuffer(body[a:b], dtype="<f4").reshape(meta["shape"])
        if not np.array_equal(t, arrays[name]):
            raise Failure(f"cut {cut}: safetensors tensor {name} differs from the npy one")
    check(len(header) - 1 == len(arrays), f"cut {cut}: safetensors holds the same {len(arrays)} tensors bit for bit")


def launch(binary, steps, db, *extra):
    cmd = [sys.executable, os.path.join(REPO, "deploy", "launch.py"), "--binary", binary, "--learners", "2",
           "--shards", "2", "--standbys", "0", "--steps", str(steps), "--db", db, "--json", *extra]
    for k in KNOBS:
        cmd += ["--set", k]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    summary = [line for line in out.stdout.splitlines() if line.startswith("{")]
    check(out.returncode == 0 and summary, f"a mesh of 4 processes trained ({' '.join(extra) or 'fresh'})",
          out.stdout + out.stderr)
    return json.loads(summary[-1])["logs"]


def check_resume(binary, mesh, mid, work):
    """Cut `mid` resumed in one process and as a new mesh of nodes."""
    cut = mid["cut"]
    at_cut = replay(binary, [mesh], "eval", cut, "--threads", "1")["eval_loss"]
    rdb = os.path.join(work, "resumed.db")
    r = replay(binary, [mesh], "resume", cut, "--db", rdb, "--report", "", "--out", "", "--set", "train.threads=1")
    check(r["start_eval_loss"] == at_cut,
          f"resume of cut {cut} in one process: its first eval {r['start_eval_loss']:.6f} is exactly the cut's "
          f"{at_cut:.6f} (learners' schedule at step {r['start_step']})", json.dumps(r)[:1500])
    check(r["eval_loss"] < at_cut, f"then the loss falls: {at_cut:.4f} -> {r['eval_loss']:.4f} after {r['steps']} steps")

    seed = os.path.join(work, "seed.db")
    saved = replay(binary, [mesh], "save", cut, "--out", seed)
    check(replay(binary, [seed], "eval", "head", "--threads", "1")["eval_loss"] == at_cut,
          f"cut {cut} saved as one store (step {saved['learner_steps']}) evaluates the same")
    mesh2 = os.path.join(work, "mesh2")
    logs = launch(binary, int(os.environ.get("REPLAY_MESH_STEPS", "300")), mesh2, "--resume-from", seed)
    seeded = {e["fragment"]: (e["version"], e["checksum"]) for e in replay(binary, [seed], "show", "head")["entries"]}
    for s in range(2):
        first = replay(binary, [os.path.join(mesh2, f"shard-{s}")], "show", "1")["entries"]
        check(first and all(seeded[e["fragment"]] == (e["version"], e["checksum"]) for e in first),
              f"the new mesh's shard {s} started from exactly the cut's {len(first)} fragments")
        check(last_json(os.path.join(logs, f"shard-{s}.{2 + s}.log"))["resumed_version"] == 1,
              f"shard {s} restored its seeded version")
    after = replay(binary, [mesh2], "eval", "head", "--threads", "1")["eval_loss"]
    check(after < at_cut, f"the resumed mesh of nodes trained on from the cut: {at_cut:.4f} -> {after:.4f}")


def main():
    binary = os.environ.get("ARCHIPELAGO", os.path.join(REPO, "build", "archipelago"))
    steps = int(os.environ.get("REPLAY_MESH_STEPS", "300"))
    work = tempfile.mkdtemp(prefix="archipelago-replay-mesh-")
    mesh = os.path.join(work, "mesh")
    try:
        logs = launch(binary, steps, mesh)
        shard_dbs = [os.path.join(mesh, f"shard-{s}") for s in range(2)]
        final = [last_json(os.path.join(logs, f"shard-{s}.{2 + s}.log")) for s in range(2)]

        listed = replay(binary, [mesh], "list")
        rows = {r["cut"]: r for r in listed["rows"]}
        head = next(r for r in listed["rows"] if r["head"])
        check(head["complete"] and head["manifests"] == [f["mesh_version"] for f in final],
              f"the head cut is complete and is each shard's final store version {head['manifests']}",
              json.dumps(listed)[:2000])
        check(rows.get("0", {}).get("complete"), "cut 0 (the initial model) is complete")
        middle = [r for r in listed["rows"] if r["complete"] and not r["head"] and r["cut"] != "0"]
        check(middle, f"{listed['complete']} of {listed['cuts']} cuts complete over a tape of "
              f"{listed['tape_records']} rounds, middle ones among them")
        mid = middle[len(middle) // 2]

        check_export(binary, mesh, shard_dbs, "head", work, head["manifests"])
        check_export(binary, mesh, shard_dbs, mid["cut"], work, mid["manifests"])

        first = replay(binary, [mesh], "eval", "0", "--threads", "1")["eval_loss"]
        last = replay(binary, [mesh], "eval", "head", "--threads", "1")["eval_loss"]
        check(last < first, f"eval loss of the whole model: cut 0 {first:.4f}, head {last:.4f} nats/byte")
        # The mesh's own last evaluation of the global model, by learner 0 as it left.
        held = last_json(os.path.join(logs, "learner-0.4.log"))["status"].get("global_eval")
        check(held and held["evaluations"] >= 3, f"learner 0 evaluated the global model it held: {held}")
        named = ",".join(str(v) for v in held["versions"])
        own = replay(binary, [mesh], "eval", named, "--threads", "1")["eval_loss"]
        check(own == held["loss"], f"replay eval of the cut learner 0 evaluated ({named}) gives its loss exactly: "
              f"{own:.6f} vs {held['loss']:.6f}; head {last:.4f}")
        check_export(binary, mesh, shard_dbs, named, work)
        counted = [r for r in listed["rows"] if r["complete"]]
        check(listed["counts_from"] == "tape" and counted[0]["tokens"] == 0 and head["tokens"] > 0 and
              head["learner_steps"] > 0 and all(a["tokens"] <= b["tokens"] for a, b in zip(counted, counted[1:])),
              f"list's tokens and steps over node shards come from the tape: cut 0 0, head {head['tokens']} tokens, "
              f"step {head['learner_steps']}")
        check_resume(binary, mesh, mid, work)
        text = replay(binary, [mesh], "sample", "head", "--bytes", "32")["text"]
        check(len(text) > 0, "sample from the head cut")
        # The same stores named one by one (the broker's last) read the same.
        same = replay(binary, shard_dbs + [os.path.join(mesh, "broker")], "eval", "head", "--threads", "1")["eval_loss"]
        check(same == last, "the stores given one by one read the same model")

        # Refusals.
        other = os.path.join(work, "other.db")
        subprocess.run([binary, "run", "--db", other, "--learners", "1", "--steps", "5", "--report", "",
                        "--out", os.path.join(work, "other.ckpt"), "--set", "data.synthetic_bytes=1048576", "--set", "train.threads=1",
                        "--set", "data.eval_tokens=8192"], capture_output=True, timeout=300, check=True)
        err = replay(binary, [shard_dbs[0], other], "list", expect=2)
        check("stores of different runs" in err and other in err, f"a store of another run refused: {err}")
        twin = os.path.join(work, "shard-0-copy")
        shutil.copytree(shard_dbs[0], twin)
        err = replay(binary, [shard_dbs[0], twin, shard_dbs[1]], "list", expect=2)
        check("both hold fragment" in err, f"one shard's store twice refused: {err}")
        err = replay(binary, [shard_dbs[0], os.path.join(mesh, "broker")], "export", "head", "--out",
                     os.path.join(work, "x"), expect=2)
        check("incomplete" in err and "shard 1" in err, f"a view without shard 1 refused: {err}")
    except Failure as e:
        print(f"FAIL: {e}\n(work directory kept: {work})", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
