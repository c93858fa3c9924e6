#!/usr/bin/env python3
"""Tidy: no assert in the C++ sources; checked invariants instead.

Every build here is Release, and NDEBUG compiles assert out of it: a programmer
error it was meant to catch would run on unnoticed. ARCHIPELAGO_INVARIANT
(actors/core/invariant.hpp) stays in the shipped build, names the invariant,
logs and aborts. This check refuses every call of assert and every include of
<cassert> or <assert.h> in the C++ files under actors/, storage/, tools/, tests/
and deploy/ (comments and string literals aside; static_assert is fine).

Usage: no_assert.py SOURCE_DIR
Prints every use as FILE:LINE: and exits 1 if there is one. Before that it
checks itself on a small file holding two uses and three look-alikes.
"""

import os
import re
import sys

FOLDERS = ("actors", "storage", "tools", "tests", "deploy")
SOURCE = (".cpp", ".hpp", ".h")
USE = re.compile(r"\bassert\s*\(|#\s*include\s*<(cassert|assert\.h)>")
# Comments and string or character literals, replaced by blanks of the same lines.
NOT_CODE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def uses(text):
    """The line numbers of every assert (or its header) in one file's text."""
    code = NOT_CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [n for n, line in enumerate(code.splitlines(), 1) if USE.search(line)]


def self_test():
    sample = ('#include <cassert>\n'                          # 1: a use
              'static_assert(sizeof(int) == 4);\n'            # 2: fine
              '// assert(x) in a comment\n'                   # 3: fine
              'const char* s = "assert(y)";\n'                # 4: fine
              'void f(int x) { assert (x > 0); }\n'           # 5: a use
              '/* a block\n   assert(z) */ int g;\n')         # 6-7: fine
    got = uses(sample)
    if got != [1, 5]:
        print(f"no_assert.py self-test failed: expected uses on lines [1, 5], got {got}")
        sys.exit(1)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    self_test()
    root, found, checked = sys.argv[1], [], 0
    for top in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = uses(f.read())
                checked += 1
                found += [f"{os.path.relpath(path, root)}:{n}" for n in lines]
    for where in sorted(found):
        print(f"{where}: assert is compiled out of the Release build: use ARCHIPELAGO_INVARIANT "
              f"(core/invariant.hpp), or an error value for bad input")
    if found:
        print(f"{len(found)} use(s) of assert in {checked} C++ files")
        sys.exit(1)
    print(f"ok: no assert in {checked} C++ files")


main()
