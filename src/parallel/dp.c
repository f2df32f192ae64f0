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
#include <string.h>

#include "parallel/dp_internal.h"

static int cmp_ready(const void *a, const void *b) {
    const bucket *x = a, *y = b;
    if (x->ready != y->ready) return x->ready - y->ready;
    return x->lo < y->lo ? 1 : -1;
}

/* iterate this rank's shard: for each bucket, its part then the tail */
typedef void (*seg_fn)(void *u, int64_t flat_lo, int64_t len, int64_t shard_off);
static void for_each_segment(const sl_dp *dp, seg_fn fn, void *u) {
    int64_t off = 0;
    for (int k = 0; k < dp->nb; k++) {
        const bucket *b = &dp->b[k];
        int64_t len = b->hi - b->lo, q = b->q, tail = len - q * dp->n;
        if (q > 0) {
            fn(u, b->lo + q * dp->r, q, off);
            off += q;
        }
        if (tail > 0) {
            fn(u, b->lo + q * dp->n, tail, off);
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
    dp->gwin = w;
    dp->gwin_graph = g;
    return SL_OK;
}

static void grads_from_window(sl_dp *dp) {
    if (!dp->gwin) return;
    sl_model *m = dp->m;
    sl_buffer *p = NULL;
    if (sl_backend_alloc(m->backend, sizeof(float) * (size_t)m->numel, &p) == SL_OK)
        (void)sl_backend_copy(p, 0, m->grads_buf, 0, sizeof(float) * (size_t)m->numel);
    (void)sl_model_adopt_grads(m, p); /* NULL if that failed: nothing trains after DP */
    sl_graph_refresh_views(dp->gwin_graph);
    (void)sl_comm_mem_free(dp->comm, dp->gwin);
    dp->gwin = NULL;
}

/* A host-mapped f32 buffer of n elements on the model's backend (data parallelism keeps its shards in
 * host-visible memory: the communicator moves host bytes). */
static sl_status host_buf(sl_dp *dp, int64_t n, sl_buffer **buf, float **map) {
    SL_TRY(sl_backend_alloc(dp->m->backend, sizeof(float) * (size_t)(n > 0 ? n : 1), buf));
    *map = sl_buffer_map(*buf);
    return SL_OK;
}

sl_status sl_dp_new(sl_dp **out, const sl_mesh *mesh, sl_model *m, sl_graph *g, const sl_dp_opts *o) {
    *out = NULL;
    if (o->zero_stage < 0 || o->zero_stage > 3)
        return sl_fail(SL_ERR_INVALID, "--zero-stage %d: must be 0, 1, 2 or 3", o->zero_stage);
    if (!m->backend->caps.host_visible)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "data parallelism needs host-visible device memory; the %s backend's is not (staging "
                       "through host copies is not built yet)",
                       m->backend->name);
    sl_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    dp->comm = mesh->dp_comm;
    dp->n = mesh->dp;
    dp->r = mesh->dp_rank;
    dp->zero = o->zero_stage;
    dp->m = m;
    dp->gscale = 1.0f;
    int64_t be = o->bucket_elems > 0 ? o->bucket_elems : (1 << 20);
    dp->b = calloc((size_t)m->n_params + 1, sizeof(bucket));
    if (!dp->b) goto oom;
    /* walk parameters from the end of the flat buffer */
    int64_t hi = m->numel;
    int ready = -1;
    for (int i = m->n_params - 1; i >= 0; i--) {
        const sl_param_info *p = &m->params[i];
        int w = sl_graph_last_grad_write(g, p->t);
        if (w > ready) ready = w;
        if (hi - p->offset >= be || i == 0) {
            dp->b[dp->nb++] = (bucket){.lo = p->offset, .hi = hi, .ready = ready};
            hi = p->offset;
            ready = -1;
        }
    }
    for (int k = 0; k < dp->nb; k++) dp->b[k].q = dp->zero ? (dp->b[k].hi - dp->b[k].lo) / dp->n : 0;
    qsort(dp->b, (size_t)dp->nb, sizeof(bucket), cmp_ready);
    if (dp->zero) {
        for_each_segment(dp, count_seg, &dp->shard_len);
    } else {
        dp->shard_len = m->numel;
    }
    /* moments come zero-filled */
    if (host_buf(dp, dp->shard_len, &dp->m1_buf, &dp->m1) != SL_OK) goto oom;
    if (host_buf(dp, dp->shard_len, &dp->m2_buf, &dp->m2) != SL_OK) goto oom;
    if (dp->zero >= 2 && host_buf(dp, dp->shard_len, &dp->gshard_buf, &dp->gshard) != SL_OK) goto oom;
    if (dp->zero) { /* shard offsets of each bucket's part and tail, in for_each_segment order */
        int64_t off = 0;
        for (int k = 0; k < dp->nb; k++) {
            bucket *b = &dp->b[k];
            int64_t len = b->hi - b->lo, tail = len - b->q * dp->n;
            b->soff = off;
            off += b->q;
            b->toff = off;
            if (tail > 0) off += tail;
        }
    }
    dp->gslots = dp->zero >= 2 && o->accum == 1 && dp->comm;
    if (dp->zero == 3) {
        if (host_buf(dp, dp->shard_len + 1, &dp->pshard_buf, &dp->pshard) != SL_OK) goto oom;
        for (int k = 0; k < dp->nb; k++) {
            const bucket *b = &dp->b[k];
            int64_t len = b->hi - b->lo, tail = len - b->q * dp->n;
            memcpy(dp->pshard + b->soff, m->params_mem + b->lo + b->q * dp->r, sizeof(float) * (size_t)b->q);
            if (tail > 0)
                memcpy(dp->pshard + b->toff, m->params_mem + b->lo + b->q * dp->n,
                       sizeof(float) * (size_t)tail);
        }
    }
    if (dp->zero) {
        sl_status zs = sl_dp_slots_build(dp, g);
        if (zs != SL_OK) {
            sl_dp_free(dp);
            return zs;
        }
    }
    /* the full buffers go (leaves now point into the slot arena) */
    if (dp->zero == 3) sl_model_drop_params(m);
    if (dp->gslots) {
        sl_model_drop_grads(m);
    } else if (dp->comm && m->grads_buf) {
        sl_status ws = grads_to_window(dp, g);
        if (ws != SL_OK) {
            sl_dp_free(dp);
            return ws;
        }
    }
    *out = dp;
    return SL_OK;
oom:
    sl_dp_free(dp);
    return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
}

void sl_dp_free(sl_dp *dp) {
    if (!dp) return;
    (void)sl_dp_sync_params(dp); /* nothing may still write into the parameters */
    for (int k = 0; k < dp->nb; k++) {
        sl_comm_req_free(dp->b[k].req);
        sl_comm_req_free(dp->b[k].req_tail);
        sl_comm_req_free(dp->b[k].preq);
    }
    free(dp->b);
    sl_backend *be = dp->m->backend;
    sl_backend_free(be, dp->m1_buf);
    sl_backend_free(be, dp->m2_buf);
    sl_backend_free(be, dp->gshard_buf);
    sl_dp_slots_free(dp);
    grads_from_window(dp);
    sl_backend_free(be, dp->pshard_buf);
    free(dp);
}

int sl_dp_num_buckets(const sl_dp *dp) { return dp->nb; }
int sl_dp_rank(const sl_dp *dp) { return dp->r; }
int sl_dp_size(const sl_dp *dp) { return dp->n; }
void sl_dp_arm(sl_dp *dp, int armed) {
    dp->armed = armed;
    dp->next = 0;
}

sl_status sl_dp_launch_bucket(sl_dp *dp, bucket *b) {
    /* the bucket's gradients: its slot, or its range of the full buffer */
    float *g = dp->gslots ? dp->arena + b->goff : dp->m->grads_mem + b->lo;
    int64_t len = b->hi - b->lo;
    if (!dp->comm || len == 0) return SL_OK;
    if (dp->zero < 2)
        return sl_comm_all_reduce_async(dp->comm, g, g, (size_t)len, SL_COMM_F32, SL_COMM_SUM, &b->req);
    /* stages 2, 3: reduce-scatter the equal parts in place (rank r's part lands at its own offset) */
    int64_t q = b->q, tail = len - q * dp->n;
    if (q > 0)
        SL_TRY(sl_comm_reduce_scatter_async(dp->comm, g, g + q * dp->r, (size_t)q, SL_COMM_F32, SL_COMM_SUM,
                                            &b->req));
    if (tail > 0)
        SL_TRY(sl_comm_all_reduce_async(dp->comm, g + q * dp->n, g + q * dp->n, (size_t)tail, SL_COMM_F32,
                                        SL_COMM_SUM, &b->req_tail));
    return SL_OK;
}

sl_status sl_dp_hook(sl_graph *g, int i, sl_tensor *n, void *user) {
    (void)g;
    (void)n;
    return sl_dp_slots_advance(user, i);
}

typedef struct {
    sl_dp *dp;
} gs_ctx;
static void copy_to_shard(void *u, int64_t lo, int64_t len, int64_t off) {
    sl_dp *dp = ((gs_ctx *)u)->dp;
    memcpy(dp->gshard + off, dp->m->grads_mem + lo, sizeof(float) * (size_t)len);
}

sl_status sl_dp_finish_grads(sl_dp *dp, double *wait_sec) {
    double t0 = sl_time_sec();
    sl_status st = SL_OK;
    /* buckets not launched by the hook (e.g. hook unarmed) go now */
    while (dp->next < dp->nb) {
        st = sl_dp_launch_bucket(dp, &dp->b[dp->next++]);
        if (st != SL_OK) break;
    }
    for (int k = 0; k < dp->nb; k++) {
        if (dp->b[k].req) {
            sl_status s = sl_comm_wait(dp->b[k].req);
            dp->b[k].req = NULL;
            if (st == SL_OK) st = s;
        }
        if (dp->b[k].req_tail) {
            sl_status s = sl_comm_wait(dp->b[k].req_tail);
            dp->b[k].req_tail = NULL;
            if (st == SL_OK) st = s;
        }
    }
    dp->armed = 0;
    if (st == SL_OK && dp->gslots) {
        st = sl_dp_slots_finish(dp);
    } else if (st == SL_OK && dp->zero >= 2) {
        gs_ctx c = {dp};
        for_each_segment(dp, copy_to_shard, &c);
    }
    /* + the waits inside backward (ZeRO-3 gathers, gradient slots due) */
    if (wait_sec) *wait_sec += sl_time_sec() - t0 + dp->wait_sec;
    dp->wait_sec = 0;
    return st;
}

/* sum of squares of rank rr's part of every bucket (tails counted for rank 0 only), in double, each piece
 * through the backend's sumsq (the single-process norm's kernel) and the pieces added in bucket order */
static sl_status part_sumsq(const sl_dp *dp, int rr, int use_shard, double *out) {
    sl_backend *be = dp->m->backend;
    const sl_buffer *g = use_shard ? dp->gshard_buf : dp->m->grads_buf;
    double s = 0, x;
    int64_t off = 0;
    for (int k = 0; k < dp->nb; k++) {
        const bucket *b = &dp->b[k];
        int64_t len = b->hi - b->lo, q = dp->zero ? b->q : len / dp->n, tail = len - q * dp->n;
        if (q > 0) {
            SL_TRY(sl_backend_sumsq(be, g, use_shard ? off : b->lo + q * rr, q, &x));
            s += x;
        }
        off += q;
        if (tail > 0) {
            if (rr == 0) {
                SL_TRY(sl_backend_sumsq(be, g, use_shard ? off : b->lo + q * dp->n, tail, &x));
                s += x;
            }
            off += tail;
        }
    }
    *out = s;
    return SL_OK;
}

sl_status sl_dp_clip(sl_dp *dp, float max_norm, float *norm_out) {
    double ss;
    if (dp->zero >= 2 && dp->comm) {
        double mine;
        SL_TRY(part_sumsq(dp, dp->r, 1, &mine));
        SL_TRY(sl_comm_all_reduce(dp->comm, &mine, &ss, 1, SL_COMM_F64, SL_COMM_SUM));
    } else {
        /* same grouping as the sharded case: per rank part, then ranks in order */
        ss = 0;
        for (int rr = 0; rr < dp->n; rr++) {
            double x;
            SL_TRY(part_sumsq(dp, rr, 0, &x));
            ss = rr ? ss + x : x;
        }
    }
    float norm = (float)sqrt(ss);
    dp->gscale = sl_clip_coef(norm, max_norm); /* applied inside the update */
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
    sl_adamw_call c = {.p = dp->zero == 3 ? dp->pshard_buf : dp->m->params_buf,
                       .g = dp->zero >= 2 ? dp->gshard_buf : dp->m->grads_buf,
                       .m = dp->m1_buf,
                       .v = dp->m2_buf,
                       .spans = l.v,
                       .n_spans = l.n,
                       .lr = lr,
                       .gscale = dp->gscale,
                       .hp = hp,
                       .t = t};
    sl_status st = l.n ? sl_backend_adamw(dp->m->backend, &c) : SL_OK;
    free(l.v);
    return st;
}

sl_status sl_dp_optimizer_step(sl_dp *dp, float lr, int64_t t, sl_adamw_hparams hp) {
    if (dp->zero == 3 && dp->materialized) { /* training goes on after a gather: back to the shard */
        sl_model_drop_params(dp->m);
        dp->materialized = 0;
    }
    sl_status st = update_shard(dp, lr, t, hp);
    dp->gscale = 1.0f; /* the factor belongs to this step's gradients only */
    SL_TRY(st);
    if (!dp->zero || !dp->comm || dp->zero == 3) return SL_OK; /* stage 3 gathers lazily in the next pass */
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
    mem->param_bytes = sizeof(float) * (size_t)(dp->zero == 3 ? dp->shard_len : dp->m->numel);
    mem->slot_bytes = sizeof(float) * (size_t)dp->arena_len;
    mem->grad_bytes = dp->gslots ? 0 : sizeof(float) * (size_t)dp->m->numel;
    mem->grad_shard_bytes = dp->gshard ? sizeof(float) * (size_t)dp->shard_len : 0;
    mem->optim_bytes = 2 * sizeof(float) * (size_t)dp->shard_len;
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
    *m1 = dp->m1;
    *m2 = dp->m2;
    seg_list l = {calloc((size_t)(2 * dp->nb + 1), sizeof(sl_dp_seg)), 0};
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
