/* Packed routed experts: the experts of a MoE layer as one chain over the packed (token, expert) rows, each
 * expert reading and writing only its own rows (Note [Packed experts], src/ops/moe_ops.c), and the EP
 * regrouping of received rows. Each expert runs the GEMMs of the per-expert path (MOE_EXPERT_FFN and its
 * backward, moe.c) on the same rows, so the two give the same values. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/gemm.h"
#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/moe.h"

static float silu_f(float x) { return x / (1.0f + expf(-x)); }

/* Note [Packed experts under autocast]: iparams[3] of the chain node is the autocast half type (0: none).
 * The kernels then round where the per-expert path's nodes do (sl_llama_lin and sl_llama_swiglu under
 * autocast, whose casts round values forward and gradients backward, as torch.autocast's half tensors do):
 * inputs and weights of every GEMM, each GEMM's output, silu's output and the product; backward every
 * incoming gradient, every GEMM's output and each elementwise step's. Products of two half values are exact
 * in fp32 and every GEMM accumulates in fp32, so the values are those of the per-expert path's nodes.
 * Under bf16 with iparams[4] set (sl_moe_packed_ffn_half_gemm: where sl_llama_lin runs the bf16 GEMM with
 * fused weight casts, Note [bf16 GEMMs under autocast] in src/nn/llama.c) the products are the calls that
 * path's MATMUL nodes make: activations as bf16 rows, weights through sl_gemm_bf16_f32b, weight gradients
 * rounded in the GEMM (sl_gemm_rounded) and input gradients through the fused product, each on the expert's
 * rows (a GEMM's row results do not depend on the other rows, and the per-expert path's extra rows are zero:
 * they add +0 to the weight gradients' sums). Without it, fp32 GEMMs on rounded copies (the unfused path);
 * on an AMX or AVX512_BF16 host the two differ in the accumulation inside the bf16 kernels. */
#define PAR(work) ((int64_t)(work) >= 16384) /* elementwise loops: threads from this many elements */

static inline float rnd_to(float v, int half) {
    return half == SL_BF16  ? sl_bf16_to_f32(sl_f32_to_bf16(v))
           : half == SL_F16 ? sl_f16_to_f32(sl_f32_to_f16(v))
                            : v;
}
static void rnd_n(float *dst, const float *src, int64_t n, int half) {
    if (!half) {
        if (dst != src) memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    }
    if (half == SL_BF16) {
#pragma omp parallel for schedule(static) if (PAR(n))
        for (int64_t i = 0; i < n; i++) dst[i] = sl_bf16_to_f32(sl_f32_to_bf16(src[i]));
    } else {
#pragma omp parallel for schedule(static) if (PAR(n))
        for (int64_t i = 0; i < n; i++) dst[i] = sl_f16_to_f32(sl_f32_to_f16(src[i]));
    }
}
/* a rounded copy of n floats under autocast (*own: to free), else src itself */
static const float *rounded(const float *src, int64_t n, int half, float **own) {
    *own = NULL;
    if (!half) return src;
    if (!(*own = malloc(sizeof(float) * (size_t)(n ? n : 1)))) return NULL;
    rnd_n(*own, src, n, half);
    return *own;
}
/* h = silu(a1) * a3, and under autocast R(R(silu(a1)) * a3) */
static void hidden(float *h, const float *a1, const float *a3, int64_t n, int half) {
    if (!half) {
#pragma omp parallel for schedule(static) if (PAR(n))
        for (int64_t i = 0; i < n; i++) h[i] = silu_f(a1[i]) * a3[i];
        return;
    }
#pragma omp parallel for schedule(static) if (PAR(n))
    for (int64_t i = 0; i < n; i++) h[i] = rnd_to(rnd_to(silu_f(a1[i]), half) * a3[i], half);
}

/* rows x cols of src (rows ld apart) as packed bf16 (sl_f32_to_bf16: the CAST kernel's bits); NULL when out
 * of memory */
static uint16_t *as_bf16(const float *src, int64_t rows, int64_t cols, int64_t ld) {
    uint16_t *d = malloc(sizeof(uint16_t) * (size_t)(rows * cols > 0 ? rows * cols : 1));
    if (!d) return NULL;
    if (ld == cols)
        sl_k_cast_f32_bf16(src, d, rows * cols);
    else
        for (int64_t r = 0; r < rows; r++) sl_k_cast_f32_bf16(src + r * ld, d + r * cols, cols);
    return d;
}
/* C (M x N) = bf16(A^T B) for bf16 A (K x M) and B (K x N): a weight gradient as the MATMUL node marked
 * SL_MATMUL_IP_ROUND computes it (src/device/cpu/kernels/matmul.c) */
static void dw_bf16(const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, int64_t M, int64_t N,
                    int64_t K, float *C) {
    if (!sl_gemm_rounded(1, 1, 0, M, N, K, A, lda, B, ldb, C, N, 0)) {
        sl_gemm_bf16(1, 0, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        rnd_n(C, C, M * N, SL_BF16);
    }
}

/* a whole count in [0, hi], else -1 */
static int64_t whole(float v, int64_t hi) {
    return v >= 0 && v <= (float)hi && v == (float)(int64_t)v ? (int64_t)v : -1;
}

/* The rows of expert iparams[0] in the packed input of chain node f: [*off, *off + *cnt). One process
 * (El = 0): the route's kept counts (MOE_EP_PACK orders pairs expert-major); EP: the received counts rcnt
 * (MOE_EP_REGROUP orders the received rows local-expert major, source rank order within). */
static sl_status packed_rows(const sl_tensor *f, const char *op, int64_t *off, int64_t *cnt) {
    const sl_tensor *xp = f->src[0], *c = xp->src[1];
    int64_t S = xp->ne[0], e = f->iparams[0], El = f->iparams[1], o = 0, k = 0;
    if (El == 0) {
        int64_t N = c->ne[0], E = c->ne[1];
        const float *kept = (const float *)c->data + 3 * N * E + E; /* the route's kept counts */
        for (int64_t j = 0; j <= e && j < E; j++) {
            int64_t v = whole(kept[j], N);
            if (v < 0)
                return sl_fail(SL_ERR_INVALID, "%s: expert %lld has a bad kept count", op, (long long)j);
            if (j < e)
                o += v;
            else
                k = v;
        }
    } else {
        const float *rc = c->data;
        int64_t P = c->ne[0] / El;
        for (int64_t p = 0; p < P; p++)
            for (int64_t j = 0; j <= e; j++) {
                int64_t v = whole(rc[p * El + j], S);
                if (v < 0)
                    return sl_fail(SL_ERR_INVALID, "%s: rank %lld sent a bad count for local expert %lld", op,
                                   (long long)p, (long long)j);
                if (j < e)
                    o += v;
                else
                    k += v;
            }
    }
    if (o + k > S)
        return sl_fail(SL_ERR_INVALID, "%s: expert %lld's rows [%lld, %lld) exceed the %lld packed rows", op,
                       (long long)e, (long long)o, (long long)(o + k), (long long)S);
    *off = o;
    *cnt = k;
    return SL_OK;
}

/* Note [EP weight gradients per source rank]: under autocast a weight gradient is rounded to the half type
 * once per backward pass, over the rows that pass holds (a half-precision node's gradient, as torch's), and
 * summed in fp32 across micro-batches. One process passes one micro-batch's rows; an EP rank passes the rows
 * every source rank sent for the same micro-batch index, each source's block being one micro-batch of the
 * single process. Rounding the sum of all blocks once moved the experts' weight gradients by ~2e-3
 * (normwise, bf16) off the single process while every other gradient was bitwise equal, so the chain rounds
 * each source's block and sums them in fp32 (source order): the single process's roundings. The OpenCL
 * backend does the same on the device (dw_blocks in src/device/opencl/opencl_ops_moe.c: one GEMM per block,
 * the later ones into scratch and added rounded, the blocks from the counts it reads to place the rows):
 * before, its bf16 ep 2 losses were 4.8e-5 .. 9.8e-5 relative off one opencl process, now bitwise equal
 * (4 steps, tests/backend/test_opencl_train.c). The per-expert path (SUANLI_MOE_PACKED=0, ep_experts in
 * src/nn/moe.c) builds the same with graph nodes: under autocast each local expert runs once per source rank
 * p, on MOE_EP_GATHER / MOE_EP_SCATTER with iparams[3] = p + 1 (source p's rows only, in R rows as the single
 * process's expert: the capacity, else N), each run with its own weight casts, so each block's weight
 * gradient is rounded by its own cast (Note [Rounded weight gradients], src/ops/ops_internal.h) and the
 * blocks meet in fp32 in the gradient, in the order autodiff adds them (two terms commute). Measured on the
 * layouts of tests/parallel/test_ep_cli.c with SUANLI_MOE_PACKED=0, against one process: bf16 ep 2 (6
 * steps) worst loss 5.6e-4 relative, weights 4.6e-4 normwise before, 8.5e-8 and 4.9e-10 after (ep 4:
 * every loss equal; capacity factor 1: 4.5e-4 -> equal); fp16 ep 2 (12 steps) 2.6e-4 and 4.2e-4 before,
 * 9.3e-8 and 6.5e-9 after; OpenCL (PoCL) against one opencl process, bf16 3.7e-4 -> 7.4e-8, fp16 1.8e-4 ->
 * 8.1e-8. Its cost: P GEMMs of R rows per expert where there was one of P N rows, P weight casts (without
 * the fused bf16 GEMM) and P scatters into the received rows' gradient. The blocks of expert e's cnt rows,
 * in *nb (1 without EP or rounding); *bl is malloc'd. */
static sl_status grad_blocks(const sl_tensor *f, int64_t cnt, int64_t **bl, int64_t *nb) {
    const sl_tensor *c = f->src[0]->src[1];
    int64_t e = f->iparams[0], El = f->iparams[1], P = El > 0 && f->iparams[3] ? c->ne[0] / El : 1;
    if (!(*bl = malloc(sizeof(int64_t) * (size_t)P)))
        return sl_fail(SL_ERR_NOMEM, "moe_packed_ffn: out of memory");
    *nb = P;
    if (P == 1) {
        (*bl)[0] = cnt;
        return SL_OK;
    }
    for (int64_t p = 0; p < P; p++) (*bl)[p] = whole(((const float *)c->data)[p * El + e], cnt);
    return SL_OK; /* packed_rows checked the counts, whose sum is cnt */
}

/* dw (M x N) = the sum over the row blocks bl[0..nb) of R(A_b^T B_b), A rows lda apart and B rows ldb
 * apart (floats; bf16: uint16_t rows), R the half rounding; one block: the one GEMM as before */
static sl_status dw_blocks(int bf16, const void *A, int64_t lda, const void *B, int64_t ldb, int64_t M,
                           int64_t N, const int64_t *bl, int64_t nb, int half, float *dw) {
    float *t = nb > 1 ? malloc(sizeof(float) * (size_t)(M * N)) : NULL;
    if (nb > 1 && !t) return sl_fail(SL_ERR_NOMEM, "moe_packed_ffn: out of memory");
    int64_t r0 = 0, es = bf16 ? 2 : 4, done = 0;
    for (int64_t b = 0; b < nb; r0 += bl[b++]) {
        if (!bl[b]) continue;
        float *dst = done ? t : dw;
        const char *a = (const char *)A + r0 * lda * es, *bb = (const char *)B + r0 * ldb * es;
        if (bf16)
            dw_bf16((const uint16_t *)a, lda, (const uint16_t *)bb, ldb, M, N, bl[b], dst);
        else {
            sl_sgemm(1, 0, M, N, bl[b], 1.0f, (const float *)a, lda, (const float *)bb, ldb, 0.0f, dst, N);
            rnd_n(dst, dst, M * N, half);
        }
        if (done)
#pragma omp parallel for schedule(static) if (PAR(M * N))
            for (int64_t i = 0; i < M * N; i++) dw[i] += t[i];
        done = 1;
    }
    if (!done) memset(dw, 0, sizeof(float) * (size_t)(M * N));
    free(t);
    return SL_OK;
}

sl_status sl_k_moe_packed_ffn(sl_tensor *n) {
    sl_tensor *xp = n->src[0], *w1 = n->src[1], *w3 = n->src[2], *w2 = n->src[3];
    int64_t S = n->ne[0], C = n->ne[1], I = w1->ne[0], off, cnt;
    int half = n->iparams[3];
    SL_TRY(packed_rows(n, "moe_packed_ffn", &off, &cnt));
    /* in place: n->data is the chain's first node's, whose aux follows its (S, C) rows */
    float *y = (float *)n->data + off * C, *a1 = (float *)n->data + S * C + off * I, *a3 = a1 + S * I;
    if (!cnt) return SL_OK;
    if (half == SL_BF16 && n->iparams[4]) { /* the bf16 GEMM (Note [Packed experts under autocast]) */
        uint16_t *xh = as_bf16((const float *)xp->data + off * C, cnt, C, C), *hh = NULL;
        float *h = malloc(sizeof(float) * (size_t)(cnt * I));
        if (xh && h) {
            sl_gemm_bf16_f32b(0, 1, cnt, I, C, 1.0f, xh, C, w1->data, C, 0.0f, NULL, a1, I);
            sl_gemm_bf16_f32b(0, 1, cnt, I, C, 1.0f, xh, C, w3->data, C, 0.0f, NULL, a3, I);
            rnd_n(a1, a1, cnt * I, half);
            rnd_n(a3, a3, cnt * I, half);
            hidden(h, a1, a3, cnt * I, half);
            if ((hh = as_bf16(h, cnt, I, I))) {
                sl_gemm_bf16_f32b(0, 1, cnt, C, I, 1.0f, hh, I, w2->data, I, 0.0f, NULL, y, C);
                rnd_n(y, y, cnt * C, half);
            }
        }
        sl_status st = hh ? SL_OK : sl_fail(SL_ERR_NOMEM, "moe_packed_ffn: out of memory");
        free(xh), free(hh), free(h);
        return st;
    }
    float *h = malloc(sizeof(float) * (size_t)(cnt * I)), *o[4];
    const float *x = rounded((const float *)xp->data + off * C, cnt * C, half, &o[0]),
                *W1 = rounded(w1->data, I * C, half, &o[1]), *W3 = rounded(w3->data, I * C, half, &o[2]),
                *W2 = rounded(w2->data, I * C, half, &o[3]);
    sl_status st = SL_OK;
    if (!h || !x || !W1 || !W3 || !W2) {
        st = sl_fail(SL_ERR_NOMEM, "moe_packed_ffn: out of memory");
        goto done;
    }
    sl_sgemm(0, 1, cnt, I, C, 1.0f, x, C, W1, C, 0.0f, a1, I);
    sl_sgemm(0, 1, cnt, I, C, 1.0f, x, C, W3, C, 0.0f, a3, I);
    rnd_n(a1, a1, cnt * I, half);
    rnd_n(a3, a3, cnt * I, half);
    hidden(h, a1, a3, cnt * I, half);
    sl_sgemm(0, 1, cnt, C, I, 1.0f, h, I, W2, I, 0.0f, y, C);
    rnd_n(y, y, cnt * C, half);
done:
    free(h);
    for (int i = 0; i < 4; i++) free(o[i]);
    return st;
}

/* from dh (in d1's rows: h == d1) the pre-activation gradients d(w3 x) into d3 and d(w1 x) into d1 */
static void back_pointwise(const float *h, const float *a1, const float *a3, float *d1, float *d3, int64_t n,
                           int half) {
    if (!half) {
#pragma omp parallel for schedule(static) if (PAR(n))
        for (int64_t i = 0; i < n; i++) {
            float sg = 1.0f / (1.0f + expf(-a1[i])), d = h[i];
            d3[i] = d * a1[i] * sg;                                /* dh * silu(w1 x) */
            d1[i] = d * a3[i] * sg * (1.0f + a1[i] * (1.0f - sg)); /* dh * w3 x * silu'(w1 x) */
        }
    } else {
#pragma omp parallel for schedule(static) if (PAR(n))
        for (int64_t i = 0; i < n; i++) {
            float sg = 1.0f / (1.0f + expf(-a1[i])), d = rnd_to(h[i], half);
            d3[i] = rnd_to(d * rnd_to(silu_f(a1[i]), half), half);         /* d(w3 x) = R(dh R(silu)) */
            float ds_ = rnd_to(d * a3[i], half);                           /* d silu = R(dh w3 x) */
            d1[i] = rnd_to(ds_ * sg * (1.0f + a1[i] * (1.0f - sg)), half); /* R(d silu silu') */
        }
    }
}

/* dw2 and, into aux, d(w1 x) and d(w3 x) of the expert's rows */
sl_status sl_k_moe_packed_ffn_back(sl_tensor *n) {
    sl_tensor *f = n->src[0], *dy = n->src[1], *w2 = n->src[2];
    int64_t S = f->ne[0], C = f->ne[1], I = w2->ne[1], Rb = n->iparams[2], ds = dy->nb[0], off, cnt;
    int half = f->iparams[3];
    SL_TRY(packed_rows(f, "moe_packed_ffn_back", &off, &cnt));
    if (cnt > Rb)
        return sl_fail(SL_ERR_INVALID, "moe_packed_ffn_back: expert %d holds %lld rows, more than %lld",
                       f->iparams[0], (long long)cnt, (long long)Rb);
    const float *a1 = (const float *)f->data + S * C + off * I, *a3 = a1 + S * I;
    float *dw2 = n->data, *d1 = dw2 + C * I, *d3 = d1 + Rb * I;
    if (!cnt) {
        memset(dw2, 0, sizeof(float) * (size_t)(C * I));
        return SL_OK;
    }
    float *h = d1; /* the hidden activation, then dh, in the d1 rows before they are written */
    if (half == SL_BF16 && f->iparams[4]) { /* the bf16 GEMM (Note [Packed experts under autocast]) */
        uint16_t *gh = as_bf16((const float *)dy->data + off * ds, cnt, C, ds), *hh = NULL;
        if (gh) {
            hidden(h, a1, a3, cnt * I, half);
            hh = as_bf16(h, cnt, I, I);
        }
        if (!hh) {
            free(gh);
            return sl_fail(SL_ERR_NOMEM, "moe_packed_ffn_back: out of memory");
        }
        int64_t *bl = NULL, nb = 0;
        sl_status st = grad_blocks(f, cnt, &bl, &nb);
        if (st == SL_OK) /* dw2 = bf16(dy^T h), per source rank under EP */
            st = dw_blocks(1, gh, C, hh, I, C, I, bl, nb, half, dw2);
        if (st == SL_OK) /* dh = dy w2 */
            sl_gemm_bf16_f32b(0, 0, cnt, I, C, 1.0f, gh, C, w2->data, I, 0.0f, NULL, h, I);
        free(gh), free(hh), free(bl);
        SL_TRY(st);
        back_pointwise(h, a1, a3, d1, d3, cnt * I, half);
        return SL_OK;
    }
    float *og = NULL, *ow = NULL, *gr = NULL;
    const float *g = (const float *)dy->data + off * ds, *W2 = rounded(w2->data, C * I, half, &ow);
    int64_t gs = ds;
    if (half) { /* the rounded incoming gradient, rows packed */
        gr = og = malloc(sizeof(float) * (size_t)(cnt * C));
        for (int64_t r = 0; og && r < cnt; r++) rnd_n(og + r * C, g + r * ds, C, half);
        g = og, gs = C;
    }
    if (!W2 || (half && !gr)) {
        free(og), free(ow);
        return sl_fail(SL_ERR_NOMEM, "moe_packed_ffn_back: out of memory");
    }
    hidden(h, a1, a3, cnt * I, half);
    int64_t *bl = NULL, nb = 0;
    sl_status st = grad_blocks(f, cnt, &bl, &nb);
    if (st == SL_OK) st = dw_blocks(0, g, gs, h, I, C, I, bl, nb, half, dw2); /* dw2 = R(dy^T h) */
    free(bl);
    if (st != SL_OK) {
        free(og), free(ow);
        return st;
    }
    sl_sgemm(0, 0, cnt, I, C, 1.0f, g, gs, W2, I, 0.0f, h, I); /* dh = dy w2 */
    back_pointwise(h, a1, a3, d1, d3, cnt * I, half);
    free(og), free(ow);
    return SL_OK;
}

sl_status sl_k_moe_packed_ffn_back_w(sl_tensor *n) {
    sl_tensor *b = n->src[0], *xp = n->src[1], *f = b->src[0];
    int64_t C = f->ne[1], I = b->ne[1], Rb = b->iparams[2], off, cnt;
    int half = f->iparams[3];
    SL_TRY(packed_rows(f, "moe_packed_ffn_back_w", &off, &cnt));
    float *dw1 = n->data, *dw3 = dw1 + I * C, *ox;
    if (!cnt) {
        memset(dw1, 0, sizeof(float) * (size_t)(2 * I * C));
        return SL_OK;
    }
    const float *d1 = (const float *)b->data + C * I, *d3 = d1 + Rb * I;
    if (half == SL_BF16 && f->iparams[4]) { /* the bf16 GEMM (Note [Packed experts under autocast]) */
        uint16_t *xh = as_bf16((const float *)xp->data + off * C, cnt, C, C), *dh1 = as_bf16(d1, cnt, I, I),
                 *dh3 = as_bf16(d3, cnt, I, I);
        int64_t *bl = NULL, nb = 0;
        sl_status st = xh && dh1 && dh3 ? grad_blocks(f, cnt, &bl, &nb)
                                        : sl_fail(SL_ERR_NOMEM, "moe_packed_ffn_back_w: out of memory");
        if (st == SL_OK) st = dw_blocks(1, dh1, I, xh, C, I, C, bl, nb, half, dw1);
        if (st == SL_OK) st = dw_blocks(1, dh3, I, xh, C, I, C, bl, nb, half, dw3);
        free(xh), free(dh1), free(dh3), free(bl);
        return st;
    }
    const float *x = rounded((const float *)xp->data + off * C, cnt * C, half, &ox);
    if (!x) return sl_fail(SL_ERR_NOMEM, "moe_packed_ffn_back_w: out of memory");
    int64_t *bl = NULL, nb = 0;
    sl_status st = grad_blocks(f, cnt, &bl, &nb);
    if (st == SL_OK) st = dw_blocks(0, d1, I, x, C, I, C, bl, nb, half, dw1);
    if (st == SL_OK) st = dw_blocks(0, d3, I, x, C, I, C, bl, nb, half, dw3);
    free(ox), free(bl);
    return st;
}

/* the expert's rows of dx (in place on the later expert's DX node; rows of no expert stay unwritten: the
 * only reader, MOE_EP_UNPACK or MOE_EP_REGROUP, reads the counted rows); under autocast R(d1 w1) + R(d3 w3),
 * the two linears' rounded input gradients summed */
sl_status sl_k_moe_packed_ffn_dx(sl_tensor *n) {
    sl_tensor *b = n->src[0], *w1 = n->src[1], *w3 = n->src[2], *f = b->src[0];
    int64_t C = f->ne[1], I = w1->ne[0], Rb = b->iparams[2], off, cnt;
    int half = f->iparams[3];
    SL_TRY(packed_rows(f, "moe_packed_ffn_dx", &off, &cnt));
    if (!cnt) return SL_OK;
    const float *d1 = (const float *)b->data + C * I, *d3 = d1 + Rb * I;
    float *dx = (float *)n->data + off * C;
    if (!half) {
        sl_sgemm(0, 0, cnt, C, I, 1.0f, d1, I, w1->data, C, 0.0f, dx, C);
        sl_sgemm(0, 0, cnt, C, I, 1.0f, d3, I, w3->data, C, 1.0f, dx, C);
        return SL_OK;
    }
    if (half == SL_BF16 && f->iparams[4]) { /* the bf16 GEMM (Note [Packed experts under autocast]) */
        uint16_t *dh1 = as_bf16(d1, cnt, I, I), *dh3 = as_bf16(d3, cnt, I, I);
        float *t = malloc(sizeof(float) * (size_t)(cnt * C));
        if (dh1 && dh3 && t) {
            sl_gemm_bf16_f32b(0, 0, cnt, C, I, 1.0f, dh1, I, w1->data, C, 0.0f, NULL, dx, C);
            sl_gemm_bf16_f32b(0, 0, cnt, C, I, 1.0f, dh3, I, w3->data, C, 0.0f, NULL, t, C);
#pragma omp parallel for schedule(static) if (PAR(cnt * C))
            for (int64_t i = 0; i < cnt * C; i++) dx[i] = rnd_to(dx[i], half) + rnd_to(t[i], half);
        }
        sl_status st = dh1 && dh3 && t ? SL_OK : sl_fail(SL_ERR_NOMEM, "moe_packed_ffn_dx: out of memory");
        free(dh1), free(dh3), free(t);
        return st;
    }
    float *o1, *o3, *t = malloc(sizeof(float) * (size_t)(cnt * C));
    const float *W1 = rounded(w1->data, I * C, half, &o1), *W3 = rounded(w3->data, I * C, half, &o3);
    if (!t || !W1 || !W3) {
        free(t), free(o1), free(o3);
        return sl_fail(SL_ERR_NOMEM, "moe_packed_ffn_dx: out of memory");
    }
    sl_sgemm(0, 0, cnt, C, I, 1.0f, d1, I, W1, C, 0.0f, dx, C);
    sl_sgemm(0, 0, cnt, C, I, 1.0f, d3, I, W3, C, 0.0f, t, C);
#pragma omp parallel for schedule(static) if (PAR(cnt * C))
    for (int64_t i = 0; i < cnt * C; i++) dx[i] = rnd_to(dx[i], half) + rnd_to(t[i], half);
    free(t), free(o1), free(o3);
    return SL_OK;
}

/* Received rows: block p (from source rank p) holds rcnt[p El + j] rows for local expert j, j in order.
 * Regrouped: expert j's rows from every source in rank order (what MOE_EP_GATHER gives expert j). */
sl_status sl_k_moe_ep_regroup(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *rcnt = n->src[1];
    int64_t R = n->ne[0], C = n->ne[1], El = n->iparams[1], P = rcnt->ne[0] / El, back = n->iparams[0];
    const float *rc = rcnt->data;
    int64_t *src = malloc(sizeof(int64_t) * (size_t)(P * El)), tot = 0;
    if (!src) return sl_fail(SL_ERR_NOMEM, "moe_ep_regroup: out of memory");
    for (int64_t p = 0; p < P; p++) /* where block (p, j) starts in the received layout */
        for (int64_t j = 0; j < El; j++) {
            int64_t v = whole(rc[p * El + j], R);
            if (v < 0 || tot + v > R) {
                free(src);
                return sl_fail(SL_ERR_INVALID,
                               "moe_ep_regroup: bad count %g from rank %lld for local expert %lld",
                               (double)rc[p * El + j], (long long)p, (long long)j);
            }
            src[p * El + j] = tot;
            tot += v;
        }
    const float *in = x->data;
    float *out = n->data;
    int64_t dst = 0;
    for (int64_t j = 0; j < El; j++)
        for (int64_t p = 0; p < P; p++) {
            int64_t v = (int64_t)rc[p * El + j], s = src[p * El + j];
            const float *from = in + (back ? dst : s) * C;
            float *to = out + (back ? s : dst) * C;
            memcpy(to, from, sizeof(float) * (size_t)(v * C));
            dst += v;
        }
    /* rows past the counts: zero, except in reserved storage, whose tail stays untouched (uncommitted)
     * and is read by nobody (Note [Reserved rows], src/graph/graph.c) */
    if (!(n->flags & SL_FLAG_ROWS_CAP)) memset(out + tot * C, 0, sizeof(float) * (size_t)((R - tot) * C));
    free(src);
    return SL_OK;
}
