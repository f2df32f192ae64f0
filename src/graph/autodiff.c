/* Reverse-mode autodiff: walks the forward nodes backwards and appends gradient nodes built from the
 * per-op rules in src/ops/backward.c. */
#include <string.h>

#include "graph/graph_internal.h"
#include "ops/ops_internal.h"

typedef struct {
    sl_graph *g;
    uint8_t *needs; /* by id: depends on a parameter */
    uint8_t *owned; /* by id: grads[id] is a private accumulator that may be updated in place */
    /* Note [Full recomputation] (NULL when off): by id, a forward node's layer segment (-1: kept), its
     * copy for the backward, and a copy's original */
    int *seg;
    sl_tensor **copy, **orig;
    int cap; /* of those arrays */
} ad_state;

void sl_graph_set_recompute(sl_graph *g, int method, int num_layers) {
    g->recompute = method;
    g->recompute_layers = num_layers;
}

/* Note [Full recomputation]
 * Megatron's --recompute-granularity full: the backward does not read what the forward computed inside a
 * transformer layer. The model builders flag the residual stream at each layer boundary SL_FLAG_LAYER_IO
 * (the embedding's output and every layer's output); the forward nodes between two such tensors in
 * execution order form a layer's segment (rc_segments: with --recompute-method uniform and N layers, N
 * layers form one; with block, only the first N layers of a stage have one). When the backward
 * rule of a segment node runs, it is handed a copy of the node instead: the same op and parameters, its
 * sources copied the same way where they lie in the segment, else the originals (the kept layer input,
 * parameters, inputs, tensors that later layers read as well). Copies are pushed lazily, just before the
 * first backward node that reads them, so each layer is computed again right before its own backward,
 * and the forward's intermediates, read by nothing after the forward, die there: the planner keeps one
 * layer's worth instead of all of them. Gradients stay keyed by the originals (emit maps a copy back).
 * A copy runs the same kernel on the same bits in the same order: the same values (the dropout masks
 * come from the same counters: sl_graph_set_dropout sets the copies too); test_recompute checks losses
 * and weights bitwise equal to the run that keeps everything, also under TP, SP, PP and DP. Nodes that
 * write into storage outside their segment, KV-cache stores and the collectives whose forward sums are
 * never copied: TP's g (an all-reduce) and SP's reduce-scatter run once, in the forward, and their
 * outputs are kept for the copies downstream (Megatron runs g's all-reduce again, and keeps one (N, C)
 * buffer less per layer). The collectives that only move data are copied like any op: TP's f, whose
 * forward is the identity and which communicates in its backward only (that runs once either way; a TP
 * layer then keeps 2 C floats per token instead of 4 C: Note [Recomputation memory], src/plan); SP's
 * all-gather along the sequence, run again in the backward as Megatron does, so an SP layer keeps its
 * sequence shards only, not two gathered (N, C) buffers (sl_tp_comm_theory counts the extra all-gathers);
 * and the expert-parallel all-to-alls of the rows (ALLTOALLV, ALLTOALLV_REV), run again from the kept
 * route and counts (the counts' all-to-all is not copied), so a MoE layer under EP keeps what it keeps
 * without EP instead of ep min(k, E / ep) + k received and returned rows of C per token (test_recompute:
 * Qwen2-MoE at ep 2, bitwise; rank 0 plans 172.7 KiB instead of 193.8). The collective provider runs
 * collectives in graph order and every rank of a TP or EP group builds the same graph, so the copies'
 * collectives meet in the same order on every rank. ZB-H1 (Note [Splitting the backward]) defers the
 * weight gradients and with them the copies they read, so its last stage keeps as much as without
 * recomputation. A pipeline stage's slot graphs recompute each the same way (sl_model.recompute), so the
 * micro-batches in flight hold their layer inputs only. A MoE layer's routing (MOE_ROUTE, its losses) is
 * not copied either: the route, its token counts (read after the step by sl_moe_graph_stats and the
 * DeepSeek-V3 bias update) and its capacity drops exist once and are kept; the dispatch, the all-to-alls,
 * the experts and the combine are computed again from it. Costs one more forward per step, as
 * Megatron's. */
static int copyable(const sl_tensor *t) {
    /* collectives whose forward moves data without arithmetic are copied (below): TP's f (the identity),
     * SP's all-gather along the sequence and the expert-parallel all-to-alls of the rows */
    if (t->op == SL_OP_COLLECTIVE &&
        (t->iparams[0] == SL_COLL_COPY || t->iparams[0] == SL_COLL_ALLGATHER_SEQ ||
         t->iparams[0] == SL_COLL_ALLTOALLV || t->iparams[0] == SL_COLL_ALLTOALLV_REV))
        return !(t->flags & (SL_FLAG_OUTPUT | SL_FLAG_LOSS | SL_FLAG_PARAM | SL_FLAG_INPUT));
    return t->op != SL_OP_COLLECTIVE && t->op != SL_OP_KV_STORE && t->op != SL_OP_MOE_ROUTE &&
           t->op != SL_OP_MOE_ROUTER_LOSS &&
           !(t->flags & (SL_FLAG_OUTPUT | SL_FLAG_LOSS | SL_FLAG_PARAM | SL_FLAG_INPUT));
}

/* the copy of forward node t for the backward (t itself outside a segment) */
static sl_tensor *rc_copy(ad_state *s, sl_tensor *t) {
    if (!t || !s->seg || t->op == SL_OP_NONE || t->id >= s->cap || s->seg[t->id] < 0) return t;
    if (s->copy[t->id]) return s->copy[t->id];
    sl_tensor *c = sl_new_op(s->g->ctx, t->op, t->dtype, t->ndim, t->ne), *src[SL_MAX_SRC], *vs;
    for (int k = 0; k < SL_MAX_SRC; k++) src[k] = rc_copy(s, t->src[k]);
    vs = rc_copy(s, t->view_src);
    int id = c->id;
    *c = *t;
    c->id = id;
    c->order = -1;
    c->data = NULL;
    c->buffer = NULL;
    c->buffer_offs = 0;
    c->grad = NULL;
    c->flags = (t->flags & ~(uint32_t)SL_FLAG_LAYER_IO) | SL_FLAG_RECOMPUTED; /* a group's inner boundary */
    for (int k = 0; k < SL_MAX_SRC; k++) c->src[k] = src[k];
    c->view_src = vs;
    sl_set_name(c, "%.56s.rc", t->name);
    s->copy[t->id] = c;
    s->orig[id] = t;
    return c;
}

/* Mark the segments. The SL_FLAG_LAYER_IO nodes end the layers in execution order: layer k is what lies
 * after the (k-1)-th and before the k-th (from the graph's start for the first). On the first pipeline
 * stage (or in one process) the first such piece is the embedding, not a layer, and is kept; a later
 * stage's first layer reads its input leaf. Uniform: layers in groups of n, each group one segment (the
 * boundaries inside a group recomputed too, kept at its end); block: the first n layers each their own
 * segment, the rest kept. Segment members are copyable nodes whose storage is their own or a member's of
 * the same segment. Nodes after the last boundary (the final norm, head, loss) are kept. */
static void rc_segments(ad_state *s, int n_fwd) {
    sl_graph *g = s->g;
    int n = g->recompute_layers > 0 ? g->recompute_layers : 1, first = -1, pre = 1;
    for (int i = 0; i < n_fwd; i++) s->seg[g->nodes[i]->id] = -1;
    for (int i = 0; i < n_fwd && first < 0; i++)
        if (g->nodes[i]->flags & SL_FLAG_LAYER_IO) first = i;
    for (int i = 0; i < first && pre; i++) /* a stage's input leaf read before its first boundary */
        for (int k = 0; k < SL_MAX_SRC; k++) {
            const sl_tensor *x = g->nodes[i]->src[k];
            if (x && x->op == SL_OP_NONE && (x->flags & SL_FLAG_LAYER_IO)) pre = 0;
        }
    int lo = -1, piece = 0;
    for (int i = 0; i < n_fwd; i++) {
        if (!(g->nodes[i]->flags & SL_FLAG_LAYER_IO)) continue;
        int layer = piece - pre, grp = -1; /* this piece's layer (-1: the embedding) and segment */
        if (layer >= 0) grp = g->recompute == SL_RECOMPUTE_BLOCK ? (layer < n ? layer : -1) : layer / n;
        for (int j = lo + 1; grp >= 0 && j < i; j++) {
            sl_tensor *x = g->nodes[j];
            if (!copyable(x)) continue;
            if (x->view_src && x->view_src->op != SL_OP_NONE && s->seg[x->view_src->id] != grp) continue;
            if (x->view_src && x->view_src->op == SL_OP_NONE && x->op != SL_OP_VIEW) continue;
            s->seg[x->id] = grp;
        }
        /* a boundary inside a uniform group is recomputed with it: the group's next layer reads it */
        if (grp >= 0 && g->recompute == SL_RECOMPUTE_UNIFORM && (layer + 1) % n != 0 && copyable(g->nodes[i]))
            s->seg[g->nodes[i]->id] = grp;
        lo = i;
        piece++;
    }
    /* the last layer's end is kept whatever the group: nothing after it is recomputed */
    for (int i = n_fwd - 1; i >= 0; i--)
        if (g->nodes[i]->flags & SL_FLAG_LAYER_IO) {
            s->seg[g->nodes[i]->id] = -1;
            break;
        }
}

static void push_new(sl_graph *g, sl_tensor *t);

/* Push `t` and any not-yet-pushed nodes it depends on (grad subgraphs are built bottom-up). */
static void push_new(sl_graph *g, sl_tensor *t) {
    sl_graph_ensure_id_capacity(g);
    if (t->op == SL_OP_NONE || g->visited[t->id]) return;
    for (int i = 0; i < SL_MAX_SRC; i++)
        if (t->src[i]) push_new(g, t->src[i]);
    sl_graph_push(g, t);
}

static void note_grad_write(ad_state *s, sl_tensor *p, sl_tensor *writer) {
    push_new(s->g, writer);
    if (s->g->last_grad_write[p->id] < 0) writer->flags |= SL_FLAG_GRAD_FIRST; /* writers push in order */
    s->g->last_grad_write[p->id] = writer->order;
}

static void emit(void *vs, sl_tensor *src, sl_tensor *c) {
    ad_state *s = vs;
    sl_graph *g = s->g;
    sl_ctx *ctx = g->ctx;
    sl_graph_ensure_id_capacity(g);
    if (s->orig && src->id < s->cap && s->orig[src->id])
        src = s->orig[src->id]; /* Note [Full recomputation] */
    if (!sl_same_shape(c, src)) {
        /* same number of elements, different shape (e.g. folded matmul): reshape */
        if (!sl_is_contiguous(c)) c = sl_cont(ctx, c);
        c = sl_reshape(ctx, c, src->ndim, src->ne);
    }
    if (src->flags & SL_FLAG_PARAM) {
        SL_ASSERT(src->grad && "parameter without a gradient leaf");
        if (sl_try_accumulate_into(c, src->grad)) { /* Note [Accumulating gradient writes] */
            note_grad_write(s, src, c);
            return;
        }
        sl_tensor *in = c;
        if (!sl_is_contiguous(in)) in = sl_cont(ctx, in);
        note_grad_write(s, src, sl_acc(ctx, src->grad, in));
        return;
    }
    sl_tensor *prev = g->grads[src->id];
    if (!prev) {
        g->grads[src->id] = c;
        s->owned[src->id] = 0;
    } else if (s->owned[src->id]) {
        sl_tensor *in = sl_is_contiguous(c) ? c : sl_cont(ctx, c);
        g->grads[src->id] = sl_acc(ctx, prev, in);
    } else {
        g->grads[src->id] = sl_add(ctx, sl_is_contiguous(prev) ? prev : sl_cont(ctx, prev), c);
        s->owned[src->id] = 1; /* the add's output is private to this accumulation */
    }
}

/* Gradient of a view: scatter g into an accumulator shaped like the view's source. */
static void emit_view(ad_state *s, sl_tensor *view, sl_tensor *gv) {
    sl_graph *g = s->g;
    sl_ctx *ctx = g->ctx;
    sl_tensor *a = view->view_src;
    /* A view of a strided view (Baichuan's heads of a W_pack slice): its strides and offset address the
     * memory of the strided view's source, not a contiguous tensor shaped like the strided view, so the
     * scatter below (into a contiguous accumulator shaped like `a`) would misplace it. Scatter into the
     * source's gradient instead: the same view geometry with the offsets composed (gradients are linear,
     * so a's other consumers still reach the source through a's own emit_view). */
    if (a->op == SL_OP_VIEW && !sl_is_contiguous(a)) {
        sl_tensor flat = *view;
        flat.view_src = a->view_src;
        flat.view_offs = a->view_offs + view->view_offs;
        emit_view(s, &flat, gv);
        return;
    }
    /* A reshape of a contiguous tensor: the gradient is a reshape too. */
    if (sl_is_contiguous(view) && sl_is_contiguous(a) && view->view_offs == 0 &&
        sl_nelements(view) == sl_nelements(a)) {
        emit(s, a, gv);
        return;
    }
    sl_tensor *prev = (a->flags & SL_FLAG_PARAM) ? NULL : g->grads[a->id];
    sl_tensor *acc;
    if (prev && s->owned[a->id] && sl_is_contiguous(prev)) {
        acc = prev;
    } else {
        acc = sl_zeros(ctx, SL_F32, a->ndim, a->ne);
    }
    sl_tensor *r = sl_scatter_add(ctx, acc, gv, view);
    if (acc == prev) {
        g->grads[a->id] = r;
        return;
    }
    if (a->flags & SL_FLAG_PARAM) {
        emit(s, a, r);
        return;
    }
    if (prev) {
        g->grads[a->id] = sl_acc(ctx, r, sl_is_contiguous(prev) ? prev : sl_cont(ctx, prev));
    } else {
        g->grads[a->id] = r;
    }
    s->owned[a->id] = 1;
}

static void build_backward(sl_graph *g, sl_tensor *loss, float loss_scale, sl_tensor *seed_in,
                           sl_tensor *extra, float extra_scale);

void sl_graph_build_backward(sl_graph *g, sl_tensor *loss, float loss_scale) {
    build_backward(g, loss, loss_scale, NULL, NULL, 0);
}

void sl_graph_build_backward_seeded(sl_graph *g, sl_tensor *out, sl_tensor *seed, sl_tensor *extra,
                                    float extra_scale) {
    SL_ASSERT(seed && sl_same_shape(seed, out) && seed->op == SL_OP_NONE);
    SL_ASSERT(!extra || (extra->order >= 0 && sl_nelements(extra) == 1));
    build_backward(g, out, 1.0f, seed, extra, extra_scale);
}

static void build_backward(sl_graph *g, sl_tensor *loss, float loss_scale, sl_tensor *seed_in,
                           sl_tensor *extra, float extra_scale) {
    sl_ctx *ctx = g->ctx;
    int n_fwd = g->n_nodes;
    SL_ASSERT(loss->order >= 0 && "loss must be in the forward graph");
    sl_graph_ensure_id_capacity(g);
    ad_state s = {g, NULL, NULL, NULL, NULL, NULL, 0};
    int cap = sl_ctx_count(ctx) * 4 + 1024; /* backward creates new tensors */
    s.needs = calloc((size_t)cap, 1);
    s.owned = calloc((size_t)cap, 1);
    SL_ASSERT(s.needs && s.owned);
    if (g->recompute) { /* Note [Full recomputation] */
        s.seg = malloc((size_t)cap * sizeof *s.seg);
        s.copy = calloc((size_t)cap, sizeof *s.copy);
        s.orig = calloc((size_t)cap, sizeof *s.orig);
        SL_ASSERT(s.seg && s.copy && s.orig);
        s.cap = cap;
        for (int i = 0; i < cap; i++) s.seg[i] = -1;
        rc_segments(&s, n_fwd);
    }
    /* which forward nodes depend on a parameter */
    for (int i = 0; i < n_fwd; i++) {
        sl_tensor *t = g->nodes[i];
        for (int k = 0; k < SL_MAX_SRC; k++) {
            sl_tensor *x = t->src[k];
            if (!x) continue;
            if ((x->flags & SL_FLAG_PARAM) || s.needs[x->id]) s.needs[t->id] = 1;
        }
    }
    /* seed: d(loss) = loss_scale, a FILL node computed on the backend (device-resident, no host float);
     * or the caller's leaf (a pipeline stage: the gradient of its output received from the next stage) */
    sl_tensor *seed = seed_in;
    if (!seed) {
        SL_ASSERT(sl_nelements(loss) == 1);
        seed = sl_fill(ctx, SL_F32, loss->ndim, loss->ne, loss_scale);
        sl_set_name(seed, "d_loss");
        sl_graph_push(g, seed);
    }
    sl_graph_ensure_id_capacity(g);
    g->grads[loss->id] = seed;
    int top = loss->order;
    if (extra) { /* a second root, seeded like a loss (a pipeline stage's router losses) */
        sl_tensor *es = sl_fill(ctx, SL_F32, extra->ndim, extra->ne, extra_scale);
        sl_set_name(es, "d_extra_loss");
        sl_graph_push(g, es);
        sl_graph_ensure_id_capacity(g);
        g->grads[extra->id] = es;
        if (extra->order > top) top = extra->order;
    }

    for (int i = top; i >= 0; i--) {
        sl_tensor *t = g->nodes[i];
        sl_tensor *gt = g->grads[t->id];
        if (!gt || !s.needs[t->id]) continue;
        SL_ASSERT(sl_ctx_count(ctx) + 64 < cap);
        int ng[SL_MAX_SRC] = {0};
        for (int k = 0; k < SL_MAX_SRC; k++) {
            sl_tensor *x = t->src[k];
            ng[k] = x && ((x->flags & SL_FLAG_PARAM) || s.needs[x->id]);
        }
        if (t->op == SL_OP_VIEW) {
            if (ng[0]) emit_view(&s, t, gt);
        } else if (t->op == SL_OP_EMBEDDING) {
            sl_tensor *table = t->src[0], *ids = t->src[1];
            if (ng[0]) {
                int is_param = (table->flags & SL_FLAG_PARAM) != 0;
                sl_tensor *dst = is_param ? table->grad : sl_zeros(ctx, SL_F32, 2, table->ne);
                SL_ASSERT(dst);
                sl_tensor *eb = sl_new_op(ctx, SL_OP_EMBEDDING_BACK, SL_F32, 2, table->ne);
                eb->src[0] = dst;
                eb->src[1] = ids;
                eb->src[2] = sl_is_contiguous(gt) ? gt : sl_cont(ctx, gt);
                eb->view_src = dst;
                eb->iparams[2] = t->iparams[2]; /* vocab shard: rows [lo, +V) */
                eb->iparams[3] = t->iparams[3];
                if (is_param)
                    note_grad_write(&s, table, eb);
                else
                    emit(&s, table, eb);
            }
        } else {
            sl_op_backward(ctx, rc_copy(&s, t), gt, ng, emit, &s); /* Note [Full recomputation] */
        }
        /* push everything created so far so the order stays topological; the gradient of a bf16 copy of a
         * parameter waits for the CAST rule (Note [Rounded weight gradients]) */
        for (int k = 0; k < SL_MAX_SRC; k++) {
            sl_tensor *x = t->src[k];
            if (x && x->op == SL_OP_CAST && x->dtype == SL_BF16 && x->src[0]->op == SL_OP_NONE &&
                (x->src[0]->flags & SL_FLAG_PARAM) && x->order >= 0 && x->order < i)
                continue;
            if (x && g->grads && x->id < g->grads_cap && g->grads[x->id]) push_new(g, g->grads[x->id]);
        }
    }
    /* gradients that were never consumed (e.g. of inputs) are still pushed so they are computable */
    free(s.needs);
    free(s.owned);
    free(s.seg);
    free(s.copy);
    free(s.orig);
}
