/* The trainer's thread governor: Note [Threads on a shared machine]. */
#include <stdlib.h>
#include <string.h>

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
 * SUANLI_ADAPTIVE_THREADS=0 keeps the configured count. */
enum { GOV_FIRST = 4, GOV_MAX_INTERVAL = 128, GOV_PROBE = 2 };

void sl_thread_gov_init(sl_thread_gov *g, int n_max) {
    memset(g, 0, sizeof *g);
    const char *e = getenv("SUANLI_ADAPTIVE_THREADS");
    g->n_max = g->cur = n_max > 0 ? n_max : 1;
    g->on = g->n_max > 1 && !(e && !strcmp(e, "0"));
    g->interval = GOV_FIRST;
    g->next = 3; /* step 0 warms caches and allocations (not timed); two timed steps, then the first probe */
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

int sl_thread_gov_begin(sl_thread_gov *g) {
    if (!g->on) return g->cur;
    if (!g->probe_left && g->steps >= g->next && g->nhist >= 2) { /* start a probe */
        g->alt = g->cur == g->n_max ? g->n_max - 1 : g->n_max;
        g->probe_left = GOV_PROBE;
        g->nprobe = 0;
        g->probes++;
    }
    int n = g->probe_left ? g->alt : g->cur;
    sl_threads_set(n);
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
