/* The comm test matrix on one transport.
 *   test_comm_matrix loopback RANKS...   threads as ranks, full matrix incl. forced algorithms
 *   test_comm_matrix shm|tcp RANKS...    forked processes joined by a unique id
 *   test_comm_matrix hosts A,B,... ...  forked, A ranks pretending to be host 0, B host 1, ... (hybrid
 *                                        transport, hierarchical all-reduce, cc_run_hier_check)
 *   test_comm_matrix env [TRANSPORT [ENV]] one rank of a job started by suanli run / mpirun / srun;
 *                                        fails unless it joined over TRANSPORT, detected from ENV
 * Options (before the mode): --large (1Mi+3 elements), --quick (fewer dtype/op pairs), --algos,
 * On several hosts (SUANLI_COMM_HOSTNAME, network namespaces) the env mode also runs cc_run_hier_check.
 * --window (all-reduce, reduce-scatter, all-gather(v) on sl_comm_mem_alloc windows, plus the window
 * checks of cc_run_window_extras instead of the ordinary extras). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "comm_check.h"

static cc_cfg g_cfg;

typedef struct {
    sl_comm *c;
    int fails;
} th_arg;

static void *th_main(void *p) {
    th_arg *a = p;
    a->fails = cc_run_matrix(a->c, &g_cfg);
    a->fails += g_cfg.window ? cc_run_window_extras(a->c) : cc_run_extras(a->c);
    return NULL;
}

static int run_loopback(int n) {
    sl_comm *comms[64];
    th_arg args[64];
    pthread_t th[64];
    if (sl_comm_init_loopback(n, comms, NULL) != SL_OK) {
        fprintf(stderr, "FAIL loopback init: %s\n", sl_errmsg());
        return 1;
    }
    for (int r = 0; r < n; r++) {
        args[r] = (th_arg){comms[r], 0};
        pthread_create(&th[r], NULL, th_main, &args[r]);
    }
    int fails = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        fails += args[r].fails;
        sl_comm_free(comms[r]);
    }
    return fails;
}

static int rank_main(sl_comm *c) {
    int fails = cc_run_matrix(c, &g_cfg);
    fails += cc_run_hier_check(c);
    fails += g_cfg.window ? cc_run_window_extras(c) : cc_run_extras(c);
    return fails;
}

/* host_of: NULL, or the pretend host of each rank (SUANLI_COMM_HOSTNAME set in the child) */
static int run_forked(sl_comm_transport_kind kind, int n, const int *host_of) {
    sl_comm_unique_id id;
    if (sl_comm_get_unique_id(&id) != SL_OK) {
        fprintf(stderr, "FAIL get_unique_id: %s\n", sl_errmsg());
        return 1;
    }
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            sl_comm_opts o = {.transport = kind, .timeout_sec = 60};
            if (host_of) {
                char hn[32];
                snprintf(hn, sizeof hn, "host%d", host_of[r]);
                setenv("SUANLI_COMM_HOSTNAME", hn, 1);
                o.transport = SL_COMM_TRANSPORT_AUTO;
            }
            sl_comm *c;
            if (sl_comm_init_rank(&c, n, &id, r, &o) != SL_OK) {
                fprintf(stderr, "FAIL rank %d init: %s\n", r, sl_errmsg());
                _exit(1);
            }
            if (sl_comm_transport(c) != kind) {
                fprintf(stderr, "FAIL rank %d: transport %s\n", r,
                        sl_comm_transport_name(sl_comm_transport(c)));
                _exit(1);
            }
            /* Note [Ranks sharing a machine]: pretend hosts on this kernel share its CPUs, so the shm wait
             * spins long only when all n ranks have one */
            long cpus = sysconf(_SC_NPROCESSORS_ONLN);
            if (host_of && sl_comm_spin_budget(1) != (n <= cpus ? 4096u : 16u)) {
                fprintf(stderr, "FAIL rank %d: spin budget %u with %d ranks on %ld CPUs\n", r,
                        sl_comm_spin_budget(1), n, cpus);
                _exit(1);
            }
            int f = rank_main(c);
            sl_comm_free(c);
            _exit(f ? 1 : 0);
        }
    }
    int fails = 0;
    for (int k = 0; k < n; k++) {
        int status;
        pid_t p = wait(&status);
        if (p < 0) break;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "FAIL a rank (pid %d) exited with status 0x%x\n", (int)p, status);
            fails++;
        }
    }
    return fails;
}

int main(int argc, char **argv) {
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--large"))
            g_cfg.large = 1;
        else if (!strcmp(argv[i], "--quick"))
            g_cfg.quick = 1;
        else if (!strcmp(argv[i], "--algos"))
            g_cfg.algos = 1;
        else if (!strcmp(argv[i], "--window"))
            g_cfg.window = 1;
        else {
            fprintf(stderr, "unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (i >= argc) {
        fprintf(stderr, "usage: test_comm_matrix [--large] [--quick] [--algos] [--window] loopback|shm|tcp "
                        "RANKS... | hosts A,B,... | env\n");
        return 2;
    }
    const char *mode = argv[i++];
    int fails = 0;
    double t0 = sl_time_sec();
    if (!strcmp(mode, "env")) {
        sl_comm *c;
        sl_comm_env e;
        if (sl_comm_env_detect(&e) != SL_OK) {
            fprintf(stderr, "FAIL env_detect: %s\n", sl_errmsg());
            return 1;
        }
        if (sl_comm_init_env(&c, NULL) != SL_OK) {
            fprintf(stderr, "FAIL init_env: %s\n", sl_errmsg());
            return 1;
        }
        /* env [TRANSPORT [SOURCE]]: also fail unless the job was detected and joined as expected */
        const char *tp = sl_comm_transport_name(sl_comm_transport(c));
        if (i < argc && strcmp(argv[i], tp))
            fprintf(stderr, "FAIL rank %d: transport %s, expected %s\n", sl_comm_rank(c), tp, argv[i]),
                fails++;
        if (i + 1 < argc && strcmp(argv[i + 1], e.source))
            fprintf(stderr, "FAIL rank %d: environment %s, expected %s\n", sl_comm_rank(c), e.source,
                    argv[i + 1]),
                fails++;
        fails += rank_main(c);
        printf("rank %d/%d transport %s: %s (%.1f s; environment: %s)\n", sl_comm_rank(c), sl_comm_size(c),
               sl_comm_transport_name(sl_comm_transport(c)), fails ? "FAILED" : "ok", sl_time_sec() - t0,
               e.source);
        sl_comm_free(c);
        return fails ? 1 : 0;
    }
    for (; i < argc; i++) {
        int n = atoi(argv[i]);
        double t1 = sl_time_sec();
        int f;
        if (!strcmp(mode, "loopback"))
            f = run_loopback(n);
        else if (!strcmp(mode, "shm"))
            f = run_forked(SL_COMM_TRANSPORT_SHM, n, NULL);
        else if (!strcmp(mode, "tcp"))
            f = run_forked(SL_COMM_TRANSPORT_TCP, n, NULL);
        else if (!strcmp(mode, "hosts")) { /* A,B,...: A ranks on pretend host 0, B on host 1, ... */
            int host_of[64], nr = 0, h = 0, many = 0;
            for (const char *p = argv[i]; *p && nr < 64; h++) {
                int k = atoi(p);
                many |= k > 1;
                for (int j = 0; j < k && nr < 64; j++) host_of[nr++] = h;
                p = strchr(p, ',');
                if (!p) break;
                p++;
            }
            f = run_forked(h > 0 && many ? SL_COMM_TRANSPORT_HYBRID : SL_COMM_TRANSPORT_TCP, nr, host_of);
            n = nr;
        } else {
            fprintf(stderr, "unknown mode %s\n", mode);
            return 2;
        }
        printf("%s n=%d: %s (%.1f s)\n", mode, n, f ? "FAILED" : "ok", sl_time_sec() - t1);
        fflush(stdout);
        fails += f;
    }
    printf("%s: %d failure(s) in %.1f s\n", mode, fails, sl_time_sec() - t0);
    return fails ? 1 : 0;
}
