/* TCP transport (libc only): a full mesh of sockets, one per pair, non-blocking and driven by
 * poll(). RECV_REDUCE receives into a staging buffer and reduces whole elements as they arrive.
 * A closed or reset connection is SL_ERR_PEER; abort shuts every socket down so that peers see
 * EOF at once. Connections carry the job token; others are dropped. Errors name the peer by rank and
 * by the address it announced (ip:port), so that a lost peer on another machine can be told apart. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/net.h"
#include "comm/wire.h"

#define STAGE (256u << 10)

typedef struct tcp_tp {
    sl_transport base;
    int *fds;
    char *stage;
    size_t stage_cap;
    struct pollfd *pfd;
    int *pidx;
    char (*addr)[80]; /* [p] "ip:port" that rank p announced, for messages */
} tcp_tp;

static int first_pending(const sl_xfer *x, int n) {
    for (int i = 0; i < n; i++)
        if (x[i].done != x[i].bytes) return x[i].peer;
    return -1;
}

static sl_status tcp_exchange(sl_transport *t_, sl_xfer *x, int n, double deadline) {
    tcp_tp *t = (tcp_tp *)t_;
    int nrr = 0, remaining = 0;
    for (int i = 0; i < n; i++) {
        x[i].done = x[i].aux = 0;
        if (x[i].bytes) remaining++;
        if (x[i].kind == SL_XFER_RECV_REDUCE) nrr++;
    }
    if ((size_t)nrr * STAGE > t->stage_cap) {
        free(t->stage);
        t->stage = malloc((size_t)nrr * STAGE);
        t->stage_cap = t->stage ? (size_t)nrr * STAGE : 0;
        if (!t->stage) return sl_fail(SL_ERR_NOMEM, "tcp transport: out of memory");
    }
    while (remaining) {
        if (atomic_load(t->base.abort_flag)) return sl_fail(SL_ERR_ABORTED, "communicator aborted");
        int np = 0;
        for (int p = 0; p < t->base.size; p++) t->pidx[p] = -1;
        for (int i = 0; i < n; i++) {
            if (x[i].done == x[i].bytes) continue;
            int p = x[i].peer;
            if (t->pidx[p] < 0) {
                t->pidx[p] = np;
                t->pfd[np++] = (struct pollfd){t->fds[p], 0, 0};
            }
            t->pfd[t->pidx[p]].events |= x[i].kind == SL_XFER_SEND ? POLLOUT : POLLIN;
        }
        double left = deadline - sl_time_sec();
        if (left <= 0) {
            int p = first_pending(x, n);
            return sl_fail(SL_ERR_TIMEOUT,
                           "tcp transport: no progress with rank %d (%s) before the deadline "
                           "(SUANLI_COMM_TIMEOUT)",
                           p, p >= 0 ? t->addr[p] : "?");
        }
        int rc = poll(t->pfd, (nfds_t)np, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        if (rc < 0 && errno != EINTR) return sl_fail(SL_ERR_IO, "tcp transport: poll: %s", strerror(errno));
        if (rc <= 0) continue;
        int rr = 0;
        for (int i = 0; i < n; i++) {
            sl_xfer *xi = &x[i];
            int is_rr = xi->kind == SL_XFER_RECV_REDUCE, myrr = is_rr ? rr++ : -1;
            if (xi->done == xi->bytes) continue;
            int is_send = xi->kind == SL_XFER_SEND, blocked = 0;
            for (int j = 0; j < i && !blocked; j++)
                blocked = x[j].done != x[j].bytes && x[j].peer == xi->peer &&
                          (x[j].kind == SL_XFER_SEND) == is_send;
            if (blocked) continue;
            short re = t->pfd[t->pidx[xi->peer]].revents;
            int fd = t->fds[xi->peer];
            if (is_send) {
                if (!(re & (POLLOUT | POLLERR | POLLHUP))) continue;
                ssize_t k =
                    send(fd, (char *)xi->buf + xi->done, xi->bytes - xi->done, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (k > 0)
                    xi->done += (size_t)k;
                else if (k < 0 && errno != EAGAIN && errno != EINTR)
                    return sl_fail(SL_ERR_PEER, "rank %d (%s): connection lost: %s", xi->peer,
                                   t->addr[xi->peer], strerror(errno));
            } else {
                if (!(re & (POLLIN | POLLERR | POLLHUP))) continue;
                ssize_t k;
                if (!is_rr) {
                    k = recv(fd, (char *)xi->buf + xi->done, xi->bytes - xi->done, MSG_DONTWAIT);
                    if (k > 0) xi->done += (size_t)k;
                } else {
                    char *sg = t->stage + (size_t)myrr * STAGE;
                    size_t want = xi->bytes - xi->done - xi->aux;
                    if (want > STAGE - xi->aux) want = STAGE - xi->aux;
                    k = recv(fd, sg + xi->aux, want, MSG_DONTWAIT);
                    if (k > 0) {
                        xi->aux += (size_t)k;
                        size_t es = sl_comm_dtype_size(xi->dt), whole = xi->aux / es * es;
                        sl_comm_reduce_kernel(xi->dt, xi->op, (char *)xi->buf + xi->done,
                                              (const char *)xi->src + xi->done, sg, whole / es);
                        xi->done += whole;
                        xi->aux -= whole;
                        if (xi->aux) memmove(sg, sg + whole, xi->aux);
                    }
                }
                if (k == 0)
                    return sl_fail(SL_ERR_PEER, "rank %d (%s) closed the connection (died or aborted)",
                                   xi->peer, t->addr[xi->peer]);
                if (k < 0 && errno != EAGAIN && errno != EINTR)
                    return sl_fail(SL_ERR_PEER, "rank %d (%s): connection lost: %s", xi->peer,
                                   t->addr[xi->peer], strerror(errno));
            }
            if (xi->done == xi->bytes) remaining--;
        }
    }
    return SL_OK;
}

static void tcp_abort(sl_transport *t_) {
    tcp_tp *t = (tcp_tp *)t_;
    for (int p = 0; p < t->base.size; p++)
        if (t->fds[p] >= 0) shutdown(t->fds[p], SHUT_RDWR);
}

static void tcp_destroy(sl_transport *t_) {
    tcp_tp *t = (tcp_tp *)t_;
    if (!t) return;
    if (t->fds)
        for (int p = 0; p < t->base.size; p++)
            if (t->fds[p] >= 0) close(t->fds[p]);
    free(t->fds);
    free(t->stage);
    free(t->pfd);
    free(t->pidx);
    free(t->addr);
    free(t);
}

static const sl_transport_vt tcp_vt = {"tcp", tcp_exchange, tcp_abort, tcp_destroy};

sl_status sl_tp_tcp_new(sl_oob *oob, sl_transport **out) {
    int n = oob->size, r = oob->rank, lfd = -1, port = 0;
    sl_status st = SL_OK;
    sl_wire_tcp_addr *all = NULL;
    tcp_tp *t = calloc(1, sizeof *t);
    double timeout = sl_comm_env_timeout(), dl = sl_time_sec() + timeout;
    if (!t || !(t->fds = malloc(sizeof(int) * (size_t)n)) || !(t->pfd = calloc((size_t)n, sizeof *t->pfd)) ||
        !(t->pidx = calloc((size_t)n, sizeof(int))) || !(all = calloc((size_t)n, sizeof *all)) ||
        !(t->addr = calloc((size_t)n, sizeof *t->addr))) {
        st = sl_fail(SL_ERR_NOMEM, "tcp transport: out of memory");
        goto done;
    }
    t->base = (sl_transport){.vt = &tcp_vt,
                             .kind = SL_COMM_TRANSPORT_TCP,
                             .rank = r,
                             .size = n,
                             .alpha = 30e-6,
                             .beta = 1.0 / 2e9};
    for (int p = 0; p < n; p++) t->fds[p] = -1;
    SL_CHECK(sl_net_listen(0, &lfd, &port));
    sl_wire_tcp_addr me = {.port = port};
    snprintf(me.ip, sizeof me.ip, "%s", oob->local_ip);
    SL_CHECK(oob->allgather(oob, &me, all, sizeof me));
    for (int p = 0; p < r; p++) SL_CHECK(sl_wire_tcp_addr_check(&all[p], sizeof all[p], p)); /* we connect */
    for (int p = 0; p < n;
         p++) { /* for messages: printable characters only (higher ranks' are not checked) */
        all[p].ip[sizeof all[p].ip - 1] = 0;
        snprintf(t->addr[p], sizeof t->addr[p], "%s:%d", all[p].ip, (int)all[p].port);
        for (char *q = t->addr[p]; *q; q++)
            if (*q < 0x21 || *q > 0x7e) *q = '?';
    }
    sl_wire_tcp_hello h = {.magic = SL_WIRE_TCP_MAGIC, .rank = (uint32_t)r};
    snprintf(h.token, sizeof h.token, "%s", oob->token);
    for (int p = 0; p < r; p++) { /* connect to lower ranks; their kernels queue us until accept */
        SL_CHECK(sl_net_connect(all[p].ip, all[p].port, dl, &t->fds[p]));
        SL_CHECK(sl_net_write_full(t->fds[p], &h, sizeof h, dl, "tcp handshake"));
    }
    for (int have = 0; have < n - 1 - r;) { /* accept higher ranks */
        int fd;
        SL_CHECK(sl_net_accept(lfd, dl, &fd));
        sl_wire_tcp_hello ph;
        int pr = -1;
        if (sl_net_read_full(fd, &ph, sizeof ph, dl, "tcp handshake") == SL_OK)
            pr = sl_wire_tcp_hello_rank(&ph, sizeof ph, oob->token, r, n);
        if (pr < 0 || t->fds[pr] >= 0) {
            SL_LOGW("tcp transport: dropped a connection without this job's token");
            close(fd);
            continue;
        }
        t->fds[pr] = fd;
        have++;
    }
    for (int p = 0; p < n; p++)
        if (t->fds[p] >= 0) fcntl(t->fds[p], F_SETFL, fcntl(t->fds[p], F_GETFL) | O_NONBLOCK);
done:
    if (lfd >= 0) close(lfd);
    free(all);
    if (st != SL_OK) {
        if (t) tcp_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return SL_OK;
}
