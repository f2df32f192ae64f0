/* No hang, ever: a rank killed (SIGKILL), stopped (SIGSTOP) or aborted in the middle of a stream
 * of all-reduces must make every other rank return an error within the deadline.
 *   test_comm_fault loopback-abort | shm-kill | tcp-kill | shm-stop | tcp-stop | mpi-kill
 *   test_comm_fault hybrid-kill | hybrid-stop   (ranks 0, 1 pretend to share a host, rank 2 is alone:
 *                                                the victim is rank 0's shm peer and rank 2's tcp peer)
 *   test_comm_fault mpi-stop | env-stop   (one rank of a job under mpirun / suanli run)
 * A "-window" suffix (loopback-abort-window, shm-kill-window, shm-stop-window) puts the buffer in
 * sl_comm_mem_alloc memory, so the fault hits the direct window all-reduce (src/comm/algo/sym.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "suanli/comm.h"

#define N_ELEMS (2u << 20) /* 8 MiB of f32 per all-reduce */
#define RUN_SEC 20.0       /* a healthy loop runs this long, far past the fault */
static int g_window;       /* buffers from sl_comm_mem_alloc */

static void sleep_sec(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Loop all-reduces until an error or RUN_SEC; returns the failing status (SL_OK if none), the time it
 * came back (*t_err) and the time the failing call was issued (*t_call). If the loop runs out of time it
 * issues one more call: a host stall longer than RUN_SEC between the fault and the next check (seen once
 * in CI: every thread of the process stood still for ~25 s) must not let a healthy-looking exit hide
 * the fault, since every call after an abort or a peer failure fails at once. */
static sl_status hammer(sl_comm *c, double *t_err, double *t_call) {
    float *x = NULL;
    if (g_window) {
        sl_status st = sl_comm_mem_alloc(c, sizeof(float) * N_ELEMS, (void **)&x);
        if (st != SL_OK) {
            fprintf(stderr, "FAIL sl_comm_mem_alloc: %s\n", sl_errmsg());
            *t_err = *t_call = 0;
            return st;
        }
        if (!sl_comm_mem_is_shared(c, x, sizeof(float) * N_ELEMS))
            fprintf(stderr, "FAIL window memory is not shared on %s\n",
                    sl_comm_transport_name(sl_comm_transport(c)));
    } else {
        x = malloc(sizeof(float) * N_ELEMS);
    }
    for (size_t i = 0; i < N_ELEMS; i++) x[i] = 1.0f;
    double t0 = sl_time_sec();
    sl_status st = SL_OK;
    int more = 1;
    while (more) {
        more = sl_time_sec() - t0 < RUN_SEC;
        *t_call = sl_time_sec();
        st = sl_comm_all_reduce(c, x, x, N_ELEMS, SL_COMM_F32, SL_COMM_MAX);
        if (st != SL_OK) break;
    }
    *t_err = sl_time_sec();
    if (g_window)
        sl_comm_mem_free(c, x);
    else
        free(x);
    return st;
}

/* ---- loopback: one rank's communicator is aborted from another thread mid-collective ---- */
typedef struct {
    sl_comm *c;
    sl_status st;
    double t_err, t_call;
    char msg[256];
} th_arg;
static void *th_main(void *p) {
    th_arg *a = p;
    a->st = hammer(a->c, &a->t_err, &a->t_call);
    snprintf(a->msg, sizeof a->msg, "%s", sl_errmsg());
    return NULL;
}
static int loopback_abort(void) {
    enum { n = 4 };
    sl_comm *comms[n];
    th_arg args[n];
    pthread_t th[n];
    sl_comm_opts o = {.timeout_sec = 30};
    if (sl_comm_init_loopback(n, comms, &o) != SL_OK)
        return fprintf(stderr, "FAIL init: %s\n", sl_errmsg()), 1;
    for (int r = 0; r < n; r++) {
        args[r] = (th_arg){.c = comms[r]};
        pthread_create(&th[r], NULL, th_main, &args[r]);
    }
    sleep_sec(0.5);
    double t_abort = sl_time_sec();
    sl_comm_abort(comms[2]);
    int fails = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        /* prompt: within 5 s of the abort, or of the call itself when it was issued later */
        double dt = args[r].t_err - (args[r].t_call > t_abort ? args[r].t_call : t_abort);
        printf("rank %d: %s after %.3f s: %s\n", r, sl_status_name(args[r].st), dt, args[r].msg);
        if (args[r].st == SL_OK || dt > 5.0)
            fprintf(stderr, "FAIL rank %d did not fail promptly\n", r), fails++;
        if (sl_comm_async_error(comms[r]) == SL_OK)
            fprintf(stderr, "FAIL rank %d: no async error\n", r), fails++;
        sl_comm_free(comms[r]);
    }
    return fails;
}

/* Names the job left in /dev/shm: the shm transport unlinks its segments and windows as soon as every
 * rank has mapped them, so a rank killed after set-up must leave nothing behind (Note [Shared-memory
 * names] in src/base/util.c). The job prefix comes from the token in the unique id ("sl1 addr port
 * token", src/comm/bootstrap.c). */
static int shm_leftovers(const sl_comm_unique_id *id) {
    char addr[128], token[64], pre[64];
    int port;
    if (sscanf(id->bytes, "sl1 %127s %d %63s", addr, &port, token) != 3)
        return fprintf(stderr, "FAIL unique id '%.60s' not in the expected form\n", id->bytes), 1;
    sl_shm_job_prefix(token, pre, sizeof pre);
    size_t pl = strlen(pre);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0; /* no /dev/shm: nothing can be left */
    int left = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (!strncmp(e->d_name, pre, pl) && e->d_name[pl] == '-') {
            fprintf(stderr, "FAIL /dev/shm/%s left behind by the job\n", e->d_name);
            left++;
        }
    closedir(d);
    return left;
}

/* ---- processes: rank 1 is killed or stopped; the others must exit 3 (error seen) promptly ---- */
static void *killer(void *p) {
    sleep_sec(0.5);
    raise(*(int *)p);
    return NULL;
}
static int procs(sl_comm_transport_kind kind, int sig) {
    enum { n = 3 };
    double timeout = sig == SIGSTOP ? 2.0 : 30.0;
    sl_comm_unique_id id;
    if (sl_comm_get_unique_id(&id) != SL_OK) return fprintf(stderr, "FAIL id: %s\n", sl_errmsg()), 1;
    pid_t pids[n];
    for (int r = 0; r < n; r++) {
        if ((pids[r] = fork()) != 0) continue;
        sl_comm_opts o = {.transport = kind, .timeout_sec = timeout};
        if (kind == SL_COMM_TRANSPORT_HYBRID) setenv("SUANLI_COMM_HOSTNAME", r < 2 ? "hostA" : "hostB", 1);
        sl_comm *c;
        if (sl_comm_init_rank(&c, n, &id, r, &o) != SL_OK) {
            fprintf(stderr, "rank %d init: %s\n", r, sl_errmsg());
            _exit(1);
        }
        if (sl_comm_transport(c) != kind) {
            fprintf(stderr, "FAIL rank %d: transport %s\n", r, sl_comm_transport_name(sl_comm_transport(c)));
            _exit(1);
        }
        static int s;
        s = sig;
        pthread_t t;
        if (r == 1) pthread_create(&t, NULL, killer, &s);
        double te, tc;
        sl_status st = hammer(c, &te, &tc);
        printf("rank %d: %s: %s\n", r, sl_status_name(st), st ? sl_errmsg() : "");
        fflush(stdout);
        sl_comm_free(c);
        _exit(st == SL_OK ? 0 : 3);
    }
    int fails = 0, left = n, st_of[n] = {0};
    double t_fault = 0, t_exit[n] = {0};
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WUNTRACED);
        if (p < 0) break;
        int r = p == pids[0] ? 0 : p == pids[1] ? 1 : 2;
        if (WIFSTOPPED(status)) {
            t_fault = sl_time_sec();
            continue;
        }
        left--;
        t_exit[r] = sl_time_sec();
        st_of[r] = status;
        if (r == 1 && !t_fault) t_fault = t_exit[r];
        if (sig == SIGSTOP && t_exit[0] > 0 && t_exit[2] > 0) kill(pids[1], SIGKILL); /* survivors done */
    }
    for (int r = 0; r < n; r += 2) { /* the survivors: ranks 0 and 2 (exit order vs. rank 1 may race) */
        double dt = t_exit[r] - t_fault;
        int ok = WIFEXITED(st_of[r]) && WEXITSTATUS(st_of[r]) == 3 && t_fault > 0 && dt < timeout + 5.0;
        printf("rank %d exited (status 0x%x) %.3f s after the fault\n", r, st_of[r], dt);
        if (!ok) fprintf(stderr, "FAIL rank %d did not report the fault promptly\n", r), fails++;
    }
    if (sig == SIGSTOP) kill(pids[1], SIGKILL);
    while (wait(NULL) > 0) {
    }
    if (kind == SL_COMM_TRANSPORT_SHM || kind == SL_COMM_TRANSPORT_HYBRID) fails += shm_leftovers(&id);
    return fails;
}

/* ---- mpi: run under mpirun; rank 1 dies; mpirun must end the job (non-zero) instead of hanging, and
 * under --enable-recovery (test_comm_fault_mpi-kill-survivors) ranks 0 and 2 must each report the error ----
 */
static int mpi_kill(void) {
    sl_comm *c;
    sl_comm_opts o = {.transport = SL_COMM_TRANSPORT_MPI, .timeout_sec = 5};
    if (sl_comm_init_env(&c, &o) != SL_OK) return fprintf(stderr, "init: %s\n", sl_errmsg()), 1;
    static int s = SIGKILL;
    pthread_t t;
    if (sl_comm_rank(c) == 1) pthread_create(&t, NULL, killer, &s);
    int me = sl_comm_rank(c);
    double t0 = sl_time_sec(), te, tc;
    sl_status st = hammer(c, &te, &tc);
    /* a survivor reports its error at once (flushed: mpirun may tear the job down right after), then
     * lingers like env_stop so that the other survivor reports too, and exits 3 without MPI_Finalize */
    printf("rank %d: %s after %.1f s of all-reduces: %s\n", me, sl_status_name(st), te - t0,
           st ? sl_errmsg() : "");
    fflush(stdout);
    if (st != SL_OK) {
        sleep_sec(3.0);
        _exit(3);
    }
    sl_comm_free(c);
    return 0;
}

/* ---- a job started by mpirun / mpiexec.mpich / suanli run: rank 1 stops itself (SIGSTOP) ----
 * Every other rank must see an error (the deadline) and report it; it then lingers so that the
 * other survivors report theirs before the launcher tears the job down, and exits 3 without
 * MPI_Finalize (which could wait for the stopped peer). The launcher must then end the job. */
static int env_stop(sl_comm_transport_kind kind) {
    const double timeout = 2.0;
    sl_comm *c;
    sl_comm_opts o = {.transport = kind, .timeout_sec = timeout};
    if (sl_comm_init_env(&c, &o) != SL_OK) return fprintf(stderr, "init: %s\n", sl_errmsg()), 1;
    static int s = SIGSTOP;
    pthread_t t;
    int me = sl_comm_rank(c);
    if (me == 1) pthread_create(&t, NULL, killer, &s);
    double t0 = sl_time_sec(), te, tc;
    sl_status st = hammer(c, &te, &tc);
    printf("rank %d: %s after %.1f s of all-reduces (deadline %.0f s): %s\n", me, sl_status_name(st), te - t0,
           timeout, st ? sl_errmsg() : "");
    fflush(stdout);
    sl_comm_free(c);
    if (st != SL_OK) sleep_sec(timeout + 1.0);
    _exit(st == SL_OK ? 0 : 3);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(
            stderr,
            "usage: test_comm_fault "
            "loopback-abort|shm-kill|tcp-kill|shm-stop|tcp-stop|hybrid-kill|hybrid-stop|mpi-kill|mpi-stop|"
            "env-stop\n");
        return 2;
    }
    char m[64];
    snprintf(m, sizeof m, "%s", argv[1]);
    size_t ml = strlen(m);
    if (ml > 7 && !strcmp(m + ml - 7, "-window")) {
        g_window = 1;
        m[ml - 7] = 0;
    }
    int f;
    if (!strcmp(m, "loopback-abort"))
        f = loopback_abort();
    else if (!strcmp(m, "shm-kill"))
        f = procs(SL_COMM_TRANSPORT_SHM, SIGKILL);
    else if (!strcmp(m, "tcp-kill"))
        f = procs(SL_COMM_TRANSPORT_TCP, SIGKILL);
    else if (!strcmp(m, "shm-stop"))
        f = procs(SL_COMM_TRANSPORT_SHM, SIGSTOP);
    else if (!strcmp(m, "tcp-stop"))
        f = procs(SL_COMM_TRANSPORT_TCP, SIGSTOP);
    else if (!strcmp(m, "hybrid-kill"))
        f = procs(SL_COMM_TRANSPORT_HYBRID, SIGKILL);
    else if (!strcmp(m, "hybrid-stop"))
        f = procs(SL_COMM_TRANSPORT_HYBRID, SIGSTOP);
    else if (!strcmp(m, "mpi-kill"))
        return mpi_kill();
    else if (!strcmp(m, "mpi-stop"))
        return env_stop(SL_COMM_TRANSPORT_MPI);
    else if (!strcmp(m, "env-stop"))
        return env_stop(SL_COMM_TRANSPORT_AUTO);
    else
        return fprintf(stderr, "unknown mode %s\n", m), 2;
    printf("%s%s: %s\n", m, g_window ? " (window)" : "", f ? "FAILED" : "ok");
    return f ? 1 : 0;
}
