/* Hierarchical all-reduce for communicators spanning several hosts (sub-communicators: init.c,
 * Note [Hierarchical sub-communicators]).
 *
 * Note [Hierarchical all-reduce]
 * Every host has L ranks (local rank l), H hosts. With q = count / L:
 *   1. reduce-scatter inside the host (shm): local rank l holds block l (q elements) summed over
 *      the host;
 *   2. all-reduce of block l among the H ranks with local rank l (`peers`, tcp/mpi): each holds
 *      block l summed over the world;
 *   3. all-gather inside the host (shm).
 * The count % L tail elements are all-reduced inside the host and then among the peers (a few
 * elements: latency only). Each rank sends 2(H-1)/H q elements over the network, so a host sends
 * 2(H-1)/H N in all, the same as one flat ring rank would, but L ranks carry it in parallel
 * streams and the ring's 2(n-1) network steps become 2(H-1). The result is the same on every rank
 * (each block is reduced once, in one order, then copied), but its summation order differs from
 * the flat ring's: floating-point sums agree with it to reassociation error, integers and small
 * integers in floats exactly. AVG is reduced as SUM and divided by the world size at the end, as
 * the ring does. Uneven hosts (`leaders` only): reduce to each host's leader, all-reduce among the
 * leaders, broadcast inside the host. */
#include <string.h>

#include "comm/comm_internal.h"

static sl_status hier_uneven(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                             sl_comm_redop op1) {
    SL_TRY(sl_comm_reduce(c->local, sb, rb, count, dt, op1, 0));
    if (c->leaders) SL_TRY(sl_comm_all_reduce(c->leaders, rb, rb, count, dt, op1));
    return sl_comm_broadcast(c->local, rb, rb, count, dt, 0);
}

sl_status sl_algo_allreduce_hier(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                 sl_comm_redop op) {
    sl_comm_redop op1 = op == SL_COMM_AVG ? SL_COMM_SUM : op;
    size_t es = sl_comm_dtype_size(dt);
    char *d = rb;
    const char *s = sb;
    if (!c->peers) {
        SL_TRY(hier_uneven(c, sb, rb, count, dt, op1));
    } else {
        int L = sl_comm_size(c->local), l = sl_comm_rank(c->local), H = sl_comm_size(c->peers);
        size_t q = count / (size_t)L, tail = q * (size_t)L, rem = count - tail;
        char *mine = d + (size_t)l * q * es;
        if (q) { /* ring reduce-scatter: in place is safe with recv = send + l*q (Note above ring.c's) */
            SL_TRY(sl_comm_reduce_scatter(c->local, s, mine, q, dt, op1));
            if (H > 1) SL_TRY(sl_comm_all_reduce(c->peers, mine, mine, q, dt, op1));
        }
        if (rem) {
            if (s != d) memcpy(d + tail * es, s + tail * es, rem * es);
            SL_TRY(sl_comm_all_reduce(c->local, d + tail * es, d + tail * es, rem, dt, op1));
            if (H > 1) SL_TRY(sl_comm_all_reduce(c->peers, d + tail * es, d + tail * es, rem, dt, op1));
        }
        if (q) SL_TRY(sl_comm_all_gather(c->local, mine, d, q, dt));
    }
    if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, count, c->size);
    return SL_OK;
}
