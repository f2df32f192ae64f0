/* Mismatched send / receive sizes on a single-copy pull (Note [Single-copy pulls],
 * src/comm/transport/fifo.c): two forked ranks over shm with SUANLI_SHM_PULL_KB=64; rank 0 sends S bytes,
 * rank 1 expects R, both pulled. R != S must fail on the receiver with the message naming both counts (the
 * pull-length check), never copy R bytes from the sender's S-byte buffer: R > S read past the sender's
 * buffer, R < S took a truncated message as complete (each survived a mutation audit). The sender errors out
 * too (its descriptor is never consumed: the deadline). R == S moves the data (the control; pulls need
 * process_vm_readv between the ranks, as test_comm_shm_large_pull does), also at exactly the threshold,
 * where sender and receiver must agree that the transfer is pulled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suanli/comm.h"

enum { KB = 1024 };

/* one case: 0 passed, 1 failed */
static int run_case(size_t send_bytes, size_t recv_bytes) {
    sl_comm_unique_id id;
    if (sl_comm_get_unique_id(&id) != SL_OK) return fprintf(stderr, "FAIL id: %s\n", sl_errmsg()), 1;
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        if ((pids[r] = fork()) < 0) {
            perror("FAIL fork");
            return 1;
        }
        if (pids[r] != 0) continue;
        sl_comm_opts o = {.transport = SL_COMM_TRANSPORT_SHM, .timeout_sec = 3.0};
        sl_comm *c;
        if (sl_comm_init_rank(&c, 2, &id, r, &o) != SL_OK) {
            fprintf(stderr, "rank %d init: %s\n", r, sl_errmsg());
            _exit(1);
        }
        size_t n = r == 0 ? send_bytes : recv_bytes;
        unsigned char *buf = malloc(n);
        for (size_t i = 0; i < n; i++) buf[i] = r == 0 ? (unsigned char)(i * 7 + 1) : 0;
        sl_status st =
            r == 0 ? sl_comm_send(c, buf, n, SL_COMM_U8, 1) : sl_comm_recv(c, buf, n, SL_COMM_U8, 0);
        int code;
        if (send_bytes == recv_bytes) {
            int ok = st == SL_OK;
            for (size_t i = 0; ok && r == 1 && i < n; i++) ok = buf[i] == (unsigned char)(i * 7 + 1);
            if (!ok) fprintf(stderr, "FAIL rank %d: %zu bytes: %s\n", r, n, st ? sl_errmsg() : "wrong data");
            code = ok ? 0 : 1;
        } else if (r == 1) {
            char want[128];
            snprintf(want, sizeof want, "rank 0 sent %zu bytes where %zu were expected", send_bytes,
                     recv_bytes);
            int ok = st == SL_ERR_INTERNAL && strstr(sl_errmsg(), want);
            if (!ok)
                fprintf(stderr, "FAIL receiver of %zu of %zu bytes: %s: %s\n", recv_bytes, send_bytes,
                        sl_status_name(st), st ? sl_errmsg() : "(no error)");
            code = ok ? 0 : 1;
        } else {
            code = st != SL_OK ? 0 : 1;
            if (st == SL_OK)
                fprintf(stderr, "FAIL sender of %zu bytes (%zu expected): no error\n", n, recv_bytes);
        }
        free(buf);
        sl_comm_free(c);
        _exit(code);
    }
    int fails = 0;
    for (int r = 0; r < 2; r++) {
        int status = 0;
        if (waitpid(pids[r], &status, 0) != pids[r]) {
            perror("FAIL waitpid");
            fails++;
            continue;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "FAIL rank %d: %s %d\n", r, WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            fails++;
        }
    }
    printf("send %zu, receive %zu: %s\n", send_bytes, recv_bytes, fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}

int main(void) {
    setenv("SUANLI_SHM_PULL_KB", "64", 1);
    int fails = run_case(256 * KB, 256 * KB);
    fails += run_case(64 * KB, 64 * KB);   /* exactly the threshold: pulled on both sides */
    fails += run_case(128 * KB, 256 * KB); /* the receiver expects more than was sent */
    fails += run_case(256 * KB, 128 * KB); /* ... less */
    if (fails) fprintf(stderr, "test_comm_pull_len: %d failures\n", fails);
    return fails ? 1 : 0;
}
