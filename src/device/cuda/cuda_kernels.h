/* The CUDA kernels' launchers (kernels/ (*.cu), compiled by nvcc), as a C interface shared by the host side
 * of the backend (cuda_*.c, compiled by gcc) and the .cu files. Every launcher enqueues on stream `s` and
 * returns cudaGetLastError() of the launch (cudaSuccess when there was nothing to do). Tensors arrive as
 * device pointers to their first element (t->data: the buffer base is the cudaMalloc'd address); shapes and
 * strides in elements. Semantics of each op: suanli/tensor.h and src/device/cpu/kernels/. */
#ifndef SL_CUDA_KERNELS_H
#define SL_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* a 5-D shape or stride vector (leading 1s / 0s), passed to kernels by value */
typedef struct cu_v5 {
    int64_t v[5];
} cu_v5;

/* what a dropout site draws (Note [CUDA dropout] in kernels/common.cuh, from sl_accel_dropout_of): on = 0 is
 * no dropout; heads / head0: an ATTENTION node's place among the model's query heads (TP) */
typedef struct cu_drop {
    int on;
    uint32_t thr;
    uint64_t seed, hi;
    float keep;
    int64_t heads, head0;
} cu_drop;

/* elementwise op codes of cu_ew (kernels/elementwise.cu) */
enum {
    CU_EW_ADD = 0,
    CU_EW_MUL,
    CU_EW_COPY_A, /* o = a (bit copy) */
    CU_EW_SCALE,  /* o = a * f */
    CU_EW_GELU,
    CU_EW_GELU_BACK, /* a = x, b = dy */
    CU_EW_SILU,
    CU_EW_SILU_BACK, /* a = x, b = dy */
    CU_EW_FILL,      /* o = f */
    CU_EW_COPY_B,    /* o = b (bit copy) */
};
/* op codes of cu_ew16 */
enum {
    CU_EW16_COPY = 0,
    CU_EW16_F32_TO_BF16,
    CU_EW16_BF16_TO_F32,
    CU_EW16_ROUND_BF16, /* f32 -> f32 */
    CU_EW16_F32_TO_F16, /* IEEE binary16, nearest even (Note [CUDA f16 storage]) */
    CU_EW16_F16_TO_F32
};

/* ---- elementwise.cu ---- */
/* o[it] = op(a[it], b[it]) over shape ne (32-bit elements), each operand with its own strides */
cudaError_t cu_ew(cudaStream_t s, int op, float f, void *o, cu_v5 nbo, const void *a, cu_v5 nba,
                  const void *b, cu_v5 nbb, cu_v5 ne);
/* 16-bit copies, f32 <-> bf16 and f32 <-> f16 casts (round to nearest even, quiet NaN; the CPU's bits) and
 * rounding f32 to bf16 */
cudaError_t cu_ew16(cudaStream_t s, int op, void *o, cu_v5 nbo, const void *a, cu_v5 nba, cu_v5 ne);
/* o (contiguous, shape neo, n_out elements) = sum of a (shape ne, strides nba) over the broadcast dims */
cudaError_t cu_sum_to(cudaStream_t s, float *o, const float *a, cu_v5 ne, cu_v5 nba, cu_v5 neo,
                      int64_t n_out);

/* ---- dropout.cu ---- DROPOUT: o = x * m, or r + x * m (r non-NULL); nb blocks of blk contiguous
 * elements: seq == 0: one block, element i is number i of the site; seq > 0: a sequence shard, batch row b of
 * (B, Tl, R) holds positions [t0, + Tl) of seq, element i of it is number (b seq + t0) R + i */
cudaError_t cu_dropout(cudaStream_t s, float *o, const float *x, const float *r, int64_t nb, int64_t blk,
                       int64_t R, int64_t seq, int64_t t0, cu_drop d);

/* ---- norm.cu ---- (row r of x starts at x + r * xs; outputs contiguous) */
cudaError_t cu_layernorm(cudaStream_t s, float *y, float *stats, const float *x, int64_t xs, const float *w,
                         const float *b, int64_t R, int64_t C, float eps);
cudaError_t cu_layernorm_back_x(cudaStream_t s, float *dx, const float *stats, const float *x, int64_t xs,
                                const float *w, const float *g, int64_t gs, int64_t R, int64_t C);
/* the weight gradients: partial sums over 512-row chunks (scratch `part`, cu_colsum_parts floats), then the
 * chunks added in order: deterministic. mode 0: LayerNorm (out (2, C) = [dw; db]), 1: RMSNorm (out (C)). */
int64_t cu_colsum_parts(int64_t R, int64_t C);
cudaError_t cu_norm_back_w(cudaStream_t s, int mode, float *out, float *part, const float *stats,
                           const float *x, int64_t xs, const float *g, int64_t gs, int64_t R, int64_t C);
cudaError_t cu_rmsnorm(cudaStream_t s, float *y, float *rstd, const float *x, int64_t xs, const float *w,
                       int64_t R, int64_t C, float eps);
cudaError_t cu_rmsnorm_back_x(cudaStream_t s, float *dx, const float *rstd, const float *x, int64_t xs,
                              const float *w, const float *g, int64_t gs, int64_t R, int64_t C);
cudaError_t cu_softmax(cudaStream_t s, float *y, const float *x, int64_t xs, int64_t R, int64_t C);
/* dx = y * (dy - sum(y * dy)) per row (also the top-k gate's backward) */
cudaError_t cu_softmax_back(cudaStream_t s, float *dx, const float *y, const float *g, int64_t gs, int64_t R,
                            int64_t C);

/* ---- attention.cu ---- d: dropout of the probabilities (element (t, j) of query head h of batch b is
 * number ((b heads + head0 + h) T + t) T + j); win > 0: a sliding window (query t sees keys t - win + 1 ..
 * t); q/k/v rows (b, t, head) with strides qs/ks/vs (v[0..2]); dy rows (b, t) with strides gs (v[0..1]),
 * heads contiguous */
cudaError_t cu_attention(cudaStream_t s, float *out, float *lse, const float *q, cu_v5 qs, const float *k,
                         cu_v5 ks, const float *v, cu_v5 vs, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                         int64_t hs, int64_t win, float scale, cu_drop d);
/* out (B, T, NH + 2 NKV, hs) packed dq | dk | dv; dsum: B * NH * T floats of scratch */
cudaError_t cu_attention_back(cudaStream_t s, float *out, float *dsum, const float *lse, const float *q,
                              cu_v5 qs, const float *k, cu_v5 ks, const float *v, cu_v5 vs, const float *g,
                              cu_v5 gs, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                              int64_t win, float scale, cu_drop d);
cudaError_t cu_attention_kv(cudaStream_t s, float *out, const float *q, cu_v5 qs, const float *k,
                            const float *v, int64_t B, int64_t Tq, int64_t S, int64_t NH, int64_t NKV,
                            int64_t hs, int64_t pos0, int64_t win, float scale);

/* ---- attention_half.cu ---- the eager half numerics (hm = ATTENTION iparams[2], 1..4; Note [CUDA half
 * attention]): the CPU's scalar reference as threads. P: B NH T * 2 T floats of scratch; S: B NH T * (1 + 2
 * hs) floats (D per row, the per-head dk / dv sums) */
cudaError_t cu_attention_half(cudaStream_t s, float *out, float *lse, const float *q, cu_v5 qs,
                              const float *k, cu_v5 ks, const float *v, cu_v5 vs, int64_t B, int64_t T,
                              int64_t NH, int64_t NKV, int64_t hs, int64_t win, float scale, int hm,
                              cu_drop d, float *P);
cudaError_t cu_attention_half_back(cudaStream_t s, float *out, const float *lse, const float *q, cu_v5 qs,
                                   const float *k, cu_v5 ks, const float *v, cu_v5 vs, const float *g,
                                   cu_v5 gs, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                   int64_t win, float scale, int hm, cu_drop d, float *S);

/* ---- loss.cu ---- flag: 2 device ints {set, offending id} */
cudaError_t cu_embedding(cudaStream_t s, float *out, const float *tab, const int32_t *ids, int64_t N,
                         int64_t V, int64_t C, int *flag);
/* deterministic: 1 = one thread per column, positions in order (slow); 0 = atomics */
cudaError_t cu_embedding_back(cudaStream_t s, float *d, const int32_t *ids, const float *g, int64_t N,
                              int64_t V, int64_t C, int *flag, int deterministic);
/* targets >= vcheck are flagged (V; INT64_MAX for a vocab shard, whose targets are global ids) */
cudaError_t cu_ce_lse(cudaStream_t s, float *lse, const float *x, const int32_t *tg, int64_t N, int64_t V,
                      int64_t vcheck, int *flag);
/* mode 0: out[0] = mean over valid rows of lse - logit[target] (double); mode 1: out[0] = dl[0] / count;
 * mode 2: the same with every target >= 0 counted (a vocab shard) */
cudaError_t cu_ce_mean(cudaStream_t s, int mode, float *out, const float *lse, const float *x,
                       const int32_t *tg, const float *dl, int64_t N, int64_t V);
/* tlo: the first id of a vocab shard (0: the whole vocabulary) */
cudaError_t cu_ce_back(cudaStream_t s, float *d, const float *lse, const float *x, const int32_t *tg,
                       const float *scale, int64_t N, int64_t V, int64_t tlo);
/* Note [CUDA tensor parallelism] (loss.cu): the vocab-shard embedding [lo, lo + V) and its backward,
 * CE_VP_STATS (out (N, 2) from the shard's lse), CE_VP (stats (P, N, 2) -> lse and the mean loss) */
cudaError_t cu_embedding_shard(cudaStream_t s, float *out, const float *tab, const int32_t *ids, int64_t N,
                               int64_t V, int64_t C, int64_t lo, int *flag);
cudaError_t cu_embedding_back_shard(cudaStream_t s, float *d, const int32_t *ids, const float *g, int64_t N,
                                    int64_t V, int64_t C, int64_t lo, int deterministic);
cudaError_t cu_ce_vp_stats(cudaStream_t s, float *out, const float *lse, const float *x, const int32_t *tg,
                           int64_t N, int64_t V, int64_t lo);
cudaError_t cu_ce_vp(cudaStream_t s, float *out, float *lse, const int32_t *tg, const float *st, int64_t N,
                     int64_t P);

/* ---- llama.cu ---- */
/* bf: 0 fp32, 1 bf16, 2 f16 rounding of products and sums; round_cs: cos / sin rounded too (Note [RoPE
 * numerics]) */
cudaError_t cu_rope(cudaStream_t s, float *y, const float *x, cu_v5 xs, const float *inv, int64_t B,
                    int64_t T, int64_t NH, int64_t hs, int64_t pos0, float sgn, int bf, int round_cs);
cudaError_t cu_topk_gate(cudaStream_t s, float *y, const float *x, int64_t xs, int64_t N, int64_t E, int k);
cudaError_t cu_moe_up(cudaStream_t s, float *a, const float *h, const float *gate, int64_t gs, int64_t e,
                      const float *w1, const float *w3, int64_t N, int64_t C, int64_t I);
cudaError_t cu_moe_down(cudaStream_t s, float *y, const float *a, const float *gate, int64_t gs, int64_t e,
                        const float *w2, int64_t N, int64_t C, int64_t I);

/* ---- optim.cu ---- */
cudaError_t cu_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, int64_t n, float decay,
                     float gscale, float b1, float b2, float eps, float step_size, float bc2_sqrt);
/* part[c] = sum of squares (double) of 65536-element chunk c of x[0 .. n), a fixed reduction tree per chunk
 */
cudaError_t cu_sumsq_chunks(cudaStream_t s, const float *x, int64_t n, double *part);

#ifdef __cplusplus
}
#endif
#endif
