#!/usr/bin/env bash
# Model-parallel throughput (issue 16, item 7): GPT-2 124M, micro-batch 4, T=64, fp32, one global batch of
# 4 micro-batches per step for every layout. (tp, pp, dp) = (2,1,1), (1,2,1), (1,1,2) and (2,2,2) with 1
# thread per rank under `suanli run`, against 1 process x 2 threads. Each record is `suanli bench train
# --json` on rank 0: tokens/s, the TP collectives' share of the step, the time blocked in pipeline receives
# (the measured bubble + transfer) beside (p-1)/(m+p-1), DP's comm wait, parameters per rank.
# (1,2,1) also runs with the uneven split the even run's record suggests (balanced_first_layers /
# balanced_last_layers: the LM head weighs V / (12 C + T) layers on the last stage; Note [Uneven pipeline
# stages]), as --decoder-first/last-pipeline-num-layers, and on that split with the ZB-H1 schedule
# (--enable-zero-bubble, Note [Zero-bubble schedule]; its bubble formula is (p-1)/(3m+p-1)).
# Usage: bench/parallel.sh [--steps N] [--repeat R] [--small] [--pp-only]   (--small: 4 layers, C=256;
# --pp-only: 1 process and the two (1,2,1) splits only)
# With --repeat R the set runs R times, interleaved, and the summary uses medians. (2,2,2) runs 8 ranks on
# however many cores the host has: on 2 cores it measures oversubscription as much as the layout.
set -euo pipefail
cd "$(dirname "$0")/.."
me=parallel.sh; . bench/lib.sh
steps=5; model=""; repeat=1; pponly=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) need "$@"; steps="$2"; shift 2;;
        --repeat) need "$@"; repeat="$2"; shift 2;;
        --small) model="--num-layers 4 --hidden-size 256 --num-attention-heads 4"; shift;;
        --pp-only) pponly=1; shift;;
        *) echo "usage: $0 [--steps N] [--repeat R] [--small] [--pp-only]" >&2; exit 2;;
    esac
done
posint --steps "$steps"; posint --repeat "$repeat"
S=./build/suanli
need_bin "$S"
out=$(mktemp /tmp/suanli-bench-par-XXXXXX)
trap 'rm -f "$out" "$out.err"' EXIT
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
run() {
    "$@" --steps "$steps" --json 2>"$out.err" | sed 's/^\[0\] //' | grep '^{"bench": "train"' | head -1 | tee -a "$out" ||
        fail_log "$out.err" "$@" --steps "$steps" --json
}
for _ in $(seq "$repeat"); do
    run $S bench train $model --threads 2 --accum 4
    [ "$pponly" = 1 ] || run $S run -n 2 -- $S bench train $model --threads 1 --accum 4 --tensor-model-parallel-size 2
    rec=$(run $S run -n 2 -- $S bench train $model --threads 1 --accum 4 --pipeline-model-parallel-size 2)
    echo "$rec"
    bal=$(echo "$rec" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); f,l=r["balanced_first_layers"],r["balanced_last_layers"]
print("--decoder-first-pipeline-num-layers %d --decoder-last-pipeline-num-layers %d" % (f, l) if f or l else "")')
    [ -n "$bal" ] && run $S run -n 2 -- $S bench train $model --threads 1 --accum 4 --pipeline-model-parallel-size 2 $bal
    run $S run -n 2 -- $S bench train $model --threads 1 --accum 4 --pipeline-model-parallel-size 2 $bal --enable-zero-bubble
    if [ "$pponly" = 0 ]; then
        run $S run -n 2 -- $S bench train $model --threads 1 --accum 2
        run $S run -n 8 -- $S bench train $model --threads 1 --accum 2 --tensor-model-parallel-size 2 \
            --pipeline-model-parallel-size 2
    fi
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" <<'PY' >&2
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
def med(sel, key="tokens_per_s"):
    v = [r[key] for r in rs if sel(r)]
    return (statistics.median(v), len(v)) if v else (float("nan"), 0)
one, n = med(lambda r: r["dp"] == 1 and r["tp"] == 1 and r["pp"] == 1)
print("# medians of %d run(s); global batch 4 x B4 x T64 per step; 1 process x 2 threads: %.1f tokens/s" % (n, one))
for (tp, pp, dp, split, zb) in [(2, 1, 1, 0, 0), (1, 2, 1, 0, 0), (1, 2, 1, 1, 0), (1, 2, 1, 1, 1), (1, 2, 1, 0, 1),
                               (1, 1, 2, 0, 0), (2, 2, 2, 0, 0)]:
    sel = lambda r, a=(tp, pp, dp), u=split, z=zb: (r["tp"], r["pp"], r["dp"]) == a and bool(r.get("first_layers") or r.get("last_layers")) == bool(u) and r.get("zero_bubble", 0) == z
    t, k = med(sel)
    if not k: continue
    fl = [(r["first_layers"], r["last_layers"]) for r in rs if sel(r)][0] if split else None
    f, _ = med(sel, "tp_comm_fraction"); w, _ = med(sel, "comm_wait_fraction")
    b, _ = med(sel, "pipe_wait_fraction"); bt, _ = med(sel, "bubble_theory"); p, _ = med(sel, "param_mib_per_rank")
    print("# (tp,pp,dp)=(%d,%d,%d)%s%s x 1 thread: %.1f tokens/s = %.2fx; TP collectives %.1f%% of step; pipeline wait "
          "%.1f%% (bubble formula %.1f%%); DP comm wait %.1f%%; %.1f MiB parameters on rank 0"
          % (tp, pp, dp, " layers %d/%d" % fl if fl else "", " ZB-H1" if zb else "", t, t / one, 100 * f, 100 * b,
             100 * bt, 100 * w, p))
PY
