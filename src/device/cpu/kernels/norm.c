/* LayerNorm (forward saves mean and rstd in the node's aux area) and softmax over the last dim.
 * *_ref: scalar reference kernels; sl_k_*: SIMD bodies from vec_kernels.inc when an ISA allows. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/vec_kernels.h"

static int64_t rows_of(const sl_tensor *t) { return sl_nelements(t) / t->ne[t->ndim - 1]; }
/* row r of a tensor whose last dim is contiguous and whose leading dims fold uniformly */
static int64_t row_stride(const sl_tensor *t) { return t->ndim >= 2 ? t->nb[t->ndim - 2] : t->ne[0]; }

sl_status sl_k_layernorm_ref(sl_tensor *n) {
    sl_tensor *x = n->src[0], *w = n->src[1], *b = n->src[2];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x), xs = row_stride(x);
    float eps = n->fparams[0];
    const float *px = x->data, *pw = w->data, *pb = b->data;
    float *py = n->data;
    uint16_t *pyh = n->dtype == SL_BF16 ? n->data : NULL; /* Note [Half outputs] (src/graph/fuse.c) */
    float *mean = (float *)((char *)n->data + sl_nbytes(n)), *rstd = mean + R;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = px + r * xs;
        float *yr = py + r * C;
        uint16_t *yh = pyh ? pyh + r * C : NULL;
        float m = 0;
#pragma omp simd reduction(+ : m)
        for (int64_t c = 0; c < C; c++) m += xr[c];
        m /= (float)C;
        float v = 0;
#pragma omp simd reduction(+ : v)
        for (int64_t c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= (float)C;
        float rs = 1.0f / sqrtf(v + eps);
        if (yh)
            for (int64_t c = 0; c < C; c++) yh[c] = sl_f32_to_bf16((xr[c] - m) * rs * pw[c] + pb[c]);
        else
#pragma omp simd
            for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs * pw[c] + pb[c];
        mean[r] = m;
        rstd[r] = rs;
    }
    return SL_OK;
}

sl_status sl_k_layernorm_back_x_ref(sl_tensor *n) {
    sl_tensor *f = n->src[0], *x = n->src[1], *w = n->src[2], *g = n->src[3];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x), xs = row_stride(x), gs = row_stride(g);
    const float *mean = (const float *)((const char *)f->data + sl_nbytes(f)), *rstd = mean + R;
    const float *px = x->data, *pw = w->data, *pg = g->data;
    float *pdx = n->data;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = px + r * xs, *gr = pg + r * gs;
        float *dx = pdx + r * C;
        float m = mean[r], rs = rstd[r];
        float s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
        for (int64_t c = 0; c < C; c++) {
            float dxh = gr[c] * pw[c];
            s1 += dxh;
            s2 += dxh * (xr[c] - m) * rs;
        }
        s1 /= (float)C;
        s2 /= (float)C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) {
            float xh = (xr[c] - m) * rs;
            dx[c] = rs * (gr[c] * pw[c] - s1 - xh * s2);
        }
    }
    return SL_OK;
}

sl_status sl_k_layernorm_back_wb_ref(sl_tensor *n) {
    sl_tensor *f = n->src[0], *x = n->src[1], *g = n->src[2];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x), xs = row_stride(x), gs = row_stride(g);
    const float *mean = (const float *)((const char *)f->data + sl_nbytes(f)), *rstd = mean + R;
    const float *px = x->data, *pg = g->data;
    float *dw = n->data, *db = dw + C;
    /* parallel over column blocks; each column sums its rows in order: deterministic for any thread count */
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        int64_t c1 = c0 + 64 < C ? c0 + 64 : C;
        float aw[64] = {0}, ab[64] = {0};
        for (int64_t r = 0; r < R; r++) {
            const float *xr = px + r * xs, *gr = pg + r * gs;
            float m = mean[r], rs = rstd[r];
            for (int64_t c = c0; c < c1; c++) {
                aw[c - c0] += gr[c] * (xr[c] - m) * rs;
                ab[c - c0] += gr[c];
            }
        }
        for (int64_t c = c0; c < c1; c++) {
            dw[c] = aw[c - c0];
            db[c] = ab[c - c0];
        }
    }
    return SL_OK;
}

sl_status sl_k_softmax_ref(sl_tensor *n) {
    sl_tensor *a = n->src[0];
    int64_t C = a->ne[a->ndim - 1], R = rows_of(a), as = row_stride(a);
    if (a->nb[a->ndim - 1] != 1) return sl_fail(SL_ERR_UNSUPPORTED, "softmax: last dim not contiguous");
    const float *px = a->data;
    float *py = n->data;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *x = px + r * as;
        float *y = py + r * C;
        float mx = -INFINITY;
        for (int64_t c = 0; c < C; c++) mx = x[c] > mx ? x[c] : mx;
        float s = 0;
        for (int64_t c = 0; c < C; c++) {
            y[c] = expf(x[c] - mx);
            s += y[c];
        }
        float inv = 1.0f / s;
        for (int64_t c = 0; c < C; c++) y[c] *= inv;
    }
    return SL_OK;
}

sl_status sl_k_softmax_back_ref(sl_tensor *n) {
    sl_tensor *y = n->src[0], *g = n->src[1];
    int64_t C = y->ne[y->ndim - 1], R = rows_of(y), gs = row_stride(g);
    const float *py = y->data, *pg = g->data;
    float *pdx = n->data;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *yr = py + r * C, *gr = pg + r * gs;
        float *dx = pdx + r * C;
        float dot = 0;
        for (int64_t c = 0; c < C; c++) dot += yr[c] * gr[c];
        for (int64_t c = 0; c < C; c++) dx[c] = yr[c] * (gr[c] - dot);
    }
    return SL_OK;
}

sl_status sl_k_layernorm(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    if (!v) return sl_k_layernorm_ref(n);
    sl_tensor *x = n->src[0], *w = n->src[1], *b = n->src[2];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    float *mean = (float *)((char *)n->data + sl_nbytes(n));
    v->layernorm_fwd(x->data, row_stride(x), w->data, b->data, n->data, n->dtype == SL_BF16 ? n->data : NULL,
                     mean, mean + R, R, C, n->fparams[0]);
    return SL_OK;
}

sl_status sl_k_layernorm_back_x(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    if (!v) return sl_k_layernorm_back_x_ref(n);
    sl_tensor *f = n->src[0], *x = n->src[1], *w = n->src[2], *g = n->src[3];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    const float *mean = (const float *)((const char *)f->data + sl_nbytes(f));
    v->layernorm_bwd_x(x->data, row_stride(x), g->data, row_stride(g), w->data, mean, mean + R, n->data, R,
                       C);
    return SL_OK;
}

sl_status sl_k_layernorm_back_wb(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    if (!v) return sl_k_layernorm_back_wb_ref(n);
    sl_tensor *f = n->src[0], *x = n->src[1], *g = n->src[2];
    int64_t C = x->ne[x->ndim - 1], R = rows_of(x);
    const float *mean = (const float *)((const char *)f->data + sl_nbytes(f));
    float *dw = n->data;
    v->layernorm_bwd_wb(x->data, row_stride(x), g->data, row_stride(g), mean, mean + R, dw, dw + C, R, C);
    return SL_OK;
}

sl_status sl_k_softmax(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    sl_tensor *a = n->src[0];
    if (!v || a->nb[a->ndim - 1] != 1) return sl_k_softmax_ref(n);
    v->softmax_fwd(a->data, row_stride(a), n->data, rows_of(a), a->ne[a->ndim - 1]);
    return SL_OK;
}

sl_status sl_k_softmax_back(sl_tensor *n) {
    const sl_vec_ops *v = sl_vec();
    sl_tensor *y = n->src[0], *g = n->src[1];
    if (!v || g->nb[g->ndim - 1] != 1) return sl_k_softmax_back_ref(n);
    v->softmax_bwd(y->data, g->data, row_stride(g), n->data, rows_of(y), y->ne[y->ndim - 1]);
    return SL_OK;
}
