#!/bin/sh
# sl_comm_mem_alloc with a /dev/shm too small for the window (as in a container): every rank must fall
# back to private memory together (a warning, correct results), not fail or die of SIGBUS later.
# The second run asks for a 16 MiB staging window per rank for the staged all-reduce of private
# buffers (Note [Staged all-reduce]): it cannot be made either, and every rank keeps the slot FIFO
# algorithms together (a warning, correct results).
# Needs root (a private mount namespace with a 24 MiB /dev/shm); skips (77) otherwise.
# usage: shm_full.sh SUANLI_CLI SL_BENCH_COMM
cli=$1 bench=$2
unshare -m true 2>/dev/null || { echo "skipped: unshare -m not permitted"; exit 77; }
exec unshare -m sh -c "mount -t tmpfs -o size=24M tmpfs /dev/shm || exit 77
  '$cli' run -n 2 -- '$bench' --window --min-bytes 16M --max-bytes 16M --colls all_reduce,reduce_scatter --iters 2 --reps 1 --json &&
  SUANLI_COMM_STAGE_KB=16384 '$cli' run -n 2 -- '$bench' --min-bytes 1M --max-bytes 1M --colls all_reduce --iters 2 --reps 1 --json"
