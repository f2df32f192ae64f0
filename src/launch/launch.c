/* See launch.h.
 *
 * Note [Launcher event loop]
 * One thread: poll() over every child's stdout/stderr pipe with a 50 ms timeout; after each wake
 * we reap children with waitpid(WNOHANG) and look at the signal flag set by our handlers. Each
 * child runs in its own process group so that signals reach its whole subtree (sh -c, wrappers).
 * The first non-zero exit (or death by signal) starts the teardown: after a short settle time (0.5 s, so
 * ranks failing for the same reason, e.g. a bad flag every rank checks, still print their own error),
 * SIGTERM to every other group, SIGKILL to whatever is left after the grace period. Output is flushed line by
 * line, each line written with one write() so lines from different ranks never interleave mid-line. */
#define _GNU_SOURCE
#include "launch/launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_sig, g_nsig; /* the last signal, how many arrived */
static void on_signal(int s) {
    g_sig = s;
    g_nsig++;
}

/* "0-3,8,10-11" -> set; 0 when malformed or empty */
static int parse_cpu_list(const char *s, cpu_set_t *set) {
    CPU_ZERO(set);
    int any = 0;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s || a < 0 || a >= CPU_SETSIZE) return 0;
        s = end;
        if (*s == '-') {
            b = strtol(s + 1, &end, 10);
            if (end == s + 1 || b < a || b >= CPU_SETSIZE) return 0;
            s = end;
        }
        for (long c = a; c <= b; c++) CPU_SET((int)c, set);
        any = 1;
        if (*s == ',')
            s++;
        else if (*s)
            return 0;
    }
    return any;
}

typedef struct child {
    pid_t pid;
    int rank;
    int fd[2]; /* stdout, stderr pipes (read ends), -1 at EOF */
    char *buf[2];
    size_t len[2];
    int exited, status;
} child;

#define LINE_MAX_BUF (64 * 1024)

static void emit(int out, int rank, int prefix, const char *s, size_t n, int add_nl) {
    char pre[32];
    int pl = prefix ? snprintf(pre, sizeof pre, "[%d] ", rank) : 0;
    size_t tot = (size_t)pl + n + (size_t)add_nl;
    char *line = malloc(tot);
    if (!line) return;
    memcpy(line, pre, (size_t)pl);
    memcpy(line + pl, s, n);
    if (add_nl) line[tot - 1] = '\n';
    size_t off = 0;
    while (off < tot) {
        ssize_t k = write(out, line + off, tot - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (size_t)k;
    }
    free(line);
}

static void drain(child *c, int which, int prefix, int eof) {
    char *b = c->buf[which];
    size_t start = 0;
    for (size_t i = 0; i < c->len[which]; i++)
        if (b[i] == '\n') {
            emit(which ? 2 : 1, c->rank, prefix, b + start, i - start + 1, 0);
            start = i + 1;
        }
    if ((eof || c->len[which] - start >= LINE_MAX_BUF / 2) && c->len[which] > start) {
        emit(which ? 2 : 1, c->rank, prefix, b + start, c->len[which] - start, 1);
        start = c->len[which];
    }
    memmove(b, b + start, c->len[which] - start);
    c->len[which] -= start;
}

/* "SIGKILL" for 9: the name users grep logs and man pages for (strsignal gives "Killed"); strsignal's text
 * for the rest */
static const char *sig_name(int s) {
    static const struct {
        int sig;
        const char *name;
    } names[] = {{SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
                 {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
                 {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
                 {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
                 {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == s) return names[i].name;
    return strsignal(s);
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void kill_all(child *cs, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (cs[i].pid > 0 && !cs[i].exited) kill(-cs[i].pid, sig);
}

static void setenv_int(const char *k, int v) {
    char s[32];
    snprintf(s, sizeof s, "%d", v);
    setenv(k, s, 1);
}

/* One attempt of the local group. */
static sl_status run_once(const sl_launch_opts *o, const char *addr, int port, const char *token, int attempt,
                          sl_launch_result *res) {
    int n = o->nproc, world = o->nproc * o->nnodes;
    child *cs = calloc((size_t)n, sizeof *cs);
    if (!cs) return sl_fail(SL_ERR_NOMEM, "launcher: out of memory");
    sl_status st = SL_OK;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++) {
        child *c = &cs[i];
        c->rank = o->node_rank * o->nproc + i;
        c->fd[0] = c->fd[1] = -1;
        int po[2], pe[2];
        c->buf[0] = malloc(LINE_MAX_BUF);
        c->buf[1] = malloc(LINE_MAX_BUF);
        if (!c->buf[0] || !c->buf[1] || pipe2(po, O_CLOEXEC) != 0) {
            st = sl_fail(SL_ERR_IO, "launcher: cannot create pipes: %s", strerror(errno));
            break;
        }
        if (pipe2(pe, O_CLOEXEC) != 0) {
            close(po[0]), close(po[1]);
            st = sl_fail(SL_ERR_IO, "launcher: cannot create pipes: %s", strerror(errno));
            break;
        }
        pid_t launcher = getpid(), pid = fork();
        if (pid < 0) {
            st = sl_fail(SL_ERR_IO, "launcher: fork failed: %s", strerror(errno));
            close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
            break;
        }
        if (pid == 0) {
            setpgid(0, 0);
            /* a launcher killed with SIGKILL (or OOM) cannot stop its ranks: the kernel does. Only the rank
             * process itself: children of a wrapper (sh -c '...') outlive it */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != launcher) _exit(128 + SIGKILL); /* it died before the prctl */
            /* Pin local rank i to its own block of CPUs (allowed / n each, so OpenMP threads of a
             * rank stay usable): shared-memory waits spin briefly, and two spinning ranks that the
             * kernel happens to put on one core cost ~100x in latency. n == 1: no pinning. */
            cpu_set_t allowed, mine;
            if (o->cpu_lists && o->cpu_lists[i]) {
                if (parse_cpu_list(o->cpu_lists[i], &mine)) sched_setaffinity(0, sizeof mine, &mine);
                setenv("OMP_PROC_BIND", "close", 0);
                setenv("OMP_PLACES", "cores", 0);
            } else if (o->bind && n > 1 && sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
                       CPU_COUNT(&allowed) >= n) {
                int per = CPU_COUNT(&allowed) / n;
                CPU_ZERO(&mine);
                for (int cpu = 0, k = 0; cpu < CPU_SETSIZE; cpu++)
                    if (CPU_ISSET(cpu, &allowed)) {
                        if (k >= i * per && k < (i + 1) * per) CPU_SET(cpu, &mine);
                        k++;
                    }
                sched_setaffinity(0, sizeof mine, &mine);
            }
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGHUP, SIG_DFL);
            dup2(po[1], 1);
            dup2(pe[1], 2);
            setenv_int("RANK", c->rank);
            setenv_int("WORLD_SIZE", world);
            setenv_int("LOCAL_RANK", i);
            setenv_int("LOCAL_WORLD_SIZE", n);
            setenv_int("GROUP_RANK", o->node_rank);
            setenv_int("NODE_RANK", o->node_rank);
            setenv_int("SUANLI_RESTART_COUNT", attempt);
            if (o->hosts > 0 || !getenv("SUANLI_HOSTS"))
                setenv_int("SUANLI_HOSTS", o->hosts > 0 ? o->hosts : world);
            setenv("MASTER_ADDR", addr, 1);
            setenv_int("MASTER_PORT", port);
            setenv("SUANLI_JOB_TOKEN", token, 1);
            execvp(o->argv[0], o->argv);
            fprintf(stderr, "suanli run: cannot execute %s: %s\n", o->argv[0], strerror(errno));
            _exit(127);
        }
        setpgid(pid, pid);
        c->pid = pid;
        close(po[1]);
        close(pe[1]);
        c->fd[0] = po[0];
        c->fd[1] = pe[0];
    }
    int started = 0;
    for (int i = 0; i < n; i++) started += cs[i].pid > 0;
    if (st != SL_OK) kill_all(cs, n, SIGKILL);
    struct pollfd *pf = calloc(2 * (size_t)n, sizeof *pf);
    int *owner = calloc(2 * (size_t)n, sizeof(int));
    int running = started, teardown = st != SL_OK, fwd = 0, fwd_n = 0;
    int signalled = 0, all_restart = 1;                         /* Note [Exit 75 asks for a restart] */
    double kill_at = teardown ? sl_time_sec() : 0, term_at = 0; /* term_at: pending SIGTERM (0: none) */
    while (pf && owner && (running > 0 || 1)) {
        int np = 0;
        for (int i = 0; i < n; i++)
            for (int w = 0; w < 2; w++)
                if (cs[i].fd[w] >= 0) {
                    pf[np] = (struct pollfd){cs[i].fd[w], POLLIN, 0};
                    owner[np++] = i * 2 + w;
                }
        if (np == 0 && running == 0) break;
        int rc = poll(pf, (nfds_t)np, 50);
        for (int k = 0; rc > 0 && k < np; k++) {
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            child *c = &cs[owner[k] / 2];
            int w = owner[k] % 2;
            ssize_t got = read(c->fd[w], c->buf[w] + c->len[w], LINE_MAX_BUF - c->len[w]);
            if (got > 0) {
                c->len[w] += (size_t)got;
                drain(c, w, o->prefix, 0);
            } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
                drain(c, w, o->prefix, 1);
                close(c->fd[w]);
                c->fd[w] = -1;
            }
        }
        for (;;) {
            int status;
            pid_t p = waitpid(-1, &status, WNOHANG);
            if (p <= 0) break;
            for (int i = 0; i < n; i++) {
                if (cs[i].pid != p || cs[i].exited) continue;
                cs[i].exited = 1;
                cs[i].status = status;
                running--;
                int bad = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
                if (bad && !signalled &&
                    !(WIFEXITED(status) && WEXITSTATUS(status) == SL_LAUNCH_EXIT_RESTART))
                    all_restart = 0;
                if (bad && res->failed_rank < 0 && !fwd) {
                    res->failed_rank = cs[i].rank;
                    res->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
                    res->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
                }
                if (bad && !teardown) {
                    double settle = o->grace_sec < 0.5 ? o->grace_sec : 0.5;
                    teardown = 1;
                    term_at = sl_time_sec() + settle;
                    kill_at = term_at + o->grace_sec;
                }
            }
        }
        if (g_sig && !fwd) {
            fwd = g_sig;
            fwd_n = g_nsig;
            res->interrupted = fwd;
            kill_all(cs, n, fwd);
            signalled = 1;
            if (!teardown) {
                teardown = 1;
                kill_at = sl_time_sec() + o->grace_sec;
            }
        } else if (fwd && g_nsig != fwd_n && running > 0) { /* a second Ctrl-C: no more grace */
            fwd_n = g_nsig;
            kill_all(cs, n, SIGKILL);
            kill_at = sl_time_sec() + 1e9;
        }
        if (term_at > 0 && !fwd && sl_time_sec() >= term_at) {
            kill_all(cs, n, SIGTERM);
            signalled = 1;
            term_at = 0;
        }
        if (teardown && running > 0 && sl_time_sec() > kill_at) {
            signalled = 1;
            kill_all(cs, n, SIGKILL);
            kill_at = sl_time_sec() + 1e9;
        }
        if (running == 0) { /* grandchildren may hold the pipes open: stop reading soon */
            static const double linger = 2.0;
            double now = sl_time_sec();
            if (!kill_at || kill_at > now + linger) kill_at = now + linger;
            if (now > kill_at) {
                for (int i = 0; i < n; i++)
                    for (int w = 0; w < 2; w++)
                        if (cs[i].fd[w] >= 0) {
                            drain(&cs[i], w, o->prefix, 1);
                            close(cs[i].fd[w]);
                            cs[i].fd[w] = -1;
                        }
            }
        }
    }
    res->requeue = st == SL_OK && res->failed_rank >= 0 && all_restart && !res->interrupted;
    if (st == SL_OK && res->failed_rank >= 0) {
        if (res->signal)
            st = sl_fail(SL_ERR_PEER, "rank %d was killed by signal %d (%s%s)", res->failed_rank, res->signal,
                         sig_name(res->signal),
                         res->signal == SIGKILL ? ": kill -9 or the out-of-memory killer, see dmesg" : "");
        else if (res->exit_code == 127)
            st = sl_fail(SL_ERR_PEER, "rank %d exited with status 127 (could not execute %s?)",
                         res->failed_rank, o->argv[0]);
        else
            st = sl_fail(SL_ERR_PEER, "rank %d exited with status %d", res->failed_rank, res->exit_code);
    } else if (st == SL_OK && res->interrupted) {
        st = sl_fail(SL_ERR_ABORTED, "interrupted by signal %d (%s); forwarded to all ranks",
                     res->interrupted, sig_name(res->interrupted));
    }
    for (int i = 0; i < n; i++) {
        for (int w = 0; w < 2; w++)
            if (cs[i].fd[w] >= 0) close(cs[i].fd[w]);
        free(cs[i].buf[0]);
        free(cs[i].buf[1]);
    }
    free(pf);
    free(owner);
    free(cs);
    return st;
}

sl_status sl_launch_check_program(const char *prog, int *shell_code) {
    struct stat sb;
    *shell_code = 127;
    if (!prog || !*prog) return sl_fail(SL_ERR_INVALID, "cannot execute '': empty program name");
    if (strchr(prog, '/')) {
        if (stat(prog, &sb) != 0) {
            if (errno != ENOENT && errno != ENOTDIR) *shell_code = 126;
            return sl_fail(SL_ERR_INVALID, "cannot execute %s: %s", prog, strerror(errno));
        }
        *shell_code = 126;
        if (S_ISDIR(sb.st_mode)) return sl_fail(SL_ERR_INVALID, "cannot execute %s: is a directory", prog);
        if (access(prog, X_OK) != 0)
            return sl_fail(SL_ERR_INVALID, "cannot execute %s: %s", prog, strerror(errno));
        *shell_code = 0;
        return SL_OK;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/bin:/usr/bin"; /* execvp's default */
    int denied = 0;
    while (1) {
        const char *e = strchr(path, ':');
        size_t n = e ? (size_t)(e - path) : strlen(path);
        char cand[4096];
        if (snprintf(cand, sizeof cand, "%.*s/%s", n ? (int)n : 1, n ? path : ".", prog) < (int)sizeof cand &&
            stat(cand, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
            if (access(cand, X_OK) == 0) {
                *shell_code = 0;
                return SL_OK;
            }
            denied = 1;
        }
        if (!e) break;
        path = e + 1;
    }
    if (denied) {
        *shell_code = 126;
        return sl_fail(SL_ERR_INVALID, "cannot execute %s: found in PATH but not executable", prog);
    }
    return sl_fail(SL_ERR_INVALID, "cannot execute %s: not found in PATH", prog);
}

/* Remove the in-memory checkpoint directories of launchers that died without cleaning up (SIGKILL).
 * A live launcher holds an flock on <dir>/.owner (released by the kernel when it dies, and valid across
 * pid namespaces sharing /dev/shm); a directory without that file is judged by its pid. */
static void sweep_dead_memdirs(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid = 0, used = 0;
        if (sscanf(e->d_name, "suanli-ckpt-%d%n", &pid, &used) != 1 || e->d_name[used] || pid <= 0) continue;
        char path[320];
        snprintf(path, sizeof path, "/dev/shm/%s/.owner", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC), dead;
        if (fd >= 0) {
            dead = flock(fd, LOCK_EX | LOCK_NB) == 0;
            close(fd);
        } else {
            dead = kill(pid, 0) != 0 && errno == ESRCH;
        }
        if (!dead) continue;
        snprintf(path, sizeof path, "rm -rf '/dev/shm/%s'", e->d_name);
        if (system(path) == 0) SL_LOGI("suanli run: removed /dev/shm/%s (its launcher is gone)", e->d_name);
    }
    closedir(d);
}

sl_status sl_launch_run(const sl_launch_opts *o, sl_launch_result *res) {
    memset(res, 0, sizeof *res);
    res->failed_rank = -1;
    res->exit_code = -1;
    if (o->nproc < 1 || o->nnodes < 1 || o->node_rank < 0 || o->node_rank >= o->nnodes || !o->argv ||
        !o->argv[0] || o->hosts < 0 || o->hosts > o->nproc * o->nnodes)
        return sl_fail(SL_ERR_INVALID, "launcher: bad options");
    /* Before anything starts: the launcher holds two pipes per local rank (and a few files of its own);
     * past RLIMIT_NOFILE pipe2 fails halfway through the spawn. Raise the soft limit when the hard one
     * allows it, else refuse. */
    struct rlimit nofile;
    rlim_t need = 2 * (rlim_t)o->nproc + 64;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY &&
        nofile.rlim_cur < need) {
        struct rlimit up = nofile;
        up.rlim_cur = nofile.rlim_max == RLIM_INFINITY || nofile.rlim_max >= need ? need : nofile.rlim_max;
        if (up.rlim_cur < need || setrlimit(RLIMIT_NOFILE, &up) != 0)
            return sl_fail(
                SL_ERR_INVALID,
                "-n %d: the launcher needs %llu open files, the limit is %llu (ulimit -n; hard limit "
                "%llu)",
                o->nproc, (unsigned long long)need, (unsigned long long)nofile.rlim_cur,
                (unsigned long long)nofile.rlim_max);
    }
    char addr[256], token[80];
    int port = o->master_port;
    snprintf(addr, sizeof addr, "%s", o->master_addr[0] ? o->master_addr : "127.0.0.1");
    if (!port) {
        if (o->nnodes > 1) return sl_fail(SL_ERR_INVALID, "--master HOST:PORT is required with --nnodes > 1");
        port = free_port();
        if (!port) return sl_fail(SL_ERR_IO, "launcher: cannot find a free TCP port");
    }
    const char *et = getenv("SUANLI_JOB_TOKEN");
    if (et && *et)
        snprintf(token, sizeof token, "%.70s", et);
    else if (o->nnodes > 1)
        snprintf(token, sizeof token, "m-%.40s-%d", addr, port); /* same on every node */
    else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(token, sizeof token, "%08x%08lx%05d", (unsigned)getpid(), (unsigned long)ts.tv_nsec, port);
    }
    /* Note [In-memory checkpoint copy]
     * The launcher owns a tmpfs directory for the job; ranks mirror each committed checkpoint into it
     * (SUANLI_MEM_CKPT_DIR), so a restarted attempt reloads from memory instead of disk. It outlives the
     * ranks (that is the point) and is removed when the launcher finishes. */
    char memdir[128] = "";
    int owner_fd = -1;
    if (!getenv("SUANLI_MEM_CKPT_DIR") && access("/dev/shm", W_OK) == 0) {
        sweep_dead_memdirs();
        snprintf(memdir, sizeof memdir, "/dev/shm/suanli-ckpt-%d", (int)getpid());
        if (mkdir(memdir, 0700) == 0) {
            /* .owner appears already locked (locked under a temporary name, then renamed: the lock is
             * on the inode), so a sweeper never finds it unlocked while we live */
            char tmp[160], lk[160];
            snprintf(tmp, sizeof tmp, "%s/.owner.tmp", memdir);
            snprintf(lk, sizeof lk, "%s/.owner", memdir);
            owner_fd = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
            if (owner_fd >= 0 && (flock(owner_fd, LOCK_EX) != 0 || rename(tmp, lk) != 0)) {
                close(owner_fd);
                owner_fd = -1;
            }
            setenv("SUANLI_MEM_CKPT_DIR", memdir, 1);
        } else {
            memdir[0] = 0;
        }
    }
    struct sigaction sa = {0}, old[3];
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
    sigaction(SIGHUP, &sa, &old[2]);
    g_sig = g_nsig = 0;
    sl_status st;
    /* Note [No restart after bad input]
     * torchrun restarts after any failure, but a rank that exits 2 (suanli's code for bad input or usage:
     * an unknown flag, a malformed config or environment variable) fails the same way on every attempt,
     * so --max-restarts would only repeat the error K times. The first failed rank's exit status decides:
     * 2 ends the job at once, and so do 126 and 127 (the shell's "cannot execute" / "not found": the program,
     * or one a wrapper script runs, is missing; `suanli run` checks the program itself before starting any
     * rank, sl_launch_check_program); a signal or any other status restarts as before. */
    for (int attempt = 0;; attempt++) {
        sl_launch_result r1;
        memset(&r1, 0, sizeof r1);
        r1.failed_rank = -1;
        r1.exit_code = -1;
        st = run_once(o, addr, port, token, attempt, &r1);
        /* every local rank is gone: remove segments a killed rank could not unlink (Note [Shared-memory
         * names]) */
        int swept = sl_shm_sweep_job(token);
        if (swept) SL_LOGI("suanli run: removed %d shared-memory segment(s) left by dead ranks", swept);
        r1.restarts = attempt;
        if (g_sig && !r1.interrupted) r1.interrupted = g_sig; /* came after the attempt ended */
        *res = r1;
        if (st == SL_OK || st == SL_ERR_ABORTED || g_sig) break;
        if (attempt >= o->max_restarts) {
            /* Note [Exit 75 asks for a restart]
             * A rank exits 75 (EX_TEMPFAIL; suanli train after SIGUSR1: a checkpoint of this step is
             * committed, Note [SIGUSR1: checkpoint and exit for requeue]) to be run again. --max-restarts
             * does that here; once its budget is spent (0 by default), the launcher exits 75 itself when
             * every rank that failed on its own (before the launcher signalled any) asked for it, so that an
             * outer supervisor (Slurm's requeue, systemd, a wrapper loop) requeues the job. A rank that
             * failed otherwise makes it exit 1 as before. */
            if (r1.requeue)
                st = sl_fail(st, "%s (a restart was asked for%s: exit %d for the supervisor to requeue)",
                             sl_errmsg(), o->max_restarts > 0 ? " and --max-restarts is used up" : "",
                             SL_LAUNCH_EXIT_RESTART);
            else if (o->max_restarts > 0)
                st = sl_fail(st, "%s (gave up: --max-restarts %d used up)", sl_errmsg(), o->max_restarts);
            break;
        }
        if (st == SL_ERR_PEER && !r1.signal && r1.exit_code == 2) { /* Note [No restart after bad input] */
            st = sl_fail(SL_ERR_PEER, "%s (bad input or usage: not restarting, it would fail the same way)",
                         sl_errmsg());
            break;
        }
        if (st == SL_ERR_PEER && !r1.signal && (r1.exit_code == 126 || r1.exit_code == 127)) {
            st = sl_fail(SL_ERR_PEER,
                         "%s (a program could not be run: not restarting, it would fail the same way)",
                         sl_errmsg());
            break;
        }
        SL_LOGW("suanli run: %s; restarting (%d of %d)", sl_errmsg(), attempt + 1, o->max_restarts);
        if (o->nnodes == 1 && !o->master_port) port = free_port();
    }
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
    sigaction(SIGHUP, &old[2], NULL);
    if (owner_fd >= 0) close(owner_fd);
    if (memdir[0]) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", memdir);
        if (system(cmd) != 0) SL_LOGW("suanli run: could not remove %s", memdir);
        unsetenv("SUANLI_MEM_CKPT_DIR");
    }
    return st;
}
