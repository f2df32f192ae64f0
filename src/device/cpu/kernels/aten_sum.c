/* Note [ATen's summation order]
 * PyTorch's CPU sum of float32 (aten/src/ATen/native/cpu/SumKernel.cpp, cascade_sum) does not add in
 * index order. Measured against torch 2.15 from PyPI on an AVX-512 host (`scripts/gen_hf_bf16_ref.py`'s
 * fixtures; a brute-force search over lane counts and unrolls matched 200 of 200 random rows only with
 * this one), its reductions use 8-float vectors:
 * - multi_row_sum(nrows = 4): four accumulators, each summing its own "row" (vector or column) of
 *   consecutive inputs, in 4 levels: level 0 takes 16 inputs at a time, then passes its sum up to level
 *   1, which passes up to level 2 every 16 x 16 inputs, and so on; at the end the levels are added into
 *   level 0 (0 += 1, += 2, += 3).
 * - row_sum: the input seen as groups of 4 consecutive items (vectors or scalars), one accumulator per
 *   position in the group (multi_row_sum), the leftover items added to the first, then acc0 += acc1,
 *   += acc2, += acc3.
 * - A contiguous last dimension of n >= 8 floats: row_sum over its n / 8 vectors (lane-wise), then a
 *   scalar that starts at 0, adds the n % 8 trailing floats in order and then the 8 lanes in order. n < 8:
 *   row_sum over the scalars.
 * - An outer dimension (summing rows; columns contiguous): columns in blocks of 32 take multi_row_sum down
 *   the rows, one column per lane; the rest (blocks of 8, then single columns) take row_sum down the rows.
 *   Fewer than 8 columns: blocks of 4 columns take multi_row_sum, the rest row_sum.
 * This is the serial order: torch runs it below its 32,768-element grain (each thread's chunk in it above,
 * with the chunks' results added after). suanli's kernels that mirror a PyTorch reduction bit for bit
 * (RMSNorm: Note [RMSNorm as transformers computes it] in llama_ops.c) call these; they are scalar code, so
 * every host gets the same bits. */
#include "device/cpu/kernels/aten_sum.h"

#include <string.h>

enum { LANES = 8, LEVELS = 4, LEVEL_POWER = 4 }; /* max(4, CeilLog2(size) / 4) is 4 below 2^20 items */

/* multi_row_sum of 4 rows of W floats each (W = LANES: vectors, W = 1: scalars; compile-time widths, so the
 * lane loops vectorise): item i of row k starts at in + i * istride + k * kstride; `size` items; ret: 4 x W
 */
#define DEF_MULTI_ROW_SUM(NAME, W)                                                                           \
    static void NAME(const float *in, int64_t istride, int64_t kstride, int64_t size, float *ret) {          \
        float acc[LEVELS][4][W];                                                                             \
        memset(acc, 0, sizeof acc);                                                                          \
        const int64_t step = (int64_t)1 << LEVEL_POWER, mask = step - 1;                                     \
        int64_t i = 0;                                                                                       \
        while (i + step <= size) {                                                                           \
            for (int64_t j = 0; j < step; ++j, ++i)                                                          \
                for (int k = 0; k < 4; k++)                                                                  \
                    for (int l = 0; l < W; l++) acc[0][k][l] += in[i * istride + k * kstride + l];           \
            for (int j = 1; j < LEVELS; j++) {                                                               \
                for (int k = 0; k < 4; k++)                                                                  \
                    for (int l = 0; l < W; l++) acc[j][k][l] += acc[j - 1][k][l], acc[j - 1][k][l] = 0;      \
                if ((i & (mask << (j * LEVEL_POWER))) != 0) break;                                           \
            }                                                                                                \
        }                                                                                                    \
        for (; i < size; ++i)                                                                                \
            for (int k = 0; k < 4; k++)                                                                      \
                for (int l = 0; l < W; l++) acc[0][k][l] += in[i * istride + k * kstride + l];               \
        for (int j = 1; j < LEVELS; j++)                                                                     \
            for (int k = 0; k < 4; k++)                                                                      \
                for (int l = 0; l < W; l++) acc[0][k][l] += acc[j][k][l];                                    \
        memcpy(ret, acc[0], sizeof(float) * 4 * W);                                                          \
    }
DEF_MULTI_ROW_SUM(multi_row_sum_v, LANES)
DEF_MULTI_ROW_SUM(multi_row_sum_s, 1)

/* row_sum of `size` items of W floats, item i at in + i * stride; out: W */
#define DEF_ROW_SUM(NAME, MRS, W)                                                                            \
    static void NAME(const float *in, int64_t stride, int64_t size, float *out) {                            \
        float ps[4][W];                                                                                      \
        int64_t size_ilp = size / 4;                                                                         \
        MRS(in, 4 * stride, stride, size_ilp, &ps[0][0]);                                                    \
        for (int64_t i = size_ilp * 4; i < size; i++)                                                        \
            for (int l = 0; l < W; l++) ps[0][l] += in[i * stride + l];                                      \
        for (int k = 1; k < 4; k++)                                                                          \
            for (int l = 0; l < W; l++) ps[0][l] += ps[k][l];                                                \
        memcpy(out, ps[0], sizeof(float) * W);                                                               \
    }
DEF_ROW_SUM(row_sum_v, multi_row_sum_v, LANES)
DEF_ROW_SUM(row_sum_s, multi_row_sum_s, 1)

float sl_aten_row_sum(const float *p, int64_t n) {
    float r;
    if (n < LANES) {
        row_sum_s(p, 1, n, &r);
        return 0.0f + r;
    }
    float v[LANES];
    int64_t nv = n / LANES;
    row_sum_v(p, LANES, nv, v);
    r = 0;
    for (int64_t k = nv * LANES; k < n; k++) r += p[k];
    for (int l = 0; l < LANES; l++) r += v[l];
    return r;
}

void sl_aten_col_sums(const float *p, int64_t R, int64_t C, int64_t ld, float *out) {
    int64_t c = 0;
    float t[4 * LANES];
    if (C < LANES) { /* scalar_outer_sum: columns 4 at a time down the rows, then row_sum */
        for (; c + 4 <= C; c += 4) {
            multi_row_sum_s(p + c, ld, 1, R, t);
            for (int k = 0; k < 4; k++) out[c + k] = 0.0f + t[k];
        }
        for (; c < C; c++) {
            row_sum_s(p + c, ld, R, t);
            out[c] = 0.0f + t[0];
        }
        return;
    }
    /* multi_row_sum: 4 vectors of 8 columns, down the rows; the blocks are independent (threads) */
    int64_t nb = C / (4 * LANES);
#pragma omp parallel for schedule(static) if (R * C >= 16384 && nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        float tb[4 * LANES];
        multi_row_sum_v(p + b * 4 * LANES, ld, LANES, R, tb);
        for (int k = 0; k < 4 * LANES; k++) out[b * 4 * LANES + k] = 0.0f + tb[k];
    }
    for (c = nb * 4 * LANES; c + LANES <= C; c += LANES) {
        row_sum_v(p + c, ld, R, t);
        for (int k = 0; k < LANES; k++) out[c + k] = 0.0f + t[k];
    }
    for (; c < C; c++) {
        row_sum_s(p + c, ld, R, t);
        out[c] = 0.0f + t[0];
    }
}
