/* Direct algorithms on symmetric windows (sl_comm_mem_alloc): every rank loads its peers' buffers
 * straight from their windows instead of passing the bytes through slot FIFOs.
 *
 * Note [Direct window algorithms]
 * All-reduce of N bytes over n ranks: the vector is cut into n slices (the ring's blocks); rank r
 * reduces slice r reading the n inputs in rank order 0..n-1 from every rank's send buffer and writes
 * it into its own receive buffer, then copies every other slice p from rank p's receive buffer.
 * Each slice is processed in chunks (SUANLI_COMM_WIN_CHUNK_KB, default 128 KiB) and the copy of chunk k-1
 * follows the reduction of chunk k, so a peer reads a reduced chunk while it is still in the cache that
 * produced it: a 2-rank all-reduce moves about 4N bytes of DRAM traffic (read both inputs, write both
 * outputs; the peer slices are written with streaming stores from SUANLI_COMM_WIN_NT_KB on) against about 5N
 * for the slot FIFOs (Note [Slot FIFOs]). One-shot variant (SUANLI_COMM_WIN_ONESHOT_KB, out of place only,
 * off by default): every rank reduces the whole vector from all n inputs; no chunk hand-off, n-fold reads;
 * same results. Reduce-scatter: rank r reduces slice r of the n send buffers in rank order into its receive
 * buffer. All-gather(v): each rank puts its block in its own receive buffer, then copies the others'
 * blocks from their receive buffers.
 *
 * Synchronisation uses each rank's control words (sl_win_vt.ctl, written only by their owner):
 *   ARRIVE = s  after rank posted the descriptor of its s-th window operation (its inputs are ready);
 *   DESC..     what it was called with: kind, dtype, op, count, and (window id, offset) of the
 *              symmetric buffers; every rank compares every peer's with its own before it reads
 *              peer memory, so asymmetric use is an error on every rank, never wrong data;
 *   PROGRESS = s << 24 | k  (all-reduce) rank has reduced and stored chunks 0..k-1 of its slice;
 *   DONE = s   rank no longer reads peer memory for operation s; nobody returns (and so nobody lets
 *              its caller overwrite a buffer) before every peer is DONE.
 * In place works because rank p's slice p of my buffer is read only by rank p during its reduction,
 * and I overwrite it with the result only after p's PROGRESS says that chunk is reduced. Waits are the
 * transport's (deadline, abort flag, dead peer: as in exchange). Only ranks that chose the window
 * path post anything; a rank that did not (its buffers are not in a window) never arrives, and the
 * others fail at the deadline, as with any other mismatched call.
 *
 * Results: for n = 2 each element is a op b of the two inputs, bitwise what the ring computes (IEEE
 * sum, product, max and min of two operands commute); for n > 2 they are bitwise those of the direct
 * algorithm (SUANLI_COMM_ALGO=direct: rank order 0..n-1), which differ from the ring's order but are
 * the same on every rank and in every run, and equal between all-reduce and reduce-scatter (ZeRO-2
 * vs plain data parallelism). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

enum { W_ARRIVE = 0, W_KIND, W_COUNT, W_SBWIN, W_SBOFF, W_RBWIN, W_RBOFF, W_DONE, W_PROGRESS = 8 };
enum { K_ALLREDUCE = 1, K_REDSCAT, K_ALLGATHER };
#define SYM_CHUNK_DEFAULT_KB 128 /* bytes of one slice reduced before its peers copy it */
#define SYM_TMP (16u << 10)      /* n > 2: accumulate in an L1-resident block */
#define SYM_ONESHOT_DEFAULT_KB 0 /* out-of-place all-reduces up to this size: one shot */
#define SYM_NT_DEFAULT_KB 8192   /* copies of transfers this large bypass the cache (0: never) */
#define NO_WIN UINT64_MAX

sl_win *sl_win_find(sl_win *list, const void *p, size_t bytes) {
    const char *q = p;
    for (sl_win *w = list; w; w = w->next)
        if (w->shared && q >= w->base && bytes <= w->bytes && (size_t)(q - w->base) <= w->bytes - bytes)
            return w;
    return NULL;
}

/* KiB-valued knobs, read once: SUANLI_COMM_WIN_CHUNK_KB (every rank must use the same value: it sets
 * the chunk count that the PROGRESS words count, so it is part of the all-reduce descriptor) and
 * SUANLI_COMM_WIN_NT_KB (a local choice). */
static size_t env_kb(const char *name, size_t dflt_kb, size_t lo_kb, _Atomic size_t *cached) {
    size_t v = atomic_load_explicit(cached, memory_order_relaxed);
    if (v) return v - 1;
    v = dflt_kb << 10;
    const char *e = getenv(name);
    if (e && *e) {
        char *end;
        unsigned long long k = strtoull(e, &end, 10);
        if (*end || k < lo_kb || k > (1u << 30))
            SL_LOGW("%s=%s ignored (want %zu..%u)", name, e, lo_kb, 1u << 30);
        else
            v = (size_t)k << 10;
    }
    atomic_store_explicit(cached, v + 1, memory_order_relaxed);
    return v;
}
static size_t sym_chunk(void) {
    static _Atomic size_t cached;
    return env_kb("SUANLI_COMM_WIN_CHUNK_KB", SYM_CHUNK_DEFAULT_KB, 4, &cached);
}
static size_t sym_oneshot_max(void) {
    static _Atomic size_t cached;
    return env_kb("SUANLI_COMM_WIN_ONESHOT_KB", SYM_ONESHOT_DEFAULT_KB, 0, &cached);
}
static size_t sym_nt_min(void) {
    static _Atomic size_t cached;
    return env_kb("SUANLI_COMM_WIN_NT_KB", SYM_NT_DEFAULT_KB, 0, &cached);
}

static size_t blk_off(size_t count, int n, int b) {
    size_t q = count / (size_t)n, r = count % (size_t)n;
    return (size_t)b * q + ((size_t)b < r ? (size_t)b : r);
}
static size_t blk_len(size_t count, int n, int b) {
    return count / (size_t)n + ((size_t)b < count % (size_t)n ? 1 : 0);
}

static void copy_out(void *dst, const void *src, size_t len, int nt) {
    if (nt)
        sl_comm_stream_copy(dst, src, len); /* Note [Non-temporal stores] in transport/fifo.c */
    else
        memcpy(dst, src, len);
}

typedef struct sym_op {
    sl_algo_ctx *c;
    const sl_win_vt *vt;
    _Atomic uint64_t *mine;
    uint64_t seq, desc[7]; /* desc[i] = control word W_KIND + i */
} sym_op;

/* Post the descriptor and ARRIVE, wait for every peer's, and check they called the same thing. */
static sl_status sym_begin(sym_op *o, const char *what) {
    sl_algo_ctx *c = o->c;
    sl_transport *tp = c->tp;
    o->vt = tp->win;
    o->mine = o->vt->ctl(tp, c->rank);
    o->seq = ++*c->win_seq;
    for (int i = 0; i < 6; i++) atomic_store_explicit(&o->mine[W_KIND + i], o->desc[i], memory_order_relaxed);
    atomic_store_explicit(&o->mine[W_ARRIVE], o->seq, memory_order_release);
    for (int i = 1; i < c->size; i++) {
        int p = (c->rank + i) % c->size;
        SL_TRY(o->vt->wait(tp, p, W_ARRIVE, o->seq, c->deadline));
        _Atomic uint64_t *pc = o->vt->ctl(tp, p);
        uint64_t ps = atomic_load_explicit(&pc[W_ARRIVE], memory_order_acquire);
        if (ps != o->seq)
            return sl_fail(SL_ERR_INVALID,
                           "window %s: rank %d is at window operation %llu, this rank at %llu (ranks issued "
                           "different operations, or passed window memory on some ranks only)",
                           what, p, (unsigned long long)ps, (unsigned long long)o->seq);
        for (int k = 0; k < 6; k++) {
            uint64_t v = atomic_load_explicit(&pc[W_KIND + k], memory_order_relaxed);
            if (v == o->desc[k]) continue;
            static const char *field[] = {"kind/dtype/op/chunk",   "count",
                                          "send-buffer window",    "send-buffer offset",
                                          "receive-buffer window", "receive-buffer offset"};
            return sl_fail(SL_ERR_INVALID,
                           "window %s: rank %d passed %s %llu, this rank %llu (symmetric memory: every rank "
                           "must pass buffers at the same offset of the same sl_comm_mem_alloc window)",
                           what, p, field[k], (unsigned long long)v, (unsigned long long)o->desc[k]);
        }
    }
    return SL_OK;
}

/* DONE barrier: nobody returns while a peer may still read its buffers. */
static sl_status sym_end(sym_op *o) {
    sl_algo_ctx *c = o->c;
    atomic_store_explicit(&o->mine[W_DONE], o->seq, memory_order_release);
    for (int i = 1; i < c->size; i++)
        SL_TRY(o->vt->wait(c->tp, (c->rank + i) % c->size, W_DONE, o->seq, c->deadline));
    return SL_OK;
}

/* dst[0..m) = in[0] op in[1] op ... op in[n-1] (rank order); dst may alias any in[i] */
static void reduce_n(sl_comm_dtype dt, sl_comm_redop op, char *dst, const char *const *in, int n, size_t m,
                     char *tmp) {
    size_t es = sl_comm_dtype_size(dt);
    if (n == 2) {
        sl_comm_reduce_kernel(dt, op, dst, in[0], in[1], m);
        return;
    }
    size_t tb = SYM_TMP / es;
    for (size_t o = 0; o < m; o += tb) {
        size_t k = m - o < tb ? m - o : tb;
        sl_comm_reduce_kernel(dt, op, tmp, in[0] + o * es, in[1] + o * es, k);
        for (int i = 2; i < n; i++) sl_comm_reduce_kernel(dt, op, tmp, tmp, in[i] + o * es, k);
        memcpy(dst + o * es, tmp, k * es);
    }
}

static uint64_t kind_word(int kind, sl_comm_dtype dt, sl_comm_redop op) {
    return (uint64_t)kind | (uint64_t)dt << 8 | (uint64_t)op << 16;
}

/* Work space of a reduction over the n ranks' inputs, in the communicator's cached scratch buffer: the
 * L1-resident accumulation block (used when n > 2) followed by the n input pointers. */
static sl_status sym_work(sl_algo_ctx *c, char **tmp, const char ***in, const char *what) {
    char *s = sl_algo_scratch(c, SYM_TMP + sizeof(char *) * (size_t)c->size);
    if (!s) return sl_fail(SL_ERR_NOMEM, "window %s: out of memory", what);
    *tmp = s;
    *in = (const char **)(void *)(s + SYM_TMP);
    return SL_OK;
}

sl_status sl_sym_allreduce(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                           sl_comm_redop op) {
    size_t es = sl_comm_dtype_size(dt), bytes = count * es;
    sl_win *ws = c->tp->win ? sl_win_find(c->wins, sb, bytes) : NULL, *wr;
    if (!ws || !(wr = sl_win_find(c->wins, rb, bytes)) || c->size < 2 || !count) return SL_ERR_UNSUPPORTED;
    int n = c->size, r = c->rank;
    size_t so = (size_t)((const char *)sb - ws->base), ro = (size_t)((char *)rb - wr->base);
    size_t chunk = sym_chunk(); /* in the descriptor: ranks must cut the slices alike */
    size_t ce = chunk / es, nc = (blk_len(count, n, 0) + ce - 1) / ce;
    if (nc >= (1u << 24)) return SL_ERR_UNSUPPORTED;      /* PROGRESS counts chunks in 24 bits */
    int oneshot = sb != rb && bytes <= sym_oneshot_max(); /* in the descriptor too */
    sym_op o = {
        .c = c,
        .desc = {kind_word(K_ALLREDUCE, dt, op) | (uint64_t)(chunk >> 10) << 24 | (uint64_t)oneshot << 56,
                 count, ws->id, so, wr->id, ro}};
    char *tmp = NULL;
    const char **in = NULL;
    SL_TRY(sym_work(c, &tmp, &in, "all-reduce"));
    sl_status st = sym_begin(&o, "all-reduce");
    if (st == SL_OK && oneshot) { /* every rank reduces the whole vector (in rank order, like the slices) */
        for (int p = 0; p < n; p++) in[p] = ws->peer[p] + so;
        reduce_n(dt, op, rb, in, n, count, tmp);
        if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, count, n);
        return sym_end(&o);
    }
    size_t mo = blk_off(count, n, r), ml = blk_len(count, n, r);
    int nt = sym_nt_min() && bytes >= sym_nt_min();
    for (size_t k = 0; k <= nc && st == SL_OK; k++) {
        if (k < nc) { /* reduce chunk k of my slice */
            size_t e0 = k * ce, m = e0 < ml ? (ml - e0 < ce ? ml - e0 : ce) : 0;
            if (m) {
                for (int p = 0; p < n; p++) in[p] = ws->peer[p] + so + (mo + e0) * es;
                char *dst = (char *)rb + (mo + e0) * es;
                reduce_n(dt, op, dst, in, n, m, tmp);
                if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, dst, m, n);
            }
            atomic_store_explicit(&o.mine[W_PROGRESS], o.seq << 24 | (k + 1), memory_order_release);
        }
        if (k == 0) continue;
        size_t e0 = (k - 1) * ce; /* copy chunk k-1 of every other slice from its owner */
        for (int i = 1; i < n && st == SL_OK; i++) {
            int p = (r + i) % n;
            size_t po = blk_off(count, n, p), pl = blk_len(count, n, p);
            st = o.vt->wait(c->tp, p, W_PROGRESS, o.seq << 24 | k, c->deadline);
            if (st != SL_OK || e0 >= pl) continue;
            size_t m = pl - e0 < ce ? pl - e0 : ce, off = (po + e0) * es;
            copy_out((char *)rb + off, wr->peer[p] + ro + off, m * es, nt);
        }
    }
    if (st == SL_OK) st = sym_end(&o);
    return st;
}

sl_status sl_sym_reduce_scatter(sl_algo_ctx *c, const void *sb, void *rb, size_t rc, sl_comm_dtype dt,
                                sl_comm_redop op) {
    size_t es = sl_comm_dtype_size(dt);
    int n = c->size, r = c->rank;
    sl_win *ws = c->tp->win ? sl_win_find(c->wins, sb, rc * es * (size_t)n) : NULL;
    if (!ws || n < 2 || !rc) return SL_ERR_UNSUPPORTED;
    size_t so = (size_t)((const char *)sb - ws->base);
    sym_op o = {.c = c, .desc = {kind_word(K_REDSCAT, dt, op), rc, ws->id, so, NO_WIN, 0}};
    char *tmp = NULL;
    const char **in = NULL;
    SL_TRY(sym_work(c, &tmp, &in, "reduce-scatter"));
    sl_status st = sym_begin(&o, "reduce-scatter");
    if (st == SL_OK) {
        for (int p = 0; p < n; p++) in[p] = ws->peer[p] + so + (size_t)r * rc * es;
        reduce_n(dt, op, rb, in, n, rc, tmp);
        if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, rc, n);
        st = sym_end(&o);
    }
    return st;
}

sl_status sl_sym_allgatherv(sl_algo_ctx *c, const void *sb, void *rb, const size_t *counts,
                            const size_t *displs, sl_comm_dtype dt) {
    size_t es = sl_comm_dtype_size(dt), end = 0, tot = 0;
    int n = c->size, r = c->rank;
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the layout: it must be the same on every rank */
    for (int p = 0; p < n; p++) {
        if (counts[p] && displs[p] + counts[p] > end) end = displs[p] + counts[p];
        tot += counts[p];
        h = (h ^ counts[p]) * 1099511628211ull;
        h = (h ^ displs[p]) * 1099511628211ull;
    }
    sl_win *wr = c->tp->win ? sl_win_find(c->wins, rb, end * es) : NULL;
    if (!wr || n < 2 || !tot) return SL_ERR_UNSUPPORTED;
    size_t ro = (size_t)((char *)rb - wr->base);
    sym_op o = {.c = c, .desc = {kind_word(K_ALLGATHER, dt, 0), h, NO_WIN, 0, wr->id, ro}};
    char *d = rb;
    if (counts[r] && (const char *)sb != d + displs[r] * es) memmove(d + displs[r] * es, sb, counts[r] * es);
    SL_TRY(sym_begin(&o, "all-gather"));
    int nt = sym_nt_min() && tot * es >= sym_nt_min();
    for (int i = 1; i < n; i++) {
        int p = (r + i) % n;
        size_t off = displs[p] * es;
        if (counts[p]) copy_out(d + off, wr->peer[p] + ro + off, counts[p] * es, nt);
    }
    return sym_end(&o);
}
