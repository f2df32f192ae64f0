/* Slots for data parallelism: ZeRO-3 parameter gathers and ZeRO-2/3 gradient slots, scheduled statically
 * over the fixed training graph, and the executor-hook events that drive them (and the bucket launches).
 *
 * Note [ZeRO-3 gather schedule]
 * Under stage 3 a rank keeps only its shard of the parameters (the same parts and tails as the optimizer
 * state); the full flat parameter buffer is freed. For each bucket, the nodes that read any of its
 * parameters (directly or through views) are found and split into use intervals [S, E] wherever two uses
 * are more than Z3_GAP nodes apart, so a layer's weights are gathered once for forward and again for
 * backward, and not held in between. Intervals are ordered by S; interval j's all-gather is launched
 * asynchronously right after node S(j-1) - 1, i.e. while interval j-1 computes (prefetch depth 1), and
 * waited for just before node S(j), where the bucket's parameter leaves are bound to the slot and the
 * graph's views re-derived (sl_graph_refresh_views). The gathered values are bitwise the shard values, so
 * stage 3 computes exactly what stages 0-2 compute.
 *
 * Note [Gradient slots]
 * Under stages 2 and 3 with one micro-batch per step, the full-size gradient buffer is freed too: bucket
 * k's gradient leaves live in a slot from just before the first node that touches them (gw0; the slot is
 * zeroed and bound then) until its reduce-scatter has been waited for, which happens after the node at
 * which bucket k + GSLOT_LAG becomes ready (so GSLOT_LAG reductions are in flight behind backward), or at
 * the end of the pass for the last ones; the reduced part is then copied into the gradient shard. With
 * several micro-batches per step the gradients must accumulate locally before the single reduction (that
 * is what keeps ZeRO-2/3 bitwise equal to plain DP), so the full buffer is kept: gradient slots are used
 * only when sl_dp_opts.accum == 1.
 *
 * Note [Overlapped parameter gather]
 * Under ZeRO-1/2 the updated parameter parts are all-gathered in place after the optimizer step. The
 * gathers are launched asynchronously in the order the next forward pass reads the buckets (pfirst) and
 * each is waited for only just before the first node that reads it, so they overlap the next step's
 * forward (Megatron's overlap-param-gather). Anything that reads the weights between steps (checkpoint
 * state, sl_dp_gather_params) calls sl_dp_sync_params first; sl_dp_end_pass waits for any left.
 *
 * Both kinds of slot live in one arena. Offsets are static: greedy by size over the lifetimes (first
 * event, last use], like the activation planner; two slots share memory only when their lifetimes do not
 * overlap. The order of events after node i is: launch bucket reductions that became ready, complete the
 * reductions due (before their slot can be reused), launch parameter gathers, zero and bind gradient
 * slots, then wait for and bind the parameter gathers node i + 1 needs. */
#include <limits.h>

#include "parallel/dp_internal.h"

enum { Z3_GAP = 16, GSLOT_LAG = 2 };

static int param_of(const sl_dp *dp, sl_tensor *t) {
    t = sl_storage_root(t);
    if (!t || !(t->flags & SL_FLAG_PARAM)) return -1;
    for (int i = 0; i < dp->m->n_params; i++)
        if (dp->m->params[i].t == t) return i;
    return -1;
}

static int grad_of(const sl_dp *dp, sl_tensor *t) {
    t = sl_storage_root(t);
    if (!t || t->op != SL_OP_NONE) return -1;
    for (int i = 0; i < dp->m->n_params; i++)
        if (dp->m->params[i].t->grad == t) return i;
    return -1;
}

static int cmp_iv_s(const void *a, const void *b) {
    const z3_iv *x = a, *y = b;
    return x->S != y->S ? x->S - y->S : x->k - y->k;
}

typedef struct {
    int64_t size, off;
    int L, E; /* lifetime (L, E] */
} slot_req;

typedef struct {
    int64_t size;
    int idx;
} size_idx;
static int cmp_size_idx(const void *a, const void *b) {
    const size_idx *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    return x->idx - y->idx;
}

static int64_t round16(int64_t x) { return (x + 15) & ~(int64_t)15; }

/* greedy by size: each request gets the lowest offset clear of every placed request alive at the same time */
static sl_status place_slots(slot_req *v, int n, int64_t *total) {
    size_idx *order = malloc(sizeof(size_idx) * (size_t)(n + 1));
    int *placed = malloc(sizeof(int) * (size_t)(n + 1));
    if (!order || !placed) {
        free(order);
        free(placed);
        return sl_fail(SL_ERR_NOMEM, "dp: out of memory (slot plan)");
    }
    for (int j = 0; j < n; j++) order[j] = (size_idx){v[j].size, j};
    qsort(order, (size_t)n, sizeof(size_idx), cmp_size_idx);
    int np = 0;
    *total = 0;
    for (int a = 0; a < n; a++) {
        slot_req *x = &v[order[a].idx];
        int64_t off = 0;
        for (int moved = 1; moved;) {
            moved = 0;
            for (int c = 0; c < np; c++) {
                const slot_req *y = &v[placed[c]];
                if (x->L < y->E && y->L < x->E && off < y->off + y->size && y->off < off + x->size) {
                    off = y->off + y->size;
                    moved = 1;
                }
            }
        }
        x->off = off;
        if (off + x->size > *total) *total = off + x->size;
        placed[np++] = order[a].idx;
    }
    free(order);
    free(placed);
    return SL_OK;
}

/* index sorts without a global qsort context (ranks may be threads of one process) */
typedef struct {
    int key, key2, idx;
} key_idx;
static int cmp_key_idx(const void *a, const void *b) {
    const key_idx *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    if (x->key2 != y->key2) return x->key2 < y->key2 ? -1 : 1;
    return x->idx - y->idx;
}
/* out[j] = indices 0..n-1 ordered by (key, key2, index); v is scratch of n entries filled by the caller */
static void sort_indices(int *out, key_idx *v, int n) {
    qsort(v, (size_t)n, sizeof(key_idx), cmp_key_idx);
    for (int i = 0; i < n; i++) out[i] = v[i].idx;
}

/* parameter use intervals of every bucket (stage 3) */
static sl_status build_param_intervals(sl_dp *dp) {
    dp_z3 *z3 = &dp->slots.z3;
    const int *pbucket = dp->slots.param_bucket;
    int nb = dp->buckets.count, nn = sl_graph_n_nodes(dp->g), cap = 4 * nb + 16;
    int *last = malloc(sizeof(int) * (size_t)nb), *open = malloc(sizeof(int) * (size_t)nb);
    z3->iv = malloc(sizeof(z3_iv) * (size_t)cap);
    if (!last || !open || !z3->iv) goto oom;
    for (int k = 0; k < nb; k++) open[k] = -1, last[k] = INT_MIN / 2;
    for (int i = 0; i < nn; i++) {
        sl_tensor *t = sl_graph_node(dp->g, i);
        if (t->op == SL_OP_VIEW) continue; /* views compute nothing; their readers count */
        for (int s = 0; s < SL_MAX_SRC; s++) {
            int pi = t->src[s] ? param_of(dp, t->src[s]) : -1;
            int k = pi >= 0 ? pbucket[pi] : -1;
            if (k < 0 || last[k] == i) continue;
            if (open[k] >= 0 && i - last[k] <= Z3_GAP) {
                z3->iv[open[k]].E = i;
            } else {
                if (z3->count == cap) {
                    cap *= 2;
                    z3_iv *nv = realloc(z3->iv, sizeof(z3_iv) * (size_t)cap);
                    if (!nv) goto oom;
                    z3->iv = nv;
                }
                z3->iv[z3->count] = (z3_iv){.k = k, .S = i, .E = i};
                open[k] = z3->count++;
            }
            last[k] = i;
        }
    }
    qsort(z3->iv, (size_t)z3->count, sizeof(z3_iv), cmp_iv_s);
    for (int j = 0; j < z3->count; j++) z3->iv[j].L = j == 0 ? -1 : z3->iv[j - 1].S - 1;
    free(last);
    free(open);
    return SL_OK;
oom:
    free(last);
    free(open);
    return sl_fail(SL_ERR_NOMEM, "dp: out of memory (ZeRO-3 schedule)");
}

/* first node touching each bucket's gradients, and when its reduction is completed (gradient slots) */
static sl_status build_grad_intervals(sl_dp *dp) {
    dp_grad_slots *gs = &dp->slots.grad;
    const dp_bucket *bv = dp->buckets.v;
    int nb = dp->buckets.count, nn = sl_graph_n_nodes(dp->g);
    gs->v = malloc(sizeof(dp_grad_slot) * (size_t)(nb + 1));
    if (!gs->v) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    for (int k = 0; k < nb; k++) gs->v[k] = (dp_grad_slot){.gw0 = INT_MAX};
    for (int i = 0; i < nn; i++) {
        sl_tensor *t = sl_graph_node(dp->g, i);
        sl_tensor *touch[SL_MAX_SRC + 1];
        int nt = 0;
        if (t->view_src) touch[nt++] = t->view_src;
        for (int s = 0; s < SL_MAX_SRC; s++)
            if (t->src[s]) touch[nt++] = t->src[s];
        for (int a = 0; a < nt; a++) {
            int pi = grad_of(dp, touch[a]);
            int k = pi >= 0 ? dp->slots.param_bucket[pi] : -1;
            if (k >= 0 && i < gs->v[k].gw0) gs->v[k].gw0 = i;
        }
    }
    for (int k = 0; k < nb; k++) {
        dp_grad_slot *s = &gs->v[k];
        if (s->gw0 == INT_MAX) s->gw0 = bv[k].ready >= 0 ? bv[k].ready : nn; /* no gradient written: zeros */
        s->zero_after = s->gw0 - 1;
        s->done_after = k + GSLOT_LAG < nb ? bv[k + GSLOT_LAG].ready : nn;
        if (s->done_after < bv[k].ready) s->done_after = bv[k].ready;
    }
    return SL_OK;
}

/* bucket of every parameter, and the first node that reads each bucket's parameters */
static sl_status build_param_uses(sl_dp *dp) {
    const sl_model *m = dp->m;
    dp_slots *s = &dp->slots;
    int nb = dp->buckets.count, nn = sl_graph_n_nodes(dp->g);
    s->param_bucket = malloc(sizeof(int) * (size_t)(m->n_params + 1));
    s->pgather.pfirst = malloc(sizeof(int) * (size_t)(nb + 1));
    s->pgather.reqs = calloc((size_t)nb + 1, sizeof(sl_comm_req *));
    if (!s->param_bucket || !s->pgather.pfirst || !s->pgather.reqs)
        return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    for (int i = 0; i < m->n_params; i++) {
        s->param_bucket[i] = -1;
        for (int k = 0; k < nb; k++)
            if (m->params[i].offset >= dp->buckets.v[k].lo && m->params[i].offset < dp->buckets.v[k].hi)
                s->param_bucket[i] = k;
    }
    for (int k = 0; k < nb; k++) s->pgather.pfirst[k] = INT_MAX;
    for (int i = 0; i < nn; i++) {
        sl_tensor *t = sl_graph_node(dp->g, i);
        if (t->op == SL_OP_VIEW) continue;
        for (int j = 0; j < SL_MAX_SRC; j++) {
            int pi = t->src[j] ? param_of(dp, t->src[j]) : -1;
            int k = pi >= 0 ? s->param_bucket[pi] : -1;
            if (k >= 0 && i < s->pgather.pfirst[k]) s->pgather.pfirst[k] = i;
        }
    }
    return SL_OK;
}

/* static slot offsets for the ZeRO-3 intervals and the gradient slots (greedy by size over lifetimes) */
static sl_status plan_arena(sl_dp *dp) {
    dp_slots *s = &dp->slots;
    const dp_bucket *bv = dp->buckets.v;
    int nb = dp->buckets.count, nn = sl_graph_n_nodes(dp->g), niv = s->z3.count;
    int nreq = niv + (dp->grad_slots ? nb : 0);
    slot_req *v = malloc(sizeof(slot_req) * (size_t)(nreq + 1));
    if (!v) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    for (int j = 0; j < niv; j++) {
        const dp_bucket *b = &bv[s->z3.iv[j].k];
        v[j] = (slot_req){round16(b->hi - b->lo), 0, s->z3.iv[j].L, s->z3.iv[j].E};
    }
    if (dp->grad_slots)
        for (int k = 0; k < nb; k++) {
            const dp_grad_slot *g = &s->grad.v[k];
            v[niv + k] = (slot_req){round16(bv[k].hi - bv[k].lo), 0, g->zero_after,
                                    g->done_after < nn ? g->done_after : nn};
        }
    sl_status st = place_slots(v, nreq, &s->arena.len);
    if (st == SL_OK) {
        for (int j = 0; j < niv; j++) s->z3.iv[j].off = v[j].off;
        if (dp->grad_slots)
            for (int k = 0; k < nb; k++) s->grad.v[k].off = v[niv + k].off;
    }
    free(v);
    return st;
}

/* The arena: a backend buffer with a host mapping for the communicator calls. With peers it wraps a
 * symmetric window (collective: every rank computed the same size), so the slots' reduce-scatters and
 * all-gathers take the direct path (Note [Gradients in a window], dp.c). It also holds every parameter
 * (gradient) leaf at offset 0 before its slot binds it. */
static sl_status alloc_arena(sl_dp *dp) {
    dp_arena *a = &dp->slots.arena;
    sl_model *m = dp->m;
    int64_t n = a->len;
    if (dp->zero == 3 || dp->grad_slots) /* (no larger unless a bucket's parameters are never read) */
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].numel > n) n = m->params[i].numel;
    size_t bytes = f32_bytes(n + 16);
    if (dp->comm &&
        m->backend->caps.host_visible) { /* (staged ZeRO-1 reads no slot: Note [Staged gradients]) */
        SL_TRY(sl_comm_mem_alloc(dp->comm, bytes, (void **)&a->map));
        sl_status st = sl_backend_wrap_host(m->backend, a->map, bytes, &a->buf);
        if (st != SL_OK) {
            (void)sl_comm_mem_free(dp->comm, a->map);
            a->map = NULL;
        }
        return st;
    }
    if (sl_backend_alloc(m->backend, bytes, &a->buf) != SL_OK)
        return sl_fail(SL_ERR_NOMEM, "dp: out of memory (slots)");
    a->map = m->backend->caps.host_visible ? sl_buffer_map(a->buf) : NULL; /* Note [Staged gradients] */
    return SL_OK;
}

/* the event orders: intervals by L, gradient slots by zero_after, parameter gathers by pfirst */
static sl_status build_orders(sl_dp *dp) {
    dp_slots *s = &dp->slots;
    int nb = dp->buckets.count, niv = s->z3.count;
    s->z3.by_launch = malloc(sizeof(int) * (size_t)(niv + 1));
    s->pgather.by_pfirst = malloc(sizeof(int) * (size_t)(nb + 1));
    if (dp->grad_slots) s->grad.by_zero = malloc(sizeof(int) * (size_t)(nb + 1));
    key_idx *kv = malloc(sizeof(key_idx) * (size_t)(niv + nb + 1));
    if (!s->z3.by_launch || !s->pgather.by_pfirst || (dp->grad_slots && !s->grad.by_zero) || !kv) {
        free(kv);
        return sl_fail(SL_ERR_NOMEM, "dp: out of memory (slots)");
    }
    for (int j = 0; j < niv; j++) kv[j] = (key_idx){s->z3.iv[j].L, s->z3.iv[j].S, j};
    sort_indices(s->z3.by_launch, kv, niv);
    if (dp->grad_slots) {
        for (int k = 0; k < nb; k++) kv[k] = (key_idx){s->grad.v[k].zero_after, 0, k};
        sort_indices(s->grad.by_zero, kv, nb);
    }
    for (int k = 0; k < nb; k++) kv[k] = (key_idx){s->pgather.pfirst[k], 0, k};
    sort_indices(s->pgather.by_pfirst, kv, nb);
    free(kv);
    return SL_OK;
}

sl_status sl_dp_slots_build(sl_dp *dp) {
    sl_model *m = dp->m;
    SL_TRY(build_param_uses(dp));
    if (dp->zero == 3) SL_TRY(build_param_intervals(dp));
    if (dp->grad_slots) SL_TRY(build_grad_intervals(dp));
    SL_TRY(plan_arena(dp));
    SL_TRY(alloc_arena(dp));
    SL_TRY(build_orders(dp));
    /* until their interval binds them, leaves point into the arena (never read there) */
    for (int i = 0; i < m->n_params; i++) {
        if (dp->zero == 3) sl_tensor_bind_buffer(m->params[i].t, dp->slots.arena.buf, 0);
        if (dp->grad_slots) sl_tensor_bind_buffer(m->params[i].t->grad, dp->slots.arena.buf, 0);
    }
    sl_graph_refresh_views(dp->g);
    return SL_OK;
}

void sl_dp_slots_free(sl_dp *dp) {
    dp_slots *s = &dp->slots;
    for (int j = 0; j < s->z3.count; j++) sl_comm_req_free(s->z3.iv[j].req);
    free(s->z3.iv);
    free(s->z3.by_launch);
    free(s->grad.v);
    free(s->grad.by_zero);
    if (s->pgather.reqs)
        for (int k = 0; k < dp->buckets.count; k++) sl_comm_req_free(s->pgather.reqs[k]);
    free(s->pgather.reqs);
    free(s->pgather.pfirst);
    free(s->pgather.by_pfirst);
    free(s->param_bucket);
    sl_backend_free(dp->m->backend, s->arena.buf);
    if (dp->comm) (void)sl_comm_mem_free(dp->comm, s->arena.map);
    s->arena.buf = NULL;
    s->arena.map = NULL;
}

float *sl_dp_grad_slot(const sl_dp *dp, int k) { return dp->slots.arena.map + dp->slots.grad.v[k].off; }

/* bind bucket k's parameter (grad = 0) or gradient (grad = 1) leaves to the arena slot at element offset
 * slot (the bucket's first element) */
static void bind_bucket(sl_dp *dp, int k, int64_t slot, int grad) {
    for (int i = 0; i < dp->m->n_params; i++)
        if (dp->slots.param_bucket[i] == k) {
            sl_tensor *t = grad ? dp->m->params[i].t->grad : dp->m->params[i].t;
            sl_tensor_bind_buffer(t, dp->slots.arena.buf,
                                  f32_bytes(slot + (dp->m->params[i].offset - dp->buckets.v[k].lo)));
        }
}

/* gather bucket k from every rank's parameter shard into dst at element offset off (its full length):
 * the parts with an all-gather on the host mappings (a copy without peers), the tail with a copy */
static sl_status gather_bucket(sl_dp *dp, int k, sl_buffer *dst, int64_t off, sl_comm_req **req) {
    const dp_bucket *b = &dp->buckets.v[k];
    const dp_shard *s = &dp->shard;
    int64_t len = b->hi - b->lo, q = b->q, tail = len - q * bk_n(dp, b);
    if (q > 0) {
        if (bk_comm(dp, b)) dp_count_bk(dp, b, 1, q * bk_n(dp, b));
        if (bk_comm(dp, b) && !s->param) { /* staged (Note [Staged gradients]): finished by gather_done */
            float *w = dp->window.stage + b->lo;
            SL_TRY(
                sl_backend_copy_out(s->param_buf, f32_bytes(b->part_off), w + q * bk_r(dp, b), f32_bytes(q)));
            SL_TRY(sl_comm_all_gather_async(bk_comm(dp, b), w + q * bk_r(dp, b), w, (size_t)q, SL_COMM_F32,
                                            req));
        } else if (bk_comm(dp, b))
            SL_TRY(sl_comm_all_gather_async(bk_comm(dp, b), s->param + b->part_off,
                                            (float *)sl_buffer_map(dst) + off, (size_t)q, SL_COMM_F32, req));
        else
            SL_TRY(sl_backend_copy(dst, f32_bytes(off), s->param_buf, f32_bytes(b->part_off), f32_bytes(q)));
    }
    if (tail > 0)
        SL_TRY(sl_backend_copy(dst, f32_bytes(off + q * bk_n(dp, b)), s->param_buf, f32_bytes(b->tail_off),
                               f32_bytes(tail)));
    return SL_OK;
}

/* wait for bucket k's gather into dst at off; staged, its parts then go from the window to the device */
static sl_status gather_done(sl_dp *dp, int k, sl_buffer *dst, int64_t off, sl_comm_req **req) {
    SL_TRY(dp_wait_req(req));
    const dp_bucket *b = &dp->buckets.v[k];
    if (dp->shard.param || !bk_comm(dp, b) || b->q <= 0) return SL_OK;
    return sl_backend_copy_in(dst, f32_bytes(off), dp->window.stage + b->lo, f32_bytes(b->q * bk_n(dp, b)));
}

/* gradient slots: wait for bucket k's reduction and copy this rank's reduced part and the tail to the shard
 */
static sl_status complete_grad(sl_dp *dp, int k) {
    SL_TRY(sl_dp_reduce_wait(dp, k));
    const dp_bucket *b = &dp->buckets.v[k];
    sl_buffer *arena = dp->slots.arena.buf, *shard = dp->shard.grad_buf;
    int64_t slot = dp->slots.grad.v[k].off, len = b->hi - b->lo, q = b->q, tail = len - q * bk_n(dp, b);
    SL_TRY(sl_backend_copy(shard, f32_bytes(b->part_off), arena, f32_bytes(slot + q * bk_r(dp, b)),
                           f32_bytes(q)));
    if (tail > 0)
        SL_TRY(sl_backend_copy(shard, f32_bytes(b->tail_off), arena, f32_bytes(slot + q * bk_n(dp, b)),
                               f32_bytes(tail)));
    return SL_OK;
}

/* event 0: ZeRO-1/2 parameters node i + 1 reads must have been gathered */
static sl_status wait_param_gathers(sl_dp *dp, int i) {
    dp_param_gathers *pg = &dp->slots.pgather;
    if (!pg->in_flight) return SL_OK;
    while (pg->next_wait < dp->buckets.count && pg->pfirst[pg->by_pfirst[pg->next_wait]] <= i + 1) {
        int k = pg->by_pfirst[pg->next_wait++];
        double t0 = sl_time_sec();
        SL_TRY(dp_wait_req(&pg->reqs[k]));
        dp->reduce.wait_sec += sl_time_sec() - t0;
    }
    return SL_OK;
}

sl_status sl_dp_slots_advance(sl_dp *dp, int i) {
    dp_slots *s = &dp->slots;
    dp_z3 *z3 = &s->z3;
    dp_grad_slots *gs = &s->grad;
    /* 0. ZeRO-1/2: parameters node i + 1 reads must have been gathered */
    SL_TRY(wait_param_gathers(dp, i));
    /* 1. bucket reductions whose gradients are final */
    SL_TRY(sl_dp_reduce_ready(dp, i));
    /* 2. reductions due (their slot may be reused from here on) */
    if (dp->grad_slots)
        while (gs->next_done < dp->reduce.next_launch && gs->v[gs->next_done].done_after <= i)
            SL_TRY(complete_grad(dp, gs->next_done++));
    /* 3. parameter gathers (prefetch) */
    while (z3->next_launch < z3->count && z3->iv[z3->by_launch[z3->next_launch]].L <= i) {
        z3_iv *z = &z3->iv[z3->by_launch[z3->next_launch++]];
        if (z->S >= s->pass_end) continue;
        SL_TRY(gather_bucket(dp, z->k, s->arena.buf, z->off, &z->req));
        z->launched = 1;
    }
    int bound = 0;
    /* 4. gradient slots about to be written: zero and bind */
    if (dp->grad_slots)
        while (gs->next_zero < dp->buckets.count && gs->v[gs->by_zero[gs->next_zero]].zero_after <= i) {
            int k = gs->by_zero[gs->next_zero++];
            const dp_grad_slot *g = &gs->v[k];
            if (g->gw0 >= s->pass_end) continue;
            SL_TRY(sl_backend_memset_zero(s->arena.buf, f32_bytes(g->off),
                                          f32_bytes(dp->buckets.v[k].hi - dp->buckets.v[k].lo)));
            bind_bucket(dp, k, g->off, 1);
            bound = 1;
        }
    /* 5. parameters node i + 1 reads */
    while (z3->next_use < z3->count && z3->iv[z3->next_use].S <= i + 1) {
        z3_iv *z = &z3->iv[z3->next_use++];
        if (z->S >= s->pass_end) continue;
        if (!z->launched)
            return sl_fail(SL_ERR_INTERNAL, "dp: ZeRO-3 gather of bucket %d never launched", z->k);
        double t0 = sl_time_sec();
        z->launched = 0;
        SL_TRY(gather_done(dp, z->k, s->arena.buf, z->off, &z->req));
        dp->reduce.wait_sec += sl_time_sec() - t0;
        bind_bucket(dp, z->k, z->off, 0);
        bound = 1;
    }
    if (bound) sl_graph_refresh_views(dp->g);
    return SL_OK;
}

sl_status sl_dp_slots_finish(sl_dp *dp) {
    dp_grad_slots *gs = &dp->slots.grad;
    while (gs->next_done < dp->buckets.count) SL_TRY(complete_grad(dp, gs->next_done++));
    return SL_OK;
}

void sl_dp_reshard_params(sl_dp *dp) {
    if (!dp->slots.z3.materialized) return;
    sl_model_drop_params(dp->m);
    dp->slots.z3.materialized = 0;
}

sl_status sl_dp_begin_pass(sl_dp *dp, int end) {
    dp_slots *s = &dp->slots;
    sl_dp_reshard_params(dp);
    s->z3.next_launch = s->z3.next_use = 0;
    s->grad.next_zero = s->grad.next_done = 0;
    s->pgather.next_wait = 0;
    sl_dp_reduce_restart(dp);
    s->pass_end = end;
    return sl_dp_slots_advance(dp, -1);
}

sl_status sl_dp_sync_params(sl_dp *dp) {
    dp_param_gathers *pg = &dp->slots.pgather;
    sl_status st = SL_OK;
    if (!pg->in_flight) return st;
    double t0 = sl_time_sec();
    for (int k = 0; k < dp->buckets.count; k++) {
        sl_status s = dp_wait_req(&pg->reqs[k]);
        if (st == SL_OK) st = s;
    }
    dp->reduce.wait_sec += sl_time_sec() - t0;
    pg->in_flight = 0;
    return st;
}

sl_status sl_dp_launch_param_gathers(sl_dp *dp) {
    dp_param_gathers *pg = &dp->slots.pgather;
    float *p = dp->m->params_mem; /* the communicator's host mapping of m->params_buf */
    for (int j = 0; j < dp->buckets.count; j++) {
        int k = pg->by_pfirst[j];
        const dp_bucket *b = &dp->buckets.v[k];
        if (b->q > 0) dp_count_bk(dp, b, 1, b->q * bk_n(dp, b));
        if (b->q > 0 && bk_comm(dp, b))
            SL_TRY(sl_comm_all_gather_async(bk_comm(dp, b), p + b->lo + b->q * bk_r(dp, b), p + b->lo,
                                            (size_t)b->q, SL_COMM_F32, &pg->reqs[k]));
    }
    pg->in_flight = 1;
    return SL_OK;
}

sl_status sl_dp_end_pass(sl_dp *dp) {
    dp_z3 *z3 = &dp->slots.z3;
    sl_status st = sl_dp_sync_params(dp);
    for (int j = 0; j < z3->count; j++)
        if (z3->iv[j].launched) {
            z3->iv[j].launched = 0;
            sl_status s = dp_wait_req(&z3->iv[j].req);
            if (st == SL_OK) st = s;
        }
    return st;
}

sl_status sl_dp_gather_params(sl_dp *dp) {
    if (dp->zero != 3) return sl_dp_sync_params(dp);
    if (dp->slots.z3.materialized) return SL_OK;
    sl_model *m = dp->m;
    if (sl_model_new_params(m) != SL_OK)
        return sl_fail(SL_ERR_NOMEM, "dp: cannot allocate %lld parameters", (long long)m->numel);
    sl_status st = SL_OK;
    for (int k = 0; k < dp->buckets.count && st == SL_OK; k++) {
        sl_comm_req *req = NULL;
        st = gather_bucket(dp, k, m->params_buf, dp->buckets.v[k].lo, &req);
        sl_status s =
            st == SL_OK ? gather_done(dp, k, m->params_buf, dp->buckets.v[k].lo, &req) : dp_wait_req(&req);
        if (st == SL_OK) st = s;
    }
    sl_graph_refresh_views(dp->g); /* sl_model_new_params bound the leaves */
    dp->slots.z3.materialized = 1;
    return st;
}

float *sl_dp_param_shard(sl_dp *dp) { return dp->zero == 3 ? dp->shard.param : NULL; }
sl_buffer *sl_dp_param_shard_buf(sl_dp *dp) { return dp->zero == 3 ? dp->shard.param_buf : NULL; }
int sl_dp_grad_slots(const sl_dp *dp) { return dp->grad_slots; }
