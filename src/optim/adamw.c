/* AdamW, gradient clipping and the LR schedule over the flat buffers. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "suanli/nn.h"

sl_status sl_adamw_init(sl_adamw *o, const sl_model *m, sl_adamw_hparams hp) {
    memset(o, 0, sizeof *o);
    o->hp = hp;
    o->numel = m->numel;
    o->m = sl_malloc_aligned(sizeof(float) * (size_t)m->numel);
    o->v = sl_malloc_aligned(sizeof(float) * (size_t)m->numel);
    if (!o->m || !o->v) {
        sl_adamw_free(o);
        return sl_fail(SL_ERR_NOMEM, "adamw: cannot allocate moments for %lld parameters",
                       (long long)m->numel);
    }
    memset(o->m, 0, sizeof(float) * (size_t)m->numel);
    memset(o->v, 0, sizeof(float) * (size_t)m->numel);
    return SL_OK;
}

void sl_adamw_free(sl_adamw *o) {
    sl_free_aligned(o->m);
    sl_free_aligned(o->v);
    o->m = o->v = NULL;
}

/* Note [AdamW order of operations]
 * Mirrors torch.optim.AdamW (single-tensor path) operation by operation so fp32 results agree to
 * rounding: p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = v*b2 + (1-b2)*g*g;
 * p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
 * Every element is computed with IEEE single-precision operations in that order (no FMA contraction),
 * so the SIMD width (SSE2 or AVX2) and the thread partition do not change a single bit. One parallel
 * region covers all parameters: each thread updates a contiguous share of every tensor (no barriers). */
typedef struct {
    float b1, b2, eps, step_size, bc2_sqrt;
} adamw_k;

#define ADAMW_SPAN_BODY                                                                                      \
    for (int64_t k = 0; k < n; k++) {                                                                        \
        float gk = g[k];                                                                                     \
        p[k] *= decay;                                                                                       \
        mm[k] += (1.0f - c.b1) * (gk - mm[k]);                                                               \
        vv[k] = vv[k] * c.b2 + (1.0f - c.b2) * gk * gk;                                                      \
        float denom = sqrtf(vv[k]) / c.bc2_sqrt + c.eps;                                                     \
        p[k] += -c.step_size * (mm[k] / denom);                                                              \
    }

__attribute__((optimize("fp-contract=off"))) static void adamw_span(float *restrict p,
                                                                    const float *restrict g,
                                                                    float *restrict mm, float *restrict vv,
                                                                    int64_t n, float decay, adamw_k c) {
#pragma omp simd
    ADAMW_SPAN_BODY
}

#if defined(__x86_64__)
__attribute__((target("avx2"), optimize("fp-contract=off"))) static void
adamw_span_avx2(float *restrict p, const float *restrict g, float *restrict mm, float *restrict vv, int64_t n,
                float decay, adamw_k c) {
#pragma omp simd
    ADAMW_SPAN_BODY
}
#endif

void sl_adamw_step(sl_adamw *o, sl_model *m, float lr) {
    o->t++;
    const float b1 = o->hp.beta1, b2 = o->hp.beta2, eps = o->hp.eps;
    double bc1 = 1.0 - pow((double)b1, (double)o->t), bc2 = 1.0 - pow((double)b2, (double)o->t);
    adamw_k c = {b1, b2, eps, (float)(lr / bc1), (float)sqrt(bc2)};
    int avx2 = 0;
#if defined(__x86_64__)
    avx2 = sl_cpu_features_get()->avx2;
#endif
#pragma omp parallel
    {
        int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
        for (int i = 0; i < m->n_params; i++) {
            const sl_param_info *pi = &m->params[i];
            float decay = pi->decay ? 1.0f - lr * o->hp.weight_decay : 1.0f;
            int64_t n = pi->numel, a = n * tid / nt, e = n * (tid + 1) / nt, off = pi->offset + a;
            if (e <= a) continue;
#if defined(__x86_64__)
            if (avx2) {
                adamw_span_avx2(m->params_mem + off, m->grads_mem + off, o->m + off, o->v + off, e - a, decay,
                                c);
                continue;
            }
#endif
            adamw_span(m->params_mem + off, m->grads_mem + off, o->m + off, o->v + off, e - a, decay, c);
        }
    }
}

float sl_clip_grad_norm(sl_model *m, float max_norm) {
    /* sum of squares in double, fixed order: deterministic for any thread count */
    double ss = 0;
    const float *g = m->grads_mem;
    int64_t n = m->numel;
    int64_t nchunks = (n + 65535) / 65536;
    double *part = calloc((size_t)(nchunks ? nchunks : 1), sizeof(double));
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t a = c * 65536, b = a + 65536 < n ? a + 65536 : n;
        double s = 0;
        for (int64_t k = a; k < b; k++) s += (double)g[k] * g[k];
        part[c] = s;
    }
    for (int64_t c = 0; c < nchunks; c++) ss += part[c];
    free(part);
    float norm = (float)sqrt(ss);
    if (max_norm > 0) {
        float coef = max_norm / (norm + 1e-6f);
        if (coef < 1.0f) {
            float *gw = m->grads_mem;
#pragma omp parallel for simd schedule(static)
            for (int64_t k = 0; k < n; k++) gw[k] *= coef;
        }
    }
    return norm;
}

float sl_lr_schedule(int64_t it, float lr, float min_lr, int64_t warmup, int64_t decay_iters) {
    if (warmup > 0 && it < warmup) return lr * (float)(it + 1) / (float)warmup;
    if (it >= decay_iters) return min_lr;
    double ratio = (double)(it - warmup) / (double)(decay_iters - warmup);
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    return (float)(min_lr + coeff * (lr - min_lr));
}
