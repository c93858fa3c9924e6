#!/usr/bin/env bash
# `archipelago bench ablate`, shrunk to seconds: bad input is refused with one line
# and exit 2; the encoding ablation's JSON has every variant, the ledger is exact in
# every run, and int2 outer gradients move fewer bytes than fp32 and bf16; the merge
# ablation gives every M the same tokens and each its own reference.
set -uo pipefail
ONE_ERROR_LINE=0  # these checks ask for the code and the message, not for a single line
source "$(dirname "$0")/lib.sh"

expect_error 2 "which: nonsense not in" -- "$A" bench ablate nonsense
expect_error 2 "unknown merge 'avg'" -- "$A" bench ablate merge --set mesh.merge=avg
expect_error 2 "variant P=4000: " -- "$A" bench ablate fragments --fragments 2,4000 --steps 5
expect_error 2 "unknown model size 'huge'" -- "$A" bench ablate encoding --model huge
expect_error 2 "plot $work: is a directory" -- "$A" bench ablate quorum --plot "$work"

# Paced steps of 15 ms and a small eval keep each mesh run to a few seconds.
tiny=(--steps 40 --step-time-ms 15 --set data.eval_tokens=4096 --set data.synthetic_bytes=1000000 --json)

if timeout 90 "$A" bench ablate encoding --encodings fp32,bf16,int2 --learners 2 "${tiny[@]}" \
    >"$work/enc.out" 2>"$work/enc.err"; then
  tail -n 1 "$work/enc.out" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert s["command"] == "bench ablate" and s["which"] == "encoding", s
v = {x["name"]: x for x in s["variants"]}
assert sorted(v) == ["bf16", "fp32", "int2"], v.keys()
assert v["fp32"]["reference"] and v["fp32"]["rel_pct"] == 0, v["fp32"]
assert all(x["ledger_exact"] for x in v.values()) and s["ledger_exact"], s
for x in v.values():
    assert 0 < x["eval_loss"] < 6 and x["tokens"] == 2 * 40 * 8 * 64, x
    assert abs(x["rel_pct"] - 100 * (x["eval_loss"] / v["fp32"]["eval_loss"] - 1)) < 1e-3, x
assert v["int2"]["bytes_on_wire"] < v["bf16"]["bytes_on_wire"] < v["fp32"]["bytes_on_wire"], \
    [(k, x["bytes_on_wire"]) for k, x in v.items()]
assert [c["claim"][:10] for c in s["claims"]] == ["2-bit brea"], s["claims"]
' || fail "bench ablate encoding --json: $(tail -n 1 "$work/enc.out")"
  grep -q "paper" "$work/enc.out" || fail "bench ablate encoding: no paper column: $(cat "$work/enc.out")"
else
  fail "bench ablate encoding failed: $(tail -5 "$work/enc.err")"
fi

if timeout 90 "$A" bench ablate merge --merge-learners 2,4 --plot "$work/merge.svg" --eval-every-s 0.5 "${tiny[@]}" >"$work/merge.out" 2>"$work/merge.err"; then
  tail -n 1 "$work/merge.out" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
v = s["variants"]
assert [(x["group"], x["name"], x["reference"]) for x in v] == \
    [("M=2", "mean", True), ("M=2", "rda", False), ("M=4", "mean", True), ("M=4", "rda", False)], v
assert len({x["tokens"] for x in v}) == 1, [x["tokens"] for x in v]  # the same budget at every M
assert [x["steps"] for x in v] == [40, 40, 20, 20], v
assert all(x["ledger_exact"] for x in v), v
assert len(s["claims"]) == 2, s["claims"]
' || fail "bench ablate merge --json: $(tail -n 1 "$work/merge.out")"
  # One chart per M, a line per variant, the reference (mean) dashed.
  python3 "$(dirname "$0")/svg_check.py" "$work/merge.svg" --charts 2 --legend mean,rda --dashed mean --min-points 3 \
    >"$work/svg.out" 2>&1 || fail "bench ablate merge --plot: $(cat "$work/svg.out")"
else
  fail "bench ablate merge failed: $(tail -5 "$work/merge.err")"
fi

# Quorum: the four decoupled variants share a wall time; dp runs its whole schedule and is the
# quality reference, K=1 + grace compared with it at the same tokens.
if timeout 120 "$A" bench ablate quorum --learners 2 --eval-every-s 0.5 "${tiny[@]}" >"$work/quorum.out" 2>"$work/quorum.err"; then
  tail -n 1 "$work/quorum.out" | python3 -c '
import json, math, sys
s = json.loads(sys.stdin.read())
v = {x["name"]: x for x in s["variants"]}
assert list(v) == ["K=1 + grace", "K=1, no grace", "K=M", "K=M lock-step", "dp"], list(v)
assert v["dp"]["tokens"] == 2 * 40 * 8 * 64, v["dp"]  # every step of its schedule
assert all(x["tokens"] < v["dp"]["tokens"] for k, x in v.items() if k != "dp"), v  # the rest: a common wall time
assert all(x["ledger_exact"] for x in v.values()), v
c = [x["claim"] for x in s["claims"]]
assert len(c) == 5 and "dp-level quality" in c[4], c
assert "nan" not in c[4], c  # dp'"'"'s loss at the same tokens was found on its curve
' || fail "bench ablate quorum --json: $(tail -n 1 "$work/quorum.out")"
else
  fail "bench ablate quorum failed: $(tail -5 "$work/quorum.err")"
fi

if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo "bench ablate: all passed"
