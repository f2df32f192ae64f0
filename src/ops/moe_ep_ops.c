/* Expert-parallel MoE ops: the token dispatch and combine of experts spread over the ranks of an
 * expert-parallel group, as graph nodes with their backward rules.
 *
 * Note [Expert-parallel dispatch]
 * With E experts over the P ranks of the EP group, rank p holds the El = E / P experts
 * [p El, (p + 1) El). Every rank routes its own N tokens (MOE_ROUTE, capacity from its own N, as a single
 * process running the same micro-batch), then one sparse layer is
 *   cnt  = MOE_EP_COUNTS(w)                       (E) kept tokens per global expert
 *   rcnt = COLLECTIVE(cnt, ALLTOALL)              (E) block p: rank p's counts for my El experts
 *   xs   = MOE_EP_PACK(h, w)                      (S, C) kept pairs, expert-major, token order within
 *   xr   = COLLECTIVE(xs, ALLTOALLV; cnt, rcnt)   (Rx, C) from rank 0's rows for my experts, rank 1's, ..
 *   x_l  = MOE_EP_GATHER(xr, rcnt, l)             (Rl, C) local expert l's rows, source rank order
 *   y_l  = MOE_EXPERT_FFN(x_l; rcnt, l)           on the received count only (Note [Routed expert rows])
 *   yr   = MOE_EP_SCATTER(y_l, rcnt, yr_{<l}, l)  (Rx, C) back into the received layout
 *   ys   = COLLECTIVE(yr, ALLTOALLV_REV)          (S, C) every pair's expert output, back home
 *   y    = MOE_EP_UNPACK(ys, w)                   (N, C) sum over the token's pairs of weight * row
 * The counts are exchanged first (the all-to-all of E floats), so every ALLTOALLV knows its send and
 * receive counts; shapes stay static: S = N k pairs at most, Rx = P min(N k, N El) rows, Rl = P N rows (an
 * expert takes a token at most once). Ranks of the EP group are consecutive data-parallel ranks, so an
 * expert sees its tokens in the order of the single process that runs the group's micro-batches as one
 * batch (dropless) and its GEMMs compute every row as that process does. Under autocast the per-expert
 * path gathers and scatters one source rank's rows at a time (iparams[3]; Note [EP weight gradients per
 * source rank], src/device/cpu/kernels/moe_packed.c), so each weight gradient is rounded per micro-batch.
 * Backward is the same machinery transposed: the gradient of an ALLTOALLV is an ALLTOALLV_REV with the same
 * counts (and the reverse), PACK and UNPACK are adjoint, GATHER and SCATTER too; the routing weights get
 * their gradient from UNPACK (dy . row per kept pair). Expert gradients are reduced over the
 * expert-data-parallel group by data parallelism (src/parallel/dp.c), the other parameters over the
 * whole data-parallel group. */
#include "ops/ops_internal.h"

static int rows2d(const sl_tensor *t) { return t->ndim == 2 && t->nb[1] == 1 && t->dtype == SL_F32; }
static sl_tensor *rows(sl_ctx *ctx, sl_tensor *g) {
    return rows2d(g) && sl_is_contiguous(g) ? g : sl_cont(ctx, g);
}
static int is_counts(const sl_tensor *c, int64_t E) {
    return c->ndim == 1 && c->ne[0] == E && c->dtype == SL_F32 && sl_is_contiguous(c);
}

sl_tensor *sl_moe_ep_counts(sl_ctx *ctx, sl_tensor *route) {
    SL_ASSERT(route->op == SL_OP_MOE_ROUTE);
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EP_COUNTS, SL_F32, 1, (int64_t[]){route->ne[1]});
    t->src[0] = route;
    return t;
}

sl_tensor *sl_moe_ep_exchange_counts(sl_ctx *ctx, sl_tensor *cnt, int P) {
    SL_ASSERT(cnt->ndim == 1 && cnt->ne[0] % P == 0);
    return sl_collective(ctx, cnt, SL_COLL_ALLTOALL, SL_COLL_NONE, SL_GROUP_EP, P);
}

sl_tensor *sl_moe_ep_pack(sl_ctx *ctx, sl_tensor *x, sl_tensor *route, int64_t S, int weighted) {
    SL_ASSERT(rows2d(x) && route->op == SL_OP_MOE_ROUTE && x->ne[0] == route->ne[0] && S >= 1);
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EP_PACK, SL_F32, 2, (int64_t[]){S, x->ne[1]});
    t->src[0] = x;
    t->src[1] = route;
    t->iparams[1] = weighted;
    return t;
}

sl_tensor *sl_moe_ep_unpack(sl_ctx *ctx, sl_tensor *packed, sl_tensor *route, int weighted) {
    SL_ASSERT(rows2d(packed) && route->op == SL_OP_MOE_ROUTE);
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EP_UNPACK, SL_F32, 2, (int64_t[]){route->ne[0], packed->ne[1]});
    t->src[0] = packed;
    t->src[1] = route;
    t->iparams[1] = weighted;
    return t;
}

sl_tensor *sl_moe_ep_alltoallv(sl_ctx *ctx, sl_tensor *x, sl_tensor *cnt, sl_tensor *rcnt, int64_t rows_out,
                               int reverse, int P) {
    SL_ASSERT(rows2d(x) && sl_is_contiguous(x) && rows_out >= 1 && P >= 1);
    SL_ASSERT(is_counts(cnt, cnt->ne[0]) && is_counts(rcnt, cnt->ne[0]) && cnt->ne[0] % P == 0);
    sl_tensor *t = sl_new_op(ctx, SL_OP_COLLECTIVE, SL_F32, 2, (int64_t[]){rows_out, x->ne[1]});
    t->src[0] = x;
    t->src[1] = cnt;
    t->src[2] = rcnt;
    t->iparams[0] = reverse ? SL_COLL_ALLTOALLV_REV : SL_COLL_ALLTOALLV;
    t->iparams[1] = reverse ? SL_COLL_ALLTOALLV : SL_COLL_ALLTOALLV_REV;
    t->iparams[2] = SL_GROUP_EP;
    t->iparams[3] = P;
    return t;
}

sl_tensor *sl_moe_ep_gather(sl_ctx *ctx, sl_tensor *recv, sl_tensor *rcnt, int l, int El, int64_t Rl) {
    SL_ASSERT(rows2d(recv) && is_counts(rcnt, rcnt->ne[0]) && El >= 1 && rcnt->ne[0] % El == 0);
    SL_ASSERT(l >= 0 && l < El && Rl >= 1);
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EP_GATHER, SL_F32, 2, (int64_t[]){Rl, recv->ne[1]});
    t->src[0] = recv;
    t->src[1] = rcnt;
    t->iparams[0] = l;
    t->iparams[1] = El;
    return t;
}

sl_tensor *sl_moe_ep_scatter(sl_ctx *ctx, sl_tensor *y, sl_tensor *rcnt, sl_tensor *acc, int l, int El,
                             int64_t Rx) {
    SL_ASSERT(rows2d(y) && is_counts(rcnt, rcnt->ne[0]) && El >= 1 && rcnt->ne[0] % El == 0);
    SL_ASSERT(l >= 0 && l < El && Rx >= 1);
    SL_ASSERT(!acc || (rows2d(acc) && sl_is_contiguous(acc) && acc->ne[0] == Rx && acc->ne[1] == y->ne[1]));
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EP_SCATTER, SL_F32, 2, (int64_t[]){Rx, y->ne[1]});
    t->src[0] = y;
    t->src[1] = rcnt;
    t->src[2] = acc;
    t->iparams[0] = l;
    t->iparams[1] = El;
    return t;
}

sl_tensor *sl_moe_expert_ffn_ep(sl_ctx *ctx, sl_tensor *x, sl_tensor *w1, sl_tensor *w3, sl_tensor *w2,
                                sl_tensor *rcnt, int l, int El) {
    SL_ASSERT(is_counts(rcnt, rcnt->ne[0]) && El >= 1 && l < El && rcnt->ne[0] % El == 0);
    return sl_moe_expert_ffn_node(ctx, x, w1, w3, w2, rcnt, l, El);
}

sl_tensor *sl_moe_ep_regroup(sl_ctx *ctx, sl_tensor *x, sl_tensor *rcnt, int El, int back) {
    SL_ASSERT(rows2d(x) && sl_is_contiguous(x) && is_counts(rcnt, rcnt->ne[0]) && El >= 1 &&
              rcnt->ne[0] % El == 0);
    sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EP_REGROUP, SL_F32, 2, x->ne);
    t->src[0] = x;
    t->src[1] = rcnt;
    t->iparams[0] = back != 0;
    t->iparams[1] = El;
    return t;
}

/* Backward rules of the expert-parallel ops; returns 0 for other ops. */
int sl_moe_ep_op_backward(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *ng, sl_grad_emit emit,
                          void *st) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    switch (n->op) {
    case SL_OP_MOE_EP_COUNTS: /* a function of the discrete selection */
        return 1;
    case SL_OP_MOE_EP_PACK:
        SL_ASSERT(!n->iparams[1] && "weighted pack exists for backward rules only");
        if (ng[0]) emit(st, a, sl_moe_ep_unpack(ctx, rows(ctx, g), b, 0));
        return 1;
    case SL_OP_MOE_EP_UNPACK: {
        sl_tensor *gr = rows(ctx, g);
        if (ng[0]) emit(st, a, sl_moe_ep_pack(ctx, gr, b, a->ne[0], n->iparams[1]));
        if (ng[1] && n->iparams[1]) {
            sl_tensor *t = sl_new_op(ctx, SL_OP_MOE_EP_UNPACK_BACK_GATE, SL_F32, 2, b->ne);
            t->src[0] = a;
            t->src[1] = b;
            t->src[2] = gr;
            emit(st, b, t);
        }
        return 1;
    }
    case SL_OP_MOE_EP_GATHER:
        if (ng[0]) {
            sl_tensor *d =
                sl_moe_ep_scatter(ctx, rows(ctx, g), b, NULL, n->iparams[0], n->iparams[1], a->ne[0]);
            d->iparams[3] = n->iparams[3]; /* one source's rows: back to where they came from */
            emit(st, a, d);
        }
        return 1;
    case SL_OP_MOE_EP_SCATTER:
        if (ng[0]) {
            sl_tensor *d = sl_moe_ep_gather(ctx, rows(ctx, g), b, n->iparams[0], n->iparams[1], a->ne[0]);
            d->iparams[2] = a->op == SL_OP_MOE_EXPERT_FFN; /* its backward reads the received rows only */
            d->iparams[3] = n->iparams[3];
            emit(st, a, d);
        }
        /* the rows of expert l in g belong to y; the earlier experts' scatters read only their own rows */
        if (n->src[2] && ng[2]) emit(st, n->src[2], g);
        return 1;
    case SL_OP_MOE_EP_REGROUP: /* a permutation of the counted rows: its adjoint is the way back */
        if (ng[0]) {
            sl_tensor *d = sl_moe_ep_regroup(ctx, rows(ctx, g), b, n->iparams[1], !n->iparams[0]);
            if (a->flags & SL_FLAG_ROWS_CAP_GRAD) d->flags |= SL_FLAG_ROWS_CAP; /* Note [Reserved rows] */
            emit(st, a, d);
        }
        return 1;
    default:
        return 0;
    }
}

/* the gradient of an expert-parallel all-to-all(v): the way back with the same counts */
sl_tensor *sl_moe_ep_alltoallv_back(sl_ctx *ctx, sl_tensor *n, sl_tensor *g) {
    sl_tensor *gc = sl_is_contiguous(g) ? g : sl_cont(ctx, g);
    sl_tensor *t = sl_moe_ep_alltoallv(ctx, gc, n->src[1], n->src[2], n->src[0]->ne[0],
                                       n->iparams[0] == SL_COLL_ALLTOALLV, n->iparams[3]);
    if (n->src[0]->flags & SL_FLAG_ROWS_CAP_GRAD) t->flags |= SL_FLAG_ROWS_CAP; /* Note [Reserved rows] */
    return t;
}
