/* Per-call interleaved A/B of two versions of the GEMM in one process: the baseline's gemm objects are
 * linked under renamed symbols (base_*), so both versions see the same machine state call by call; the
 * speedup of a shape is the median over repetitions of t(base)/t(new) for back-to-back calls (order
 * alternating). On this shared host that resolves ~1-2 % differences that separate runs (+-10 %) cannot.
 * Thread CPU time by default (1 thread); WALL=1: wall time (for OMP_NUM_THREADS=2).
 *   mkdir /tmp/baseobj && cd /tmp/baseobj && ar x BASE/libsuanli.a gemm.c.o gemm_avx2.c.o gemm_avx512.c.o
 *   nm --defined-only -g gemm*.o | awk 'NF==3{print $3" base_"$3}' | sort -u > syms.txt
 *   for f in gemm*.o; do objcopy --redefine-syms=syms.txt $f b_$f; done; cd -
 *   cc -O2 -Iinclude -Isrc bench/tools/gemm_ab.c /tmp/baseobj/b_gemm*.o build/libsuanli.a -fopenmp -lm \
 *      -lpthread -o /tmp/gemm_ab
 *   OMP_NUM_THREADS=1 /tmp/gemm_ab REPS BT            (GPT-2 124M Linear shapes: fwd NT, dX NN, dW TN)
 * Not part of the build. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "device/cpu/kernels/gemm.h"
#include "gemm_tool.h"
void base_sl_sgemm(int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                   float, float *, int64_t);
static int use_wall;
typedef void (*gfn)(int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                    int64_t, float, float *, int64_t);
static gfn fns[2] = {base_sl_sgemm, sl_sgemm};
int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: gemm_ab REPS BT\n");
        return 2;
    }
    int reps = atoi(argv[1]);
    int64_t BT = atoll(argv[2]);
    if (reps < 1 || BT < 1) {
        fprintf(stderr, "gemm_ab: REPS '%s' and BT '%s' must be positive integers\n", argv[1], argv[2]);
        return 2;
    }
    use_wall = getenv("WALL") != NULL;
    double lr = 0;
    int n = 0;
    for (int l = 0; l < 5; l++)
        for (int pass = 0; pass < 3; pass++) {
            int tA, tB;
            int64_t M, N, K;
            tool_gpt2_gemm(l, pass, BT, &tA, &tB, &M, &N, &K);
            float *A = malloc(4 * M * K), *B = malloc(4 * K * N), *C = malloc(4 * M * N);
            for (int64_t i = 0; i < M * K; i++) A[i] = (float)((i * 7 % 13) - 6) * 0.01f;
            for (int64_t i = 0; i < K * N; i++) B[i] = (float)((i * 5 % 11) - 5) * 0.01f;
            int64_t lda = tA ? M : K, ldb = tB ? K : N;
            double t[2][64];
            for (int v = 0; v < 2; v++) {
                fns[v](tA, tB, M, N, K, 1, A, lda, B, ldb, 0, C, N);
            }
            for (int r = 0; r < reps; r++)
                for (int vv = 0; vv < 2; vv++) {
                    int v = (r & 1) ? 1 - vv : vv;
                    double t0 = tool_now(use_wall);
                    fns[v](tA, tB, M, N, K, 1, A, lda, B, ldb, 0, C, N);
                    t[v][r] = tool_now(use_wall) - t0;
                }
            double ratio[64];
            for (int r = 0; r < reps; r++) ratio[r] = t[0][r] / t[1][r];
            qsort(ratio, reps, 8, tool_cmp_double);
            qsort(t[0], reps, 8, tool_cmp_double);
            qsort(t[1], reps, 8, tool_cmp_double);
            double fl = 2.0 * M * N * K * 1e-9;
            printf("%-3s %5ld %5ld %5ld  base %6.1f  exp %6.1f GFLOP/s  speedup(med of pair ratios) %.3f\n",
                   pass == 0   ? "fwd"
                   : pass == 1 ? "dX"
                               : "dW",
                   (long)M, (long)N, (long)K, fl / t[0][reps / 2], fl / t[1][reps / 2], ratio[reps / 2]);
            lr += log(ratio[reps / 2]);
            n++;
            free(A);
            free(B);
            free(C);
        }
    printf("geomean speedup %.3f\n", exp(lr / n));
    return 0;
}
