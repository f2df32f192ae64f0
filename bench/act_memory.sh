#!/usr/bin/env bash
# Per-rank activation memory under tensor / sequence / pipeline parallelism (issue 16, item 2): GPT-2 124M,
# micro-batch 1, T=1024, fp32, planned by `suanli bench train --plan-only` (the activation arena the graph
# planner reserves on rank 0: activations kept for backward plus backward's working set, after liveness
# reuse), beside Korthikanti et al. 2022's per-layer formula for stored activations (16-bit, with dropout
# masks): sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t + 5as/(ht)) with TP, sbh/t (34 + 5as/h) with
# TP + SP. suanli has no dropout and keeps fp32 activations, so the absolute numbers differ by design; the
# columns to compare are the ratios to the unsplit model. Prints a markdown table.
# Usage: bench/act_memory.sh [T]
set -euo pipefail
cd "$(dirname "$0")/.."
me=act_memory.sh; . bench/lib.sh
[ $# -le 1 ] || { echo "usage: $0 [T]" >&2; exit 2; }
T=${1:-1024}
posint T "$T"
S=./build/suanli
need_bin "$S"
args="--plan-only --micro-batch-size 1 --seq-length $T --threads 1"
out=$(mktemp /tmp/suanli-actmem-XXXXXX)
trap 'rm -f "$out" "$out.err"' EXIT
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
plan() { "$@" 2>"$out.err" | sed 's/^\[0\] //' | grep '^{"bench": "train_plan"' | head -1 >>"$out" || fail_log "$out.err" "$@"; }
plan $S bench train $args
plan $S run -n 2 -- $S bench train $args --tensor-model-parallel-size 2
plan $S run -n 2 -- $S bench train $args --tensor-model-parallel-size 2 --sequence-parallel
plan $S run -n 4 -- $S bench train $args --tensor-model-parallel-size 4
plan $S run -n 4 -- $S bench train $args --tensor-model-parallel-size 4 --sequence-parallel
plan $S run -n 2 -- $S bench train $args --pipeline-model-parallel-size 2 --accum 2
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" <<'PY'
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
base = rs[0]
s, b, h, a, L = base["T"], base["B"], base["C"], base["NH"], base["L"]
def formula(t, sp):
    if t == 1: return s*b*h*(34 + 5*a*s/h)
    if sp: return s*b*h/t*(34 + 5*a*s/h)
    return s*b*h*(10 + 24/t + 5*a*s/(h*t))
f0 = formula(1, 0)
print("| layout (rank 0) | planned activations MiB | ratio to unsplit | Korthikanti per-layer MiB (16-bit) | formula ratio |")
print("|---|---|---|---|---|")
for r in rs:
    t, sp, pp = r["tp"], r["sp"], r["pp"]
    f = formula(t, sp)
    name = "tp=%d%s%s" % (t, " +SP" if sp else "", " pp=%d (stage 0, 2 micro-batches in flight)" % pp if pp > 1 else "")
    fr = f / f0 if pp == 1 else float("nan")
    print("| %s | %.1f | %.2f | %.1f | %s |" % (name, r["activation_mib"], r["activation_mib"] / base["activation_mib"],
          f / 2**20, "%.2f" % fr if pp == 1 else "(p - s) x 1/p of the layers"))
PY
