#!/usr/bin/python3
"""scp for the multi-host guide test: the hosts of the test bed run no SSH server, so
`scp [HOST:]PATH... [HOST:]DIR` copies between their root filesystems, which the test
mounts at /run/hosts/HOST in every host. A remote path's wildcards are expanded on its
host, as scp's remote shell does. Options (-r, -p, ...) are refused: the guide uses none."""

import glob
import os
import shutil
import sys

HOSTS = "/run/hosts"


def local(spec):
    host, sep, path = spec.partition(":")
    if not sep or "/" in host:
        return spec, False
    return os.path.join(HOSTS, host, path.lstrip("/")), True


def main():
    args = sys.argv[1:]
    if len(args) < 2 or any(a.startswith("-") for a in args):
        sys.exit(f"scp (test stand-in): usage: scp [HOST:]PATH... [HOST:]DIR, got {args}")
    *sources, target = args
    target, _ = local(target)
    if not os.path.isdir(target):
        sys.exit(f"scp: {target}: not a directory")
    copied = 0
    for spec in sources:
        path, remote = local(spec)
        matches = sorted(glob.glob(path)) if remote else [path]
        if not matches or not all(os.path.isfile(m) for m in matches):
            sys.exit(f"scp: {spec}: No such file")
        for m in matches:
            shutil.copy(m, target)
            copied += 1
    return 0 if copied else 1


if __name__ == "__main__":
    sys.exit(main())
