/* Threads on a shared machine: binding the OpenMP team one CPU per thread, the shared-mode flag the GEMM
 * reads, and a thread spawner that keeps new threads off the bound CPUs. Note [Binding on a shared machine].
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "suanli/base.h"
#ifdef __linux__
#include <sched.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* Note [Binding on a shared machine]
 * With a busy neighbour on a 2-CPU machine, three runnable tasks share two CPUs. Left to itself, Linux
 * often puts both of our threads on one CPU and leaves the neighbour alone on the other: a helper woken
 * from its futex is placed near the thread that woke it (wake-affine), and every parallel region then runs
 * at half speed on one CPU. Measured on the 2-core Intel host (GPT-2 qkv GEMM 256 x 2304 x 768, 2 threads,
 * a spinning shell loop beside it): 9.7 ms unbound, 4.9 ms with one thread bound to each CPU, against 4.6 ms
 * for one thread alone. So when the trainer's governor sees the machine oversubscribed (Note [Threads on a
 * shared machine]), it binds thread t of its team to the t-th CPU of the process's affinity mask and turns
 * on the shared mode, in which the GEMM deals its work in several units per thread to whichever thread is
 * free (Note [GEMM units]): the thread that shares its CPU with the neighbour then takes fewer units
 * (4.0 ms above). When the load goes, or the team shrinks to one thread, the mask taken at the first
 * binding is restored on every thread, so a lone thread may run on whichever CPU is free.
 * The user's own binding wins: with OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY set, nothing is bound
 * (the shared mode still applies). Threads started while the team is bound (the checkpoint writer, the
 * communicator's progress thread) are started by sl_thread_spawn with the original mask, not the master's
 * single CPU. No result depends on any of this: kernels' results do not depend on the partition. */
static int g_shared; /* read by the kernels (relaxed) */
#ifdef __linux__
static cpu_set_t g_orig;
static int g_have_orig;
#endif

#if defined(__linux__) && defined(_OPENMP)
static int g_bound_n; /* threads bound now (0: none) */

static int user_binds(void) {
    return getenv("OMP_PROC_BIND") || getenv("OMP_PLACES") || getenv("GOMP_CPU_AFFINITY");
}

/* cpu of the t-th set bit of the original mask, -1 if none */
static int nth_cpu(int t) {
    for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &g_orig) && seen++ == t) return c;
    return -1;
}

static void team_set(int n, int bind) {
#pragma omp parallel num_threads(n)
    {
        cpu_set_t s;
        int t = omp_get_thread_num(), c = nth_cpu(t);
        if (bind && c >= 0) {
            CPU_ZERO(&s);
            CPU_SET(c, &s);
        } else
            s = g_orig;
        pthread_setaffinity_np(pthread_self(), sizeof s, &s);
    }
}
#endif

int sl_threads_shared_mode(int n, int on) {
    __atomic_store_n(&g_shared, on && n > 1, __ATOMIC_RELAXED);
#if defined(__linux__) && defined(_OPENMP)
    if (omp_in_parallel()) return 0;
    int want = on && n > 1 && !user_binds() ? n : 0;
    if (want && !g_have_orig) {
        if (sched_getaffinity(0, sizeof g_orig, &g_orig) != 0) return 0;
        g_have_orig = 1;
    }
    if (want && CPU_COUNT(&g_orig) < want) want = 0; /* fewer CPUs than threads: binding cannot separate */
    if (want == g_bound_n) return g_bound_n > 0;
    if (g_bound_n) team_set(g_bound_n > n ? g_bound_n : n, 0); /* restore the old team (and the master) */
    if (want) team_set(want, 1);
    g_bound_n = want;
    return want > 0;
#else
    (void)n;
    return 0;
#endif
}

int sl_threads_shared(void) { return __atomic_load_n(&g_shared, __ATOMIC_RELAXED); }

int sl_thread_spawn(pthread_t *th, void *(*fn)(void *), void *arg) {
    pthread_attr_t a;
    if (pthread_attr_init(&a) != 0) return pthread_create(th, NULL, fn, arg);
#ifdef __linux__
    if (g_have_orig) pthread_attr_setaffinity_np(&a, sizeof g_orig, &g_orig);
#endif
    int rc = pthread_create(th, &a, fn, arg);
    pthread_attr_destroy(&a);
    return rc;
}
