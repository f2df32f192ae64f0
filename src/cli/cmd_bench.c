/* cmd_bench.c — `suanli bench ops|comm|train`. Only `ops` exists so far (bench/bench_ops.c). */
#include <stdio.h>
#include <string.h>

#include "bench_ops.h"
#include "cli/commands.h"

int sl_cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "ops")) return sl_bench_ops(argc - 1, argv + 1);
    fprintf(stderr, "usage: suanli bench ops [--json] [--threads N] [--reps R] [--quick]\n");
    return 2;
}
