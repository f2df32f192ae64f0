#!/usr/bin/env bash
# Data-parallel throughput (issue 5): GPT-2 124M, micro-batch 4, T=64, fp32, on this 2-core host.
# One process with 2 threads (one micro-batch per step, and two: the same global batch as DP=2) against
# DP=2 with 1 thread per rank under `suanli run -n 2`, for ZeRO stages 0-3. Prints one JSON line per run
# (the `suanli bench train --json` record, plus the per-rank memory record under DP) and a summary.
# Usage: bench/dp.sh [--steps N] [--repeat R] [--small]   (--small: 4 layers, C=256, for a quick check)
# With --repeat R the whole set runs R times, interleaved (so drifting background load hits every
# configuration alike), and the summary uses each configuration's median.
set -euo pipefail
cd "$(dirname "$0")/.."
me=dp.sh; . bench/lib.sh
steps=5; model=""; repeat=1
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) need "$@"; steps="$2"; shift 2;;
        --repeat) need "$@"; repeat="$2"; shift 2;;
        --small) model="--num-layers 4 --hidden-size 256 --num-attention-heads 4"; shift;;
        *) echo "usage: $0 [--steps N] [--repeat R] [--small]" >&2; exit 2;;
    esac
done
posint --steps "$steps"; posint --repeat "$repeat"
S=./build/suanli
need_bin "$S"
out=$(mktemp /tmp/suanli-bench-dp-XXXXXX)
trap 'rm -f "$out" "$out.err"' EXIT
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# run CMD...: its JSON records (rank 0's) to stdout and $out; a run that fails or prints none stops the script
# with its stderr
run() {
    "$@" --steps "$steps" --json 2>"$out.err" | sed 's/^\[0\] //' | grep '^{' | tee -a "$out" ||
        fail_log "$out.err" "$@" --steps "$steps" --json
}
for _ in $(seq "$repeat"); do
    run $S bench train $model --threads 2
    run $S bench train $model --threads 2 --accum 2
    run $S bench train $model --threads 1
    for z in 0 1 2 3; do run $S run -n 2 -- $S bench train $model --threads 1 --zero-stage "$z"; done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" <<'EOF' >&2
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if '"bench": "train"' in l]
def med(sel, key="tokens_per_s"):
    v = [r[key] for r in rs if sel(r)]
    return statistics.median(v), len(v)
one, n1 = med(lambda r: r["dp"] == 1 and r["threads"] == 2 and r["accum"] == 1)
one2, _ = med(lambda r: r["dp"] == 1 and r["threads"] == 2 and r["accum"] == 2)
single1, _ = med(lambda r: r["dp"] == 1 and r["threads"] == 1)
print("# medians of %d run(s): 1 process x 2 threads %.1f tokens/s (2 micro-batches per step: %.1f), x 1 thread %.1f"
      % (n1, one, one2, single1))
for z in range(4):
    sel = lambda r, z=z: r["dp"] == 2 and r["zero_stage"] == z
    t, n = med(sel)
    w, _ = med(sel, "comm_wait_fraction")
    print("# DP=2 x 1 thread, ZeRO-%d: %.1f tokens/s = %.2fx one process x 2 threads, %.2fx at the same global "
          "batch; comm wait %.1f%% of step" % (z, t, t / one, t / one2, 100 * w))
EOF
