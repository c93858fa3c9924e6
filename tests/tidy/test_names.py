#!/usr/bin/env python3
"""Every doctest case reaches ctest: no test name may hold a ';'.

doctest_discover_tests turns each case into a ctest test named after it, and CMake
reads a ';' in that name as a list separator: the name is cut there, the test's
--test-case filter matches no case, and the test "passes" without running anything
(23 cases were silently skipped that way). Usage: test_names.py SOURCE_DIR
"""

import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1]) / "tests"
bad = []
for path in sorted(root.rglob("*.cpp")):
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for name in re.findall(r'TEST_CASE\("([^"]*)"', line):
            if ";" in name:
                bad.append(f"{path.relative_to(root.parent)}:{number}: {name}")
if bad:
    print("test names with ';' (ctest would run none of them):\n" + "\n".join(bad))
    sys.exit(1)
print("ok: no test name holds a ';'")
