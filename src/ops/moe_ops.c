/* Mixture-of-experts ops: routing (softmax / sigmoid scores, top-k, group-limited top-k, capacity), the
 * router's auxiliary losses, and token dispatch (gather) / combine, with their backward rules.
 *
 * Note [MoE dispatch in a static graph]
 * The graph is static, so every tensor has a shape fixed at build time while the number of tokens an
 * expert receives changes every step. A layer is built as
 *   w   = MOE_ROUTE(logits)                  (N, E) dense routing weights, zero off each token's top-k
 *   x_e = MOE_GATHER(h, w, e)                (R, C) the tokens expert e keeps, in token order
 *   y_e = SwiGLU_e(x_e)                      ordinary matmul / silu / mul nodes on R rows
 *   y   = MOE_COMBINE(y_e, w, y_{<e}, e)     (N, C) y_{<e} + w[:, e] * y_e scattered back
 * R is the capacity (ceil(capacity_factor * N * k / E)) when tokens are dropped, so the experts run on
 * E * R ~ capacity_factor * N * k rows as in Switch / Megatron; dropless routing needs R = N (an expert
 * may receive every token). With matmul nodes the expert GEMMs would then run on N rows each, padding
 * included; MOE_EXPERT_FFN (f32) runs them on the expert's kept rows only, the count read from the route
 * at run time (Note [Routed expert rows]), so FLOPs follow the routed tokens. The (N, C) combine
 * accumulator is still copied once per expert (O(N * C * E) bytes moved).
 * Dropping is deterministic: an expert keeps its first `capacity` tokens in token order (Switch's and
 * Megatron's "position" policy); a dropped assignment keeps its place in the top-k normalisation and
 * gets weight 0 (the token passes through the residual). The token -> row map is recomputed by the
 * kernels from the route node's mask (a prefix count over column e), so no index tensor exists.
 * Gradients: the selection is piecewise constant, so routing weights get gradients only through the
 * selected scores (MOE_ROUTE_BACK); gather / combine are linear in x / y (each other's adjoint) and
 * combine is bilinear in the weights (MOE_COMBINE_BACK_GATE). */
#include <string.h>

#include "ops/ops_internal.h"

static int row_major_2d(const sl_tensor *t) { return t->ndim == 2 && t->nb[1] == 1 && t->dtype == SL_F32; }

sl_tensor *sl_moe_route(sl_ctx *ctx, sl_tensor *logits, sl_tensor *bias, const sl_moe_route_opts *o) {
    SL_ASSERT(row_major_2d(logits));
    int64_t N = logits->ne[0], E = logits->ne[1];
    SL_ASSERT(o->k >= 1 && o->k <= E && o->capacity >= 0);
    SL_ASSERT(!bias ||
              (bias->ndim == 1 && bias->ne[0] == E && bias->dtype == SL_F32 && sl_is_contiguous(bias)));
    int ng = o->n_group > 1 ? o->n_group : 1;
    SL_ASSERT(E % ng == 0 && (ng == 1 || (o->topk_group >= 1 && o->topk_group <= ng)));
    SL_ASSERT(ng == 1 || E / ng >= 2); /* group score: the sum of each group's top two */
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_ROUTE, SL_F32, 2, logits->ne);
    t->src[0] = logits;
    t->src[1] = bias;
    t->iparams[0] = o->k;
    t->iparams[1] = (int)o->score;
    t->iparams[2] = o->norm_topk;
    t->iparams[3] = ng;
    t->iparams[4] = ng > 1 ? o->topk_group : 1;
    t->iparams[5] = o->capacity;
    t->fparams[0] = o->scale > 0 ? o->scale : 1.0f;
    t->aux_bytes = sizeof(float) * (size_t)(2 * N * E + 2 * E);
    return t;
}

size_t sl_moe_route_counts_offset(const sl_tensor *route) {
    SL_ASSERT(route->op == SL_OP_MOE_ROUTE);
    return sizeof(float) * (size_t)(3 * route->ne[0] * route->ne[1]);
}

sl_tensor *sl_moe_router_loss(sl_ctx *ctx, sl_tensor *logits, sl_tensor *route, float aux_coeff,
                              float z_coeff) {
    SL_ASSERT(row_major_2d(logits) && route->op == SL_OP_MOE_ROUTE && sl_same_shape(logits, route));
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_ROUTER_LOSS, SL_F32, 1, (int64_t[]){1});
    t->src[0] = logits;
    t->src[1] = route;
    t->fparams[0] = aux_coeff;
    t->fparams[1] = z_coeff;
    t->aux_bytes = 2 * sizeof(float);
    return t;
}

sl_tensor *sl_moe_gather(sl_ctx *ctx, sl_tensor *x, sl_tensor *route, int e, int64_t R, int weighted) {
    SL_ASSERT(row_major_2d(x) && route->op == SL_OP_MOE_ROUTE && x->ne[0] == route->ne[0]);
    SL_ASSERT(e >= 0 && e < route->ne[1] && R >= 1);
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_GATHER, SL_F32, 2, (int64_t[]){R, x->ne[1]});
    t->src[0] = x;
    t->src[1] = route;
    t->iparams[0] = e;
    t->iparams[1] = weighted;
    return t;
}

sl_tensor *sl_moe_combine(sl_ctx *ctx, sl_tensor *y, sl_tensor *route, sl_tensor *acc, int e, int weighted) {
    SL_ASSERT(row_major_2d(y) && route->op == SL_OP_MOE_ROUTE && e >= 0 && e < route->ne[1]);
    int64_t N = route->ne[0], C = y->ne[1];
    SL_ASSERT(!acc || (row_major_2d(acc) && acc->ne[0] == N && acc->ne[1] == C));
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_COMBINE, SL_F32, 2, (int64_t[]){N, C});
    t->src[0] = y;
    t->src[1] = route;
    t->src[2] = acc;
    t->iparams[0] = e;
    t->iparams[1] = weighted;
    return t;
}

sl_tensor *sl_moe_expert_ffn_node(sl_ctx *ctx, sl_tensor *x, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                                  sl_tensor *count_src, int e, int El) {
    SL_ASSERT(row_major_2d(x) && sl_is_contiguous(x) && e >= 0);
    int64_t R = x->ne[0], C = x->ne[1], I = w1->ne[0];
    SL_ASSERT(w1->dtype == SL_F32 && w3->dtype == SL_F32 && w2->dtype == SL_F32);
    SL_ASSERT(w1->ndim == 2 && w1->ne[1] == C && w3->ndim == 2 && w3->ne[0] == I && w3->ne[1] == C);
    SL_ASSERT(w2->ndim == 2 && w2->ne[0] == C && w2->ne[1] == I);
    SL_ASSERT(sl_is_contiguous(w1) && sl_is_contiguous(w3) && sl_is_contiguous(w2));
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EXPERT_FFN, SL_F32, 2, x->ne);
    t->src[0] = x;
    t->src[1] = w1;
    t->src[2] = w3;
    t->src[3] = w2;
    t->src[4] = count_src;
    t->iparams[0] = e;
    t->iparams[1] = El;
    t->aux_bytes = sizeof(float) * (size_t)(1 + 2 * R * I); /* count, w1 x, w3 x */
    return t;
}

sl_tensor *sl_moe_expert_ffn(sl_ctx *ctx, sl_tensor *x, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                             sl_tensor *route, int e) {
    SL_ASSERT(route->op == SL_OP_MOE_ROUTE && e < route->ne[1]);
    return sl_moe_expert_ffn_node(ctx, x, w1, w3, w2, route, e, 0);
}

static sl_tensor *rows(sl_ctx *ctx, sl_tensor *g) { return row_major_2d(g) ? g : sl_cont(ctx, g); }

/* Backward rules of the MoE ops; returns 0 for other ops. */
int sl_moe_op_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *ng, sl_grad_emit emit, void *st) {
    sl_tensor *a = n->src[0], *route = n->src[1];
    switch (n->op) {
    case SL_OP_MOE_ROUTE: /* no gradient to the selection bias: it only moves the top-k boundary */
        if (ng[0]) {
            sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_ROUTE_BACK, SL_F32, 2, a->ne);
            t->src[0] = n;
            t->src[1] = rows(ctx, g);
            emit(st, a, t);
        }
        return 1;
    case SL_OP_MOE_ROUTER_LOSS: /* the counts are constants (a function of the discrete selection) */
        if (ng[0]) {
            sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_ROUTER_LOSS_BACK, SL_F32, 2, a->ne);
            t->src[0] = n;
            t->src[1] = a;
            t->src[2] = route;
            /* fparams[2] (0: 1): this node's share of the gradient, when several ranks hold the same loss */
            t->src[3] = n->fparams[2] > 0 && n->fparams[2] != 1 ? sl_scale(ctx, g, n->fparams[2]) : g;
            emit(st, a, t);
        }
        return 1;
    case SL_OP_MOE_GATHER: /* the token -> row map is discrete: no gradient to the route (unweighted) */
        SL_ASSERT(!(n->iparams[1] && ng[1]) && "weighted gather exists for backward rules only");
        if (ng[0]) emit(st, a, sl_moe_combine(ctx, rows(ctx, g), route, NULL, n->iparams[0], 0));
        return 1;
    case SL_OP_MOE_COMBINE: {
        int e = n->iparams[0], w = n->iparams[1];
        sl_tensor *gr = rows(ctx, g);
        if (ng[0]) {
            sl_tensor *d = sl_moe_gather(ctx, gr, route, e, a->ne[0], w);
            d->iparams[2] = a->op == SL_OP_MOE_EXPERT_FFN; /* its backward reads the kept rows only */
            emit(st, a, d);
        }
        if (ng[1] && w) {
            sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_COMBINE_BACK_GATE, SL_F32, 2, route->ne);
            t->src[0] = a;
            t->src[1] = route;
            t->src[2] = gr;
            t->iparams[0] = e;
            emit(st, route, t);
        }
        if (n->src[2] && ng[2]) emit(st, n->src[2], g);
        return 1;
    }
    case SL_OP_MOE_EXPERT_FFN: { /* two packed nodes (SL_MAX_SRC): d pre-activations + dw2, then dx + dw1, dw3
                                  */
        sl_tensor *w1 = n->src[1], *w3 = n->src[2], *w2 = n->src[3];
        int64_t R = a->ne[0], C = a->ne[1], I = w1->ne[0];
        sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EXPERT_FFN_BACK, SL_F32, 1, (int64_t[]){2 * R * I + C * I});
        t->src[0] = n;
        t->src[1] = rows(ctx, g);
        t->src[2] = w2;
        if (ng[3]) emit(st, w2, sl_view(ctx, t, 2, (int64_t[]){C, I}, (int64_t[]){I, 1}, 2 * R * I));
        if (!ng[0] && !ng[1] && !ng[2]) return 1;
        sl_tensor *u = sl_new_op(ctx, SL_OP_MOE_EXPERT_FFN_BACK_X, SL_F32, 1, (int64_t[]){R * C + 2 * I * C});
        u->src[0] = n;
        u->src[1] = t;
        u->src[2] = a;
        u->src[3] = w1;
        u->src[4] = w3;
        if (ng[0]) emit(st, a, sl_view(ctx, u, 2, (int64_t[]){R, C}, (int64_t[]){C, 1}, 0));
        if (ng[1]) emit(st, w1, sl_view(ctx, u, 2, (int64_t[]){I, C}, (int64_t[]){C, 1}, R * C));
        if (ng[2]) emit(st, w3, sl_view(ctx, u, 2, (int64_t[]){I, C}, (int64_t[]){C, 1}, R * C + I * C));
        return 1;
    }
    default:
        return sl_moe_ep_op_backward(ctx, n, g, ng, emit, st);
    }
}
