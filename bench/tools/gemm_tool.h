/* Shared by the stand-alone GEMM tools (gemm_ab.c, gemm_cpu.c, grad_zero.c): clocks, a double comparator
 * for qsort, and the GPT-2 124M Linear shapes with their three training GEMMs. Not part of the build. */
#ifndef SL_BENCH_GEMM_TOOL_H
#define SL_BENCH_GEMM_TOOL_H
#include <stdint.h>
#include <time.h>

/* wall = 0: this thread's CPU time (less sensitive to other processes), 1: monotonic wall time */
static inline double tool_now(int wall) {
    struct timespec t;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static inline int tool_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* (out, in) of the Linears: qkv, attention proj, fc, fc proj, tied LM head (padded vocab) */
static const int64_t tool_gpt2_linear[5][2] = {
    {2304, 768}, {768, 768}, {3072, 768}, {768, 3072}, {50304, 768}};

/* GEMM `pass` of Linear l at BT rows: 0 forward Y = X W^T (NT), 1 dX = dY W (NN), 2 dW = dY^T X (TN) */
static inline void tool_gpt2_gemm(int l, int pass, int64_t BT, int *tA, int *tB, int64_t *M, int64_t *N,
                                  int64_t *K) {
    int64_t out = tool_gpt2_linear[l][0], in = tool_gpt2_linear[l][1];
    *tA = pass == 2;
    *tB = pass == 0;
    *M = pass == 2 ? out : BT;
    *N = pass == 0 ? out : in;
    *K = pass == 0 ? in : pass == 1 ? out : BT;
}
#endif
