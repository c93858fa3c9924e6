#!/usr/bin/env python3
"""Deployment: the Debian package installed on a fresh Debian 12 root (root only).

cpack builds archipelago_<version>_amd64.deb from the build directory; a fresh root
(deb_root.py: Debian 12's apt variant, none of our dependencies) runs the install blocks
of docs/guides/multi-host.md word for word (`apt install -y ./archipelago_*_amd64.deb`,
then etcd-server for the guide's etcd). Checks: apt resolved and installed every
dependency the package declares (dpkg-shlibdeps's list) and the binary finds every shared
library; the version is the project's; the deployment files, the benches' reference
scripts and the Python package are where the docs say (`import archipelago` in Debian's
python3); and a whole mesh trains from the installed binary (`archipelago run`). The
installed root stays in WORK/root for the multi-host guide test (ctest fixture deb_root).

Usage: deb_install_test.py BUILD_DIR WORK_DIR   (exit 77: not root)
"""

import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deb_root  # noqa: E402
from guide_blocks import runnable_blocks  # noqa: E402

GUIDE = os.path.join(HERE, "..", "..", "docs", "guides", "multi-host.md")


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


def sh(root, script, timeout=120):
    out = subprocess.run(deb_root.in_root(root, script), capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise Failure(f"in the root: {script!r} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out.stdout


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    if os.geteuid() != 0:
        print("deb_install_test: needs root (a chroot, mounts); skipped")
        return 77
    build_dir, work = (os.path.abspath(a) for a in sys.argv[1:])
    root = os.path.join(work, "root")
    deb_root.remove_tree(work)
    os.makedirs(work)
    t0 = time.time()
    phases = {}

    def phase(name, since):
        phases[name] = round(time.time() - since, 1)
        return time.time()

    deb = deb_root.build_deb(build_dir, os.path.join(work, "deb"))
    t = phase("cpack", t0)
    fields = {k: subprocess.run(["dpkg-deb", "-f", deb, k], capture_output=True, text=True).stdout.strip()
              for k in ("Package", "Version", "Depends")}
    print(f"package {os.path.basename(deb)} ({os.path.getsize(deb) / 1e6:.1f} MB); Depends: {fields['Depends']}")
    project_version = open(os.path.join(build_dir, "CPackConfig.cmake")).read().split('CPACK_PACKAGE_VERSION "')[1]
    project_version = project_version.split('"')[0]
    check(fields["Version"] == project_version, f"package version {fields['Version']} != {project_version}")
    for lib in ("libcaf-core0.17", "libzmq5", "libcapnp-0.9.2", "librocksdb7.8", "libdnnl2", "libspdlog1.10"):
        check(lib in fields["Depends"], f"Depends lacks {lib} (dpkg-shlibdeps): {fields['Depends']}")

    deb_root.unpack(root)
    before = set(sh(root, "dpkg-query -W -f '${Package}\\n'").split())
    check("libcaf-core0.17" not in before and "librocksdb7.8" not in before,
          "the base root already holds the package's libraries: it proves nothing")
    shutil.copy(deb, os.path.join(root, "root"))
    t = phase("fresh root", t)
    blocks = [b for b in runnable_blocks(GUIDE) if b.install]
    check(len(blocks) >= 1 and "./archipelago_*_amd64.deb" in blocks[0].text,
          f"{GUIDE}: the first install block must install the package: {blocks}")
    with deb_root.mounted(root, apt_cache=True):
        outputs = [sh(root, b.text, timeout=900) for b in blocks]
        t = phase("apt install", t)
        after = set(sh(root, "dpkg-query -W -f '${Package}\\n'").split())
        pulled = sorted(after - before)
        print(f"apt installed {len(pulled)} packages beside the base root's {len(before)}")
        status = sh(root, "dpkg-query -W -f '${Status} ${Version}' archipelago")
        check(status == f"install ok installed {project_version}", f"dpkg says: {status}")
        # dpkg configures a package only with every dependency satisfied; apt-get check finds none broken.
        sh(root, "apt-get check -q")
        for lib in ("libcaf-core0.17", "librocksdb7.8", "libdnnl2"):
            check(lib in pulled, f"apt did not pull {lib}: {pulled}")
        missing = sh(root, "ldd /usr/bin/archipelago /usr/bin/archipelago_wan_relay | grep 'not found' || true")
        check(not missing.strip(), f"libraries the installed binary cannot find:\n{missing}")
        check(f"archipelago {project_version}" in outputs[0], f"`archipelago --version` in the guide's block:\n{outputs[0]}")
        for path in ("usr/share/archipelago/deploy/drills/crash_storm.toml", "usr/share/archipelago/deploy/launch.py",
                     "usr/share/archipelago/deploy/netns/testbed.py", "usr/share/archipelago/bench/torch_reference.py",
                     "usr/share/doc/archipelago/README.md", "usr/bin/etcd"):
            check(os.path.exists(os.path.join(root, path)), f"/{path} is not installed")
        py = sh(root, "python3 -c 'import archipelago, archipelago._native as n; print(archipelago.__file__)'")
        check(py.strip().startswith("/usr/lib/python3/dist-packages/archipelago/"), f"the Python package: {py}")
        # A whole mesh (one process) trains from the installed binary.
        out = sh(root, "archipelago run --steps 30 --learners 2 --set data.batch=8 --report '' --out '' --json",
                 timeout=300)
        summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        check(summary.get("ledger_exact") is True and summary.get("rounds", 0) > 0,
              f"`archipelago run` from the package: {summary}")
        t = phase("checks", t)
    with open(os.path.join(work, "root.ready"), "w") as f:
        json.dump({"deb": deb, "version": project_version}, f)
    print(f"ok: the package installed on a fresh Debian 12 root with {len(pulled)} packages from apt; "
          f"phases {phases} (s); total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (Failure, deb_root.RootError) as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
