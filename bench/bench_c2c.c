/* See bench_c2c.h. */
#define _GNU_SOURCE
#include "bench_c2c.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/flags.h"
#include "suanli/base.h"

typedef struct {
    _Alignas(64) volatile long flag; /* odd: the pinger's turn is over; even: the ponger's */
    char pad[64 - sizeof(long)];
    long iters;
    int cpu;
    int failed; /* the ponger could not be placed: the pinger stops waiting */
} c2c_line;

static int pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *ponger(void *arg) {
    c2c_line *l = arg;
    if (pin(l->cpu) != 0) {
        __atomic_store_n(&l->failed, 1, __ATOMIC_RELEASE);
        return (void *)1;
    }
    for (long i = 0; i < l->iters; i++) {
        while (__atomic_load_n(&l->flag, __ATOMIC_ACQUIRE) != 2 * i + 1) {
        }
        __atomic_store_n(&l->flag, 2 * i + 2, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* ns per round trip between cpus a and b (< 0: a thread could not be placed) */
static double round_trip(int a, int b, long iters) {
    c2c_line l = {.flag = 0, .iters = iters, .cpu = b};
    pthread_t th;
    cpu_set_t old;
    if (sched_getaffinity(0, sizeof old, &old) != 0 || pin(a) != 0) return -1;
    if (pthread_create(&th, NULL, ponger, &l) != 0) return -1;
    double t0 = sl_time_sec();
    for (long i = 0; i < iters; i++) {
        __atomic_store_n(&l.flag, 2 * i + 1, __ATOMIC_RELEASE);
        while (__atomic_load_n(&l.flag, __ATOMIC_ACQUIRE) != 2 * i + 2 &&
               !__atomic_load_n(&l.failed, __ATOMIC_ACQUIRE)) {
        }
        if (__atomic_load_n(&l.failed, __ATOMIC_ACQUIRE)) break;
    }
    double t = sl_time_sec() - t0;
    void *rc = NULL;
    pthread_join(th, &rc);
    pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    return rc ? -1 : t / (double)iters * 1e9;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int sl_bench_c2c(int argc, char **argv) {
    int json = 0;
    int64_t iters = 200000, reps = 3;
    const char *cpus = NULL;
    sl_flag flags[] = {
        {"json", SL_FLAG_BOOL, &json, 0, 1, "machine-readable output", 0},
        {"iters", SL_FLAG_INT, &iters, 1000, 1e9, "round trips per repetition (200000)", 0},
        {"reps", SL_FLAG_INT, &reps, 1, 101, "repetitions; the median is reported (3)", 0},
        {"cpus", SL_FLAG_STR, &cpus, 0, 0, "A,B: the two CPUs (default: the first two this process may use)",
         0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    if (sl_flags_help(flags, nf, argc, argv, "usage: suanli bench c2c [flags]")) return 0;
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli bench c2c: %s\n", sl_errmsg());
        return 2;
    }
    int a = -1, b = -1;
    if (cpus) {
        char tail;
        if (sscanf(cpus, "%d,%d%c", &a, &b, &tail) != 2 || a < 0 || b < 0 || a == b || a >= CPU_SETSIZE ||
            b >= CPU_SETSIZE) {
            fprintf(stderr, "suanli bench c2c: --cpus '%s': expected two different CPU numbers A,B\n", cpus);
            return 2;
        }
    } else {
        cpu_set_t s;
        if (sched_getaffinity(0, sizeof s, &s) == 0)
            for (int c = 0; c < CPU_SETSIZE && b < 0; c++)
                if (CPU_ISSET(c, &s)) *(a < 0 ? &a : &b) = c;
        if (b < 0) {
            fprintf(stderr, "suanli bench c2c: this process may run on fewer than two CPUs\n");
            return 2;
        }
    }
    double v[101];
    for (int r = 0; r < (int)reps; r++) {
        v[r] = round_trip(a, b, (long)iters);
        if (v[r] < 0) {
            fprintf(stderr, "suanli bench c2c: --cpus %d,%d: cannot run a thread on each\n", a, b);
            return 2;
        }
    }
    qsort(v, (size_t)reps, sizeof v[0], cmp_d);
    double med = v[reps / 2];
    if (json)
        printf(
            "{\"bench\": \"c2c\", \"cpu_a\": %d, \"cpu_b\": %d, \"round_trip_ns\": %.1f, \"min_ns\": %.1f, "
            "\"max_ns\": %.1f, \"iters\": %lld, \"reps\": %lld}\n",
            a, b, med, v[0], v[reps - 1], (long long)iters, (long long)reps);
    else
        printf("core-to-core round trip, CPUs %d and %d: %.1f ns (median of %lld; %.1f .. %.1f)\n", a, b, med,
               (long long)reps, v[0], v[reps - 1]);
    return 0;
}
