/* Hybrid transport: shared memory between the ranks of one host, TCP between hosts, chosen per peer
 * inside one communicator.
 *
 * Note [Hybrid exchanges]
 * An exchange is split by peer: the transfers with ranks on this host go to a shm transport built
 * over this host's ranks (their ranks renumbered), the others to a TCP full mesh over all ranks.
 * The two halves run one after the other, shm first. That cannot deadlock: every rank runs the
 * same exchanges in the same order (Note [Transfers are byte streams per ordered pair]), and the shm
 * half of exchange k involves only ranks of one host, all of which run their own shm half of
 * exchange k before their TCP half, so it completes without waiting on any other host; then every
 * rank is in the TCP half, which is one concurrent poll-driven exchange like the plain TCP
 * transport's. The cost is that a step sending to a host peer and receiving from a remote rank (a
 * flat ring crossing hosts) takes shm time + TCP time instead of the larger of the two; the data
 * the remote peer sends meanwhile waits in the kernel's socket buffers, so the overlap loss is
 * small when shm is much faster than the network, which is the case this transport is for. The
 * hierarchical all-reduce (algo/hier.c) never mixes the two in one exchange.
 * Windows and single-copy pulls are not offered (peers on other hosts cannot map them); the cost
 * model sees the TCP half's alpha and beta. */
#include <string.h>

#include "comm/comm_internal.h"

typedef struct hyb_tp {
    sl_transport base;
    sl_transport *shm; /* this host's ranks (NULL when this rank is alone on its host) */
    sl_transport *net; /* every rank */
    int *lidx;         /* [rank] index in shm, or -1 when on another host */
    int *members;      /* [local index] rank */
    int nlocal;
    sl_xfer *xs, *xn; /* split exchange (grow-only) */
    int cap;
    atomic_int ctor_abort; /* abort flag of the children while the communicator does not exist yet */
} hyb_tp;

static void hyb_wire_flags(hyb_tp *t) {
    atomic_int *f = t->base.abort_flag ? t->base.abort_flag : &t->ctor_abort;
    t->net->abort_flag = f;
    if (t->shm) t->shm->abort_flag = f;
}

static sl_status hyb_exchange(sl_transport *t_, sl_xfer *x, int n, double deadline) {
    hyb_tp *t = (hyb_tp *)t_;
    hyb_wire_flags(t);
    if (n > t->cap) {
        sl_xfer *a = realloc(t->xs, sizeof *a * (size_t)n),
                *b = a ? realloc(t->xn, sizeof *b * (size_t)n) : NULL;
        if (a) t->xs = a;
        if (b) t->xn = b;
        if (!a || !b) return sl_fail(SL_ERR_NOMEM, "hybrid transport: out of memory");
        t->cap = n;
    }
    int ns = 0, nn = 0;
    for (int i = 0; i < n; i++) {
        int l = t->lidx[x[i].peer];
        if (l >= 0 && t->shm) {
            t->xs[ns] = x[i];
            t->xs[ns++].peer = l;
        } else {
            t->xn[nn++] = x[i];
        }
    }
    if (ns) {
        sl_status st = t->shm->vt->exchange(t->shm, t->xs, ns, deadline);
        if (st != SL_OK) { /* the shm half numbers the host's ranks 0..nlocal-1: name them */
            char map[128];
            int o = 0;
            for (int l = 0; l < t->nlocal && o < (int)sizeof map - 16; l++)
                o += snprintf(map + o, sizeof map - (size_t)o, "%s%d=%d", l ? " " : "", l, t->members[l]);
            char msg[400];
            snprintf(msg, sizeof msg, "%s", sl_errmsg());
            return sl_fail(st, "%s (shm ranks on this host: %s)", msg, map);
        }
    }
    if (nn) SL_TRY(t->net->vt->exchange(t->net, t->xn, nn, deadline));
    return SL_OK;
}

static void hyb_abort(sl_transport *t_) {
    hyb_tp *t = (hyb_tp *)t_;
    hyb_wire_flags(t);
    if (t->shm) t->shm->vt->abort(t->shm);
    t->net->vt->abort(t->net);
}

static void hyb_destroy(sl_transport *t_) {
    hyb_tp *t = (hyb_tp *)t_;
    if (!t) return;
    if (t->shm) t->shm->vt->destroy(t->shm);
    if (t->net) t->net->vt->destroy(t->net);
    free(t->lidx);
    free(t->members);
    free(t->xs);
    free(t->xn);
    free(t);
}

static const sl_transport_vt hyb_vt = {"hybrid", hyb_exchange, hyb_abort, hyb_destroy};

/* the oob of the host's shm transport: an all-gather among the host's ranks over the TCP mesh */
typedef struct host_oob {
    hyb_tp *t;
    double timeout;
} host_oob;

static sl_status host_allgather(sl_oob *o, const void *mine, void *all, size_t bytes) {
    host_oob *h = o->ctx;
    hyb_tp *t = h->t;
    int n = t->nlocal, k = 0;
    sl_xfer *x = calloc(2 * (size_t)n, sizeof *x);
    if (!x) return sl_fail(SL_ERR_NOMEM, "hybrid transport: out of memory");
    memcpy((char *)all + (size_t)o->rank * bytes, mine, bytes);
    for (int j = 0; j < n; j++) {
        if (j == o->rank) continue;
        x[k++] = (sl_xfer){.kind = SL_XFER_SEND, .peer = t->members[j], .buf = (void *)mine, .bytes = bytes};
        x[k++] = (sl_xfer){.kind = SL_XFER_RECV,
                           .peer = t->members[j],
                           .buf = (char *)all + (size_t)j * bytes,
                           .bytes = bytes};
    }
    sl_status st = t->net->vt->exchange(t->net, x, k, sl_time_sec() + h->timeout);
    free(x);
    return st;
}

sl_status sl_tp_hybrid_new(sl_oob *oob, const int *host_of, sl_transport **out) {
    int n = oob->size, r = oob->rank;
    sl_status st = SL_OK;
    hyb_tp *t = calloc(1, sizeof *t);
    if (!t || !(t->lidx = malloc(sizeof(int) * (size_t)n)) ||
        !(t->members = malloc(sizeof(int) * (size_t)n))) {
        if (t) hyb_destroy(&t->base);
        return sl_fail(SL_ERR_NOMEM, "hybrid transport: out of memory");
    }
    atomic_init(&t->ctor_abort, 0);
    for (int p = 0; p < n; p++) {
        t->lidx[p] = host_of[p] == host_of[r] ? t->nlocal : -1;
        if (t->lidx[p] >= 0) t->members[t->nlocal++] = p;
    }
    SL_CHECK(sl_tp_tcp_new(oob, &t->net));
    hyb_wire_flags(t);
    t->base = (sl_transport){.vt = &hyb_vt,
                             .kind = SL_COMM_TRANSPORT_HYBRID,
                             .rank = r,
                             .size = n,
                             .alpha = t->net->alpha,
                             .beta = t->net->beta};
    int ok = 1, *oks = calloc((size_t)n, sizeof(int));
    if (!oks) {
        st = sl_fail(SL_ERR_NOMEM, "hybrid transport: out of memory");
        goto done;
    }
    if (t->nlocal > 1) {
        host_oob h = {t, sl_comm_env_timeout()};
        sl_oob lo = {.rank = t->lidx[r], .size = t->nlocal, .allgather = host_allgather, .ctx = &h};
        snprintf(lo.local_ip, sizeof lo.local_ip, "%s", oob->local_ip);
        /* /dev/shm is one namespace for every "host" of a machine (network namespaces, pretend hosts):
         * the host index keeps the segment names apart */
        snprintf(lo.name, sizeof lo.name, "%.180s-h%d", oob->name, host_of[r]);
        snprintf(lo.token, sizeof lo.token, "%s", oob->token);
        st = sl_tp_shm_new(&lo, &t->shm);
        if (st != SL_OK) {
            ok = 0;
            t->shm = NULL;
            SL_LOGE("hybrid transport: rank %d: %s", r, sl_errmsg());
        }
    }
    /* every rank learns whether every host built its shm half, so all fail together */
    sl_status st2 = oob->allgather(oob, &ok, oks, sizeof ok);
    if (st == SL_OK) st = st2;
    for (int p = 0; p < n && st == SL_OK; p++)
        if (!oks[p])
            st = sl_fail(SL_ERR_IO, "hybrid transport: rank %d could not build its host's shm transport", p);
    free(oks);
done:
    if (st != SL_OK) {
        hyb_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return SL_OK;
}
