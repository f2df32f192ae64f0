/* Primitives the algorithms are written in (send, recv, recv-reduce, in one concurrent exchange)
 * and the latency/bandwidth cost model that picks an algorithm. */
#include <string.h>

#include "comm/comm_internal.h"

sl_status sl_prim_exchange(sl_algo_ctx *c, sl_xfer *x, int n) {
    return c->tp->vt->exchange(c->tp, x, n, c->deadline);
}

sl_status sl_prim_sendrecv(sl_algo_ctx *c, int sp, const void *sb, size_t sbytes, int rp, void *rb,
                           size_t rbytes) {
    sl_xfer x[2];
    int n = 0;
    if (sp >= 0) x[n++] = (sl_xfer){.kind = SL_XFER_SEND, .peer = sp, .buf = (void *)sb, .bytes = sbytes};
    if (rp >= 0) x[n++] = (sl_xfer){.kind = SL_XFER_RECV, .peer = rp, .buf = rb, .bytes = rbytes};
    return sl_prim_exchange(c, x, n);
}

sl_status sl_prim_send_recv_reduce(sl_algo_ctx *c, int sp, const void *sb, size_t sbytes, int rp, void *dst,
                                   const void *src, size_t rbytes, sl_comm_dtype dt, sl_comm_redop op) {
    sl_xfer x[2];
    int n = 0;
    if (sp >= 0) x[n++] = (sl_xfer){.kind = SL_XFER_SEND, .peer = sp, .buf = (void *)sb, .bytes = sbytes};
    if (rp >= 0)
        x[n++] = (sl_xfer){.kind = SL_XFER_RECV_REDUCE,
                           .peer = rp,
                           .buf = dst,
                           .src = src,
                           .bytes = rbytes,
                           .dt = dt,
                           .op = op};
    return sl_prim_exchange(c, x, n);
}

void *sl_algo_scratch(sl_algo_ctx *c, size_t bytes) {
    if (*c->scratch_cap < bytes) {
        sl_free_aligned(*c->scratch);
        *c->scratch = sl_malloc_aligned(bytes);
        *c->scratch_cap = *c->scratch ? bytes : 0;
    }
    return *c->scratch;
}

/* Note [Cost model]
 * alpha = per-message latency, beta = seconds per byte of the transport (set by each transport).
 * gamma = seconds per byte of local memory work (copies into scratch, reductions):
 *   ring:   2(n-1) alpha + 2 (n-1)/n N beta + (n-1)/n N gamma
 *   rd:     ceil(log2 n) (alpha + N beta + 2 N gamma) (+2 steps when n is not a power of two)
 *   direct: alpha + (n-1) N beta + (n+1) N gamma  (one step, everyone sends everything to all)
 * The choice depends only on (n, N, transport), never on timings, so it is the same on every rank
 * and every run — which keeps reductions bitwise reproducible. */
sl_comm_algo sl_algo_choose_allreduce(const sl_algo_ctx *c, size_t bytes) {
    if (c->local && (c->algo == SL_COMM_ALGO_AUTO || c->algo == SL_COMM_ALGO_HIER)) return SL_COMM_ALGO_HIER;
    if (c->algo != SL_COMM_ALGO_AUTO && c->algo != SL_COMM_ALGO_HIER) return c->algo;
    int n = c->size, lg = 0, p2 = 1;
    while (p2 * 2 <= n) {
        p2 *= 2;
        lg++;
    }
    if (p2 != n) lg += 2;
    double a = c->tp->alpha, b = c->tp->beta, g = 1.0 / 10e9, N = (double)bytes;
    double ring = 2.0 * (n - 1) * a + 2.0 * (n - 1) / n * N * b + (double)(n - 1) / n * N * g;
    double rd = lg * (a + N * b + 2 * N * g);
    double direct = a + (n - 1) * N * b + (n + 1) * N * g;
    if (direct <= rd && direct <= ring && n <= 8) return SL_COMM_ALGO_DIRECT;
    return rd < ring ? SL_COMM_ALGO_RD : SL_COMM_ALGO_RING;
}

sl_status sl_algo_allreduce(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                            sl_comm_redop op) {
    size_t es = sl_comm_dtype_size(dt);
    if (c->size == 1 || count == 0) {
        if (sb != rb && count) memmove(rb, sb, count * es);
        return SL_OK;
    }
    if (sl_sym_enabled(c)) { /* buffers in symmetric windows: algo/sym.c */
        sl_status st = sl_sym_allreduce(c, sb, rb, count, dt, op);
        if (st == SL_ERR_UNSUPPORTED) st = sl_sym_allreduce_staged(c, sb, rb, count, dt, op);
        if (st != SL_ERR_UNSUPPORTED) return st;
    }
    switch (sl_algo_choose_allreduce(c, count * es)) {
    case SL_COMM_ALGO_DIRECT:
        return sl_algo_allreduce_direct(c, sb, rb, count, dt, op);
    case SL_COMM_ALGO_HIER:
        return sl_algo_allreduce_hier(c, sb, rb, count, dt, op);
    case SL_COMM_ALGO_RD:
        return sl_algo_allreduce_rd(c, sb, rb, count, dt, op);
    default:
        return sl_algo_allreduce_ring(c, sb, rb, count, dt, op);
    }
}
