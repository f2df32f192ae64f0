/* Embedding lookup (and its accumulating backward) and cross-entropy over logits.
 * *_ref: scalar reference kernels; sl_k_*: SIMD bodies from vec_kernels.inc when an ISA allows. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/vec_kernels.h"

sl_status sl_k_embedding(sl_tensor *n) {
    if (n->iparams[3]) return sl_k_embedding_shard(n);
    sl_tensor *tab = n->src[0], *ids = n->src[1];
    int64_t V = tab->ne[0], C = tab->ne[1], N = sl_nelements(ids);
    const int32_t *pi = ids->data;
    for (int64_t i = 0; i < N; i++)
        if (pi[i] < 0 || pi[i] >= V)
            return sl_fail(SL_ERR_INVALID, "embedding: token id %d at position %lld out of range [0, %lld)",
                           pi[i], (long long)i, (long long)V);
    const float *pt = tab->data;
    float *po = n->data;
#pragma omp parallel for schedule(static) if (N * C > 65536)
    for (int64_t i = 0; i < N; i++) memcpy(po + i * C, pt + (int64_t)pi[i] * C, sizeof(float) * (size_t)C);
    return SL_OK;
}

/* In place: dst[id] += dy[i] for every position. Parallel over column blocks so rows with the same id
 * never race and the summation order is fixed. */
static void zero_table(float *d, int64_t m) {
    const int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static) if (m > chunk)
    for (int64_t a = 0; a < m; a += chunk)
        memset(d + a, 0, sizeof(float) * (size_t)(m - a < chunk ? m - a : chunk));
}

sl_status sl_k_embedding_back_ref(sl_tensor *n) {
    if (n->iparams[3]) return sl_k_embedding_back_shard(n);
    sl_tensor *ids = n->src[1], *g = n->src[2];
    int64_t V = n->ne[0], C = n->ne[1], N = sl_nelements(ids);
    const int32_t *pi = ids->data;
    for (int64_t i = 0; i < N; i++)
        if (pi[i] < 0 || pi[i] >= V)
            return sl_fail(SL_ERR_INVALID, "embedding_back: token id %d out of range", pi[i]);
    if (n->iparams[1]) zero_table(n->data, V * C); /* Note [Overwriting first gradient writes] */
    const float *pg = g->data;
    float *pd = n->data;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        int64_t c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int64_t i = 0; i < N; i++) {
            float *d = pd + (int64_t)pi[i] * C;
            const float *s = pg + i * C;
            for (int64_t c = c0; c < c1; c++) d[c] += s[c];
        }
    }
    return SL_OK;
}

void sl_k_lse_rows_ref(const float *pl, int64_t N, int64_t V, float *lse) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *x = pl + i * V;
        float mx = -INFINITY;
        for (int64_t j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        float s = 0;
        for (int64_t j = 0; j < V; j++) s += expf(x[j] - mx);
        lse[i] = mx + logf(s);
    }
}

/* Mean over positions whose target >= 0 (negative targets are ignored, like PyTorch's ignore_index). */
sl_status sl_k_cross_entropy_ref(sl_tensor *n) {
    sl_tensor *lg = n->src[0], *tg = n->src[1];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    const float *pl = lg->data;
    const int32_t *pt = tg->data;
    float *lse = (float *)((char *)n->data + sl_nbytes(n));
    for (int64_t i = 0; i < N; i++)
        if (pt[i] >= V)
            return sl_fail(SL_ERR_INVALID, "cross_entropy: target %d at position %lld >= vocab %lld", pt[i],
                           (long long)i, (long long)V);
    sl_k_lse_rows_ref(pl, N, V, lse);
    double total = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++)
        if (pt[i] >= 0) {
            total += (double)lse[i] - (double)pl[i * V + pt[i]];
            cnt++;
        }
    ((float *)n->data)[0] = cnt ? (float)(total / (double)cnt) : 0.0f;
    return SL_OK;
}

sl_status sl_k_cross_entropy_back_ref(sl_tensor *n) {
    sl_tensor *f = n->src[0], *lg = n->src[1], *tg = n->src[2], *dl = n->src[3];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    const float *lse = (const float *)((const char *)f->data + sl_nbytes(f));
    const float *pl = lg->data;
    const int32_t *pt = tg->data;
    float *pd = n->data;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) cnt += pt[i] >= 0;
    float scale = cnt ? ((const float *)dl->data)[0] / (float)cnt : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *x = pl + i * V;
        float *d = pd + i * V;
        if (pt[i] < 0) {
            memset(d, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float l = lse[i];
        for (int64_t j = 0; j < V; j++) d[j] = expf(x[j] - l) * scale;
        d[pt[i]] -= scale;
    }
    return SL_OK;
}

sl_status sl_k_embedding_back(sl_tensor *n) {
    if (n->iparams[3]) return sl_k_embedding_back_shard(n);
    const sl_vec_ops *v = sl_vec();
    if (!v) return sl_k_embedding_back_ref(n);
    sl_tensor *ids = n->src[1], *g = n->src[2];
    int64_t V = n->ne[0], C = n->ne[1], N = sl_nelements(ids);
    const int32_t *pi = ids->data;
    for (int64_t i = 0; i < N; i++)
        if (pi[i] < 0 || pi[i] >= V)
            return sl_fail(SL_ERR_INVALID, "embedding_back: token id %d out of range", pi[i]);
    if (n->iparams[1]) zero_table(n->data, V * C); /* Note [Overwriting first gradient writes] */
    v->embedding_bwd(pi, N, g->data, n->data, C);
    return SL_OK;
}

sl_status sl_k_cross_entropy(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    if (!v) return sl_k_cross_entropy_ref(n);
    sl_tensor *lg = n->src[0], *tg = n->src[1];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    const float *pl = lg->data;
    const int32_t *pt = tg->data;
    float *lse = (float *)((char *)n->data + sl_nbytes(n));
    for (int64_t i = 0; i < N; i++)
        if (pt[i] >= V)
            return sl_fail(SL_ERR_INVALID, "cross_entropy: target %d at position %lld >= vocab %lld", pt[i],
                           (long long)i, (long long)V);
    v->ce_lse(pl, N, V, lse);
    double total = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++)
        if (pt[i] >= 0) {
            total += (double)lse[i] - (double)pl[i * V + pt[i]];
            cnt++;
        }
    ((float *)n->data)[0] = cnt ? (float)(total / (double)cnt) : 0.0f;
    return SL_OK;
}

sl_status sl_k_cross_entropy_back(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    if (!v) return sl_k_cross_entropy_back_ref(n);
    sl_tensor *f = n->src[0], *lg = n->src[1], *tg = n->src[2], *dl = n->src[3];
    int64_t V = lg->ne[lg->ndim - 1], N = sl_nelements(tg);
    const float *lse = (const float *)((const char *)f->data + sl_nbytes(f));
    const int32_t *pt = tg->data;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) cnt += pt[i] >= 0;
    float scale = cnt ? ((const float *)dl->data)[0] / (float)cnt : 0.0f;
    v->ce_bwd(lg->data, lse, pt, scale, n->data, N, V, 0);
    return SL_OK;
}
