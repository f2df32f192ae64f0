/* AdamW, gradient clipping and the LR schedule over the model's flat buffers. The arithmetic is the
 * backend's (sl_backend_adamw / sumsq / scale: the CPU's SIMD bodies live in
 * src/device/cpu/kernels/optim.c); this file owns the state and the order of the steps. */
#include <math.h>
#include <string.h>

#include "suanli/nn.h"

sl_status sl_adamw_init(sl_adamw *o, const sl_model *m, sl_adamw_hparams hp) {
    memset(o, 0, sizeof *o);
    o->hp = hp;
    o->numel = m->numel;
    size_t bytes = sizeof(float) * (size_t)m->numel;
    sl_status st = sl_backend_alloc(m->backend, bytes, &o->m);
    if (st == SL_OK) st = sl_backend_alloc(m->backend, bytes, &o->v); /* buffers come zero-filled */
    o->spans = calloc((size_t)(m->n_params ? m->n_params : 1), sizeof(sl_adamw_span));
    if (st != SL_OK || !o->spans) {
        sl_adamw_free(o);
        return sl_fail(SL_ERR_NOMEM, "adamw: cannot allocate moments for %lld parameters on %s",
                       (long long)m->numel, m->backend->name);
    }
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *pi = &m->params[i];
        if (pi->t->dtype != SL_F32) continue;
        o->spans[o->n_spans++] = (sl_adamw_span){pi->offset, pi->offset, pi->offset, pi->numel, pi->decay};
    }
    o->backend = m->backend;
    return SL_OK;
}

void sl_adamw_free(sl_adamw *o) {
    if (o->backend) {
        sl_backend_free(o->backend, o->m);
        sl_backend_free(o->backend, o->v);
    }
    free(o->spans);
    o->m = o->v = NULL;
    o->spans = NULL;
}

sl_status sl_adamw_step_scaled(sl_adamw *o, sl_model *m, float lr, float gscale) {
    if (!m->grads_buf) return sl_fail(SL_ERR_INVALID, "adamw: the model has no gradients (inference model)");
    o->t++;
    sl_adamw_call c = {.p = m->params_buf,
                       .g = m->grads_buf,
                       .m = o->m,
                       .v = o->v,
                       .spans = o->spans,
                       .n_spans = o->n_spans,
                       .lr = lr,
                       .gscale = gscale,
                       .hp = o->hp,
                       .t = o->t};
    return sl_backend_adamw(m->backend, &c);
}

sl_status sl_adamw_step(sl_adamw *o, sl_model *m, float lr) { return sl_adamw_step_scaled(o, m, lr, 1.0f); }

sl_status sl_grad_norm(const sl_model *m, float *norm) {
    if (!m->grads_buf) return sl_fail(SL_ERR_INVALID, "grad norm: the model has no gradients");
    double ss = 0;
    SL_TRY(sl_backend_sumsq(m->backend, m->grads_buf, 0, m->numel, &ss));
    *norm = (float)sqrt(ss);
    return SL_OK;
}

float sl_clip_coef(float norm, float max_norm) {
    if (max_norm <= 0) return 1.0f;
    float coef = max_norm / (norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}

sl_status sl_clip_grad_norm(sl_model *m, float max_norm, float *norm) {
    SL_TRY(sl_grad_norm(m, norm));
    float coef = sl_clip_coef(*norm, max_norm);
    if (coef < 1.0f) SL_TRY(sl_backend_scale(m->backend, m->grads_buf, 0, m->numel, coef));
    return SL_OK;
}

float sl_lr_schedule(int64_t it, float lr, float min_lr, int64_t warmup, int64_t decay_iters) {
    if (warmup > 0 && it < warmup) return lr * (float)(it + 1) / (float)warmup;
    if (it >= decay_iters) return min_lr;
    double ratio = (double)(it - warmup) / (double)(decay_iters - warmup);
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    return (float)(min_lr + coeff * (lr - min_lr));
}
