/* Data parallelism: bucketed gradient reduction overlapped with backward, ZeRO-1/2/3 sharding.
 *
 * Note [DP buckets and shards]
 * Buckets are contiguous slices of the flat gradient buffer, built from the end of the buffer (the last
 * layers, whose gradients backward finishes first) towards the start, each closed once it holds
 * `bucket_elems`. A bucket is ready after the last node that writes any of its parameters' gradients
 * (sl_graph_last_grad_write); the executor hook launches its reduction then.
 * Under ZeRO, each bucket of length len is split into n equal parts of q = len / n elements; rank r owns
 * part r of every bucket, and the tail (len - n*q < n elements) is reduced with an all-reduce and owned
 * by every rank (updated identically). So the reduce-scatter / all-gather calls always have equal counts,
 * and a rank's shard is the concatenation of its parts: about numel / n elements.
 * Determinism: every reduction sums ranks in a fixed order (with SUANLI_COMM_ALGO=direct: rank 0, 1, ...,
 * the order a single process accumulates micro-batches in), and the gradient norm is always summed per
 * rank part then over ranks, so stages 0-3 produce bitwise-identical parameters. ZeRO-3 and gradient slots:
 * see zero_slots.c.
 */
#include <math.h>

#include "parallel/dp_internal.h"

static int cmp_ready(const void *a, const void *b) {
    const dp_bucket *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return x->lo < y->lo ? 1 : -1;
}

/* iterate this rank's shard: for each bucket, its part then the tail */
typedef void (*seg_fn)(void *u, int64_t flat_lo, int64_t len, int64_t shard_off);
static void for_each_segment(const sl_dp *dp, seg_fn fn, void *u) {
    int64_t off = 0;
    for (int k = 0; k < dp->buckets.count; k++) {
        const dp_bucket *b = &dp->buckets.v[k];
        int64_t len = b->hi - b->lo, q = b->q, tail = len - q * bk_n(dp, b);
        if (q > 0) {
            fn(u, b->lo + q * bk_r(dp, b), q, off);
            off += q;
        }
        if (tail > 0) {
            fn(u, b->lo + q * bk_n(dp, b), tail, off);
            off += tail;
        }
    }
}

static void count_seg(void *u, int64_t lo, int64_t len, int64_t off) {
    (void)lo;
    (void)off;
    *(int64_t *)u += len;
}

/* Note [Gradients in a window]
 * With peers, the flat gradient buffer (m->grads_mem) moves into a symmetric window
 * (sl_comm_mem_alloc) for DP's lifetime, and so does the slot arena (zero_slots.c): every rank's
 * buckets then lie at the same offsets of the same window, and on shm the bucket all-reduces and
 * reduce-scatters read the peers' gradients in place (src/comm/algo/sym.c) instead of copying them
 * through the transport. Over tcp/mpi the window is private memory and nothing changes. Results: for
 * 2 ranks bitwise those of the ring, for more those of SUANLI_COMM_ALGO=direct (rank order), for
 * all-reduce and reduce-scatter alike, so ZeRO stages still match plain DP bitwise. sl_dp_free moves
 * the gradients back into private memory (the model owns and frees m->grads_mem); it must run while
 * the communicator and the graph still exist. */
static sl_status grads_to_window(sl_dp *dp, sl_graph *g) {
    sl_model *m = dp->m;
    size_t bytes = sizeof(float) * (size_t)m->numel;
    float *w = NULL;
    sl_buffer *wb = NULL;
    SL_TRY(sl_comm_mem_alloc(dp->comm, bytes, (void **)&w));
    sl_status st = sl_backend_wrap_host(m->backend, w, bytes, &wb);
    if (st == SL_OK) st = sl_backend_copy(wb, 0, m->grads_buf, 0, bytes);
    if (st == SL_OK) st = sl_model_adopt_grads(m, wb);
    if (st != SL_OK) {
        sl_backend_free(m->backend, wb);
        (void)sl_comm_mem_free(dp->comm, w);
        return st;
    }
    sl_graph_refresh_views(g);
    dp->window.grads = w;
    return SL_OK;
}

static void grads_from_window(sl_dp *dp) {
    if (!dp->window.grads) return;
    sl_model *m = dp->m;
    sl_buffer *p = NULL;
    if (sl_backend_alloc(m->backend, sizeof(float) * (size_t)m->numel, &p) == SL_OK)
        (void)sl_backend_copy(p, 0, m->grads_buf, 0, sizeof(float) * (size_t)m->numel);
    (void)sl_model_adopt_grads(m, p); /* NULL if that failed: nothing trains after DP */
    sl_graph_refresh_views(dp->g);
    (void)sl_comm_mem_free(dp->comm, dp->window.grads);
    dp->window.grads = NULL;
}

/* A host-mapped f32 buffer of n elements on the model's backend (data parallelism keeps its shards in
 * host-visible memory: the communicator moves host bytes). map may be NULL: no host mapping needed. */
static sl_status host_buf(sl_dp *dp, int64_t n, sl_buffer **buf, float **map) {
    if (sl_backend_alloc(dp->m->backend, f32_bytes(n > 0 ? n : 1), buf) != SL_OK)
        return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    if (map) *map = dp->m->backend->caps.host_visible ? sl_buffer_map(*buf) : NULL; /* staged: copies */
    return SL_OK;
}

/* the bucket plan: buckets walked from the end of the flat buffer, sorted by ready, with their part lengths
 * and (ZeRO) the shard offsets of their parts and tails, in for_each_segment order */
static sl_status build_buckets(sl_dp *dp, sl_graph *g, int64_t bucket_elems) {
    const sl_model *m = dp->m;
    dp_buckets *bs = &dp->buckets;
    bs->v = calloc((size_t)m->n_params + 1, sizeof(dp_bucket));
    if (!bs->v) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    int64_t hi = m->numel;
    int ready = -1;
    for (int i = m->n_params - 1; i >= 0; i--) {
        const sl_param_info *p = &m->params[i];
        int w = dp->ready ? dp->ready(dp->ready_user, p->t) : sl_graph_last_grad_write(g, p->t);
        if (w > ready) ready = w;
        /* a bucket holds expert parameters only or none (their groups differ) */
        int close = i == 0 || m->params[i - 1].expert != p->expert;
        if (hi - p->offset >= bucket_elems || close) {
            bs->v[bs->count++] = (dp_bucket){.lo = p->offset, .hi = hi, .ready = ready, .expert = p->expert};
            hi = p->offset;
            ready = -1;
        }
    }
    for (int k = 0; k < bs->count; k++)
        bs->v[k].q = dp->zero ? (bs->v[k].hi - bs->v[k].lo) / bk_n(dp, &bs->v[k]) : 0;
    qsort(bs->v, (size_t)bs->count, sizeof(dp_bucket), cmp_ready);
    if (dp->zero) {
        int64_t off = 0;
        for (int k = 0; k < bs->count; k++) {
            dp_bucket *b = &bs->v[k];
            int64_t len = b->hi - b->lo, tail = len - b->q * bk_n(dp, b);
            b->part_off = off;
            off += b->q;
            b->tail_off = off;
            if (tail > 0) off += tail;
        }
    }
    return SL_OK;
}

/* the sharded optimizer state; under stage 3 this rank's parameters are copied into its parameter shard */
static sl_status alloc_shard(sl_dp *dp) {
    sl_model *m = dp->m;
    dp_shard *s = &dp->shard;
    if (dp->zero)
        for_each_segment(dp, count_seg, &s->len);
    else
        s->len = m->numel;
    /* moments come zero-filled */
    SL_TRY(host_buf(dp, s->len, &s->m1_buf, &s->m1));
    SL_TRY(host_buf(dp, s->len, &s->m2_buf, &s->m2));
    if (dp->zero >= 2) SL_TRY(host_buf(dp, s->len, &s->grad_buf, NULL));
    if (dp->zero == 3) {
        SL_TRY(host_buf(dp, s->len + 1, &s->param_buf, &s->param));
        for (int k = 0; k < dp->buckets.count; k++) {
            const dp_bucket *b = &dp->buckets.v[k];
            int64_t len = b->hi - b->lo, tail = len - b->q * bk_n(dp, b);
            SL_TRY(sl_backend_copy(s->param_buf, f32_bytes(b->part_off), m->params_buf,
                                   f32_bytes(b->lo + b->q * bk_r(dp, b)), f32_bytes(b->q)));
            if (tail > 0)
                SL_TRY(sl_backend_copy(s->param_buf, f32_bytes(b->tail_off), m->params_buf,
                                       f32_bytes(b->lo + b->q * bk_n(dp, b)), f32_bytes(tail)));
        }
    }
    return SL_OK;
}

sl_status sl_dp_new(sl_dp **out, const sl_mesh *mesh, sl_model *m, sl_graph *g, const sl_dp_opts *o) {
    *out = NULL;
    if (o->zero_stage < 0 || o->zero_stage > 3)
        return sl_fail(SL_ERR_INVALID, "--zero-stage %d: must be 0, 1, 2 or 3", o->zero_stage);
    if (m->pp > 1 && o->zero_stage == 3) /* its gathers are scheduled in one graph's forward */
        return sl_fail(
            SL_ERR_UNSUPPORTED,
            "--zero-stage 3 with --pipeline-model-parallel-size %d is not supported (use 0, 1 or 2)", m->pp);
    sl_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    dp->comm = mesh->dp_comm;
    dp->tp_comm = m->tp > 1 ? mesh->tp_comm : NULL;
    dp->pp_comm = m->pp > 1 ? mesh->pp_comm : NULL;
    dp->n = mesh->dp;
    dp->r = mesh->dp_rank;
    dp->en = m->ep > 1 ? mesh->dp / mesh->ep : mesh->dp;
    dp->er = m->ep > 1 ? mesh->dp_rank / mesh->ep : mesh->dp_rank;
    dp->edp_comm = m->ep > 1 ? mesh->edp_comm : mesh->dp_comm;
    dp->ep_comm = m->ep > 1 ? mesh->ep_comm : NULL;
    dp->zero = o->zero_stage;
    /* gradient slots live in a host-mapped arena: a staged backend keeps the full gradient buffer (Note
     * [Staged gradients]), as accumulation does */
    dp->grad_slots = dp->zero >= 2 && o->accum == 1 && dp->comm && m->backend->caps.host_visible;
    dp->m = m;
    dp->g = g;
    dp->shard.gscale = 1.0f;
    dp->ready = o->ready;
    dp->ready_user = o->ready_user;
    sl_status st = build_buckets(dp, g, o->bucket_elems > 0 ? o->bucket_elems : (1 << 20));
    if (st == SL_OK) {
        dp->reduce.reqs = calloc((size_t)dp->buckets.count + 1, sizeof(dp_bucket_reqs));
        if (!dp->reduce.reqs) st = sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    }
    if (st == SL_OK) st = alloc_shard(dp);
    if (st == SL_OK && dp->zero) st = sl_dp_slots_build(dp);
    if (st == SL_OK) {
        /* the full buffers go (leaves now point into the slot arena) */
        if (dp->zero == 3) sl_model_drop_params(m);
        if (dp->grad_slots)
            sl_model_drop_grads(m);
        else if (dp->comm && m->grads_buf && !m->backend->caps.host_visible)
            st = sl_comm_mem_alloc(dp->comm, f32_bytes(m->numel > 0 ? m->numel : 1),
                                   (void **)&dp->window.stage); /* Note [Staged gradients] */
        else if (dp->comm && m->grads_buf)
            st = grads_to_window(dp, g);
    }
    if (st != SL_OK) {
        sl_dp_free(dp);
        return st;
    }
    *out = dp;
    return SL_OK;
}

void sl_dp_free(sl_dp *dp) {
    if (!dp) return;
    (void)sl_dp_sync_params(dp); /* nothing may still write into the parameters */
    if (dp->reduce.reqs)
        for (int k = 0; k < dp->buckets.count; k++) {
            sl_comm_req_free(dp->reduce.reqs[k].part);
            sl_comm_req_free(dp->reduce.reqs[k].tail);
        }
    free(dp->reduce.reqs);
    sl_backend *be = dp->m->backend;
    sl_backend_free(be, dp->shard.m1_buf);
    sl_backend_free(be, dp->shard.m2_buf);
    sl_backend_free(be, dp->shard.grad_buf);
    sl_dp_slots_free(dp);
    grads_from_window(dp);
    if (dp->window.stage) (void)sl_comm_mem_free(dp->comm, dp->window.stage);
    sl_backend_free(be, dp->shard.param_buf);
    free(dp->buckets.v);
    free(dp);
}

int sl_dp_num_buckets(const sl_dp *dp) { return dp->buckets.count; }
int sl_dp_rank(const sl_dp *dp) { return dp->r; }
int sl_dp_size(const sl_dp *dp) { return dp->n; }
void sl_dp_arm(sl_dp *dp, int armed) {
    dp->reduce.armed = armed;
    dp->reduce.next_launch = 0;
}

/* Note [Staged gradients]
 * A backend whose memory the host cannot address (OpenCL, CUDA without a device transport) keeps the
 * gradients in its own buffer. Data parallelism then stages them: when the executor hook says a bucket's
 * gradients are final, its range is copied out (a blocking copy, so everything the device queued before it
 * has run) into the same range of a host window of numel floats, all-reduced there in place like the window
 * of Note [Gradients in a window] (on shm the peers read it directly), and copied back into the device's
 * buffer before the gradient norm (sl_dp_finish_grads). Clipping and AdamW then run on the device as in one
 * process. Under ZeRO-1 each rank updates its parts of the parameters (moments on the device, sharded), and
 * the parameters travel the same way: every rank's updated parts copied out into the window, all-gathered
 * there in place, and the buckets copied back (staged_param_gather; synchronous, where the host-visible path
 * overlaps the gathers with the next forward). ZeRO-2 reduce-scatters the staged buckets in place and takes
 * its parts from the device's copy into the gradient shard; it keeps the full gradient buffer (its gradient
 * slots live in a host-mapped arena), as under accumulation. ZeRO-3 keeps that buffer too, and its slot
 * arena and parameter shard on the device: each interval's gather copies this rank's part out of the shard
 * into the bucket's range of the same window, all-gathers there (launched ahead, as on host memory), and
 * copies the bucket into its device slot when the interval is waited for (zero_slots.c). A bucket's
 * parameters are gathered before its backward and its gradients reduced after it, so the two never hold
 * the window's range at once; within a pass the gathered values never change, so two gathers of one bucket
 * in flight write the same bytes. */
static int bucket_staged(const sl_dp *dp, const dp_bucket *b) {
    return dp->window.stage && bk_comm(dp, b) && b->hi > b->lo;
}

/* launch bucket k's reduction (in place, on the host mappings the communicator needs) */
static sl_status launch_bucket(sl_dp *dp, int k) {
    const dp_bucket *b = &dp->buckets.v[k];
    dp_bucket_reqs *rq = &dp->reduce.reqs[k];
    /* the bucket's gradients: its slot, its range of the full buffer, or its staged copy */
    float *g = dp->grad_slots     ? sl_dp_grad_slot(dp, k)
               : dp->window.stage ? dp->window.stage + b->lo
                                  : dp->m->grads_mem + b->lo;
    int64_t len = b->hi - b->lo;
    sl_comm *c = bk_comm(dp, b);
    if (!c || len == 0) return SL_OK;
    if (bucket_staged(dp, b)) /* Note [Staged gradients] */
        SL_TRY(sl_backend_copy_out(dp->m->grads_buf, f32_bytes(b->lo), g, f32_bytes(len)));
    if (dp->zero < 2) {
        dp_count_bk(dp, b, 2, len);
        return sl_comm_all_reduce_async(c, g, g, (size_t)len, SL_COMM_F32, SL_COMM_SUM, &rq->part);
    }
    /* stages 2, 3: reduce-scatter the equal parts in place (rank r's part lands at its own offset) */
    int64_t q = b->q, n = bk_n(dp, b), tail = len - q * n;
    if (q > 0) dp_count_bk(dp, b, 1, q * n);
    if (tail > 0) dp_count_bk(dp, b, 2, tail);
    if (q > 0)
        SL_TRY(sl_comm_reduce_scatter_async(c, g, g + q * bk_r(dp, b), (size_t)q, SL_COMM_F32, SL_COMM_SUM,
                                            &rq->part));
    if (tail > 0)
        SL_TRY(sl_comm_all_reduce_async(c, g + q * n, g + q * n, (size_t)tail, SL_COMM_F32, SL_COMM_SUM,
                                        &rq->tail));
    return SL_OK;
}

sl_status sl_dp_reduce_ready(sl_dp *dp, int i) {
    dp_reduce *r = &dp->reduce;
    if (!r->armed && !dp->grad_slots) return SL_OK;
    while (r->next_launch < dp->buckets.count && dp->buckets.v[r->next_launch].ready <= i) {
        SL_TRY(launch_bucket(dp, r->next_launch++));
        r->early++;
    }
    return SL_OK;
}

int sl_dp_ready_from(const sl_dp *dp, int (*fn)(void *, const sl_tensor *), const void *user) {
    return dp->ready == fn && dp->ready_user == user;
}

int sl_dp_take_early_launches(sl_dp *dp) {
    int n = dp->reduce.early;
    dp->reduce.early = 0;
    return n;
}

sl_status sl_dp_reduce_wait(sl_dp *dp, int k) {
    dp_bucket_reqs *rq = &dp->reduce.reqs[k];
    double t0 = sl_time_sec();
    sl_status st = dp_wait_req(&rq->part), st2 = dp_wait_req(&rq->tail);
    dp->reduce.wait_sec += sl_time_sec() - t0;
    SL_TRY(st);
    return st2;
}

void sl_dp_reduce_restart(sl_dp *dp) { dp->reduce.next_launch = 0; }

sl_status sl_dp_hook(sl_graph *g, int i, sl_tensor *n, void *user) {
    (void)g;
    (void)n;
    return sl_dp_slots_advance(user, i);
}

typedef struct {
    sl_dp *dp;
    sl_status st;
} gs_ctx;
/* a reduced segment of the full gradient buffer into the gradient shard */
static void copy_to_shard(void *u, int64_t lo, int64_t len, int64_t off) {
    gs_ctx *c = u;
    if (c->st == SL_OK)
        c->st = sl_backend_copy(c->dp->shard.grad_buf, f32_bytes(off), c->dp->m->grads_buf, f32_bytes(lo),
                                f32_bytes(len));
}

sl_status sl_dp_finish_grads(sl_dp *dp, double *wait_sec) {
    double t0 = sl_time_sec();
    sl_status st = SL_OK;
    dp_reduce *r = &dp->reduce;
    /* buckets not launched by the hook (e.g. hook unarmed) go now */
    while (r->next_launch < dp->buckets.count) {
        st = launch_bucket(dp, r->next_launch++);
        if (st != SL_OK) break;
    }
    for (int k = 0; k < dp->buckets.count; k++) {
        if (r->reqs[k].part) {
            sl_status s = sl_comm_wait(r->reqs[k].part);
            r->reqs[k].part = NULL;
            if (st == SL_OK) st = s;
        }
        if (r->reqs[k].tail) {
            sl_status s = sl_comm_wait(r->reqs[k].tail);
            r->reqs[k].tail = NULL;
            if (st == SL_OK) st = s;
        }
    }
    r->armed = 0;
    for (int k = 0; k < dp->buckets.count && st == SL_OK; k++) { /* Note [Staged gradients] */
        const dp_bucket *b = &dp->buckets.v[k];
        if (bucket_staged(dp, b))
            st = sl_backend_copy_in(dp->m->grads_buf, f32_bytes(b->lo), dp->window.stage + b->lo,
                                    f32_bytes(b->hi - b->lo));
    }
    if (st == SL_OK && dp->grad_slots) {
        st = sl_dp_slots_finish(dp);
    } else if (st == SL_OK && dp->zero >= 2) {
        gs_ctx c = {dp, SL_OK};
        for_each_segment(dp, copy_to_shard, &c);
        st = c.st;
    }
    /* + the waits inside backward (ZeRO-3 gathers, gradient slots due) */
    if (wait_sec) *wait_sec += sl_time_sec() - t0 + r->wait_sec;
    r->wait_sec = 0;
    return st;
}

/* sum of squares of the flat gradient range [flat, flat + len) stored at goff of g; sel 0: all of it in one
 * call; 1 / 2: only the TP-split / replicated parameters in it (Note [TP gradient norm]) */
static sl_status seg_sumsq(const sl_dp *dp, const sl_buffer *g, int64_t goff, int64_t flat, int64_t len,
                           int sel, double *out) {
    sl_backend *be = dp->m->backend;
    if (!sel) return sl_backend_sumsq(be, g, goff, len, out);
    double s = 0, x;
    for (int i = 0; i < dp->m->n_params; i++) {
        const sl_param_info *p = &dp->m->params[i];
        if ((p->tp_split > 0) != (sel == 1) || p->tied_copy) continue; /* tied copy: on the first stage */
        int64_t a = p->offset > flat ? p->offset : flat,
                e = p->offset + p->numel < flat + len ? p->offset + p->numel : flat + len;
        if (e <= a) continue;
        SL_TRY(sl_backend_sumsq(be, g, goff + (a - flat), e - a, &x));
        s += p->tp_parts > 0 && dp->m->tp > p->tp_parts ? x * p->tp_parts / dp->m->tp
                                                        : x; /* replicated part */
    }
    *out = s;
    return SL_OK;
}

/* sum of squares of rank rr's part of every bucket (tails counted for rank 0 only), in double, each piece
 * through the backend's sumsq (the single-process norm's kernel) and the pieces added in bucket order */
static sl_status part_sumsq(const sl_dp *dp, int rr, int use_shard, int sel, double *out) {
    const sl_buffer *g = use_shard ? dp->shard.grad_buf : dp->m->grads_buf;
    double s = 0, x;
    int64_t off = 0;
    for (int k = 0; k < dp->buckets.count; k++) {
        const dp_bucket *b = &dp->buckets.v[k];
        int n = bk_n(dp, b), me = use_shard ? bk_r(dp, b) : rr; /* the shard: this rank's part */
        int64_t len = b->hi - b->lo, q = dp->zero ? b->q : len / n, tail = len - q * n;
        if (q > 0) {
            int64_t flat = b->lo + q * me;
            SL_TRY(seg_sumsq(dp, g, use_shard ? off : flat, flat, q, sel, &x));
            s += x;
        }
        off += q;
        if (tail > 0) {
            if (me == 0) {
                int64_t flat = b->lo + q * n;
                SL_TRY(seg_sumsq(dp, g, use_shard ? off : flat, flat, tail, sel, &x));
                s += x;
            }
            off += tail;
        }
    }
    *out = s;
    return SL_OK;
}

/* Note [EP gradient norm]
 * With expert parallelism a rank's gradients are the replicated parameters' and its own experts'. Sharded
 * (ZeRO-2) the DP group's parts cover every replicated element once and, EDP group by EDP group, every
 * expert once: the all-reduce of the parts is the whole model's sum. Unsharded, the replicated sum is
 * local and the experts' is summed over the EP group (each rank of which holds different experts). With TP
 * or PP the same holds for each selection (sel: TP-split or replicated parameters, Note [TP gradient norm]),
 * before the TP and pipeline sums. */
static sl_status ep_sumsq(sl_dp *dp, int sel, double *ss) {
    if (dp->zero >= 2 && dp->comm) {
        double mine;
        SL_TRY(part_sumsq(dp, dp->r, 1, sel, &mine));
        return sl_comm_all_reduce(dp->comm, &mine, ss, 1, SL_COMM_F64, SL_COMM_SUM);
    }
    double part[2] = {0, 0}, x, all;
    for (int k = 0; k < dp->buckets.count; k++) {
        const dp_bucket *b = &dp->buckets.v[k];
        SL_TRY(seg_sumsq(dp, dp->m->grads_buf, b->lo, b->lo, b->hi - b->lo, sel, &x));
        part[b->expert] += x;
    }
    SL_TRY(sl_comm_all_reduce(dp->ep_comm, &part[1], &all, 1, SL_COMM_F64, SL_COMM_SUM));
    *ss = part[0] + all;
    return SL_OK;
}

static sl_status dp_sumsq(sl_dp *dp, int sel, double *ss) {
    if (dp->ep_comm) return ep_sumsq(dp, sel, ss);
    if (dp->zero >= 2 && dp->comm) {
        double mine;
        SL_TRY(part_sumsq(dp, dp->r, 1, sel, &mine));
        return sl_comm_all_reduce(dp->comm, &mine, ss, 1, SL_COMM_F64, SL_COMM_SUM);
    }
    /* same grouping as the sharded case: per rank part, then ranks in order */
    *ss = 0;
    for (int rr = 0; rr < dp->n; rr++) {
        double x;
        SL_TRY(part_sumsq(dp, rr, 0, sel, &x));
        *ss = rr ? *ss + x : x;
    }
    return SL_OK;
}

/* Note [TP gradient norm]
 * With a TP-split model each rank's gradients are shards of some parameters and copies of the others
 * (identical on every TP rank). The whole model's sum of squares is the split parameters' sums
 * all-reduced over the TP group plus the replicated ones counted once (sl_tp_grad_sumsq does the same
 * without DP). A pipeline stage's sum is then summed over the stages, the last stage's copy of the tied
 * embedding left out (Note [Pipeline stages and 1F1B]). */
sl_status sl_dp_clip(sl_dp *dp, float max_norm, float *norm_out) {
    return sl_dp_clip_unscale(dp, max_norm, 1.0f, norm_out);
}

sl_status sl_dp_clip_unscale(sl_dp *dp, float max_norm, float inv_scale, float *norm_out) {
    double ss;
    if (dp->tp_comm || dp->pp_comm) {
        double split, rep, all;
        SL_TRY(dp_sumsq(dp, 1, &split));
        SL_TRY(dp_sumsq(dp, 2, &rep));
        if (dp->tp_comm) SL_TRY(sl_comm_all_reduce(dp->tp_comm, &split, &all, 1, SL_COMM_F64, SL_COMM_SUM));
        ss = (dp->tp_comm ? all : split) + rep;
        if (dp->pp_comm) { /* every stage's layers */
            SL_TRY(sl_comm_all_reduce(dp->pp_comm, &ss, &all, 1, SL_COMM_F64, SL_COMM_SUM));
            ss = all;
        }
    } else {
        SL_TRY(dp_sumsq(dp, 0, &ss));
    }
    float norm = (float)sqrt(ss) * inv_scale;
    dp->shard.gscale = sl_clip_coef(norm, max_norm) * inv_scale; /* applied inside the update */
    *norm_out = norm;
    return SL_OK;
}

typedef struct {
    sl_dp *dp;
    sl_adamw_span *v;
    int n, cap;
} span_list;
/* a shard segment [lo, lo+len) of the flat buffer, split at parameter boundaries (weight decay is per
 * parameter), as AdamW spans: parameters at lo (or the ZeRO-3 shard), gradients at lo (or the gradient
 * shard), moments at the shard offset */
static void collect_spans(void *u, int64_t lo, int64_t len, int64_t off) {
    span_list *l = u;
    sl_dp *dp = l->dp;
    for (int i = 0; i < dp->m->n_params; i++) {
        const sl_param_info *pi = &dp->m->params[i];
        int64_t a = pi->offset > lo ? pi->offset : lo,
                e = pi->offset + pi->numel < lo + len ? pi->offset + pi->numel : lo + len;
        if (e <= a) continue;
        int64_t k = a - lo;
        if (l->n == l->cap) {
            l->cap = l->cap ? 2 * l->cap : 256;
            sl_adamw_span *nv = realloc(l->v, sizeof *nv * (size_t)l->cap);
            if (!nv) {
                l->cap = -1; /* out of memory: reported by the caller */
                return;
            }
            l->v = nv;
        }
        if (l->cap < 0) return;
        l->v[l->n++] = (sl_adamw_span){.p_offs = (dp->zero == 3 ? off : lo) + k,
                                       .g_offs = (dp->zero >= 2 ? off : lo) + k,
                                       .s_offs = off + k,
                                       .n = e - a,
                                       .decay = pi->decay};
    }
}

/* one AdamW call over every span this rank updates (the single-process optimizer's backend operation) */
static sl_status update_shard(sl_dp *dp, float lr, int64_t t, sl_adamw_hparams hp) {
    span_list l = {dp, NULL, 0, 0};
    if (!dp->zero)
        collect_spans(&l, 0, dp->m->numel, 0);
    else
        for_each_segment(dp, collect_spans, &l);
    if (l.cap < 0) {
        free(l.v);
        return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    }
    const dp_shard *s = &dp->shard;
    sl_adamw_call c = {.p = dp->zero == 3 ? s->param_buf : dp->m->params_buf,
                       .g = dp->zero >= 2 ? s->grad_buf : dp->m->grads_buf,
                       .m = s->m1_buf,
                       .v = s->m2_buf,
                       .spans = l.v,
                       .n_spans = l.n,
                       .lr = lr,
                       .gscale = s->gscale,
                       .hp = hp,
                       .t = t};
    sl_status st = l.n ? sl_backend_adamw(dp->m->backend, &c) : SL_OK;
    free(l.v);
    return st;
}

double sl_dp_take_comm_bytes(sl_dp *dp) {
    double b = dp ? dp->comm_bytes : 0;
    if (dp) dp->comm_bytes = 0;
    return b;
}

/* Note [DP communication volume]: per step, gradients G = parameters P = 4 numel bytes, ring collectives:
 * ZeRO-0 all-reduces G (2 (n-1)/n G); ZeRO-1 all-reduces G and all-gathers the updated P ((n-1)/n P);
 * ZeRO-2 reduce-scatters G and all-gathers P (2 (n-1)/n G). ZeRO-3's gathers follow the passes (not
 * modelled here: NAN). The measured count equals this for ZeRO-0 and 2 (a bucket's tail, the elements past
 * n equal parts, is all-reduced: the same 2 (n-1)/n); under ZeRO-1 the tails are not gathered, so it is
 * below by (n-1)/n of 4 x (their sum, < n per bucket). With expert parallelism the experts' share uses the
 * expert-data-parallel group's size. */
double sl_dp_comm_theory(const sl_dp *dp) {
    if (!dp || !dp->comm || dp->n < 2) return 0;
    if (dp->zero == 3) return NAN;
    /* expert parameters travel over the expert-data-parallel group of en ranks (none when en == 1) */
    double ex = 0;
    for (int i = 0; i < dp->m->n_params; i++)
        ex += dp->m->params[i].expert ? (double)dp->m->params[i].numel : 0;
    double f = (double)(dp->n - 1) / dp->n,
           fe = dp->en > 1 && dp->edp_comm ? (double)(dp->en - 1) / dp->en : 0;
    double G = (double)f32_bytes(dp->m->numel) - 4 * ex, Ge = 4 * ex;
    return (dp->zero == 1 ? 3 : 2) * (f * G + fe * Ge);
}

typedef struct {
    float *shard;
    int64_t lo, n;
    const float *delta;
} add_ctx;
static void add_seg(void *u, int64_t lo, int64_t len, int64_t off) {
    add_ctx *a = u;
    int64_t b = lo > a->lo ? lo : a->lo, e = lo + len < a->lo + a->n ? lo + len : a->lo + a->n;
    for (int64_t x = b; x < e; x++) a->shard[off + (x - lo)] += a->delta[x - a->lo];
}

sl_status sl_dp_add_params(sl_dp *dp, int64_t lo, int64_t n, const float *delta) {
    sl_model *m = dp->m;
    if (lo < 0 || n < 0 || lo + n > m->numel)
        return sl_fail(SL_ERR_INVALID, "dp: parameters [%lld, %lld) outside the model's %lld", (long long)lo,
                       (long long)(lo + n), (long long)m->numel);
    if (dp->zero != 3) {
        float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
        if (!v) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
        sl_status st = sl_model_params_read(m, lo, n, v);
        for (int64_t i = 0; i < n && st == SL_OK; i++) v[i] += delta[i];
        if (st == SL_OK) st = sl_model_params_write(m, lo, n, v);
        free(v);
        return st;
    }
    add_ctx a = {dp->shard.param, lo, n, delta};
    if (!a.shard) { /* the shard on the device (Note [Staged gradients]): through a host copy */
        if (!(a.shard = malloc(f32_bytes(dp->shard.len + 1))))
            return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
        sl_status st = sl_backend_copy_out(dp->shard.param_buf, 0, a.shard, f32_bytes(dp->shard.len));
        if (st == SL_OK) for_each_segment(dp, add_seg, &a);
        if (st == SL_OK) st = sl_backend_copy_in(dp->shard.param_buf, 0, a.shard, f32_bytes(dp->shard.len));
        free(a.shard);
        return st;
    }
    for_each_segment(dp, add_seg, &a);
    return SL_OK;
}

/* ZeRO-1 on a backend without host-visible memory (Note [Staged gradients]): each bucket's parts gathered
 * through the host window, then copied back whole */
static sl_status staged_param_gather(sl_dp *dp) {
    sl_model *m = dp->m;
    float *w = dp->window.stage;
    sl_status st = SL_OK;
    for (int k = 0; k < dp->buckets.count && st == SL_OK; k++) {
        const dp_bucket *b = &dp->buckets.v[k];
        dp_bucket_reqs *rq = &dp->reduce.reqs[k];
        int64_t own = b->lo + b->q * bk_r(dp, b);
        if (b->q <= 0 || !bk_comm(dp, b)) continue;
        dp_count_bk(dp, b, 1, b->q * bk_n(dp, b));
        st = sl_backend_copy_out(m->params_buf, f32_bytes(own), w + own, f32_bytes(b->q));
        if (st == SL_OK)
            st = sl_comm_all_gather_async(bk_comm(dp, b), w + own, w + b->lo, (size_t)b->q, SL_COMM_F32,
                                          &rq->part);
    }
    for (int k = 0; k < dp->buckets.count; k++) {
        const dp_bucket *b = &dp->buckets.v[k];
        sl_status s = dp_wait_req(&dp->reduce.reqs[k].part);
        if (st == SL_OK) st = s;
        if (st == SL_OK && b->q > 0 && bk_comm(dp, b))
            st =
                sl_backend_copy_in(m->params_buf, f32_bytes(b->lo), w + b->lo, f32_bytes(b->q * bk_n(dp, b)));
    }
    return st;
}

sl_status sl_dp_optimizer_step(sl_dp *dp, float lr, int64_t t, sl_adamw_hparams hp) {
    if (dp->zero == 3) sl_dp_reshard_params(dp); /* training goes on after a gather: back to the shard */
    sl_status st = update_shard(dp, lr, t, hp);
    dp->shard.gscale = 1.0f; /* the factor belongs to this step's gradients only */
    SL_TRY(st);
    if (!dp->zero || !dp->comm || dp->zero == 3) return SL_OK; /* stage 3 gathers lazily in the next pass */
    if (dp->window.stage) return staged_param_gather(dp);      /* Note [Staged gradients] */
    /* all-gather the updated parts of every bucket in place, overlapped with the next forward pass (Note
     * [Overlapped parameter gather] in zero_slots.c) */
    return sl_dp_launch_param_gathers(dp);
}

sl_status sl_dp_mean(sl_dp *dp, float *v) {
    if (!dp->comm) return SL_OK;
    double x = *v, s;
    SL_TRY(sl_comm_all_reduce(dp->comm, &x, &s, 1, SL_COMM_F64, SL_COMM_SUM));
    *v = (float)(s / dp->n);
    return SL_OK;
}

void sl_dp_memory_report(const sl_dp *dp, sl_dp_memory *mem) {
    const dp_shard *s = &dp->shard;
    mem->param_bytes = f32_bytes(dp->zero == 3 ? s->len : dp->m->numel);
    mem->slot_bytes = f32_bytes(dp->slots.arena.len);
    mem->grad_bytes = dp->grad_slots ? 0 : f32_bytes(dp->m->numel);
    mem->grad_shard_bytes = s->grad_buf ? f32_bytes(s->len) : 0;
    mem->optim_bytes = 2 * f32_bytes(s->len);
}

typedef struct {
    sl_dp_seg *v;
    int n;
} seg_list;
static void collect_seg(void *u, int64_t lo, int64_t len, int64_t off) {
    seg_list *l = u;
    l->v[l->n++] = (sl_dp_seg){lo, len, off};
}

sl_status sl_dp_state(sl_dp *dp, sl_dp_seg **segs, int *nseg, float **m1, float **m2) {
    SL_TRY(sl_dp_sync_params(dp)); /* the caller reads the weights */
    *m1 = dp->shard.m1;
    *m2 = dp->shard.m2;
    seg_list l = {calloc((size_t)(2 * dp->buckets.count + 1), sizeof(sl_dp_seg)), 0};
    if (!l.v) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    if (dp->zero)
        for_each_segment(dp, collect_seg, &l);
    else
        l.v[l.n++] = (sl_dp_seg){0, dp->m->numel, 0};
    *segs = l.v;
    *nseg = l.n;
    return SL_OK;
}

int sl_dp_zero_stage(const sl_dp *dp) { return dp->zero; }

void sl_dp_state_bufs(sl_dp *dp, sl_buffer **m1, sl_buffer **m2) {
    *m1 = dp->shard.m1_buf;
    *m2 = dp->shard.m2_buf;
}
