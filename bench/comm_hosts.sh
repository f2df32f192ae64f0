#!/bin/sh
# Multi-host all-reduce on a namespace cluster (tests/comm/netns_cluster.sh): H hosts x L ranks, each
# host's link shaped to RATE (tc tbf). Prints, as JSON lines, in one run:
#   1. the links: busbw of a 2-rank all-reduce inside one host (shm) and across two hosts (1 rank per
#      host, tcp over the shaped link), 8 B to MAX, so the intra/inter ratio is measured, not assumed;
#   2. the job: one OpenMPI mpirun over all H x L ranks (orted started in each namespace by
#      tests/comm/netns_rsh.sh), where every process runs `suanli bench comm --algos ring,hier`
#      with suanli's communicator bootstrapped over TCP (MASTER_ADDR: the hybrid transport) and
#      OpenMPI's MPI_Allreduce in the same processes, blocks interleaved: columns auto (= hier),
#      ring (flat, same hybrid transport), hier, mpi.
# DELAY=US (environment) adds that one-way latency between hosts with the user-space delay line
# (tests/comm/delayline.c, NC_DELAYLINE, by default the build's tests/comm/sl_delayline beside the CLI);
# its counts and the lateness of its wake-ups are printed at the end.
# usage: [DELAY=US] bench/comm_hosts.sh SUANLI_CLI [HOSTS [RANKS_PER_HOST [RATE [MAX]]]]   (root)
# A failed run is named on stderr at the end and the exit status is 1.
usage() { echo "comm_hosts.sh: $*; usage: [DELAY=US] sh bench/comm_hosts.sh SUANLI_CLI [HOSTS [RANKS_PER_HOST [RATE [MAX]]]]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 5 ] || usage "wrong number of arguments"
[ -f "$1" ] && [ -x "$1" ] || usage "SUANLI_CLI '$1' is not an executable"
CLI=$(readlink -f "$1"); H=${2:-2}; L=${3:-2}; RATE=${4:-2gbit}; MAX=${5:-16M}; DELAY=${DELAY:-}
case $H in ''|*[!0-9]*|0|1) usage "HOSTS '$H' is not an integer >= 2";; esac
case $L in ''|*[!0-9]*|0) usage "RANKS_PER_HOST '$L' is not a positive integer";; esac
export NC_DELAYLINE=${NC_DELAYLINE:-$(dirname "$CLI")/tests/comm/sl_delayline}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../tests/comm/netns_cluster.sh"
export NC NC_DIR
trap nc_cleanup EXIT
trap 'exit 1' INT TERM
nc_setup $H $RATE $DELAY || exit $?
M=$(nc_addr 0)
# ok LABEL CMD...: CMD's output and errors without the "suanli info" lines; a failure is recorded under LABEL
ok() { _ok=$1; shift; { "$@" 2>&1 || echo "$_ok (exit $?)" >> "$NC_DIR/failed"; } | grep -v "suanli info"; }
echo "# $(date -u +%FT%TZ) hosts=$H ranks/host=$L rate=$RATE delay_us=${DELAY:-0} cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
echo "# link: shm, 2 ranks on host h0"
ok "shm link" nc_exec 0 "$CLI" run -n 2 -- "$CLI" bench comm --colls all_reduce --json --reps 3 --max-bytes $MAX
echo "# link: tcp, 1 rank on each of h0 and h1 (one shaped link per direction)"
nc_exec 1 "$CLI" run -n 1 --nnodes 2 --node-rank 1 --master $M:29500 -- "$CLI" bench comm --colls all_reduce --json --reps 3 --max-bytes $MAX > "$NC_DIR/h1.log" 2>&1 &
p1=$!
ok "tcp link, h0" nc_exec 0 "$CLI" run -n 1 --nnodes 2 --node-rank 0 --master $M:29500 -- "$CLI" bench comm --colls all_reduce --json --reps 3 --max-bytes $MAX
wait $p1 || { echo "tcp link, h1 (exit $?)" >> "$NC_DIR/failed"; tail -n 5 "$NC_DIR/h1.log" >&2; }
hosts=""; for h in $(seq 0 $((H - 1))); do hosts="$hosts${hosts:+,}h$h:$L"; done
echo "# job: mpirun -np $((H * L)) --host $hosts, suanli (hybrid transport) and OpenMPI in the same processes"
ok "mpirun job" nc_exec 0 mpirun --allow-run-as-root -np $((H * L)) --host $hosts --mca plm_rsh_agent "$HERE/../tests/comm/netns_rsh.sh" \
  --mca btl self,vader,tcp --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
  -x MASTER_ADDR=$M -x MASTER_PORT=29600 -x NC -x NC_DIR ${SUANLI_COMM_SPIN:+-x SUANLI_COMM_SPIN} \
  --mca mpi_yield_when_idle 1 "$CLI" bench comm --colls all_reduce --algos ${ALGOS:-ring,hier} --json --reps 3 --max-bytes $MAX
[ -n "$DELAY" ] && echo "# $(nc_delayline_stats)"
echo "# end $(date -u +%FT%TZ) load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
if [ -s "$NC_DIR/failed" ]; then echo "comm_hosts.sh: FAIL: $(paste -sd';' "$NC_DIR/failed")" >&2; exit 1; fi
