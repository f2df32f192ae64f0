/* Bootstrap: a TCP rendezvous at master addr:port run by rank 0, used as the out-of-band
 * all-gather while transports are built, plus unique ids.
 *
 * Note [Rendezvous protocol]
 * Every rank r > 0 connects to rank 0 and sends {magic, rank, size, token}. Rank 0 drops (closes)
 * connections whose magic, token or size do not match, or that repeat a rank, and keeps accepting
 * until all ranks arrived or the deadline passed. Each all-gather round is: every client sends its
 * bytes; rank 0 assembles them in rank order and sends the whole array back to each client. The
 * connections are closed once the communicator is built. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/net.h"
#include "comm/wire.h"

typedef struct boot {
    sl_oob oob;
    int fd;   /* client: connection to rank 0 */
    int *fds; /* rank 0: connection per rank */
    double timeout;
} boot;

static sl_status boot_allgather(sl_oob *o, const void *mine, void *all, size_t bytes) {
    boot *b = o->ctx;
    double dl = sl_time_sec() + b->timeout;
    char who[64];
    if (o->rank == 0) {
        memcpy(all, mine, bytes);
        for (int r = 1; r < o->size; r++) {
            snprintf(who, sizeof who, "bootstrap: rank %d", r);
            SL_TRY(sl_net_read_full(b->fds[r], (char *)all + (size_t)r * bytes, bytes, dl, who));
        }
        for (int r = 1; r < o->size; r++) {
            snprintf(who, sizeof who, "bootstrap: rank %d", r);
            SL_TRY(sl_net_write_full(b->fds[r], all, bytes * (size_t)o->size, dl, who));
        }
        return SL_OK;
    }
    SL_TRY(sl_net_write_full(b->fd, mine, bytes, dl, "bootstrap: rank 0"));
    return sl_net_read_full(b->fd, all, bytes * (size_t)o->size, dl, "bootstrap: rank 0");
}

static pthread_mutex_t g_lmu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char token[64];
    int fd;
} g_listeners[16];

int sl_bootstrap_take_listener(const char *token) {
    int fd = -1;
    pthread_mutex_lock(&g_lmu);
    for (int i = 0; i < 16; i++)
        if (g_listeners[i].token[0] && !strcmp(g_listeners[i].token, token)) {
            fd = g_listeners[i].fd;
            g_listeners[i].token[0] = 0;
            break;
        }
    pthread_mutex_unlock(&g_lmu);
    return fd;
}

sl_status sl_comm_get_unique_id(sl_comm_unique_id *id) {
    int fd, port;
    char ip[64], token[33];
    SL_TRY(sl_net_listen(0, &fd, &port));
    sl_net_first_ip(ip, sizeof ip);
    uint64_t r[2] = {0, 0};
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(r, sizeof r, 1, f) != 1) {
        if (f) fclose(f);
        close(fd);
        return sl_fail(SL_ERR_IO, "get_unique_id: cannot read /dev/urandom");
    }
    fclose(f);
    snprintf(token, sizeof token, "%016llx%016llx", (unsigned long long)r[0], (unsigned long long)r[1]);
    pthread_mutex_lock(&g_lmu);
    int slot = -1;
    for (int i = 0; i < 16 && slot < 0; i++)
        if (!g_listeners[i].token[0]) slot = i;
    if (slot >= 0) {
        snprintf(g_listeners[slot].token, sizeof g_listeners[slot].token, "%s", token);
        g_listeners[slot].fd = fd;
    }
    pthread_mutex_unlock(&g_lmu);
    if (slot < 0) close(fd); /* rank 0 will bind the port again */
    memset(id, 0, sizeof *id);
    snprintf(id->bytes, sizeof id->bytes, "sl1 %s %d %s", ip, port, token);
    return SL_OK;
}

int sl_comm_unique_id_parse(const sl_comm_unique_id *id, char *addr, size_t addrcap, int *port, char *token,
                            size_t tokcap) {
    char a[128], t[64];
    int p;
    if (memchr(id->bytes, 0, sizeof id->bytes) == NULL) return 0;
    if (sscanf(id->bytes, "sl1 %127s %d %63s", a, &p, t) != 3 || p <= 0 || p > 65535) return 0;
    snprintf(addr, addrcap, "%s", a);
    snprintf(token, tokcap, "%s", t);
    *port = p;
    return 1;
}

void sl_bootstrap_oob_free(sl_oob *o) {
    if (!o) return;
    boot *b = o->ctx;
    if (b->fd >= 0) close(b->fd);
    if (b->fds)
        for (int r = 1; r < o->size; r++)
            if (b->fds[r] >= 0) close(b->fds[r]);
    free(b->fds);
    free(b);
}

static void ip_of(int fd, char *buf, size_t cap) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        inet_ntop(AF_INET, &a.sin_addr, buf, (socklen_t)cap);
}

sl_status sl_bootstrap_oob_new(const char *addr, int port, const char *token, int rank, int size,
                               double timeout, sl_oob **out) {
    boot *b = calloc(1, sizeof *b);
    if (!b) return sl_fail(SL_ERR_NOMEM, "bootstrap: out of memory");
    b->fd = -1;
    b->timeout = timeout;
    b->oob.rank = rank;
    b->oob.size = size;
    b->oob.allgather = boot_allgather;
    b->oob.ctx = b;
    snprintf(b->oob.token, sizeof b->oob.token, "%s", token);
    snprintf(b->oob.local_ip, sizeof b->oob.local_ip, "127.0.0.1");
    double dl = sl_time_sec() + timeout;
    sl_status st = SL_OK;
    if (rank == 0) {
        int lfd = sl_bootstrap_take_listener(token), p;
        if (lfd < 0) {
            st = sl_net_listen(port, &lfd, &p);
            if (st != SL_OK) {
                sl_fail(st, "bootstrap: rank 0 cannot listen on %s:%d: %s", addr, port, sl_errmsg());
                goto fail;
            }
        }
        b->fds = malloc(sizeof(int) * (size_t)size);
        if (!b->fds) {
            close(lfd);
            st = sl_fail(SL_ERR_NOMEM, "bootstrap: out of memory");
            goto fail;
        }
        for (int r = 0; r < size; r++) b->fds[r] = -1;
        int have = 0;
        while (have < size - 1) {
            int fd;
            st = sl_net_accept(lfd, dl, &fd);
            if (st != SL_OK) {
                sl_fail(st, "bootstrap: only %d of %d ranks reached %s:%d before the deadline (%.0f s)",
                        have + 1, size, addr, port, timeout);
                break;
            }
            sl_wire_boot_hello h;
            double hdl = sl_time_sec() + 5 < dl ? sl_time_sec() + 5 : dl;
            int hr = -1;
            if (sl_net_read_full(fd, &h, sizeof h, hdl, "bootstrap client") == SL_OK)
                hr = sl_wire_boot_hello_rank(&h, sizeof h, token, size);
            if (hr < 0 || b->fds[hr] >= 0) {
                SL_LOGW("bootstrap: dropped a connection without this job's token/shape");
                close(fd);
                continue;
            }
            char ack = 'K';
            if (sl_net_write_full(fd, &ack, 1, hdl, "bootstrap client") != SL_OK) {
                close(fd);
                continue;
            }
            b->fds[hr] = fd;
            if (have++ == 0) ip_of(fd, b->oob.local_ip, sizeof b->oob.local_ip);
        }
        close(lfd);
        if (st != SL_OK) goto fail;
    } else {
        SL_CHECK(sl_net_connect(addr, port, dl, &b->fd));
        sl_wire_boot_hello h = {.magic = SL_WIRE_BOOT_MAGIC, .rank = (uint32_t)rank, .size = (uint32_t)size};
        snprintf(h.token, sizeof h.token, "%s", token);
        char ack = 0;
        st = sl_net_write_full(b->fd, &h, sizeof h, dl, "bootstrap: rank 0");
        if (st == SL_OK) st = sl_net_read_full(b->fd, &ack, 1, dl, "bootstrap: rank 0");
        if (st != SL_OK || ack != 'K') {
            st = sl_fail(SL_ERR_PEER,
                         "bootstrap: rendezvous at %s:%d rejected rank %d (token or world size mismatch?)",
                         addr, port, rank);
            goto fail;
        }
        ip_of(b->fd, b->oob.local_ip, sizeof b->oob.local_ip);
    }
    *out = &b->oob;
    return SL_OK;
done:
fail:
    sl_bootstrap_oob_free(&b->oob);
    return st;
}
