#!/usr/bin/env bash
# Cold restart of a whole mesh: a one-process `run` with snapshots (every learner,
# shard and the broker in one process) is killed with SIGKILL mid-training — every
# node at once — and restarted from its store with `run --resume`. It resumes from
# the newest consistent snapshot (no rollback past it), not from a fresh model, and
# its eval curve continues: the first point after the restart is the stored head's
# own eval (`replay eval head`), no worse than 1 % above the last evaluation before
# the kill (the head may be newer than that evaluation, and better), and it goes on
# learning.
set -uo pipefail
ONE_ERROR_LINE=0 ERROR_TIMEOUT=120
source "$(dirname "$0")/lib.sh"
json() { tail -n 1 "$work/out" | python3 -c "import json,sys; s=json.loads(sys.stdin.read()); print($1)"; }

db=$work/db
"$A" run --learners 2 --steps 100000 --db "$db" --out "" --report "" --eval-every-s 4 \
  --set mesh.step_time_ms=20 --json >"$work/first" 2>"$work/first.err" &
pid=$!
# Until three evaluated versions are in the store (read beside the live writer), at most 240 s.
evaluated=0
for _ in $(seq 1 240); do
  if timeout 60 "$A" replay --db "$db" list --json >"$work/out" 2>/dev/null; then
    evaluated=$(json 'sum(1 for r in s["rows"] if r["eval_loss"] is not None and r["eval_loss"] == r["eval_loss"])')
    [[ $evaluated -ge 3 ]] && break
  fi
  sleep 1
done
kill -KILL "$pid"
wait "$pid" 2>/dev/null
[[ $evaluated -ge 3 ]] && pass || fail "three evaluated versions within 240 s: $evaluated; $(tail -n 3 "$work/first.err")"

timeout 60 "$A" replay --db "$db" check --json >"$work/out" 2>&1 && [[ $(json 's["ok"]') == True ]] && pass ||
  fail "replay check after SIGKILL: $(tail -n 2 "$work/out")"
timeout 60 "$A" replay --db "$db" list --json >"$work/out" 2>&1 || fail "replay list: $(tail -n 2 "$work/out")"
head=$(json 's["rows"][-1]["version"]')
steps=$(json 's["rows"][-1]["learner_steps"]')
last_eval=$(json '[r for r in s["rows"] if r["eval_loss"] is not None and r["eval_loss"] == r["eval_loss"]][-1]["eval_loss"]')
first_eval=$(json '[r for r in s["rows"] if r["eval_loss"] is not None and r["eval_loss"] == r["eval_loss"]][0]["eval_loss"]')
timeout 120 "$A" replay --db "$db" eval head --json >"$work/out" 2>&1 || fail "replay eval head: $(tail -n 2 "$work/out")"
head_eval=$(json 's["eval_loss"]')

# Every node restarted at once from the store: 40 more steps.
if timeout 300 "$A" run --resume "$db" --learners 2 --steps $((steps + 40)) --out "" --report "" --eval-every-s 4 \
     --set mesh.step_time_ms=20 --json >"$work/out" 2>"$work/err"; then
  read -r resumed start end < <(json 's["resumed_from"], s["start_eval_loss"], s["eval_loss"]' | tr -d '(),')
  echo "cold restart: killed at version $head (steps $steps), head's eval $head_eval, last eval before the kill" \
       "$last_eval (first $first_eval); resumed from $resumed at $start, ended at $end"
  [[ $(json "s['resumed_from'] == $head and abs(s['start_eval_loss'] - $head_eval) <= 1e-3 * $head_eval \
             and s['start_eval_loss'] <= 1.01 * $last_eval and s['start_eval_loss'] < $first_eval \
             and s['eval_loss'] <= s['start_eval_loss'] * 1.01") == True ]] && pass ||
    fail "resumed from $resumed (head $head, its eval $head_eval) at $start (last eval $last_eval, first $first_eval), ended at $end"
else
  fail "run --resume: $(tail -n 3 "$work/out") $(tail -n 3 "$work/err")"
fi
echo "cold restart: $passes passed, $failures failed"
[[ $failures -eq 0 ]]
