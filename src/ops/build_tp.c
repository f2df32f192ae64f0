/* Builders for tensor-parallel graphs: collectives as nodes, a vocab-sharded embedding, and the
 * vocab-parallel cross-entropy.
 *
 * Note [Tensor-parallel graphs]
 * Every rank of a TP group builds the same graph over its own shards of the weights (src/nn/gpt2.c).
 * Communication is part of the graph, as COLLECTIVE nodes whose forward and backward kinds are named at
 * build time, so autodiff produces Megatron's conjugate pairs without knowing about ranks:
 *   f = COLLECTIVE(x, COPY, ALLREDUCE)   before a column-parallel linear (input replicated, its gradient
 *                                        is a partial sum on every rank)
 *   g = COLLECTIVE(y, ALLREDUCE, COPY)   after a row-parallel linear (partial sums in, replicated out)
 * With sequence parallelism (Korthikanti et al. 2022) the replicated activations between the TP regions
 * are split along the sequence instead: an all-gather along T before a column-parallel linear
 * (ALLGATHER_SEQ, backward REDSCAT_SEQ) and a reduce-scatter along T after a row-parallel one (REDSCAT_SEQ,
 * backward ALLGATHER_SEQ). Parameters used on sequence shards (norms, row-parallel biases, positions) take
 * partial gradients on each rank: the model wraps each in COLLECTIVE(COPY, ALLREDUCE), so their gradient
 * is summed over the group inside the graph, before data parallelism sees it.
 * The gradient of a COLLECTIVE is a COLLECTIVE with the kinds swapped. The nodes are executed by the
 * graph's collective provider (the parallel layer, src/parallel/tp.c), which sees host-visible memory;
 * backends never see them. The vocab-parallel cross-entropy gathers 2 floats per row (the shard's
 * logsumexp and the target logit, or 0 where the target lies in another shard) instead of the logits; its
 * gradient needs no communication: softmax - onehot restricted to the shard's columns. */
#include "ops/ops_internal.h"

sl_tensor *sl_collective(sl_ctx *ctx, sl_tensor *x, sl_coll_kind fwd, sl_coll_kind bwd, sl_coll_group group,
                         int group_size) {
    SL_ASSERT(x->dtype == SL_F32 && sl_is_contiguous(x) && group_size >= 1);
    SL_ASSERT(fwd != SL_COLL_NONE && (int)group < SL_GROUP_COUNT);
    int64_t ne[SL_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) ne[d] = x->ne[d];
    if (fwd == SL_COLL_ALLGATHER) ne[0] *= group_size;
    if (fwd == SL_COLL_ALLGATHER_SEQ) ne[1] *= group_size;
    if (fwd == SL_COLL_REDSCAT_SEQ) {
        SL_ASSERT(x->ndim >= 2 && x->ne[1] % group_size == 0);
        ne[1] /= group_size;
    }
    /* the adjoint of an all-gather along dim 0 is a slice of the summed gradient: not needed yet */
    SL_ASSERT(bwd != SL_COLL_ALLGATHER && (fwd != SL_COLL_ALLGATHER || bwd == SL_COLL_NONE));
    /* the sequence collectives are each other's adjoints */
    SL_ASSERT((fwd == SL_COLL_ALLGATHER_SEQ) == (bwd == SL_COLL_REDSCAT_SEQ) &&
              (fwd == SL_COLL_REDSCAT_SEQ) == (bwd == SL_COLL_ALLGATHER_SEQ));
    sl_tensor *t = sl_new_op(ctx, SL_OP_COLLECTIVE, SL_F32, x->ndim, ne);
    t->src[0] = x;
    t->iparams[0] = fwd;
    t->iparams[1] = bwd;
    t->iparams[2] = group;
    t->iparams[3] = group_size;
    return t;
}

sl_tensor *sl_embedding_shard(sl_ctx *ctx, sl_tensor *table, sl_tensor *ids, int64_t lo) {
    SL_ASSERT(lo >= 0 && lo < INT32_MAX);
    sl_tensor *t = sl_embedding(ctx, table, ids);
    t->iparams[2] = (int32_t)lo;
    t->iparams[3] = 1;
    return t;
}

sl_tensor *sl_cross_entropy_vp(sl_ctx *ctx, sl_tensor *logits, sl_tensor *targets, int64_t lo,
                               int group_size) {
    SL_ASSERT(logits->dtype == SL_F32 && targets->dtype == SL_I32 && sl_is_contiguous(logits));
    SL_ASSERT(targets->ndim == logits->ndim - 1 && sl_is_contiguous(targets));
    SL_ASSERT(lo >= 0 && lo < INT32_MAX);
    for (int d = 0; d < targets->ndim; d++) SL_ASSERT(targets->ne[d] == logits->ne[d]);
    int64_t N = sl_nelements(targets);
    sl_tensor *st = sl_new_op(ctx, SL_OP_CE_VP_STATS, SL_F32, 2, (int64_t[]){N, 2});
    st->src[0] = logits;
    st->src[1] = targets;
    st->iparams[0] = (int32_t)lo;
    sl_tensor *all = st;
    if (group_size > 1)
        all = sl_collective(ctx, st, SL_COLL_ALLGATHER, SL_COLL_NONE, SL_GROUP_TP, group_size);
    all = sl_reshape(ctx, all, 3, (int64_t[]){group_size, N, 2});
    sl_tensor *t = sl_new_op(ctx, SL_OP_CE_VP, SL_F32, 1, (int64_t[]){1});
    t->src[0] = logits;
    t->src[1] = targets;
    t->src[2] = all;
    t->iparams[0] = (int32_t)lo;
    t->aux_bytes = sizeof(float) * (size_t)N; /* the global logsumexp per row, for backward */
    t->flags |= SL_FLAG_LOSS;
    return t;
}

sl_tensor *sl_collective_group(sl_ctx *ctx, sl_tensor *x, sl_coll_kind fwd, sl_coll_kind bwd, int tp,
                               int sub) {
    SL_ASSERT(fwd <= SL_COLL_ALLREDUCE && bwd <= SL_COLL_ALLREDUCE && sub >= 1 && tp % sub == 0);
    sl_tensor *t = sl_collective(ctx, x, fwd, bwd, SL_GROUP_TP_KV, tp);
    t->iparams[4] = sub;
    return t;
}

sl_tensor *sl_tp_enter(sl_ctx *ctx, sl_tensor *x, int tp, int sp) {
    if (tp <= 1) return x;
    if (sp) return sl_collective(ctx, x, SL_COLL_ALLGATHER_SEQ, SL_COLL_REDSCAT_SEQ, SL_GROUP_TP, tp);
    return sl_collective(ctx, x, SL_COLL_COPY, SL_COLL_ALLREDUCE, SL_GROUP_TP, tp);
}

sl_tensor *sl_tp_exit(sl_ctx *ctx, sl_tensor *x, int tp, int sp) {
    if (tp <= 1) return x;
    if (sp) return sl_collective(ctx, x, SL_COLL_REDSCAT_SEQ, SL_COLL_ALLGATHER_SEQ, SL_GROUP_TP, tp);
    return sl_collective(ctx, x, SL_COLL_ALLREDUCE, SL_COLL_COPY, SL_GROUP_TP, tp);
}

sl_tensor *sl_tp_rep(sl_ctx *ctx, sl_tensor *p, int tp, int sp) {
    return tp > 1 && sp ? sl_collective(ctx, p, SL_COLL_COPY, SL_COLL_ALLREDUCE, SL_GROUP_TP, tp) : p;
}

/* Backward rules of the tensor-parallel ops (called by sl_op_backward) */
void sl_op_backward_tp(sl_ctx *ctx, sl_tensor *n, sl_tensor *g, const int *ng, sl_grad_emit emit, void *st) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    switch (n->op) {
    case SL_OP_COLLECTIVE: /* the conjugate collective */
        if (ng[0] && (n->iparams[0] == SL_COLL_ALLTOALLV || n->iparams[0] == SL_COLL_ALLTOALLV_REV)) {
            emit(st, a, sl_moe_ep_alltoallv_back(ctx, n, g));
        } else if (ng[0] && n->iparams[1] != SL_COLL_NONE) {
            sl_tensor *gc = sl_is_contiguous(g) ? g : sl_cont(ctx, g);
            sl_tensor *c = sl_collective(ctx, gc, (sl_coll_kind)n->iparams[1], (sl_coll_kind)n->iparams[0],
                                         (sl_coll_group)n->iparams[2], n->iparams[3]);
            c->iparams[4] = n->iparams[4];
            emit(st, a, c);
        }
        break;
    case SL_OP_CE_VP:
        /* the stats (src2) are treated as constants: the softmax form below is the whole gradient */
        if (ng[0]) {
            sl_tensor *t = sl_new_op(ctx, SL_OP_CE_VP_BACK, SL_F32, a->ndim, a->ne);
            t->src[0] = n;
            t->src[1] = a;
            t->src[2] = b;
            t->src[3] = g;
            t->iparams[0] = n->iparams[0];
            emit(st, a, t);
        }
        break;
    case SL_OP_CE_VP_STATS:
        break; /* reached only through CE_VP's src2, which takes no gradient */
    default:
        SL_ASSERT(!"not a tensor-parallel op");
    }
}
