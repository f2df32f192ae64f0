#!/usr/bin/env bash
# MoE training throughput with expert parallelism (issue 17, item 6): a small Qwen2-MoE (4 layers, C = 256,
# 8 experts of width 256, top-2, a 512-wide shared expert, V = 4096), micro-batch 4, T = 64, fp32, on this
# 2-core host. One process with 2 threads (ep = 1) against 2 ranks x 1 thread under `suanli run -n 2`: data
# parallel with every expert on both ranks (ep = 1), and the experts split (ep = 2). The global batch per step
# is the same (one process: 2 micro-batches; 2 ranks: one each). Prints one JSON line per run (`suanli bench
# moe --json`) and a summary with the medians of the interleaved repeats.
# Usage: bench/moe_ep.sh [--steps N] [--repeat R] [--capacity CF]
set -euo pipefail
cd "$(dirname "$0")/.."
me=moe_ep.sh; . bench/lib.sh
steps=6; repeat=1; cap=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) need "$@"; steps="$2"; shift 2;;
        --repeat) need "$@"; repeat="$2"; shift 2;;
        --capacity) need "$@"; cap="$2"; shift 2;;
        *) echo "usage: $0 [--steps N] [--repeat R] [--capacity CF]" >&2; exit 2;;
    esac
done
posint --steps "$steps"; posint --repeat "$repeat"
S=./build/suanli
need_bin "$S"
out=$(mktemp /tmp/suanli-bench-moe-XXXXXX)
trap 'rm -f "$out" "$out.err"' EXIT
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
run() {
    "$@" --steps "$steps" --moe-capacity-factor "$cap" --json 2>"$out.err" | sed 's/^\[0\] //' | grep '^{' | tee -a "$out" ||
        fail_log "$out.err" "$@" --steps "$steps" --moe-capacity-factor "$cap" --json
}
for _ in $(seq "$repeat"); do
    run $S bench moe --threads 2 --micro-batch-size 8
    run $S run -n 2 -- $S bench moe --threads 1 --ep 1
    run $S run -n 2 -- $S bench moe --threads 1 --ep 2
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" <<'PY' >&2
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if '"moe_train"' in l]
def med(sel, key):
    v = [r[key] for r in rs if sel(r)]
    return statistics.median(v) if v else float("nan")
one = med(lambda r: r["world"] == 1, "tokens_per_s")
for ep in (1, 2):
    sel = lambda r, ep=ep: r["world"] == 2 and r["ep"] == ep
    t = med(sel, "tokens_per_s")
    print(f"2 ranks x 1 thread, ep={ep}: {t:.1f} tokens/s = {t / one:.2f}x of 1 process x 2 threads "
          f"({one:.1f}); all-to-all {100 * med(sel, 'a2a_fraction'):.1f}% of the step, "
          f"{med(sel, 'a2a_mib_per_step'):.2f} MiB sent per rank and step; gradient waits "
          f"{100 * med(sel, 'comm_wait_fraction'):.1f}%; {med(sel, 'params_per_rank') / 1e6:.2f}M parameters per rank")
PY
