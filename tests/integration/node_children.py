"""The `archipelago node` processes a drill started, as /proc shows them, and their /status."""

import json
import os
import urllib.request


def children_of(pid):
    """pid -> (node name, state letter, metrics port) of every live `node` process whose parent is
    `pid`. Names as the drill's: broker (the primary), broker-I (a standby), shard-I, learner-I."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) != pid or "node" not in argv:
            continue
        role, index = argv[argv.index("--role") + 1], argv[argv.index("--index") + 1]
        name = ("broker" if index == "0" else f"broker-{index}") if role == "broker" else f"{role}-{index}"
        out[int(entry)] = (name, fields[0], int(argv[argv.index("--metrics-port") + 1]))
    return out


def alive(pid):
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def node_status(port):
    """A node's GET /status on its metrics port; None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=1) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None
