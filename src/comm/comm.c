/* The communicator: request queue, progress thread, error state, group calls, public entry points.
 *
 * Note [Progress thread and inline execution]
 * Each communicator owns one progress thread that runs queued operations in issue order; async
 * calls enqueue and return, so computation overlaps communication. A blocking call whose queue is
 * empty runs inline on the caller's thread instead (no thread hand-off: this is what keeps an
 * 8-byte all-reduce at about a microsecond). `busy` marks that someone, thread or caller, is
 * executing; at most one executes at a time, which also serialises use of the transport.
 *
 * Note [Errors are sticky]
 * The first failed operation records its status and message in the communicator and aborts the
 * transport, which tells the peers (they fail with SL_ERR_PEER instead of waiting for their own
 * deadline). Every later operation fails immediately with the recorded status. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_private.h"

double sl_comm_env_timeout(void) {
    const char *v = getenv("SUANLI_COMM_TIMEOUT");
    if (v && *v) {
        char *end;
        double t = strtod(v, &end);
        if (!*end && t > 0) return t;
        SL_LOGW("SUANLI_COMM_TIMEOUT=%s ignored (want seconds > 0)", v);
    }
    return 300.0;
}

static sl_comm_algo env_algo(void) {
    const char *v = getenv("SUANLI_COMM_ALGO");
    if (!v || !*v) return SL_COMM_ALGO_AUTO;
    for (int a = 0; a < SL_COMM_ALGO_COUNT; a++)
        if (!strcmp(v, sl_comm_algo_name((sl_comm_algo)a))) return (sl_comm_algo)a;
    SL_LOGW("SUANLI_COMM_ALGO=%s ignored (want auto|ring|rd|direct|hier)", v);
    return SL_COMM_ALGO_AUTO;
}

/* ---------------- requests and execution ---------------- */

static void task_free(sl_comm_req *t) {
    if (!t) return;
    free(t->v);
    free(t);
}

/* Drop one reference (caller holds c->mu). */
static void task_unref_locked(sl_comm_req *t) {
    if (--t->refs == 0) task_free(t);
}

static void record_error(sl_comm *c, sl_status st, const char *msg) {
    int expected = SL_OK;
    pthread_mutex_lock(&c->errmu);
    if (atomic_compare_exchange_strong(&c->err, &expected, (int)st))
        snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
    pthread_mutex_unlock(&c->errmu);
    c->tp->vt->abort(c->tp);
    if (c->local) sl_comm_abort(c->local);
    if (c->leaders) sl_comm_abort(c->leaders);
    if (c->peers) sl_comm_abort(c->peers);
}

static sl_status run_one(sl_comm *c, sl_algo_ctx *x, sl_comm_req *t) {
    switch (t->kind) {
    case T_ALLREDUCE:
        return sl_algo_allreduce(x, t->sb, t->rb, t->count, t->dt, t->op);
    case T_REDUCE:
        return sl_algo_reduce(x, t->sb, t->rb, t->count, t->dt, t->op, t->root);
    case T_BCAST:
        return sl_algo_broadcast(x, t->sb, t->rb, t->count, t->dt, t->root);
    case T_ALLGATHERV:
        return sl_algo_allgatherv(x, t->sb, t->rb, t->v, t->v + c->size, t->dt);
    case T_REDSCAT:
        return sl_algo_reduce_scatter(x, t->sb, t->rb, t->count, t->dt, t->op);
    case T_A2AV: {
        size_t n = (size_t)c->size;
        return sl_algo_alltoallv(x, t->sb, t->v, t->v + n, t->rb, t->v + 2 * n, t->v + 3 * n, t->dt);
    }
    case T_BARRIER:
        return sl_algo_barrier(x);
    case T_SEND:
    case T_RECV: {
        sl_xfer xf = {.kind = t->kind == T_SEND ? SL_XFER_SEND : SL_XFER_RECV,
                      .peer = t->root,
                      .buf = t->kind == T_SEND ? (void *)t->sb : t->rb,
                      .bytes = t->count * sl_comm_dtype_size(t->dt)};
        if (t->root == c->rank) return sl_fail(SL_ERR_INVALID, "send/recv to self (rank %d)", c->rank);
        return sl_prim_exchange(x, &xf, 1);
    }
    case T_GROUP: {
        /* consecutive sends/recvs progress together in one exchange; collectives run in order */
        sl_comm_req *k = t->children;
        while (k) {
            if (k->kind != T_SEND && k->kind != T_RECV) {
                SL_TRY(run_one(c, x, k));
                k = k->next_child;
                continue;
            }
            int n = 0;
            for (sl_comm_req *q = k; q && (q->kind == T_SEND || q->kind == T_RECV); q = q->next_child) n++;
            sl_xfer *xf = calloc((size_t)n, sizeof *xf);
            if (!xf) return sl_fail(SL_ERR_NOMEM, "group: out of memory");
            for (int i = 0; i < n; i++, k = k->next_child) {
                if (k->root == c->rank) {
                    free(xf);
                    return sl_fail(SL_ERR_INVALID, "send/recv to self (rank %d)", c->rank);
                }
                xf[i] = (sl_xfer){.kind = k->kind == T_SEND ? SL_XFER_SEND : SL_XFER_RECV,
                                  .peer = k->root,
                                  .buf = k->kind == T_SEND ? (void *)k->sb : k->rb,
                                  .bytes = k->count * sl_comm_dtype_size(k->dt)};
            }
            sl_status st = sl_prim_exchange(x, xf, n);
            free(xf);
            SL_TRY(st);
        }
        return SL_OK;
    }
    }
    return sl_fail(SL_ERR_INTERNAL, "unknown comm task %d", (int)t->kind);
}

static void win_release(sl_comm *c, sl_win *w);

/* Execute t (caller has set busy). Records status/message in t. */
static void execute(sl_comm *c, sl_comm_req *t) {
    int err = atomic_load(&c->err);
    if (err != SL_OK) {
        t->st = (sl_status)err;
        pthread_mutex_lock(&c->errmu);
        snprintf(t->msg, sizeof t->msg, "communicator already failed: %.250s", c->errmsg);
        pthread_mutex_unlock(&c->errmu);
        return;
    }
    sl_algo_ctx x = {.tp = c->tp,
                     .rank = c->rank,
                     .size = c->size,
                     .deadline = sl_time_sec() + c->timeout,
                     .scratch = &c->scratch,
                     .scratch_cap = &c->scratch_cap,
                     .algo = c->algo,
                     .local = c->local,
                     .leaders = c->leaders,
                     .peers = c->peers,
                     .wins = c->wins,
                     .win_seq = &c->win_seq,
                     .stage = &c->stage,
                     .stage_state = &c->stage_state};
    sl_clear_error();
    t->st = run_one(c, &x, t);
    if (t->st != SL_OK) {
        snprintf(t->msg, sizeof t->msg, "rank %d: %s", c->rank, sl_errmsg());
        record_error(c, t->st, t->msg);
    }
}

static void complete_locked(sl_comm *c, sl_comm_req *t) {
    if (t->kind == T_GROUP) {
        sl_comm_req *k = t->children;
        while (k) {
            sl_comm_req *nx = k->next_child;
            k->st = t->st;
            memcpy(k->msg, t->msg, sizeof k->msg);
            k->done = 1;
            task_unref_locked(k);
            k = nx;
        }
    }
    t->done = 1;
    pthread_cond_broadcast(&c->cv_done);
    task_unref_locked(t);
}

static void *progress_main(void *arg) {
    sl_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while ((!c->qhead || c->busy) && !c->stop) pthread_cond_wait(&c->cv_work, &c->mu);
        if (!c->qhead && c->stop) break;
        if (c->busy) continue;
        sl_comm_req *t = c->qhead;
        c->qhead = t->next;
        if (!c->qhead) c->qtail = NULL;
        c->busy = 1;
        pthread_mutex_unlock(&c->mu);
        execute(c, t);
        pthread_mutex_lock(&c->mu);
        c->busy = 0;
        complete_locked(c, t);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Wait until nothing is queued or running, then mark busy: the caller executes exclusively. */
void sl_comm_acquire(sl_comm *c) {
    pthread_mutex_lock(&c->mu);
    while (c->qhead || c->busy) pthread_cond_wait(&c->cv_done, &c->mu);
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);
}
void sl_comm_release(sl_comm *c) {
    pthread_mutex_lock(&c->mu);
    c->busy = 0;
    if (c->qhead) pthread_cond_broadcast(&c->cv_work);
    pthread_cond_broadcast(&c->cv_done);
    pthread_mutex_unlock(&c->mu);
}

/* ---------------- group calls ---------------- */
static _Thread_local int g_depth;
static _Thread_local sl_comm_req *g_head, *g_tail;

void sl_comm_group_start(void) { g_depth++; }

static void enqueue(sl_comm *c, sl_comm_req *t) {
    pthread_mutex_lock(&c->mu);
    t->next = NULL;
    if (c->qtail)
        c->qtail->next = t;
    else
        c->qhead = t;
    c->qtail = t;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
}

sl_status sl_comm_group_end(void) {
    if (g_depth <= 0) return sl_fail(SL_ERR_INVALID, "sl_comm_group_end without group_start");
    if (--g_depth > 0) return SL_OK;
    sl_status st = SL_OK;
    while (g_head) {
        sl_comm *c = g_head->comm;
        sl_comm_req *g = calloc(1, sizeof *g), *rest = NULL, *rest_tail = NULL, **ctail = NULL;
        if (!g) {
            st = sl_fail(SL_ERR_NOMEM, "group: out of memory");
            c = NULL; /* fall through: fail everything left */
        } else {
            g->comm = c;
            g->kind = T_GROUP;
            g->refs = 1;
            ctail = &g->children;
        }
        for (sl_comm_req *t = g_head, *nx; t; t = nx) {
            nx = t->next_child;
            t->next_child = NULL;
            if (c && t->comm == c) {
                *ctail = t;
                ctail = &t->next_child;
            } else if (!c) {
                pthread_mutex_lock(&t->comm->mu);
                t->st = st;
                snprintf(t->msg, sizeof t->msg, "group: out of memory");
                t->done = 1;
                task_unref_locked(t);
                pthread_mutex_unlock(&t->comm->mu);
            } else {
                if (rest_tail)
                    rest_tail->next_child = t;
                else
                    rest = t;
                rest_tail = t;
            }
        }
        g_head = rest;
        if (c) enqueue(c, g);
    }
    g_tail = NULL;
    return st;
}

/* ---------------- submission ---------------- */
static sl_comm_req *task_new(sl_comm *c, task_kind kind) {
    sl_comm_req *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->comm = c;
    t->kind = kind;
    t->refs = 1; /* the executor's */
    return t;
}

/* Submit t. req != NULL: async, *req gets a handle. req == NULL: blocking. */
static sl_status submit(sl_comm *c, sl_comm_req *t, sl_comm_req **req) {
    if (req) {
        t->refs++;
        *req = t;
    }
    if (g_depth > 0) {
        if (g_tail)
            g_tail->next_child = t;
        else
            g_head = t;
        g_tail = t;
        return SL_OK;
    }
    if (req) {
        enqueue(c, t);
        return SL_OK;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->qhead && !c->busy) { /* inline fast path */
        c->busy = 1;
        pthread_mutex_unlock(&c->mu);
        execute(c, t);
        pthread_mutex_lock(&c->mu);
        c->busy = 0;
        /* wake the progress thread only if work arrived meanwhile: a needless wake-up costs a
         * context switch on every call when the process is pinned to one core */
        if (c->qhead) pthread_cond_broadcast(&c->cv_work);
        sl_status st = t->st;
        if (st != SL_OK) sl_fail(st, "%s", t->msg);
        task_unref_locked(t);
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    pthread_mutex_unlock(&c->mu);
    t->refs++;
    enqueue(c, t);
    return sl_comm_wait(t);
}

sl_status sl_comm_test(sl_comm_req *t, int *done) {
    sl_comm *c = t->comm;
    pthread_mutex_lock(&c->mu);
    *done = t->done;
    sl_status st = t->done ? t->st : SL_OK;
    if (t->done && st != SL_OK) sl_fail(st, "%s", t->msg);
    pthread_mutex_unlock(&c->mu);
    return st;
}

sl_status sl_comm_wait(sl_comm_req *t) {
    if (!t) return sl_fail(SL_ERR_INVALID, "sl_comm_wait: NULL request");
    sl_comm *c = t->comm;
    double guard = sl_time_sec() + 2 * c->timeout + 30;
    int aborted = 0;
    pthread_mutex_lock(&c->mu);
    while (!t->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&c->cv_done, &c->mu, &ts);
        if (!t->done && !aborted && sl_time_sec() > guard) {
            /* operations queued behind slow ones: bound the total wait too */
            aborted = 1;
            pthread_mutex_unlock(&c->mu);
            record_error(c, SL_ERR_TIMEOUT, "wait exceeded twice the communicator timeout");
            atomic_store(&c->abort_flag, 1);
            pthread_mutex_lock(&c->mu);
        }
    }
    sl_status st = t->st;
    if (st != SL_OK) sl_fail(st, "%s", t->msg);
    task_unref_locked(t);
    pthread_mutex_unlock(&c->mu);
    return st;
}

void sl_comm_req_free(sl_comm_req *t) {
    if (t) (void)sl_comm_wait(t);
}

/* ---------------- entry points ---------------- */
#define CHECK_COMM(c)                                                                                        \
    do {                                                                                                     \
        if (!(c)) return sl_fail(SL_ERR_INVALID, "%s: NULL communicator", __func__);                         \
    } while (0)

static sl_status check_dt(const char *fn, sl_comm_dtype dt, int reduce, sl_comm_redop op) {
    if ((unsigned)dt >= SL_COMM_DTYPE_COUNT) return sl_fail(SL_ERR_INVALID, "%s: bad dtype %d", fn, (int)dt);
    if (reduce && (dt == SL_COMM_U8 || (unsigned)op >= SL_COMM_REDOP_COUNT))
        return sl_fail(SL_ERR_INVALID, "%s: cannot reduce dtype %s with op %d", fn, sl_comm_dtype_name(dt),
                       (int)op);
    return SL_OK;
}
static sl_status check_root(const char *fn, const sl_comm *c, int root) {
    if (root < 0 || root >= c->size)
        return sl_fail(SL_ERR_INVALID, "%s: rank %d out of range (size %d)", fn, root, c->size);
    return SL_OK;
}
#define NEW_TASK(kind)                                                                                       \
    sl_comm_req *t = task_new(c, kind);                                                                      \
    if (!t) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", __func__)

sl_status sl_comm_all_reduce_async(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                   sl_comm_redop op, sl_comm_req **req) {
    CHECK_COMM(c);
    SL_TRY(check_dt(__func__, dt, 1, op));
    NEW_TASK(T_ALLREDUCE);
    t->sb = sb, t->rb = rb, t->count = count, t->dt = dt, t->op = op;
    return submit(c, t, req);
}
sl_status sl_comm_all_reduce(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                             sl_comm_redop op) {
    return sl_comm_all_reduce_async(c, sb, rb, count, dt, op, NULL);
}

sl_status sl_comm_reduce_async(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                               sl_comm_redop op, int root, sl_comm_req **req) {
    CHECK_COMM(c);
    SL_TRY(check_dt(__func__, dt, 1, op));
    SL_TRY(check_root(__func__, c, root));
    NEW_TASK(T_REDUCE);
    t->sb = sb, t->rb = rb, t->count = count, t->dt = dt, t->op = op, t->root = root;
    return submit(c, t, req);
}
sl_status sl_comm_reduce(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                         sl_comm_redop op, int root) {
    return sl_comm_reduce_async(c, sb, rb, count, dt, op, root, NULL);
}

sl_status sl_comm_broadcast_async(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                  int root, sl_comm_req **req) {
    CHECK_COMM(c);
    SL_TRY(check_dt(__func__, dt, 0, SL_COMM_SUM));
    SL_TRY(check_root(__func__, c, root));
    NEW_TASK(T_BCAST);
    t->sb = sb, t->rb = rb, t->count = count, t->dt = dt, t->root = root;
    return submit(c, t, req);
}
sl_status sl_comm_broadcast(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt, int root) {
    return sl_comm_broadcast_async(c, sb, rb, count, dt, root, NULL);
}

sl_status sl_comm_all_gatherv_async(sl_comm *c, const void *sb, void *rb, const size_t *counts,
                                    const size_t *displs, sl_comm_dtype dt, sl_comm_req **req) {
    CHECK_COMM(c);
    SL_TRY(check_dt(__func__, dt, 0, SL_COMM_SUM));
    size_t n = (size_t)c->size;
    NEW_TASK(T_ALLGATHERV);
    if (!(t->v = malloc(2 * n * sizeof(size_t)))) {
        task_free(t);
        return sl_fail(SL_ERR_NOMEM, "%s: out of memory", __func__);
    }
    memcpy(t->v, counts, n * sizeof(size_t));
    memcpy(t->v + n, displs, n * sizeof(size_t));
    t->sb = sb, t->rb = rb, t->dt = dt;
    return submit(c, t, req);
}
sl_status sl_comm_all_gatherv(sl_comm *c, const void *sb, void *rb, const size_t *counts,
                              const size_t *displs, sl_comm_dtype dt) {
    return sl_comm_all_gatherv_async(c, sb, rb, counts, displs, dt, NULL);
}

sl_status sl_comm_all_gather_async(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                   sl_comm_req **req) {
    CHECK_COMM(c);
    size_t n = (size_t)c->size, stackv[128] = {0}, *v = n <= 64 ? stackv : malloc(2 * n * sizeof(size_t));
    if (!v) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", __func__);
    for (size_t i = 0; i < n; i++) v[i] = count, v[n + i] = i * count;
    sl_status st = sl_comm_all_gatherv_async(c, sb, rb, v, v + n, dt, req);
    if (v != stackv) free(v);
    return st;
}
sl_status sl_comm_all_gather(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt) {
    return sl_comm_all_gather_async(c, sb, rb, count, dt, NULL);
}

sl_status sl_comm_reduce_scatter_async(sl_comm *c, const void *sb, void *rb, size_t rc, sl_comm_dtype dt,
                                       sl_comm_redop op, sl_comm_req **req) {
    CHECK_COMM(c);
    SL_TRY(check_dt(__func__, dt, 1, op));
    NEW_TASK(T_REDSCAT);
    t->sb = sb, t->rb = rb, t->count = rc, t->dt = dt, t->op = op;
    return submit(c, t, req);
}
sl_status sl_comm_reduce_scatter(sl_comm *c, const void *sb, void *rb, size_t rc, sl_comm_dtype dt,
                                 sl_comm_redop op) {
    return sl_comm_reduce_scatter_async(c, sb, rb, rc, dt, op, NULL);
}

sl_status sl_comm_all_to_allv_async(sl_comm *c, const void *sb, const size_t *sc, const size_t *sd, void *rb,
                                    const size_t *rc, const size_t *rd, sl_comm_dtype dt, sl_comm_req **req) {
    CHECK_COMM(c);
    SL_TRY(check_dt(__func__, dt, 0, SL_COMM_SUM));
    size_t n = (size_t)c->size;
    NEW_TASK(T_A2AV);
    if (!(t->v = malloc(4 * n * sizeof(size_t)))) {
        task_free(t);
        return sl_fail(SL_ERR_NOMEM, "%s: out of memory", __func__);
    }
    memcpy(t->v, sc, n * sizeof(size_t));
    memcpy(t->v + n, sd, n * sizeof(size_t));
    memcpy(t->v + 2 * n, rc, n * sizeof(size_t));
    memcpy(t->v + 3 * n, rd, n * sizeof(size_t));
    t->sb = sb, t->rb = rb, t->dt = dt;
    return submit(c, t, req);
}
sl_status sl_comm_all_to_allv(sl_comm *c, const void *sb, const size_t *sc, const size_t *sd, void *rb,
                              const size_t *rc, const size_t *rd, sl_comm_dtype dt) {
    return sl_comm_all_to_allv_async(c, sb, sc, sd, rb, rc, rd, dt, NULL);
}

sl_status sl_comm_all_to_all_async(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                   sl_comm_req **req) {
    CHECK_COMM(c);
    size_t n = (size_t)c->size, stackv[128] = {0}, *v = n <= 64 ? stackv : malloc(2 * n * sizeof(size_t));
    if (!v) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", __func__);
    for (size_t i = 0; i < n; i++) v[i] = count, v[n + i] = i * count;
    sl_status st = sl_comm_all_to_allv_async(c, sb, v, v + n, rb, v, v + n, dt, req);
    if (v != stackv) free(v);
    return st;
}
sl_status sl_comm_all_to_all(sl_comm *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt) {
    return sl_comm_all_to_all_async(c, sb, rb, count, dt, NULL);
}

sl_status sl_comm_send_async(sl_comm *c, const void *buf, size_t count, sl_comm_dtype dt, int peer,
                             sl_comm_req **req) {
    CHECK_COMM(c);
    SL_TRY(check_dt(__func__, dt, 0, SL_COMM_SUM));
    SL_TRY(check_root(__func__, c, peer));
    if (peer == c->rank)
        return sl_fail(SL_ERR_INVALID, "%s: send to self (rank %d) is not supported", __func__, peer);
    NEW_TASK(T_SEND);
    t->sb = buf, t->count = count, t->dt = dt, t->root = peer;
    return submit(c, t, req);
}
sl_status sl_comm_send(sl_comm *c, const void *buf, size_t count, sl_comm_dtype dt, int peer) {
    return sl_comm_send_async(c, buf, count, dt, peer, NULL);
}
sl_status sl_comm_recv_async(sl_comm *c, void *buf, size_t count, sl_comm_dtype dt, int peer,
                             sl_comm_req **req) {
    CHECK_COMM(c);
    SL_TRY(check_dt(__func__, dt, 0, SL_COMM_SUM));
    SL_TRY(check_root(__func__, c, peer));
    if (peer == c->rank)
        return sl_fail(SL_ERR_INVALID, "%s: receive from self (rank %d) is not supported", __func__, peer);
    NEW_TASK(T_RECV);
    t->rb = buf, t->count = count, t->dt = dt, t->root = peer;
    return submit(c, t, req);
}
sl_status sl_comm_recv(sl_comm *c, void *buf, size_t count, sl_comm_dtype dt, int peer) {
    return sl_comm_recv_async(c, buf, count, dt, peer, NULL);
}
sl_status sl_comm_barrier_async(sl_comm *c, sl_comm_req **req) {
    CHECK_COMM(c);
    NEW_TASK(T_BARRIER);
    return submit(c, t, req);
}
sl_status sl_comm_barrier(sl_comm *c) { return sl_comm_barrier_async(c, NULL); }

/* ---------------- symmetric memory (Note [Symmetric windows] in comm_internal.h) ---------------- */
/* SUANLI_COMM_WINDOWS=0: sl_comm_mem_alloc hands out private memory (A/B comparisons; must be the same
 * on every rank, else the ranks with windows wait for the others until the deadline) */
static int env_windows(void) {
    const char *v = getenv("SUANLI_COMM_WINDOWS");
    return !(v && !strcmp(v, "0"));
}

static void win_release(sl_comm *c, sl_win *w) {
    if (w->shared)
        c->tp->win->release(c->tp, w);
    else
        sl_free_aligned(w->base);
    free(w);
}

sl_status sl_comm_mem_alloc(sl_comm *c, size_t bytes, void **ptr) {
    CHECK_COMM(c);
    if (!ptr) return sl_fail(SL_ERR_INVALID, "%s: NULL ptr", __func__);
    *ptr = NULL;
    sl_win *w = calloc(1, sizeof *w);
    if (!w) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", __func__);
    w->bytes = bytes;
    sl_comm_acquire(c); /* queued operations finish first; the transport is ours */
    sl_status st = (sl_status)atomic_load(&c->err);
    if (st != SL_OK) {
        pthread_mutex_lock(&c->errmu);
        sl_fail(st, "%s: communicator already failed: %.250s", __func__, c->errmsg);
        pthread_mutex_unlock(&c->errmu);
    } else if (c->tp->win && env_windows()) {
        w->id = c->win_ids++;
        sl_clear_error();
        st = c->tp->win->alloc(c->tp, w, sl_time_sec() + c->timeout);
        if (st == SL_ERR_IO || st == SL_ERR_NOMEM) {
            /* some rank could not create or map its part (/dev/shm full?): every rank saw the same
             * verdict, so all fall back to private memory together */
            SL_LOGW("sl_comm_mem_alloc: rank %d: %s; using private memory (no direct window algorithms)",
                    c->rank, sl_errmsg());
            w->base = sl_malloc_aligned(bytes ? bytes : 1);
            st = w->base ? SL_OK : sl_fail(SL_ERR_NOMEM, "%s: cannot allocate %zu bytes", __func__, bytes);
        } else if (st == SL_ERR_TIMEOUT || st == SL_ERR_PEER || st == SL_ERR_ABORTED) {
            char msg[300];
            snprintf(msg, sizeof msg, "rank %d: %s", c->rank, sl_errmsg());
            record_error(c, st, msg); /* the FIFOs may be out of step: the communicator is done */
            sl_fail(st, "%s", msg);
        }
    } else { /* tcp, mpi, several hosts: private memory, ordinary algorithms */
        w->id = c->win_ids++;
        w->base = sl_malloc_aligned(bytes ? bytes : 1);
        if (!w->base) st = sl_fail(SL_ERR_NOMEM, "%s: cannot allocate %zu bytes", __func__, bytes);
    }
    if (st == SL_OK) {
        w->next = c->wins;
        c->wins = w;
        *ptr = w->base;
    } else {
        free(w);
    }
    sl_comm_release(c);
    return st;
}

sl_status sl_comm_mem_free(sl_comm *c, void *ptr) {
    CHECK_COMM(c);
    if (!ptr) return SL_OK;
    sl_comm_acquire(c); /* no queued operation may still use it */
    sl_win **pw = &c->wins;
    while (*pw && (*pw)->base != ptr) pw = &(*pw)->next;
    sl_win *w = *pw;
    if (w) *pw = w->next;
    sl_comm_release(c);
    if (!w)
        return sl_fail(SL_ERR_INVALID, "%s: %p was not returned by sl_comm_mem_alloc on this communicator",
                       __func__, ptr);
    win_release(c, w);
    return SL_OK;
}

int sl_comm_mem_is_shared(const sl_comm *c, const void *ptr, size_t bytes) {
    return c && sl_win_find(c->wins, ptr, bytes) != NULL;
}

/* ---------------- lifetime ---------------- */
int sl_comm_rank(const sl_comm *c) { return c->rank; }
int sl_comm_size(const sl_comm *c) { return c->size; }
sl_comm_transport_kind sl_comm_transport(const sl_comm *c) { return c->tp->kind; }
sl_status sl_comm_async_error(sl_comm *c) { return (sl_status)atomic_load(&c->err); }
void sl_comm_set_algo(sl_comm *c, sl_comm_algo a) { c->algo = a; }
int sl_comm_nhosts(const sl_comm *c) { return c->nhosts > 0 ? c->nhosts : 1; }
int sl_comm_host_of(const sl_comm *c, int rank) {
    return c->host_of && rank >= 0 && rank < c->size ? c->host_of[rank] : 0;
}

void sl_comm_abort(sl_comm *c) {
    if (!c) return;
    atomic_store(&c->abort_flag, 1);
    record_error(c, SL_ERR_ABORTED, "communicator aborted");
}

sl_status sl_comm_from_transport(sl_transport *tp, const sl_comm_opts *opts, const char *name,
                                 const char *local_ip, const int *world_ranks, int mpi_tag, sl_comm **out) {
    sl_comm *c = calloc(1, sizeof *c);
    if (!c) {
        tp->vt->destroy(tp);
        return sl_fail(SL_ERR_NOMEM, "communicator: out of memory");
    }
    c->tp = tp;
    c->rank = tp->rank;
    c->size = tp->size;
    tp->abort_flag = &c->abort_flag;
    c->timeout = opts && opts->timeout_sec > 0 ? opts->timeout_sec : sl_comm_env_timeout();
    c->algo = env_algo();
    c->stage_state = env_windows() ? 0 : -1;
    c->opts = opts ? *opts : (sl_comm_opts){0};
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->local_ip, sizeof c->local_ip, "%s", local_ip ? local_ip : "127.0.0.1");
    c->mpi_tag = mpi_tag;
    if (world_ranks) {
        c->world_ranks = malloc(sizeof(int) * (size_t)c->size);
        if (c->world_ranks) memcpy(c->world_ranks, world_ranks, sizeof(int) * (size_t)c->size);
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->errmu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    if (sl_thread_spawn(&c->thread, progress_main, c) != 0) {
        tp->vt->destroy(tp);
        free(c->world_ranks);
        free(c);
        return sl_fail(SL_ERR_INTERNAL, "communicator: cannot start progress thread: %s", strerror(errno));
    }
    *out = c;
    return SL_OK;
}

void sl_comm_free(sl_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    sl_comm_free(c->local);
    sl_comm_free(c->leaders);
    sl_comm_free(c->peers);
    free(c->host_of);
    if (c->stage) win_release(c, c->stage);
    while (c->wins) { /* windows the caller did not free */
        sl_win *w = c->wins;
        c->wins = w->next;
        win_release(c, w);
    }
    c->tp->vt->destroy(c->tp);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->errmu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
    sl_free_aligned(c->scratch);
    free(c->world_ranks);
    free(c);
}
