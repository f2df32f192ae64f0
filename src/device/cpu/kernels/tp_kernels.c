/* Kernels for tensor-parallel graphs (Note [Tensor-parallel graphs], src/ops/build_tp.c): the embedding
 * lookup in a vocab shard and its backward, and the vocab-parallel cross-entropy. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/vec_kernels.h"

/* ids outside the shard [lo, lo + V) give zero rows (another rank's shard holds them) */
sl_status sl_k_embedding_shard(sl_tensor *n) {
    sl_tensor *tab = n->src[0], *ids = n->src[1];
    int64_t V = tab->ne[0], C = tab->ne[1], N = sl_nelements(ids), lo = n->iparams[2];
    const int32_t *pi = ids->data;
    for (int64_t i = 0; i < N; i++)
        if (pi[i] < 0)
            return sl_fail(SL_ERR_INVALID, "embedding: negative token id %d at %lld", pi[i], (long long)i);
    const float *pt = tab->data;
    float *po = n->data;
#pragma omp parallel for schedule(static) if (N * C > 65536)
    for (int64_t i = 0; i < N; i++) {
        int64_t r = (int64_t)pi[i] - lo;
        if (r >= 0 && r < V)
            memcpy(po + i * C, pt + r * C, sizeof(float) * (size_t)C);
        else
            memset(po + i * C, 0, sizeof(float) * (size_t)C);
    }
    return SL_OK;
}

/* dst[id - lo] += dy[i] for the ids in the shard, in position order (the order of the full-table kernel,
 * so each row's sum is bitwise the single-process one); parallel over column blocks */
sl_status sl_k_embedding_back_shard(sl_tensor *n) {
    sl_tensor *ids = n->src[1], *g = n->src[2];
    int64_t V = n->ne[0], C = n->ne[1], N = sl_nelements(ids), lo = n->iparams[2];
    const int32_t *pi = ids->data;
    float *pd = n->data;
    const float *pg = g->data;
    if (n->iparams[1]) memset(pd, 0, sizeof(float) * (size_t)(V * C)); /* a first gradient write */
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        int64_t c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int64_t i = 0; i < N; i++) {
            int64_t r = (int64_t)pi[i] - lo;
            if (r < 0 || r >= V) continue;
            float *d = pd + r * C;
            const float *s = pg + i * C;
            for (int64_t c = c0; c < c1; c++) d[c] += s[c];
        }
    }
    return SL_OK;
}

static void lse_rows(const float *pl, int64_t N, int64_t V, float *lse) {
    const sl_vec_ops *v = sl_vec();
    if (v)
        v->ce_lse(pl, N, V, lse);
    else
        sl_k_lse_rows_ref(pl, N, V, lse);
}

sl_status sl_k_ce_vp_stats(sl_tensor *n) {
    sl_tensor *lg = n->src[0], *tg = n->src[1];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg), lo = n->iparams[0];
    const float *pl = lg->data;
    const int32_t *pt = tg->data;
    float *out = n->data, *lse = malloc(sizeof(float) * (size_t)(N ? N : 1));
    if (!lse) return sl_fail(SL_ERR_NOMEM, "ce_vp_stats: out of memory");
    lse_rows(pl, N, V, lse);
    for (int64_t i = 0; i < N; i++) {
        int64_t j = (int64_t)pt[i] - lo;
        out[2 * i] = lse[i];
        out[2 * i + 1] = pt[i] >= 0 && j >= 0 && j < V ? pl[i * V + j] : 0.0f;
    }
    free(lse);
    return SL_OK;
}

/* The group's stats (P, N, 2) -> the global logsumexp per row (max-shifted, so P = 1 gives the shard's
 * value exactly) and the mean loss, accumulated in double like SL_OP_CROSS_ENTROPY. */
sl_status sl_k_ce_vp(sl_tensor *n) {
    sl_tensor *tg = n->src[1], *st = n->src[2];
    int64_t N = sl_nelements(tg), P = st->ne[0];
    const int32_t *pt = tg->data;
    const float *ps = st->data;
    float *lse = (float *)((char *)n->data + sl_nbytes(n));
    double total = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) {
        float M = -INFINITY, tl = 0;
        for (int64_t r = 0; r < P; r++) {
            float l = ps[(r * N + i) * 2];
            M = l > M ? l : M;
            tl += ps[(r * N + i) * 2 + 1]; /* one rank holds the target; the others add 0 */
        }
        float s = 0;
        for (int64_t r = 0; r < P; r++) s += expf(ps[(r * N + i) * 2] - M);
        lse[i] = M + logf(s);
        if (pt[i] >= 0) {
            total += (double)lse[i] - (double)tl;
            cnt++;
        }
    }
    ((float *)n->data)[0] = cnt ? (float)(total / (double)cnt) : 0.0f;
    return SL_OK;
}

sl_status sl_k_ce_vp_back(sl_tensor *n) {
    sl_tensor *f = n->src[0], *lg = n->src[1], *tg = n->src[2], *dl = n->src[3];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg), lo = n->iparams[0];
    const float *lse = (const float *)((const char *)f->data + sl_nbytes(f));
    const int32_t *pt = tg->data;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) cnt += pt[i] >= 0;
    float scale = cnt ? ((const float *)dl->data)[0] / (float)cnt : 0.0f;
    const sl_vec_ops *v = sl_vec();
    if (v) {
        v->ce_bwd(lg->data, lse, pt, scale, n->data, N, V, lo);
        return SL_OK;
    }
    const float *pl = lg->data;
    float *pd = n->data;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *x = pl + i * V;
        float *d = pd + i * V;
        if (pt[i] < 0) {
            memset(d, 0, sizeof(float) * (size_t)V);
            continue;
        }
        for (int64_t j = 0; j < V; j++) d[j] = expf(x[j] - lse[i]) * scale;
        int64_t j = (int64_t)pt[i] - lo;
        if (j >= 0 && j < V) d[j] -= scale;
    }
    return SL_OK;
}
