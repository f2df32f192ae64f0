/* Pairwise all-to-all(v): in step k (1..n-1) rank r sends to r+k and receives from r-k, so every
 * link carries one block per step and no rank is a hot spot. On transports with windows (shm,
 * loopback) the pull of algo/sym.c runs instead (Note [Window data movement]). */
#include <string.h>

#include "comm/comm_internal.h"

sl_status sl_algo_alltoallv(sl_algo_ctx *c, const void *sb, const size_t *scounts, const size_t *sdispls,
                            void *rb, const size_t *rcounts, const size_t *rdispls, sl_comm_dtype dt) {
    int n = c->size, r = c->rank;
    size_t es = sl_comm_dtype_size(dt);
    const char *s = sb;
    char *d = rb;
    if (sb == rb) { /* in place: send from a copy */
        size_t hi = 0;
        for (int j = 0; j < n; j++)
            if ((sdispls[j] + scounts[j]) * es > hi) hi = (sdispls[j] + scounts[j]) * es;
        char *tmp = sl_algo_scratch(c, hi ? hi : 1);
        if (!tmp) return sl_fail(SL_ERR_NOMEM, "all-to-all: cannot allocate %zu bytes of scratch", hi);
        memcpy(tmp, sb, hi);
        s = tmp;
    }
    if (rcounts[r] != scounts[r])
        return sl_fail(SL_ERR_INVALID, "all-to-all: rank %d sends itself %zu elements but expects %zu", r,
                       scounts[r], rcounts[r]);
    if (sl_sym_enabled(c) && n > 1) { /* transport with windows: algo/sym.c, Note [Window data movement] */
        sl_status st = sl_sym_alltoallv(c, s, scounts, sdispls, rb, rcounts, rdispls, dt);
        if (st != SL_ERR_UNSUPPORTED) return st;
    }
    if (scounts[r]) memmove(d + rdispls[r] * es, s + sdispls[r] * es, scounts[r] * es);
    for (int k = 1; k < n; k++) {
        int to = (r + k) % n, from = (r - k + n) % n;
        SL_TRY(sl_prim_sendrecv(c, to, s + sdispls[to] * es, scounts[to] * es, from, d + rdispls[from] * es,
                                rcounts[from] * es));
    }
    return SL_OK;
}
