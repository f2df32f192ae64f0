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
#include <string.h>

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
static sl_status build_param_intervals(sl_dp *dp, sl_graph *g) {
    int nn = sl_graph_n_nodes(g), cap = 4 * dp->nb + 16;
    int *last = malloc(sizeof(int) * (size_t)dp->nb), *open = malloc(sizeof(int) * (size_t)dp->nb);
    dp->iv = malloc(sizeof(z3_iv) * (size_t)cap);
    if (!last || !open || !dp->iv) goto oom;
    for (int k = 0; k < dp->nb; k++) open[k] = -1, last[k] = INT_MIN / 2;
    for (int i = 0; i < nn; i++) {
        sl_tensor *t = sl_graph_node(g, i);
        if (t->op == SL_OP_VIEW) continue; /* views compute nothing; their readers count */
        for (int s = 0; s < SL_MAX_SRC; s++) {
            int pi = t->src[s] ? param_of(dp, t->src[s]) : -1;
            int k = pi >= 0 ? dp->pbucket[pi] : -1;
            if (k < 0 || last[k] == i) continue;
            if (open[k] >= 0 && i - last[k] <= Z3_GAP) {
                dp->iv[open[k]].E = i;
            } else {
                if (dp->niv == cap) {
                    cap *= 2;
                    z3_iv *nv = realloc(dp->iv, sizeof(z3_iv) * (size_t)cap);
                    if (!nv) goto oom;
                    dp->iv = nv;
                }
                dp->iv[dp->niv] = (z3_iv){.k = k, .S = i, .E = i};
                open[k] = dp->niv++;
            }
            last[k] = i;
        }
    }
    qsort(dp->iv, (size_t)dp->niv, sizeof(z3_iv), cmp_iv_s);
    for (int j = 0; j < dp->niv; j++) dp->iv[j].L = j == 0 ? -1 : dp->iv[j - 1].S - 1;
    free(last);
    free(open);
    return SL_OK;
oom:
    free(last);
    free(open);
    return sl_fail(SL_ERR_NOMEM, "dp: out of memory (ZeRO-3 schedule)");
}

/* first node touching each bucket's gradients, and when its reduction is completed (gradient slots) */
static void build_grad_intervals(sl_dp *dp, sl_graph *g) {
    int nn = sl_graph_n_nodes(g);
    for (int k = 0; k < dp->nb; k++) dp->b[k].gw0 = INT_MAX;
    for (int i = 0; i < nn; i++) {
        sl_tensor *t = sl_graph_node(g, i);
        sl_tensor *touch[SL_MAX_SRC + 1];
        int nt = 0;
        if (t->view_src) touch[nt++] = t->view_src;
        for (int s = 0; s < SL_MAX_SRC; s++)
            if (t->src[s]) touch[nt++] = t->src[s];
        for (int a = 0; a < nt; a++) {
            int pi = grad_of(dp, touch[a]);
            int k = pi >= 0 ? dp->pbucket[pi] : -1;
            if (k >= 0 && i < dp->b[k].gw0) dp->b[k].gw0 = i;
        }
    }
    for (int k = 0; k < dp->nb; k++) {
        bucket *b = &dp->b[k];
        if (b->gw0 == INT_MAX) b->gw0 = b->ready >= 0 ? b->ready : nn; /* no gradient written: zeros */
        b->gz = b->gw0 - 1;
        b->gdone = k + GSLOT_LAG < dp->nb ? dp->b[k + GSLOT_LAG].ready : nn;
        if (b->gdone < b->ready) b->gdone = b->ready;
    }
}

sl_status sl_dp_slots_build(sl_dp *dp, sl_graph *g) {
    sl_model *m = dp->m;
    int nn = sl_graph_n_nodes(g);
    dp->g = g;
    dp->pbucket = malloc(sizeof(int) * (size_t)(m->n_params + 1));
    if (!dp->pbucket) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    for (int i = 0; i < m->n_params; i++) {
        dp->pbucket[i] = -1;
        for (int k = 0; k < dp->nb; k++)
            if (m->params[i].offset >= dp->b[k].lo && m->params[i].offset < dp->b[k].hi) dp->pbucket[i] = k;
    }
    for (int k = 0; k < dp->nb; k++) dp->b[k].pfirst = INT_MAX;
    for (int i = 0; i < nn; i++) {
        sl_tensor *t = sl_graph_node(g, i);
        if (t->op == SL_OP_VIEW) continue;
        for (int s = 0; s < SL_MAX_SRC; s++) {
            int pi = t->src[s] ? param_of(dp, t->src[s]) : -1;
            int k = pi >= 0 ? dp->pbucket[pi] : -1;
            if (k >= 0 && i < dp->b[k].pfirst) dp->b[k].pfirst = i;
        }
    }
    if (dp->zero == 3) SL_TRY(build_param_intervals(dp, g));
    if (dp->gslots) build_grad_intervals(dp, g);
    int nreq = dp->niv + (dp->gslots ? dp->nb : 0);
    slot_req *v = malloc(sizeof(slot_req) * (size_t)(nreq + 1));
    if (!v) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    for (int j = 0; j < dp->niv; j++) {
        const bucket *b = &dp->b[dp->iv[j].k];
        v[j] = (slot_req){round16(b->hi - b->lo), 0, dp->iv[j].L, dp->iv[j].E};
    }
    if (dp->gslots)
        for (int k = 0; k < dp->nb; k++)
            v[dp->niv + k] = (slot_req){round16(dp->b[k].hi - dp->b[k].lo), 0, dp->b[k].gz,
                                        dp->b[k].gdone < nn ? dp->b[k].gdone : nn};
    sl_status st = place_slots(v, nreq, &dp->arena_len);
    if (st == SL_OK) {
        for (int j = 0; j < dp->niv; j++) dp->iv[j].off = v[j].off;
        if (dp->gslots)
            for (int k = 0; k < dp->nb; k++) dp->b[k].goff = v[dp->niv + k].off;
    }
    free(v);
    SL_TRY(st);
    /* a symmetric window when there are peers (collective: every rank computed the same arena_len), so
     * the slots' reduce-scatters and all-gathers take the direct path (Note [Gradients in a window], dp.c) */
    if (dp->comm)
        SL_TRY(
            sl_comm_mem_alloc(dp->comm, sizeof(float) * (size_t)(dp->arena_len + 16), (void **)&dp->arena));
    else
        dp->arena = sl_malloc_aligned(sizeof(float) * (size_t)(dp->arena_len + 16));
    dp->by_l = malloc(sizeof(int) * (size_t)(dp->niv + 1));
    dp->by_gz = malloc(sizeof(int) * (size_t)(dp->nb + 1));
    dp->by_pf = malloc(sizeof(int) * (size_t)(dp->nb + 1));
    if (!dp->by_l || !dp->by_gz || !dp->by_pf || !dp->arena)
        return sl_fail(SL_ERR_NOMEM, "dp: out of memory (slots)");
    key_idx *kv = malloc(sizeof(key_idx) * (size_t)(dp->niv + dp->nb + 1));
    if (!kv) return sl_fail(SL_ERR_NOMEM, "dp: out of memory (slots)");
    for (int j = 0; j < dp->niv; j++) kv[j] = (key_idx){dp->iv[j].L, dp->iv[j].S, j};
    sort_indices(dp->by_l, kv, dp->niv);
    for (int k = 0; k < dp->nb; k++) kv[k] = (key_idx){dp->b[k].gz, 0, k};
    sort_indices(dp->by_gz, kv, dp->nb);
    for (int k = 0; k < dp->nb; k++) kv[k] = (key_idx){dp->b[k].pfirst, 0, k};
    sort_indices(dp->by_pf, kv, dp->nb);
    free(kv);
    /* until their interval binds them, leaves point into the arena (never read there) */
    for (int i = 0; i < m->n_params; i++) {
        if (dp->zero == 3) sl_tensor_bind(m->params[i].t, dp->arena);
        if (dp->gslots) sl_tensor_bind(m->params[i].t->grad, dp->arena);
    }
    sl_graph_refresh_views(g);
    return SL_OK;
}

void sl_dp_slots_free(sl_dp *dp) {
    for (int j = 0; j < dp->niv; j++) sl_comm_req_free(dp->iv[j].req);
    free(dp->iv);
    free(dp->by_l);
    free(dp->by_gz);
    free(dp->by_pf);
    free(dp->pbucket);
    if (dp->comm)
        (void)sl_comm_mem_free(dp->comm, dp->arena);
    else
        sl_free_aligned(dp->arena);
    dp->arena = NULL;
}

/* bind bucket k's parameter (grad = 0) or gradient (grad = 1) leaves to `base` (the bucket's first element)
 */
static void bind_bucket(sl_dp *dp, int k, float *base, int grad) {
    for (int i = 0; i < dp->m->n_params; i++)
        if (dp->pbucket[i] == k) {
            sl_tensor *t = grad ? dp->m->params[i].t->grad : dp->m->params[i].t;
            sl_tensor_bind(t, base + (dp->m->params[i].offset - dp->b[k].lo));
        }
}

/* gather bucket b from every rank's parameter shard into dst (its full length) */
static sl_status gather_bucket(sl_dp *dp, const bucket *b, float *dst, sl_comm_req **req) {
    int64_t len = b->hi - b->lo, q = b->q, tail = len - q * dp->n;
    if (q > 0) {
        if (dp->comm)
            SL_TRY(
                sl_comm_all_gather_async(dp->comm, dp->pshard + b->soff, dst, (size_t)q, SL_COMM_F32, req));
        else
            memcpy(dst, dp->pshard + b->soff, sizeof(float) * (size_t)q);
    }
    if (tail > 0) memcpy(dst + q * dp->n, dp->pshard + b->toff, sizeof(float) * (size_t)tail);
    return SL_OK;
}

static sl_status wait_req(sl_comm_req **r) {
    sl_status st = SL_OK;
    if (*r) st = sl_comm_wait(*r);
    *r = NULL;
    return st;
}

/* gradient slots: wait for bucket b's reduction and copy this rank's reduced part and the tail to the shard
 */
static sl_status complete_grad(sl_dp *dp, bucket *b) {
    double t0 = sl_time_sec();
    sl_status st = wait_req(&b->req), st2 = wait_req(&b->req_tail);
    dp->wait_sec += sl_time_sec() - t0;
    SL_TRY(st);
    SL_TRY(st2);
    const float *slot = dp->arena + b->goff;
    int64_t len = b->hi - b->lo, q = b->q, tail = len - q * dp->n;
    memcpy(dp->gshard + b->soff, slot + q * dp->r, sizeof(float) * (size_t)q);
    if (tail > 0) memcpy(dp->gshard + b->toff, slot + q * dp->n, sizeof(float) * (size_t)tail);
    return SL_OK;
}

sl_status sl_dp_slots_advance(sl_dp *dp, int i) {
    /* 0. ZeRO-1/2: parameters node i + 1 reads must have been gathered */
    if (dp->pgather)
        while (dp->cpf < dp->nb && dp->b[dp->by_pf[dp->cpf]].pfirst <= i + 1) {
            bucket *b = &dp->b[dp->by_pf[dp->cpf++]];
            double t0 = sl_time_sec();
            SL_TRY(wait_req(&b->preq));
            dp->wait_sec += sl_time_sec() - t0;
        }
    /* 1. bucket reductions whose gradients are final */
    if (dp->armed || dp->gslots)
        while (dp->next < dp->nb && dp->b[dp->next].ready <= i)
            SL_TRY(sl_dp_launch_bucket(dp, &dp->b[dp->next++]));
    /* 2. reductions due (their slot may be reused from here on) */
    if (dp->gslots)
        while (dp->cgd < dp->next && dp->b[dp->cgd].gdone <= i) SL_TRY(complete_grad(dp, &dp->b[dp->cgd++]));
    /* 3. parameter gathers (prefetch) */
    while (dp->cl < dp->niv && dp->iv[dp->by_l[dp->cl]].L <= i) {
        z3_iv *z = &dp->iv[dp->by_l[dp->cl++]];
        if (z->S >= dp->range_end) continue;
        SL_TRY(gather_bucket(dp, &dp->b[z->k], dp->arena + z->off, &z->req));
        z->launched = 1;
    }
    int bound = 0;
    /* 4. gradient slots about to be written: zero and bind */
    if (dp->gslots)
        while (dp->cgz < dp->nb && dp->b[dp->by_gz[dp->cgz]].gz <= i) {
            int k = dp->by_gz[dp->cgz++];
            bucket *b = &dp->b[k];
            if (b->gw0 >= dp->range_end) continue;
            memset(dp->arena + b->goff, 0, sizeof(float) * (size_t)(b->hi - b->lo));
            bind_bucket(dp, k, dp->arena + b->goff, 1);
            bound = 1;
        }
    /* 5. parameters node i + 1 reads */
    while (dp->cs < dp->niv && dp->iv[dp->cs].S <= i + 1) {
        z3_iv *z = &dp->iv[dp->cs++];
        if (z->S >= dp->range_end) continue;
        if (!z->launched)
            return sl_fail(SL_ERR_INTERNAL, "dp: ZeRO-3 gather of bucket %d never launched", z->k);
        double t0 = sl_time_sec();
        z->launched = 0;
        SL_TRY(wait_req(&z->req));
        dp->wait_sec += sl_time_sec() - t0;
        bind_bucket(dp, z->k, dp->arena + z->off, 0);
        bound = 1;
    }
    if (bound) sl_graph_refresh_views(dp->g);
    return SL_OK;
}

sl_status sl_dp_slots_finish(sl_dp *dp) {
    while (dp->cgd < dp->nb) SL_TRY(complete_grad(dp, &dp->b[dp->cgd++]));
    return SL_OK;
}

sl_status sl_dp_begin_pass(sl_dp *dp, int end) {
    if (dp->materialized) {
        sl_model_drop_params(dp->m);
        dp->materialized = 0;
    }
    dp->cl = dp->cs = dp->cgz = dp->cgd = dp->cpf = dp->next = 0;
    dp->range_end = end;
    return sl_dp_slots_advance(dp, -1);
}

sl_status sl_dp_sync_params(sl_dp *dp) {
    sl_status st = SL_OK;
    if (!dp->pgather) return st;
    double t0 = sl_time_sec();
    for (int k = 0; k < dp->nb; k++) {
        sl_status s = wait_req(&dp->b[k].preq);
        if (st == SL_OK) st = s;
    }
    dp->wait_sec += sl_time_sec() - t0;
    dp->pgather = 0;
    return st;
}

sl_status sl_dp_launch_param_gathers(sl_dp *dp) {
    float *p = dp->m->params_mem;
    for (int j = 0; j < dp->nb; j++) {
        bucket *b = &dp->b[dp->by_pf[j]];
        if (b->q > 0)
            SL_TRY(sl_comm_all_gather_async(dp->comm, p + b->lo + b->q * dp->r, p + b->lo, (size_t)b->q,
                                            SL_COMM_F32, &b->preq));
    }
    dp->pgather = 1;
    return SL_OK;
}

sl_status sl_dp_end_pass(sl_dp *dp) {
    sl_status st = sl_dp_sync_params(dp);
    for (int j = 0; j < dp->niv; j++)
        if (dp->iv[j].launched) {
            dp->iv[j].launched = 0;
            sl_status s = wait_req(&dp->iv[j].req);
            if (st == SL_OK) st = s;
        }
    return st;
}

sl_status sl_dp_gather_params(sl_dp *dp) {
    if (dp->zero != 3) return sl_dp_sync_params(dp);
    if (dp->materialized) return SL_OK;
    sl_model *m = dp->m;
    if (sl_model_new_params(m) != SL_OK)
        return sl_fail(SL_ERR_NOMEM, "dp: cannot allocate %lld parameters", (long long)m->numel);
    sl_status st = SL_OK;
    for (int k = 0; k < dp->nb && st == SL_OK; k++) {
        sl_comm_req *req = NULL;
        st = gather_bucket(dp, &dp->b[k], m->params_mem + dp->b[k].lo, &req);
        sl_status s = wait_req(&req);
        if (st == SL_OK) st = s;
    }
    sl_graph_refresh_views(dp->g); /* sl_model_new_params bound the leaves */
    dp->materialized = 1;
    return st;
}

float *sl_dp_param_shard(sl_dp *dp) { return dp->zero == 3 ? dp->pshard : NULL; }
int sl_dp_grad_slots(const sl_dp *dp) { return dp->gslots; }
