#!/usr/bin/env bash
# The user-facing bench/ and scripts/ entry points: bad input exits non-zero with a one-line error naming the
# flag or file (before any run), and a failing inner command's error reaches stderr
# (bench/time_to_loss.sh: it used to exit 2 with nothing printed). A few seconds.
#   tests/e2e/test_bench_scripts.sh SRC_DIR BUILD_DIR
set -uo pipefail
src=$1 cli=$2/suanli
tmp=$(mktemp -d /tmp/sl-test-bench-scripts.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bad=0
# expect RC PATTERN CMD...: CMD exits with RC and its stderr matches PATTERN (grep -E)
expect() {
  local want=$1 pat=$2 rc=0
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  if [ "$rc" != "$want" ] || { [ -n "$pat" ] && ! grep -Eq -- "$pat" "$tmp/err"; }; then
    echo "FAIL: $* -> exit $rc (want $want), stderr: $(head -c 400 "$tmp/err")"
    bad=1
  fi
}
b=$src/bench
expect 2 "unknown argument '--bogus'" bash "$b/time_to_loss.sh" --bogus
expect 2 "--iters needs a value" bash "$b/time_to_loss.sh" --iters
expect 2 "--iters 'x' is not a positive integer" bash "$b/time_to_loss.sh" --iters x
expect 2 "--threads '2 a' is not" bash "$b/time_to_loss.sh" --threads "2 a"
expect 2 "/nonexistent/suanli: not an executable" env SUANLI=/nonexistent/suanli bash "$b/time_to_loss.sh"
for s in dp moe_ep moe_packed parallel busy bf16_demo plan_validate; do
  expect 2 "--steps 'x' is not a positive integer" bash "$b/$s.sh" --steps x
  expect 2 "--steps needs a value" bash "$b/$s.sh" --steps
  expect 2 "usage:" bash "$b/$s.sh" --bogus
done
expect 2 "T 'x' is not a positive integer" bash "$b/act_memory.sh" x
expect 2 "usage:" bash "$b/ckpt.sh" --bogus
expect 2 "usage:" bash "$b/ckpt_pool.sh" --bogus
expect 2 "/nonexistent/suanli: no such executable" env SUANLI_BIN=/nonexistent/suanli bash "$b/busy.sh"
expect 2 "SUANLI_CLI '/nonexistent' is not an executable" sh "$b/comm_hosts.sh" /nonexistent
expect 2 "HOSTS 'x' is not" sh "$b/comm_hosts.sh" "$cli" x
expect 2 "wrong number of arguments" bash "$b/plan_hosts.sh"
expect 2 "STEPS 'x' is not" bash "$b/plan_hosts.sh" "$cli" 1gbit x
expect 2 "the size 'big' is not" bash "$b/ckpt_pool_net.sh" "$cli" 1gbit big
expect 2 "usage:" bash "$b/llama7b_bf16.sh" a b
expect 2 "--launches must be at least 1" python3 "$b/comm_ratio.py" --launches 0
expect 2 "/nonexistent: not an executable" bash "$src/scripts/bitwise_ab.sh" /nonexistent "$cli"
expect 2 "--rounds 'x' is not a positive integer" bash "$b/ops_ab.sh" --rounds x "$cli" "$cli"
expect 2 "give two suanli binaries" bash "$b/ops_ab.sh" "$cli"
expect 2 "/nonexistent: no such executable" bash "$b/ops_ab.sh" "$cli" /nonexistent
expect 2 "usage:" bash "$src/scripts/fuzz.sh" --bogus
expect 2 "usage:" bash "$src/scripts/cuda_toolkit.sh" --bogus
expect 2 "usage:" bash "$src/scripts/deps.sh" --bogus

# a failing inner command: its error reaches stderr (a stand-in suanli whose train fails)
printf '#!/bin/sh\n[ "$1" = train ] && { echo "suanli train: injected failure" >&2; exit 2; }\nexec "%s" "$@"\n' "$cli" >"$tmp/suanli"
chmod +x "$tmp/suanli"
expect 1 "injected failure" env SUANLI="$tmp/suanli" bash "$b/time_to_loss.sh" --iters 5 --threads 1
# and a short real run below the config's 100 warmup steps (it used to exit 2 silently): one JSON record
expect 0 "" env SUANLI="$cli" bash "$b/time_to_loss.sh" --iters 5 --threads 1 --json
grep -Eq '"impl": "suanli".*"iters": 5, "threads": 1,.*"val_loss": [0-9.]+,' "$tmp/out" ||
  { echo "FAIL: time_to_loss.sh --iters 5: $(cat "$tmp/out" "$tmp/err")"; bad=1; }
# --bf16 runs (suanli train --bf16) and its record says so
expect 0 "" env SUANLI="$cli" bash "$b/time_to_loss.sh" --iters 5 --threads 1 --json --bf16
grep -Eq '"impl": "suanli", "precision": "bf16".*"iters": 5, "threads": 1,.*"val_loss": [0-9.]+,' "$tmp/out" ||
  { echo "FAIL: time_to_loss.sh --bf16: $(cat "$tmp/out" "$tmp/err")"; bad=1; }
[ $bad = 0 ] && echo "bench/scripts entry points: OK"
exit $bad
