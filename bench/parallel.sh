#!/usr/bin/env bash
# Model parallelism throughput (issue 16, item 7): GPT-2 124M, micro-batch 4, T=64, fp32, on this host.
# Layouts (tp, pp, dp) with 1 thread per rank under `suanli run`, against 1 process x 2 threads (the same
# global batch: one micro-batch per step for tp, two for dp=2). Each record is `suanli bench train --json`
# (tokens/s, the TP collectives' share of the step, per-rank parameter MiB). Pipeline layouts are listed
# once pipeline parallelism lands (the bench refuses --pp today).
# Usage: bench/parallel.sh [--steps N] [--repeat R] [--small]   (--small: 4 layers, C=256)
# With --repeat R the set runs R times, interleaved, and the summary uses medians.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=5; model=""; repeat=1
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps="$2"; shift 2;;
        --repeat) repeat="$2"; shift 2;;
        --small) model="--num-layers 4 --hidden-size 256 --num-attention-heads 4"; shift;;
        *) echo "usage: $0 [--steps N] [--repeat R] [--small]" >&2; exit 2;;
    esac
done
S=./build/suanli
out=$(mktemp /tmp/suanli-bench-par-XXXXXX)
trap 'rm -f "$out"' EXIT
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
run() { "$@" --steps "$steps" --json 2>/dev/null | sed 's/^\[0\] //' | grep '"bench": "train"' | tee -a "$out"; }
for _ in $(seq "$repeat"); do
    run $S bench train $model --threads 2
    run $S bench train $model --threads 2 --accum 2
    run $S run -n 2 -- $S bench train $model --threads 1 --tensor-model-parallel-size 2
    run $S run -n 2 -- $S bench train $model --threads 1
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" <<'PY' >&2
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
def med(sel, key="tokens_per_s"):
    v = [r[key] for r in rs if sel(r)]
    return (statistics.median(v), len(v)) if v else (float("nan"), 0)
one, n = med(lambda r: r["dp"] == 1 and r["tp"] == 1 and r["accum"] == 1)
one2, _ = med(lambda r: r["dp"] == 1 and r["tp"] == 1 and r["accum"] == 2)
print("# medians of %d run(s): 1 process x 2 threads %.1f tokens/s (2 micro-batches per step: %.1f)" % (n, one, one2))
for name, sel, base in [("(tp,pp,dp)=(2,1,1)", lambda r: r["tp"] == 2 and r["dp"] == 1, one),
                        ("(tp,pp,dp)=(1,1,2)", lambda r: r["tp"] == 1 and r["dp"] == 2, one2)]:
    t, _ = med(sel)
    f, _ = med(sel, "tp_comm_fraction")
    w, _ = med(sel, "comm_wait_fraction")
    p, _ = med(sel, "param_mib_per_rank")
    print("# %s x 1 thread: %.1f tokens/s = %.2fx one process x 2 threads at the same global batch; TP "
          "collectives %.1f%% of step, DP comm wait %.1f%%; %.1f MiB parameters per rank" % (name, t, t / base, 100 * f, 100 * w, p))
PY
