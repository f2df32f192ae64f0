/* Direct algorithms on symmetric windows (sl_comm_mem_alloc): every rank loads its peers' buffers
 * straight from their windows instead of passing the bytes through slot FIFOs.
 *
 * Note [Direct window algorithms]
 * All-reduce of N bytes over n ranks ("push"): the vector is cut into n slices (the ring's blocks);
 * rank r reduces slice r reading the n inputs in rank order 0..n-1 from every rank's send buffer, an
 * 8 KiB block at a time, and stores the block into slice r of every rank's receive buffer, its own
 * included (reduced straight into its own and copied from there, or, streaming, reduced into an
 * L1-resident block that is streamed to all). One pass, no hand-off between ranks, nothing re-read: each rank
 * reads N bytes and writes N bytes, the least any all-reduce can move (4N of DRAM traffic for 2 ranks,
 * against about 5-6N for a reduce-then-copy two-phase scheme or the slot FIFOs, Note [Slot FIFOs]). From
 * SUANLI_COMM_WIN_NT_KB on the stores stream past the cache (Note [Non-temporal stores]).
 * Reduce-scatter: rank r reduces slice r of the n send buffers in rank order into its receive buffer.
 * All-gather(v): each rank puts its block in its own receive buffer, then copies the others' blocks
 * from their receive buffers.
 *
 * Synchronisation uses each rank's control words (sl_win_vt.ctl, written only by their owner):
 *   ARRIVE = s  after rank posted the descriptor of its s-th window operation (its inputs are ready
 *              and its receive buffer may be written);
 *   DESC..     what it was called with: kind, dtype, op, count, and (window id, offset) of the
 *              symmetric buffers; every rank compares every peer's with its own before it reads
 *              peer memory, so asymmetric use is an error on every rank, never wrong data;
 *   DONE = s   rank no longer reads or writes peer memory for operation s (streaming stores are
 *              fenced before); nobody returns (and so nobody lets its caller touch a buffer) before
 *              every peer is DONE.
 * In place works because slice r of every buffer is read and written by rank r alone, and it reads
 * each block before it stores the result. (Partly overlapping send and receive buffers are undefined,
 * as in MPI and NCCL.) Waits are the transport's (deadline, abort flag, dead peer: as in exchange). Only
 * ranks that chose the window path post anything; a rank that did not (its buffers are not in a window) never
 * arrives, and the others fail at the deadline, as with any other mismatched call.
 *
 * Results: for n = 2 each element is a op b of the two inputs, bitwise what the ring computes (IEEE
 * sum, product, max and min of two operands commute); for n > 2 they are bitwise those of the direct
 * algorithm (SUANLI_COMM_ALGO=direct: rank order 0..n-1), which differ from the ring's order but are
 * the same on every rank and in every run, and equal between all-reduce and reduce-scatter (ZeRO-2
 * vs plain data parallelism). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

enum { W_ARRIVE = 0, W_KIND, W_COUNT, W_SBWIN, W_SBOFF, W_RBWIN, W_RBOFF, W_DONE, W_X };
enum { K_ALLREDUCE = 1, K_REDSCAT, K_ALLGATHER, K_STAGED, K_ALLTOALL };
#define SYM_TMP (8u << 10) /* reduce a block of this size at a time (L1-resident) */
#define SYM_NT_DEFAULT_KB                                                                                    \
    8192 /* at most: transfers this large bypass the cache (Note [Streaming threshold from the L3]) */
#define SYM_AG_PUSH_DEFAULT_KB 8192 /* all-gathers this large push when they can (0: never) */
#define SYM_PUSH_CHUNK (64u << 10)
#define NO_WIN UINT64_MAX

sl_win *sl_win_find(sl_win *list, const void *p, size_t bytes) {
    const char *q = p;
    for (sl_win *w = list; w; w = w->next)
        if (w->shared && q >= w->base && bytes <= w->bytes && (size_t)(q - w->base) <= w->bytes - bytes)
            return w;
    return NULL;
}

/* KiB-valued knobs, read once. */
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
/* Note [Streaming threshold from the L3]
 * Streaming stores pay once a transfer's buffers no longer fit the last-level cache: below that the
 * destination lines are in the cache anyway and streaming them out costs a later re-read. Measured at 2
 * ranks on windows (docs/BENCHMARKS-comm.md): on a Zen 4 guest (32 MiB L3 per CCD) the best threshold is
 * 8 MiB (4 MiB loses: both ranks' buffers still fit); on a Zen 1 guest (8 MiB L3 per CCX) 4 MiB (at 8 MiB,
 * the 4 MiB transfers ran at 1.2-1.3x OpenMPI against 2.1-4.6x streamed). The default is therefore half the
 * L3 that cpu0 shares (sysfs: the per-CCX size, not glibc's whole-socket figure), at most 8 MiB. */
static size_t nt_default_kb(void) {
    size_t kb = SYM_NT_DEFAULT_KB;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        unsigned long v = 0;
        char unit = 0;
        if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
            size_t l3 = unit == 'M' ? (size_t)v << 10 : unit == 'G' ? (size_t)v << 20 : (size_t)v;
            if (l3 >= 1024 && l3 / 2 < kb) kb = l3 / 2;
        }
        fclose(f);
    }
    return kb;
}

/* SUANLI_COMM_WIN_NT_KB: a local choice (it changes no result) */
static size_t sym_nt_min(void) {
    static _Atomic size_t cached;
    if (!atomic_load_explicit(&cached, memory_order_relaxed))
        return env_kb("SUANLI_COMM_WIN_NT_KB", nt_default_kb(), 0, &cached);
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
    const uint64_t *xw;    /* nx words published at W_X.. before ARRIVE (the moves' source descriptors) */
    int nx;
} sym_op;

/* Post the descriptor and ARRIVE, wait for every peer's, and check they called the same thing. */
static sl_status sym_begin(sym_op *o, const char *what) {
    sl_algo_ctx *c = o->c;
    sl_transport *tp = c->tp;
    o->vt = tp->win;
    o->mine = o->vt->ctl(tp, c->rank);
    o->seq = ++*c->win_seq;
    for (int i = 0; i < 6; i++) atomic_store_explicit(&o->mine[W_KIND + i], o->desc[i], memory_order_relaxed);
    for (int i = 0; i < o->nx; i++) atomic_store_explicit(&o->mine[W_X + i], o->xw[i], memory_order_relaxed);
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

/* dst[0..m) = in[0] op in[1] op ... op in[n-1] (rank order); dst may alias in[0] or in[1] only */
static void reduce_block(sl_comm_dtype dt, sl_comm_redop op, char *dst, const char *const *in, int n,
                         size_t m) {
    sl_comm_reduce_kernel(dt, op, dst, in[0], in[1], m);
    for (int i = 2; i < n; i++) sl_comm_reduce_kernel(dt, op, dst, dst, in[i], m);
}

/* The same for any m, dst may alias any in[i]: n > 2 accumulates SYM_TMP-sized blocks in tmp. */
static void reduce_n(sl_comm_dtype dt, sl_comm_redop op, char *dst, const char *const *in, int n, size_t m,
                     char *tmp) {
    size_t es = sl_comm_dtype_size(dt), tb = SYM_TMP / es;
    if (n == 2) {
        reduce_block(dt, op, dst, in, n, m);
        return;
    }
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
 * L1-resident accumulation block followed by 3n pointers (the n inputs of a block, and the push
 * all-reduce's n input and n output bases). */
static sl_status sym_work(sl_algo_ctx *c, char **tmp, const char ***in, const char *what) {
    char *s = sl_algo_scratch(c, SYM_TMP + 3 * sizeof(char *) * (size_t)c->size);
    if (!s) return sl_fail(SL_ERR_NOMEM, "window %s: out of memory", what);
    *tmp = s;
    *in = (const char **)(void *)(s + SYM_TMP);
    return SL_OK;
}

/* The push all-reduce of count elements (Note [Direct window algorithms]), in the work space of
 * sym_work (tmp, in) which the caller filled: rank p's input vector starts at ib[p] = in[n + p] and its
 * output at ob[p] = in[2n + p] (both in p's window for p != rank). Stores into my own output stream
 * when nt_self is set, into the peers' when nt_peer is. */
static sl_status sym_push(sl_algo_ctx *c, const uint64_t desc[6], size_t count, sl_comm_dtype dt,
                          sl_comm_redop op, int nt_self, int nt_peer, char *tmp, const char **in) {
    size_t es = sl_comm_dtype_size(dt);
    int n = c->size, r = c->rank, nt = nt_self || nt_peer;
    sym_op o = {.c = c};
    memcpy(o.desc, desc, 6 * sizeof *desc);
    const char *const *ib = in + n;
    char *const *ob = (char *const *)(in + 2 * n);
    SL_TRY(sym_begin(&o, "all-reduce"));
    size_t mo = blk_off(count, n, r), ml = blk_len(count, n, r), tb = SYM_TMP / es;
    for (size_t e0 = 0; e0 < ml; e0 += tb) { /* reduce a block of my slice, store it everywhere */
        size_t m = ml - e0 < tb ? ml - e0 : tb, off = (mo + e0) * es;
        for (int p = 0; p < n; p++) in[p] = ib[p] + off;
        /* streaming: reduce into tmp and stream it out; cached: reduce into my own output and copy
         * from there (one pass fewer over the block: measured faster at 256 KiB-4 MiB) */
        char *blk = nt ? tmp : ob[r] + off;
        if (nt)
            reduce_block(dt, op, tmp, in, n, m);
        else
            reduce_n(dt, op, blk, in, n, m, tmp);
        if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, blk, m, n);
        for (int i = 1; i <= n; i++)
            if (nt || i < n) copy_out(ob[(r + i) % n] + off, blk, m * es, i < n ? nt_peer : nt_self);
    }
    return sym_end(&o);
}

sl_status sl_sym_allreduce(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                           sl_comm_redop op) {
    size_t es = sl_comm_dtype_size(dt), bytes = count * es;
    sl_win *ws = c->tp->win ? sl_win_find(c->wins, sb, bytes) : NULL, *wr;
    if (!ws || !(wr = sl_win_find(c->wins, rb, bytes)) || c->size < 2 || !count) return SL_ERR_UNSUPPORTED;
    int n = c->size;
    size_t so = (size_t)((const char *)sb - ws->base), ro = (size_t)((char *)rb - wr->base);
    char *tmp = NULL;
    const char **in = NULL;
    SL_TRY(sym_work(c, &tmp, &in, "all-reduce"));
    for (int p = 0; p < n; p++) {
        in[n + p] = ws->peer[p] + so;
        in[2 * n + p] = wr->peer[p] + ro;
    }
    uint64_t desc[6] = {kind_word(K_ALLREDUCE, dt, op), count, ws->id, so, wr->id, ro};
    int nt = sym_nt_min() && bytes >= sym_nt_min();
    return sym_push(c, desc, count, dt, op, nt, nt, tmp, in);
}

/* Note [Staged all-reduce]
 * Buffers outside windows (any user memory) on a transport with windows: the communicator keeps one
 * staging window of SUANLI_COMM_STAGE_KB per rank (made by the first such call: every rank reaches it
 * with the same count, so they make it together; if /dev/shm cannot hold it, every rank learns so
 * at once and all keep the slot FIFO algorithms). The vector goes through it a window-full at a time:
 * copy my part of the input in, push all-reduce in place on the staging windows (above), copy the
 * result out (streaming stores from SUANLI_COMM_WIN_NT_KB on). DRAM traffic is the push's minimum,
 * reading the input once and writing the output once per rank; the staging copies stay in the cache.
 * A rank's own slice needs no staging: it reduces it from its own input straight into its own output,
 * and stages only the slices its peers reduce (their inputs in, their results out).
 * Results are the push's (bitwise the ring's for 2 ranks, the direct algorithm's rank order for
 * more); it runs when the algorithm is auto (a forced one runs as asked), for SUANLI_COMM_STAGE_MIN_KB
 * and up. */
#define SYM_STAGE_ID (UINT64_C(1) << 62) /* window id of the staging window (user windows count up) */
#define SYM_STAGE_DEFAULT_KB 4096
#define SYM_STAGE_MIN_DEFAULT_KB 2
static size_t sym_stage_bytes(void) {
    static _Atomic size_t cached;
    return env_kb("SUANLI_COMM_STAGE_KB", SYM_STAGE_DEFAULT_KB, 0, &cached);
}
static size_t sym_stage_min(void) {
    static _Atomic size_t cached;
    return env_kb("SUANLI_COMM_STAGE_MIN_KB", SYM_STAGE_MIN_DEFAULT_KB, 0, &cached);
}

/* The communicator's staging window, made by the first call that needs it (collective: every rank
 * gets here in the same call). SL_ERR_UNSUPPORTED on every rank when it cannot be had. */
static sl_status stage_get(sl_algo_ctx *c, const char *what) {
    size_t sbytes = sym_stage_bytes();
    if (*c->stage_state < 0 || sbytes < 64) return SL_ERR_UNSUPPORTED;
    if (*c->stage) return SL_OK;
    sl_win *w = calloc(1, sizeof *w);
    if (!w) return sl_fail(SL_ERR_NOMEM, "%s: out of memory", what);
    w->bytes = sbytes;
    w->id = SYM_STAGE_ID;
    sl_status st = c->tp->win->alloc(c->tp, w, c->deadline);
    if (st != SL_OK) {
        free(w);
        if (st != SL_ERR_IO && st != SL_ERR_NOMEM) return st;
        SL_LOGW("%s: rank %d: %s; using the slot FIFO algorithms", what, c->rank, sl_errmsg());
        *c->stage_state = -1; /* every rank saw the same verdict (see sl_comm_mem_alloc) */
        return SL_ERR_UNSUPPORTED;
    }
    *c->stage = w;
    *c->stage_state = 1;
    return SL_OK;
}

sl_status sl_sym_allreduce_staged(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                  sl_comm_redop op) {
    size_t es = sl_comm_dtype_size(dt), bytes = count * es, sbytes = sym_stage_bytes();
    if (!c->tp->win || *c->stage_state < 0 || c->algo != SL_COMM_ALGO_AUTO || c->size < 2 || !count ||
        sbytes < es || bytes < sym_stage_min())
        return SL_ERR_UNSUPPORTED;
    SL_TRY(stage_get(c, "staged all-reduce"));
    const sl_win *w = *c->stage;
    size_t ce = sbytes / es;
    int n = c->size, r = c->rank, nt = sym_nt_min() && bytes >= sym_nt_min();
    char *tmp = NULL;
    const char **in = NULL;
    SL_TRY(sym_work(c, &tmp, &in, "all-reduce"));
    for (size_t e0 = 0; e0 < count; e0 += ce) {
        size_t m = count - e0 < ce ? count - e0 : ce, mo = blk_off(m, n, r), ml = blk_len(m, n, r);
        const char *s = (const char *)sb + e0 * es;
        char *d = (char *)rb + e0 * es;
        for (int p = 0; p < n; p++) { /* my own slice from and to the caller's buffers, the rest staged */
            in[n + p] = p == r ? s : w->peer[p];
            in[2 * n + p] = p == r ? d : w->peer[p];
        }
        if (mo) memcpy(w->base, s, mo * es); /* the slices my peers reduce, into my staging window */
        if (ml < m - mo) memcpy(w->base + (mo + ml) * es, s + (mo + ml) * es, (m - mo - ml) * es);
        uint64_t desc[6] = {kind_word(K_STAGED, dt, op), m, w->id, 0, w->id, 0};
        SL_TRY(sym_push(c, desc, m, dt, op, nt, 0, tmp, in));
        if (mo) copy_out(d, w->base, mo * es, nt); /* their results, out of my staging window */
        if (mo + ml < m) copy_out(d + (mo + ml) * es, w->base + (mo + ml) * es, (m - mo - ml) * es, nt);
    }
    return SL_OK;
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

/* Note [Window data movement]
 * All-gather(v) and all-to-all(v) on a transport with windows pull: every rank copies what it
 * receives straight from where its peer keeps it into its own receive buffer, so each byte is copied
 * once (cf. reduce-scatter above: nothing is written where a peer reads it during the call). Before
 * ARRIVE each rank publishes in its control words (W_X..) where peers find its data:
 *   - in a window: (window id, byte offset). All-gather: its send buffer, or, when only the receive
 *     buffer is in a window, its own block there (copied in before ARRIVE; in place: already there).
 *     All-to-all: its send buffer, plus per destination the byte count and displacement. Offsets need
 *     not be equal across ranks: the reader finds the window by id (ids are equal on every rank).
 *   - an address in its own address space, read with the transport's peer_read (shm:
 *     process_vm_readv, from SUANLI_SHM_MOVE_PULL_KB): one copy and no staging rounds, each a barrier;
 *     a peer's unchanged send buffer is read from this core's cache, not pulled across from the
 *     writer's (on the loaded machine 1-3x OpenMPI where staging gave 0.03-0.9x).
 *   - "staged": otherwise (private memory). The rank copies its data into its staging window
 *     (Note [Staged all-reduce]) and peers copy it out from there, in rounds. The staging window is
 *     used a quarter at a time, the quarters in turn (operation sequence number mod 4): writing the
 *     lines a peer has just read measured 2x slower at 256 KiB-1 MiB (2 ranks) than the slot FIFOs,
 *     which rotate through 4 slots the same way. All-to-all cuts the quarter in n slots, one per
 *     destination.
 * Ranks may mix these (one rank's buffers in a window, another's private, in place or not): the
 * operation runs in rounds, each a window operation with its own ARRIVE/DONE barrier; round k moves
 * chunk k of every staged rank (everything else moves in round 0), and the number of rounds is the
 * largest any rank needs, which every rank computes alike from what all published. All-to-all checks
 * that each pair agrees on the count (SL_ERR_INVALID otherwise).
 * Push all-gather: from SUANLI_COMM_AG_PUSH_KB of gathered bytes, when every rank's receive buffer
 * is in a window (every rank sees that in round 0), each rank instead stores its block into every
 * rank's receive buffer, 64 KiB at a time, so its source is read from memory once (DRAM traffic 3N
 * instead of 4N for 2 ranks).
 * Used when the algorithm is auto or direct, from SUANLI_COMM_STAGE_MIN_KB of gathered bytes
 * (all-gather; any size for all-to-all), with up to 26 ranks for all-to-all (two control words per
 * peer); otherwise, and when no staging window can be had, the ring / pairwise algorithms run on every
 * rank. */
#define SRC_STAGED (UINT64_MAX - 1)
#define SRC_ADDR (UINT64_MAX - 2) /* read with the transport's peer_read at this address */
#ifndef SYM_PARTS
#define SYM_PARTS 4
#endif

static const sl_win *win_by_id(const sl_win *list, uint64_t id) {
    for (const sl_win *w = list; w; w = w->next)
        if (w->shared && w->id == id) return w;
    return NULL;
}

/* The bytes [off, off + len) of rank p's window `id`, or NULL (with an error) if it makes no sense here. */
static const char *peer_src(sl_algo_ctx *c, int p, uint64_t id, uint64_t off, size_t len, const char *what) {
    const sl_win *w = win_by_id(c->wins, id);
    if (!w || off > w->bytes || len > w->bytes - off) {
        sl_fail(SL_ERR_INVALID,
                "window %s: rank %d published window %llu offset %llu (%zu bytes), not a window "
                "of this communicator here",
                what, p, (unsigned long long)id, (unsigned long long)off, len);
        return NULL;
    }
    return w->peer[p] + off;
}

/* SUANLI_COMM_AG_PUSH_KB: all-gathers of at least this many bytes whose receive buffers are all in
 * windows push (a local copy loop, but every rank must agree: it is decided from what all published) */
static size_t sym_push_min(void) {
    static _Atomic size_t cached;
    return env_kb("SUANLI_COMM_AG_PUSH_KB", SYM_AG_PUSH_DEFAULT_KB, 0, &cached);
}

/* Push: my block (len bytes at src) into every rank's receive buffer (dst[p]; NULL: skip), a chunk at
 * a time so that the source is read from memory once. */
static void ag_push(char *const *dst, const char *src, size_t len, int n, int r, int nt) {
    for (size_t o = 0; o < len; o += SYM_PUSH_CHUNK) {
        size_t m = len - o < SYM_PUSH_CHUNK ? len - o : SYM_PUSH_CHUNK;
        for (int i = 1; i <= n; i++)
            if (dst[(r + i) % n]) copy_out(dst[(r + i) % n] + o, src + o, m, nt);
    }
}

sl_status sl_sym_allgatherv(sl_algo_ctx *c, const void *sb, void *rb, const size_t *counts,
                            const size_t *displs, sl_comm_dtype dt) {
    size_t es = sl_comm_dtype_size(dt), tot = 0;
    int n = c->size, r = c->rank;
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the layout: it must be the same on every rank */
    for (int p = 0; p < n; p++) {
        tot += counts[p];
        h = (h ^ counts[p]) * 1099511628211ull;
        h = (h ^ displs[p]) * 1099511628211ull;
    }
    if (n < 2 || !tot || tot * es < sym_stage_min()) return SL_ERR_UNSUPPORTED; /* the same on every rank */
    SL_TRY(stage_get(c, "all-gather"));
    const sl_win *stg = *c->stage, *w, *wr;
    char *d = rb, *mine = d + displs[r] * es, **dst = NULL;
    size_t mb = counts[r] * es, S = stg->bytes / SYM_PARTS / 64 * 64, end = 0;
    for (int p = 0; p < n; p++)
        if (counts[p] && displs[p] + counts[p] > end) end = displs[p] + counts[p];
    int nt = sym_nt_min() && tot * es >= sym_nt_min(), push = 1, own = mb && (const char *)sb != mine;
    /* xw: where my block is (window id and offset, or staged), and my receive buffer's window */
    uint64_t xw[4] = {NO_WIN, 0, NO_WIN, 0};
    if ((wr = sl_win_find(c->wins, rb, end * es))) xw[2] = wr->id, xw[3] = (uint64_t)(d - wr->base);
    if (mb && (w = sl_win_find(c->wins, sb, mb))) {
        xw[0] = w->id, xw[1] = (uint64_t)((const char *)sb - w->base);
    } else if (mb && wr) { /* peers may read it from my receive buffer: put it there first */
        if (own) copy_out(mine, sb, mb, nt);
        own = 0;
        xw[0] = wr->id, xw[1] = (uint64_t)(mine - wr->base);
    } else if (mb && c->tp->peer_read && mb >= c->tp->peer_read_min) {
        xw[0] = SRC_ADDR, xw[1] = (uint64_t)(uintptr_t)sb;
    } else if (mb) {
        xw[0] = SRC_STAGED;
    }
    const char **tmp_in = NULL;
    char *tmp = NULL;
    SL_TRY(sym_work(c, &tmp, &tmp_in, "all-gather"));
    dst = (char **)(void *)tmp_in;
    sym_op o = {.c = c, .desc = {kind_word(K_ALLGATHER, dt, 0), h, NO_WIN, 0, NO_WIN, 0}, .xw = xw, .nx = 4};
    size_t rounds = 1;
    for (size_t k = 0; k < rounds; k++) {
        size_t ko = k * S;
        if (xw[0] == SRC_STAGED && ko < mb)
            memcpy(stg->base + (*c->win_seq + 1) % SYM_PARTS * S, (const char *)sb + ko,
                   mb - ko < S ? mb - ko : S);
        SL_TRY(sym_begin(&o, "all-gather"));
        if (k == 0) { /* rounds, and whether everyone pushes (every receive buffer in a window) */
            push = sym_push_min() && tot * es >= sym_push_min();
            for (int p = 0; p < n; p++) {
                _Atomic uint64_t *pc = o.vt->ctl(c->tp, p);
                uint64_t src = atomic_load_explicit(&pc[W_X], memory_order_relaxed);
                size_t len = counts[p] * es;
                if (src == SRC_STAGED && (len + S - 1) / S > rounds) rounds = (len + S - 1) / S;
                uint64_t rw = atomic_load_explicit(&pc[W_X + 2], memory_order_relaxed);
                if (rw == NO_WIN) push = 0;
                if (push && p != r) {
                    uint64_t ro = atomic_load_explicit(&pc[W_X + 3], memory_order_relaxed);
                    const char *pd = peer_src(c, p, rw, ro, end * es, "all-gather");
                    if (!pd) return SL_ERR_INVALID;
                    dst[p] = (char *)pd + displs[r] * es;
                }
            }
            dst[r] = own ? mine : NULL; /* NULL: my block is there already */
            if (push) rounds = 1;
            if (push && mb) ag_push(dst, sb, mb, n, r, nt);
            if (!push && own) copy_out(mine, sb, mb, nt);
            if (push) {
                SL_TRY(sym_end(&o));
                break;
            }
        }
        for (int i = 1; i < n; i++) {
            int p = (r + i) % n;
            _Atomic uint64_t *pc = o.vt->ctl(c->tp, p);
            uint64_t src = atomic_load_explicit(&pc[W_X], memory_order_relaxed);
            size_t len = counts[p] * es;
            if (!len) continue;
            if (src == SRC_STAGED) {
                if (ko < len)
                    copy_out(d + displs[p] * es + ko, stg->peer[p] + o.seq % SYM_PARTS * S,
                             len - ko < S ? len - ko : S, nt);
            } else if (k == 0 && src == SRC_ADDR) {
                SL_TRY(c->tp->peer_read(c->tp, p, d + displs[p] * es,
                                        atomic_load_explicit(&pc[W_X + 1], memory_order_relaxed), len));
            } else if (k == 0) {
                const char *ps = peer_src(c, p, src, atomic_load_explicit(&pc[W_X + 1], memory_order_relaxed),
                                          len, "all-gather");
                if (!ps) return SL_ERR_INVALID;
                copy_out(d + displs[p] * es, ps, len, nt);
            }
        }
        SL_TRY(sym_end(&o));
    }
    return SL_OK;
}

/* s: the send data (not aliasing rb: the caller copies an in-place send buffer away first) */
sl_status sl_sym_alltoallv(sl_algo_ctx *c, const void *s, const size_t *scounts, const size_t *sdispls,
                           void *rb, const size_t *rcounts, const size_t *rdispls, sl_comm_dtype dt) {
    int n = c->size, r = c->rank;
    if (n < 2 || W_X + 3 + 2 * n > SL_WIN_CTL) return SL_ERR_UNSUPPORTED; /* the same on every rank */
    SL_TRY(stage_get(c, "all-to-all"));
    const sl_win *stg = *c->stage;
    size_t es = sl_comm_dtype_size(dt), cap = (stg->bytes / SYM_PARTS / (size_t)n) & ~(size_t)63,
           lo = SIZE_MAX, hi = 0, big = 0, tot = 0;
    if (!cap) return SL_ERR_UNSUPPORTED;
    uint64_t xw[3 + 2 * 26];
    for (int q = 0; q < n; q++) {
        xw[3 + q] = scounts[q] * es;
        xw[3 + n + q] = sdispls[q] * es;
        tot += rcounts[q] * es;
        if (!scounts[q] || q == r) continue;
        if (sdispls[q] * es < lo) lo = sdispls[q] * es;
        if ((sdispls[q] + scounts[q]) * es > hi) hi = (sdispls[q] + scounts[q]) * es;
        if (scounts[q] * es > big) big = scounts[q] * es;
    }
    int nt = sym_nt_min() && tot >= sym_nt_min();
    char *d = rb;
    if (scounts[r]) copy_out(d + rdispls[r] * es, (const char *)s + sdispls[r] * es, scounts[r] * es, nt);
    const sl_win *w = hi ? sl_win_find(c->wins, (const char *)s + lo, hi - lo) : NULL;
    int addr = !w && hi && c->tp->peer_read && hi - lo >= c->tp->peer_read_min;
    xw[0] = w ? w->id : addr ? SRC_ADDR : SRC_STAGED;
    xw[1] = w ? (uint64_t)((const char *)s - w->base) : addr ? (uint64_t)(uintptr_t)s : 0;
    xw[2] = w || addr ? 1 : (big + cap - 1) / cap; /* rounds this rank needs */
    sym_op o = {
        .c = c, .desc = {kind_word(K_ALLTOALL, dt, 0), 0, NO_WIN, 0, NO_WIN, 0}, .xw = xw, .nx = 3 + 2 * n};
    size_t rounds = xw[2] ? xw[2] : 1;
    for (size_t k = 0; k < rounds; k++) {
        size_t ko = k * cap;
        for (int q = 0; xw[0] == SRC_STAGED && q < n; q++) /* staged: piece k of my block for q into slot q */
            if (q != r && ko < xw[3 + q])
                memcpy(stg->base + (*c->win_seq + 1) % SYM_PARTS * (size_t)n * cap + (size_t)q * cap,
                       (const char *)s + xw[3 + n + q] + ko, xw[3 + q] - ko < cap ? xw[3 + q] - ko : cap);
        SL_TRY(sym_begin(&o, "all-to-all"));
        for (int i = 1; i < n; i++) {
            int p = (r + i) % n;
            _Atomic uint64_t *pc = o.vt->ctl(c->tp, p);
            uint64_t src = atomic_load_explicit(&pc[W_X], memory_order_relaxed);
            size_t len = rcounts[p] * es;
            if (k == 0) {
                uint64_t pr = atomic_load_explicit(&pc[W_X + 2], memory_order_relaxed),
                         pl = atomic_load_explicit(&pc[W_X + 3 + r], memory_order_relaxed);
                if (pl != len)
                    return sl_fail(SL_ERR_INVALID,
                                   "all-to-all: rank %d sends this rank %llu bytes, it expects %zu", p,
                                   (unsigned long long)pl, len);
                if (pr > rounds) rounds = pr;
            }
            if (!len) continue;
            if (src == SRC_STAGED) {
                if (ko < len)
                    copy_out(d + rdispls[p] * es + ko,
                             stg->peer[p] + o.seq % SYM_PARTS * (size_t)n * cap + (size_t)r * cap,
                             len - ko < cap ? len - ko : cap, nt);
            } else if (k == 0) {
                uint64_t off = atomic_load_explicit(&pc[W_X + 1], memory_order_relaxed) +
                               atomic_load_explicit(&pc[W_X + 3 + n + r], memory_order_relaxed);
                if (src == SRC_ADDR) {
                    SL_TRY(c->tp->peer_read(c->tp, p, d + rdispls[p] * es, off, len));
                    continue;
                }
                const char *ps = peer_src(c, p, src, off, len, "all-to-all");
                if (!ps) return SL_ERR_INVALID;
                copy_out(d + rdispls[p] * es, ps, len, nt);
            }
        }
        SL_TRY(sym_end(&o));
    }
    return SL_OK;
}
