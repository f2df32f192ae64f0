#!/bin/sh
# The hybrid transport and the hierarchical all-reduce between network namespaces: H "hosts" (each
# its own address, host name and shaped link to a bridge: netns_cluster.sh) with 2 ranks each, one
# `suanli run --nnodes H` per host. Every rank must join over the hybrid transport (shm to its host
# peer, tcp to the others) and pass the comm matrix with every forced all-reduce algorithm plus the
# hier-vs-ring check (cc_run_hier_check). Skipped (exit 77) where namespaces cannot be made.
# usage: netns_hier.sh SUANLI_CLI TEST_PROGRAM [HOSTS [RATE [DELAY_US]]]   (a delay needs NC_DELAYLINE)
CLI=$1; PROG=$2; H=${3:-3}; RATE=${4:-2gbit}; DELAY=${5:-}
. "$(dirname "$0")/netns_cluster.sh"
trap nc_cleanup EXIT
trap 'exit 1' INT TERM
nc_setup $H $RATE $DELAY; rc=$?; [ $rc = 0 ] || exit $rc
LOG=$(mktemp -d); trap 'nc_cleanup; rm -rf "$LOG"' EXIT
# ports inside a fresh namespace are all free: a fixed one cannot collide
export SUANLI_COMM_TIMEOUT=60
pids=""
for h in $(seq 1 $((H - 1))); do
  nc_exec $h timeout 100 "$CLI" run -n 2 --nnodes $H --node-rank $h --master $(nc_addr 0):29500 -- \
    "$PROG" --algos env hybrid suanli > "$LOG/h$h.log" 2>&1 &
  pids="$pids $!"
done
nc_exec 0 timeout 100 "$CLI" run -n 2 --nnodes $H --node-rank 0 --master $(nc_addr 0):29500 -- \
  "$PROG" --algos env hybrid suanli > "$LOG/h0.log" 2>&1
fail=$?
for p in $pids; do wait $p || fail=1; done
grep -hv "suanli info" "$LOG"/h*.log | tail -n 40
[ $fail = 0 ] || { echo "FAIL: a host's launcher failed"; exit 1; }
for r in $(seq 0 $((2 * H - 1))); do
  grep -q "\[$r\] rank $r/$((2 * H)) transport hybrid: ok" "$LOG"/h*.log || { echo "FAIL: rank $r"; exit 1; }
done
grep -q "hier vs ring: $((2 * H)) ranks on $H hosts" "$LOG/h0.log" || { echo "FAIL: no hier check"; exit 1; }
if [ -n "$DELAY" ]; then
  # every frame between the hosts crossed the delay line: it saw traffic and cut none
  st=$(nc_delayline_stats); echo "$st"
  echo "$st" | grep -q "received [1-9][0-9]* frames.*truncated 0;" || { echo "FAIL: delay line: $st"; exit 1; }
fi
echo "netns hier ($H hosts x 2 ranks, $RATE links${DELAY:+, $DELAY us one way}): ok"
