/* Hierarchical all-reduce for communicators spanning several hosts: reduce to each host's leader
 * over shared memory, all-reduce among the leaders over the network transport, broadcast inside
 * each host. Network traffic is one vector per host instead of one per rank. The sub-communicators
 * are built when the communicator is created (init.c) and run their operations inline here. */
#include "comm/comm_internal.h"

sl_status sl_algo_allreduce_hier(sl_algo_ctx *c, const void *sb, void *rb, size_t count, sl_comm_dtype dt,
                                 sl_comm_redop op) {
    sl_comm_redop op1 = op == SL_COMM_AVG ? SL_COMM_SUM : op;
    SL_TRY(sl_comm_reduce(c->local, sb, rb, count, dt, op1, 0));
    if (c->leaders) {
        SL_TRY(sl_comm_all_reduce(c->leaders, rb, rb, count, dt, op1));
        if (op == SL_COMM_AVG) sl_comm_div_kernel(dt, rb, count, c->size);
    }
    return sl_comm_broadcast(c->local, rb, rb, count, dt, 0);
}
