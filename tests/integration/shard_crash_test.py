#!/usr/bin/env python3
"""Integration, crash consistency: a parameter shard process writing snapshots
to RocksDB is killed with SIGKILL at random points, KILLS times, and restarted
on the same directory while the broker and the learners go on.

After every kill (before the restart) the shard's store must be consistent
(`replay check`: every manifest readable, its fragment states present and
checksum-valid, versions monotonic), its head must not go back, and no fragment
version the broker saw committed (its tape) may be missing. At the end the
restarted shard has moved on from its snapshot, and `replay verify` re-applies
every recorded merge, across all the crashes, bit for bit.

Replay follows the live mesh meanwhile, over both stores as one view (`replay
--db SHARD --db BROKER`, secondary instances caught up at open): before every
kill, while the shard writes, the newest complete cut the tape names is exported
(`export newest`: every fragment read and checked against its manifest's
checksum), and its fragment versions must be the ones the broker's tape names up
to that cut (checked after the kill against the tape read then).

Environment: ARCHIPELAGO (the binary), SHARD_KILLS (default 20), SHARD_CRASH_SEED.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports  # noqa: E402  (deploy/launch.py: the mesh launcher)


class Failure(Exception):
    pass


def last_json(text):
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def replay(binary, db, *args, live=False):
    """`live`: another process is writing the store. `replay` reads it as a RocksDB
    secondary instance, which RocksDB supports beside a live writer; replay itself
    retries the moments while the writer recovers, so the test does not."""
    out = subprocess.run([binary, "replay", "--db", db, *args, "--json"], capture_output=True, text=True,
                         timeout=120)
    summary = last_json(out.stdout)
    if summary is not None:
        return out.returncode, summary, out.stderr
    raise Failure(f"replay {' '.join(args)} on {db}{' (live writer)' if live else ''}: exit {out.returncode}, "
                  f"no summary\n{out.stdout}\n{out.stderr}")


def tape_versions(tape, seq):
    """Each fragment's version after tape record `seq`: the newest the tape names by then (0: none)."""
    versions = {}
    for r in tape["rounds"]:
        if r["sequence"] <= seq:
            versions[r["fragment"]] = max(versions.get(r["fragment"], 0), r["version"])
    return versions


def follow(binary, dbs, out, cut):
    """Replay over the mesh's stores beside the live writers: export cut `cut` (newest:
    the newest complete cut the tape names), every fragment checked against its
    manifest's checksum. Returns (cut name, versions)."""
    shutil.rmtree(out, ignore_errors=True)
    code, exported, stderr = replay(binary, dbs[0], *[x for db in dbs[1:] for x in ("--db", db)], "export", cut,
                                    "--out", out, live=True)
    if code != 0:
        raise Failure(f"replay export {cut} over the live mesh: exit {code}\n{stderr}")
    return exported["cut"], exported["versions"]


def main():
    binary = os.environ["ARCHIPELAGO"]
    kills = int(os.environ.get("SHARD_KILLS", "20"))
    seed = int(os.environ.get("SHARD_CRASH_SEED", "1"))
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="archipelago-shard-crash-")
    shard_db, broker_db = os.path.join(work, "shard"), os.path.join(work, "broker")
    ports = free_ports(2)
    common = ["--broker", f"tcp://127.0.0.1:{ports[0]}", "--shards", f"tcp://127.0.0.1:{ports[1]}",
              "--learners", "2", "--steps", "1000000", "--set", "mesh.shards=1", "--set", "wire.curve=false",
              "--set", "storage.keep_last=16", "--set", "storage.keep_every=50",
              "--set", "data.synthetic_bytes=1048576", "--json"]  # a small corpus: quick restarts
    logs = []

    def start(role, index, *extra):
        log = open(os.path.join(work, f"{role}-{index}.{len(logs)}.log"), "w+")
        logs.append(log)
        return subprocess.Popen([binary, "node", "--role", role, "--index", str(index), *common, *extra],
                                stdout=log, stderr=subprocess.STDOUT), log

    processes = []
    heads = {}
    started = time.time()
    try:
        broker, _ = start("broker", 0, "--db", broker_db)
        processes.append(broker)
        shard, shard_log = start("shard", 0, "--db", shard_db, "--record-contributions")
        time.sleep(0.5)
        for i in range(2):
            processes.append(start("learner", i)[0])
        # The mesh is merging: the broker's tape holds a round (a generous bound: a loaded machine).
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(broker_db, "CURRENT")) or \
                not replay(binary, broker_db, "tape", live=True)[1]["rounds"]:
            if time.time() > deadline:
                raise Failure("the mesh merged nothing in 120 s")
            time.sleep(0.5)
        committed_seen = 0
        verified_cuts = 0
        wrote_before_kill = 0  # kills that hit an incarnation after it had committed new versions
        head_at_restart = 0
        restarted_at = time.time()
        back_in = []  # restart → its first new committed version, seconds
        followed = []  # (cut, its versions) read by replay over the live mesh, to check against the tape
        export_dir = os.path.join(work, "export")
        for k in range(1, kills + 1):
            # Mostly while it writes: after the incarnation committed something new;
            # otherwise at any point, start-up and recovery included.
            if rng.random() < 0.75:
                deadline = time.time() + 20
                while time.time() < deadline and shard.poll() is None:
                    _, listed, _ = replay(binary, shard_db, "list", live=True)
                    if listed["rows"] and listed["rows"][-1]["version"] > head_at_restart:
                        if k > 1:
                            back_in.append(time.time() - restarted_at)
                        break
                    time.sleep(0.2)
                time.sleep(rng.uniform(0.0, 0.8))
            else:
                time.sleep(rng.uniform(0.1, 1.5))
            followed.append(follow(binary, [shard_db, broker_db], export_dir, "newest"))  # while the shard writes
            if shard.poll() is not None:
                raise Failure(f"the shard exited by itself ({shard.returncode}) before kill {k}; log {shard_log.name}")
            shard.send_signal(signal.SIGKILL)
            shard.wait()
            code, check, stderr = replay(binary, shard_db, "check")
            if code != 0 or not check["ok"]:
                raise Failure(f"after kill {k}: the store is not consistent: {check['errors']}\n{stderr}")
            now = {int(p): v for p, v in check["head_versions"].items()}
            wrote_before_kill += sum(now.values()) > sum(heads.values())
            for p, v in heads.items():
                if now.get(p, -1) < v:
                    raise Failure(f"after kill {k}: fragment {p} went back from version {v} to {now.get(p)}")
            heads = now
            # Read-only, beside the running broker: what it has recorded as committed so far.
            _, tape, _ = replay(binary, broker_db, "tape", live=True)
            committed = {}
            for r in tape["rounds"]:
                committed[r["fragment"]] = max(committed.get(r["fragment"], 0), r["version"])
            missing = {p: v for p, v in committed.items() if heads.get(p, -1) < v}
            if missing:
                raise Failure(f"after kill {k}: versions the broker saw committed are missing: {missing} "
                              f"(store heads {heads})")
            committed_seen = max(committed_seen, len(tape["rounds"]))
            for cut, versions in followed:
                said = tape_versions(tape, int(cut))
                if any(v != said.get(p, 0) for p, v in enumerate(versions)):
                    raise Failure(f"after kill {k}: cut {cut} as replay read it beside the live mesh {versions} "
                                  f"differs from the broker's tape {said}")
            verified_cuts += len(followed)
            followed = []
            head_at_restart = check["head"]
            shard, shard_log = start("shard", 0, "--db", shard_db, "--record-contributions")
            restarted_at = time.time()
        # The last incarnation resumes and merges again (a generous bound: a loaded machine).
        deadline = time.time() + 90
        while time.time() < deadline and shard.poll() is None:
            _, listed, _ = replay(binary, shard_db, "list", live=True)
            if listed["rows"] and listed["rows"][-1]["version"] > head_at_restart:
                break
            time.sleep(0.5)
        for p in processes[1:]:
            p.send_signal(signal.SIGTERM)
        for p in processes[1:]:
            p.wait(timeout=60)
        shard.send_signal(signal.SIGTERM)
        shard.wait(timeout=60)
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=60)
        shard_log.seek(0)
        final = last_json(shard_log.read())
        if shard.returncode != 0 or not final:
            raise Failure(f"the last shard incarnation exited {shard.returncode}; log {shard_log.name}")
        if final["resumed_version"] == 0 or final["mesh_version"] <= final["resumed_version"]:
            raise Failure(f"the last shard incarnation did not resume and move on: {final}")
        code, check, stderr = replay(binary, shard_db, "check")
        if code != 0:
            raise Failure(f"final check: {check['errors']}\n{stderr}")
        code, verify, stderr = replay(binary, shard_db, "verify")
        if code != 0 or not verify["ok"]:
            raise Failure(f"replay verify across {kills} crashes: {verify}\n{stderr}")
        print(f"ok: {kills} SIGKILLs of the shard in {time.time() - started:.0f} s (seed {seed}); store consistent "
              f"after each ({wrote_before_kill} kills after the incarnation had committed new versions); "
              f"restart to first new commit: median {sorted(back_in)[len(back_in) // 2] if back_in else 0:.1f} s, "
              f"max {max(back_in, default=0):.1f} s (polled every 0.2 s); tape rounds {committed_seen}; last incarnation resumed at mesh version "
              f"{final['resumed_version']} and reached {final['mesh_version']}; {verified_cuts} cuts exported by replay "
              f"beside the live mesh, checksums valid, versions as the tape says; verify replayed "
              f"{verify['merges']} merges, {verify['compared']} versions bit for bit")
    except Failure as f:
        print(f"FAIL (seed {seed}, logs in {work}): {f}", flush=True)
        sys.exit(1)
    finally:
        for p in processes + [shard] if 'shard' in dir() else processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
