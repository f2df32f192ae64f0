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
 * rank part then over ranks, so stages 0, 1, 2 and 3 produce bitwise-identical parameters.
 *
 * Note [ZeRO-3 gather schedule]
 * Under stage 3 a rank keeps only its shard of the parameters (same parts and tails as the optimizer
 * state); the full flat parameter buffer is freed. The graph is fixed, so the schedule is static: for each
 * bucket, the nodes that read any of its parameters (directly or through views) are found and split into
 * use intervals [S, E] wherever two uses are more than Z3_GAP nodes apart (so a layer's weights are
 * gathered once for forward and again for backward, and freed in between). Intervals are ordered by S;
 * interval j's all-gather is launched asynchronously right after node S(j-1) - 1, i.e. while interval j-1
 * computes (prefetch depth 1), and waited for just before node S(j). Each interval gets a static offset in
 * one gather arena, assigned greedy-by-size over lifetimes (launch, E], like the activation planner; when an
 * interval starts, the bucket's parameter leaves are bound to its slot and the graph's views re-derived
 * (sl_graph_refresh_views). The all-gathered values are bitwise the shard values, so stage 3 computes
 * exactly what stages 0-2 compute. Gradients follow stage 2 (reduce-scatter into the shard). */
#include <math.h>
#include <string.h>

#include "suanli/ckpt.h"
#include "suanli/parallel.h"

typedef struct {
    int64_t lo, hi, q;  /* [lo, hi) in the flat buffer; q = part length per rank (ZeRO) */
    int64_t soff, toff; /* offsets of this rank's part and of the tail in the shard arrays */
    int ready;          /* graph node index after which the bucket is final */
    sl_comm_req *req, *req_tail;
} bucket;

enum { Z3_GAP = 16 };

typedef struct {
    int k;       /* bucket */
    int L, S, E; /* gather launched after node L (-1: before the pass); used by nodes [S, E] */
    int64_t off; /* element offset of its slot in the gather arena */
    sl_comm_req *req;
    int launched;
} z3_iv;

struct sl_dp {
    sl_comm *comm; /* dp communicator (NULL: dp == 1) */
    int n, r, zero;
    sl_model *m;
    bucket *b; /* sorted by ready */
    int nb, next, armed;
    float *m1, *m2;    /* AdamW moments: full (stage 0) or shard (stages 1, 2) */
    float *gshard;     /* stage 2: this rank's reduced gradients (its parts, then tails) */
    int64_t shard_len; /* elements this rank updates */
    uint8_t *decay;    /* per shard element: weight decay applies (stages 1, 2) */
    double wait_sec;
    /* stage 3 (Note [ZeRO-3 gather schedule]) */
    sl_graph *g;
    float *pshard; /* this rank's parameters, indexed like m1/m2 */
    float *arena;  /* gather slots */
    int64_t arena_len;
    z3_iv *iv; /* sorted by S */
    int *by_l; /* interval indices sorted by L */
    int niv, cl, cs, range_end;
    int *pbucket;     /* parameter index -> bucket */
    int materialized; /* sl_dp_gather_params made m->params_mem whole again */
};

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

typedef struct {
    sl_dp *dp;
} decay_ctx;
static void fill_decay(void *u, int64_t lo, int64_t len, int64_t off) {
    sl_dp *dp = ((decay_ctx *)u)->dp;
    for (int i = 0; i < dp->m->n_params; i++) {
        const sl_param_info *p = &dp->m->params[i];
        int64_t a = p->offset > lo ? p->offset : lo,
                e = p->offset + p->numel < lo + len ? p->offset + p->numel : lo + len;
        for (int64_t k = a; k < e; k++) dp->decay[off + (k - lo)] = (uint8_t)p->decay;
    }
}

/* ---------------- ZeRO-3 (Note [ZeRO-3 gather schedule]) ---------------- */

static int param_index(const sl_model *m, const sl_tensor *t) {
    while (t && t->op == SL_OP_VIEW) t = t->view_src;
    if (!t || !(t->flags & SL_FLAG_PARAM)) return -1;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].t == t) return i;
    return -1;
}

static int cmp_iv_s(const void *a, const void *b) {
    const z3_iv *x = a, *y = b;
    return x->S != y->S ? x->S - y->S : x->k - y->k;
}

typedef struct {
    int64_t size;
    int idx;
} size_idx;
static int cmp_size_idx(const void *a, const void *b) {
    const size_idx *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    return x->idx - y->idx;
}

static const z3_iv *g_sort_iv; /* qsort context for by_l (set and used under one call) */
static int cmp_by_l(const void *a, const void *b) {
    const z3_iv *x = &g_sort_iv[*(const int *)a], *y = &g_sort_iv[*(const int *)b];
    return x->L != y->L ? x->L - y->L : x->S - y->S;
}

static int64_t round16(int64_t x) { return (x + 15) & ~(int64_t)15; }

static sl_status z3_build(sl_dp *dp, sl_graph *g) {
    sl_model *m = dp->m;
    int nn = sl_graph_n_nodes(g);
    dp->g = g;
    dp->pbucket = malloc(sizeof(int) * (size_t)(m->n_params + 1));
    int *last = malloc(sizeof(int) * (size_t)dp->nb), *seen = malloc(sizeof(int) * (size_t)dp->nb);
    int cap = 4 * dp->nb + 16;
    dp->iv = malloc(sizeof(z3_iv) * (size_t)cap);
    if (!dp->pbucket || !last || !seen || !dp->iv) goto oom;
    for (int i = 0; i < m->n_params; i++) {
        dp->pbucket[i] = -1;
        for (int k = 0; k < dp->nb; k++)
            if (m->params[i].offset >= dp->b[k].lo && m->params[i].offset < dp->b[k].hi) dp->pbucket[i] = k;
    }
    int *open = seen; /* open[k]: index of bucket k's current interval, -1 none */
    for (int k = 0; k < dp->nb; k++) open[k] = -1, last[k] = -1000000;
    for (int i = 0; i < nn; i++) {
        sl_tensor *t = sl_graph_node(g, i);
        if (t->op == SL_OP_VIEW) continue; /* views compute nothing; their readers count */
        for (int s = 0; s < SL_MAX_SRC; s++) {
            int pi = t->src[s] ? param_index(m, t->src[s]) : -1;
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
    /* open[] indexes are invalid after sorting; nothing uses them past here */
    qsort(dp->iv, (size_t)dp->niv, sizeof(z3_iv), cmp_iv_s);
    for (int j = 0; j < dp->niv; j++) dp->iv[j].L = j == 0 ? -1 : dp->iv[j - 1].S - 1;
    /* slots: greedy by size over lifetimes (L, E] */
    size_idx *order = malloc(sizeof(size_idx) * (size_t)(dp->niv + 1));
    int *placed = malloc(sizeof(int) * (size_t)(dp->niv + 1));
    if (!order || !placed) {
        free(order);
        free(placed);
        goto oom;
    }
    for (int j = 0; j < dp->niv; j++)
        order[j] = (size_idx){round16(dp->b[dp->iv[j].k].hi - dp->b[dp->iv[j].k].lo), j};
    qsort(order, (size_t)dp->niv, sizeof(size_idx), cmp_size_idx);
    int np = 0;
    for (int a = 0; a < dp->niv; a++) {
        z3_iv *x = &dp->iv[order[a].idx];
        int64_t sz = order[a].size, off = 0;
        /* lowest offset clear of every placed interval that is alive at the same time */
        for (int moved = 1; moved;) {
            moved = 0;
            for (int c = 0; c < np; c++) {
                const z3_iv *y = &dp->iv[placed[c]];
                int64_t ysz = round16(dp->b[y->k].hi - dp->b[y->k].lo);
                if (x->L < y->E && y->L < x->E && off < y->off + ysz && y->off < off + sz) {
                    off = y->off + ysz;
                    moved = 1;
                }
            }
        }
        x->off = off;
        if (off + sz > dp->arena_len) dp->arena_len = off + sz;
        placed[np++] = order[a].idx;
    }
    free(order);
    free(placed);
    dp->by_l = malloc(sizeof(int) * (size_t)(dp->niv + 1));
    dp->arena = sl_malloc_aligned(sizeof(float) * (size_t)(dp->arena_len + 16));
    if (!dp->by_l || !dp->arena) goto oom;
    for (int j = 0; j < dp->niv; j++) dp->by_l[j] = j;
    g_sort_iv = dp->iv;
    qsort(dp->by_l, (size_t)dp->niv, sizeof(int), cmp_by_l);
    g_sort_iv = NULL;
    free(last);
    free(seen);
    return SL_OK;
oom:
    free(last);
    free(seen);
    return sl_fail(SL_ERR_NOMEM, "dp: out of memory (ZeRO-3 schedule)");
}

/* bind bucket k's parameter leaves to `base` (the bucket's first element) */
static void bind_bucket(sl_dp *dp, int k, float *base) {
    for (int i = 0; i < dp->m->n_params; i++)
        if (dp->pbucket[i] == k)
            sl_tensor_bind(dp->m->params[i].t, base + (dp->m->params[i].offset - dp->b[k].lo));
}

/* gather bucket b from every rank's shard into dst (len elements) */
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

static sl_status z3_wait(z3_iv *z) {
    sl_status st = SL_OK;
    if (z->req) st = sl_comm_wait(z->req);
    z->req = NULL;
    z->launched = 0;
    return st;
}

/* events after node i (i = -1: before the first node) */
static sl_status z3_advance(sl_dp *dp, int i) {
    while (dp->cl < dp->niv && dp->iv[dp->by_l[dp->cl]].L <= i) {
        z3_iv *z = &dp->iv[dp->by_l[dp->cl++]];
        if (z->S >= dp->range_end) continue;
        SL_TRY(gather_bucket(dp, &dp->b[z->k], dp->arena + z->off, &z->req));
        z->launched = 1;
    }
    int bound = 0;
    while (dp->cs < dp->niv && dp->iv[dp->cs].S <= i + 1) {
        z3_iv *z = &dp->iv[dp->cs++];
        if (z->S >= dp->range_end) continue;
        if (!z->launched)
            return sl_fail(SL_ERR_INTERNAL, "dp: ZeRO-3 gather of bucket %d never launched", z->k);
        double t0 = sl_time_sec();
        SL_TRY(z3_wait(z));
        dp->wait_sec += sl_time_sec() - t0;
        bind_bucket(dp, z->k, dp->arena + z->off);
        bound = 1;
    }
    if (bound) sl_graph_refresh_views(dp->g);
    return SL_OK;
}

sl_status sl_dp_begin_pass(sl_dp *dp, int end) {
    if (dp->zero != 3) return SL_OK;
    if (dp->materialized) {
        sl_free_aligned(dp->m->params_mem);
        dp->m->params_mem = NULL;
        dp->materialized = 0;
    }
    dp->cl = dp->cs = 0;
    dp->range_end = end;
    return z3_advance(dp, -1);
}

sl_status sl_dp_end_pass(sl_dp *dp) {
    sl_status st = SL_OK;
    if (dp->zero != 3) return st;
    for (int j = 0; j < dp->niv; j++)
        if (dp->iv[j].launched) {
            sl_status s = z3_wait(&dp->iv[j]);
            if (st == SL_OK) st = s;
        }
    return st;
}

sl_status sl_dp_gather_params(sl_dp *dp) {
    if (dp->zero != 3 || dp->materialized) return SL_OK;
    sl_model *m = dp->m;
    m->params_mem = sl_malloc_aligned(sizeof(float) * (size_t)m->numel);
    if (!m->params_mem)
        return sl_fail(SL_ERR_NOMEM, "dp: cannot allocate %lld parameters", (long long)m->numel);
    sl_status st = SL_OK;
    for (int k = 0; k < dp->nb && st == SL_OK; k++) {
        sl_comm_req *req = NULL;
        st = gather_bucket(dp, &dp->b[k], m->params_mem + dp->b[k].lo, &req);
        if (req) {
            sl_status s = sl_comm_wait(req);
            if (st == SL_OK) st = s;
        }
    }
    for (int i = 0; i < m->n_params; i++) sl_tensor_bind(m->params[i].t, m->params_mem + m->params[i].offset);
    sl_graph_refresh_views(dp->g);
    dp->materialized = 1;
    return st;
}

float *sl_dp_param_shard(sl_dp *dp) { return dp->zero == 3 ? dp->pshard : NULL; }

sl_status sl_dp_new(sl_dp **out, const sl_mesh *mesh, sl_model *m, sl_graph *g, const sl_dp_opts *o) {
    *out = NULL;
    if (o->zero_stage < 0 || o->zero_stage > 3)
        return sl_fail(SL_ERR_INVALID, "--zero-stage %d: must be 0, 1, 2 or 3", o->zero_stage);
    sl_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    dp->comm = mesh->dp_comm;
    dp->n = mesh->dp;
    dp->r = mesh->dp_rank;
    dp->zero = o->zero_stage;
    dp->m = m;
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
    dp->m1 = sl_malloc_aligned(sizeof(float) * (size_t)dp->shard_len);
    dp->m2 = sl_malloc_aligned(sizeof(float) * (size_t)dp->shard_len);
    if (!dp->m1 || !dp->m2) goto oom;
    memset(dp->m1, 0, sizeof(float) * (size_t)dp->shard_len);
    memset(dp->m2, 0, sizeof(float) * (size_t)dp->shard_len);
    if (dp->zero) {
        dp->decay = calloc((size_t)dp->shard_len + 1, 1);
        if (!dp->decay) goto oom;
        decay_ctx dc = {dp};
        for_each_segment(dp, fill_decay, &dc);
    }
    if (dp->zero >= 2) {
        dp->gshard = sl_malloc_aligned(sizeof(float) * (size_t)dp->shard_len);
        if (!dp->gshard) goto oom;
    }
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
    if (dp->zero == 3) {
        sl_status zs = z3_build(dp, g);
        if (zs != SL_OK) {
            sl_dp_free(dp);
            return zs;
        }
        dp->pshard = sl_malloc_aligned(sizeof(float) * (size_t)(dp->shard_len + 1));
        if (!dp->pshard) goto oom;
        for (int k = 0; k < dp->nb; k++) {
            const bucket *b = &dp->b[k];
            int64_t len = b->hi - b->lo, tail = len - b->q * dp->n;
            memcpy(dp->pshard + b->soff, m->params_mem + b->lo + b->q * dp->r, sizeof(float) * (size_t)b->q);
            if (tail > 0)
                memcpy(dp->pshard + b->toff, m->params_mem + b->lo + b->q * dp->n,
                       sizeof(float) * (size_t)tail);
        }
        /* the full buffer goes; leaves point into the arena until their interval binds them */
        for (int i = 0; i < m->n_params; i++) sl_tensor_bind(m->params[i].t, dp->arena);
        sl_graph_refresh_views(g);
        sl_free_aligned(m->params_mem);
        m->params_mem = NULL;
    }
    *out = dp;
    return SL_OK;
oom:
    sl_dp_free(dp);
    return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
}

void sl_dp_free(sl_dp *dp) {
    if (!dp) return;
    for (int k = 0; k < dp->nb; k++) {
        sl_comm_req_free(dp->b[k].req);
        sl_comm_req_free(dp->b[k].req_tail);
    }
    free(dp->b);
    sl_free_aligned(dp->m1);
    sl_free_aligned(dp->m2);
    sl_free_aligned(dp->gshard);
    free(dp->decay);
    for (int j = 0; j < dp->niv; j++) sl_comm_req_free(dp->iv[j].req);
    free(dp->iv);
    free(dp->by_l);
    free(dp->pbucket);
    sl_free_aligned(dp->arena);
    sl_free_aligned(dp->pshard);
    free(dp);
}

int sl_dp_num_buckets(const sl_dp *dp) { return dp->nb; }
int sl_dp_rank(const sl_dp *dp) { return dp->r; }
int sl_dp_size(const sl_dp *dp) { return dp->n; }
void sl_dp_arm(sl_dp *dp, int armed) {
    dp->armed = armed;
    dp->next = 0;
}

static sl_status launch(sl_dp *dp, bucket *b) {
    float *g = dp->m->grads_mem;
    int64_t len = b->hi - b->lo;
    if (!dp->comm || len == 0) return SL_OK;
    if (dp->zero < 2)
        return sl_comm_all_reduce_async(dp->comm, g + b->lo, g + b->lo, (size_t)len, SL_COMM_F32, SL_COMM_SUM,
                                        &b->req);
    /* stage 2: reduce-scatter the equal parts in place (rank r's part lands at its own offset) */
    int64_t q = b->q, tail = len - q * dp->n;
    if (q > 0)
        SL_TRY(sl_comm_reduce_scatter_async(dp->comm, g + b->lo, g + b->lo + q * dp->r, (size_t)q,
                                            SL_COMM_F32, SL_COMM_SUM, &b->req));
    if (tail > 0)
        SL_TRY(sl_comm_all_reduce_async(dp->comm, g + b->lo + q * dp->n, g + b->lo + q * dp->n, (size_t)tail,
                                        SL_COMM_F32, SL_COMM_SUM, &b->req_tail));
    return SL_OK;
}

sl_status sl_dp_hook(sl_graph *g, int i, sl_tensor *n, void *user) {
    (void)g;
    (void)n;
    sl_dp *dp = user;
    if (dp->zero == 3) SL_TRY(z3_advance(dp, i));
    if (!dp->armed) return SL_OK;
    while (dp->next < dp->nb && dp->b[dp->next].ready <= i) SL_TRY(launch(dp, &dp->b[dp->next++]));
    return SL_OK;
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
        st = launch(dp, &dp->b[dp->next++]);
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
    if (wait_sec) *wait_sec += sl_time_sec() - t0;
    if (st == SL_OK && dp->zero >= 2) {
        gs_ctx c = {dp};
        for_each_segment(dp, copy_to_shard, &c);
    }
    return st;
}

/* sum of squares of rank rr's part of every bucket (tails counted for rank 0 only), in double */
static double part_sumsq(const sl_dp *dp, const float *g, int rr, int use_shard) {
    double s = 0;
    int64_t off = 0;
    for (int k = 0; k < dp->nb; k++) {
        const bucket *b = &dp->b[k];
        int64_t len = b->hi - b->lo, q = dp->zero ? b->q : len / dp->n, tail = len - q * dp->n;
        const float *p = use_shard ? dp->gshard + off : g + b->lo + q * rr;
        for (int64_t i = 0; i < q; i++) s += (double)p[i] * p[i];
        off += q;
        if (tail > 0) {
            const float *t = use_shard ? dp->gshard + off : g + b->lo + q * dp->n;
            if (rr == 0)
                for (int64_t i = 0; i < tail; i++) s += (double)t[i] * t[i];
            off += tail;
        }
    }
    return s;
}

sl_status sl_dp_clip(sl_dp *dp, float max_norm, float *norm_out) {
    double ss;
    if (dp->zero >= 2 && dp->comm) {
        double mine = part_sumsq(dp, NULL, dp->r, 1);
        SL_TRY(sl_comm_all_reduce(dp->comm, &mine, &ss, 1, SL_COMM_F64, SL_COMM_SUM));
    } else {
        /* same grouping as the sharded case: per rank part, then ranks in order */
        ss = 0;
        for (int rr = 0; rr < dp->n; rr++)
            ss = rr ? ss + part_sumsq(dp, dp->m->grads_mem, rr, 0) : part_sumsq(dp, dp->m->grads_mem, 0, 0);
    }
    float norm = (float)sqrt(ss);
    if (max_norm > 0) {
        float coef = max_norm / (norm + 1e-6f);
        if (coef < 1.0f) {
            float *g = dp->zero >= 2 ? dp->gshard : dp->m->grads_mem;
            int64_t n = dp->zero >= 2 ? dp->shard_len : dp->m->numel;
#pragma omp parallel for simd schedule(static)
            for (int64_t k = 0; k < n; k++) g[k] *= coef;
        }
    }
    *norm_out = norm;
    return SL_OK;
}

/* the AdamW element update, PyTorch operation order (see Note [AdamW order of operations]) */
static void adamw_seg(float *p, const float *g, float *m1, float *m2, const uint8_t *decay, int decay_all,
                      int64_t n, float lr, float wd, float b1, float b2, float eps, float step_size,
                      float bc2_sqrt) {
#pragma omp parallel for simd schedule(static) if (n > 32768)
    for (int64_t k = 0; k < n; k++) {
        float gk = g[k];
        if (decay ? decay[k] : decay_all) p[k] *= 1.0f - lr * wd;
        m1[k] += (1.0f - b1) * (gk - m1[k]);
        m2[k] = m2[k] * b2 + (1.0f - b2) * gk * gk;
        float denom = sqrtf(m2[k]) / bc2_sqrt + eps;
        p[k] += -step_size * (m1[k] / denom);
    }
}

typedef struct {
    sl_dp *dp;
    float lr, step_size, bc2_sqrt;
    sl_adamw_hparams hp;
} upd_ctx;
static void update_seg(void *u, int64_t lo, int64_t len, int64_t off) {
    upd_ctx *c = u;
    sl_dp *dp = c->dp;
    const float *g = dp->zero >= 2 ? dp->gshard + off : dp->m->grads_mem + lo;
    float *p = dp->zero == 3 ? dp->pshard + off : dp->m->params_mem + lo;
    adamw_seg(p, g, dp->m1 + off, dp->m2 + off, dp->decay + off, 0, len, c->lr, c->hp.weight_decay,
              c->hp.beta1, c->hp.beta2, c->hp.eps, c->step_size, c->bc2_sqrt);
}

sl_status sl_dp_optimizer_step(sl_dp *dp, float lr, int64_t t, sl_adamw_hparams hp) {
    double bc1 = 1.0 - pow((double)hp.beta1, (double)t), bc2 = 1.0 - pow((double)hp.beta2, (double)t);
    upd_ctx c = {dp, lr, (float)(lr / bc1), (float)sqrt(bc2), hp};
    if (!dp->zero) {
        for (int i = 0; i < dp->m->n_params; i++) {
            const sl_param_info *p = &dp->m->params[i];
            adamw_seg(dp->m->params_mem + p->offset, dp->m->grads_mem + p->offset, dp->m1 + p->offset,
                      dp->m2 + p->offset, NULL, p->decay, p->numel, lr, hp.weight_decay, hp.beta1, hp.beta2,
                      hp.eps, c.step_size, c.bc2_sqrt);
        }
        return SL_OK;
    }
    if (dp->zero == 3 && dp->materialized) { /* training goes on after a gather: back to the shard */
        sl_free_aligned(dp->m->params_mem);
        dp->m->params_mem = NULL;
        dp->materialized = 0;
    }
    for_each_segment(dp, update_seg, &c);
    if (!dp->comm || dp->zero == 3) return SL_OK; /* stage 3 gathers lazily in the next pass */
    /* all-gather the updated parts of every bucket, in place */
    sl_status st = SL_OK;
    float *p = dp->m->params_mem;
    for (int k = 0; k < dp->nb; k++) {
        bucket *b = &dp->b[k];
        if (b->q > 0) {
            sl_status s = sl_comm_all_gather_async(dp->comm, p + b->lo + b->q * dp->r, p + b->lo,
                                                   (size_t)b->q, SL_COMM_F32, &b->req);
            if (s != SL_OK && st == SL_OK) st = s;
        }
    }
    for (int k = 0; k < dp->nb; k++)
        if (dp->b[k].req) {
            sl_status s = sl_comm_wait(dp->b[k].req);
            dp->b[k].req = NULL;
            if (s != SL_OK && st == SL_OK) st = s;
        }
    return st;
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
    mem->param_gather_bytes = sizeof(float) * (size_t)dp->arena_len;
    mem->grad_bytes = sizeof(float) * (size_t)dp->m->numel;
    mem->grad_shard_bytes = dp->gshard ? sizeof(float) * (size_t)dp->shard_len : 0;
    mem->optim_bytes = 2 * sizeof(float) * (size_t)dp->shard_len;
}

typedef struct {
    sl_ckpt_seg *v;
    int n;
} seg_list;
static void collect_seg(void *u, int64_t lo, int64_t len, int64_t off) {
    seg_list *l = u;
    l->v[l->n++] = (sl_ckpt_seg){lo, len, off};
}

sl_status sl_dp_state(sl_dp *dp, sl_ckpt_seg **segs, int *nseg, float **m1, float **m2) {
    *m1 = dp->m1;
    *m2 = dp->m2;
    seg_list l = {calloc((size_t)(2 * dp->nb + 1), sizeof(sl_ckpt_seg)), 0};
    if (!l.v) return sl_fail(SL_ERR_NOMEM, "dp: out of memory");
    if (dp->zero)
        for_each_segment(dp, collect_seg, &l);
    else
        l.v[l.n++] = (sl_ckpt_seg){0, dp->m->numel, 0};
    *segs = l.v;
    *nseg = l.n;
    return SL_OK;
}

int sl_dp_zero_stage(const sl_dp *dp) { return dp->zero; }
