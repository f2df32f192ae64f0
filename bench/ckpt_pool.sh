#!/usr/bin/env bash
# Pooled checkpoint benchmark (issue 18): GPT-2 124M body (V=256, as bench/ckpt.sh) with DP ranks acting as
# hosts under `suanli run --hosts`, node-local dirs under one work dir. Reports, per redundancy mode:
# training stall per save vs the step, rank 0's commit time, the bytes each host writes per save (own shard +
# replicas or blocks) over the background write time vs `dd conv=fsync`, and the time from a kill -9 of a
# rank whose host directory is deleted to the next trained step (restart reassembles from the surviving
# hosts; the in-memory copy is off), plus `suanli ckpt gather` read time vs dd read (page cache hot).
# The hosts share one disk here, so the host write is also set against n dd streams run at once
# (dd_shared_write_mb_s: one stream's share, the median over three rounds), n being the mode's host count.
# Usage: bench/ckpt_pool.sh [--json] [--small]
set -euo pipefail
cd "$(dirname "$0")/.."
json=0; small=0
for a in "$@"; do case "$a" in --json) json=1;; --small) small=1;; *) echo "usage: $0 [--json] [--small]" >&2; exit 2;; esac; done
S=./build/suanli
me=ckpt_pool.sh; . bench/lib.sh
need_bin "$S"
work=$(mktemp -d /tmp/suanli-bench-pool-XXXXXX)
trap 'rc=$?; [ $rc = 0 ] || { echo "ckpt_pool.sh: failed (rc $rc); logs:" >&2; tail -n 5 "$work"/*.log >&2; }; rm -rf "$work"' EXIT
$S data prepare --input data/tinyshakespeare.txt --output-prefix "$work/data" --tokenizer-type byte >/dev/null
if [ "$small" = 1 ]; then model="--num-layers 4 --hidden-size 256 --num-attention-heads 4"; else model="--num-layers 12 --hidden-size 768 --num-attention-heads 12"; fi
med() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print 0}'; }
dd_w=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count=512 conv=fsync 2>&1 | tail -1 | awk '{for(i=1;i<=NF;i++) if ($i ~ /^(MB|GB)\/s$/) {v=$(i-1); if ($i=="GB/s") v*=1000; print v}}')
dd_r=$(dd if="$work/dd.bin" of=/dev/null bs=1M 2>&1 | tail -1 | awk '{for(i=1;i<=NF;i++) if ($i ~ /^(MB|GB)\/s$/) {v=$(i-1); if ($i=="GB/s") v*=1000; print v}}')
rm -f "$work/dd.bin"
# The pretend hosts share this machine's one disk: beside the single-stream dd, each host's fair share is
# what one of n dd streams writing at the same time gets (the median stream, MB/s), for n = the mode's hosts.
dd_par() { # three rounds of n streams at once: the median stream
  local n=$1 i r
  for r in 1 2 3; do
    for i in $(seq 1 "$n"); do
      (dd if=/dev/zero of="$work/ddp$i.bin" bs=1M count=512 conv=fsync 2>&1 | tail -1 | awk '{for(i=1;i<=NF;i++) if ($i ~ /^(MB|GB)\/s$/) {v=$(i-1); if ($i=="GB/s") v*=1000; print v}}') &
    done
    wait
    rm -f "$work"/ddp*.bin
  done | med
}
load=$(cut -d' ' -f1-3 /proc/loadavg)
for mode in "replicas 2:2:--ckpt-replicas 2" "ec 2+1:3:--ckpt-ec 2+1"; do
  name=${mode%%:*}; rest=${mode#*:}; n=${rest%%:*}; flags=${rest#*:}
  common="--data-path $work/data $model --seq-length 64 --micro-batch-size 4 --global-batch-size $((4 * n)) --zero-stage 1 --eval-interval 0 --eval-iters 1 --threads 1"
  L="$work/L$n"; log="$work/train$n.log"
  SUANLI_MEM_CKPT_DIR= $S run -n "$n" -- $S train $common --train-iters 8 --save "$work/o$n" --save-interval 2 --ckpt-local-dir "$L" $flags >"$log" 2>&1
  step_ms=$(grep -o '[0-9.]* ms/step' "$log" | awk '{print $1}' | med)
  stall_ms=$(grep -o 'stall [0-9.]* ms' "$log" | awk '{print $2}' | med)
  commit_ms=$(grep -o 'commit [0-9.]* ms' "$log" | awk '{print $2}' | med)
  wsec=$(grep -o 'background write [0-9.]* s' "$log" | awk '{print $3}' | med)
  dd_h=$(dd_par "$n")
  step=$(cat "$L/host-0/latest")
  host_bytes=$(du -sb "$L/host-0/$step" | awk '{print $1}')
  host_mbs=$(awk -v b="$host_bytes" -v s="$wsec" 'BEGIN {printf "%.0f", b / 1e6 / (s > 0 ? s : 1)}')
  t0=$(date +%s.%N); $S ckpt gather "$L" "$work/g$n" >/dev/null; t1=$(date +%s.%N)
  total=$(du -sb "$work/g$n" | awk '{print $1}')
  gather_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')
  read_mbs=$(awk -v b="$total" -v s="$gather_s" 'BEGIN {printf "%.0f", b / 1e6 / s}')
  rlog="$work/restart$n.log"
  SUANLI_MEM_CKPT_DIR= SUANLI_FAULT_KILL_AT_STEP=5 SUANLI_FAULT_RANK=1 SUANLI_FAULT_LOSE_HOSTS=1 \
    $S run -n "$n" --max-restarts 1 -- $S train $common --train-iters 7 --save "$work/f$n" --load "$work/f$n" \
    --save-interval 2 --ckpt-local-dir "$work/F$n" $flags 2>&1 \
    | while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$rlog"
  t_kill=$(grep -m1 'killing myself' "$rlog" | awk '{print $1}')
  t_back=$(awk '/resumed from/ {r=1} r && / step [0-9]+\/7 / {print $1; exit}' "$rlog")
  [ -n "$t_kill" ] && [ -n "$t_back" ] || { echo "ckpt_pool.sh: $name: the kill -9 run has no kill or resumed step line" >&2; exit 1; }
  recover_s=$(awk -v a="$t_kill" -v b="$t_back" 'BEGIN {printf "%.2f", b - a}')
  stall_pct=$(awk -v s="$stall_ms" -v t="$step_ms" 'BEGIN {printf "%.2f", 100 * s / t}')
  commit_pct=$(awk -v s="$commit_ms" -v t="$step_ms" 'BEGIN {printf "%.2f", 100 * s / t}')
  if [ "$json" = 1 ]; then
    printf '{"bench": "ckpt_pool", "mode": "%s", "ranks_hosts": %s, "step_ms": %s, "stall_ms": %s, "stall_pct": %s, "commit_ms": %s, "commit_pct": %s, "host_bytes_per_save": %s, "host_write_mb_s": %s, "dd_write_mb_s": %s, "dd_shared_write_mb_s": %s, "host_vs_dd_shared": %s, "gather_s": %s, "gather_read_mb_s": %s, "dd_read_mb_s": %s, "lost_host_kill_to_training_s": %s, "load": "%s"}\n' \
      "$name" "$n" "$step_ms" "$stall_ms" "$stall_pct" "$commit_ms" "$commit_pct" "$host_bytes" "$host_mbs" "${dd_w:-0}" "${dd_h:-0}" "$(awk -v a="$host_mbs" -v b="${dd_h:-0}" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')" "$gather_s" "$read_mbs" "${dd_r:-0}" "$recover_s" "$load"
  else
    echo "$name over $n hosts: step ${step_ms} ms; stall ${stall_ms} ms (${stall_pct}%); background commit ${commit_ms} ms"
    echo "  per host per save ${host_bytes} B in ${wsec} s = ${host_mbs} MB/s vs dd ${dd_w} MB/s (${n} dd streams at once: ${dd_h} MB/s each); gather ${gather_s} s (${read_mbs} MB/s vs dd read ${dd_r} MB/s)"
    echo "  kill -9 + host dir lost -> next trained step: ${recover_s} s (load ${load})"
  fi
done
