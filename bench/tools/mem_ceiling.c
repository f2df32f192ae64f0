/* Memory ceiling of this host for the comm benchmarks: P processes (process i pinned to CPU i) run
 * the same kernel concurrently for ~2 s on private buffers; prints the total read+written bytes per
 * second (read-for-ownership traffic of ordinary stores is not counted, so memcpy's real traffic is
 * higher).
 *   gcc -O2 -mavx2 -Wall -Wextra bench/tools/mem_ceiling.c -o /tmp/mem_ceiling
 *   /tmp/mem_ceiling MiB PROCS memcpy|ntcopy|ntadd          e.g. /tmp/mem_ceiling 64 2 ntcopy
 * Not part of the build (x86-64 + AVX2 only); docs/BENCHMARKS-comm.md quotes it. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void ntcopy(float *d, const float *s, size_t n) {
    for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(d + i, _mm256_load_ps(s + i));
    _mm_sfence();
}

static void ntadd(float *d, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i += 8)
        _mm256_stream_ps(d + i, _mm256_add_ps(_mm256_load_ps(a + i), _mm256_load_ps(b + i)));
    _mm_sfence();
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: mem_ceiling MiB PROCS memcpy|ntcopy|ntadd\n");
        return 2;
    }
    size_t bytes = (size_t)atoi(argv[1]) << 20, n = bytes / sizeof(float);
    int np = atoi(argv[2]);
    const char *k = argv[3];
    double *res = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (np < 1 || np > 64 || bytes == 0 ||
        (strcmp(k, "memcpy") && strcmp(k, "ntcopy") && strcmp(k, "ntadd"))) {
        fprintf(stderr, "usage: mem_ceiling MiB PROCS memcpy|ntcopy|ntadd   (MiB > 0, 1 <= PROCS <= 64)\n");
        return 2;
    }
    if (res == MAP_FAILED) return perror("mem_ceiling: mmap"), 2;
    double start = now() + 0.3; /* everyone starts together */
    for (int p = 0; p < np; p++) {
        if (fork() != 0) continue;
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(p, &set);
        sched_setaffinity(0, sizeof set, &set);
        float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes), *c = aligned_alloc(64, bytes);
        if (!a || !b || !c) _exit(1);
        memset(a, 1, bytes), memset(b, 1, bytes), memset(c, 1, bytes);
        while (now() < start) {
        }
        double t0 = now(), moved = 0;
        while (now() - t0 < 2.0) {
            if (!strcmp(k, "memcpy")) {
                memcpy(c, a, bytes);
                moved += 2.0 * (double)bytes;
            } else if (!strcmp(k, "ntcopy")) {
                ntcopy(c, a, n);
                moved += 2.0 * (double)bytes;
            } else {
                ntadd(c, a, b, n);
                moved += 3.0 * (double)bytes;
            }
        }
        res[p] = moved / (now() - t0);
        _exit(0);
    }
    while (wait(NULL) > 0) {
    }
    double tot = 0;
    for (int p = 0; p < np; p++) tot += res[p];
    printf("%s %zu MiB x %d procs: %.1f GB/s total (r+w bytes)\n", k, bytes >> 20, np, tot / 1e9);
    return 0;
}
