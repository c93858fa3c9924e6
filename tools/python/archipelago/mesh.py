"""A mesh's synchronizer on the local machine, for examples and tests: a sync broker and
its parameter shards as `archipelago node` processes on tcp:// loopback (and,
for a mixed mesh, native learners). Nothing here is needed to join a mesh
started some other way (deploy/launch.py, Slurm, Kubernetes)."""

import json
import os
import signal
import socket
import subprocess
import tempfile
import time


def free_ports(count):
    """`count` TCP ports of 127.0.0.1 that were free a moment ago (bound, read, released)."""
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


def last_json(path):
    """The last JSON line a node printed (--json), or None. A line cut short (a node
    killed while writing it) is passed over."""
    try:
        with open(path) as f:
            lines = [line for line in f if line.startswith("{")]
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


class LocalMesh:
    """Broker and `shards` shard nodes of the mesh `config` (a TOML file) with `knobs`
    (["KEY=VALUE", ...] for every node). CURVE is off unless the knobs turn it on. With
    `db`, the broker and shards keep their stores under it (broker, shard-I), as
    deploy/launch.py --db lays them out for `archipelago replay --db DIR`."""

    def __init__(self, binary, config, shards, knobs=(), logs=None, db=None):
        self.binary = binary
        self.logs = logs or tempfile.mkdtemp(prefix="archipelago-pymesh-")
        ports = free_ports(1 + shards)
        self.broker = f"tcp://127.0.0.1:{ports[0]}"
        self.shards = [f"tcp://127.0.0.1:{p}" for p in ports[1:]]
        self.common = ["--config", config, "--broker", self.broker, "--shards", ",".join(self.shards), "--json"]
        self.common += [a for k in ("wire.curve=false", *knobs) for a in ("--set", k)]
        self.db = db
        self.processes = {}  # name -> (Popen, log)

    def start_node(self, role, index=0):
        """Starts `archipelago node --role ROLE --index INDEX` of this mesh (its log in self.logs)."""
        name = f"{role}-{index}"
        log = os.path.join(self.logs, f"{name}.{len(self.processes)}.log")
        store = ["--db", os.path.join(self.db, "broker" if role == "broker" else name)] \
            if self.db and role != "learner" else []  # learners keep no snapshots
        with open(log, "w") as out:
            proc = subprocess.Popen([self.binary, "node", "--role", role, "--index", str(index), *self.common, *store],
                                    stdout=out, stderr=subprocess.STDOUT)
        self.processes[name] = (proc, log)
        return proc

    def start(self):
        """Starts the broker and every shard; returns the mesh."""
        self.start_node("broker")
        for s in range(len(self.shards)):
            self.start_node("shard", s)
        return self

    def check_alive(self):
        """Raises RuntimeError naming the node and its log if a broker or shard has exited."""
        for name, (proc, log) in self.processes.items():
            if not name.startswith("learner") and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; its log: {log}")

    def stop(self, wait_s=20):
        """SIGTERM to every node, in the order the one-process mesh stops its roles:
        learners, then shards, then brokers, each group once the one before it has
        exited (a shard's stop makes its last versions durable and announces them to the
        broker, whose ledger credits those steps merged only on hearing it; signalled
        together, a broker could report before it heard them and book them lost).
        Each group is killed after `wait_s`. Returns {name: its last JSON line}."""
        for group in ("learner", "shard", "broker"):
            procs = [proc for name, (proc, _) in self.processes.items() if name.startswith(group)]
            deadline = time.time() + wait_s
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return {name: last_json(log) for name, (_, log) in self.processes.items()}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def learner_reports(procs, timeout_s, what="a learner", logs=None):
    """The last JSON line each learner process (Popen with stdout=PIPE, text) printed, in
    order; a process that fails or prints none raises RuntimeError. Any still running when
    this returns or raises is killed."""
    try:
        reports = []
        deadline = time.time() + timeout_s
        for p in procs:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"{what} exited with {p.returncode}" + (f"; logs in {logs}" if logs else ""))
            reports.append(json.loads(lines[-1]))
        return reports
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def ledger_check(broker_summary, learner_reports):
    """The broker's ledger against what each learner incarnation reports
    ({"index", "incarnation", "tokens"}): (balanced, matches, ledger)."""
    seen = {(r["learner"], r["incarnation"]): r for r in broker_summary.get("learners", [])}
    matches = all(seen.get((r["index"], r["incarnation"]), {}).get("processed") == r["tokens"]
                  for r in learner_reports)
    return broker_summary.get("ledger_balanced", False), matches, broker_summary.get("ledger", {})
