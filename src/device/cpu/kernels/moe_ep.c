/* Expert-parallel MoE kernels: counts, pack / unpack of (token, expert) pairs, and the per-expert gather /
 * scatter of received rows (Note [Expert-parallel dispatch], src/ops/moe_ep_ops.c). Sums over a token's
 * experts run in expert order from zero, as MOE_COMBINE's chain does in one process, so a token's output is
 * bitwise the single process's for the same expert outputs. */
#include <string.h>

#include "device/cpu/kernels/moe.h"

#define PAR(work) ((int64_t)(work) >= 16384)

static const float *route_mask(const sl_tensor *r) {
    return (const float *)r->data + 2 * r->ne[0] * r->ne[1];
}

/* row[n * E + e] = the packed row of kept pair (n, e), -1 for other pairs; returns the pair count */
static int64_t pair_rows(const sl_tensor *route, int64_t *row) {
    int64_t N = route->ne[0], E = route->ne[1], c = 0;
    const float *pm = route_mask(route);
    for (int64_t e = 0; e < E; e++)
        for (int64_t n = 0; n < N; n++) row[n * E + e] = pm[n * E + e] == 1 ? c++ : -1;
    return c;
}

static sl_status pairs_for(const sl_tensor *route, int64_t S, const char *op, int64_t **row) {
    int64_t NE = route->ne[0] * route->ne[1];
    *row = malloc(sizeof(int64_t) * (size_t)(NE > 0 ? NE : 1));
    if (!*row) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", op);
    int64_t c = pair_rows(route, *row);
    if (c > S) {
        free(*row);
        return sl_fail(SL_ERR_INVALID, "%s: %lld kept pairs exceed the %lld packed rows", op, (long long)c,
                       (long long)S);
    }
    return SL_OK;
}

/* iparams[0] = B > 1: per block of N / B rows (sl_moe_route_block_counts) */
sl_status sl_k_moe_ep_counts(sl_tensor *n) {
    const sl_tensor *route = n->src[0];
    int64_t N = route->ne[0], E = route->ne[1], B = n->iparams[0] > 1 ? n->iparams[0] : 1, Nb = N / B;
    const float *pm = route_mask(route);
    float *out = n->data;
    for (int64_t i = 0; i < B * E; i++) out[i] = 0;
    for (int64_t r = 0; r < N; r++)
        for (int64_t e = 0; e < E; e++) out[r / Nb * E + e] += pm[r * E + e] == 1;
    return SL_OK;
}

sl_status sl_k_moe_ep_pack(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *route = n->src[1];
    int64_t S = n->ne[0], C = n->ne[1], N = route->ne[0], E = route->ne[1], xs = x->nb[0], *row;
    SL_TRY(pairs_for(route, S, "moe_ep_pack", &row));
    const float *pw = route->data, *px = x->data;
    float *out = n->data;
    int w = n->iparams[1];
#pragma omp parallel for schedule(static) if (PAR(N * C))
    for (int64_t t = 0; t < N; t++)
        for (int64_t e = 0; e < E; e++) {
            int64_t r = row[t * E + e];
            if (r < 0) continue;
            float s = w ? pw[t * E + e] : 1.0f, *o = out + r * C;
            const float *xr = px + t * xs;
            for (int64_t c = 0; c < C; c++) o[c] = s * xr[c];
        }
    free(row);
    return SL_OK;
}

sl_status sl_k_moe_ep_unpack(sl_tensor *n) {
    const sl_tensor *y = n->src[0], *route = n->src[1];
    int64_t N = n->ne[0], C = n->ne[1], E = route->ne[1], ys = y->nb[0], *row;
    SL_TRY(pairs_for(route, y->ne[0], "moe_ep_unpack", &row));
    const float *pw = route->data, *py = y->data;
    float *out = n->data;
    int w = n->iparams[1];
#pragma omp parallel for schedule(static) if (PAR(N * C))
    for (int64_t t = 0; t < N; t++) {
        float *o = out + t * C;
        memset(o, 0, sizeof(float) * (size_t)C);
        for (int64_t e = 0; e < E; e++) { /* expert order, as the single process's combine chain */
            int64_t r = row[t * E + e];
            if (r < 0) continue;
            float s = w ? pw[t * E + e] : 1.0f;
            const float *yr = py + r * ys;
            for (int64_t c = 0; c < C; c++) o[c] += s * yr[c];
        }
    }
    free(row);
    return SL_OK;
}

sl_status sl_k_moe_ep_unpack_back_gate(sl_tensor *n) {
    const sl_tensor *y = n->src[0], *route = n->src[1], *dy = n->src[2];
    int64_t N = n->ne[0], E = n->ne[1], C = y->ne[1], ys = y->nb[0], ds = dy->nb[0], *row;
    SL_TRY(pairs_for(route, y->ne[0], "moe_ep_unpack_back_gate", &row));
    const float *py = y->data, *pd = dy->data;
    float *out = n->data;
#pragma omp parallel for schedule(static) if (PAR(N * C))
    for (int64_t t = 0; t < N; t++)
        for (int64_t e = 0; e < E; e++) {
            int64_t r = row[t * E + e];
            float dot = 0;
            if (r >= 0) {
                const float *yr = py + r * ys, *d = pd + t * ds;
                for (int64_t c = 0; c < C; c++) dot += yr[c] * d[c];
            }
            out[t * E + e] = dot;
        }
    free(row);
    return SL_OK;
}

/* the segments of local expert l in the received rows: from source p, cnt[p] rows at off[p] (sel > 0: only
 * source sel - 1's, the others' cnt 0); returns the total, or -1 when the counts are not whole numbers within
 * [0, rows] (a corrupt exchange) */
static int64_t segments(const sl_tensor *rcnt, int El, int l, int sel, int64_t rows, int64_t *off,
                        int64_t *cnt) {
    const float *rc = rcnt->data;
    int64_t E = rcnt->ne[0], P = E / El, base = 0, tot = 0;
    for (int64_t p = 0; p < P; p++) {
        int64_t o = base;
        for (int64_t j = 0; j < El; j++) {
            float v = rc[p * El + j];
            if (!(v >= 0 && v <= (float)rows) || v != (float)(int64_t)v) return -1;
            if (j < l) o += (int64_t)v;
            base += (int64_t)v;
        }
        off[p] = o;
        cnt[p] = sel > 0 && p != sel - 1 ? 0 : (int64_t)rc[p * El + l];
        tot += cnt[p];
    }
    return base > rows ? -1 : tot;
}

static sl_status expert_segments(const sl_tensor *n, const sl_tensor *rcnt, int64_t rows, int64_t lrows,
                                 const char *op, int64_t **off, int64_t **cnt, int64_t *tot) {
    int El = n->iparams[1], l = n->iparams[0];
    int64_t P = rcnt->ne[0] / El;
    *off = malloc(sizeof(int64_t) * (size_t)(2 * P));
    if (!*off) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", op);
    *cnt = *off + P;
    *tot = segments(rcnt, El, l, n->iparams[3], rows, *off, *cnt);
    if (*tot < 0 || *tot > lrows) {
        free(*off);
        return sl_fail(SL_ERR_INVALID, "%s: the exchanged token counts of local expert %d are invalid", op,
                       l);
    }
    return SL_OK;
}

sl_status sl_k_moe_ep_gather(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *rcnt = n->src[1];
    int64_t Rl = n->ne[0], C = n->ne[1], xs = x->nb[0], *off, *cnt, tot;
    SL_TRY(expert_segments(n, rcnt, x->ne[0], Rl, "moe_ep_gather", &off, &cnt, &tot));
    int64_t P = rcnt->ne[0] / n->iparams[1], r = 0;
    float *out = n->data;
    for (int64_t p = 0; p < P; p++)
        for (int64_t i = 0; i < cnt[p]; i++, r++)
            memcpy(out + r * C, (const float *)x->data + (off[p] + i) * xs, sizeof(float) * (size_t)C);
    if (!n->iparams[2]) memset(out + tot * C, 0, sizeof(float) * (size_t)((Rl - tot) * C));
    free(off);
    return SL_OK;
}

sl_status sl_k_moe_ep_scatter(sl_tensor *n) {
    const sl_tensor *y = n->src[0], *rcnt = n->src[1], *acc = n->src[2];
    int64_t Rx = n->ne[0], C = n->ne[1], ys = y->nb[0], *off, *cnt, tot;
    SL_TRY(expert_segments(n, rcnt, Rx, y->ne[0], "moe_ep_scatter", &off, &cnt, &tot));
    int64_t P = rcnt->ne[0] / n->iparams[1], r = 0;
    float *out = n->data;
    if (acc)
        memcpy(out, acc->data, sizeof(float) * (size_t)(Rx * C));
    else
        memset(out, 0, sizeof(float) * (size_t)(Rx * C));
    for (int64_t p = 0; p < P; p++)
        for (int64_t i = 0; i < cnt[p]; i++, r++)
            memcpy(out + (off[p] + i) * C, (const float *)y->data + r * ys, sizeof(float) * (size_t)C);
    free(off);
    return SL_OK;
}

int64_t sl_k_moe_ep_expert_count(const sl_tensor *rcnt, int El, int l, int64_t rows) {
    const float *rc = rcnt->data;
    int64_t P = rcnt->ne[0] / El, tot = 0;
    for (int64_t p = 0; p < P; p++) {
        float v = rc[p * El + l];
        if (!(v >= 0 && v <= (float)rows) || v != (float)(int64_t)v) return -1;
        tot += (int64_t)v;
    }
    return tot;
}
