#!/usr/bin/env bash
# Planner validation on this host (issue 15): real `suanli train` runs (1 process, and `suanli run -n 2`
# with ZeRO 0-3), one thread per rank, against `suanli plan`'s prediction for the same layout on
# configs/cluster/this-host.json. Step time: median ms_per_step of metrics.jsonl after the first step.
# Memory per rank: the banner's allocation sizes (params, grads, shard, optimizer, slots; one process:
# 16 B x parameters) + the planned activation arena. Prints one markdown row per run.
# Usage: bench/plan_validate.sh [--steps N] [--big]   (--big adds GPT-2 L12 C768, 85M parameters)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=8; big=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps="$2"; shift 2;;
        --big) big=1; shift;;
        *) echo "usage: $0 [--steps N] [--big]" >&2; exit 2;;
    esac
done
S=$PWD/build/suanli
tmp=$(mktemp -d /tmp/suanli-plan-val-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
$S data prepare --input data/tinyshakespeare.txt --output-prefix "$tmp/tok" > /dev/null
echo "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| model | layout | load | measured ms/step | predicted (file) | error | predicted (probe) | error | measured MiB/rank | predicted | error |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
one() { # L C H B n zero
    local L=$1 C=$2 H=$3 B=$4 n=$5 z=$6 run="$tmp/run-$1-$2-$4-$5-$6"
    local model="--num-layers $L --hidden-size $C --num-attention-heads $H"
    local train="$S train --data-path $tmp/tok $model --seq-length 64 --micro-batch-size $B --train-iters $steps --threads 1 --eval-iters 1 --eval-interval 0 --log-interval 1 --save $run"
    local zf=""; [ "$n" -gt 1 ] && zf="--zero $z"
    echo "{\"num_layers\": $L, \"hidden_size\": $C, \"num_attention_heads\": $H, \"vocab_size\": 256, \"seq_length\": 64}" > "$tmp/m.json"
    local pargs="--model $tmp/m.json --cluster configs/cluster/this-host.json --devices $n --dp $n --micro-batch $B --global-batch $((B * n)) --seq-len 64 --recompute none $zf --json --top 1"
    $S plan $pargs --probe --threads 1 | grep '^{' > "$tmp/probe.json"   # calibrated right before the run
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    if [ "$n" = 1 ]; then $train > "$run.log" 2>&1
    else $S run -n "$n" -- $train --zero-stage "$z" > "$run.log" 2>&1; fi
    $S plan $pargs > "$tmp/plan.json"
    python3 - "$run" "$tmp/plan.json" "$L" "$C" "$B" "$n" "$z" "$tmp/probe.json" "$load" <<'PY'
import json, re, statistics, sys
run, planf, L, C, B, n, z, probef, load = sys.argv[1:]
log = open(run + ".log").read()
ms = [json.loads(l)["ms_per_step"] for l in open(run + "/metrics.jsonl")][1:]
meas_ms = statistics.median(ms)
act = float(re.search(r"activation memory: planned ([0-9.]+) MiB", log).group(1))
m = re.search(r"per rank: params ([0-9.]+) MiB, grads ([0-9.]+) MiB \(\+ ([0-9.]+) MiB reduced shard\), optimizer state ([0-9.]+) MiB(?:, slots ([0-9.]+) MiB)?", log)
if m:
    mem = sum(float(x) for x in m.groups() if x) + act
else:
    mem = 16 * float(re.search(r"\| ([0-9.]+)M params", log).group(1)) * 1e6 / 1048576 + act
p = json.loads(open(planf).readline())
q = json.loads(open(probef).readline())
pms, qms, pmem = p["step_sec"] * 1e3, q["step_sec"] * 1e3, p["mem_total"] / 1048576
lay = "1 process" if n == "1" else f"DP={n} ZeRO-{z}"
print(f"| GPT-2 L{L} C{C} T64 B{B} | {lay} | {load} | {meas_ms:.1f} | {pms:.1f} | {100*(pms/meas_ms-1):+.1f}% | {qms:.1f} | {100*(qms/meas_ms-1):+.1f}% | {mem:.1f} | {pmem:.1f} | {100*(pmem/mem-1):+.2f}% |")
PY
}
one 4 256 4 8 1 0
for z in 0 1 2 3; do one 4 256 4 8 2 "$z"; done
one 4 256 4 32 1 0
one 4 256 4 32 2 1
if [ "$big" = 1 ]; then
    one 12 768 12 4 1 0
    for z in 0 1 2 3; do one 12 768 12 4 2 "$z"; done
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
