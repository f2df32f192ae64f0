/* In-process A/B of the staged all-reduce (Note [Staged all-reduce], src/comm/algo/sym.c) against the
 * slot FIFO algorithm the cost model picks without it: one communicator as configured (auto: staged
 * for private buffers on shm) and a split of it made with SUANLI_COMM_WINDOWS=0 (no staging window,
 * same algorithm choice otherwise). For each size: 7 interleaved blocks of each, median block, f32 sum,
 * private buffers. Any rank count; run inside a job:
 *   cmake --build build && mpicc -O2 -std=gnu11 -Iinclude bench/tools/staged_ab.c build/libsuanli.a \
 *       -fopenmp -lm -o /tmp/staged_ab      (or gcc, from a build without MPI)
 *   build/suanli run -n 2 -- /tmp/staged_ab [--forced-ring]
 * --forced-ring: compare against SUANLI_COMM_ALGO=ring instead of the cost model's pick.
 * Not part of the build; docs/BENCHMARKS-comm.md quotes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/base.h"
#include "suanli/comm.h"

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double block(sl_comm *c, float *sb, float *rb, size_t n, int iters) {
    sl_comm_barrier(c);
    double t0 = sl_time_sec();
    for (int k = 0; k < iters; k++)
        if (sl_comm_all_reduce(c, sb, rb, n, SL_COMM_F32, SL_COMM_SUM) != SL_OK) {
            fprintf(stderr, "all-reduce: %s\n", sl_errmsg());
            exit(1);
        }
    double t = (sl_time_sec() - t0) / iters;
    sl_comm_all_reduce(c, &t, &t, 1, SL_COMM_F64, SL_COMM_MAX);
    return t;
}

int main(int argc, char **argv) {
    int ring = argc > 1 && !strcmp(argv[1], "--forced-ring");
    if (argc > 2 || (argc == 2 && !ring)) return fprintf(stderr, "usage: staged_ab [--forced-ring]\n"), 2;
    sl_comm *a, *b;
    if (sl_comm_init_env(&a, NULL) != SL_OK) return fprintf(stderr, "init: %s\n", sl_errmsg()), 1;
    const char *var = ring ? "SUANLI_COMM_ALGO" : "SUANLI_COMM_WINDOWS";
    setenv(var, ring ? "ring" : "0", 1); /* read when the split communicator is made */
    if (sl_comm_split(a, 0, sl_comm_rank(a), &b) != SL_OK)
        return fprintf(stderr, "split: %s\n", sl_errmsg()), 1;
    unsetenv(var);
    size_t maxb = (size_t)256 << 20;
    float *sb = sl_malloc_aligned(maxb), *rb = sl_malloc_aligned(maxb);
    if (!sb || !rb) return fprintf(stderr, "out of memory\n"), 1;
    memset(sb, 0, maxb);
    memset(rb, 0, maxb);
    if (sl_comm_rank(a) == 0)
        printf("# %d ranks, f32 sum, busbw GB/s, median of 7 interleaved blocks: staged vs %s\n",
               sl_comm_size(a), ring ? "forced ring" : "auto without staging");
    for (size_t by = 64; by <= maxb; by *= 4) {
        size_t n = by / 4;
        int iters = by <= ((size_t)64 << 10)   ? 200
                    : by <= ((size_t)4 << 20)  ? 40
                    : by <= ((size_t)32 << 20) ? 10
                                               : 4;
        double ta[7], tb[7];
        block(a, sb, rb, n, 2);
        block(b, sb, rb, n, 2);
        for (int r = 0; r < 7; r++) {
            ta[r] = block(a, sb, rb, n, iters);
            tb[r] = block(b, sb, rb, n, iters);
        }
        qsort(ta, 7, sizeof *ta, cmpd);
        qsort(tb, 7, sizeof *tb, cmpd);
        double f = 2.0 * (sl_comm_size(a) - 1) / sl_comm_size(a);
        if (sl_comm_rank(a) == 0)
            printf("%10zu B  staged %7.3f  other %7.3f  staged/other %.2f\n", by,
                   (double)by / ta[3] / 1e9 * f, (double)by / tb[3] / 1e9 * f, tb[3] / ta[3]);
        fflush(stdout);
    }
    sl_comm_free(b);
    sl_comm_free(a);
    sl_free_aligned(sb);
    sl_free_aligned(rb);
    return 0;
}
