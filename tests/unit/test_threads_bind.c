/* The shared-machine mode of src/base/threads.c (Note [Binding on a shared machine]):
 * - on with 2 threads: the flag is set and each thread of the team runs on its own single CPU, the two
 *   CPUs different; a thread started meanwhile by sl_thread_spawn keeps the process's whole mask;
 * - off, or on with 1 thread: every thread of the team has the whole mask back, and the flag is clear;
 * - with OMP_PROC_BIND set (the user's binding) nothing is bound, while the flag still follows the mode.
 * Binding needs two CPUs in the process's mask: with one, the test skips (exit 77). */
#define _GNU_SOURCE
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "suanli/base.h"
#include "testutil.h"

/* the CPU of each of the team's 2 threads when it runs on a single one, else -1 (several) */
static void team_cpus(int cpu[2], int count[2]) {
#pragma omp parallel num_threads(2)
    {
        cpu_set_t s;
        int t = omp_get_thread_num();
        sched_getaffinity(0, sizeof s, &s);
        count[t] = CPU_COUNT(&s);
        cpu[t] = -1;
        if (count[t] == 1)
            for (int c = 0; c < CPU_SETSIZE; c++)
                if (CPU_ISSET(c, &s)) cpu[t] = c;
    }
}

static void *spawned_main(void *arg) {
    cpu_set_t s;
    sched_getaffinity(0, sizeof s, &s);
    *(int *)arg = CPU_COUNT(&s);
    return NULL;
}

int main(void) {
    unsetenv("OMP_PROC_BIND");
    unsetenv("OMP_PLACES");
    unsetenv("GOMP_CPU_AFFINITY");
    cpu_set_t all;
    sched_getaffinity(0, sizeof all, &all);
    int ncpu = CPU_COUNT(&all);
    if (ncpu < 2) {
        printf("SKIP: %d CPU in this process's mask, binding needs 2\n", ncpu);
        return 77;
    }
    sl_threads_set(2);
    int cpu[2], count[2];

    TU_CHECK(sl_threads_shared_mode(2, 1) == 1, "2 threads in the shared mode: not bound");
    TU_CHECK(sl_threads_shared() == 1, "shared flag clear in the shared mode");
    team_cpus(cpu, count);
    printf("bound: thread 0 on CPU %d, thread 1 on CPU %d (of %d)\n", cpu[0], cpu[1], ncpu);
    TU_CHECK(count[0] == 1 && count[1] == 1 && cpu[0] >= 0 && cpu[1] >= 0 && cpu[0] != cpu[1],
             "bound team: masks of %d and %d CPUs, CPUs %d and %d", count[0], count[1], cpu[0], cpu[1]);
    pthread_t th;
    int spawned = 0;
    TU_CHECK(sl_thread_spawn(&th, spawned_main, &spawned) == 0, "sl_thread_spawn failed");
    pthread_join(th, NULL);
    TU_CHECK(spawned == ncpu, "a thread spawned while bound runs on %d CPUs, not the process's %d", spawned,
             ncpu);

    TU_CHECK(sl_threads_shared_mode(2, 0) == 0, "mode off: still bound");
    TU_CHECK(sl_threads_shared() == 0, "shared flag set after the mode is off");
    team_cpus(cpu, count);
    TU_CHECK(count[0] == ncpu && count[1] == ncpu, "after the mode: masks of %d and %d CPUs, want %d",
             count[0], count[1], ncpu);

    /* a team of one is never bound, and the mode's flag needs two threads */
    sl_threads_shared_mode(2, 1);
    TU_CHECK(sl_threads_shared_mode(1, 1) == 0 && sl_threads_shared() == 0, "1 thread: bound or flagged");
    team_cpus(cpu, count);
    TU_CHECK(count[0] == ncpu && count[1] == ncpu, "after shrinking to 1: masks of %d and %d CPUs", count[0],
             count[1]);

    /* the user's binding wins */
    setenv("OMP_PROC_BIND", "false", 1);
    TU_CHECK(sl_threads_shared_mode(2, 1) == 0, "OMP_PROC_BIND set: bound anyway");
    TU_CHECK(sl_threads_shared() == 1, "OMP_PROC_BIND set: the shared flag must still follow the mode");
    team_cpus(cpu, count);
    TU_CHECK(count[0] == ncpu && count[1] == ncpu, "OMP_PROC_BIND set: masks of %d and %d CPUs", count[0],
             count[1]);
    sl_threads_shared_mode(2, 0);
    return tu_finish("test_threads_bind");
}
