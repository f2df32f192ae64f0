/* The latency of an OpenMP barrier between 2 threads, sampled once a second: shows whether a VM's cores are
 * near or far from each other right now (docs/BENCHMARKS.md, "Two speeds of this VM's pair of cores").
 *   cc -O2 -fopenmp bench/tools/omp_barrier.c -o /tmp/omp_barrier && /tmp/omp_barrier [SAMPLES]
 * Not part of the build. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 12, n = 200000;
    if (samples < 1) {
        fprintf(stderr, "omp_barrier: SAMPLES must be a positive integer\n");
        return 2;
    }
    for (int r = 0; r < samples; r++) {
        double t0 = now();
#pragma omp parallel num_threads(2)
        for (int i = 0; i < n; i++) {
#pragma omp barrier
        }
        printf("%.0f ns/barrier\n", (now() - t0) / n * 1e9);
        fflush(stdout);
        struct timespec s = {1, 0};
        nanosleep(&s, NULL);
    }
    return 0;
}
