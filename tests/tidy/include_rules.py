#!/usr/bin/env python3
"""Tidy: the layers of the code, checked on every #include.

Dependencies point down: core <- transport, storage <- the roles (learner,
sync_broker, parameter_shard, chaos_monkey) <- node <- tools. A role never
includes another role or node/; a library under tools/ only what lies below it.
Within a role, the state core and the wire layer (*_core.*, *_wire*.*) are
pure: no CAF, no ZeroMQ, no sockets, no clock read; only actor shells
(*_actor.*), the transport's CAF bridge, node/ and tools/ use CAF.

Usage: include_rules.py SOURCE_DIR
Checks the tree, prints every violation as FILE:LINE: what is wrong, and exits 1
if there is one. Before that it checks itself: a small tree with an upward, a
sideways and an impure include must fail with exactly those three.
"""

import os
import re
import sys
import tempfile

ROLES = {"learner", "sync_broker", "parameter_shard", "chaos_monkey"}
BELOW_ROLES = {"core", "transport", "storage", "schemas"}
BELOW_NODE = BELOW_ROLES | ROLES | {"node"}
# What each component may include (besides itself), by the first folder of a quoted include.
ALLOWED = {
    "core": set(),
    "transport": {"core", "schemas"},
    "storage": {"core", "schemas"},
    **{r: BELOW_ROLES for r in ROLES},
    "node": BELOW_NODE,
    "tools/simulate": {"core"},
    "tools/drill": BELOW_NODE,
    "tools/report": BELOW_NODE | {"drill"},
    "tools/bench": BELOW_NODE | {"drill", "report"},
    "tools/replay": BELOW_NODE,
    "tools/python": BELOW_NODE,
    "tools/archipelago": BELOW_NODE | {"drill", "report", "simulate", "bench", "replay"},
}
# A quoted include's first folder → the component it belongs to.
OWNER = {**{c: c for c in BELOW_NODE}, **{t: "tools/" + t for t in ("drill", "report", "simulate", "bench", "replay")}}
CAF_FILES = re.compile(r"(_actor\.(hpp|cpp)|actor_bridge\.(hpp|cpp)|caf_pch\.cpp)$")
PURE_FILES = re.compile(r"_(core|wire)[a-z_]*\.(hpp|cpp)$")
IMPURE_INCLUDES = re.compile(r'#\s*include\s*[<"](caf/|zmq|transport/transport\.hpp|transport/actor_bridge\.hpp|thread>)')
CLOCK_READS = re.compile(r"\b(steady_clock|system_clock|high_resolution_clock)::now\b|\bwall_clock_ns\s*\(|clock_gettime\s*\(")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def component(rel):
    """The component a source file belongs to, or None for files outside the layers."""
    parts = rel.split("/")
    if parts[0] == "actors" and len(parts) > 2:
        return parts[1]
    if parts[0] == "storage":
        return "storage"
    if parts[0] == "tools" and len(parts) > 2 and "tools/" + parts[1] in ALLOWED:
        return "tools/" + parts[1]
    return None


def check_file(root, rel):
    """Every violation in one file, as 'FILE:LINE: message'."""
    comp = component(rel)
    if comp is None:
        return []
    out = []
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    pure = comp in ROLES and PURE_FILES.search(rel)
    for n, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        where = f"{rel}:{n}"
        before = len(out)
        if m:
            kind, path = m.groups()
            if kind == "<":
                if path.startswith("caf/") and not CAF_FILES.search(rel) and comp not in ("node",) and not comp.startswith("tools/"):
                    out.append(f"{where}: <{path}>: only actor shells, the transport's CAF bridge, node/ and tools/ use CAF")
            elif ".." in path.split("/"):
                out.append(f'{where}: "{path}": a relative path out of the folder; include by the layer\'s folder')
            elif "/" not in path:
                if not os.path.exists(os.path.join(root, os.path.dirname(rel), path)):
                    out.append(f'{where}: "{path}" is not beside this file; include other layers by their folder')
            else:
                first = path.split("/")[0]
                owner = OWNER.get(first)
                if owner is None:
                    out.append(f'{where}: "{path}": {first}/ is no layer of the project')
                elif owner != comp and first not in ALLOWED[comp] and owner not in ALLOWED[comp]:
                    direction = "sideways (another role)" if comp in ROLES and owner in ROLES else "up"
                    allowed = ", ".join(sorted(ALLOWED[comp])) or "nothing but itself"
                    out.append(f'{where}: "{path}" points {direction}: {comp} may include {allowed}')
        if pure and len(out) == before and (IMPURE_INCLUDES.search(line) or CLOCK_READS.search(line)):
            out.append(f"{where}: a state core or wire layer must be pure (no CAF, ZeroMQ, sockets, threads or clock "
                       f"reads): {line.strip()}")
    return out


def check_tree(root):
    out = []
    for top in ("actors", "storage", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if name.endswith((".hpp", ".cpp", ".h")):
                    out += check_file(root, os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def self_test():
    """The checker fails on an upward, a sideways and an impure include — and only on them."""
    files = {
        "actors/core/ok.hpp": '#include "core/ids.hpp"\n',
        "actors/sync_broker/up.cpp": '#include "sync_broker/broker_core.hpp"\n#include "node/local_mesh.hpp"\n',
        "actors/sync_broker/sideways.cpp": '#include "parameter_shard/shard_core.hpp"\n',
        "actors/learner/learner_wire.cpp": '#include "transport/codec.hpp"\n#include <caf/all.hpp>\n',
        "actors/learner/learner_actor.cpp": '#include <caf/all.hpp>\n#include "learner/learner_wire.hpp"\n',
        "tools/drill/ok.cpp": '#include "node/local_mesh.hpp"\n',
    }
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in files.items():
            os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        found = check_tree(tmp)
    expected = ["actors/learner/learner_wire.cpp:2", "actors/sync_broker/sideways.cpp:1", "actors/sync_broker/up.cpp:2"]
    got = sorted(v.split(": ")[0] for v in found)
    if got != expected or "points up" not in " ".join(found) or "sideways" not in " ".join(found):
        print("include_rules.py self-test failed: expected violations at", expected, "got:", *found, sep="\n  ")
        sys.exit(1)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    self_test()
    violations = check_tree(sys.argv[1])
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} include(s) break the layers (see tests/tidy/include_rules.py)")
        sys.exit(1)
    print("ok: every #include points down the layers; state cores and wire layers are pure")


main()
