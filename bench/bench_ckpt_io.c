/* See bench_ckpt_io.h. */
#define _GNU_SOURCE
#include "bench_ckpt_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/pool_internal.h"
#include "cli/flags.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int sl_bench_ckpt_io(int argc, char **argv) {
    int json = 0;
    int64_t reps64 = 5, mib64 = 512;
    const char *dir = "/tmp";
    sl_flag flags[] = {
        {"json", SL_FLAG_BOOL, &json, 0, 1, "machine-readable output", 0},
        {"mib", SL_FLAG_INT, &mib64, 1, 65536, "MiB per file (512)", 0}, /* (size_t)mib << 20 must not wrap */
        {"reps", SL_FLAG_INT, &reps64, 1, 100, "repetitions; the median is reported (5)", 0},
        {"dir", SL_FLAG_STR, &dir, 0, 0, "directory the files are written in (/tmp)", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    if (sl_flags_help(flags, nf, argc, argv, "usage: suanli bench ckpt-io [flags]")) return 0;
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli bench ckpt-io: %s\n", sl_errmsg());
        return 2;
    }
    int reps = (int)reps64;
    long mib = (long)mib64;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "suanli bench ckpt-io: --dir %s: not a directory\n", dir);
        return 2;
    }
    size_t hlen = 4096, dlen = ((size_t)mib << 20) + 1000; /* a partial last block, like a real shard */
    char *hdr = sl_malloc_aligned_to(hlen, 4096), *data = sl_malloc_aligned_to(dlen, 4096), path[4200];
    if (!hdr || !data) {
        fprintf(stderr, "suanli bench ckpt-io: out of memory\n");
        return 1;
    }
    memset(hdr, ' ', hlen);
    for (size_t i = 0; i < dlen; i++) data[i] = (char)(i * 2654435761u >> 13);
    snprintf(path, sizeof path, "%s/suanli-bench-ckpt-io-%d.bin", dir, (int)getpid());
    double wall[2][100], cpu[2][100];
    int direct = 0;
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            int which = (r + k) % 2; /* 0: buffered (the anchor), 1: O_DIRECT; alternating order */
            sl_ckpt_io io;
            double c0 = thread_cpu();
            sl_status st = sl_ckpt_write_file(path, hdr, hlen, data, dlen,
                                              SL_CKPT_IO_SYNC | (which ? SL_CKPT_IO_DIRECT : 0), &io);
            cpu[which][r] = thread_cpu() - c0;
            if (st != SL_OK) {
                fprintf(stderr, "suanli bench ckpt-io: %s\n", sl_errmsg());
                unlink(path);
                return 1;
            }
            wall[which][r] = io.seconds;
            if (which) direct = io.direct;
            unlink(path);
        }
    double mb = (double)(hlen + dlen) / 1e6, wb = median(wall[0], reps), wd = median(wall[1], reps),
           cb = median(cpu[0], reps), cd = median(cpu[1], reps);
    if (json)
        printf(
            "{\"bench\": \"ckpt-io\", \"dir\": \"%s\", \"mib\": %ld, \"reps\": %d, \"buffered_mb_s\": %.0f, "
            "\"buffered_cpu_s\": %.3f, \"direct_mb_s\": %.0f, \"direct_cpu_s\": %.3f, \"o_direct\": %s, "
            "\"direct_over_buffered\": %.2f}\n",
            dir, mib, reps, mb / wb, cb, mb / wd, cd, direct ? "true" : "false", wb / wd);
    else
        printf("shard file of %.0f MB in %s, median of %d:\n  buffered write + fsync (anchor): %.0f MB/s, "
               "%.3f CPU s\n  shard write path (%s): %.0f MB/s, %.3f CPU s (%.2fx the anchor)\n",
               mb, dir, reps, mb / wb, cb, direct ? "O_DIRECT" : "O_DIRECT refused: buffered", mb / wd, cd,
               wb / wd);
    sl_free_aligned(hdr);
    sl_free_aligned(data);
    return 0;
}
