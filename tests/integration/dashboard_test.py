#!/usr/bin/env python3
"""Integration: the live dashboard in a real browser.

`archipelago run` serves the dashboard on its --metrics-port (GET /, the page;
GET /status and /evals, what it polls). Headless Chromium (Debian's `chromium`,
installed by the setup script's test action) loads it while the mesh trains:
the page's script must have drawn several live updates — the rounds closed, every
learner and shard, the charts, the eval curve — and a screenshot of it must not
be empty. A node without a status page answers / with a plain index.

Usage: dashboard_test.py ARCHIPELAGO_BINARY
"""

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from launch import free_ports  # noqa: E402

BINARY = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(prefix="archipelago-dashboard-")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
run = None


def fail(message):
    if run and run.poll() is None:
        run.kill()
    print("FAIL: " + message)
    for name in ("run.err",):
        path = os.path.join(WORK, name)
        if os.path.exists(path):
            print("--- " + name + " (tail)\n" + open(path, errors="replace").read()[-3000:])
    sys.exit(1)


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def wait_for(what, check, bound_s):
    deadline = time.time() + bound_s
    while time.time() < deadline:
        if run.poll() is not None:
            fail(f"run exited {run.returncode} while waiting for {what}")
        try:
            value = check()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.5)
    fail(f"{what}: not within {bound_s} s")


def chromium(*args):
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--user-data-dir=" + os.path.join(WORK, "profile"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def png_distinct_bytes(path):
    """The number of distinct byte values in a PNG's decompressed image data: 1-2 for a blank page."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG")
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


if not CHROMIUM:
    fail("chromium is not installed: `tools/setup.sh test` installs it (apt-get install chromium)")

port, = free_ports(1)
cmd = [BINARY, "run", "--steps", "100000", "--metrics-port", str(port), "--out", "", "--report", "",
       "--eval-every-s", "3", "--set", "data.batch=4", "--set", "data.eval_tokens=4096", "--set", "data.synthetic_bytes=1000000"]
run = subprocess.Popen(cmd, stdout=open(os.path.join(WORK, "run.out"), "w"),
                       stderr=open(os.path.join(WORK, "run.err"), "w"), cwd=WORK)
try:
    status = wait_for("rounds closed on /status",
                      lambda: (lambda s: s if s["rounds_closed"] > 0 else None)(json.loads(get(port, "/status")[2])), 120)
    for key in ("recent_rounds", "events", "uptime", "fragment_availability", "rejected", "learners", "shards"):
        if key not in status:
            fail(f"/status has no {key}: {status}")
    code, kind, page = get(port, "/")
    if code != 200 or not kind.startswith("text/html") or "<script>" not in page:
        fail(f"GET / is not the dashboard: {code} {kind} {page[:200]}")
    if re.search(r"(src|href)=\"https?://", page):
        fail("the dashboard loads something from outside the machine")
    # The eval curve: the run evaluates every 3 s (--eval-every-s); wait for its second point.
    wait_for("two points on /evals", lambda: len(json.loads(get(port, "/evals")[2])) >= 2, 120)

    # Ten seconds of the page's own clock: about ten polls of /status.
    r = chromium("--virtual-time-budget=10000", "--dump-dom", f"http://127.0.0.1:{port}/")
    dom = r.stdout
    updates = re.search(r'id="updates" data-count="(\d+)"', dom)
    if not updates or int(updates.group(1)) < 3:
        fail(f"the page drew {updates.group(1) if updates else 0} live updates (want >= 3); chromium: "
             f"{r.stderr[-1500:]}\n{dom[:1500]}")
    closed = re.search(r'id="rounds-closed">(\d+)<', dom)
    if not closed or int(closed.group(1)) < status["rounds_closed"]:
        fail(f"rounds closed on the page: {closed.group(1) if closed else None}, /status said {status['rounds_closed']} before")
    learner_rows = re.findall(r'<td class="(live|dead|joining|left)">', re.search(r'<table id="learners">(.*?)</table>', dom, re.S).group(1))
    if len(learner_rows) != 4 or learner_rows.count("live") < 1:
        fail(f"the learners table: {learner_rows}")
    if len(re.findall(r"<tr>", re.search(r'<table id="shards">(.*?)</table>', dom, re.S).group(1))) != 1 + 2:
        fail("the shards table has not a row per shard")
    charts = re.findall(r'<div class="chart" id="([^"]+)"><svg', dom)
    if sorted(charts) != sorted(["chart-goodput", "chart-rounds", "chart-members", "chart-quorum", "eval-chart"]):
        fail(f"charts drawn: {charts}")
    eval_svg = re.search(r'id="eval-chart"><svg.*?</svg>', dom, re.S).group(0)
    if not re.search(r'<path d="M[0-9.]+,[0-9.]+ L', eval_svg):
        fail("the eval chart has no line")
    if "live ·" not in dom:
        fail("the banner does not say live")

    shot = os.path.join(WORK, "dashboard.png")
    r = chromium("--virtual-time-budget=5000", "--window-size=1280,1600", "--screenshot=" + shot, f"http://127.0.0.1:{port}/")
    if not os.path.exists(shot):
        fail(f"no screenshot: {r.stderr[-1500:]}")
    size, distinct = os.path.getsize(shot), png_distinct_bytes(shot)
    if size < 20000 or distinct < 32:
        fail(f"the screenshot looks empty: {size} bytes, {distinct} distinct byte values")
    if os.environ.get("ARCHIPELAGO_DASHBOARD_PNG"):
        shutil.copy(shot, os.environ["ARCHIPELAGO_DASHBOARD_PNG"])
finally:
    if run.poll() is None:
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            fail("run did not stop within 60 s of SIGTERM")
print(f"PASS: the dashboard drew {updates.group(1)} live updates in a headless browser ({closed.group(1)} rounds closed, "
      f"4 learners, 2 shards, 5 charts); screenshot {size} bytes")
shutil.rmtree(WORK, ignore_errors=True)
