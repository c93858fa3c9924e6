#!/usr/bin/env python3
"""The documentation's tests (ctest docs/*).

    docs_test.py reference BINARY   docs/reference/ is what tools/docs/reference.py generates now
    docs_test.py timeless           no date, load average, clock time or "this machine" outside docs/benchmarks/
    docs_test.py links              every relative link and anchor of every page resolves, and every
                                    page and section the sources cite exists
    docs_test.py runnable BINARY    every ```sh runnable block of docs/start.md and docs/guides/ runs
    docs_test.py commands BINARY    every `archipelago ...` command a page shows names a subcommand, flags
                                    and knobs the binary has

Each first proves on planted input that it can fail.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "docs"))
import reference  # noqa: E402


def pages():
    """Every Markdown page of the project's own documentation (not build trees or the fuzz corpus)."""
    out = []
    for top in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md"):
        if os.path.exists(os.path.join(ROOT, top)):
            out.append(top)
    for folder in ("docs", "deploy", "schemas", "storage", "tools"):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            out += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in files if f.endswith(".md")]
    return sorted(out)


def fail(msg):
    print(msg, file=sys.stderr)
    return 1


# ---- reference -------------------------------------------------------------------

def check_reference(binary):
    with tempfile.TemporaryDirectory() as tmp:
        fresh = os.path.join(tmp, "fresh")
        reference.generate(binary, fresh)
        # It can fail: a committed page that differs by one line is reported.
        planted = os.path.join(tmp, "planted")
        shutil.copytree(fresh, planted)
        with open(os.path.join(planted, "knobs.md"), "a", encoding="utf-8") as f:
            f.write("| `planted.knob` | integer | `0` | [0, 1] | planted |\n")
        with open(os.devnull, "w") as quiet:
            saved, sys.stdout, sys.stderr = (sys.stdout, sys.stderr), quiet, quiet
            try:
                caught = not reference.compare(fresh, planted)
            finally:
                sys.stdout, sys.stderr = saved
        if not caught:
            return fail("docs/reference: the comparison passed a planted difference")
        if not reference.compare(fresh, os.path.join(ROOT, "docs", "reference")):
            return 1
    print(f"docs/reference: {len(reference.PAGES)} pages up to date")
    return 0


# ---- timeless ---------------------------------------------------------------------

TIMELY = [
    (re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"), "a date"),
    (re.compile(r"\bload average|\bload \d|\(load \d|\bloadavg", re.I), "a load average"),
    (re.compile(r"\b[0-2]\d:[0-5]\d(?::[0-5]\d)?\s*(?:UTC|-)", re.I), "a clock time"),
    (re.compile(r"\bUTC\b"), "a clock time"),
    (re.compile(r"\bthis (?:machine|host|session|VM)\b|\bon our machine\b|\bthe project machine\b|\bhere: load\b", re.I),
     "a statement about one machine"),
    (re.compile(r"\btoday\b|\byesterday\b|\blast night\b", re.I), "a relative date"),
]
# Pages that may speak of a date: the measurements and the history.
DATED = ("docs/benchmarks/", "CHANGELOG.md")


def timeless_findings(name, text):
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        # A link may name a dated result: its text and target are not the page's own statement.
        line = re.sub(r"\[([^\]]*)\]\(([^)]*)\)",
                      lambda m: "" if "benchmarks/results/" in m.group(2) else f"[{m.group(1)}]()", line)
        for pattern, what in TIMELY:
            m = pattern.search(line)
            if m:
                found.append(f"{name}:{i}: {what} ('{m.group(0)}') in a timeless page: measurements go into "
                             "docs/benchmarks/results/YYYY-MM-DD-topic.md")
    return found


def check_timeless():
    planted = timeless_findings("planted.md", "Measured on 2026-12-07 at 10:04 UTC, load average 3 on this machine.")
    if len(planted) < 4:
        return fail(f"docs/timeless: the check missed planted dates and loads ({planted})")
    findings = []
    for name in pages():
        if name.startswith(DATED) or name == "CHANGELOG.md":
            continue
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            findings += timeless_findings(name, f.read())
    for f in findings:
        print(f, file=sys.stderr)
    if findings:
        return 1
    print(f"docs/timeless: {len(pages())} pages checked")
    return 0


# ---- links --------------------------------------------------------------------------

LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading."""
    text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    out, in_fence = set(), False
    counts = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_fence = not in_fence
            if in_fence:
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
            if m:
                s = slug(m.group(1))
                n = counts.get(s, 0)
                counts[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
    return out


def link_findings(name, text, exists):
    found = []
    in_fence = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        for m in LINK.finditer(line):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(name), path)) if path else name
            problem = exists(resolved, anchor)
            if problem:
                found.append(f"{name}:{i}: {target}: {problem}")
    return found


# Pages another piece of work writes with their own test, linked before they land. Remove an entry
# once its page is in the tree: a link to it must then resolve like any other.
PENDING = {}


# A source file's citation of a page (and a section of it): design/algorithm.md §6, docs/concepts/...
CITE = re.compile(r"\b((?:docs/)?(?:design|concepts|guides|operating|reference|benchmarks)/[A-Za-z0-9_./-]*\.md)"
                  r"(?:(?:'s)?\s*§\s*(\d+))?")
# The design notes the project grew from live outside the repository: nothing may cite them.
OUTSIDE = re.compile(r"\b(ALGORITHM|ARCHITECTURE|MACHINE|STACK|BENCHMARKS)\.md\b")
CITING = ("actors", "tools", "storage", "schemas", "tests", "deploy", ".ci", "CMakeLists.txt")


def citation_findings(name, text):
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in OUTSIDE.finditer(line):
            found.append(f"{name}:{i}: cites {m.group(0)}, which is not in the repository")
        for m in CITE.finditer(line):
            page, section = m.group(1), m.group(2)
            page = page if page.startswith("docs/") else "docs/" + page
            full = os.path.join(ROOT, page)
            if not os.path.exists(full):
                if page not in PENDING:
                    found.append(f"{name}:{i}: cites {page}, which does not exist")
            elif section and not any(a.startswith(section) and re.match(r"^\d+(-|$)", a)
                                     and a.split("-")[0] == section for a in anchors(full)):
                found.append(f"{name}:{i}: cites {page} §{section}, which has no such section")
    return found


def citing_files():
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "--", *CITING], capture_output=True, text=True)
    names = listed.stdout.split() if listed.returncode == 0 else []
    own = os.path.relpath(os.path.abspath(__file__), ROOT)
    return [n for n in names if not n.endswith((".md", ".svg")) and n != own
            and os.path.isfile(os.path.join(ROOT, n))]


def check_links():
    def exists(path, anchor):
        full = os.path.join(ROOT, path)
        if not os.path.exists(full):
            return None if path in PENDING else "no such file"
        if anchor and path.endswith(".md") and anchor not in anchors(full):
            return "no such heading"
        return None
    planted = link_findings("docs/planted.md", "[a](missing.md) [b](../README.md#no-such-heading) [c](../README.md)",
                            exists)
    if len(planted) != 2:
        return fail(f"docs/links: the check did not find exactly the two planted broken links ({planted})")
    findings = []
    for name in pages():
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            findings += link_findings(name, f.read(), exists)
    planted = citation_findings("actors/planted.cpp", "// design/algorithm.md §99, docs/guides/nope.md, "
                                "ARCHITECTURE.md; design/algorithm.md §6 holds")
    if len(planted) != 3:
        return fail(f"docs/links: the citation check did not find exactly the three planted mistakes ({planted})")
    cited = citing_files()
    for name in cited:
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                findings += citation_findings(name, f.read())
        except UnicodeDecodeError:
            continue
    for name in pages():
        if not name.startswith(DATED):
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                findings += [x for x in citation_findings(name, f.read()) if "not in the repository" in x]
    for f in findings:
        print(f, file=sys.stderr)
    if findings:
        return 1
    print(f"docs/links: every page and section {len(cited)} source files cite exists")
    for path, what in PENDING.items():
        if os.path.exists(os.path.join(ROOT, path)):
            print(f"docs/links: {path} is in the tree now and checked like any page: its PENDING entry can go")
        else:
            print(f"docs/links: {path} is not in the tree yet ({what}); links to it are not checked")
    print(f"docs/links: {len(pages())} pages checked")
    return 0


# ---- runnable -----------------------------------------------------------------------

RUNNABLE = re.compile(r"^```sh runnable\s*\n(.*?)^```\s*$", re.S | re.M)
# A bound against a hang, generous for a loaded machine: together the blocks take about a minute on
# an idle 2-core machine and two at a load average of 16.
BUDGET_S = float(os.environ.get("DOCS_RUNNABLE_BUDGET_S", "420"))


def runnable_pages():
    out = ["docs/start.md"] if os.path.exists(os.path.join(ROOT, "docs", "start.md")) else []
    guides = os.path.join(ROOT, "docs", "guides")
    if os.path.isdir(guides):
        out += sorted(os.path.join("docs", "guides", f) for f in os.listdir(guides) if f.endswith(".md"))
    return out


def run_blocks(name, blocks, bin_dir, deadline):
    """Runs a page's blocks in order in one fresh directory (a tutorial's later blocks use the
    earlier ones' files) that looks like the repository's root; returns an error or None."""
    with tempfile.TemporaryDirectory(prefix="docs-runnable-") as work:
        for top in ("deploy", "tools", "schemas"):
            os.symlink(os.path.join(ROOT, top), os.path.join(work, top))
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
                   PYTHONPATH=os.path.join(os.path.dirname(bin_dir), "python") + os.pathsep
                   + os.path.join(bin_dir, "python"))
        for n, block in enumerate(blocks, 1):
            left = deadline - time.monotonic()
            if left <= 0:
                return f"{name}: block {n} not run: the budget of {BUDGET_S:.0f} s for every runnable block is spent"
            t0 = time.monotonic()
            try:
                out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env,
                                     capture_output=True, text=True, timeout=left)
            except subprocess.TimeoutExpired:
                return f"{name}: block {n} did not finish within the budget:\n{block}"
            print(f"docs/runnable: {name}: block {n} in {time.monotonic() - t0:.1f} s", flush=True)
            if out.returncode != 0:
                return (f"{name}: block {n} exited {out.returncode}:\n{block}\n--- stdout (tail)\n"
                        f"{out.stdout[-2000:]}\n--- stderr (tail)\n{out.stderr[-2000:]}")
    return None


def check_runnable(binary):
    bin_dir = os.path.dirname(os.path.abspath(binary))
    planted = run_blocks("planted.md", ["true", "archipelago config --set no.such=1 >/dev/null"], bin_dir,
                         time.monotonic() + 60)
    if planted is None:
        return fail("docs/runnable: a planted failing block passed")
    start = time.monotonic()
    deadline = start + BUDGET_S
    total = 0
    for name in runnable_pages():
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            blocks = RUNNABLE.findall(f.read())
        if not blocks:
            continue
        t0 = time.monotonic()
        error = run_blocks(name, blocks, bin_dir, deadline)
        if error:
            return fail("docs/runnable: " + error)
        total += len(blocks)
        print(f"docs/runnable: {name}: {len(blocks)} blocks in {time.monotonic() - t0:.1f} s")
    print(f"docs/runnable: {total} blocks in {time.monotonic() - start:.1f} s")
    return 0


# ---- commands -----------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
# What a page may show that is not a command of this binary's: the history, the dated measurements
# (run by the commit they name) and the generated reference (the binary's own words).
NOT_COMMANDS = ("CHANGELOG.md", "docs/benchmarks/results/", "docs/reference/")


class Cli:
    """The binary's subcommand tree, each node's options, and the knobs, read from the binary."""

    def __init__(self, binary):
        self.binary = binary
        self.helps = {}
        knobs = reference.last_json(reference.run(binary, "config", "--knobs", "--json"))["knobs"]
        self.knobs = {k["key"] for k in knobs}

    def help(self, path):
        key = tuple(path)
        if key not in self.helps:
            self.helps[key] = reference.run(self.binary, *path, "--help")
        return self.helps[key]

    def subcommands(self, path):
        return reference.subcommands(self.help(path))

    def has_option(self, path, flag):
        return re.search(r"(?:^|[\s,])" + re.escape(flag) + r"(?=[\s,=]|$)", self.help(path), re.M) is not None


def command_lines(text):
    """Every line of code a page shows: sh/bash/console fences (continuations joined) and code spans."""
    for lang, body in FENCE.findall(text):
        if lang in ("", "sh", "bash", "console", "shell"):
            yield from body.replace("\\\n", " ").splitlines()
    yield from SPAN.findall(FENCE.sub("", text))


def segments(line):
    """A line's simple commands: comments cut, split at pipes and command separators."""
    line = re.sub(r"(?:^|\s)#.*$", "", line)
    for part in re.split(r"\|\|?|&&|;|\$\(|\)", line):
        try:
            tokens = shlex.split(part)
        except ValueError:
            tokens = part.split()
        yield tokens


def command_findings(name, text, cli):
    """The mistakes of a page's archipelago commands, and how many commands it shows."""
    found, shown_count = [], 0
    for line in command_lines(text):
        for tokens in segments(line):
            for i, token in enumerate(tokens):
                # Not the binary: a Python module, an image's or a namespace's name (-m, -t, -n ...), a variable.
                if os.path.basename(token) != "archipelago" or "=" in token or \
                        (i and (tokens[i - 1] == "import" or tokens[i - 1].startswith("-"))):
                    continue
                shown, shown_count = " ".join(tokens[i:]), shown_count + 1
                path, rest = [], tokens[i + 1:]
                if rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]) and rest[0] not in cli.subcommands([]):
                    found.append(f"{name}: `{shown}`: no subcommand '{rest[0]}'")
                    break
                # A subcommand may follow its parent's options (replay --db D export ...); an option
                # belongs to the subcommand it follows or to one of its parents.
                for j, arg in enumerate(rest):
                    if not arg.startswith("-") and arg in cli.subcommands(path):
                        path = path + [arg]
                        continue
                    flag = arg.split("=", 1)[0]
                    if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and \
                            not any(cli.has_option(path[:k], flag) for k in range(len(path), -1, -1)):
                        found.append(f"{name}: `{shown}`: {' '.join(['archipelago', *path])} has no {flag}")
                    if flag == "--set":
                        value = arg.split("=", 1)[1] if "=" in arg else (rest[j + 1] if j + 1 < len(rest) else "")
                        key = value.split("=", 1)[0]
                        if re.fullmatch(r"[a-z_]+\.[a-z_.]+", key) and key not in cli.knobs:
                            found.append(f"{name}: `{shown}`: no knob {key}")
                break
    return found, shown_count


def check_commands(binary):
    cli = Cli(binary)
    planted, _ = command_findings("docs/planted.md", "```sh\narchipelago run --no-such-flag\n"
                               "archipelago frobnicate\narchipelago bench parity --set no.such=1 --seeds 3\n```\n"
                               "`archipelago run --steps 10`", cli)
    if len(planted) != 3:
        return fail(f"docs/commands: the check did not find exactly the three planted mistakes ({planted})")
    findings, checked = [], 0
    for name in pages():
        if name.startswith(NOT_COMMANDS):
            continue
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            found, n = command_findings(name, f.read(), cli)
        findings, checked = findings + found, checked + n
    for f in findings:
        print(f, file=sys.stderr)
    if findings:
        return 1
    print(f"docs/commands: {checked} archipelago commands name only subcommands, options and knobs the binary has")
    return 0


def main():
    if len(sys.argv) < 2:
        return fail(__doc__)
    what = sys.argv[1]
    if what == "reference":
        return check_reference(sys.argv[2])
    if what == "timeless":
        return check_timeless()
    if what == "links":
        return check_links()
    if what == "runnable":
        return check_runnable(sys.argv[2])
    if what == "commands":
        return check_commands(sys.argv[2])
    return fail(__doc__)


if __name__ == "__main__":
    sys.exit(main())
