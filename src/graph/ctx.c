/* Tensor metadata arena (sl_ctx) and tensor helpers. Tensors are graph nodes; nothing is computed here. */
#include <stdarg.h>
#include <string.h>

#include "suanli/graph.h"

struct sl_ctx {
    sl_tensor *tensors;
    int n, cap;
};

sl_ctx *sl_ctx_new(int max_tensors) {
    sl_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cap = max_tensors > 0 ? max_tensors : 4096;
    c->tensors = calloc((size_t)c->cap, sizeof(sl_tensor));
    if (!c->tensors) {
        free(c);
        return NULL;
    }
    return c;
}

void sl_ctx_free(sl_ctx *ctx) {
    if (!ctx) return;
    free(ctx->tensors);
    free(ctx);
}

int sl_ctx_count(const sl_ctx *ctx) { return ctx->n; }
sl_tensor *sl_ctx_tensor(sl_ctx *ctx, int i) { return (i >= 0 && i < ctx->n) ? &ctx->tensors[i] : NULL; }

static void set_contiguous_strides(sl_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        t->nb[d] = s;
        s *= t->ne[d];
    }
}

sl_tensor *sl_new_op(sl_ctx *ctx, sl_op op, sl_dtype dt, int ndim, const int64_t *ne) {
    /* The arena is fixed-size so that tensor pointers stay valid; running out is a programmer error
     * (size the ctx for the model). */
    SL_ASSERT(ctx->n < ctx->cap);
    SL_ASSERT(ndim >= 0 && ndim <= SL_MAX_DIMS);
    sl_tensor *t = &ctx->tensors[ctx->n];
    memset(t, 0, sizeof *t);
    t->id = ctx->n++;
    t->order = -1;
    t->op = op;
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        SL_ASSERT(ne[d] >= 0);
        t->ne[d] = ne[d];
    }
    set_contiguous_strides(t);
    return t;
}

sl_tensor *sl_new_tensor(sl_ctx *ctx, sl_dtype t, int ndim, const int64_t *ne) {
    return sl_new_op(ctx, SL_OP_NONE, t, ndim, ne);
}
sl_tensor *sl_new_tensor_1d(sl_ctx *ctx, sl_dtype t, int64_t n0) {
    return sl_new_tensor(ctx, t, 1, (int64_t[]){n0});
}
sl_tensor *sl_new_tensor_2d(sl_ctx *ctx, sl_dtype t, int64_t n0, int64_t n1) {
    return sl_new_tensor(ctx, t, 2, (int64_t[]){n0, n1});
}
sl_tensor *sl_new_tensor_3d(sl_ctx *ctx, sl_dtype t, int64_t n0, int64_t n1, int64_t n2) {
    return sl_new_tensor(ctx, t, 3, (int64_t[]){n0, n1, n2});
}

sl_tensor *sl_set_name(sl_tensor *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    return t;
}

void sl_set_param(sl_tensor *t) { t->flags |= SL_FLAG_PARAM; }
void sl_set_input(sl_tensor *t) { t->flags |= SL_FLAG_INPUT; }
void sl_set_output(sl_tensor *t) { t->flags |= SL_FLAG_OUTPUT; }
void sl_tensor_bind(sl_tensor *t, void *data) {
    SL_ASSERT(t->op == SL_OP_NONE);
    t->data = data;
    t->buffer = NULL; /* external memory: no backend buffer (host-visible backends only) */
    t->buffer_offs = 0;
}
