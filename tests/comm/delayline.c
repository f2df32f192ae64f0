/* sl_delayline: a store-and-forward Ethernet switch with a fixed one-way delay, in user space, for the
 * namespace cluster (netns_cluster.sh) on kernels without sch_netem.
 *
 *   sl_delayline DELAY_US IFACE IFACE...    (in the switch namespace, root)
 *
 * Every frame received on one IFACE is sent out of the port its destination MAC was learned on (or every
 * other port, for broadcast, multicast and unknown destinations) DELAY_US microseconds after it arrived,
 * in arrival order. It stands where the bridge would be, so suanli's TCP transport and OpenMPI's TCP BTL
 * cross the same delay: a latency shaper that works on any kernel with AF_PACKET. Bandwidth shaping stays
 * in the hosts' tc tbf.
 *
 * Frames keep their GSO form (PACKET_VNET_HDR, the interface tap and QEMU use), so one 64 KiB TCP segment
 * is one frame here and not 45. Each output port holds at most 16 MiB in flight; beyond that frames are
 * dropped, as a switch's buffer would (TCP recovers). The wake-up for a due frame uses a 1 ns timer slack;
 * its lateness (the scheduler's, on a busy machine) is measured and printed at exit with the counts.
 * Prints "delayline: ready" once every port is bound. SIGTERM or SIGINT ends it. Test tool, not library:
 * exits 2 on bad arguments, 1 when a port cannot be opened. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { MAX_PORTS = 16, QCAP = 8192, MAC_SLOTS = 64 };
#define VHDR ((int)sizeof(struct virtio_net_hdr))
#define FRAME_MAX (VHDR + 65536 + 512)
#define QBYTES_MAX (16u << 20)

typedef struct {
    uint64_t due;
    uint32_t len;
    uint8_t *buf;
} frame;

typedef struct {
    int fd;
    const char *name;
    frame q[QCAP];
    uint32_t head, n;
    uint64_t bytes; /* queued */
    int blocked;    /* last send returned EAGAIN: wait for POLLOUT */
    uint64_t sent, dropped;
} port;

static volatile sig_atomic_t g_stop;
static void on_signal(int s) {
    (void)s;
    g_stop = 1;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int open_port(port *p, const char *name) {
    p->name = name;
    unsigned idx = if_nametoindex(name);
    if (!idx) {
        fprintf(stderr, "delayline: no interface '%s'\n", name);
        return -1;
    }
    p->fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (p->fd < 0) {
        fprintf(stderr, "delayline: AF_PACKET socket for '%s': %s\n", name, strerror(errno));
        return -1;
    }
    int one = 1, buf = 8 << 20;
    if (setsockopt(p->fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0 ||
        setsockopt(p->fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) != 0) {
        fprintf(stderr, "delayline: '%s': PACKET_VNET_HDR / PACKET_IGNORE_OUTGOING: %s\n", name,
                strerror(errno));
        return -1;
    }
    /* large socket buffers: a burst from a 1-10 Gbit/s link must not overflow between two wake-ups */
    (void)setsockopt(p->fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf);
    (void)setsockopt(p->fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf);
    struct sockaddr_ll a = {
        .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = (int)idx};
    if (bind(p->fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "delayline: bind '%s': %s\n", name, strerror(errno));
        return -1;
    }
    struct packet_mreq m = {.mr_ifindex = (int)idx, .mr_type = PACKET_MR_PROMISC};
    if (setsockopt(p->fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &m, sizeof m) != 0) {
        fprintf(stderr, "delayline: promiscuous '%s': %s\n", name, strerror(errno));
        return -1;
    }
    return 0;
}

/* MAC learning: which port each source address was last seen on */
static uint8_t g_mac[MAC_SLOTS][6];
static int g_mac_port[MAC_SLOTS], g_nmac;

static void learn(const uint8_t *mac, int portno) {
    if (mac[0] & 1) return; /* group address as a source: ignore */
    for (int i = 0; i < g_nmac; i++)
        if (!memcmp(g_mac[i], mac, 6)) {
            g_mac_port[i] = portno;
            return;
        }
    if (g_nmac < MAC_SLOTS) {
        memcpy(g_mac[g_nmac], mac, 6);
        g_mac_port[g_nmac++] = portno;
    }
}

static int lookup(const uint8_t *mac) {
    if (mac[0] & 1) return -1;
    for (int i = 0; i < g_nmac; i++)
        if (!memcmp(g_mac[i], mac, 6)) return g_mac_port[i];
    return -1;
}

static void enqueue(port *p, const uint8_t *data, uint32_t len, uint64_t due) {
    if (p->n == QCAP || p->bytes + len > QBYTES_MAX) {
        p->dropped++;
        return;
    }
    uint8_t *b = malloc(len);
    if (!b) {
        p->dropped++;
        return;
    }
    memcpy(b, data, len);
    frame *f = &p->q[(p->head + p->n) % QCAP];
    f->due = due;
    f->len = len;
    f->buf = b;
    p->n++;
    p->bytes += len;
}

/* lateness of sends against their due time: count, sum, max (ns) */
static uint64_t g_late_n, g_late_sum, g_late_max;

static void send_due(port *p, uint64_t now) {
    while (p->n) {
        frame *f = &p->q[p->head];
        if (f->due > now) return;
        ssize_t r = send(p->fd, f->buf, f->len, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
            p->blocked = 1;
            return;
        }
        if (r < 0)
            p->dropped++;
        else {
            p->sent++;
            uint64_t late = now - f->due;
            g_late_n++;
            g_late_sum += late;
            if (late > g_late_max) g_late_max = late;
        }
        p->bytes -= f->len;
        free(f->buf);
        p->head = (p->head + 1) % QCAP;
        p->n--;
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: sl_delayline DELAY_US IFACE IFACE...\n");
        return 2;
    }
    char *end;
    double us = strtod(argv[1], &end);
    if (*end || us < 0 || us > 10e6) {
        fprintf(stderr, "delayline: DELAY_US '%s' is not a number of microseconds in [0, 1e7]\n", argv[1]);
        return 2;
    }
    int np = argc - 2;
    if (np > MAX_PORTS) {
        fprintf(stderr, "delayline: at most %d interfaces\n", MAX_PORTS);
        return 2;
    }
    const uint64_t delay = (uint64_t)(us * 1000.0);
    static port ports[MAX_PORTS];
    for (int i = 0; i < np; i++)
        if (open_port(&ports[i], argv[i + 2]) != 0) return 1;
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    uint8_t *scratch = malloc(FRAME_MAX);
    if (!scratch) return 1;
    uint64_t truncated = 0, received = 0;
    printf("delayline: ready, %d ports, %.1f us one way\n", np, us);
    fflush(stdout);

    struct pollfd pfd[MAX_PORTS];
    while (!g_stop) {
        uint64_t now = now_ns();
        uint64_t next = UINT64_MAX;
        for (int i = 0; i < np; i++) {
            if (!ports[i].blocked) send_due(&ports[i], now);
            if (ports[i].n && !ports[i].blocked && ports[i].q[ports[i].head].due < next)
                next = ports[i].q[ports[i].head].due;
            pfd[i].fd = ports[i].fd;
            pfd[i].events = (short)(POLLIN | (ports[i].blocked ? POLLOUT : 0));
            pfd[i].revents = 0;
        }
        struct timespec ts, *tp = NULL;
        if (next != UINT64_MAX) {
            uint64_t wait = next > now ? next - now : 0;
            ts.tv_sec = (time_t)(wait / 1000000000u);
            ts.tv_nsec = (long)(wait % 1000000000u);
            tp = &ts;
        }
        int r = ppoll(pfd, (nfds_t)np, tp, NULL);
        if (r < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "delayline: poll: %s\n", strerror(errno));
            break;
        }
        for (int i = 0; i < np; i++) {
            if (pfd[i].revents & POLLOUT) ports[i].blocked = 0;
            if (!(pfd[i].revents & POLLIN)) continue;
            for (int k = 0; k < 256; k++) { /* drain, bounded so the other ports get their turn */
                ssize_t len = recv(ports[i].fd, scratch, FRAME_MAX, MSG_DONTWAIT | MSG_TRUNC);
                if (len < 0) break;
                uint64_t t = now_ns();
                received++;
                if (len > FRAME_MAX || len < VHDR + 14) {
                    truncated++;
                    continue;
                }
                const uint8_t *eth = scratch + VHDR;
                learn(eth + 6, i);
                int out = lookup(eth);
                for (int o = 0; o < np; o++)
                    if (o != i && (out < 0 || o == out))
                        enqueue(&ports[o], scratch, (uint32_t)len, t + delay);
            }
        }
    }
    uint64_t sent = 0, dropped = 0;
    for (int i = 0; i < np; i++) {
        sent += ports[i].sent;
        dropped += ports[i].dropped + ports[i].n;
        while (ports[i].n) {
            free(ports[i].q[ports[i].head].buf);
            ports[i].head = (ports[i].head + 1) % QCAP;
            ports[i].n--;
        }
        close(ports[i].fd);
    }
    free(scratch);
    fprintf(stderr,
            "delayline: %.1f us one way: received %llu frames, sent %llu, dropped %llu, truncated %llu; "
            "sent late by %.1f us mean, %.1f us max\n",
            us, (unsigned long long)received, (unsigned long long)sent, (unsigned long long)dropped,
            (unsigned long long)truncated, g_late_n ? (double)g_late_sum / (double)g_late_n / 1e3 : 0.0,
            (double)g_late_max / 1e3);
    return 0;
}
