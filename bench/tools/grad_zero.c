/* What fusing gradient zeroing into the first gradient write saves, in isolation: the weight-gradient GEMMs
 * of one GPT-2 124M step (12 layers x {qkv, attn proj, fc, fc proj} + the tied LM head, dW = dY^T X with
 * K = BT) writing into one flat gradient buffer, (a) after a parallel memset of the buffer with beta = 1
 * (the trainer before) and (b) with beta = 0 and no memset (after). Alternating, medians of wall time.
 *   cc -O2 -Iinclude -Isrc bench/tools/grad_zero.c build/libsuanli.a -fopenmp -lm -lpthread -o /tmp/grad_zero
 *   OMP_NUM_THREADS=2 /tmp/grad_zero [reps] [BT]
 * Not part of the build. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/cpu/kernels/gemm.h"
#include "gemm_tool.h"

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    int64_t BT = argc > 2 ? atoll(argv[2]) : 256, C = 768, V = 50257, numel = 124475904;
    if (reps < 1 || BT < 1 || argc > 3) {
        fprintf(stderr, "usage: grad_zero [reps] [BT]   (positive integers)\n");
        return 2;
    }
    float *grads = aligned_alloc(64, sizeof(float) * (size_t)numel);
    float *dy = aligned_alloc(64, sizeof(float) * (size_t)(BT * V)),
          *x = aligned_alloc(64, sizeof(float) * (size_t)(BT * 3072));
    for (int64_t i = 0; i < BT * V; i++) dy[i] = (float)((i * 7 % 13) - 6) * 1e-3f;
    for (int64_t i = 0; i < BT * 3072; i++) x[i] = (float)((i * 5 % 11) - 5) * 1e-2f;
    memset(grads, 0, sizeof(float) * (size_t)numel);
    double ta[64], tb[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) {
        for (int mode = 0; mode < 2; mode++) {
            double t0 = tool_now(1);
            if (mode == 0) {
                int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static)
                for (int64_t a = 0; a < numel; a += chunk)
                    memset(grads + a, 0, sizeof(float) * (size_t)(numel - a < chunk ? numel - a : chunk));
            }
            float beta = mode == 0 ? 1.0f : 0.0f;
            int64_t off = 0;
            sl_sgemm(1, 0, V, C, BT, 1.0f, dy, V, x, C, beta, grads + off, C); /* LM head (tied wte) */
            off += V * C + 1024 * C;                                           /* wte, wpe */
            for (int l = 0; l < 12; l++)
                for (int j = 0; j < 4; j++) {
                    int64_t out = tool_gpt2_linear[j][0], in = tool_gpt2_linear[j][1];
                    off += 2 * C; /* a norm's weight and bias in between */
                    sl_sgemm(1, 0, out, in, BT, 1.0f, dy, out, x, in, beta, grads + off, in);
                    off += out * in + out;
                }
            (mode == 0 ? ta : tb)[r] = tool_now(1) - t0;
        }
    }
    qsort(ta, (size_t)reps, sizeof(double), tool_cmp_double);
    qsort(tb, (size_t)reps, sizeof(double), tool_cmp_double);
    printf("BT %ld: memset + beta=1: median %.1f ms (min %.1f)   beta=0: median %.1f ms (min %.1f)   saved "
           "%.1f ms\n",
           (long)BT, ta[reps / 2] * 1e3, ta[0] * 1e3, tb[reps / 2] * 1e3, tb[0] * 1e3,
           (ta[reps / 2] - tb[reps / 2]) * 1e3);
    return 0;
}
