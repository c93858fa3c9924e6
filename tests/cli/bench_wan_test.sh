#!/usr/bin/env bash
# `archipelago bench wan`, shrunk to seconds: bad input is refused with one line and
# exit 2; a tiny race over capped links prints the arithmetic and the paper's figure,
# and its JSON has the four modes, bytes moved by each, dp's time projected from its
# capped step time, and dp moving more bytes than decoupled.
set -uo pipefail
ONE_ERROR_LINE=0  # these checks ask for the code and the message, not for a single line
source "$(dirname "$0")/lib.sh"

expect_error 2 "'dp' is not one of diloco" -- "$A" bench wan --modes dp
expect_error 2 "ref-\* figures must be positive" -- "$A" bench wan --ref-gbit 0
expect_error 2 "unknown model size 'huge'" -- "$A" bench wan --model huge
expect_error 2 "no directory /nonexistent" -- "$A" bench wan --plot /nonexistent/wan.svg

# A 100 Gbit/s reference keeps dp's capped step short; H = 10 lets diloco sync in 30 steps.
if timeout 150 "$A" bench wan --steps 120 --dp-steps 30 --ref-gbit 100 --dp-seconds 8 --mode-seconds 25 --eval-every-s 1 \
    --eval-tokens 2048 --set data.synthetic_bytes=1000000 --set mesh.inner_steps=10 --plot "$work/wan.svg" --json \
    >"$work/wan.out" 2>"$work/wan.err"; then
  tail -n 1 "$work/wan.out" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert s["command"] == "bench wan" and s["learners"] == 2, s
assert s["cap_mbit"] > 0 and s["target_loss"] > 0 and s["comm_compute_ratio"] > 0, s
m = {x["mode"]: x for x in s["modes"]}
assert sorted(m) == ["decoupled", "diloco", "dp", "streaming"], m.keys()
assert all(x["bytes"] > 0 for x in m.values()), [(k, x["bytes"]) for k, x in m.items()]
assert m["dp"]["projected"] and m["dp"]["reached"] and m["dp"]["speedup_vs_dp"] == 1, m["dp"]
assert m["dp"]["bytes"] > m["decoupled"]["bytes"], (m["dp"]["bytes"], m["decoupled"]["bytes"])
for x in m.values():
    assert 0 < x["final_loss"] < 6, x
    if x["reached"] and x["mode"] != "dp":
        assert x["final_loss"] <= s["target_loss"] + 0.05 and x["speedup_vs_dp"] > 0, x
' || fail "bench wan --json: $(tail -n 1 "$work/wan.out")"
  # Eval loss against time: every racing mode measured, dp projected (dashed), the target.
  python3 "$(dirname "$0")/svg_check.py" "$work/wan.svg" --charts 1 --dashed "dp (projected),target" \
    --legend "dp (projected),diloco,streaming,decoupled,target" >"$work/svg.out" 2>&1 ||
    fail "bench wan --plot: $(cat "$work/svg.out")"
  grep -q "The arithmetic" "$work/wan.out" || fail "bench wan: no arithmetic: $(cat "$work/wan.out")"
  grep -q "paper" "$work/wan.out" || fail "bench wan: no paper figure: $(cat "$work/wan.out")"
else
  fail "bench wan failed: $(tail -5 "$work/wan.err") $(tail -5 "$work/wan.out")"
fi

if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo "bench wan: all passed"
