#!/usr/bin/env python3
"""Integration, the brokers' lease in etcd (mesh.etcd): a real etcd (Debian's
etcd-server, on loopback, its data on tmpfs) and a mesh of `archipelago node`
processes — the primary broker and a standby, two shards, three learners — with the
default liveness settings (heartbeat 1 s, dead after 3 s: a lease of 3 s).

1. The primary leads in the epoch etcd records (PREFIX/leader and PREFIX/epoch).
2. The primary is paused (SIGSTOP): it cannot renew its lease. The standby leads only
   once etcd has expired it, in an epoch above the primary's; when the primary resumes
   it finds its lease gone and steps down — it never closed a round after its lease's
   end (the tapes: per fragment, versions grow with the epoch).
3. The standby's host is lost (SIGKILL, store deleted): the primary leads again, in a
   newer epoch still.
4. etcd itself is killed while the primary leads: the primary cannot renew, so it
   stops leading when its lease would have ended (no broker leads without etcd); etcd
   restarts on its data, a broker leads again in an epoch above every earlier one.
5. The learners leave on SIGTERM, never restarted; the last leader's ledger balances and holds
   exactly the tokens each learner reports.

Environment: ARCHIPELAGO (the binary), LEASE_STEPS (default 3000).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker_crash_test import Failure, tape  # noqa: E402
from broker_standby_test import Mesh, check_versions_grow_with_epoch, wait_until  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports  # noqa: E402

import broker_standby_test  # noqa: E402
broker_standby_test.RUN_BOUND_S = 260.0
TAKEOVER_BOUND_S = 20.0  # the lease's 3 s + a campaign each second, on a loaded 2-core machine


class Etcd:
    def __init__(self, work):
        if not shutil.which("etcd"):
            raise Failure("etcd is not installed (Debian's etcd-server; tools/setup.sh test installs it)")
        self.client, self.peer = free_ports(2)
        self.data = tempfile.mkdtemp(prefix="archipelago-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.log = os.path.join(work, "etcd.log")
        self.url = f"http://127.0.0.1:{self.client}"
        self.proc = None

    def start(self):
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                ["etcd", "--name", "t", "--data-dir", self.data, "--listen-client-urls", self.url,
                 "--advertise-client-urls", self.url, "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
                 "--initial-cluster", f"t=http://127.0.0.1:{self.peer}"], stdout=log, stderr=subprocess.STDOUT)
        wait_until("etcd answering", 30, lambda: self.keys() is not None, lambda: None)

    def keys(self):
        """The mesh's keys: {"leader": epoch or None, "epoch": epoch or None}; None if etcd does not answer."""
        try:
            out = subprocess.run(["etcdctl", "--endpoints", self.url, "--command-timeout=2s", "get", "--prefix",
                                  "archipelago/", "-w", "json"], capture_output=True, text=True, timeout=5)
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0:
            return None
        import base64
        found = {"leader": None, "epoch": None}
        for kv in json.loads(out.stdout).get("kvs", []):
            key = base64.b64decode(kv["key"]).decode()
            found[key.rsplit("/", 1)[1]] = int(base64.b64decode(kv["value"]))
        return found

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def leader_epoch(etcd):
    k = etcd.keys()
    return k["leader"] if k else None


def main():
    binary = os.environ["ARCHIPELAGO"]
    steps = int(os.environ.get("LEASE_STEPS", "3000"))
    work = tempfile.mkdtemp(prefix="archipelago-lease-")
    etcd = Etcd(work)
    mesh = None
    try:
        etcd.start()  # bound before the mesh picks its free ports
        mesh = Mesh(binary, work, steps)
        mesh.common += ["--set", f"mesh.etcd={etcd.url}"]
        mesh.start_all()
        both = lambda: mesh.alive("primary", "standby")  # noqa: E731

        # 1. The primary leads in etcd's epoch.
        first = wait_until("the primary's first committed round", 60,
                           lambda: [r for r in tape(binary, mesh.db["primary"]) if r["broker"] == 0], both)
        epoch1 = first[0]["epoch"]
        keys = etcd.keys()
        if keys != {"leader": epoch1, "epoch": epoch1}:
            raise Failure(f"etcd records {keys}, the primary leads in epoch {epoch1}")
        time.sleep(1.5)  # a ledger copy or two on the standby

        # 2. The primary paused: the standby leads only after etcd expired the lease.
        primary, _ = mesh.procs["primary"]
        primary.send_signal(signal.SIGSTOP)
        paused_at = time.time()
        epoch2 = wait_until("the standby leading in etcd", TAKEOVER_BOUND_S,
                            lambda: (leader_epoch(etcd) or 0) > epoch1 and leader_epoch(etcd), lambda: mesh.alive("standby"))
        lease_takeover_s = time.time() - paused_at
        if epoch2 & 0xFF != 1:
            raise Failure(f"etcd's leader epoch {epoch2} does not name the standby (broker 1)")
        wait_until("a round committed by the standby", TAKEOVER_BOUND_S,
                   lambda: [r for r in tape(binary, mesh.db["standby"]) if r["epoch"] == epoch2], lambda: mesh.alive("standby"))
        round_takeover_s = time.time() - paused_at
        primary.send_signal(signal.SIGCONT)
        wait_until("the resumed primary stepping down", 15, lambda: "stepping down" in mesh.log("primary"), both)

        # 3. The standby's host lost: the primary leads again, newer still.
        standby, _ = mesh.procs["standby"]
        killed_at = time.time()
        standby.send_signal(signal.SIGKILL)
        standby.wait()
        shutil.rmtree(mesh.db["standby"])
        epoch3 = wait_until("the primary leading again", TAKEOVER_BOUND_S,
                            lambda: (leader_epoch(etcd) or 0) > epoch2 and leader_epoch(etcd), lambda: mesh.alive("primary"))
        kill_lead_s = time.time() - killed_at
        wait_until("a round committed by the primary in its new epoch", TAKEOVER_BOUND_S,
                   lambda: [r for r in tape(binary, mesh.db["primary"]) if r["epoch"] == epoch3], lambda: mesh.alive("primary"))
        kill_takeover_s = time.time() - killed_at

        # 4. etcd lost while the primary leads: it stops leading when its lease would have ended.
        step_downs = mesh.log("primary").count("is no longer held")
        etcd.kill()
        etcd_lost_at = time.time()
        wait_until("the primary stepping down without etcd", TAKEOVER_BOUND_S,
                   lambda: mesh.log("primary").count("is no longer held") > step_downs, lambda: mesh.alive("primary"))
        stepped_down_s = time.time() - etcd_lost_at
        time.sleep(2)  # the store's writer queue drains what was closed before
        rounds_before = tape(binary, mesh.db["primary"])
        time.sleep(4)
        rounds_after = tape(binary, mesh.db["primary"])
        if len(rounds_after) != len(rounds_before):
            raise Failure(f"the primary closed rounds without its lease: {rounds_after[len(rounds_before):][:3]}")
        etcd.start()
        epoch4 = wait_until("a broker leading again once etcd is back", 30,
                            lambda: (leader_epoch(etcd) or 0) > epoch3 and leader_epoch(etcd), lambda: mesh.alive("primary"))

        # 5. The learners leave under it, once it committed a round.
        wait_until("a round committed in the epoch after etcd's return", TAKEOVER_BOUND_S,
                   lambda: [r for r in tape(binary, mesh.db["primary"]) if r["epoch"] == epoch4], lambda: mesh.alive("primary"))
        final = mesh.finish(["primary"])
        keys = etcd.keys()
        if keys["leader"] is not None or keys["epoch"] != epoch4:
            raise Failure(f"after a clean stop etcd should hold no leader and epoch {epoch4}: {keys}")

        # Per fragment, versions grow with the epoch on the primary's tape (its own rounds, and the
        # standby's that it was sent while it followed: those closed while it was paused are not
        # re-sent, so the standby's epoch may be missing there; stage 2 saw it on the standby's tape).
        seen = {}
        for r in tape(binary, mesh.db["primary"]):
            seen[(r["fragment"], r["version"])] = r["epoch"]
        check_versions_grow_with_epoch(seen, "two brokers led at once")
        epochs = sorted(set(seen.values()))
        if not {epoch1, epoch3, epoch4} <= set(epochs):
            raise Failure(f"the primary's tape lacks an epoch of {epoch1, epoch3, epoch4}: {epochs}")
        ledger = final["ledger"]
        print(f"ok: with etcd's lease (3 s): primary paused → the standby led {lease_takeover_s:.1f} s later, committed "
              f"a round at {round_takeover_s:.1f} s, and the resumed primary stepped down; standby SIGKILLed and its "
              f"store deleted → the primary led again after {kill_lead_s:.1f} s (a round at {kill_takeover_s:.1f} s); etcd killed → the primary stopped "
              f"leading {stepped_down_s:.1f} s later and led again once etcd was back; epochs {epoch1} < {epoch2} < "
              f"{epoch3} < {epoch4} allocated by etcd, versions monotonic in epoch; ledger merged {ledger['merged']}, "
              f"lost {ledger['lost']} of {ledger['processed']} tokens, balanced, equal to the learners' counts")
    except Failure as e:
        print(f"FAIL: {e}\nlogs in {work}")
        sys.exit(1)
    finally:
        if mesh:
            mesh.stop_all()
        etcd.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
