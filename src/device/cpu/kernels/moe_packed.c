/* Packed routed experts: the experts of a MoE layer as one chain over the packed (token, expert) rows, each
 * expert reading and writing only its own rows (Note [Packed experts], src/ops/moe_ops.c), and the EP
 * regrouping of received rows. Each expert runs the GEMMs of the per-expert path (MOE_EXPERT_FFN and its
 * backward, moe.c) on the same rows, so the two give the same values. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/gemm.h"
#include "device/cpu/kernels/moe.h"

static float silu_f(float x) { return x / (1.0f + expf(-x)); }

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

sl_status sl_k_moe_packed_ffn(sl_tensor *n) {
    sl_tensor *xp = n->src[0], *w1 = n->src[1], *w3 = n->src[2], *w2 = n->src[3];
    int64_t S = n->ne[0], C = n->ne[1], I = w1->ne[0], off, cnt;
    SL_TRY(packed_rows(n, "moe_packed_ffn", &off, &cnt));
    /* in place: n->data is the chain's first node's, whose aux follows its (S, C) rows */
    float *y = (float *)n->data + off * C, *a1 = (float *)n->data + S * C + off * I, *a3 = a1 + S * I;
    if (!cnt) return SL_OK;
    float *h = malloc(sizeof(float) * (size_t)(cnt * I));
    if (!h) return sl_fail(SL_ERR_NOMEM, "moe_packed_ffn: out of memory");
    const float *x = (const float *)xp->data + off * C;
    sl_sgemm(0, 1, cnt, I, C, 1.0f, x, C, w1->data, C, 0.0f, a1, I);
    sl_sgemm(0, 1, cnt, I, C, 1.0f, x, C, w3->data, C, 0.0f, a3, I);
    for (int64_t i = 0; i < cnt * I; i++) h[i] = silu_f(a1[i]) * a3[i];
    sl_sgemm(0, 1, cnt, C, I, 1.0f, h, I, w2->data, I, 0.0f, y, C);
    free(h);
    return SL_OK;
}

/* dw2 and, into aux, d(w1 x) and d(w3 x) of the expert's rows */
sl_status sl_k_moe_packed_ffn_back(sl_tensor *n) {
    sl_tensor *f = n->src[0], *dy = n->src[1], *w2 = n->src[2];
    int64_t S = f->ne[0], C = f->ne[1], I = w2->ne[1], Rb = n->iparams[2], ds = dy->nb[0], off, cnt;
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
    const float *g = (const float *)dy->data + off * ds;
    float *h = d1; /* silu(w1 x) * w3 x, then dh, in the d1 rows before they are written */
    for (int64_t i = 0; i < cnt * I; i++) h[i] = silu_f(a1[i]) * a3[i];
    sl_sgemm(1, 0, C, I, cnt, 1.0f, g, ds, h, I, 0.0f, dw2, I);      /* dw2 = dy^T h */
    sl_sgemm(0, 0, cnt, I, C, 1.0f, g, ds, w2->data, I, 0.0f, h, I); /* dh = dy w2 */
    for (int64_t i = 0; i < cnt * I; i++) {
        float sg = 1.0f / (1.0f + expf(-a1[i])), d = h[i];
        d3[i] = d * a1[i] * sg;                                /* dh * silu(w1 x) */
        d1[i] = d * a3[i] * sg * (1.0f + a1[i] * (1.0f - sg)); /* dh * w3 x * silu'(w1 x) */
    }
    return SL_OK;
}

sl_status sl_k_moe_packed_ffn_back_w(sl_tensor *n) {
    sl_tensor *b = n->src[0], *xp = n->src[1], *f = b->src[0];
    int64_t C = f->ne[1], I = b->ne[1], Rb = b->iparams[2], off, cnt;
    SL_TRY(packed_rows(f, "moe_packed_ffn_back_w", &off, &cnt));
    const float *d1 = (const float *)b->data + C * I, *d3 = d1 + Rb * I,
                *x = (const float *)xp->data + off * C;
    float *dw1 = n->data, *dw3 = dw1 + I * C;
    if (!cnt) {
        memset(dw1, 0, sizeof(float) * (size_t)(2 * I * C));
        return SL_OK;
    }
    sl_sgemm(1, 0, I, C, cnt, 1.0f, d1, I, x, C, 0.0f, dw1, C);
    sl_sgemm(1, 0, I, C, cnt, 1.0f, d3, I, x, C, 0.0f, dw3, C);
    return SL_OK;
}

/* the expert's rows of dx (in place on the later expert's DX node; rows of no expert stay unwritten: the
 * only reader, MOE_EP_UNPACK or MOE_EP_REGROUP, reads the counted rows) */
sl_status sl_k_moe_packed_ffn_dx(sl_tensor *n) {
    sl_tensor *b = n->src[0], *w1 = n->src[1], *w3 = n->src[2], *f = b->src[0];
    int64_t C = f->ne[1], I = w1->ne[0], Rb = b->iparams[2], off, cnt;
    SL_TRY(packed_rows(f, "moe_packed_ffn_dx", &off, &cnt));
    if (!cnt) return SL_OK;
    const float *d1 = (const float *)b->data + C * I, *d3 = d1 + Rb * I;
    float *dx = (float *)n->data + off * C;
    sl_sgemm(0, 0, cnt, C, I, 1.0f, d1, I, w1->data, C, 0.0f, dx, C);
    sl_sgemm(0, 0, cnt, C, I, 1.0f, d3, I, w3->data, C, 1.0f, dx, C);
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
    memset(out + tot * C, 0, sizeof(float) * (size_t)((R - tot) * C)); /* rows past the counts */
    free(src);
    return SL_OK;
}
