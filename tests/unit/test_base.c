/* base layer: status messages, RNG reproducibility and distribution, bf16 rounding, atomic files. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "suanli/base.h"
#include "testutil.h"

static void test_status(void) {
    sl_status st = sl_fail(SL_ERR_IO, "file %s\nbad", "x.bin");
    TU_CHECK(st == SL_ERR_IO, "status passthrough");
    TU_CHECK(strcmp(sl_errmsg(), "file x.bin bad") == 0, "one-line message, got '%s'", sl_errmsg());
    TU_CHECK(strcmp(sl_status_name(SL_ERR_TIMEOUT), "timeout") == 0, "name");
    /* the previous message as an argument: wrapped, not garbled (they share one buffer) */
    sl_fail(SL_ERR_IO, "x.bin.tmp: cannot create");
    sl_fail(SL_ERR_IO, "%s: %s", "x.bin", sl_errmsg());
    TU_CHECK(strcmp(sl_errmsg(), "x.bin: x.bin.tmp: cannot create") == 0, "wrapped message, got '%s'",
             sl_errmsg());
}

static void test_rng(void) {
    /* Known-answer test for Philox4x32-10 from the Random123 distribution (kat_vectors):
     * ctr = {0,0,0,0}, key = {0,0} -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8 */
    uint32_t o[4];
    sl_philox4x32(0, 0, 0, o);
    TU_CHECK(o[0] == 0x6627e8d5u && o[1] == 0xe169c58du && o[2] == 0xbc57ac4cu && o[3] == 0x9b00dbd8u,
             "philox KAT got %08x %08x %08x %08x", o[0], o[1], o[2], o[3]);
    /* ctr = {ffffffff x4}, key = {ffffffff x2} -> 408f276d 41c83b0e a20bc7c6 6d5451fd */
    sl_philox4x32(~0ull, ~0ull, ~0ull, o);
    TU_CHECK(o[0] == 0x408f276du && o[1] == 0x41c83b0eu && o[2] == 0xa20bc7c6u && o[3] == 0x6d5451fdu,
             "philox KAT2 got %08x %08x %08x %08x", o[0], o[1], o[2], o[3]);
    TU_CHECK(sl_rng_u64(1, 2, 3) == sl_rng_u64(1, 2, 3), "reproducible");
    TU_CHECK(sl_rng_u64(1, 2, 3) != sl_rng_u64(1, 2, 4), "counter matters");
    TU_CHECK(sl_rng_u64(1, 2, 3) != sl_rng_u64(1, 3, 3), "stream matters");
    enum { N = 200000 };
    static float x[N];
    sl_rng_fill_normal(x, N, 42, 7, 1.0f, 2.0f);
    double m = 0, v = 0;
    for (int i = 0; i < N; i++) m += x[i];
    m /= N;
    for (int i = 0; i < N; i++) v += (x[i] - m) * (x[i] - m);
    v /= N;
    TU_CHECK(fabs(m - 1.0) < 0.02 && fabs(sqrt(v) - 2.0) < 0.02, "normal moments m=%g sd=%g", m, sqrt(v));
}

static void test_bf16(void) {
    TU_CHECK(sl_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    /* 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0 */
    TU_CHECK(sl_f32_to_bf16(1.00390625f) == 0x3f80, "tie to even down");
    /* 1.0078125 + 2^-8 halfway between 0x3f81 and 0x3f82 -> even 0x3f82 */
    TU_CHECK(sl_f32_to_bf16(1.01171875f) == 0x3f82, "tie to even up");
    TU_CHECK(sl_bf16_to_f32(0x3f82) == 1.015625f, "back");
    TU_CHECK(isnan(sl_bf16_to_f32(sl_f32_to_bf16(NAN))), "nan stays nan");
    TU_CHECK(sl_f32_to_bf16(INFINITY) == 0x7f80, "inf");
}

static void test_files(void) {
    const char *d = tu_tmpdir("base");
    char p[600];
    snprintf(p, sizeof p, "%s/a.txt", d);
    TU_CHECK(sl_file_write_atomic(p, "hello", 5) == SL_OK, "write");
    char *buf;
    size_t n;
    TU_CHECK(sl_file_read_all(p, &buf, &n) == SL_OK && n == 5 && !memcmp(buf, "hello", 5), "read back");
    free(buf);
    snprintf(p, sizeof p, "%s/missing/a.txt", d);
    TU_CHECK(sl_file_write_atomic(p, "x", 1) == SL_ERR_IO, "missing dir fails");
    TU_CHECK(strstr(sl_errmsg(), "missing/a.txt") != NULL, "message names the file: %s", sl_errmsg());
    TU_CHECK(sl_file_read_all(d, &buf, &n) == SL_ERR_IO && strstr(sl_errmsg(), "is a directory"),
             "reading a directory: %s", sl_errmsg());
    snprintf(p, sizeof p, "%s/x/y/z", d);
    TU_CHECK(sl_mkdirs(p) == SL_OK, "mkdirs");
    snprintf(p, sizeof p, "%s/a.txt/sub", d);
    TU_CHECK(sl_mkdirs(p) != SL_OK, "mkdirs under a file fails");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    TU_CHECK(system(cmd) == 0, "cleanup");
}

static void test_cpu(void) {
    const char *isa = sl_cpu_isa_name();
    TU_CHECK(!strcmp(isa, "avx512") || !strcmp(isa, "avx2") || !strcmp(isa, "scalar"), "isa %s", isa);
}

/* Note [Huge pages for large buffers]: a large buffer starts on a 2 MiB boundary and holds what is written to
 * all of it; a small one keeps 64-byte alignment. Whether the kernel backed it with huge pages depends on
 * the host's THP setting and free memory, so that is printed, not asserted. */
static void test_large_alloc(void) {
    const size_t big = (40u << 20) + 12345, small = 1u << 20;
    unsigned char *p = sl_malloc_aligned(big), *q = sl_malloc_aligned(small);
    TU_CHECK(p && q, "allocation failed");
    if (!p || !q) return;
    TU_CHECK((uintptr_t)p % (2u << 20) == 0, "a %zu-byte buffer at %p: not on a 2 MiB boundary", big,
             (void *)p);
    TU_CHECK((uintptr_t)q % 64 == 0, "a %zu-byte buffer at %p: not 64-byte aligned", small, (void *)q);
    for (size_t i = 0; i < big; i++) p[i] = (unsigned char)(i * 131u >> 3);
    size_t bad = 0;
    for (size_t i = 0; i < big; i++) bad += p[i] != (unsigned char)(i * 131u >> 3);
    TU_CHECK(bad == 0, "%zu bytes of the large buffer changed", bad);
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages:", 14)) printf("large buffer written; %s", line);
    if (f) fclose(f);
    sl_free_aligned(p);
    sl_free_aligned(q);
}

int main(void) {
    test_status();
    test_large_alloc();
    test_rng();
    test_bf16();
    test_files();
    test_cpu();
    return tu_finish("test_base");
}
