/* The trainer's thread governor: Note [Threads on a shared machine]. */
#define _GNU_SOURCE /* CPU_COUNT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <dirent.h>
#include <sched.h>
#include <unistd.h>
#endif

#include "suanli/train.h"

/* Note [Threads on a shared machine]
 * On a machine shared with other processes, a team of n threads whose kernels split work evenly runs at the
 * pace of its slowest member: with one core taken by a busy neighbour, the thread that shares that core gets
 * half of it (or loses whole time slices of several ms), every parallel region waits for it at its
 * barrier, and the other threads spin there meanwhile (libgomp spins ~300k iterations before it sleeps).
 * Measured on the 2-core host (issue 20): 2 threads fell to 5.0k tokens/s against 13.0k on 1 thread. The
 * scheduler cannot fix that; fewer threads can. Since no kernel's result depends on the thread count
 * (fixed partitions, fixed summation orders: docs/ARCHITECTURE.md, Kernels), the trainer may change it at
 * any step boundary without changing a single bit of the run. So the governor measures instead of guessing:
 * every `interval` steps it runs a probe of 2 steps at the alternative count (n - 1 while at n, n while
 * below) and switches when the probe's median step time beats the median of the last (up to 8) steps at
 * the current count by more than 3 %. A probe that loses doubles the interval (4 -> 128 steps; x4 and a
 * single probe step when the alternative is over 1.5x slower: on an oversubscribed machine a 2-thread step
 * measured 5.7x a 1-thread one), so on a quiet machine probes cost ~2 slower steps in 128 (< 0.5 % at
 * 1.35x per probe step); a switch resets it
 * to 4, and a step slower than 1.3x the current median (a neighbour arrived, or left while we were at
 * n - 1) brings the next probe forward. An idle OpenMP thread of a smaller team sleeps in the kernel
 * (futex) after libgomp's spin, so at n - 1 the spare thread leaves its core to the neighbour.
 * The probes of more threads are what a long busy spell still costs (each is a step at the losing count:
 * 0.95-0.97x of one thread over 60 steps, issue 20). The machine's load tells when one is worth running: at
 * each step the governor samples the runnable tasks that are not its own threads (procs_running of
 * /proc/stat minus this process's threads in state R; the minimum of the last 3 samples, so a short-lived
 * task does not count). A probe of more threads that lost is not repeated while that load stays at least
 * as high as it was then (the result would be the same), nor after fewer threads won at that load (the same
 * finding); once it falls (all of the last 3 samples below it), the probe runs at once. A probe
 * that wins clears the mark, so a neighbour that does not take our cores (a niced one) costs one probe, and
 * every 4 x 128 steps a held-back probe runs anyway. At the full count on an oversubscribed machine (load +
 * threads > CPUs, at a load no probe has seen yet) the probe of fewer threads comes as soon as one step is
 * timed. The load is only read
 * when this process may run on every online CPU (else it says nothing about our cores); without it the
 * governor probes as above. */
enum { GOV_FIRST = 4, GOV_MAX_INTERVAL = 128, GOV_PROBE = 2, GOV_GATE_MAX = 4 * GOV_MAX_INTERVAL };

int sl_thread_gov_sample_machine(void) {
#ifdef __linux__
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    char line[256];
    long running = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "procs_running %ld", &running) == 1) break;
    fclose(f);
    DIR *d = running >= 0 ? opendir("/proc/self/task") : NULL;
    if (!d) return -1;
    long mine = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *t = fopen(path, "r");
        if (!t) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, t);
        fclose(t);
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* "tid (comm) S ...": comm may hold spaces */
        mine += rp && rp[1] == ' ' && rp[2] == 'R';
    }
    closedir(d);
    return running > mine ? (int)(running - mine) : 0;
#else
    return -1;
#endif
}

/* online CPUs when this process may run on all of them, else 0 (the machine's load says nothing then) */
static int machine_cpus(void) {
#ifdef __linux__
    long on = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (on < 1 || sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != on) return 0;
    return (int)on;
#else
    return 0;
#endif
}

void sl_thread_gov_init(sl_thread_gov *g, int n_max) {
    memset(g, 0, sizeof *g);
    const char *e = getenv("SUANLI_ADAPTIVE_THREADS");
    g->n_max = g->cur = n_max > 0 ? n_max : 1;
    g->on = g->n_max > 1 && !(e && !strcmp(e, "0"));
    g->interval = GOV_FIRST;
    g->next = 3; /* step 0 warms caches and allocations (not timed); two timed steps, then the first probe */
    g->sample = sl_thread_gov_sample_machine;
    g->ncpu = g->n_max > 1 ? machine_cpus() : 0;
    g->ext = g->ext_lost = g->ext_at_probe = -1;
}

static void sample_load(sl_thread_gov *g) {
    int x = g->ncpu > 0 && g->sample ? g->sample() : -1;
    if (x < 0) {
        g->ext = -1;
        g->ext_n = 0;
        return;
    }
    g->ext_ring[g->ext_n++ % 3] = x;
    int n = g->ext_n < 3 ? g->ext_n : 3, lo = g->ext_ring[0], hi = lo;
    for (int i = 1; i < n; i++) {
        if (g->ext_ring[i] < lo) lo = g->ext_ring[i];
        if (g->ext_ring[i] > hi) hi = g->ext_ring[i];
    }
    g->ext = lo;
    g->ext_hi = hi;
}

static double median(const double *x, int n) {
    double s[8];
    memcpy(s, x, sizeof(double) * (size_t)n);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* Bind the team and deal GEMM work in units while the machine is oversubscribed at this count, and undo
 * both when it is not (Note [Binding on a shared machine]). */
static void apply_shared(sl_thread_gov *g, int n) {
    int on = g->ext >= 0 && g->ext + n > g->ncpu;
    if (on != g->shared || n != g->shared_n) sl_threads_shared_mode(n, on);
    g->shared = on;
    g->shared_n = n;
    g->shared_steps += on && n > 1;
}

int sl_thread_gov_begin(sl_thread_gov *g) {
    if (!g->on) { /* a fixed count still binds on a shared machine */
        if (g->ncpu > 0) {
            sample_load(g);
            apply_shared(g, g->cur);
        }
        return g->cur;
    }
    sample_load(g);
    int known = g->ext >= 0;
    if (!g->probe_left && known) {
        if (g->cur == g->n_max && g->ext + g->cur > g->ncpu && g->ext != g->ext_at_probe &&
            g->next > g->steps && g->nhist >= 1)
            g->next = g->steps; /* newly oversubscribed at the full count: probe fewer threads now */
        if (g->cur < g->n_max && g->ext_lost >= 0 && g->ext_hi < g->ext_lost) {
            g->ext_lost = -1; /* the load fell below where more threads lost: try them now */
            if (g->next > g->steps) g->next = g->steps;
        }
    }
    if (!g->probe_left && g->steps >= g->next && g->nhist >= (known && g->ext + g->cur > g->ncpu ? 1 : 2)) {
        int alt = g->cur == g->n_max ? g->n_max - 1 : g->n_max;
        if (alt > g->cur && known && g->ext_lost >= 0 && g->ext_hi >= g->ext_lost &&
            g->steps - g->up_at < GOV_GATE_MAX) {
            g->gated++; /* more threads lost at this load: the same probe would lose again */
            g->next = g->steps + 1;
        } else { /* start a probe */
            g->alt = alt;
            g->probe_left = GOV_PROBE;
            g->nprobe = 0;
            g->probes++;
            g->ext_at_probe = g->ext;
            if (alt > g->cur) g->up_at = g->steps;
        }
    }
    int n = g->probe_left ? g->alt : g->cur;
    sl_threads_set(n);
    apply_shared(g, n);
    return n;
}

void sl_thread_gov_end(sl_thread_gov *g, double sec) {
    if (!g->on) return;
    int64_t step = g->steps++;
    if (step == 0) return; /* warm-up */
    if (g->probe_left) {
        g->probe[g->nprobe++] = sec;
        double mc = median(g->hist, g->nhist);
        if (sec > 1.5 * mc) g->probe_left = 1; /* clearly losing: one probe step is enough */
        if (--g->probe_left) return;
        double mp = median(g->probe, g->nprobe);
        /* more threads lost at this load, or fewer won (the same finding): mark it; more threads won: clear
         */
        if (g->alt > g->cur)
            g->ext_lost = mp < 0.97 * mc ? -1 : g->ext_at_probe;
        else if (mp < 0.97 * mc)
            g->ext_lost = g->ext_at_probe;
        if (mp < 0.97 * mc) { /* switch: the history restarts at the new count */
            g->cur = g->alt;
            g->switches++;
            g->nhist = g->hpos = 0;
            for (int i = 0; i < g->nprobe; i++) g->hist[g->nhist++] = g->probe[i];
            g->hpos = g->nhist % 8;
            g->interval = GOV_FIRST;
        } else if (g->interval < GOV_MAX_INTERVAL) { /* a far slower alternative is retried later still */
            g->interval *= mp > 1.5 * mc ? 4 : 2;
            if (g->interval > GOV_MAX_INTERVAL) g->interval = GOV_MAX_INTERVAL;
        }
        g->alt = 0;
        g->next = g->steps + g->interval;
        sl_threads_set(g->cur);
        return;
    }
    if (g->nhist >= 3 && sec > 1.3 * median(g->hist, g->nhist) && g->next > g->steps + 2)
        g->next = g->steps + 2; /* the machine changed: probe soon */
    g->hist[g->hpos] = sec;
    g->hpos = (g->hpos + 1) % 8;
    if (g->nhist < 8) g->nhist++;
}
