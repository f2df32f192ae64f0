#!/usr/bin/env bash
# Pooled node-local checkpoints across network-namespace hosts (issue 18 item 2): each host its own network
# namespace and address (tests/comm/netns_cluster.sh, 2 Gbit/s tbf links), one `suanli run --nnodes` per host,
# one rank each, so replicas, blocks and the restore's reads cross the hosts' TCP links; the "local disks"
# are the directories L/host-<h>. Cases, each against the same training run uninterrupted (the oracle):
#  1. replicas 2 on 2 hosts: rank 1 SIGKILLs itself after step 7 and its host's directory is deleted
#     (SUANLI_FAULT_KILL_AT_STEP / SUANLI_FAULT_LOSE_HOSTS); host 0's rank fails on the dead peer; a restart
#     on both hosts (host 1 now empty: a replacement) reassembles step 6 from host 0's replica and finishes:
#     final weights bitwise those of the uninterrupted run;
#  2. a run stopped after step 9, then one byte flipped in host 1's own copy of its shard in the newest
#     step; the restart detects it by checksum, reads host 0's replica over the network, trains on to 12,
#     and ends bitwise equal again;
#  3. erasure code 2+1 on 3 hosts: host 1 killed and lost at step 7; its blocks are rebuilt by Reed-Solomon
#     decoding from the other two hosts over the network; bitwise.
# Skips (77) without root or namespaces.
# usage: netns_pool.sh SUANLI_CLI
CLI=$(readlink -f "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../comm/netns_cluster.sh"
W=$(mktemp -d /tmp/sl-netnspool.XXXXXX)
trap 'nc_cleanup; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
trap 'exit 1' INT TERM
fail() { echo "FAIL: $*"; for f in "$W"/*.h*; do [ -f "$f" ] && { echo "--- $f"; tail -n 12 "$f"; }; done; exit 1; }
nc_setup 3 2gbit; rc=$?; [ $rc = 0 ] || exit $rc
export SUANLI_COMM_TIMEOUT=60
"$CLI" data prepare --input "$HERE/../../data/tinyshakespeare.txt" --output-prefix "$W/data" --tokenizer-type byte > /dev/null ||
  fail "data prepare"
port=29500
# hosts_run N NAME EXPECT ENV... -- TRAIN_ARGS...: one rank on each of hosts 0..N-1 (logs NAME.h<h>);
# EXPECT ok: every launcher must succeed; EXPECT fail: host 0's must fail (a peer died)
hosts_run() {
  local n=$1 name=$2 expect=$3; shift 3
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  port=$((port + 1))
  local pids="" h
  for h in $(seq 1 $((n - 1))); do
    nc_exec $h env SUANLI_MEM_CKPT_DIR= "${envs[@]}" timeout 120 "$CLI" run -n 1 --nnodes $n --node-rank $h \
      --master $(nc_addr 0):$port -- "$CLI" train "$@" > "$W/$name.h$h" 2>&1 &
    pids="$pids $!"
  done
  nc_exec 0 env SUANLI_MEM_CKPT_DIR= "${envs[@]}" timeout 120 "$CLI" run -n 1 --nnodes $n --node-rank 0 \
    --master $(nc_addr 0):$port -- "$CLI" train "$@" > "$W/$name.h0" 2>&1
  local rc0=$? bad=0
  for p in $pids; do wait $p || bad=1; done
  if [ "$expect" = ok ]; then [ $rc0 = 0 ] && [ $bad = 0 ] || fail "$name: a launcher failed (host 0: $rc0)"
  else [ $rc0 != 0 ] || fail "$name: host 0 finished although its peer was killed"; fi
}
same() { cmp -s "$W/$1/model.safetensors" "$W/$2/model.safetensors"; }
tiny=(--data-path "$W/data" --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --micro-batch-size 1 --zero-stage 1 --train-iters 12 --lr-decay-iters 12 --eval-interval 0 --eval-iters 1
      --threads 1 --save-interval 2)

# lost_host N TAG SEEN -- ARGS...: an uninterrupted run (the oracle), a run whose rank 1 SIGKILLs itself after
# step 7 with host 1's directory deleted, and a restart on all N hosts that must log SEEN (how host 1's
# files came back), resume from a pooled step and end with bitwise the oracle's weights; sets $at
lost_host() {
  local n=$1 tag=$2 seen=$3; shift 4
  hosts_run $n ref$tag ok -- "$@" --save "$W/ref$tag" --ckpt-local-dir "$W/R$tag"
  hosts_run $n cut$tag fail SUANLI_FAULT_KILL_AT_STEP=7 SUANLI_FAULT_RANK=1 SUANLI_FAULT_LOSE_HOSTS=1 -- \
    "$@" --save "$W/cut$tag" --ckpt-local-dir "$W/L$tag"
  grep -q "removing $W/L$tag/host-1" "$W/cut$tag.h1" || fail "$tag: host 1's directory was not deleted"
  hosts_run $n resume$tag ok -- "$@" --save "$W/cut$tag" --load "$W/cut$tag" --ckpt-local-dir "$W/L$tag"
  grep -q "reassembled from $W/L$tag ($n hosts, " "$W/resume$tag.h0" || fail "$tag: no pooled reassembly"
  grep -q "$seen" "$W/resume$tag.h0" || fail "$tag: the restart did not log '$seen'"
  at=$(grep -o "resumed from .* at step [0-9]*" "$W/resume$tag.h0" | sed 's/.* at step //')
  [ -n "$at" ] && [ "$at" -ge 2 ] || fail "$tag: did not resume from a pooled step (step '$at')"
  same ref$tag cut$tag || fail "$tag: final weights differ from the uninterrupted run"
}

# 1. replicas 2, host 1 killed after step 7 and its disk lost
rep=("${tiny[@]}" --global-batch-size 2 --ckpt-replicas 2)
lost_host 2 rep "host 1: .* missing; using the copy on host 0" -- "${rep[@]}"
echo "ok   replicas 2 over 2 namespace hosts: host 1 killed after step 7 and its disk lost; resumed at step $at from host 0's replicas over the network; final weights bitwise equal"

# 2. a corrupted copy: a run stopped after step 9 (rank 1 killed, no disk lost), then host 1's own file of
# its shard in the newest step gets one flipped byte; the restart trains on from that step
hosts_run 2 stop fail SUANLI_FAULT_KILL_AT_STEP=9 SUANLI_FAULT_RANK=1 -- "${rep[@]}" --save "$W/cut2" --ckpt-local-dir "$W/C"
step=$(cat "$W/C/host-1/latest")
f="$W/C/host-1/$step/shard-r00001.safetensors"
[ -f "$f" ] || fail "no $f"
sz=$(stat -c %s "$f")
printf '\xa5' | dd of="$f" bs=1 seek=$((sz / 2)) conv=notrunc status=none
hosts_run 2 corrupt ok -- "${rep[@]}" --save "$W/cut2" --load "$W/cut2" --ckpt-local-dir "$W/C"
grep -q "using the copy on host 0" "$W/corrupt.h0" || fail "corrupt: host 0's replica was not used"
grep -qi "checksum" "$W/corrupt.h0" || fail "corrupt: the bad copy was not named as a checksum mismatch"
at=$(grep -o "resumed from .* at step [0-9]*" "$W/corrupt.h0" | sed 's/.* at step //')
[ -n "$at" ] && [ "$at" -lt 12 ] || fail "corrupt: nothing left to train after the resume (step '$at')"
same refrep cut2 || fail "corrupt: final weights differ from the uninterrupted run"
echo "ok   a corrupted copy on host 1 ($step, shard-r00001): detected by checksum, host 0's replica read over the network, trained on from step $at; bitwise"

# 3. erasure code 2+1 over 3 hosts, host 1 killed and lost after step 7
ec=("${tiny[@]}" --global-batch-size 3 --ckpt-ec 2+1)
lost_host 3 ec "host 1: .* missing; rebuilding it from 2 intact blocks" -- "${ec[@]}"
echo "ok   ec 2+1 over 3 namespace hosts: host 1 killed after step 7 and its disk lost; its blocks rebuilt from the other two over the network; resumed at step $at; bitwise"
