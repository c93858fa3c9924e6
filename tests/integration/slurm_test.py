#!/usr/bin/env python3
"""Integration, Slurm: a whole mesh launched through sbatch/srun as one
heterogeneous job (deploy/slurm/mesh.sbatch) on a Slurm cluster started on this
machine (deploy/slurm/local_cluster.sh): slurmctld, munged and three slurmd
nodes, each in a network namespace of its own with its own address, so the
broker, the shard and the learners run on three different "hosts" and reach
each other, with CURVE on and keys the job makes, by the addresses the job
script hands them.

Checks: the job's three components end COMPLETED with exit code 0 (scontrol and
the job completion log); the roles ran on three different nodes and addresses;
every process left its JSON summary; each learner ran its steps; the broker
closed rounds, its ledger balances and holds exactly the tokens each learner
reports (per learner and in total), and nothing was rejected or lost to a
crash; the shard published and committed versions. The model is pulled out of
the job's stores with one command, `replay --db ARCH_DB export head` (the
brokers' and the shard's stores as one view): numpy loads it, and every fragment
hashes to the checksum the shard's store records for the version the head cut
names, the shard's final one; the global model trained: the eval loss of the
head cut is below that of cut 0 (the initial model).
The cluster is always torn down (daemons, namespaces, bridge, directory).

Needs root, slurm-wlm, munge and iproute2 (tools/setup.sh test); exits 77
(skipped) without them. Environment: ARCHIPELAGO (the binary), SLURM_TEST_STEPS
(default 300: the learners never wait for the mesh, so their work must outlast
the brokers' election and the first rounds, some seconds), SLURM_TEST_JOB_TIMEOUT (seconds, default 120), KEEP=1 (keep the
work directory).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replay_mesh_test import Failure, check_export, replay as replay_view  # noqa: E402  (numpy, libxxhash)

HERE = os.path.dirname(os.path.abspath(__file__))
SLURM_DIR = os.path.join(HERE, "..", "..", "deploy", "slurm")
CLUSTER = os.path.join(SLURM_DIR, "local_cluster.sh")
SBATCH = os.path.join(SLURM_DIR, "mesh.sbatch")
NODES = 3       # one per component: Slurm's backfill places each on a node of its own
LEARNERS = 2
SKIP = 77


def run(cmd, env, timeout=60, check=True):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


def job_states(env, job):
    """{component job id: (state, exit code)} from scontrol; empty once forgotten."""
    out = run(["scontrol", "--oneliner", "show", "job", str(job)], env, check=False)
    states = {}
    for line in out.stdout.splitlines():
        jid = re.search(r"\bJobId=(\d+)", line)
        state = re.search(r"\bJobState=(\S+)", line)
        code = re.search(r"\bExitCode=(\S+)", line)
        if jid and state:
            states[int(jid.group(1))] = (state.group(1), code.group(1) if code else "?")
    return states


def read_json(path):
    with open(path) as f:
        return json.loads(f.read())


def logs_of(work):
    text = []
    for root, dirs, files in os.walk(work):
        dirs[:] = [d for d in dirs if d not in ("db", "keys", "spool", "state", "munge")]  # no binary files
        for name in sorted(files):
            if name.endswith((".log", ".out", ".txt")):
                path = os.path.join(root, name)
                with open(path, errors="replace") as f:
                    tail = f.read()[-3000:]
                text.append(f"---- {path}\n{tail}")
    return "\n".join(text)


def check_mesh(binary, job_dir, db, steps):
    mesh = read_json(os.path.join(job_dir, "mesh.json"))
    nodes = {mesh["broker_node"], mesh["shard_nodes"], mesh["learner_nodes"]}
    hosts = {mesh["broker"].split("//")[1].rsplit(":", 1)[0], mesh["shards"].split("//")[1].rsplit(":", 1)[0]}
    if len(nodes) != 3 or len(hosts) != 2 or any(h.startswith("127.") for h in hosts):
        raise Failure(f"the roles did not run on three nodes with their own addresses: {mesh}")
    with open(os.path.join(job_dir, "config.toml")) as f:
        wire = f.read().split("[wire]", 1)[-1].split("\n[", 1)[0]
    if mesh["curve"] is not True or not re.search(r"^curve = true$", wire, re.M) or \
            not os.path.exists(os.path.join(job_dir, "keys", "broker.key")):
        raise Failure(f"CURVE was not on, or the job made no keys: {mesh}\n[wire]{wire}")

    names = ["broker", "broker-1", "shard-0"] + [f"learner-{i}" for i in range(LEARNERS)]
    missing = [n for n in names if not os.path.exists(os.path.join(job_dir, f"{n}.json"))]
    if missing:
        raise Failure(f"no JSON summary from {missing}")
    primary = read_json(os.path.join(job_dir, "broker.json"))
    standby = read_json(os.path.join(job_dir, "broker-1.json"))
    # Exactly one leads at the end. Usually the primary; on a starved machine its lease
    # can lapse and the standby take over, which the ledger checks below must survive.
    if bool(primary.get("leading")) == bool(standby.get("leading")) or \
            len(mesh["brokers"].split(",")) != 2 or not os.path.exists(os.path.join(job_dir, "keys", "broker-1.key")):
        raise Failure(f"expected one leading broker beside a standby (broker-1) with its own key: "
                      f"primary {primary.get('leading')}, standby {standby.get('leading')}, brokers {mesh['brokers']}")
    broker = primary if primary.get("leading") else standby
    if broker is standby:
        print("note: the standby took over from the primary during the job (its lease lapsed)")
    shard = read_json(os.path.join(job_dir, "shard-0.json"))
    learners = [read_json(os.path.join(job_dir, f"learner-{i}.json")) for i in range(LEARNERS)]

    for i, r in enumerate(learners):
        if r["role"] != "learner" or r["index"] != i or r["steps"] != steps or r["tokens"] <= 0:
            raise Failure(f"learner {i} did not run its {steps} steps: {r}")
    ledger = broker["ledger"]
    if broker["rounds"] <= 0 or ledger["merged"] <= 0:
        raise Failure(f"the broker closed no rounds or merged nothing: {broker}")
    if not broker["ledger_balanced"]:
        raise Failure(f"the broker's ledger does not balance: {ledger}")
    if ledger["rejected"] != 0:
        raise Failure(f"contributions were rejected: {ledger}")
    total = sum(r["tokens"] for r in learners)
    if ledger["processed"] != total:
        raise Failure(f"the ledger holds {ledger['processed']} tokens, the learners report {total}")
    seen = {(r["learner"], r["incarnation"]): r for r in broker["learners"]}
    for r in learners:
        held = seen.get((r["index"], r["incarnation"]), {}).get("processed")
        if held != r["tokens"]:
            raise Failure(f"learner {r['index']} reports {r['tokens']} tokens, the broker's ledger {held}")
    if shard["published"] <= 0 or shard["rejected"] != 0 or shard["mesh_version"] <= 0 or broker["committed"] <= 0:
        raise Failure(f"the shard published or committed nothing, or rejected something: {shard}; "
                      f"broker committed {broker['committed']}")

    # The model out of the job's stores, as deploy/slurm/README.md says: one command over ARCH_DB.
    listed = replay_view(binary, [db], "list")
    head = next((r for r in listed["rows"] if r["head"]), None)
    if not head or not head["complete"] or head["manifests"] != [shard["mesh_version"]]:
        raise Failure(f"the head cut over {db} is not the shard's final version {shard['mesh_version']}: {head}")
    export_dir = os.path.join(os.path.dirname(job_dir), "export")
    os.makedirs(export_dir, exist_ok=True)
    check_export(binary, db, [os.path.join(db, "shard-0")], "head", export_dir, head["manifests"])
    loss_first = replay_view(binary, [db], "eval", "0", "--threads", "1")["eval_loss"]
    loss_last = replay_view(binary, [db], "eval", "head", "--threads", "1")["eval_loss"]
    if not loss_last < loss_first:
        raise Failure(f"the model did not train: eval loss {loss_first} at cut 0, {loss_last} at the head")
    return mesh, broker, ("cut 0", loss_first), ("head", loss_last)


def main():
    binary = os.environ.get("ARCHIPELAGO", "")
    if os.geteuid() != 0:
        print("skipped: needs root (slurmd, munged and network namespaces)")
        return SKIP
    for tool in ("sbatch", "slurmctld", "slurmd", "munged", "mungekey", "ip", "nsenter"):
        if not shutil.which(tool):
            print(f"skipped: {tool} not found (tools/setup.sh test installs slurm-wlm, munge, iproute2)")
            return SKIP
    if not os.access(binary, os.X_OK):
        print(f"FAIL: ARCHIPELAGO={binary!r} is not an executable", file=sys.stderr)
        return 1
    steps = int(os.environ.get("SLURM_TEST_STEPS", "300"))
    job_timeout = float(os.environ.get("SLURM_TEST_JOB_TIMEOUT", "120"))

    started = time.time()
    work = tempfile.mkdtemp(prefix="archipelago-slurm-test-")
    cluster_dir = os.path.join(work, "cluster")
    job_dir, db = os.path.join(work, "job"), os.path.join(work, "db")
    # OWNER_PID: the cluster's watchdog stops it even if this process is killed outright.
    env = dict(os.environ, NODES=str(NODES), CPUS="2", OWNER_PID=str(os.getpid()))
    # A signal (ctest's timeout, Ctrl-C) still tears the cluster down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        out = run([CLUSTER, "start", cluster_dir], env, timeout=120)
        env["SLURM_CONF"] = os.path.join(cluster_dir, "slurm.conf")
        up = time.time() - started

        # Every node has a network namespace of its own, so mesh.sbatch's default ports are free.
        env.update(ARCH_BIN=os.path.abspath(binary), ARCH_STEPS=str(steps), ARCH_JOB_DIR=job_dir, ARCH_DB=db,
                   # one compute thread per learner (two learners on two cores); a small corpus (quick
                   # starts) and evaluation set (quick `replay eval`)
                   ARCH_SET="train.threads=1 data.synthetic_bytes=1048576 data.eval_tokens=8192")
        out = run(["sbatch", "--parsable", f"--output={work}/slurm-%j.out", f"--chdir={work}", "--time=5",
                   SBATCH], env)
        job = int(out.stdout.strip().split(";")[0])
        submitted = time.time()
        while True:
            states = job_states(env, job)
            if len(states) == 3 and all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                              "OUT_OF_MEMORY") for s, _ in states.values()):
                break
            if time.time() - submitted > job_timeout:
                run(["scancel", str(job)], env, check=False)
                raise Failure(f"job {job} not finished after {job_timeout:.0f} s (states {states}); cancelled")
            time.sleep(1)
        job_s = time.time() - submitted
        if len(states) != 3 or any(s != ("COMPLETED", "0:0") for s in states.values()):
            raise Failure(f"job {job}: components ended {states}, expected 3 × COMPLETED with exit code 0:0")
        with open(os.path.join(cluster_dir, "log", "jobcomp.txt")) as f:
            completed = [l for l in f if f"HetJobId={job} " in l and "JobState=COMPLETED" in l]
        if len(completed) != 3:
            raise Failure(f"the job completion log has {len(completed)} COMPLETED component(s) of job {job}")

        mesh, broker, first, last = check_mesh(binary, job_dir, db, steps)
        print(f"ok: job {job} (3 components on {mesh['broker_node']}, {mesh['shard_nodes']}, "
              f"{mesh['learner_nodes']}) COMPLETED in {job_s:.0f} s (cluster up in {up:.0f} s): "
              f"{LEARNERS} learners × {steps} steps, {broker['rounds']} rounds, ledger {broker['ledger']} exact, "
              f"{broker['committed']} versions committed; model exported from {db} and loaded by numpy; eval loss "
              f"{first[1]:.3f} ({first[0]}) → {last[1]:.3f} ({last[0]}); {time.time() - started:.0f} s in all")
        return 0
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        print(logs_of(work), file=sys.stderr)
        return 1
    finally:
        stop = subprocess.run([CLUSTER, "stop", cluster_dir], env=env, capture_output=True, text=True, timeout=120)
        if stop.returncode != 0:
            print(f"local_cluster.sh stop: {stop.stdout}{stop.stderr}", file=sys.stderr)
        if os.environ.get("KEEP") == "1":
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
