/* vec_kernels.h — SIMD bodies of the non-GEMM CPU kernels (internal header).
 *
 * Usage (from a kernel in elementwise.c, norm.c, ...):
 *   const sl_vec_ops *v = sl_vec();          // NULL: run the scalar reference kernel
 *   if (v) v->gelu_fwd(x, y, n); else return sl_k_gelu_ref(node);
 *
 * One source (vec_kernels.inc) is compiled twice: vec_avx512.c (AVX-512F/BW/VL/DQ + FMA, 16 lanes) and
 * vec_avx2.c (AVX2 + FMA, 8 lanes). Every function threads with OpenMP over a fixed partition and sums
 * each output in an order fixed by the data layout (never by the thread schedule), so outputs are
 * bitwise identical run to run for a given ISA, whatever the thread count.
 */
#ifndef SL_DEVICE_CPU_KERNELS_VEC_KERNELS_H
#define SL_DEVICE_CPU_KERNELS_VEC_KERNELS_H

#include <stdint.h>

#include "suanli/base.h" /* sl_rng_dropout */

/* Causal attention with grouped KV heads. q (B,T,NH,hs), k/v (B,T,NKV,hs): strides in elements for the
 * B, T and head dims (hs is unit-stride). out (B,T,NH*hs) packed; lse (B,NH,T) packed. */
typedef struct sl_attn_args {
    int64_t B, T, NH, NKV, hs;
    const float *q, *k, *v;
    int64_t qs[3], ks[3], vs[3]; /* strides of dims B, T, head */
    float scale;
    int64_t win;     /* > 0: sliding window (query i sees keys i - win < j <= i); 0: causal */
    float *out;      /* forward: written; backward: read (forward output) */
    float *lse;      /* forward: written; backward: read */
    const float *dy; /* backward: (B,T,NH*hs) with strides dys[0] (B), dys[1] (T); head h at h*hs */
    int64_t dys[2];
    float *dqkv; /* backward: (B,T,NH+2*NKV,hs) packed dq|dk|dv */
    /* dropout of the probabilities (drop_p > 0): mask of element (b, h, i, j) from sl_rng_dropout(drop_seed,
     * drop_hi, ((b drop_heads + drop_h0 + h) T + i) T + j), the heads' place in the full tensor under TP;
     * Note [Dropout from counters] in src/ops/build.c */
    float drop_p;
    uint64_t drop_seed, drop_hi;
    int64_t drop_heads, drop_h0;
} sl_attn_args;
#define SL_ATTN_MAX_HS 256 /* larger head sizes use the reference kernel */

typedef struct sl_vec_ops {
    const char *name;
    /* outputs f32, or rounded to bf16 into the *h array when it is not NULL (Note [Half outputs],
     * src/graph/fuse.c) */
    void (*gelu_fwd)(const float *x, float *y, uint16_t *yh, int64_t n);
    void (*gelu_bwd)(const float *x, const float *dy, float *dx, uint16_t *dxh, int64_t n);
    /* o[r, :] = a[r, :] (+|*) b[r, :]; ldb == 0 broadcasts b's single row; op 0 add, 1 mul */
    void (*binary_rows)(const float *a, int64_t lda, const float *b, int64_t ldb, float *o, int64_t ldo,
                        int64_t R, int64_t C, int op);
    void (*binary_flat)(const float *a, const float *b, float *o, int64_t n, int op);
    /* o[c] = sum_r a[r, c]; a is f32, or bf16 when bf16 != 0 (widened) */
    void (*sum_rows)(const void *a, int64_t lda, int64_t R, int64_t C, float *o, int bf16);
    void (*layernorm_fwd)(const float *x, int64_t xs, const float *w, const float *b, float *y, uint16_t *yh,
                          float *mean, float *rstd, int64_t R, int64_t C, float eps);
    void (*layernorm_bwd_x)(const float *x, int64_t xs, const float *g, int64_t gs, const float *w,
                            const float *mean, const float *rstd, float *dx, int64_t R, int64_t C);
    void (*layernorm_bwd_wb)(const float *x, int64_t xs, const float *g, int64_t gs, const float *mean,
                             const float *rstd, float *dw, float *db, int64_t R, int64_t C);
    void (*softmax_fwd)(const float *x, int64_t xs, float *y, int64_t R, int64_t C);
    void (*softmax_bwd)(const float *y, const float *g, int64_t gs, float *dx, int64_t R, int64_t C);
    void (*ce_lse)(const float *logits, int64_t N, int64_t V, float *lse);
    void (*ce_bwd)(const float *logits, const float *lse, const int32_t *tg, float scale, float *d, int64_t N,
                   int64_t V, int64_t lo); /* one-hot at tg - lo when it lies in [0, V) */
    void (*embedding_bwd)(const int32_t *ids, int64_t N, const float *g, float *d, int64_t C);
    void (*attn_fwd)(const sl_attn_args *a);
    void (*attn_bwd)(const sl_attn_args *a);
    /* out[i] = dropout multiplier of element e0 + i (0 or 1/(1-p)): exactly sl_rng_dropout */
    void (*dropout_mask)(uint64_t seed, uint64_t hi, uint64_t e0, int64_t n, float p, float *out);
    /* o = x * m (+ r when r is not NULL), the product rounded before the add (Note [Hidden dropout bits]);
     * with oh set (and no r), x * m rounded to bf16 into oh instead */
    void (*dropout_apply)(const float *x, const float *r, const float *m, float *o, uint16_t *oh, int64_t n);
} sl_vec_ops;

extern const sl_vec_ops sl_vec_ops_avx512, sl_vec_ops_avx2;
/* The table for sl_kern_isa(), or NULL when the scalar reference kernels should run. */
const sl_vec_ops *sl_vec(void);
/* Tests only: make sl_vec() return `ops` (NULL restores the normal choice). Call from serial code. */
void sl_vec_set_for_test(const sl_vec_ops *ops);

#endif
