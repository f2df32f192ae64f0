/* suanli bench ops|kernels|comm|train|moe|generate|ec|ckpt-io|c2c — dispatch to the benchmark suites in
 * bench/.
 */
#include <stdio.h>
#include <string.h>

#include "bench_ops.h"
#include "cli/commands.h"

int sl_bench_train(int argc, char **argv);    /* bench/bench_train.c */
int sl_bench_moe(int argc, char **argv);      /* bench/bench_moe.c */
int sl_bench_generate(int argc, char **argv); /* bench/bench_generate.c */
#include "bench_comm.h"
#include "bench_ckpt_io.h"
#include "bench_ec.h"
#include "bench_c2c.h"
#include "bench_kernels.h"

int sl_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: suanli bench ops|kernels|comm|train|moe|generate|ec|ckpt-io|c2c [--json] [flags]\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "ops")) return sl_bench_ops(argc - 1, argv + 1);
    if (!strcmp(argv[1], "train")) return sl_bench_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "moe")) return sl_bench_moe(argc - 1, argv + 1);
    if (!strcmp(argv[1], "generate")) return sl_bench_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "comm")) return sl_bench_comm(argc - 1, argv + 1);
    if (!strcmp(argv[1], "kernels")) return sl_bench_kernels(argc - 1, argv + 1);
    if (!strcmp(argv[1], "ec")) return sl_bench_ec(argc - 1, argv + 1);
    if (!strcmp(argv[1], "ckpt-io")) return sl_bench_ckpt_io(argc - 1, argv + 1);
    if (!strcmp(argv[1], "c2c")) return sl_bench_c2c(argc - 1, argv + 1);
    fprintf(stderr,
            "suanli bench: unknown suite '%s' (ops, kernels, comm, train, moe, generate, ec, ckpt-io, c2c)\n",
            argv[1]);
    return 2;
}
