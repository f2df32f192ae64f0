/* The CUDA backend's network ops: norms, softmax, attention (training and KV cache), embedding,
 * cross-entropy, RoPE, the top-k gate and the sparse MoE expert. Each function resolves the node's tensors
 * to device pointers and calls the launchers of kernels/norm.cu, attention.cu, loss.cu, llama.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/accel_support.h"
#include "device/cuda/cuda_internal.h"

#define PTR(t, p) SL_TRY(cu_ptr_of(n, (t), (void **)(p)))
#define AUX(t, p) SL_TRY(cu_aux_of(n, (t), (p)))
#define RUN(call) SL_TRY(cu_ok((call), sl_op_name(n->op)))

static int64_t rows_of(const sl_tensor *t) {
    return t->ne[t->ndim - 1] ? sl_nelements(t) / t->ne[t->ndim - 1] : 0;
}
/* row stride of a tensor whose last dim is contiguous and whose leading dims fold uniformly */
static int64_t row_stride(const sl_tensor *t) { return t->ndim >= 2 ? t->nb[t->ndim - 2] : t->ne[0]; }

/* ---------------- norms and softmax ---------------- */

static sl_status op_layernorm(sl_tensor *n) {
    const sl_tensor *x = n->src[0];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    float *y, *st, *px, *w, *b;
    PTR(n, &y);
    AUX(n, &st);
    PTR(x, &px);
    PTR(n->src[1], &w);
    PTR(n->src[2], &b);
    RUN(cu_layernorm(g_cu.stream, y, st, px, row_stride(x), w, b, R, C, n->fparams[0]));
    return SL_OK;
}

/* LAYERNORM_BACK_X / _WB, RMSNORM_BACK_X / _W */
static sl_status op_norm_back(sl_tensor *n) {
    int ln = n->op == SL_OP_LAYERNORM_BACK_X || n->op == SL_OP_LAYERNORM_BACK_WB;
    int wgrad = n->op == SL_OP_LAYERNORM_BACK_WB || n->op == SL_OP_RMSNORM_BACK_W;
    const sl_tensor *f = n->src[0], *x = n->src[1], *g = n->src[wgrad ? 2 : 3];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    float *d, *st, *px, *pg, *w = NULL;
    PTR(n, &d);
    AUX(f, &st);
    PTR(x, &px);
    PTR(g, &pg);
    if (wgrad) {
        void *part;
        SL_TRY(cu_scratch(sizeof(float) * (size_t)cu_colsum_parts(R, C), &part));
        RUN(cu_norm_back_w(g_cu.stream, ln ? 0 : 1, d, part, st, px, row_stride(x), pg, row_stride(g), R, C));
        return SL_OK;
    }
    if (n->src[2]) PTR(n->src[2], &w);
    if (ln)
        RUN(cu_layernorm_back_x(g_cu.stream, d, st, px, row_stride(x), w, pg, row_stride(g), R, C));
    else
        RUN(cu_rmsnorm_back_x(g_cu.stream, d, st, px, row_stride(x), w, pg, row_stride(g), R, C));
    return SL_OK;
}

static sl_status op_rmsnorm(sl_tensor *n) {
    const sl_tensor *x = n->src[0];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    float *y, *st, *px, *w = NULL;
    PTR(n, &y);
    AUX(n, &st);
    PTR(x, &px);
    if (n->src[1]) PTR(n->src[1], &w);
    RUN(cu_rmsnorm(g_cu.stream, y, st, px, row_stride(x), w, R, C, n->fparams[0]));
    return SL_OK;
}

static sl_status op_softmax(sl_tensor *n) {
    const sl_tensor *x = n->src[0];
    float *y, *px;
    PTR(n, &y);
    PTR(x, &px);
    RUN(cu_softmax(g_cu.stream, y, px, row_stride(x), rows_of(x), x->ne[x->ndim - 1]));
    return SL_OK;
}

/* SOFTMAX_BACK and TOPK_GATE_BACK: dx = y * (dy - sum(y * dy)) per row */
static sl_status op_softmax_back(sl_tensor *n) {
    const sl_tensor *y = n->src[0], *g = n->src[1];
    float *d, *py, *pg;
    PTR(n, &d);
    PTR(y, &py);
    PTR(g, &pg);
    RUN(cu_softmax_back(g_cu.stream, d, py, pg, row_stride(g), rows_of(y), y->ne[y->ndim - 1]));
    return SL_OK;
}

/* ---------------- attention ---------------- */

static cu_v5 strides3(const sl_tensor *t) {
    cu_v5 s = {{0, 0, 0, 0, 0}};
    for (int d = 0; d < 3 && d < t->ndim; d++) s.v[d] = t->nb[d];
    return s;
}

/* the dropout of a forward ATTENTION node's probabilities (Note [CUDA dropout] in kernels/common.cuh) */
static cu_drop att_drop(const sl_tensor *fwd, int64_t NH) {
    sl_accel_dropout d = sl_accel_dropout_of(fwd);
    cu_drop r = {.on = d.on,
                 .thr = d.thr,
                 .seed = d.seed,
                 .hi = d.hi,
                 .keep = d.keep,
                 .heads = d.on ? d.heads : NH,
                 .head0 = d.head0};
    return r;
}

static sl_status op_attention(sl_tensor *n) {
    const sl_tensor *q = n->src[0], *k = n->src[1], *v = n->src[2];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    float *o, *lse, *pq, *pk, *pv;
    PTR(n, &o);
    AUX(n, &lse);
    PTR(q, &pq);
    PTR(k, &pk);
    PTR(v, &pv);
    if (n->iparams[2]) { /* Note [CUDA half attention] (kernels/attention_half.cu): a thread per query row */
        void *P;
        SL_TRY(cu_scratch(sizeof(float) * (size_t)(B * NH * T) * (size_t)(2 * T) + 16, &P));
        RUN(cu_attention_half(g_cu.stream, o, lse, pq, strides3(q), pk, strides3(k), pv, strides3(v), B, T,
                              NH, NKV, hs, n->iparams[1], 1.0f / sqrtf((float)hs), n->iparams[2],
                              att_drop(n, NH), P));
        return SL_OK;
    }
    RUN(cu_attention(g_cu.stream, o, lse, pq, strides3(q), pk, strides3(k), pv, strides3(v), B, T, NH, NKV,
                     hs, n->iparams[1], 1.0f / sqrtf((float)hs), att_drop(n, NH)));
    return SL_OK;
}

static sl_status op_attention_back(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *q = n->src[1], *k = n->src[2], *v = n->src[3], *g = n->src[4];
    int64_t B = q->ne[0], T = q->ne[1], NH = q->ne[2], hs = q->ne[3], NKV = k->ne[2];
    float *o, *lse, *pq, *pk, *pv, *pg;
    PTR(n, &o);
    AUX(f, &lse);
    PTR(q, &pq);
    PTR(k, &pk);
    PTR(v, &pv);
    PTR(g, &pg);
    cu_v5 gs = {{g->nb[0], g->nb[1], 0, 0, 0}};
    if (f->iparams[2]) { /* Note [CUDA half attention]: dq per query row, dk / dv per key row and head */
        void *S;
        SL_TRY(cu_scratch(sizeof(float) * (size_t)(B * NH * T) * (size_t)(1 + 2 * hs) + 16, &S));
        RUN(cu_attention_half_back(g_cu.stream, o, lse, pq, strides3(q), pk, strides3(k), pv, strides3(v), pg,
                                   gs, B, T, NH, NKV, hs, n->iparams[1], 1.0f / sqrtf((float)hs),
                                   f->iparams[2], att_drop(f, NH), S));
        return SL_OK;
    }
    void *dsum;
    SL_TRY(cu_scratch(sizeof(float) * (size_t)(B * NH * T > 0 ? B * NH * T : 1), &dsum));
    RUN(cu_attention_back(g_cu.stream, o, dsum, lse, pq, strides3(q), pk, strides3(k), pv, strides3(v), pg,
                          gs, B, T, NH, NKV, hs, n->iparams[1], 1.0f / sqrtf((float)hs), att_drop(f, NH)));
    return SL_OK;
}

static sl_status op_attention_kv(sl_tensor *n) {
    const sl_tensor *q = n->src[0], *kc = n->src[1], *vc = n->src[2];
    int64_t B = q->ne[0], Tq = q->ne[1], NH = q->ne[2], hs = q->ne[3], S = kc->ne[1], NKV = kc->ne[2];
    int64_t pos0 = n->iparams[0];
    if (pos0 < 0 || pos0 + Tq > S)
        return sl_fail(SL_ERR_INVALID, "kv cache: position %lld + %lld exceeds capacity %lld",
                       (long long)pos0, (long long)Tq, (long long)S);
    float *o, *pq, *pk, *pv;
    PTR(n, &o);
    PTR(q, &pq);
    PTR(kc, &pk);
    PTR(vc, &pv);
    RUN(cu_attention_kv(g_cu.stream, o, pq, strides3(q), pk, pv, B, Tq, S, NH, NKV, hs, pos0, n->iparams[1],
                        1.0f / sqrtf((float)hs)));
    return SL_OK;
}

/* ---------------- embedding and cross-entropy ---------------- */

static sl_status op_embedding(sl_tensor *n) {
    const sl_tensor *tab = n->src[0], *ids = n->src[1];
    int64_t V = tab->ne[0], C = tab->ne[1], N = sl_nelements(ids);
    float *o, *pt;
    int32_t *pi;
    PTR(n, &o);
    PTR(tab, &pt);
    PTR(ids, &pi);
    if (n->iparams[3]) /* a vocab shard from iparams[2] (Note [CUDA tensor parallelism], kernels/loss.cu) */
        RUN(cu_embedding_shard(g_cu.stream, o, pt, pi, N, V, C, n->iparams[2], g_cu.flag));
    else
        RUN(cu_embedding(g_cu.stream, o, pt, pi, N, V, C, g_cu.flag));
    return cu_check_flag("embedding: token", V);
}

static sl_status op_embedding_back(sl_tensor *n) {
    const sl_tensor *ids = n->src[1], *g = n->src[2];
    int64_t V = n->ne[0], C = n->ne[1], N = sl_nelements(ids);
    float *d, *pg;
    int32_t *pi;
    PTR(n, &d);
    PTR(ids, &pi);
    PTR(g, &pg);
    if (n->iparams[1]) /* Note [Overwriting first gradient writes] */
        SL_TRY(cu_ok(cudaMemsetAsync(d, 0, sizeof(float) * (size_t)(V * C), g_cu.stream), "embedding_back"));
    if (n->iparams[3]) { /* the rows of a vocab shard (Note [CUDA tensor parallelism]): other ids are skipped
                          */
        RUN(cu_embedding_back_shard(g_cu.stream, d, pi, pg, N, V, C, n->iparams[2], g_cu.deterministic));
        return SL_OK;
    }
    RUN(cu_embedding_back(g_cu.stream, d, pi, pg, N, V, C, g_cu.flag, g_cu.deterministic));
    return cu_check_flag("embedding_back: token", V);
}

static sl_status op_cross_entropy(sl_tensor *n) {
    const sl_tensor *lg = n->src[0], *tg = n->src[1];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    float *o, *lse, *pl;
    int32_t *pt;
    PTR(n, &o);
    AUX(n, &lse);
    PTR(lg, &pl);
    PTR(tg, &pt);
    RUN(cu_ce_lse(g_cu.stream, lse, pl, pt, N, V, V, g_cu.flag));
    SL_TRY(cu_check_flag("cross_entropy: target", V));
    RUN(cu_ce_mean(g_cu.stream, 0, o, lse, pl, pt, pl, N, V));
    return SL_OK;
}

/* CROSS_ENTROPY_BACK, and CE_VP_BACK: a vocab shard from iparams[0] (Note [CUDA tensor parallelism]) */
static sl_status op_cross_entropy_back(sl_tensor *n) {
    const sl_tensor *f = n->src[0], *lg = n->src[1], *tg = n->src[2], *dl = n->src[3];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    float *d, *lse, *pl, *pdl;
    int32_t *pt;
    PTR(n, &d);
    AUX(f, &lse);
    PTR(lg, &pl);
    PTR(tg, &pt);
    PTR(dl, &pdl);
    void *sc;
    SL_TRY(cu_scratch(sizeof(float), &sc));
    int vp = n->op == SL_OP_CE_VP_BACK;
    RUN(cu_ce_mean(g_cu.stream, vp ? 2 : 1, sc, lse, pl, pt, pdl, N, V));
    RUN(cu_ce_back(g_cu.stream, d, lse, pl, pt, sc, N, V, vp ? n->iparams[0] : 0));
    return SL_OK;
}

/* CE_VP_STATS: the shard's logsumexp per row (no target bound: they are global ids) and the target's logit
 * where the shard holds it */
static sl_status op_ce_vp_stats(sl_tensor *n) {
    const sl_tensor *lg = n->src[0], *tg = n->src[1];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    float *o, *pl;
    int32_t *pt;
    PTR(n, &o);
    PTR(lg, &pl);
    PTR(tg, &pt);
    void *sc;
    SL_TRY(cu_scratch(sizeof(float) * (size_t)(N ? N : 1), &sc));
    RUN(cu_ce_lse(g_cu.stream, sc, pl, pt, N, V, INT64_MAX, g_cu.flag));
    RUN(cu_ce_vp_stats(g_cu.stream, o, sc, pl, pt, N, V, n->iparams[0]));
    return SL_OK;
}

/* CE_VP: the group's stats -> the global logsumexp (aux) and the mean loss */
static sl_status op_ce_vp(sl_tensor *n) {
    const sl_tensor *tg = n->src[1], *st = n->src[2];
    float *o, *lse, *ps;
    int32_t *pt;
    PTR(n, &o);
    AUX(n, &lse);
    PTR(tg, &pt);
    PTR(st, &ps);
    RUN(cu_ce_vp(g_cu.stream, o, lse, pt, ps, sl_nelements(tg), st->ne[0]));
    return SL_OK;
}

/* ---------------- llama family ---------------- */

/* inverse frequencies exactly as the CPU computes them (Note [RoPE numerics], llama3 scaling) */
static void rope_inv_freq(const sl_tensor *n, int64_t hs, float *inv) {
    int64_t half = hs / 2;
    float theta = n->fparams[0], factor = n->fparams[1];
    for (int64_t i = 0; i < half; i++) inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
    if (factor > 0) {
        float lo = n->fparams[2], hi = n->fparams[3], old = (float)n->iparams[3];
        float lo_wl = old / lo, hi_wl = old / hi;
        for (int64_t i = 0; i < half; i++) {
            float wl = 2.0f * (float)M_PI / inv[i];
            float f = wl > lo_wl ? inv[i] / factor : inv[i];
            if (!(wl < hi_wl) && !(wl > lo_wl)) {
                float sm = (old / wl - lo) / (hi - lo);
                f = (1.0f - sm) * f / factor + sm * f;
            }
            inv[i] = f;
        }
    }
}

static sl_status op_rope(sl_tensor *n) {
    const sl_tensor *x = n->src[0];
    int64_t B = x->ne[0], T = x->ne[1], NH = x->ne[2], hs = x->ne[3], half = hs / 2;
    float *y, *px;
    PTR(n, &y);
    PTR(x, &px);
    size_t bytes = sizeof(float) * (size_t)(half ? half : 1);
    float *inv = malloc(bytes);
    if (!inv) return sl_fail(SL_ERR_NOMEM, "cuda backend: rope: out of memory");
    rope_inv_freq(n, hs, inv);
    void *dinv;
    sl_status st = cu_scratch(bytes, &dinv);
    /* pageable source: the copy has read `inv` when cudaMemcpyAsync returns */
    if (st == SL_OK)
        st =
            cu_ok(cudaMemcpyAsync(dinv, inv, bytes, cudaMemcpyHostToDevice, g_cu.stream), "rope frequencies");
    free(inv);
    SL_TRY(st);
    /* Note [RoPE numerics]: modes 1 / 2 round to bf16 / f16 with cos and sin rounded, 5 / 6 without */
    int mode = n->iparams[2], bf = mode == 1 || mode == 5 ? 1 : mode == 2 || mode == 6 ? 2 : 0;
    RUN(cu_rope(g_cu.stream, y, px, strides3(x), dinv, B, T, NH, hs, n->iparams[0],
                n->iparams[1] ? -1.0f : 1.0f, bf, mode == 1 || mode == 2));
    return SL_OK;
}

static sl_status op_topk_gate(sl_tensor *n) {
    const sl_tensor *a = n->src[0];
    float *y, *pa;
    PTR(n, &y);
    PTR(a, &pa);
    RUN(cu_topk_gate(g_cu.stream, y, pa, a->nb[0], a->ne[0], a->ne[1], n->iparams[0]));
    return SL_OK;
}

/* Note [Sparse experts] (llama_ops.c) in two kernels: a = silu(h w1^T) * (h w3^T) on the routed rows
 * (scratch, N x I), then y = gate * (a w2^T), zero on the other rows. */
static sl_status op_moe_expert(sl_tensor *n) {
    const sl_tensor *h = n->src[0], *gate = n->src[1], *w1 = n->src[2], *w3 = n->src[3], *w2 = n->src[4];
    int64_t N = h->ne[0], C = h->ne[1], I = w1->ne[0], e = n->iparams[0];
    float *y, *ph, *pg, *p1, *p3, *p2;
    PTR(n, &y);
    PTR(h, &ph);
    PTR(gate, &pg);
    PTR(w1, &p1);
    PTR(w3, &p3);
    PTR(w2, &p2);
    void *a;
    SL_TRY(cu_scratch(sizeof(float) * (size_t)(N * I > 0 ? N * I : 1), &a));
    RUN(cu_moe_up(g_cu.stream, a, ph, pg, gate->nb[0], e, p1, p3, N, C, I));
    RUN(cu_moe_down(g_cu.stream, y, a, pg, gate->nb[0], e, p2, N, C, I));
    return SL_OK;
}

sl_status cu_op_nn(sl_tensor *n) {
    switch (n->op) {
    case SL_OP_LAYERNORM:
        return op_layernorm(n);
    case SL_OP_LAYERNORM_BACK_X:
    case SL_OP_LAYERNORM_BACK_WB:
    case SL_OP_RMSNORM_BACK_X:
    case SL_OP_RMSNORM_BACK_W:
        return op_norm_back(n);
    case SL_OP_RMSNORM:
        return op_rmsnorm(n);
    case SL_OP_SOFTMAX:
        return op_softmax(n);
    case SL_OP_SOFTMAX_BACK:
    case SL_OP_TOPK_GATE_BACK:
        return op_softmax_back(n);
    case SL_OP_ATTENTION:
        return op_attention(n);
    case SL_OP_ATTENTION_BACK:
        return op_attention_back(n);
    case SL_OP_ATTENTION_KV:
        return op_attention_kv(n);
    case SL_OP_EMBEDDING:
        return op_embedding(n);
    case SL_OP_EMBEDDING_BACK:
        return op_embedding_back(n);
    case SL_OP_CROSS_ENTROPY:
        return op_cross_entropy(n);
    case SL_OP_CROSS_ENTROPY_BACK:
    case SL_OP_CE_VP_BACK:
        return op_cross_entropy_back(n);
    case SL_OP_CE_VP_STATS:
        return op_ce_vp_stats(n);
    case SL_OP_CE_VP:
        return op_ce_vp(n);
    case SL_OP_ROPE:
        return op_rope(n);
    case SL_OP_TOPK_GATE:
        return op_topk_gate(n);
    case SL_OP_MOE_EXPERT:
        return op_moe_expert(n);
    default:
        return sl_fail(SL_ERR_UNSUPPORTED, "cuda backend: op %s (%s) not supported", sl_op_name(n->op),
                       sl_dtype_name(n->dtype));
    }
}
