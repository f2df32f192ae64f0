#!/bin/sh
# The latency shaper of the namespace cluster (netns_cluster.sh with a delay: the user-space delay line,
# tests/comm/delayline.c) does what it says: two hosts, one rank each, a DELAY_US one-way delay between
# them. A 2-rank all-reduce cannot finish before the peer's data has crossed the link once, so every
# size's time (suanli bench comm over tcp, 8 B to 4 KiB) must be at least DELAY_US: the floor the delay
# sets, not a speed threshold (a delay line that forwards at once, or a bridge left in place, fails it).
# The results must be right (wrong 0) and the delay line must have carried the frames and cut none.
# The same bench without the delay is printed beside it for the reader. Skipped (77) without namespaces.
# usage: netns_delay.sh SUANLI_CLI DELAYLINE [DELAY_US [RATE]]
CLI=$1; export NC_DELAYLINE=$2; DELAY=${3:-2000}; RATE=${4:-2gbit}
. "$(dirname "$0")/netns_cluster.sh"
LOG=$(mktemp -d)
trap 'nc_cleanup; rm -rf "$LOG"' EXIT
trap 'exit 1' INT TERM
export SUANLI_COMM_TIMEOUT=60
bench() { # $1: log name; 1 rank on each of h0 and h1
  M=$(nc_addr 0)
  nc_exec 1 timeout 60 "$CLI" run -n 1 --nnodes 2 --node-rank 1 --master $M:29500 -- "$CLI" bench comm \
    --colls all_reduce --json --reps 3 --max-bytes 4K > "$LOG/$1.h1" 2>&1 &
  nc_exec 0 timeout 60 "$CLI" run -n 1 --nnodes 2 --node-rank 0 --master $M:29500 -- "$CLI" bench comm \
    --colls all_reduce --json --reps 3 --max-bytes 4K > "$LOG/$1" 2>&1 || { cat "$LOG/$1"*; echo "FAIL: bench ($1)"; exit 1; }
  wait $! || { cat "$LOG/$1.h1"; echo "FAIL: bench on h1 ($1)"; exit 1; }
}
nc_setup 2 $RATE; rc=$?; [ $rc = 0 ] || exit $rc
bench bridge
nc_cleanup
nc_setup 2 $RATE $DELAY || exit 1
bench delayed
st=$(nc_delayline_stats); echo "$st"
echo "$st" | grep -q "received [1-9][0-9]* frames.*truncated 0;" || { echo "FAIL: delay line: $st"; exit 1; }
# bytes, time without the delay, time with it
awk -v d="$DELAY" '
  FNR == 1 { f++ }
  /"coll":"all_reduce"/ {
    match($0, /"bytes":[0-9]+/); b = substr($0, RSTART + 8, RLENGTH - 8)
    match($0, /"time_us":[0-9.]+/); t = substr($0, RSTART + 10, RLENGTH - 10)
    if ($0 !~ /"wrong":0/) { print "FAIL: wrong result at " b " bytes"; bad = 1 }
    if (f == 1) base[b] = t; else { n++; printf "%8d B: %9.1f us bridge, %9.1f us with %d us one way\n", b, base[b], t, d
      if (t + 0 < d + 0) { print "FAIL: " b " bytes took " t " us, under the " d " us one-way delay"; bad = 1 } }
  }
  END { if (n < 10) { print "FAIL: " n " sizes measured"; bad = 1 } exit bad }' "$LOG/bridge" "$LOG/delayed" || exit 1
echo "netns delay ($DELAY us one way, $RATE): ok"
