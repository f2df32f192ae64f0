/* The bootstrap rendezvous (src/comm/bootstrap.c, Note [Rendezvous protocol]) against connections that are
 * not the job's ranks: rank 0 of a world of 3 listens; rank 1 joins; then, before rank 2 joins, three
 * strangers connect to the rendezvous port:
 *   - a second hello claiming rank 1 (the right token and size): dropped without an ack, rank 1 keeps its
 *     place (counting it as a rank ended the rendezvous without rank 2);
 *   - a hello with another job's token: dropped without an ack, the rendezvous goes on;
 *   - a connection that never says hello: given up after rank 0's 5 s hello limit, not the whole
 *     rendezvous deadline (20 s here), so rank 2 still joins.
 * The three ranks' all-gather then carries every rank's value to every rank. Also the unique id's parser:
 * a port out of range, and an id without a terminating NUL, are refused. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "comm/net.h"
#include "comm/wire.h"
#include "testutil.h"

enum { WORLD = 3 };
#define TIMEOUT 20.0

static char g_addr[128], g_token[64];
static int g_port;

typedef struct {
    int rank;
    sl_oob *oob;
    sl_status st;
    int32_t got[WORLD];
    volatile int joined; /* sl_bootstrap_oob_new returned */
    volatile int go;     /* may run the all-gather */
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    a->st = sl_bootstrap_oob_new(g_addr, g_port, g_token, a->rank, WORLD, TIMEOUT, &a->oob);
    a->joined = 1;
    if (a->st != SL_OK) return NULL;
    while (!a->go) usleep(1000);
    int32_t mine = 10 * a->rank + 7;
    a->st = a->oob->allgather(a->oob, &mine, a->got, sizeof mine);
    return NULL;
}

/* connect and send a hello (rank, size, token); 1 when rank 0 answered with the ack, 0 when it closed the
 * connection without one, -1 when the connection failed */
static int stranger(int rank, int size, const char *token) {
    int fd;
    double dl = sl_time_sec() + 10;
    if (sl_net_connect(g_addr, g_port, dl, &fd) != SL_OK) return -1;
    sl_wire_boot_hello h = {.magic = SL_WIRE_BOOT_MAGIC, .rank = (uint32_t)rank, .size = (uint32_t)size};
    snprintf(h.token, sizeof h.token, "%s", token);
    char ack = 0;
    int r = sl_net_write_full(fd, &h, sizeof h, dl, "stranger") != SL_OK ? -1
            : sl_net_read_full(fd, &ack, 1, dl, "stranger") == SL_OK     ? ack == 'K'
                                                                         : 0;
    close(fd);
    return r;
}

int main(void) {
    sl_comm_unique_id id;
    TU_CHECK(sl_comm_get_unique_id(&id) == SL_OK, "get_unique_id: %s", sl_errmsg());
    TU_CHECK(sl_comm_unique_id_parse(&id, g_addr, sizeof g_addr, &g_port, g_token, sizeof g_token),
             "parse: %s", id.bytes);
    rank_arg ra[WORLD];
    pthread_t th[WORLD];
    for (int r = 0; r < WORLD; r++) ra[r] = (rank_arg){.rank = r};
    double t0 = sl_time_sec();
    pthread_create(&th[0], NULL, rank_main, &ra[0]);
    pthread_create(&th[1], NULL, rank_main, &ra[1]);
    while (!ra[1].joined) usleep(1000);
    TU_CHECK(ra[1].st == SL_OK, "rank 1 joined: %s", sl_errmsg());
    int dup = stranger(1, WORLD, g_token);
    TU_CHECK(dup == 0, "a second hello for rank 1: %s", dup > 0 ? "acked" : "connection failed");
    int other = stranger(2, WORLD, "0123456789abcdef0123456789abcdef");
    TU_CHECK(other == 0, "another job's token: %s", other > 0 ? "acked" : "connection failed");
    int silent = -1;
    TU_CHECK(sl_net_connect(g_addr, g_port, sl_time_sec() + 10, &silent) == SL_OK, "silent connect: %s",
             sl_errmsg());
    pthread_create(&th[2], NULL, rank_main, &ra[2]);
    while (!ra[0].joined || !ra[2].joined) usleep(1000);
    double dt = sl_time_sec() - t0;
    if (silent >= 0) close(silent);
    TU_CHECK(ra[0].st == SL_OK && ra[2].st == SL_OK, "rendezvous: rank 0 %s, rank 2 %s (%s)",
             sl_status_name(ra[0].st), sl_status_name(ra[2].st), sl_errmsg());
    TU_CHECK(dt < TIMEOUT - 5, "the silent connection held the rendezvous %.1f s (hello limit 5 s)", dt);
    for (int r = 0; r < WORLD; r++) ra[r].go = 1;
    for (int r = 0; r < WORLD; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < WORLD; r++) {
        int ok = ra[r].st == SL_OK;
        for (int q = 0; q < WORLD && ok; q++) ok = ra[r].got[q] == 10 * q + 7;
        TU_CHECK(ok, "rank %d: all-gather %s: %d %d %d", r, sl_status_name(ra[r].st), ra[r].got[0],
                 ra[r].got[1], ra[r].got[2]);
        if (ra[r].oob) sl_bootstrap_oob_free(ra[r].oob);
    }
    printf("rendezvous with three strangers: %.1f s\n", dt);

    /* the unique id's parser */
    char addr[128], tok[64];
    int port;
    memset(&id, 0, sizeof id);
    snprintf(id.bytes, sizeof id.bytes, "sl1 127.0.0.1 70000 %s", g_token);
    TU_CHECK(!sl_comm_unique_id_parse(&id, addr, sizeof addr, &port, tok, sizeof tok), "port 70000 refused");
    snprintf(id.bytes, sizeof id.bytes, "sl1 127.0.0.1 65535 %s", g_token);
    TU_CHECK(sl_comm_unique_id_parse(&id, addr, sizeof addr, &port, tok, sizeof tok) && port == 65535 &&
                 !strcmp(tok, g_token) && !strcmp(addr, "127.0.0.1"),
             "port 65535 taken");
    /* every byte used, no NUL: the parser must not read past the id */
    struct {
        sl_comm_unique_id id;
        char after[64];
    } un;
    memset(&un, 0, sizeof un);
    memset(un.id.bytes, 'a', sizeof un.id.bytes);
    memcpy(un.id.bytes, "sl1 127.0.0.1 80 ", 17);
    TU_CHECK(!sl_comm_unique_id_parse(&un.id, addr, sizeof addr, &port, tok, sizeof tok),
             "an id without its NUL refused");
    return tu_finish("test_comm_boot");
}
