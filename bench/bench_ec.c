/* See bench_ec.h. */
#include "bench_ec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/flags.h"
#include "suanli/ckpt.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

int sl_bench_ec(int argc, char **argv) {
    int json = 0;
    int64_t reps64 = 5, mib64 = 256;
    sl_flag flags[] = {
        {"json", SL_FLAG_BOOL, &json, 0, 1, "machine-readable output", 0},
        {"mib", SL_FLAG_INT, &mib64, 1, 65536, "MiB of data to encode (256)", 0}, /* (size_t)mib << 20 */
        {"reps", SL_FLAG_INT, &reps64, 1, 100, "repetitions; the median is reported (5)", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    if (sl_flags_help(flags, nf, argc, argv, "usage: suanli bench ec [flags]")) return 0;
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli bench ec: %s\n", sl_errmsg());
        return 2;
    }
    int reps = (int)reps64;
    long mib = (long)mib64;
    if (!sl_ckpt_ec_available()) {
        fprintf(stderr,
                "suanli bench ec: this build has no erasure coding (install libisal-dev and rebuild)\n");
        return 1;
    }
    sl_threads_set(1);
    const int km[][2] = {{2, 1}, {4, 2}, {8, 3}};
    if (!json) printf("Reed-Solomon over ISA-L, one core, %ld MiB of data, median of %d\n", mib, reps);
    for (size_t t = 0; t < sizeof km / sizeof km[0]; t++) {
        int k = km[t][0], m = km[t][1], n = k + m;
        size_t data = (size_t)mib << 20, len = (data / (size_t)k + 63) / 64 * 64;
        uint8_t *mem = sl_malloc_aligned(len * (size_t)n), *copy = sl_malloc_aligned(len * (size_t)k),
                *blk[24];
        if (!mem || !copy) {
            fprintf(stderr, "suanli bench ec: out of memory\n");
            return 1;
        }
        for (int i = 0; i < n; i++) blk[i] = mem + len * (size_t)i;
        for (size_t i = 0; i < len * (size_t)n; i++) mem[i] = (uint8_t)(i * 2654435761u >> 13);
        double enc[100], dec[100], cpy[100];
        int present[24], lost = k < m ? k : m;
        for (int r = 0; r < reps; r++) {
            double t0 = sl_time_sec();
            sl_ckpt_ec_encode(k, m, len, blk, blk + k);
            double t1 = sl_time_sec();
            for (int i = 0; i < n; i++) present[i] = i >= lost;
            sl_ckpt_ec_decode(k, m, len, blk, present);
            double t2 = sl_time_sec();
            memcpy(copy, mem, len * (size_t)k);
            double t3 = sl_time_sec();
            enc[r] = (double)(len * (size_t)k) / (t1 - t0) / 1e9;
            dec[r] = (double)(len * (size_t)k) / (t2 - t1) / 1e9;
            cpy[r] = (double)(len * (size_t)k) / (t3 - t2) / 1e9;
        }
        double e = median(enc, reps), d = median(dec, reps), c = median(cpy, reps);
        if (json)
            printf("{\"bench\": \"ec\", \"k\": %d, \"m\": %d, \"data_mib\": %ld, \"encode_gb_s_per_core\": "
                   "%.2f, "
                   "\"decode_gb_s_per_core\": %.2f, \"lost_blocks\": %d, \"memcpy_gb_s\": %.2f}\n",
                   k, m, mib, e, d, lost, c);
        else
            printf("  %d+%d: encode %.2f GB/s, decode (%d data blocks lost) %.2f GB/s, memcpy %.2f GB/s\n", k,
                   m, e, lost, d, c);
        sl_free_aligned(mem);
        sl_free_aligned(copy);
    }
    return 0;
}
