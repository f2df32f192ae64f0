/* Latency-oriented algorithms: recursive doubling and direct all-reduce, binomial-tree reduce and
 * broadcast (pipelined chain for large broadcasts), dissemination barrier. */
#include <string.h>

#include "comm/comm_internal.h"

/* Note [Recursive doubling with n not a power of two]
 * With p = largest power of two <= n and e = n - p, ranks 2i and 2i+1 (i < e) first fold: the even
 * one sends its vector to the odd one, which reduces and takes part as virtual rank i; the even one
 * idles and receives the final result. Ranks >= 2e take part as virtual rank r - e. Partners of
 * each doubling step reduce the same two partial sums (a op b == b op a in IEEE arithmetic), so all
 * ranks end bitwise equal. */
sl_status sl_algo_allreduce_rd(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                               sl_comm_redop op) {
    int n = c->size, r = c->rank, p = 1;
    while (p * 2 <= n) p *= 2;
    int e = n - p;
    size_t es = sl_comm_dtype_size(dt), bytes = count * es;
    char *tmp = sl_algo_scratch(c, bytes ? bytes : 1);
    if (!tmp) return sl_fail(SL_ERR_NOMEM, "all-reduce: cannot allocate %zu bytes of scratch", bytes);
    if (sb != rb) memmove(rb, sb, bytes);
    int vr;
    if (r < 2 * e) {
        if (r % 2 == 0) {
            SL_TRY(sl_prim_sendrecv(c, r + 1, rb, bytes, -1, NULL, 0));
            vr = -1;
        } else {
            SL_TRY(sl_prim_send_recv_reduce(c, -1, NULL, 0, r - 1, rb, rb, bytes, dt, op));
            vr = r / 2;
        }
    } else {
        vr = r - e;
    }
    if (vr >= 0) {
        for (int m = 1; m < p; m <<= 1) {
            int pv = vr ^ m, pr = pv < e ? 2 * pv + 1 : pv + e;
            memcpy(tmp, rb, bytes);
            SL_TRY(sl_prim_send_recv_reduce(c, pr, tmp, bytes, pr, rb, rb, bytes, dt, op));
        }
        if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, count, n);
        if (r < 2 * e) SL_TRY(sl_prim_sendrecv(c, r - 1, rb, bytes, -1, NULL, 0));
    } else {
        SL_TRY(sl_prim_sendrecv(c, -1, NULL, 0, r + 1, rb, bytes));
    }
    return SL_OK;
}

/* Everyone sends its whole vector to everyone, then reduces in rank order 0..n-1. */
sl_status sl_algo_allreduce_direct(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                   sl_comm_redop op) {
    int n = c->size, r = c->rank;
    size_t es = sl_comm_dtype_size(dt), bytes = count * es;
    char *tmp = sl_algo_scratch(c, bytes * (size_t)n);
    sl_xfer stack[32], *x = n <= 16 ? stack : malloc(sizeof(sl_xfer) * 2 * (size_t)n);
    if (!tmp || !x) {
        if (x != stack) free(x);
        return sl_fail(SL_ERR_NOMEM, "all-reduce: cannot allocate scratch");
    }
    memcpy(tmp + (size_t)r * bytes, sb, bytes);
    int k = 0;
    for (int i = 1; i < n; i++) {
        int to = (r + i) % n, from = (r - i + n) % n;
        x[k++] = (sl_xfer){.kind = SL_XFER_SEND, .peer = to, .buf = tmp + (size_t)r * bytes, .bytes = bytes};
        x[k++] =
            (sl_xfer){.kind = SL_XFER_RECV, .peer = from, .buf = tmp + (size_t)from * bytes, .bytes = bytes};
    }
    sl_status st = sl_prim_exchange(c, x, k);
    if (x != stack) free(x);
    SL_TRY(st);
    /* rank order 0..n-1, written into rb last so that sb == rb works */
    for (int i = 1; i < n - 1; i++) sl_comm_reduce_kernel(dt, op, tmp, tmp, tmp + (size_t)i * bytes, count);
    sl_comm_reduce_kernel(dt, op, rb, tmp, tmp + (size_t)(n - 1) * bytes, count);
    if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, count, n);
    return SL_OK;
}

/* Reduce-scatter in one step: block j of every rank goes to rank j, which reduces the n blocks in rank
 * order 0, 1, ..., n-1 — the same order as the direct all-reduce, so ZeRO-2 (reduce-scatter) and plain
 * data parallelism (all-reduce) give bitwise-identical gradients under SUANLI_COMM_ALGO=direct. */
sl_status sl_algo_reduce_scatter_direct(sl_algo_ctx *c, const void *sb, void *rb, size_t rc, sl_comm_dtype dt,
                                        sl_comm_redop op) {
    int n = c->size, r = c->rank;
    size_t es = sl_comm_dtype_size(dt), bytes = rc * es;
    const char *s = sb;
    char *tmp = sl_algo_scratch(c, bytes * (size_t)n);
    sl_xfer stack[32], *x = n <= 16 ? stack : malloc(sizeof(sl_xfer) * 2 * (size_t)n);
    if (!tmp || !x) {
        if (x != stack) free(x);
        return sl_fail(SL_ERR_NOMEM, "reduce-scatter: cannot allocate scratch");
    }
    memcpy(tmp + (size_t)r * bytes, s + (size_t)r * bytes, bytes);
    int k = 0;
    for (int i = 1; i < n; i++) {
        int to = (r + i) % n, from = (r - i + n) % n;
        x[k++] = (sl_xfer){
            .kind = SL_XFER_SEND, .peer = to, .buf = (void *)(s + (size_t)to * bytes), .bytes = bytes};
        x[k++] =
            (sl_xfer){.kind = SL_XFER_RECV, .peer = from, .buf = tmp + (size_t)from * bytes, .bytes = bytes};
    }
    sl_status st = sl_prim_exchange(c, x, k);
    if (x != stack) free(x);
    SL_TRY(st);
    for (int i = 1; i < n - 1; i++) sl_comm_reduce_kernel(dt, op, tmp, tmp, tmp + (size_t)i * bytes, rc);
    sl_comm_reduce_kernel(dt, op, rb, tmp, tmp + (size_t)(n - 1) * bytes, rc);
    if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, rc, n);
    return SL_OK;
}

/* Binomial tree rooted at root; children are reduced in a fixed order. */
sl_status sl_algo_reduce(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                         sl_comm_redop op, int root) {
    int n = c->size, r = c->rank, vr = (r - root + n) % n;
    size_t es = sl_comm_dtype_size(dt), bytes = count * es;
    if (count == 0) return SL_OK;
    char *acc = r == root ? rb : sl_algo_scratch(c, bytes);
    if (!acc) return sl_fail(SL_ERR_NOMEM, "reduce: cannot allocate %zu bytes of scratch", bytes);
    if (acc != sb) memmove(acc, sb, bytes);
    for (int m = 1; m < n; m <<= 1) {
        if (vr & m) {
            SL_TRY(sl_prim_sendrecv(c, (vr - m + root) % n, acc, bytes, -1, NULL, 0));
            break;
        }
        if (vr + m < n)
            SL_TRY(sl_prim_send_recv_reduce(c, -1, NULL, 0, (vr + m + root) % n, acc, acc, bytes, dt, op));
    }
    if (r == root && op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, count, n);
    return SL_OK;
}

/* Small: binomial tree. Large (or forced ring): chain root -> root+1 -> ... in pieces, so that
 * every link carries data at the same time. */
sl_status sl_algo_broadcast(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                            int root) {
    int n = c->size, r = c->rank, vr = (r - root + n) % n;
    size_t bytes = count * sl_comm_dtype_size(dt);
    if (r == root && sb != rb && bytes) memmove(rb, sb, bytes);
    if (n == 1 || bytes == 0) return SL_OK;
    int chain = c->algo == SL_COMM_ALGO_RING ||
                (c->algo == SL_COMM_ALGO_AUTO && bytes >= ((size_t)256 << 10) && n > 2);
    if (!chain) {
        int m = 1;
        while (m < n) m <<= 1;
        int have = vr == 0;
        for (m >>= 1; m >= 1; m >>= 1) {
            if (have && vr + m < n)
                SL_TRY(sl_prim_sendrecv(c, (vr + m + root) % n, rb, bytes, -1, NULL, 0));
            else if (!have && (vr & (2 * m - 1)) == m) {
                SL_TRY(sl_prim_sendrecv(c, -1, NULL, 0, (vr - m + root) % n, rb, bytes));
                have = 1;
            }
        }
        return SL_OK;
    }
    size_t piece = (size_t)1 << 20, np = (bytes + piece - 1) / piece;
    int next = vr + 1 < n ? (vr + 1 + root) % n : -1, prev = vr > 0 ? (vr - 1 + root) % n : -1;
    char *d = rb;
    /* step t: receive piece t - vr + 1 ... simpler: receive piece t, send piece t - 1 */
    for (size_t t = 0; t <= np; t++) {
        int sp = -1, rp = -1;
        size_t so = 0, sn = 0, ro = 0, rn = 0;
        if (next >= 0 && (vr == 0 ? t < np : t >= 1)) {
            size_t k = vr == 0 ? t : t - 1;
            sp = next;
            so = k * piece;
            sn = bytes - so < piece ? bytes - so : piece;
        }
        if (prev >= 0 && t < np) {
            rp = prev;
            ro = t * piece;
            rn = bytes - ro < piece ? bytes - ro : piece;
        }
        if (sp >= 0 || rp >= 0) SL_TRY(sl_prim_sendrecv(c, sp, d + so, sn, rp, d + ro, rn));
    }
    return SL_OK;
}

sl_status sl_algo_barrier(sl_algo_ctx *c) {
    int n = c->size, r = c->rank;
    char out = 1, in = 0;
    for (int m = 1; m < n; m <<= 1)
        SL_TRY(sl_prim_sendrecv(c, (r + m) % n, &out, 1, (r - m + n) % n, &in, 1));
    return SL_OK;
}
