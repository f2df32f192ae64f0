/* Socket helpers with deadlines; see net.h. */
#define _GNU_SOURCE
#include "comm/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int ms_left(double deadline) {
    double s = deadline - sl_time_sec();
    if (s <= 0) return 0;
    return s > 1.0 ? 1000 : (int)(s * 1000) + 1;
}

void sl_net_tune(int fd) {
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

sl_status sl_net_listen(int port, int *fd_out, int *port_out) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return sl_fail(SL_ERR_IO, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 256) != 0) {
        int e = errno;
        close(fd);
        return sl_fail(SL_ERR_IO, "cannot listen on port %d: %s", port, strerror(e));
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port_out = ntohs(a.sin_port);
    *fd_out = fd;
    return SL_OK;
}

sl_status sl_net_connect(const char *addr, int port, double deadline, int *fd_out) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gai = getaddrinfo(addr, ps, &hints, &res);
    if (gai != 0) return sl_fail(SL_ERR_IO, "cannot resolve %s: %s", addr, gai_strerror(gai));
    int last = 0;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            freeaddrinfo(res);
            return sl_fail(SL_ERR_IO, "socket: %s", strerror(errno));
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            freeaddrinfo(res);
            sl_net_tune(fd);
            *fd_out = fd;
            return SL_OK;
        }
        last = errno;
        close(fd);
        if (sl_time_sec() > deadline) break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    freeaddrinfo(res);
    return sl_fail(SL_ERR_TIMEOUT, "cannot connect to %s:%d before the deadline: %s", addr, port,
                   strerror(last));
}

sl_status sl_net_accept(int lfd, double deadline, int *fd_out) {
    for (;;) {
        struct pollfd p = {lfd, POLLIN, 0};
        int ms = ms_left(deadline);
        if (ms == 0) return sl_fail(SL_ERR_TIMEOUT, "no connection arrived before the deadline");
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno != EINTR) return sl_fail(SL_ERR_IO, "poll: %s", strerror(errno));
        if (rc <= 0) continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            sl_net_tune(fd);
            *fd_out = fd;
            return SL_OK;
        }
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
            return sl_fail(SL_ERR_IO, "accept: %s", strerror(errno));
    }
}

static sl_status io_full(int fd, void *buf, size_t n, double deadline, const char *who, int wr) {
    size_t done = 0;
    while (done < n) {
        struct pollfd p = {fd, wr ? POLLOUT : POLLIN, 0};
        int ms = ms_left(deadline);
        if (ms == 0) return sl_fail(SL_ERR_TIMEOUT, "%s: no progress before the deadline", who);
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno != EINTR) return sl_fail(SL_ERR_IO, "%s: poll: %s", who, strerror(errno));
        if (rc <= 0) continue;
        ssize_t k = wr ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                       : recv(fd, (char *)buf + done, n - done, MSG_DONTWAIT);
        if (k > 0)
            done += (size_t)k;
        else if (k == 0)
            return sl_fail(SL_ERR_PEER, "%s closed the connection", who);
        else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
            return sl_fail(SL_ERR_PEER, "%s: %s", who, strerror(errno));
    }
    return SL_OK;
}
sl_status sl_net_write_full(int fd, const void *buf, size_t n, double deadline, const char *who) {
    return io_full(fd, (void *)buf, n, deadline, who, 1);
}
sl_status sl_net_read_full(int fd, void *buf, size_t n, double deadline, const char *who) {
    return io_full(fd, buf, n, deadline, who, 0);
}

sl_status sl_net_first_ip(char *buf, size_t cap) {
    const char *v = getenv("SUANLI_COMM_ADDR");
    if (v && *v) {
        snprintf(buf, cap, "%s", v);
        return SL_OK;
    }
    snprintf(buf, cap, "127.0.0.1");
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return SL_OK;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        if ((i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, buf, (socklen_t)cap);
        break;
    }
    freeifaddrs(ifs);
    return SL_OK;
}
