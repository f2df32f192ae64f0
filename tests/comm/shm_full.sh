#!/bin/sh
# sl_comm_mem_alloc with a /dev/shm too small for the window (as in a container): every rank must fall
# back to private memory together (a warning, correct results), not fail or die of SIGBUS later.
# Needs root (a private mount namespace with a 24 MiB /dev/shm); skips (77) otherwise.
# usage: shm_full.sh SUANLI_CLI SL_BENCH_COMM
cli=$1 bench=$2
unshare -m true 2>/dev/null || { echo "skipped: unshare -m not permitted"; exit 77; }
exec unshare -m sh -c "mount -t tmpfs -o size=24M tmpfs /dev/shm || exit 77
  '$cli' run -n 2 -- '$bench' --window --min-bytes 16M --max-bytes 16M --colls all_reduce,reduce_scatter --iters 2 --json"
