#!/usr/bin/env bash
# Planner validation on this host (issue 15): real `suanli train` runs (1 process, and `suanli run -n 2`
# with ZeRO 0-3), one thread per rank, against `suanli plan`'s prediction for the same layout on
# configs/cluster/this-host.json.
# Step time, two measurements: (a) wall: median ms_per_step of metrics.jsonl after step 1; (b) CPU: the
# CPU seconds (user + sys, every rank, divided by the ranks) of a run of STEPS+1 steps minus those of a
# 1-step run, per step. The host is shared by several engineers: under load (a) is inflated by waiting for
# a core, while (b) counts only this job's own work, which is what a step costs on an idle core (a rank
# that spin-waits in a collective counts that too). Each row gives the 1-minute load average.
# Memory per rank: the banner's allocation sizes (params, grads, shard, optimizer, slots; one process:
# 16 B x parameters) + the planned activation arena.
# TP and PP (--par, or --par-only): tp 2 (1 and 4 micro-batches per step; also with sequence parallelism
# and full recomputation) and pp 2 (1F1B over 4; also recomputing) on 2 processes (the planner models even stages only; tp 2 x pp 2 needs 4 cores, this host has 2); memory is rank 0's (TP: params + grads + optimizer from the banner;
# PP: 16 B x the stage's parameters) + its planned arena, against the planner's fullest device.
# --probe: the planner calibrates the device on this host (`suanli plan --probe --threads 1`: GEMM rate and
# copy bandwidth) instead of taking this-host.json's Zen 4 figures (hosts differ: an Intel core with AMX
# measures 1.4-1.8x that GEMM rate).
# Usage: bench/plan_validate.sh [--steps N] [--big] [--par | --par-only] [--probe]   (--big adds GPT-2 L12 C768, 85M)
set -euo pipefail
cd "$(dirname "$0")/.."
me=plan_validate.sh; . bench/lib.sh
steps=10; big=0; par=0; dpruns=1; probe=()
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) need "$@"; steps="$2"; shift 2;;
        --big) big=1; shift;;
        --par) par=1; shift;;
        --par-only) par=1; dpruns=0; shift;;
        --probe) probe=(--probe --threads 1); shift;;
        *) echo "usage: $0 [--steps N] [--big] [--par | --par-only] [--probe]" >&2; exit 2;;
    esac
done
posint --steps "$steps"
S=$PWD/build/suanli
need_bin "$S"
tmp=$(mktemp -d /tmp/suanli-plan-val-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
$S data prepare --input data/tinyshakespeare.txt --output-prefix "$tmp/tok" > /dev/null
echo "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| model | layout | load | wall ms/step (median) | CPU ms/step | predicted | error vs CPU | error vs wall | MiB/rank | predicted | error |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
TIMEFORMAT='%U %S'
# run_cpu STEPS LOG CMD...: runs CMD with --train-iters STEPS, prints user+sys seconds of it and its children;
# a failed run stops the script with its log (the callers' c1=$(...) fails: errexit is off inside $(...))
run_cpu() {
    local n=$1 log=$2; shift 2
    local t
    t=$( { time "$@" --train-iters "$n" > "$log" 2>&1; } 2>&1 ) || fail_log "$log" "$@" --train-iters "$n"
    awk '{print $1 + $2}' <<<"$t"
}
one() { # L C H B n zero
    local L=$1 C=$2 H=$3 B=$4 n=$5 z=$6 run="$tmp/run-$1-$2-$4-$5-$6"
    local model="--num-layers $L --hidden-size $C --num-attention-heads $H"
    local train=($S train --data-path "$tmp/tok" $model --seq-length 64 --micro-batch-size "$B" --threads 1
                 --eval-iters 1 --eval-interval 0 --log-interval 1)
    local zf=""; [ "$n" -gt 1 ] && zf="--zero $z"
    local pre=(); [ "$n" -gt 1 ] && pre=($S run -n "$n" --)
    local post=(); [ "$n" -gt 1 ] && post=(--zero-stage "$z")
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    local c1 cN
    c1=$(run_cpu 1 "$run.1.log" "${pre[@]}" "${train[@]}" "${post[@]}")
    rm -rf "$run"
    cN=$(run_cpu $((steps + 1)) "$run.log" "${pre[@]}" "${train[@]}" "${post[@]}" --save "$run")
    echo "{\"num_layers\": $L, \"hidden_size\": $C, \"num_attention_heads\": $H, \"vocab_size\": 256, \"seq_length\": 64}" > "$tmp/m.json"
    $S plan --model "$tmp/m.json" --cluster configs/cluster/this-host.json --devices "$n" --dp "$n" --micro-batch "$B" \
        --global-batch $((B * n)) --seq-len 64 --recompute none $zf --json --top 1 "${probe[@]}" | grep -v '^probe:' > "$tmp/plan.json"
    python3 - "$run" "$tmp/plan.json" "$L" "$C" "$B" "$n" "$z" "$load" "$c1" "$cN" "$steps" <<'PY'
import json, re, statistics, sys
run, planf, L, C, B, n, z, load, c1, cN, steps = sys.argv[1:]
log = open(run + ".log").read()
ms = [json.loads(l)["ms_per_step"] for l in open(run + "/metrics.jsonl")][1:]
wall = statistics.median(ms)
cpu = (float(cN) - float(c1)) / int(steps) / int(n) * 1e3
act = float(re.search(r"activation memory: planned ([0-9.]+) MiB", log).group(1))
m = re.search(r"per rank: params ([0-9.]+) MiB, grads ([0-9.]+) MiB \(\+ ([0-9.]+) MiB reduced shard\), optimizer state ([0-9.]+) MiB(?:, slots ([0-9.]+) MiB)?", log)
if m:
    mem = sum(float(x) for x in m.groups() if x) + act
else:
    mem = 16 * float(re.search(r"\| ([0-9.]+)M params", log).group(1)) * 1e6 / 1048576 + act
p = json.loads(open(planf).readline())
pms, pmem = p["step_sec"] * 1e3, p["mem_total"] / 1048576
lay = "1 process" if n == "1" else f"DP={n} ZeRO-{z}"
print(f"| GPT-2 L{L} C{C} T64 B{B} | {lay} | {load} | {wall:.1f} | {cpu:.1f} | {pms:.1f} | {100*(pms/cpu-1):+.1f}% | {100*(pms/wall-1):+.1f}% | {mem:.1f} | {pmem:.1f} | {100*(pmem/mem-1):+.2f}% |")
PY
}
# par L C H B tp pp accum [extra train flags]: tp x pp on tp*pp processes, dp 1
par() {
    local L=$1 C=$2 H=$3 B=$4 tp=$5 pp=$6 acc=$7; shift 7
    local extra=("$@"); local n=$((tp * pp)) run="$tmp/par-$L-$C-$B-$tp-$pp-$acc-$#"
    local model="--num-layers $L --hidden-size $C --num-attention-heads $H"
    local train=($S train --data-path "$tmp/tok" $model --seq-length 64 --micro-batch-size "$B" --threads 1
                 --global-batch-size $((B * acc)) --eval-iters 1 --eval-interval 0 --log-interval 1
                 --tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp" "${extra[@]}")
    local pre=($S run -n "$n" --)
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    local c1 cN
    c1=$(SUANLI_COMM_ALGO=direct run_cpu 1 "$run.1.log" "${pre[@]}" "${train[@]}")
    rm -rf "$run"
    cN=$(SUANLI_COMM_ALGO=direct run_cpu $((steps + 1)) "$run.log" "${pre[@]}" "${train[@]}" --save "$run")
    echo "{\"num_layers\": $L, \"hidden_size\": $C, \"num_attention_heads\": $H, \"vocab_size\": 256, \"seq_length\": 64}" > "$tmp/m.json"
    $S plan --model "$tmp/m.json" --cluster configs/cluster/this-host.json --devices "$n" --dp 1 --tp "$tp" --pp "$pp" \
        --micro-batch "$B" --global-batch $((B * acc)) --seq-len 64 --zero 0 --json --top 1 \
        --recompute "$([[ " ${extra[*]} " == *" --recompute-granularity full "* ]] && echo full || echo none)" \
        --sequence-parallel "$([[ " ${extra[*]} " == *" --sequence-parallel "* ]] && echo on || echo off)" \
        "${probe[@]}" | grep -v '^probe:' > "$tmp/plan.json"
    python3 - "$run" "$tmp/plan.json" "$L" "$C" "$B" "$n" "$tp" "$pp" "$acc" "$load" "$c1" "$cN" "$steps" "${extra[*]}" <<'PY'
import json, re, statistics, sys
run, planf, L, C, B, n, tp, pp, acc, load, c1, cN, steps, extra = sys.argv[1:]
log = open(run + ".log").read()
ms = [json.loads(l)["ms_per_step"] for l in open(run + "/metrics.jsonl")][1:]
wall = statistics.median(ms)
cpu = (float(cN) - float(c1)) / int(steps) / int(n) * 1e3
act = float(re.search(r"activation memory: planned ([0-9.]+) MiB", log).group(1))
m = re.search(r"tensor parallel: \d+ ranks[^|]*\| per rank: params ([0-9.]+) MiB \(whole model [0-9.]+ MiB\), grads ([0-9.]+) MiB, optimizer state ([0-9.]+) MiB", log)
if m and pp == "1":
    mem = sum(float(x) for x in m.groups()) + act
else:
    mem = 4 * float(re.search(r"stage 0: (?:layers [0-9-]+, )?[0-9]+ graph slots, params ([0-9.]+) MiB", log).group(1)) + act
p = json.loads(open(planf).readline())
pms, pmem = p["step_sec"] * 1e3, p["mem_total"] / 1048576
lay = (f"TP={tp}" if pp == "1" else f"PP={pp}" if tp == "1" else f"TP={tp} x PP={pp}") + f" m={acc}"
if extra: lay += " " + extra.replace("--decoder-first-pipeline-num-layers ", "first ").replace("--decoder-last-pipeline-num-layers ", "last ")
print(f"| GPT-2 L{L} C{C} T64 B{B} | {lay} | {load} | {wall:.1f} | {cpu:.1f} | {pms:.1f} | {100*(pms/cpu-1):+.1f}% | {100*(pms/wall-1):+.1f}% | {mem:.1f} | {pmem:.1f} | {100*(pmem/mem-1):+.2f}% |")
PY
}
if [ "$dpruns" = 1 ]; then
one 4 256 4 8 1 0
for z in 0 1 2 3; do one 4 256 4 8 2 "$z"; done
one 4 256 4 32 1 0
one 4 256 4 32 2 1
fi
if [ "$par" = 1 ]; then
    one 4 256 4 8 1 0
    par 4 256 4 8 2 1 1
    par 4 256 4 8 2 1 4
    par 4 256 4 8 1 2 4
    par 4 256 4 8 2 1 1 --sequence-parallel
    par 4 256 4 8 2 1 1 --recompute-granularity full
    par 4 256 4 8 2 1 1 --sequence-parallel --recompute-granularity full
    par 4 256 4 8 1 2 4 --recompute-granularity full
fi
if [ "$big" = 1 ]; then
    one 12 768 12 4 1 0
    for z in 0 1 2 3; do one 12 768 12 4 2 "$z"; done
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
