/* A pooled checkpoint transfer cut off in the middle of a piece (Note [Pool transfers over comm] and Note
 * [Pooled restore stream], src/ckpt/pool_comm.c): two forked ranks over TCP (the transport forced, a 20 s
 * deadline). Rank 0 stands in for a peer host: it speaks the transfer's wire with the public comm calls
 * (the exchange's all-gathered descriptors and its pieces; the restore stream's header, memory vote, piece
 * broadcasts and closing header) for a file larger than one 8 MiB piece, and in the cut cases sends a whole
 * piece, then 3 MiB of the next, and dies (_exit: its sockets close as a kill -9 leaves them). Rank 1 runs
 * the library side.
 * - exchange (sl_ckpt_pool_exchange: a 4096-byte head and a 20 MiB body, pieces head, 8, 8, 4 MiB): the
 *   receiver returns SL_ERR_PEER, well before the deadline (the closed connection, not the timeout), with a
 *   message naming the peer (rank 0 and its ip:port), the file and the piece; no shard file at its path and
 * no temp file in the step dir, although the head and the first body piece had gone to the temp file;
 * - restore stream (sl_ckpt_pool_restore_stream, 20 MiB, the holder cut during its second piece): the
 *   receiver returns 0 with the reason naming host 0, the file and rank 0's address; nothing at dest, no
 *   temp file;
 * - controls: the same stand-in sending everything: the exchanged file is bitwise the bytes, the restored
 *   file too, with the stream's XXH3 (so the stand-in speaks the wire the library expects).
 * A receiver still running after 60 s is killed and counted as a hang. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ckpt/pool_internal.h"
#include "suanli/ckpt.h"
#include "suanli/comm.h"
#include "testutil.h"

enum { HLEN = 4096, CUT = 3 << 20 };
#define BLEN ((size_t)20 << 20)
#define STEP "step-0000001"
#define FILE_NAME "shard-r00000.safetensors"

static char root[512];
static char *head, *body;

typedef struct {
    int st, ok;
    double sec;
    char msg[1024];
} outcome;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the TCP transport's message for a peer gone mid-transfer: EOF (it died with nothing unread) or a reset */
static int names_lost_peer(const char *msg) {
    return strstr(msg, "rank 0 (") &&
           (strstr(msg, ") closed the connection") || strstr(msg, "): connection lost"));
}

static int count_tmp_at(const char *d) { return tu_count_names(d, ".tmp"); }

/* the stand-in's sends: len bytes of buf, or only `cut` of them and then death */
static void send_or_die(sl_comm *c, const char *buf, size_t len, size_t cut) {
    if (cut && cut < len) {
        sl_comm_send(c, buf, cut, SL_COMM_U8, 1);
        _exit(137); /* mid-piece: the kernel closes the sockets */
    }
    if (sl_comm_send(c, buf, len, SL_COMM_U8, 1) != SL_OK) _exit(3);
}

/* rank 0 of an exchange: one stream head + body to rank 1; cut: die inside the second body piece */
static void fake_exchange_sender(sl_comm *c, int cut) {
    sl_ckpt_pool_stream_desc d[SL_CKPT_POOL_MAX_STREAMS], all[2 * SL_CKPT_POOL_MAX_STREAMS];
    memset(d, 0, sizeof d);
    for (int i = 0; i < SL_CKPT_POOL_MAX_STREAMS; i++) d[i].src = d[i].dst = -1;
    d[0] = (sl_ckpt_pool_stream_desc){.src = 0, .dst = 1, .hlen = HLEN, .blen = (int64_t)BLEN};
    snprintf(d[0].name, sizeof d[0].name, "%s", FILE_NAME);
    if (sl_comm_all_gather(c, d, all, sizeof d, SL_COMM_U8) != SL_OK) _exit(3);
    send_or_die(c, head, HLEN, 0); /* round 0: the head */
    for (size_t off = 0, t = 1; off < BLEN; off += SL_CKPT_POOL_PIECE, t++) {
        size_t len = BLEN - off < SL_CKPT_POOL_PIECE ? BLEN - off : SL_CKPT_POOL_PIECE;
        send_or_die(c, body + off, len, cut && t == 2 ? CUT : 0);
    }
}

/* the restore stream's header (pool_comm.c's stream_head) */
typedef struct {
    int64_t ok, n;
    char why[496];
} stream_head;

/* rank 0 as the holder of a restore stream of the body; cut: die inside the second piece */
static void fake_restore_holder(sl_comm *c, int cut) {
    stream_head m = {.ok = 1, .n = (int64_t)BLEN};
    int32_t lack = 0, any = 0;
    if (sl_comm_broadcast(c, &m, &m, sizeof m, SL_COMM_U8, 0) != SL_OK ||
        sl_comm_all_reduce(c, &lack, &any, 1, SL_COMM_I32, SL_COMM_MAX) != SL_OK)
        _exit(3);
    for (size_t off = 0, t = 0; off < BLEN; off += SL_CKPT_POOL_PIECE, t++) {
        size_t len = BLEN - off < SL_CKPT_POOL_PIECE ? BLEN - off : SL_CKPT_POOL_PIECE;
        if (cut && t == 1) send_or_die(c, body + off, len, CUT);
        if (sl_comm_broadcast(c, body + off, body + off, len, SL_COMM_U8, 0) != SL_OK) _exit(3);
    }
    memset(&m, 0, sizeof m);
    m.ok = 1;
    if (sl_comm_broadcast(c, &m, &m, sizeof m, SL_COMM_U8, 0) != SL_OK) _exit(3);
}

/* rank 1: the library side; the outcome goes to fd */
static void receiver(sl_comm *c, int restore, int fd) {
    outcome o = {0};
    double t0 = now();
    if (!restore) {
        sl_ckpt_pool p = {.local_root = root, .hosts = 2, .host = 1, .replicas = 2, .comm = c};
        o.st = sl_ckpt_pool_exchange(&p, STEP, NULL, 0);
        o.ok = o.st == SL_OK;
        if (!o.ok) snprintf(o.msg, sizeof o.msg, "%s", sl_errmsg());
    } else {
        char dest[700], sum[32], got[32] = "";
        snprintf(dest, sizeof dest, "%s/restored.bin", root);
        snprintf(sum, sizeof sum, "xxh3:%016llx", (unsigned long long)XXH3_64bits(body, BLEN));
        sl_status wst;
        o.ok = sl_ckpt_pool_restore_stream(c, 0, "/nonexistent/on/rank1", FILE_NAME, BLEN, dest, sum, got,
                                           sizeof got, &wst, o.msg, sizeof o.msg);
        o.st = wst;
        if (o.ok && strcmp(got, sum)) snprintf(o.msg, sizeof o.msg, "hash %s, want %s", got, sum), o.ok = 0;
    }
    o.sec = now() - t0;
    ssize_t w = write(fd, &o, sizeof o);
    (void)w;
}

/* one case: rank 0 the stand-in, rank 1 the library; 0 when the receiver reported within 60 s */
static int run_case(int restore, int cut, outcome *o) {
    sl_comm_unique_id id;
    int pfd[2];
    if (sl_comm_get_unique_id(&id) != SL_OK || pipe(pfd) != 0) return -1;
    pid_t pids[2];
    fflush(stdout); /* the children must not print the parent's buffered lines again */
    for (int r = 0; r < 2; r++) {
        if ((pids[r] = fork()) != 0) continue;
        close(pfd[0]);
        sl_comm_opts co = {.transport = SL_COMM_TRANSPORT_TCP, .timeout_sec = 20};
        sl_comm *c = NULL;
        if (sl_comm_init_rank(&c, 2, &id, r, &co) != SL_OK) {
            fprintf(stderr, "rank %d: init: %s\n", r, sl_errmsg());
            _exit(2);
        }
        if (r == 0) {
            if (restore)
                fake_restore_holder(c, cut);
            else
                fake_exchange_sender(c, cut);
            sl_comm_free(c);
            _exit(0);
        }
        receiver(c, restore, pfd[1]);
        close(pfd[1]);
        sl_comm_free(c);
        free(head);
        free(body);
        exit(0); /* exit, not _exit: LeakSanitizer checks the receiver's error path */
    }
    close(pfd[1]);
    int status[2] = {0, 0}, left = 2;
    double t0 = now();
    while (left > 0 && now() - t0 < 60) {
        for (int r = 0; r < 2; r++)
            if (pids[r] > 0 && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) pids[r] = 0, left--;
        usleep(20000);
    }
    for (int r = 0; r < 2; r++)
        if (pids[r] > 0) { /* a hang */
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &status[r], 0);
        }
    ssize_t n = read(pfd[0], o, sizeof *o);
    close(pfd[0]);
    TU_CHECK(left == 0, "%s%s: rank(s) still running after 60 s (a hang)", restore ? "restore" : "exchange",
             cut ? " cut" : "");
    TU_CHECK(WIFEXITED(status[1]) && WEXITSTATUS(status[1]) == 0,
             "%s%s: the receiver exited cleanly (status 0x%x: not a crash)", restore ? "restore" : "exchange",
             cut ? " cut" : "", status[1]);
    return n == (ssize_t)sizeof *o && left == 0 ? 0 : -1;
}

static void fresh_root(void) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", root, root);
    TU_CHECK(system(cmd) == 0, "fresh directory %s", root);
}

static void test_exchange(void) {
    char path[800], stepdir[700];
    snprintf(stepdir, sizeof stepdir, "%s/host-1/%s", root, STEP);
    snprintf(path, sizeof path, "%s/%s", stepdir, FILE_NAME);
    for (int cut = 0; cut <= 1; cut++) {
        fresh_root();
        outcome o;
        if (run_case(0, cut, &o) != 0) continue;
        if (!cut) {
            TU_CHECK(o.ok && tu_file_is(path, head, HLEN, body, BLEN),
                     "exchange control: the file arrived whole: %s", o.msg);
            continue;
        }
        printf("exchange cut mid-piece: status %d after %.2f s: %s\n", o.st, o.sec, o.msg);
        TU_CHECK(o.st == SL_ERR_PEER, "exchange cut: SL_ERR_PEER, got %d (%s)", o.st, o.msg);
        TU_CHECK(o.sec < 10, "exchange cut: reported after %.1f s: the closed connection, not the deadline",
                 o.sec);
        TU_CHECK(names_lost_peer(o.msg), "exchange cut: the message names the peer: %s", o.msg);
        TU_CHECK(strstr(o.msg, "checkpoint transfer of " FILE_NAME " from rank 0, piece 3 of 4"),
                 "exchange cut: the message names the file and the piece: %s", o.msg);
        TU_CHECK(access(path, F_OK) != 0, "exchange cut: no shard file at %s", path);
        TU_CHECK(count_tmp_at(stepdir) == 0, "exchange cut: no temp file left in %s", stepdir);
    }
}

static void test_restore(void) {
    char dest[700];
    snprintf(dest, sizeof dest, "%s/restored.bin", root);
    for (int cut = 0; cut <= 1; cut++) {
        fresh_root();
        outcome o;
        if (run_case(1, cut, &o) != 0) continue;
        if (!cut) {
            TU_CHECK(o.ok && o.st == SL_OK && tu_file_is(dest, body, BLEN, "", 0),
                     "restore control: the file arrived whole with its hash: %s", o.msg);
            continue;
        }
        printf("restore cut mid-piece: ok %d after %.2f s: %s\n", o.ok, o.sec, o.msg);
        TU_CHECK(!o.ok, "restore cut: reported as failed");
        TU_CHECK(o.sec < 10, "restore cut: reported after %.1f s: the closed connection, not the deadline",
                 o.sec);
        TU_CHECK(strstr(o.msg, "host 0: " FILE_NAME ": transfer failed") && names_lost_peer(o.msg),
                 "restore cut: the reason names host, file and peer: %s", o.msg);
        TU_CHECK(access(dest, F_OK) != 0, "restore cut: nothing at %s", dest);
        TU_CHECK(count_tmp_at(root) == 0, "restore cut: no temp file left in %s", root);
    }
}

int main(void) {
    char tmpl[] = "/tmp/suanli-pool-cut-XXXXXX";
    const char *d = mkdtemp(tmpl);
    if (!d) return perror("mkdtemp"), 1;
    snprintf(root, sizeof root, "%s/pool", d);
    head = malloc(HLEN);
    body = malloc(BLEN);
    for (size_t i = 0; i < HLEN; i++) head[i] = (char)(i * 3 + 1);
    for (size_t i = 0; i < BLEN; i++)
        body[i] = (char)(i * 151 + (i >> 12) + (i >> 23) * 37); /* pieces differ */
    test_exchange();
    test_restore();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", d);
    free(head);
    free(body);
    return tu_finish("test_pool_cut");
}
