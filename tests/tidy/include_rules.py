#!/usr/bin/env python3
"""Tidy: the layers of the code, checked on every #include.

Dependencies point down: core <- transport, storage <- the roles (learner,
sync_broker, parameter_shard, chaos_monkey) <- node <- tools. A role never
includes another role or node/; a library under tools/ only what lies below it.

Purity is decided by CMake library membership, as the build decides it: every
source of a role's pure library (archipelago_library(... actors/<role> ...) in
CMakeLists.txt: its state core, wire layer and whatever else it compiles) and
every header in the role's folder that is not an actor shell's is pure: no CAF,
no ZeroMQ, no sockets, no threads, no clock read. Only the sources of the actor
libraries (archipelago_actor_library(...)), their headers, the CAF precompiled
header, node/ and tools/ use CAF. A source file in a role's folder that no
library lists is itself a violation (it would escape the check). EXEMPT names
the few pure files allowed one kind of impurity, each with its reason; an
exemption that no longer matches anything fails, so the list cannot go stale.

Usage: include_rules.py SOURCE_DIR
Checks the tree, prints every violation as FILE:LINE: what is wrong, and exits 1
if there is one. Before that it checks itself: a small tree with an upward, a
sideways and two impure includes (one in a pure file whose name says nothing)
must fail with exactly those four.
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
IMPURE_INCLUDES = re.compile(r'#\s*include\s*[<"](caf/|zmq|transport/transport\.hpp|transport/actor_bridge\.hpp|thread>)')
CLOCK_READS = re.compile(r"\b(steady_clock|system_clock|high_resolution_clock)::now\b|\bwall_clock_ns\s*\(|clock_gettime\s*\(")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
LIBRARY_CALL = re.compile(r"\b(archipelago_library|archipelago_actor_library|add_library)\s*\(([^)]*)\)")
SOURCE = (".hpp", ".cpp", ".h")
# Pure files allowed one kind of impurity ("clock" or "include"), and why.
EXEMPT = {
    ("actors/learner/model/gpt.cpp", "clock"):
        "the step profiler's phase timers (train --profile): they time kernels and never change a result",
    ("actors/learner/model/cpu_peak.cpp", "clock"):
        "measures the CPU's peak FLOP rate for bench compute's ratios; no training state depends on it",
}


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


def library_kinds(root):
    """What CMakeLists.txt makes of each source: 'pure' (a role's pure library) or
    'shell' (an actor library or the CAF precompiled header); other sources are absent."""
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        text = re.sub(r"(^|\s)#[^\n]*", r"\1", f.read())  # comments
    kinds = {}
    for call, args in LIBRARY_CALL.findall(text):
        words = args.split()
        sources = [w for w in words if w.endswith(SOURCE)]
        if call == "archipelago_library" and len(words) > 1 and words[1].split("/")[0] == "actors" \
                and words[1].split("/")[-1] in ROLES:
            kind = "pure"
        elif call == "archipelago_actor_library" or (call == "add_library" and words[0] == "archipelago_caf_pch"):
            kind = "shell"
        else:
            continue
        for src in sources:
            kinds[src] = kind
    return kinds


def file_kind(rel, kinds):
    """'pure', 'shell' or None (neither: core, transport, storage, node, tools)."""
    if rel in kinds:
        return kinds[rel]
    stem = os.path.splitext(rel)[0]
    if rel.endswith((".hpp", ".h")) and kinds.get(stem + ".cpp") == "shell":
        return "shell"  # an actor shell's own header
    if component(rel) in ROLES:
        return "pure"   # a role's header: inside its pure library's include root
    return None


def check_file(root, rel, kinds, exempted):
    """Every violation in one file, as 'FILE:LINE: message'."""
    comp = component(rel)
    if comp is None:
        return []
    out = []
    kind = file_kind(rel, kinds)
    if comp in ROLES and rel.endswith(".cpp") and rel not in kinds:
        out.append(f"{rel}:1: a source of role {comp} that no library of CMakeLists.txt lists: its purity is unchecked")
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        where = f"{rel}:{n}"
        before = len(out)
        if m:
            kind_of_include, path = m.groups()
            if kind_of_include == "<":
                if path.startswith("caf/") and kind != "shell" and comp != "node" and not comp.startswith("tools/"):
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
        if kind == "pure" and len(out) == before:
            impurity = "include" if IMPURE_INCLUDES.search(line) else "clock" if CLOCK_READS.search(line) else None
            if impurity and (rel, impurity) in EXEMPT:
                exempted.add((rel, impurity))
            elif impurity:
                out.append(f"{where}: a file of {comp}'s pure library must be pure (no CAF, ZeroMQ, sockets, threads "
                           f"or clock reads): {line.strip()}")
    return out


def check_tree(root):
    """(violations, pure files checked, exemptions used)."""
    kinds = library_kinds(root)
    out, pure, exempted = [], 0, set()
    for rel in sorted(kinds):
        if not os.path.exists(os.path.join(root, rel)):
            out.append(f"CMakeLists.txt: {rel} is listed but does not exist")
    for top in ("actors", "storage", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if name.endswith(SOURCE):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    pure += file_kind(rel, kinds) == "pure"
                    out += check_file(root, rel, kinds, exempted)
    return sorted(out), pure, exempted


def self_test():
    """The checker fails on an upward, a sideways and two impure includes -- one in a pure
    library's file whose name says nothing of it -- and only on them."""
    files = {
        "CMakeLists.txt": "archipelago_library(archipelago_learner actors/learner SOURCES\n"
                          "  actors/learner/learner_wire.cpp actors/learner/ledger.cpp)\n"
                          "archipelago_library(archipelago_sync_broker actors/sync_broker SOURCES\n"
                          "  actors/sync_broker/up.cpp actors/sync_broker/sideways.cpp)  # a comment (with parentheses)\n"
                          "archipelago_actor_library(archipelago_learner_actor actors/learner/learner_actor.cpp)\n",
        "actors/core/ok.hpp": '#include "core/ids.hpp"\n',
        "actors/sync_broker/up.cpp": '#include "sync_broker/broker_core.hpp"\n#include "node/local_mesh.hpp"\n',
        "actors/sync_broker/sideways.cpp": '#include "parameter_shard/shard_core.hpp"\n',
        "actors/learner/learner_wire.cpp": '#include "transport/codec.hpp"\n#include <caf/all.hpp>\n',
        "actors/learner/ledger.cpp": '#include <thread>\n',
        "actors/learner/learner_actor.cpp": '#include <caf/all.hpp>\n#include "learner/learner_wire.hpp"\n',
        "actors/learner/learner_actor.hpp": '#include <caf/all.hpp>\n',
        "tools/drill/ok.cpp": '#include "node/local_mesh.hpp"\n',
    }
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in files.items():
            os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        found, pure, _ = check_tree(tmp)
    expected = ["actors/learner/ledger.cpp:1", "actors/learner/learner_wire.cpp:2", "actors/sync_broker/sideways.cpp:1",
                "actors/sync_broker/up.cpp:2"]
    got = sorted(v.split(": ")[0] for v in found)
    if got != sorted(expected) or pure != 4 or "points up" not in " ".join(found) or "sideways" not in " ".join(found):
        print("include_rules.py self-test failed: expected violations at", expected, "and 4 pure files, got",
              pure, "and:", *found, sep="\n  ")
        sys.exit(1)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    self_test()
    violations, pure, exempted = check_tree(sys.argv[1])
    for rel, impurity in sorted(EXEMPT):
        if (rel, impurity) in exempted:
            print(f"exempt: {rel} ({impurity}): {EXEMPT[rel, impurity]}")
        else:
            violations.append(f"{rel}: an exemption for '{impurity}' that nothing uses: remove it from EXEMPT")
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} violation(s) of the layers (see tests/tidy/include_rules.py)")
        sys.exit(1)
    print(f"ok: every #include points down the layers; {pure} files of the roles' pure libraries are pure "
          f"({len(exempted)} exemption(s) above)")


main()
