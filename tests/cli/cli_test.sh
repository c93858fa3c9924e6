#!/usr/bin/env bash
# The real archipelago binary: bad input gives one clear line and exit code 2;
# a short training run lowers the loss, prints a JSON summary last, writes a
# checkpoint that `sample` reads back.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

printf 'short' >"$work/short.txt"
: >"$work/empty.txt"
printf '[train\nsteps = 3\n' >"$work/broken.toml"
printf '[train]\nsteps = 3\n' >"$work/unreadable.toml"
chmod 000 "$work/unreadable.toml"

expect_error 2 "corpus file '.*/missing.txt' does not exist" -- "$A" train --corpus "$work/missing.txt" --steps 1
expect_error 2 "corpus '.*empty.txt' is empty" -- "$A" train --corpus "$work/empty.txt" --steps 1
expect_error 2 "has 5 bytes, fewer than context \+ 1" -- "$A" train --corpus "$work/short.txt" --steps 1
expect_error 2 "unknown model size 'huge'" -- "$A" train --model huge --steps 1
expect_error 2 "optimizer.lr must be in" -- "$A" train --lr 0 --steps 1
expect_error 2 "optimizer.lr must be in" -- "$A" train --lr -0.5 --steps 1
expect_error 2 "train.threads must be in" -- "$A" train --threads 0 --steps 1
expect_error 2 "train.threads: 'x' is not an integer" -- "$A" train --threads x --steps 1
expect_error 2 "broken.toml:[0-9]+:" -- "$A" train --config "$work/broken.toml"
expect_error 2 "cannot read config file '.*missing.toml'" -- "$A" train --config "$work/missing.toml"
if [[ $(id -u) -ne 0 ]]; then
  expect_error 2 "cannot read config file" -- "$A" train --config "$work/unreadable.toml"
fi
expect_error 2 "unknown configuration key 'train.stepz'" -- "$A" train --set train.stepz=3
expect_error 2 "unknown model size 'huge'" -- "$A" bench compute --model huge
expect_error 2 "checkpoint file '.*' does not exist" -- "$A" sample --checkpoint "$work/none.ckpt"
expect_error 2 "temperature must be a positive number" -- "$A" sample --checkpoint "$work/none.ckpt" --temperature 0
expect_error 2 "" -- "$A" train --no-such-flag
expect_error 2 "" -- "$A" keygen
mkdir -p "$work/keys"
if "$A" keygen --name node0 --dir "$work/keys" --json >"$work/keygen.out" 2>&1 &&
   tail -n 1 "$work/keygen.out" | python3 -c 'import json,sys; s=json.loads(sys.stdin.read()); assert len(s["public"]) == 40, s' &&
   [[ $(stat -c %a "$work/keys/node0.key") == 600 ]]; then pass; else fail "keygen: $(cat "$work/keygen.out")"; fi
expect_error 2 "already exists" -- "$A" keygen --name node0 --dir "$work/keys"
expect_error 2 "wire.encoding" -- "$A" train --set wire.encoding=fp8

# --help works on every command and exits 0.
for cmd in "" run train sample config bench "bench compute" "bench wire" "bench snapshot" keygen; do
  # shellcheck disable=SC2086
  if timeout 20 "$A" $cmd --help >"$work/help" 2>&1 && grep -q "Usage" "$work/help"; then pass
  else fail "archipelago $cmd --help"; fi
done

# config shows run's own defaults (--for run), marks them in the knob table, lists the presets.
# (grep reads to the end, not -q: under pipefail the writer's SIGPIPE would fail the pipeline)
if "$A" config --for run | grep -x 'steps = 1500' >/dev/null && "$A" config | grep -x 'steps = 3000' >/dev/null &&
   "$A" config --knobs | grep '^train.steps .*default 3000 (run: 1500)' >/dev/null &&
   "$A" config --knobs --json | tail -n 1 | python3 -c '
import json, sys
k = {e["key"]: e for e in json.loads(sys.stdin.read())["knobs"]}
assert k["train.steps"]["default"] == "3000" and k["train.steps"]["run_default"] == "1500", k["train.steps"]
assert "run_default" not in k["mesh.learners"] and k["mesh.learners"]["help"], k["mesh.learners"]' &&
   "$A" config --presets --json | tail -n 1 | python3 -c '
import json, sys
p = {e["size"]: e for e in json.loads(sys.stdin.read())["presets"]}
assert p["nano"]["parameters"] == 120576 and p["micro"]["parameters"] == 989600, p'; then pass
else fail "config --for run, --knobs, --presets"; fi
expect_error 2 "for" -- "$A" config --for train

# A short real run on the synthetic corpus: the loss falls, JSON is last.
if timeout 240 "$A" train --steps 500 --set train.eval_every=250 --json --out "$work/model.ckpt" \
    >"$work/train.out" 2>"$work/train.err"; then
  last=$(tail -n 1 "$work/train.out")
  if python3 - "$last" <<'PY'
import json, math, sys
s = json.loads(sys.argv[1])
for key in ["model", "params", "tokens", "wall_s", "tokens_per_s", "train_loss", "eval_loss",
            "eval_bpb", "entropy_floor_bpb"]:
    assert key in s, key
assert s["model"] == "nano" and s["params"] == 120576, s
assert s["tokens"] == 500 * 32 * 64, s
assert 0 < s["entropy_floor_bpb"] < 3, s
# 8 bits/byte is chance and ~4 the byte frequencies; 500 steps learn words (measured ~2.1).
assert s["eval_bpb"] < 3.0, s
assert abs(s["eval_bpb"] - s["eval_loss"] / math.log(2)) < 1e-3, s
PY
  then pass; else fail "train --json summary: $last"; fi
else
  fail "train run failed: $(tail -5 "$work/train.err")"
fi

# The one-process mesh: learners, shards and a broker over inproc:// train the model.
if timeout 240 "$A" run --steps 40 --learners 2 --shards 2 --json >"$work/run.out" 2>"$work/run.err"; then
  if tail -n 1 "$work/run.out" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert s["mode"] == "decoupled" and s["learners"] == 2 and s["fragments"] == 24, s
assert s["steps"] == 80 and s["tokens"] == 80 * 32 * 64, s
assert s["rounds"] > 0 and s["mean_members"] >= 1, s
assert 0 < s["eval_bpb"] < 8.0, s
l = s["ledger"]
assert l["merged"] + l["late"] + l["overwritten"] + l["lost"] + l["rejected"] == l["processed"] == s["tokens"] and s["ledger_exact"], s
assert 0 < s["goodput"] <= 1 and 0 < s["uptime"] <= 1 and s["bytes_on_wire"] > 0, s
'; then pass; else fail "run --json: $(tail -n 1 "$work/run.out")"; fi
else
  fail "run failed: $(tail -5 "$work/run.err")"
fi
# A synchronous warm start: the first 15 steps as dp, then decoupled from dp's model; one run's figures.
if timeout 240 "$A" run --steps 40 --learners 2 --shards 2 --set mesh.warm_start=15 --json >"$work/warm.out" 2>"$work/warm.err"; then
  if tail -n 1 "$work/warm.out" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert s["mode"] == "decoupled" and s["steps"] == 80 and s["tokens"] == 80 * 32 * 64, s
assert s["warm_start_steps"] == 15 and s["warm_start_tokens"] == 30 * 32 * 64, s
l = s["ledger"]
assert l["merged"] + l["late"] + l["overwritten"] + l["lost"] + l["rejected"] == l["processed"] == s["tokens"] and s["ledger_exact"], s
assert l["merged"] >= 30 * 32 * 64 * 0.9, s  # dp merges (nearly) every step of its phase
assert 0 < s["goodput"] <= 1 and 0 < s["eval_bpb"] < 8.0, s
' && grep -q "warm start: the first 15 steps per learner as dp" "$work/warm.out"; then pass
  else fail "run warm start: $(tail -n 3 "$work/warm.out")"; fi
else
  fail "run warm start failed: $(tail -5 "$work/warm.err")"
fi
expect_error 2 "mesh.warm_start \\(40\\) must be below train.steps \\(40\\)" -- "$A" run --steps 40 --set mesh.warm_start=40
expect_error 2 "a warm-started run keeps no snapshots" -- "$A" run --set mesh.warm_start=5 --db "$work/warm.db"
expect_error 2 "mesh.quorum \\(3\\) must not exceed mesh.learners \\(2\\)" -- "$A" run --learners 2 --set mesh.quorum=3
expect_error 2 "unknown mode 'async'" -- "$A" run --mode async
expect_error 2 "mesh.shards \\(30\\) must not exceed mesh.fragments \\(24\\)" -- "$A" run --shards 30
expect_error 2 "mesh.learner_slowdown has 1 values for 4 learners" -- "$A" run --set mesh.learner_slowdown=2
expect_error 2 "shards lists 1 endpoints; the configuration has 2" -- \
  "$A" node --role broker --broker tcp://127.0.0.1:1 --shards tcp://127.0.0.1:2

# bench snapshot, shrunk to seconds: every figure and its baseline from one run, JSON last,
# and its temporary stores removed.
mkdir -p "$work/bench"
if timeout 120 "$A" bench snapshot --steps 20 --learners 2 --pairs 1 --write-model nano --commits 24 --rounds 1 \
    --restore-model nano --dir "$work/bench" --json >"$work/bench.out" 2>"$work/bench.err"; then
  if tail -n 1 "$work/bench.out" | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert s["command"] == "bench snapshot" and s["pairs"] == 1, s
for k in ["latency_p50_ms_off", "latency_p50_ms_on", "latency_p50_ratio", "latency_p99_ms_off", "latency_p99_ms_on",
          "latency_p99_ratio", "tokens_per_s_off", "tokens_per_s_on", "tokens_per_s_ratio", "write_store_mbps",
          "write_plain_mbps", "write_ratio", "restore_s", "restore_plain_s", "restore_ratio", "restore_flushed_ratio"]:
    assert isinstance(s[k], (int, float)) and s[k] > 0, (k, s)
assert s["latency_rounds_off"] > 0 and s["latency_rounds_on"] > 0 and s["mesh_versions_per_run"] > 1, s
assert s["snapshot_errors"] == 0 and s["restore_params"] == 120576 and s["restore_mb"] > 0.4, s
' && [[ -z $(ls -A "$work/bench") ]]; then pass
  else fail "bench snapshot --json: $(tail -n 1 "$work/bench.out"); left behind: $(ls -A "$work/bench")"; fi
else
  fail "bench snapshot failed: $(tail -5 "$work/bench.err")"
fi
expect_error 2 "unknown model size 'huge'" -- "$A" bench snapshot --write-model huge
expect_error 2 "is not a directory" -- "$A" bench snapshot --dir "$work/none"

# The checkpoint is read back by sample; --json again last.
if timeout 60 "$A" sample --checkpoint "$work/model.ckpt" --bytes 64 --prompt "The " --json >"$work/sample.out" 2>&1; then
  if tail -n 1 "$work/sample.out" | python3 -c 'import json,sys; s=json.loads(sys.stdin.read()); assert len(s["text"].encode("latin-1", "replace")) >= 1, s'; then pass
  else fail "sample --json: $(tail -n 1 "$work/sample.out")"; fi
else
  fail "sample failed: $(cat "$work/sample.out")"
fi

# A corrupted checkpoint is refused, not used.
cp "$work/model.ckpt" "$work/bad.ckpt"
printf '\x01\x02\x03' | dd of="$work/bad.ckpt" bs=1 seek=4000 conv=notrunc status=none
expect_error 1 "checksum mismatch" -- "$A" sample --checkpoint "$work/bad.ckpt"

echo "$passes passed, $failures failed"
[[ $failures -eq 0 ]]
