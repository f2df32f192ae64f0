#!/usr/bin/env bash
# Pooled checkpoints across network-namespace hosts (issue 18 item 4: per-host write and read bandwidth
# against dd and the shaped network). H hosts (tests/comm/netns_cluster.sh), one rank each, each host's link
# shaped to RATE (tc tbf; DELAY=US adds latency with the delay line), node-local dirs L/host-<h> on this
# machine's one disk. Per mode (replicas 2 on 2 hosts, EC 2+1 on 3 hosts):
#  - the link, measured in the same run: a 2-rank all-reduce of 16 MiB between h0 and h1 (each rank sends
#    and receives N, so N / time is one direction's rate);
#  - training with a save every SAVE_EVERY steps: the stall per save, and each host's write rate: the bytes
#    of host 0's step dir (own shard + the peer's replica, or three erasure-code blocks) over rank 0's
#    background write time; the bytes that crossed host 0's link each way per save (the replica or the two
#    blocks it received; by symmetry what it sent) over the same time, against the link;
#  - the restore after host 1's directory is lost: a restart on the same hosts reassembles host 1's step
#    from the others over the network (the "reassembled from ... (H hosts, S s)" line) and the bytes it
#    rebuilds (its .restore step dir: the manifest's files, manifest.json and config.json).
# The in-memory copy is off (SUANLI_MEM_CKPT_DIR=). `dd conv=fsync` of 512 MiB is run beside.
# MODES="replicas ec" (the default) picks the modes.
# usage: [DELAY=US] [MODES=replicas|ec] bench/ckpt_pool_net.sh SUANLI_CLI [RATE [small|124m [STEPS [SAVE_EVERY]]]]   (root)
set -u
usage() { echo "ckpt_pool_net.sh: $*; usage: [DELAY=US] [MODES=replicas|ec] bash bench/ckpt_pool_net.sh SUANLI_CLI [RATE [small|124m [STEPS [SAVE_EVERY]]]]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 5 ] || usage "wrong number of arguments"
[ -f "$1" ] && [ -x "$1" ] || usage "SUANLI_CLI '$1' is not an executable"
CLI=$(readlink -f "$1"); RATE=${2:-1gbit}; SIZE=${3:-small}; STEPS=${4:-8}; EVERY=${5:-2}; DELAY=${DELAY:-}
[ "$SIZE" = small ] || [ "$SIZE" = 124m ] || usage "the size '$SIZE' is not small or 124m"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || usage "STEPS '$STEPS' is not a positive integer"
[[ $EVERY =~ ^[1-9][0-9]*$ ]] && [ "$EVERY" -le "$STEPS" ] || usage "SAVE_EVERY '$EVERY' is not a positive integer <= STEPS"
for m in ${MODES:-replicas ec}; do [ "$m" = replicas ] || [ "$m" = ec ] || usage "MODES: '$m' is not replicas or ec"; done
HERE=$(cd "$(dirname "$0")" && pwd)
export NC_DELAYLINE=${NC_DELAYLINE:-$(dirname "$CLI")/tests/comm/sl_delayline}
. "$HERE/../tests/comm/netns_cluster.sh"
W=$(mktemp -d /tmp/sl-poolnet.XXXXXX)
trap 'nc_cleanup; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
trap 'exit 1' INT TERM
"$CLI" data prepare --input "$HERE/../data/tinyshakespeare.txt" --output-prefix "$W/data" --tokenizer-type byte > /dev/null || exit 1
if [ "$SIZE" = small ]; then model="--num-layers 4 --hidden-size 256 --num-attention-heads 4"
else model="--num-layers 12 --hidden-size 768 --num-attention-heads 12"; fi
mbs() { awk '{for(i=1;i<=NF;i++) if ($i ~ /^(MB|GB)\/s$/) {v=$(i-1); if ($i=="GB/s") v*=1000; print v}}'; }
med() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print 0}'; }
dd_w=$(dd if=/dev/zero of="$W/dd.bin" bs=1M count=512 conv=fsync 2>&1 | tail -1 | mbs); rm -f "$W/dd.bin"
echo "# $(date -u +%FT%TZ) rate=$RATE delay_us=${DELAY:-0} model=$SIZE cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" load=\"$(cut -d' ' -f1-3 /proc/loadavg)\" dd_conv_fsync_mb_s=$dd_w"
# hosts_run N PORT NAME ARGS...: `suanli train ARGS` with one rank on each of hosts 0..N-1; host h's log NAME.h<h>
hosts_run() {
  local n=$1 port=$2 name=$3; shift 3
  local pids="" h
  for h in $(seq 1 $((n - 1))); do
    nc_exec $h env SUANLI_MEM_CKPT_DIR= timeout 600 "$CLI" run -n 1 --nnodes $n --node-rank $h --master $(nc_addr 0):$port -- \
      "$CLI" train "$@" > "$W/$name.h$h" 2>&1 &
    pids="$pids $!"
  done
  nc_exec 0 env SUANLI_MEM_CKPT_DIR= timeout 600 "$CLI" run -n 1 --nnodes $n --node-rank 0 --master $(nc_addr 0):$port -- \
    "$CLI" train "$@" > "$W/$name.h0" 2>&1 || { tail -n 15 "$W/$name".h* >&2; echo "FAIL: $name" >&2; exit 1; }
  for p in $pids; do wait $p || { tail -n 15 "$W/$name".h* >&2; echo "FAIL: $name (a host)" >&2; exit 1; }; done
}
for mode in "replicas 2:2:--ckpt-replicas 2" "ec 2+1:3:--ckpt-ec 2+1"; do
  name=${mode%%:*}; rest=${mode#*:}; n=${rest%%:*}; flags=${rest#*:}
  case " ${MODES:-replicas ec} " in *" ${name%% *} "*) ;; *) continue ;; esac
  nc_setup $n "$RATE" $DELAY || exit 1
  M=$(nc_addr 0)
  nc_exec 1 "$CLI" run -n 1 --nnodes 2 --node-rank 1 --master $M:29500 -- "$CLI" bench comm --colls all_reduce --json --reps 3 --min-bytes 16M --max-bytes 16M > "$W/link.h1" 2>&1 &
  p1=$!
  link=$(nc_exec 0 "$CLI" run -n 1 --nnodes 2 --node-rank 0 --master $M:29500 -- "$CLI" bench comm --colls all_reduce --json --reps 3 --min-bytes 16M --max-bytes 16M 2>"$W/link.h0" |
    grep -o '"bytes":16777216,"time_us":[0-9.]*' | awk -F: '{printf "%.1f", 16777216 / $3}')
  wait $p1 && [ -n "$link" ] || { tail -n 10 "$W"/link.h* >&2; echo "FAIL: the link measurement" >&2; exit 1; }
  common=(--data-path "$W/data" $model --seq-length 64 --micro-batch-size 4 --global-batch-size $((4 * n)) --zero-stage 1
          --eval-interval 0 --eval-iters 1 --threads 1 --save-interval $EVERY $flags)
  tag=$(echo "$name" | tr -cd 'a-z0-9')
  L="$W/L$tag"
  hosts_run $n 29510 "train$tag" "${common[@]}" --train-iters $STEPS --save "$W/o$tag" --ckpt-local-dir "$L"
  log="$W/train$tag.h0"
  step_ms=$(grep -o '[0-9.]* ms/step' "$log" | awk '{print $1}' | med)
  stall_ms=$(grep -o 'stall [0-9.]* ms' "$log" | awk '{print $2}' | med)
  wsec=$(grep -o 'background write [0-9.]* s' "$log" | awk '{print $3}' | med)
  step=$(cat "$L/host-0/latest")
  host_bytes=$(du -sb "$L/host-0/$step" | awk '{print $1}')
  # bytes that crossed host 0's link per save, each way: the other hosts' replica or blocks it received (by
  # symmetry what it sent): its step dir's shard files that are not its own shard-r00000.*
  sent=$(ls -l "$L/host-0/$step" | awk '$NF ~ /^shard-r[0-9]+\.safetensors/ && $NF !~ /^shard-r00000\./ {s += $5} END {print s + 0}')
  # restore: host 1's directory lost; the restart reassembles it from the others over the links into
  # host-1/.restore/$step (removed once loaded): every file the manifest's pool lists, manifest.json and
  # config.json, counted from host 0's copy of the manifest
  got=$(python3 -c 'import json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
print(sum(int(f["size"]) for f in m["pool"]["files"].values()) + sum(os.path.getsize(os.path.join(d, n)) for n in ("manifest.json", "config.json") if os.path.exists(os.path.join(d, n))))' "$L/host-0/$step")
  rm -rf "$L/host-1"
  hosts_run $n 29520 "restore$tag" "${common[@]}" --train-iters $((STEPS + 1)) --save "$W/o$tag" --load "$W/o$tag" --ckpt-local-dir "$L"
  rsec=$(grep -o 'reassembled from .* hosts, [0-9.]* s)' "$W/restore$tag.h0" | sed 's/.* hosts, \([0-9.]*\) s)/\1/')
  python3 - "$name" "$n" "$RATE" "$link" "$dd_w" "$step_ms" "$stall_ms" "$wsec" "$host_bytes" "$sent" "$rsec" "${got:-0}" <<'PY'
import json, sys
name, n, rate, link, dd, step, stall, wsec, hb, sent, rsec, got = sys.argv[1:]
n, link, dd, step, stall, wsec, hb, sent, rsec, got = int(n), float(link), float(dd), float(step), float(stall), float(wsec), int(hb), int(sent), float(rsec or 0), int(got)
r = {"bench": "ckpt_pool_net", "mode": name, "hosts": n, "rate": rate, "link_mb_s": round(link, 1), "dd_write_mb_s": dd,
     "step_ms": step, "stall_ms": stall, "stall_pct": round(100 * stall / step, 3), "background_write_s": wsec,
     "host_bytes_per_save": hb, "host_write_mb_s": round(hb / 1e6 / wsec, 1), "host_write_vs_dd": round(hb / 1e6 / wsec / dd, 3),
     "sent_bytes_per_save": sent, "sent_mb_s": round(sent / 1e6 / wsec, 1), "sent_vs_link": round(sent / 1e6 / wsec / link, 3),
     "restore_s": rsec, "restored_bytes_host1": got, "restore_mb_s": round(got / 1e6 / rsec, 1) if rsec else 0,
     "restore_vs_link": round(got / 1e6 / rsec / link, 3) if rsec else 0}
print(json.dumps(r))
PY
  nc_cleanup
done
echo "# end $(date -u +%FT%TZ) load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
