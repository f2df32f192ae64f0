#include "gradcheck.h"

#include <string.h>

#include "testutil.h"

static uint64_t g_key = 7, g_seed = 1;

void gc_set_key(uint64_t key) { g_key = key; }

sl_tensor *param(tc *t, int ndim, const int64_t *ne, float scale) {
    sl_tensor *p = sl_new_tensor(t->ctx, SL_F32, ndim, ne);
    sl_set_param(p);
    sl_set_name(p, "p%d", t->np);
    int64_t n = sl_nelements(p);
    float *d = calloc((size_t)n, 4), *g = calloc((size_t)n, 4);
    sl_rng_fill_normal(d, n, g_key, g_seed++, 0.0f, scale);
    sl_tensor_bind(p, d);
    p->grad = sl_new_tensor(t->ctx, SL_F32, ndim, ne);
    p->grad->flags |= SL_FLAG_GRAD;
    sl_tensor_bind(p->grad, g);
    t->params[t->np] = p;
    t->pdata[t->np] = d;
    t->gdata[t->np] = g;
    t->np++;
    return p;
}

void tc_free(tc *t) {
    for (int i = 0; i < t->np; i++) free(t->pdata[i]), free(t->gdata[i]);
    sl_ctx_free(t->ctx);
}

float *fwd(tc *t, sl_tensor *out) {
    sl_graph *g = sl_graph_new(t->ctx);
    sl_graph_build_forward(g, out);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute: %s", sl_errmsg());
    int64_t n = sl_nelements(out);
    float *r = malloc(sizeof(float) * (size_t)n);
    memcpy(r, out->data, sizeof(float) * (size_t)n);
    sl_graph_free(g);
    return r;
}

void grad_check(const char *name, build_fn fn) {
    tc t = {0};
    t.ctx = sl_ctx_new(4096);
    sl_tensor *out = fn(&t);
    int64_t n = sl_nelements(out);
    sl_tensor *R = sl_new_tensor(t.ctx, SL_F32, out->ndim, out->ne);
    float *rd = malloc(sizeof(float) * (size_t)n);
    sl_rng_fill_normal(rd, n, 9, 99, 0.0f, 1.0f);
    sl_tensor_bind(R, rd);
    sl_tensor *o = out->op == SL_OP_VIEW && !sl_is_contiguous(out) ? sl_cont(t.ctx, out) : out;
    sl_tensor *loss = sl_sum_to(t.ctx, sl_mul(t.ctx, o, R), sl_new_tensor_1d(t.ctx, SL_F32, 1));
    sl_graph *gf = sl_graph_new(t.ctx), *g = sl_graph_new(t.ctx); /* gf: forward only, for FD */
    sl_graph_build_forward(gf, loss);
    sl_graph_build_forward(g, loss);
    sl_graph_build_backward(g, loss, 1.0f);
    sl_plan_stats ps;
    TU_CHECK(sl_graph_plan(gf, sl_backend_cpu(), NULL) == SL_OK, "plan");
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), &ps) == SL_OK, "plan");
    TU_CHECK(ps.planned_bytes <= ps.naive_bytes, "planner never worse than naive");
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute: %s", sl_errmsg());
    for (int i = 0; i < t.np; i++) {
        int64_t m = sl_nelements(t.params[i]), step = m > 60 ? m / 37 + 1 : 1, k = 0;
        float *p = t.pdata[i], *gs = calloc((size_t)m, 4), *fs = calloc((size_t)m, 4);
        for (int64_t j = 0; j < m; j += step) {
            float old = p[j], h = 1e-2f * (fabsf(old) > 1 ? fabsf(old) : 1.0f);
            p[j] = old + h;
            sl_graph_compute(gf, NULL, NULL);
            double lp = ((float *)loss->data)[0];
            p[j] = old - h;
            sl_graph_compute(gf, NULL, NULL);
            double lm = ((float *)loss->data)[0];
            p[j] = old;
            fs[k] = (float)((lp - lm) / (2.0 * h));
            gs[k++] = t.gdata[i][j];
        }
        double rel = tu_rel_maxdiff(gs, fs, k);
        TU_CHECK(rel < 5e-3, "%s grad of param %d: max|analytic-FD|/max|FD| = %.3g", name, i, rel);
        free(gs), free(fs);
    }
    sl_graph_free(g);
    sl_graph_free(gf);
    free(rd);
    tc_free(&t);
}
