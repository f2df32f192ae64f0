/* Ring algorithms: all-reduce (reduce-scatter + all-gather), reduce-scatter, all-gather(v).
 * Bandwidth optimal: each rank sends 2(n-1)/n N bytes for all-reduce, (n-1)/n N for the others.
 * Each block is reduced along the ring in one fixed order, so results are identical on all ranks. */
#include <string.h>

#include "comm/comm_internal.h"

/* block b of `count` elements split n ways: first count%n blocks get one extra element */
static size_t blk_off(size_t count, int n, int b) {
    size_t q = count / (size_t)n, r = count % (size_t)n;
    return (size_t)b * q + ((size_t)b < r ? (size_t)b : r);
}
static size_t blk_len(size_t count, int n, int b) {
    return count / (size_t)n + ((size_t)b < count % (size_t)n ? 1 : 0);
}
static int mod(int a, int n) { return ((a % n) + n) % n; }

sl_status sl_algo_allreduce_ring(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                 sl_comm_redop op) {
    int n = c->size, r = c->rank, next = mod(r + 1, n), prev = mod(r - 1, n);
    size_t es = sl_comm_dtype_size(dt);
    const char *s = sb;
    char *d = rb;
    /* reduce-scatter: step k sends block r-k, receives and reduces block r-k-1 */
    for (int k = 0; k < n - 1; k++) {
        int sbk = mod(r - k, n), rbk = mod(r - k - 1, n);
        const char *src = (k == 0 ? s : d) + blk_off(count, n, sbk) * es;
        size_t ro = blk_off(count, n, rbk) * es;
        SL_TRY(sl_prim_send_recv_reduce(c, next, src, blk_len(count, n, sbk) * es, prev, d + ro, s + ro,
                                        blk_len(count, n, rbk) * es, dt, op));
    }
    int own = mod(r + 1, n);
    if (n == 1 && sb != rb) memmove(d, s, count * es);
    if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, d + blk_off(count, n, own) * es, blk_len(count, n, own), n);
    /* all-gather: step k sends block r+1-k, receives block r-k */
    for (int k = 0; k < n - 1; k++) {
        int sbk = mod(r + 1 - k, n), rbk = mod(r - k, n);
        SL_TRY(sl_prim_sendrecv(c, next, d + blk_off(count, n, sbk) * es, blk_len(count, n, sbk) * es, prev,
                                d + blk_off(count, n, rbk) * es, blk_len(count, n, rbk) * es));
    }
    return SL_OK;
}

sl_status sl_algo_reduce_scatter(sl_algo_ctx *c, const void *sb, void *rb, size_t rc, sl_comm_dtype dt,
                                 sl_comm_redop op) {
    int n = c->size, r = c->rank, next = mod(r + 1, n), prev = mod(r - 1, n);
    size_t es = sl_comm_dtype_size(dt), bb = rc * es;
    const char *s = sb;
    if (n == 1) {
        if (sb != rb && rc) memmove(rb, sb, bb);
        return SL_OK;
    }
    if (rc == 0) return SL_OK;
    if (sl_sym_enabled(c)) { /* send buffer in a symmetric window: algo/sym.c */
        sl_status st = sl_sym_reduce_scatter(c, sb, rb, rc, dt, op);
        if (st != SL_ERR_UNSUPPORTED) return st;
    }
    if (c->algo == SL_COMM_ALGO_DIRECT) return sl_algo_reduce_scatter_direct(c, sb, rb, rc, dt, op);
    char *tmp = sl_algo_scratch(c, bb * (size_t)n);
    if (!tmp)
        return sl_fail(SL_ERR_NOMEM, "reduce-scatter: cannot allocate %zu bytes of scratch", bb * (size_t)n);
    /* step k sends block r-1-k, receives block r-2-k; after n-1 steps block r is complete */
    for (int k = 0; k < n - 1; k++) {
        int sbk = mod(r - 1 - k, n), rbk = mod(r - 2 - k, n);
        const char *src = (k == 0 ? s : tmp) + (size_t)sbk * bb;
        char *dst = k == n - 2 ? (char *)rb : tmp + (size_t)rbk * bb;
        SL_TRY(sl_prim_send_recv_reduce(c, next, src, bb, prev, dst, s + (size_t)rbk * bb, bb, dt, op));
    }
    if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, rc, n);
    return SL_OK;
}

sl_status sl_algo_allgatherv(sl_algo_ctx *c, const void *sb, void *rb, const size_t *counts,
                             const size_t *displs, sl_comm_dtype dt) {
    int n = c->size, r = c->rank, next = mod(r + 1, n), prev = mod(r - 1, n);
    size_t es = sl_comm_dtype_size(dt);
    char *d = rb;
    if (sl_sym_enabled(c) && n > 1) { /* receive buffer in a symmetric window: algo/sym.c */
        sl_status st = sl_sym_allgatherv(c, sb, rb, counts, displs, dt);
        if (st != SL_ERR_UNSUPPORTED) return st;
    }
    if (counts[r] && (const char *)sb != d + displs[r] * es) memmove(d + displs[r] * es, sb, counts[r] * es);
    for (int k = 0; k < n - 1; k++) {
        int sbk = mod(r - k, n), rbk = mod(r - k - 1, n);
        SL_TRY(sl_prim_sendrecv(c, next, d + displs[sbk] * es, counts[sbk] * es, prev, d + displs[rbk] * es,
                                counts[rbk] * es));
    }
    return SL_OK;
}
