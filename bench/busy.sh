#!/usr/bin/env bash
# Shared machine (issue 20 item 4): throughput with a spinning neighbour process on one core
# (`bench train --busy`), 2 threads (adaptive: the default governor; fixed: --fixed-threads) against 1
# thread, on GPT-2 124M (B4 T64) or the baby model (--small: L4 C128 NH4 V256 B12 T64). Runs interleaved
# (--repeat R rounds) so drifting background load hits every configuration alike. Prints one JSON line per
# run (the `suanli bench train --json` record) and a summary line with each configuration's median
# tokens/s and its ratio to 1 thread.
# Usage: bench/busy.sh [--small] [--steps N] [--repeat R] [--quiet]   (--quiet: also the runs without --busy)
set -euo pipefail
S=$(realpath -m -- "${SUANLI_BIN:-$(dirname "$0")/../build/suanli}") # SUANLI_BIN: another build to compare
cd "$(dirname "$0")/.."
me=busy.sh; . bench/lib.sh
steps=""; model=""; repeat=3; quiet=0; small=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) need "$@"; steps="$2"; shift 2;;
        --repeat) need "$@"; repeat="$2"; shift 2;;
        --small) small=1; shift;;
        --quiet) quiet=1; shift;;
        *) echo "usage: $0 [--small] [--steps N] [--repeat R] [--quiet]" >&2; exit 2;;
    esac
done
if [ "$small" = 1 ]; then
    model="--num-layers 4 --hidden-size 128 --num-attention-heads 4 --vocab-size 256 --micro-batch-size 12 --seq-length 64 --warmup 3"
    steps=${steps:-60}
else
    model="--warmup 1"
    steps=${steps:-8}
fi
posint --steps "$steps"; posint --repeat "$repeat"
need_bin "$S"
out=$(mktemp /tmp/suanli-bench-busy-XXXXXX)
trap 'rm -f "$out" "$out.err"' EXIT
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
run() {
    local tag="$1"; shift
    "$S" bench train $model --steps "$steps" --json "$@" 2>"$out.err" | grep '^{' | sed "s/^{/{\"config\": \"$tag\", /" |
        tee -a "$out" || fail_log "$out.err" "$S" bench train $model --steps "$steps" --json "$@"
}
for _ in $(seq "$repeat"); do
    run 1-busy --threads 1 --busy
    run 2-adaptive-busy --threads 2 --busy
    run 2-fixed-busy --threads 2 --fixed-threads --busy
    if [ "$quiet" = 1 ]; then
        run 1-quiet --threads 1
        run 2-quiet --threads 2
    fi
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" <<'PY'
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
cfgs = []
for r in rs:
    if r["config"] not in cfgs: cfgs.append(r["config"])
med = {c: statistics.median(r["tokens_per_s"] for r in rs if r["config"] == c) for c in cfgs}
one = med.get("1-busy")
print(json.dumps({"bench": "busy", "rounds": sum(r["config"] == "1-busy" for r in rs),
                  "median_tokens_per_s": med,
                  "ratio_to_1_thread_busy": {c: round(med[c] / one, 3) for c in cfgs if one},
                  "mean_threads_adaptive": statistics.mean(r["mean_threads"] for r in rs
                                                           if r["config"] == "2-adaptive-busy")}))
PY
