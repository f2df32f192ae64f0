#!/usr/bin/env bash
# Checkpoint benchmark (issue 6): per-save stall of the training loop vs the step time, background write
# bandwidth vs dd-measured disk bandwidth, and kill-to-training-again time under `suanli run --max-restarts`.
# Usage: bench/ckpt.sh [--json] [--small]   (--small: a 4-layer model instead of GPT-2 124M)
set -euo pipefail
cd "$(dirname "$0")/.."
me=ckpt.sh; . bench/lib.sh
json=0; small=0
for a in "$@"; do case "$a" in --json) json=1;; --small) small=1;; *) echo "usage: $0 [--json] [--small]" >&2; exit 2;; esac; done
S=./build/suanli
need_bin "$S"
work=$(mktemp -d /tmp/suanli-bench-ckpt-XXXXXX)
# a failed step shows the runs' logs before the work dir goes
trap 'rc=$?; [ $rc = 0 ] || { echo "ckpt.sh: failed (exit $rc)" >&2; for f in "$work"/*.log; do [ -f "$f" ] && tail -n 10 "$f" >&2; done; }; rm -rf "$work"' EXIT
# synthetic-vocab data: GPT-2 124M needs V=50257, so use a BPE corpus is not enough; use byte data with a
# 50257-entry model would mismatch. We benchmark with the byte corpus and the 124M body (V=256) unless --small.
$S data prepare --input data/tinyshakespeare.txt --output-prefix "$work/data" --tokenizer-type byte >/dev/null
if [ "$small" = 1 ]; then model="--num-layers 4 --hidden-size 256 --num-attention-heads 4"; else model="--num-layers 12 --hidden-size 768 --num-attention-heads 12"; fi
common="--data-path $work/data $model --seq-length 64 --micro-batch-size 4 --eval-interval 0 --eval-iters 1 --threads 2"
# disk bandwidth with dd on the same disk, 512 MiB: the anchor is the buffered write + fsync (conv=fsync); dd
# with O_DIRECT (8 MiB blocks, like the checkpoint writer) is printed beside it
dd_mb_s() { awk '{for(i=1;i<=NF;i++) if ($i ~ /^(kB|MB|GB)\/s$/) {v=$(i-1); if ($i=="GB/s") v*=1000; if ($i=="kB/s") v/=1000; print v}}'; }
dd_mbs=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count=512 conv=fsync 2>&1 | tail -1 | dd_mb_s)
rm -f "$work/dd.bin"
dd_direct_mbs=$(dd if=/dev/zero of="$work/dd.bin" bs=8M count=64 oflag=direct conv=fsync 2>&1 | tail -1 | dd_mb_s)
rm -f "$work/dd.bin"
log="$work/train.log"
$S train $common --train-iters 8 --save "$work/ck" --save-interval 2 >"$log" 2>&1
step_ms=$(grep -o '[0-9.]* ms/step' "$log" | awk '{print $1}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
stall_ms=$(grep -o 'stall [0-9.]* ms' "$log" | awk '{print $2}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
stall_max_ms=$(grep -o 'stall [0-9.]* ms' "$log" | awk '{print $2}' | sort -n | tail -1)
median() { sort -n | awk '{a[NR]=$1} END {print (NR ? a[int((NR+1)/2)] : 0)}'; }
write_mbs=$(grep -o '([0-9.]* MB/s' "$log" | tr -d '(' | awk '{print $1}' | median)
# the local shard file alone (its write + fsync), from "local file X s = Y MB/s"
local_mbs=$(grep -o 'local file [0-9.]* s = [0-9.]* MB/s' "$log" | awk '{print $6}' | median)
direct=$(grep -q 'MB/s O_DIRECT' "$log" && echo true || echo false)
snap_s=$(grep -o 'snapshot [0-9.]* s' "$log" | awk '{print $2}' | median)
ckpt_mib=$(du -sm "$work/ck/latest" >/dev/null 2>&1; du -sm "$work/ck/$(cat "$work/ck/latest")" | awk '{print $1}')
# kill -9 at step 5 (checkpoint every 2 steps), restart, measure kill -> next completed step
rlog="$work/restart.log"
start=$(date +%s.%N)
SUANLI_FAULT_KILL_AT_STEP=5 $S run -n 1 --max-restarts 1 -- $S train $common --train-iters 7 --save "$work/ft" --load "$work/ft" --save-interval 2 2>&1 \
  | while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$rlog"
t_kill=$(grep -m1 'killing myself' "$rlog" | awk '{print $1}')
t_detect=$(grep -m1 'restarting (1 of 1)' "$rlog" | awk '{print $1}')
t_resumed=$(grep -m1 'resumed from' "$rlog" | awk '{print $1}')
t_back=$(awk '/resumed from/ {r=1} r && / step [0-9]+\/7 / {print $1; exit}' "$rlog")
[ -n "$t_kill" ] && [ -n "$t_detect" ] && [ -n "$t_resumed" ] && [ -n "$t_back" ] ||
  { echo "ckpt.sh: the kill -9 run has no kill, restart, resume or resumed step line" >&2; exit 1; }
# "resumed from DIR at step N (LOAD s; setup WALL s, CPU CPU s)": the restarted rank's own view
res=$(grep -m1 -o 'resumed from .*' "$rlog" | grep -o '([0-9.]* s; setup [0-9.]* s, [0-9.]* CPU s)' | tr -d '(),;')
load_s=$(echo "$res" | awk '{print $1}'); setup_s=$(echo "$res" | awk '{print $4}'); setup_cpu_s=$(echo "$res" | awk '{print $6}')
first_ms=$(awk '/resumed from/ {r=1} r && / step [0-9]+\/7 / {for(i=1;i<=NF;i++) if ($i=="ms/step") print $(i-1); exit}' "$rlog")
recover_s=$(awk -v a="$t_kill" -v b="$t_back" 'BEGIN {printf "%.2f", b - a}')
detect_s=$(awk -v a="$t_kill" -v b="$t_detect" 'BEGIN {printf "%.2f", b - a}')
restart_s=$(awk -v a="$t_detect" -v b="$t_resumed" 'BEGIN {printf "%.2f", b - a}')
stall_pct=$(awk -v s="$stall_ms" -v t="$step_ms" 'BEGIN {printf "%.2f", 100 * s / t}')
local_pct=$(awk -v a="$local_mbs" -v b="$dd_mbs" 'BEGIN {printf "%.0f", (b > 0 ? 100 * a / b : 0)}')
if [ "$json" = 1 ]; then
  printf '{"bench": "ckpt", "model": "%s", "step_ms": %s, "median_stall_ms": %s, "max_stall_ms": '"$stall_max_ms"', "stall_pct_of_step": %s, "ckpt_mib": %s, "write_mb_s": %s, "snapshot_s": %s, "local_write_mb_s": %s, "o_direct": %s, "dd_mb_s": %s, "dd_direct_mb_s": %s, "local_pct_of_dd": %s, "kill_to_training_s": %s, "kill_to_detect_s": %s, "detect_to_resumed_s": %s, "load_s": %s, "setup_s": %s, "setup_cpu_s": %s, "first_step_ms": %s}\n' \
    "$([ "$small" = 1 ] && echo gpt2-L4-C256 || echo gpt2-124M-body)" "$step_ms" "$stall_ms" "$stall_pct" "$ckpt_mib" "$write_mbs" "${snap_s:-0}" "${local_mbs:-0}" "$direct" "${dd_mbs:-0}" "${dd_direct_mbs:-0}" "$local_pct" "$recover_s" "$detect_s" "$restart_s" "${load_s:-0}" "${setup_s:-0}" "${setup_cpu_s:-0}" "${first_ms:-0}"
else
  echo "step ${step_ms} ms (median); save stall median ${stall_ms} ms = ${stall_pct}% of a step (worst ${stall_max_ms} ms); checkpoint ${ckpt_mib} MiB"
  echo "writer ${write_mbs} MB/s overall (snapshot ${snap_s} s); local shard file ${local_mbs} MB/s (O_DIRECT ${direct}) = ${local_pct}% of dd ${dd_mbs:-?} MB/s (dd O_DIRECT ${dd_direct_mbs:-?} MB/s)"
  echo "kill -9 to the next trained step: ${recover_s} s = kill->restart ${detect_s} s + restart->resumed ${restart_s} s (setup ${setup_s} s wall, ${setup_cpu_s} CPU s, of which load ${load_s} s) + first step ${first_ms} ms"
fi
