#!/usr/bin/env python3
"""Start a whole archipelago mesh as separate processes on loopback.

One `archipelago node` process per role: the primary broker and its standbys
(`--standbys`, default 1: it takes over if the primary is lost), S parameter
shards and M learners, talking over tcp://127.0.0.1. Optional faults: `--kill 1@8` sends
SIGKILL to learner 1 eight seconds after the learners started; it is started
again `--restart-after` seconds later (a new incarnation that rejoins by
itself). When every learner finished its steps the broker and the shards get
SIGTERM, and the launcher prints what the broker saw: rounds, uptime, the token
ledger, and per restarted learner the time from its restart to its first merged
contribution.

CURVE is on by default, with a keypair per node made for the run (keygen, in the
log directory); `--no-curve` turns it off, `--shared-learner-key` gives every
learner one keypair (with a warning: it binds the role only).
With --db DIR every broker and shard keeps its store under DIR, laid out as the
Slurm job lays out ARCH_DB: DIR/broker (the primary's tape), DIR/broker-I (standby
I's copy), DIR/shard-I; `archipelago replay --db DIR ...` reads the whole model back.
With --resume-from STORE (a cut saved by `replay save`) the shards' new stores, the
learners and the brokers start from that snapshot: a new mesh continuing from the cut.

Example:
  deploy/launch.py --learners 3 --steps 300 --kill 1@8 --json
  deploy/launch.py --db run1 && build/archipelago replay --db run1 export head --out model
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_ports(count):
    """`count` loopback ports free right now, below the kernel's ephemeral range: the
    mesh's own outgoing connections take their local ports from that range and could
    take one between this pick and a node's bind (the node would then exit)."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    span = low - 10000
    start = (os.getpid() * 7919) % span  # two launchers at once rarely meet
    ports = []
    for k in range(span):
        port = 10000 + (start + k) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"cannot find {count} free loopback ports below {low}")


def parse_kill(text):
    learner, _, at = text.partition("@")
    try:
        return int(learner), float(at)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--kill {text!r}: expected LEARNER@SECONDS, e.g. 1@8")


def last_json(path):
    try:
        with open(path) as f:
            lines = [line for line in f.read().splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, json.JSONDecodeError):
        return None


class Mesh:
    def __init__(self, args):
        self.args = args
        self.logs = tempfile.mkdtemp(prefix="archipelago-mesh-")
        ports = free_ports(1 + args.standbys + args.shards)
        brokers = 1 + args.standbys
        self.broker = ",".join(f"tcp://127.0.0.1:{p}" for p in ports[:brokers])
        self.shards = ",".join(f"tcp://127.0.0.1:{p}" for p in ports[brokers:])
        self.common = ["--broker", self.broker, "--shards", self.shards, "--learners", str(args.learners),
                       "--steps", str(args.steps), "--mode", args.mode, "--json",
                       "--log-format", args.log_format, "--log-level", args.log_level]
        self.keys = None
        if args.curve:
            # CURVE with a key per node, named as the transport looks them up: broker,
            # broker-I (standbys), shard-I, learner-I. Each key binds its node's identity,
            # so no learner can speak for the broker, a shard or another learner.
            self.keys = os.path.join(self.logs, "keys")
            os.makedirs(self.keys, mode=0o700)
            names = ["broker"] + [f"broker-{b}" for b in range(1, brokers)] + \
                    [f"shard-{s}" for s in range(args.shards)] + \
                    (["learner"] if args.shared_learner_key else [f"learner-{i}" for i in range(args.learners)])
            for name in names:
                subprocess.run([args.binary, "keygen", "--name", name, "--dir", self.keys], check=True,
                               stdout=subprocess.DEVNULL)
            self.common += ["--set", "wire.curve=true", "--set", f"wire.allow={self.keys}"]
        else:
            self.common += ["--set", "wire.curve=false"]
        for knob in args.set:
            self.common += ["--set", knob]
        self.processes = {}  # name -> (Popen, log path)
        self.starts = 0

    def key_of(self, role, index):
        """The node's key file (CURVE on), as keygen named it."""
        if role == "broker":
            name = "broker" if index == 0 else f"broker-{index}"
        elif role == "learner" and self.args.shared_learner_key:
            name = "learner"
        else:
            name = f"{role}-{index}"
        return ["--set", f"wire.key_file={os.path.join(self.keys, name + '.key')}"]

    def start(self, role, index=0, *extra):
        name = f"{role}-{index}"
        self.starts += 1
        log = os.path.join(self.logs, f"{name}.{self.starts}.log")
        cmd = [self.args.binary, "node", "--role", role, "--index", str(index), *extra] + self.common
        if self.keys:
            cmd += self.key_of(role, index)
        if self.args.resume_from:
            cmd += ["--resume-from", self.args.resume_from]
        if self.args.db and role != "learner":
            store = role if role == "shard" or index == 0 else f"broker-{index}"
            cmd += ["--db", os.path.join(self.args.db, f"{store}-{index}" if role == "shard" else store)]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        self.processes[name] = (proc, log)
        return proc

    def stop_all(self, sig=signal.SIGTERM, wait_s=15):
        # Learners, then shards, then brokers, each group once the one before it exited: a
        # stopping shard announces its last durable versions to the broker, whose ledger
        # books those steps lost if it reported first.
        for group in ("learner", "shard", "broker"):
            procs = [proc for name, (proc, _) in self.processes.items() if name.startswith(group)]
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(sig)
            deadline = time.time() + wait_s
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--learners", type=int, default=3)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--standbys", type=int, default=1, help="standby brokers beside the primary (0: none)")
    ap.add_argument("--mode", default="decoupled")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a knob for every node")
    ap.add_argument("--kill", action="append", type=parse_kill, default=[], metavar="LEARNER@SECONDS")
    ap.add_argument("--restart-after", type=float, default=2.0, metavar="SECONDS")
    ap.add_argument("--timeout", type=float, default=600, metavar="SECONDS", help="bound on the whole run")
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "archipelago"))
    ap.add_argument("--db", metavar="DIR", help="keep the brokers' and shards' stores under DIR (broker, broker-I, "
                    "shard-I), for `archipelago replay --db DIR`")
    ap.add_argument("--resume-from", metavar="STORE", help="start the shards (their new stores under --db), the "
                    "learners and the brokers from this store's newest snapshot (`archipelago replay --db DIR save CUT --out STORE`)")
    ap.add_argument("--json", action="store_true", help="print a one-line JSON summary last")
    ap.add_argument("--log-format", choices=["text", "json"], default="text",
                    help="every node's log lines: text, or one JSON object per line for a collector")
    ap.add_argument("--log-level", choices=["debug", "info", "warn", "error"], default="info")
    ap.add_argument("--no-curve", dest="curve", action="store_false",
                    help="plain tcp:// (wire.curve=false); default: CURVE with a keypair per node")
    ap.add_argument("--shared-learner-key", action="store_true",
                    help="one keypair for every learner (it then binds the learner role only, not an index)")
    args = ap.parse_args()
    if args.curve and args.shared_learner_key:
        print("launch.py: warning: one key shared by every learner binds only the role: any learner can "
              "contribute in another's name", file=sys.stderr)
    if args.mode in ("dp", "diloco"):
        args.shards = 1  # one fragment, one shard
    for learner, at in args.kill:
        if not 0 <= learner < args.learners or at < 0:
            ap.error(f"--kill {learner}@{at}: no such learner or a negative time")
    if not os.access(args.binary, os.X_OK):
        ap.error(f"{args.binary} is not an executable (build first, or pass --binary)")

    mesh = Mesh(args)
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(1))
    signal.signal(signal.SIGTERM, lambda *_: interrupted.append(1))
    mesh.start("broker")
    for b in range(1, args.standbys + 1):
        mesh.start("broker", b, "--standby")
    for s in range(args.shards):
        mesh.start("shard", s)
    time.sleep(0.5)
    t0 = time.time()
    for i in range(args.learners):
        mesh.start("learner", i)

    kills = sorted(args.kill, key=lambda k: k[1])
    restarts = []  # (learner, unix time of the restart)
    pending_restarts = []
    killed = 0
    deadline = t0 + args.timeout
    failure = None
    while not interrupted:
        now = time.time()
        if now > deadline:
            failure = f"the mesh did not finish within --timeout {args.timeout:.0f} s"
            break
        while kills and now - t0 >= kills[0][1]:
            learner, _ = kills.pop(0)
            proc, _ = mesh.processes[f"learner-{learner}"]
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                killed += 1
                pending_restarts.append((learner, now + args.restart_after))
        for item in list(pending_restarts):
            if now >= item[1]:
                pending_restarts.remove(item)
                mesh.start("learner", item[0])
                restarts.append((item[0], time.time()))
        for name, (proc, log) in mesh.processes.items():
            if proc.poll() not in (None, 0) and not name.startswith("learner") or \
                    name.startswith("learner") and proc.poll() not in (None, 0, -signal.SIGKILL):
                failure = f"{name} exited with {proc.returncode}; its log: {log}"
        if failure:
            break
        learners_done = all(mesh.processes[f"learner-{i}"][0].poll() == 0 for i in range(args.learners))
        if learners_done and not pending_restarts:
            break
        time.sleep(0.1)
    mesh.stop_all()

    # What the broker that led last saw (a standby's summary holds no ledger unless it led).
    brokers = [last_json(mesh.processes[f"broker-{b}"][1]) or {} for b in range(1 + args.standbys)]
    broker = next((b for b in brokers if b.get("leading")), {})
    learner_reports = [last_json(os.path.join(mesh.logs, f)) for f in sorted(os.listdir(mesh.logs))
                       if f.startswith("learner")]
    learner_reports = [r for r in learner_reports if r]
    seen = {(r["learner"], r["incarnation"]): r for r in broker.get("learners", [])}
    # Learners that finished report their tokens; the broker's ledger must hold exactly those.
    matches = all(seen.get((r["index"], r["incarnation"]), {}).get("processed") == r["tokens"]
                  for r in learner_reports)
    rejoin = []
    started = broker.get("started_unix_ms", 0) / 1000
    for learner, at in restarts:
        later = [r for (i, _), r in seen.items() if i == learner and started + r["joined_s"] >= at - 0.5]
        merged = [r["first_merged_s"] for r in later if r["first_merged_s"] >= 0]
        rejoin.append(round(started + min(merged) - at, 2) if merged else None)

    # mesh.global_eval_every: learner 0's last evaluation of the global model it held (its newest incarnation's).
    held = [r for r in learner_reports if r.get("index") == 0 and "global_eval" in r.get("status", {})]
    global_eval = max(held, key=lambda r: r["incarnation"])["status"]["global_eval"] if held else None

    ledger = broker.get("ledger", {})
    print(f"mesh of {args.learners} learners, {args.shards} shards ({args.mode}); logs in {mesh.logs}")
    if global_eval:
        print(f"learner 0's last evaluation of the global model: {global_eval['loss']:.4f} nats/byte at its step "
              f"{global_eval['step']} (replay eval {','.join(map(str, global_eval['versions']))})")
    print(f"broker/{broker.get('index', 0)}: {broker.get('rounds', 0)} rounds, uptime {100 * broker.get('uptime', 0):.1f} %; "
          f"ledger {ledger} balanced={broker.get('ledger_balanced')} matches learners={matches}")
    if restarts:
        print(f"{killed} learner(s) killed with SIGKILL; restart to first merged contribution: {rejoin} s")
    if failure:
        print(f"launch: {failure}", file=sys.stderr)
    if args.json:
        print(json.dumps({"command": "launch", "mode": args.mode, "learners": args.learners, "shards": args.shards,
                          "rounds": broker.get("rounds", 0), "uptime": broker.get("uptime", 0),
                          "ledger": ledger, "ledger_balanced": broker.get("ledger_balanced", False),
                          "ledger_matches_learners": matches, "kills": killed, "rejoin_s": rejoin,
                          "global_eval": global_eval, "failure": failure, "logs": mesh.logs, "db": args.db}))
    return 1 if failure or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
