/* Rank placement across hosts (Note [Rank placement], src/parallel/mesh.c):
 * - sl_mesh_check_hosts on host maps: tp groups inside hosts pass; tp not dividing the ranks per host,
 *   and hosts whose ranks are not consecutive, are refused with the flag named;
 * - end to end, forked ranks pretending to be 2 hosts (SUANLI_COMM_HOSTNAME) joined by a unique id:
 *   4 ranks (2 per host) with tp = 2 put each tp group on one host (its communicator is shm) and dp
 *   across hosts (tcp); 8 ranks (4 per host) with tp = 2 give dp groups of 2 ranks per host (hybrid
 *   transport, hierarchical all-reduce checked against the exact sum); tp = 4 on 2 ranks per host is
 *   refused on every rank. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suanli/parallel.h"
#include "testutil.h"

static void pure_checks(void) {
    const int two_by_two[] = {0, 0, 1, 1}, two_by_three[] = {0, 0, 0, 1, 1, 1}, interleaved[] = {0, 1, 0, 1};
    TU_CHECK(sl_mesh_check_hosts(4, 2, two_by_two) == SL_OK, "tp 2 on 2x2: %s", sl_errmsg());
    TU_CHECK(sl_mesh_check_hosts(4, 1, interleaved) == SL_OK, "tp 1 needs nothing");
    TU_CHECK(sl_mesh_check_hosts(6, 3, two_by_three) == SL_OK, "tp 3 on 2x3: %s", sl_errmsg());
    TU_CHECK(sl_mesh_check_hosts(6, 2, two_by_three) == SL_ERR_INVALID &&
                 strstr(sl_errmsg(), "--tensor-model-parallel-size 2") && strstr(sl_errmsg(), "ranks 2..3"),
             "tp 2 on 2x3 (group 2..3 straddles): %s", sl_errmsg());
    TU_CHECK(sl_mesh_check_hosts(4, 4, two_by_two) == SL_ERR_INVALID, "tp 4 on 2x2");
    TU_CHECK(sl_mesh_check_hosts(4, 2, interleaved) == SL_ERR_INVALID, "ranks not numbered host by host");
}

/* one rank: 0 ok, 1 wrong, 3 refused as expected */
static int rank_main(int n, int per_host, int tp, const sl_comm_unique_id *id, int r) {
    char hn[16];
    snprintf(hn, sizeof hn, "host%d", r / per_host);
    setenv("SUANLI_COMM_HOSTNAME", hn, 1);
    sl_comm *w;
    if (sl_comm_init_rank(&w, n, id, r, &(sl_comm_opts){.timeout_sec = 60}) != SL_OK) {
        fprintf(stderr, "FAIL rank %d init: %s\n", r, sl_errmsg());
        return 1;
    }
    sl_mesh m;
    sl_status st = sl_mesh_init(&m, w, (sl_mesh_dims){.tp = tp, .pp = 1, .ep = 1});
    int rc = 0;
    if (tp > per_host) {
        rc = st == SL_ERR_INVALID && strstr(sl_errmsg(), "spans hosts") ? 3 : 1;
        if (rc != 3)
            fprintf(stderr, "FAIL rank %d: tp %d > %d per host not refused: %s\n", r, tp, per_host,
                    sl_errmsg());
        sl_comm_free(w);
        return rc;
    }
    if (st != SL_OK) {
        fprintf(stderr, "FAIL rank %d mesh: %s\n", r, sl_errmsg());
        sl_comm_free(w);
        return 1;
    }
    sl_comm_transport_kind want_dp = per_host / tp > 1 ? SL_COMM_TRANSPORT_HYBRID : SL_COMM_TRANSPORT_TCP;
    if (sl_comm_transport(m.tp_comm) != SL_COMM_TRANSPORT_SHM || sl_comm_nhosts(m.tp_comm) != 1) {
        fprintf(stderr, "FAIL rank %d: tp group transport %s on %d hosts\n", r,
                sl_comm_transport_name(sl_comm_transport(m.tp_comm)), sl_comm_nhosts(m.tp_comm));
        rc = 1;
    }
    if (sl_comm_transport(m.dp_comm) != want_dp || sl_comm_nhosts(m.dp_comm) != 2) {
        fprintf(stderr, "FAIL rank %d: dp group transport %s on %d hosts, want %s on 2\n", r,
                sl_comm_transport_name(sl_comm_transport(m.dp_comm)), sl_comm_nhosts(m.dp_comm),
                sl_comm_transport_name(want_dp));
        rc = 1;
    }
    /* the DP all-reduce (hierarchical where dp has several ranks per host): small integers, exact */
    int64_t x[5], dp = m.dp;
    for (int i = 0; i < 5; i++) x[i] = (int64_t)(m.dp_rank + 1) * (i + 1);
    if (sl_comm_all_reduce(m.dp_comm, x, x, 5, SL_COMM_I64, SL_COMM_SUM) != SL_OK) rc = 1;
    for (int i = 0; i < 5; i++)
        if (x[i] != dp * (dp + 1) / 2 * (i + 1)) {
            fprintf(stderr, "FAIL rank %d: dp all-reduce [%d] = %lld\n", r, i, (long long)x[i]);
            rc = 1;
        }
    sl_mesh_free(&m);
    sl_comm_free(w);
    return rc;
}

static void job(int n, int per_host, int tp) {
    sl_comm_unique_id id;
    TU_CHECK(sl_comm_get_unique_id(&id) == SL_OK, "unique id: %s", sl_errmsg());
    pid_t pids[16];
    for (int r = 0; r < n; r++)
        if ((pids[r] = fork()) == 0) _exit(rank_main(n, per_host, tp, &id, r));
    int want = tp > per_host ? 3 : 0;
    for (int r = 0; r < n; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        TU_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == want,
                 "%d ranks, %d per host, tp %d: rank %d status 0x%x", n, per_host, tp, r, status);
    }
}

int main(void) {
    pure_checks();
    job(4, 2, 2);
    job(8, 4, 2);
    job(4, 2, 4);
    return tu_finish("test_mesh_hosts");
}
