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

sl_tensor *sl_moe_route_block_counts(sl_ctx *ctx, sl_tensor *route, int64_t B) {
    SL_ASSERT(route->op == SL_OP_MOE_ROUTE && route->iparams[5] == 0 && B >= 1 && route->ne[0] % B == 0);
    SL_ASSERT(B <= INT32_MAX);
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EP_COUNTS, SL_F32, 1, (int64_t[]){B * route->ne[1]});
    t->src[0] = route;
    t->iparams[0] = (int)B;
    return t;
}

void sl_moe_route_shard(sl_tensor *route, sl_tensor *counts, int shard, int64_t B) {
    int64_t E = route->ne[1];
    SL_ASSERT(route->op == SL_OP_MOE_ROUTE && route->iparams[5] > 0 && B >= 1 && route->ne[0] % B == 0);
    SL_ASSERT(counts->dtype == SL_F32 && sl_is_contiguous(counts) && sl_nelements(counts) % (B * E) == 0);
    SL_ASSERT(shard >= 0 && shard < sl_nelements(counts) / (B * E));
    route->src[2] = counts;
    route->iparams[SL_MOE_ROUTE_IP_SHARD] = shard;
    route->iparams[SL_MOE_ROUTE_IP_BLOCKS] = (int)B;
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

/* f32 SwiGLU weights w1, w3 (I, C), w2 (C, I), contiguous */
static int swiglu_weights(const sl_tensor *w1, const sl_tensor *w3, const sl_tensor *w2, int64_t C) {
    int64_t I = w1->ne[0];
    return w1->dtype == SL_F32 && w3->dtype == SL_F32 && w2->dtype == SL_F32 && w1->ndim == 2 &&
           w1->ne[1] == C && w3->ndim == 2 && w3->ne[0] == I && w3->ne[1] == C && w2->ndim == 2 &&
           w2->ne[0] == C && w2->ne[1] == I && sl_is_contiguous(w1) && sl_is_contiguous(w3) &&
           sl_is_contiguous(w2);
}

sl_tensor *sl_moe_expert_ffn_node(sl_ctx *ctx, sl_tensor *x, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                                  sl_tensor *count_src, int e, int El) {
    SL_ASSERT(row_major_2d(x) && sl_is_contiguous(x) && e >= 0);
    int64_t R = x->ne[0], C = x->ne[1], I = w1->ne[0];
    SL_ASSERT(swiglu_weights(w1, w3, w2, C));
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

/* Note [Packed experts]
 * The per-expert layer above sizes every expert's tensors for every token it may receive: dropless, E
 * buffers of N rows for the gathered input, the output and the two hidden activations, all kept for
 * backward, so a layer holds E * N * (2 C + 2 I) floats where the routed tokens need N * k * (2 C + 2 I).
 * For the f32 routed experts the layer is instead one chain over the packed pairs:
 *   xp  = MOE_EP_PACK(h, w)                          (S = N k, C) kept pairs, expert-major, token order
 * within y_0 = MOE_PACKED_FFN(xp, W_0, NULL, e = 0)       rows [off_0, off_0 + n_0) = SwiGLU_0 of xp's rows
 *   y_e = MOE_PACKED_FFN(xp, W_e, y_{e-1}, e)        in place: writes only its own rows
 *   y   = MOE_EP_UNPACK(y_{E-1}, w)                  (N, C) weighted sum of each token's rows
 * with off_e, n_e from the route's kept counts at run time. The chain's first node owns the (S, C) storage
 * and, as aux, the w1 x and w3 x rows of every expert (S, I each) that backward reads; the later nodes alias
 * it (in-place ops, src/graph/graph.c), so the layer keeps S (2 C + 2 I) floats. Under EP the same chain runs
 * over the received rows, regrouped local-expert major (MOE_EP_REGROUP; Note [Expert-parallel dispatch]).
 * Backward per expert: FFN_BACK (dw2 and the pre-activation gradients, as scratch aux for one expert),
 * FFN_BACK_W (dw1, dw3) and FFN_DX, the expert's rows of dx, again a chain in place on the later expert's DX
 * node (backward visits the experts last to first). The chain is threaded through autodiff by handing expert
 * e - 1 the DX node of expert e as "its gradient": the gradient of y_{e-1} is dy itself (its rows pass
 * through y_e untouched), which that DX node carries as FFN_BACK's src1; the first expert emits the finished
 * chain as the gradient of xp. Every GEMM is the one the per-expert path runs on the same rows, and UNPACK
 * sums a token's rows in expert order as the combine chain did, so the values are the same. Under autocast
 * the kernels round as the per-expert autocast nodes do (Note [Packed experts under autocast],
 * src/device/cpu/kernels/moe_packed.c). */
static sl_tensor *rows(sl_ctx *ctx, sl_tensor *g) { return row_major_2d(g) ? g : sl_cont(ctx, g); }

sl_tensor *sl_moe_packed_ffn(sl_ctx *ctx, sl_tensor *xp, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                             sl_tensor *prev, int e, int El, int64_t rmax, sl_dtype half) {
    SL_ASSERT(row_major_2d(xp) && sl_is_contiguous(xp) && e >= 0 && El >= 0 && rmax >= 1);
    SL_ASSERT((El == 0 && xp->op == SL_OP_MOE_EP_PACK) || (El > 0 && xp->op == SL_OP_MOE_EP_REGROUP));
    int64_t S = xp->ne[0], C = xp->ne[1], I = w1->ne[0];
    SL_ASSERT(swiglu_weights(w1, w3, w2, C));
    SL_ASSERT(half == SL_F32 || half == SL_BF16 || half == SL_F16);
    SL_ASSERT(!prev || (prev->op == SL_OP_MOE_PACKED_FFN && prev->src[0] == xp && prev->src[1]->ne[0] == I &&
                        prev->iparams[3] == (half == SL_F32 ? 0 : (int)half)));
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_PACKED_FFN, SL_F32, 2, xp->ne);
    t->src[0] = xp;
    t->src[1] = w1;
    t->src[2] = w3;
    t->src[3] = w2;
    t->src[4] = prev;
    t->iparams[0] = e;
    t->iparams[1] = El;
    t->iparams[2] = (int)(rmax < S ? rmax : S); /* rows one expert may hold: its backward's scratch */
    t->iparams[3] = half == SL_F32 ? 0 : (int)half;
    if (prev)
        t->view_src = prev; /* in place: the chain's storage (and aux) is its first node's */
    else
        t->aux_bytes = sizeof(float) * (size_t)(2 * S * I);
    return t;
}

void sl_moe_packed_ffn_half_gemm(sl_tensor *t) {
    SL_ASSERT(t->op == SL_OP_MOE_PACKED_FFN && t->iparams[3] == SL_BF16);
    SL_ASSERT(!t->src[4] || t->src[4]->iparams[4] == 1); /* the whole chain or none of it */
    t->iparams[4] = 1;
}

/* Backward of one link of the packed chain (Note [Packed experts]). */
static void packed_ffn_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *ng, sl_grad_emit emit,
                                void *st) {
    sl_tensor *xp = n->src[0], *w1 = n->src[1], *w3 = n->src[2], *w2 = n->src[3], *prev = n->src[4];
    sl_tensor *dy = g, *later = NULL; /* the later expert's DX node, which carries dy */
    if (g->op == SL_OP_MOE_PACKED_FFN_DX) {
        later = g;
        dy = g->src[0]->src[1];
    } else {
        dy = rows(ctx, g);
    }
    int64_t S = xp->ne[0], C = xp->ne[1], I = w1->ne[0], Rb = n->iparams[2];
    sl_tensor *b = sl_new_op(ctx, SL_OP_MOE_PACKED_FFN_BACK, SL_F32, 2, (int64_t[]){C, I});
    b->src[0] = n;
    b->src[1] = dy;
    b->src[2] = w2;
    b->iparams[2] = (int)Rb;
    b->aux_bytes = sizeof(float) * (size_t)(2 * Rb * I);
    if (xp->flags & SL_FLAG_ROWS_CAP_GRAD) b->flags |= SL_FLAG_ROWS_CAP; /* scratch: the expert's rows */
    if (ng[3]) emit(st, w2, b);
    if (ng[1] || ng[2]) {
        sl_tensor *w = sl_new_op(ctx, SL_OP_MOE_PACKED_FFN_BACK_W, SL_F32, 1, (int64_t[]){2 * I * C});
        w->src[0] = b;
        w->src[1] = xp;
        if (ng[1]) emit(st, w1, sl_view(ctx, w, 2, (int64_t[]){I, C}, (int64_t[]){C, 1}, 0));
        if (ng[2]) emit(st, w3, sl_view(ctx, w, 2, (int64_t[]){I, C}, (int64_t[]){C, 1}, I * C));
    }
    if (!ng[0]) { /* no input gradient: pass dy on for the earlier experts' weights */
        if (prev && ng[4]) emit(st, prev, dy);
        return;
    }
    sl_tensor *dx = sl_new_op(ctx, SL_OP_MOE_PACKED_FFN_DX, SL_F32, 2, (int64_t[]){S, C});
    dx->src[0] = b;
    dx->src[1] = w1;
    dx->src[2] = w3;
    dx->src[3] = later;
    dx->view_src = later; /* NULL for the last expert's, which owns the chain's storage */
    if (xp->flags & SL_FLAG_ROWS_CAP_GRAD) dx->flags |= SL_FLAG_ROWS_CAP; /* Note [Reserved rows] */
    if (prev)
        emit(st, prev, dx);
    else
        emit(st, xp, dx);
}

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
        SL_ASSERT(w != 2 && "the bf16 combine of a bf16 inference model has no backward");
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
    case SL_OP_MOE_PACKED_FFN:
        packed_ffn_backward(ctx, n, g, ng, emit, st);
        return 1;
    default:
        return sl_moe_ep_op_backward(ctx, n, g, ng, emit, st);
    }
}
