#!/usr/bin/env bash
# `archipelago bench parity`, shrunk to seconds: bad input is refused with one line and
# exit 2; two modes and a variant on two corpora (the synthetic one and a real text), two seeds each:
# the JSON of every mode (dp the reference), the same tokens for every run, the
# comparisons consistent with the per-seed losses, exact ledgers, and the plot.
set -uo pipefail
ONE_ERROR_LINE=0
source "$(dirname "$0")/lib.sh"

expect_error 2 "must start with dp" -- "$A" bench parity --modes decoupled,dp
expect_error 2 "dp given twice" -- "$A" bench parity --modes dp,decoupled,dp
expect_error 2 "mode 'async' is none of" -- "$A" bench parity --modes dp --variant x=async
expect_error 2 "decoupled given twice" -- "$A" bench parity --modes dp,decoupled --variant decoupled=decoupled,mesh.rebase=true
expect_error 2 "r on synthetic: mesh.rebase and mesh.mix" -- "$A" bench parity --modes dp --variant r=decoupled,mesh.rebase=true,mesh.mix=0.5
expect_error 2 "modes: nonsense not in" -- "$A" bench parity --modes dp,nonsense
expect_error 2 "unknown model size 'huge'" -- "$A" bench parity --model huge
expect_error 2 "plot $work: is a directory" -- "$A" bench parity --plot "$work"

# A real text beside the synthetic corpus: a license text every Debian system has.
text=/usr/share/common-licenses/GPL-3
tiny=(--modes dp,decoupled --variant rebase=decoupled,mesh.rebase=true --learners 2 --seeds 2 --steps 30 --eval-every-s 0.5 --set data.batch=8
      --set data.eval_tokens=4096 --set data.synthetic_bytes=1000000 --json)
if timeout 150 "$A" bench parity --corpus synthetic --corpus "$text" --plot "$work/parity.svg" "${tiny[@]}" \
    >"$work/parity.out" 2>"$work/parity.err"; then
  tail -n 1 "$work/parity.out" | python3 -c '
import json, math, sys
s = json.loads(sys.stdin.read())
assert s["command"] == "bench parity" and s["seeds"] == 2 and s["ledger_exact"], s
corpora = s["corpora"]
assert [c["corpus"] for c in corpora] == ["synthetic", "'"$text"'"], corpora
assert corpora[0]["entropy_floor_bpb"] > 0 and corpora[1]["entropy_floor_bpb"] is None, corpora
tokens = {m["tokens"] for c in corpora for m in c["modes"]}
assert tokens == {2 * 30 * 8 * 64}, tokens  # the same budget for every mode, seed and corpus
for c in corpora:
    dp, dec, reb = c["modes"]
    assert (dp["mode"], dec["mode"], reb["mode"]) == ("dp", "decoupled", "rebase"), c
    assert dp["rel_pct"] == 0 and dp["reach_ratio"] == 1 and dp["seeds_reached"] == 2, dp
    assert all(0 < x < 6 for m in c["modes"] for x in m["eval_loss_per_seed"]), c
    assert dp["eval_loss_ci95"] > 0 and dec["eval_loss_ci95"] > 0, c  # two seeds: an interval
    rel = [100 * (b / a - 1) for a, b in zip(dp["eval_loss_per_seed"], dec["eval_loss_per_seed"])]
    assert abs(dec["rel_pct"] - sum(rel) / 2) < 1e-3, (dec["rel_pct"], rel)
    for t in dec["reach_tokens_per_seed"]:
        assert t is None or 0 <= t <= 2 * 30 * 8 * 64, dec
    assert dec["seeds_reached"] == sum(t is not None for t in dec["reach_tokens_per_seed"]), dec
    assert all(m["ledger_exact"] and m["goodput"] > 0 for m in c["modes"]), c
' || fail "bench parity --json: $(tail -n 1 "$work/parity.out")"
  grep -q "tokens to dp's final loss" "$work/parity.out" || fail "bench parity: no table: $(cat "$work/parity.out")"
  # Per corpus: the whole budget and its second half; a line per mode, dp's final loss dashed.
  python3 "$(dirname "$0")/svg_check.py" "$work/parity.svg" --charts 4 --legend "dp,decoupled,rebase,dp final" \
    --dashed "dp final" --min-points 2 >"$work/svg.out" 2>&1 || fail "bench parity --plot: $(cat "$work/svg.out")"
  [[ $(grep -o 'opacity="0.18"' "$work/parity.svg" | wc -l) -eq 12 ]] || fail "bench parity --plot: not a band per mode and chart"
else
  fail "bench parity failed: $(tail -5 "$work/parity.err")"
fi

# A staged sweep: two grid points screened on one seed, the better one on two fresh seeds.
expect_error 2 "no KEY=V1" -- "$A" bench parity --modes dp --sweep x=diloco
sweep=(--modes dp --sweep 'dl=diloco,mesh.inner_steps=5|10' --sweep-top 1 --learners 2 --seeds 2 --steps 20
       --eval-every-s 0.5 --set data.batch=8 --set data.eval_tokens=4096 --set data.synthetic_bytes=1000000 --json)
if timeout 150 "$A" bench parity "${sweep[@]}" >"$work/sweep.out" 2>"$work/sweep.err"; then
  tail -n 1 "$work/sweep.out" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert s["screen_seeds"] == 1 and s["seeds"] == 2 and s["ledger_exact"] and s["screen_ledger_exact"], s
points = s["sweep"]
assert sorted(p["label"] for p in points) == ["dl:10", "dl:5"], points
assert points[0]["screen_rel_pct"] <= points[1]["screen_rel_pct"], points  # best first
assert [p["chosen"] for p in points] == [True, False], points
modes = s["corpora"][0]["modes"]
assert [m["mode"] for m in modes] == ["dp", points[0]["label"]], modes  # stage 2: dp and the winner
assert all(len(m["eval_loss_per_seed"]) == 2 for m in modes), modes
assert s["best"] == [{"corpus": "synthetic", "sweep": "dl", "best": points[0]["label"]}], s["best"]
' || fail "bench parity --sweep --json: $(tail -n 1 "$work/sweep.out")"
  grep -q "stage 1: 2 grid points" "$work/sweep.out" || fail "bench parity --sweep: no screen table: $(cat "$work/sweep.out")"
  grep -q "best of sweep dl on synthetic" "$work/sweep.out" || fail "bench parity --sweep: no best line"
else
  fail "bench parity --sweep failed: $(tail -5 "$work/sweep.err")"
fi

if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo "bench parity: all passed"
