"""A fresh Debian 12 root filesystem for the package tests (root only).

The base is Debian 12's `apt` variant made by mmdebstrap from Debian's mirror: essential
packages, apt and its keyring, nothing of archipelago's dependencies. Making it takes minutes
and the network, so it is kept as a tarball (BASE_CACHE, or $ARCHIPELAGO_DEB_ROOT_CACHE) and each
test run unpacks a fresh copy (seconds). apt inside the root reads the host's package lists and
a package cache of the tests' own (DEB_CACHE: what apt downloaded once is not fetched again), so
`apt install ./archipelago_*.deb` resolves and installs every dependency itself, as on a fresh
host; whatever the cache lacks comes from the mirror.
"""

import contextlib
import fcntl
import glob
import os
import shutil
import subprocess
import time

CACHE_DIR = os.environ.get("ARCHIPELAGO_DEB_ROOT_CACHE", "/var/cache/archipelago-tests")
BASE_CACHE = os.path.join(CACHE_DIR, "debian12-apt.tar")
DEB_CACHE = os.path.join(CACHE_DIR, "debs")
MIRRORS = ["deb http://deb.debian.org/debian bookworm main",
           "deb http://deb.debian.org/debian bookworm-updates main",
           "deb http://deb.debian.org/debian-security bookworm-security main"]
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
       "DEBIAN_FRONTEND": "noninteractive"}


class RootError(Exception):
    pass


def run(cmd, timeout, what, **kw):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise RootError(f"{what}: no end within {timeout} s")
    if out.returncode != 0:
        raise RootError(f"{what} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout


def base_tarball(log=print):
    """The cached base root, made once per machine (under a lock: parallel runs wait for one)."""
    os.makedirs(CACHE_DIR, exist_ok=True)
    with open(os.path.join(CACHE_DIR, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(BASE_CACHE):
            if not shutil.which("mmdebstrap"):
                raise RootError("mmdebstrap is not installed (tools/setup.sh test installs it)")
            log(f"making the base Debian 12 root {BASE_CACHE} with mmdebstrap (once per machine: minutes)")
            t0 = time.time()
            run(["mmdebstrap", "--variant=apt", "--quiet", "bookworm", BASE_CACHE + ".part", *MIRRORS], 1800,
                "mmdebstrap (Debian's mirror must be reachable)")
            os.replace(BASE_CACHE + ".part", BASE_CACHE)
            log(f"base root made in {time.time() - t0:.0f} s")
    return BASE_CACHE


def unpack(root):
    """A fresh root at `root`, ready for apt: the host's package lists (the same mirrors),
    no service started by a package's scripts (policy-rc.d), the host's DNS settings."""
    os.makedirs(root)
    run(["tar", "-xf", base_tarball(), "-C", root], 300, "unpacking the base root")
    lists = os.path.join(root, "var/lib/apt/lists")
    os.makedirs(lists, exist_ok=True)
    for f in glob.glob("/var/lib/apt/lists/*"):
        if os.path.isfile(f) and not f.endswith("/lock"):
            shutil.copy(f, lists)
    with open(os.path.join(root, "usr/sbin/policy-rc.d"), "w") as f:
        f.write("#!/bin/sh\n# No service starts inside a test root.\nexit 101\n")
    os.chmod(os.path.join(root, "usr/sbin/policy-rc.d"), 0o755)
    shutil.copy("/etc/resolv.conf", os.path.join(root, "etc/resolv.conf"))
    with open(os.path.join(root, "etc/apt/apt.conf.d/90archipelago-tests"), "w") as f:
        f.write('// The tests\' package cache is kept: `apt install` deletes what it downloaded otherwise.\n'
                'Binary::apt::APT::Keep-Downloaded-Packages "true";\nAPT::Keep-Downloaded-Packages "true";\n')


class Mounts:
    """/proc and /dev inside roots (and other binds), undone in reverse order."""

    def __init__(self):
        self.points = []

    def bind(self, source, target, recursive=False):
        os.makedirs(target, exist_ok=True)
        run(["mount", "--rbind" if recursive else "--bind", source, target], 30, f"mount {source} on {target}")
        self.points.append(target)

    def proc(self, root):
        target = os.path.join(root, "proc")
        os.makedirs(target, exist_ok=True)
        run(["mount", "-t", "proc", "proc", target], 30, f"mount proc on {target}")
        self.points.append(target)

    def system(self, root):
        self.proc(root)
        self.bind("/dev", os.path.join(root, "dev"))

    def undo(self):
        failed = []
        for target in reversed(self.points):
            if subprocess.run(["umount", "-l", target], capture_output=True).returncode != 0:
                failed.append(target)
        self.points = []
        if failed:
            raise RootError(f"could not unmount {failed}")


@contextlib.contextmanager
def mounted(root, apt_cache=False):
    m = Mounts()
    try:
        m.system(root)
        if apt_cache:
            os.makedirs(os.path.join(DEB_CACHE, "partial"), exist_ok=True)
            m.bind(DEB_CACHE, os.path.join(root, "var/cache/apt/archives"))
        yield m
    finally:
        m.undo()


def remove_tree(path):
    """Removes a test's directory of roots: first every mount left under it (a run killed
    before its cleanup leaves /proc and /dev bound there: removing through them would delete
    the host's), then the files, never crossing into another file system."""
    path = os.path.realpath(path)
    if not os.path.exists(path):
        return
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    for point in sorted((p for p in points if p.startswith(path + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    with open("/proc/self/mounts") as f:
        left = [line.split()[1] for line in f if line.split()[1].startswith(path + "/")]
    if left:
        raise RootError(f"mounts under {path} could not be removed: {left}")
    run(["rm", "-rf", "--one-file-system", path], 300, f"removing {path}")


def in_root(root, script, netns=None):
    """The argv that runs a bash script in the root as root (in a network namespace if given)."""
    argv = ["chroot", root, "/usr/bin/env", "-i", *[f"{k}={v}" for k, v in ENV.items()],
            "/bin/bash", "-e", "-c", "cd /root && " + script]
    return (["ip", "netns", "exec", netns] if netns else []) + argv


def build_deb(build_dir, out_dir):
    """The package, made by cpack from the build directory; its path."""
    run(["cpack", "-G", "DEB", "--config", os.path.join(build_dir, "CPackConfig.cmake"), "-B", out_dir], 600,
        "cpack -G DEB")
    debs = glob.glob(os.path.join(out_dir, "archipelago_*_amd64.deb"))
    if len(debs) != 1:
        raise RootError(f"cpack wrote {debs or 'no .deb'} in {out_dir}")
    return debs[0]
