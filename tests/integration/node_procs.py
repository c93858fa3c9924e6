"""The `archipelago node` processes an integration test starts, each with its log; a
failure ends them all and shows each log's tail."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROCS = {}  # name -> (Popen, log path)
# What a status poll may raise while a node starts or restarts.
NOT_YET = (urllib.error.URLError, ConnectionError, ValueError)


def fail(message):
    for name, (proc, log) in PROCS.items():
        if proc.poll() is None:
            proc.kill()
        with open(log) as f:
            sys.stderr.write(f"--- {name} ---\n{f.read()[-3000:]}\n")
    sys.exit(f"FAIL: {message}")


def check(condition, message):
    if not condition:
        fail(message)


def start(binary, work, name, args):
    """`archipelago node ARGS` as `name`, its output in WORK/NAME.log."""
    log = os.path.join(work, f"{name}.log")
    with open(log, "w") as out:
        PROCS[name] = (subprocess.Popen([binary, "node", *args], stdout=out, stderr=subprocess.STDOUT), log)


def status(port):
    """A node's GET /status on its metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
        return json.loads(r.read())


def wait_for(what, predicate, bound_s, not_yet=NOT_YET):
    """predicate()'s first true value, polled every 0.5 s for at most bound_s (errors in
    `not_yet` count as not yet); else the test fails."""
    deadline = time.time() + bound_s
    while time.time() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except not_yet:
            pass
        time.sleep(0.5)
    fail(f"{what}: not within {bound_s} s")
