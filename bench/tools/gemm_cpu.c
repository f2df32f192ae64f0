/* Single-thread GEMM timing by thread CPU time (less sensitive to other processes on a shared host than
 * wall time, though not immune: they still evict caches). For A/B comparisons of GEMM changes: build one
 * binary per library version and run them alternately.
 *   cc -O2 -Iinclude -Isrc bench/tools/gemm_cpu.c build/libsuanli.a -fopenmp -lm -lpthread -o /tmp/gemm_cpu
 *   OMP_NUM_THREADS=1 /tmp/gemm_cpu [reps] [BT]          (ROW=i: only row i, 0-based)
 * Prints, per GPT-2 124M Linear shape (fwd NT, dX NN, dW TN at the given BT), the median and best GFLOP/s
 * over `reps` calls, and their geometric means. Not part of the build. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "device/cpu/kernels/gemm.h"
#include "gemm_tool.h"

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    int64_t BT = argc > 2 ? atoll(argv[2]) : 256;
    if (reps < 1 || BT < 1 || argc > 3) {
        fprintf(stderr, "usage: gemm_cpu [reps] [BT]   (positive integers)\n");
        return 2;
    }
    double lsum_med = 0, lsum_best = 0;
    int nrows = 0;
    for (int l = 0; l < 5; l++) {
        for (int pass = 0; pass < 3; pass++) {
            if (getenv("ROW") && atoi(getenv("ROW")) != l * 3 + pass) continue;
            int tA, tB;
            int64_t M, N, K;
            tool_gpt2_gemm(l, pass, BT, &tA, &tB, &M, &N, &K);
            float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N)),
                  *C = malloc(sizeof(float) * (size_t)(M * N));
            for (int64_t i = 0; i < M * K; i++) A[i] = (float)((i * 7 % 13) - 6) * 0.01f;
            for (int64_t i = 0; i < K * N; i++) B[i] = (float)((i * 5 % 11) - 5) * 0.01f;
            int64_t lda = tA ? M : K, ldb = tB ? K : N;
            double t[64];
            int r = reps > 64 ? 64 : reps;
            sl_sgemm(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
            for (int i = 0; i < r; i++) {
                double t0 = tool_now(0);
                sl_sgemm(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, pass == 2 ? 1.0f : 0.0f, C, N);
                t[i] = tool_now(0) - t0;
            }
            qsort(t, (size_t)r, sizeof *t, tool_cmp_double);
            double fl = 2.0 * (double)M * (double)N * (double)K * 1e-9;
            double med = fl / t[r / 2], best = fl / t[0];
            printf("%-3s %5ld %5ld %5ld  med %6.1f  best %6.1f GFLOP/s\n",
                   pass == 0   ? "fwd"
                   : pass == 1 ? "dX"
                               : "dW",
                   (long)M, (long)N, (long)K, med, best);
            lsum_med += log(med);
            lsum_best += log(best);
            nrows++;
            free(A), free(B), free(C);
        }
    }
    printf("geomean med %.2f best %.2f GFLOP/s\n", exp(lsum_med / nrows), exp(lsum_best / nrows));
    return 0;
}
