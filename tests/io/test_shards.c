/* Token shards: write/read round trip at both token widths, and every header corruption is a one-line error
 * naming the file and the field. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string.h>

#include "io_testutil.h"
#include "suanli/data.h"
#include "testutil.h"

static char dir[512];

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Read `path` expecting failure whose message contains each of the given words. */
static void expect_bad(const char *path, const char *what, const char *w1, const char *w2) {
    int32_t *t = NULL;
    int64_t n = 0;
    sl_status st = sl_shard_read(path, NULL, &t, &n);
    const char *m = sl_errmsg();
    TU_CHECK(st == SL_ERR_FORMAT || st == SL_ERR_IO, "%s: expected a format error, got %s", what,
             sl_status_name(st));
    TU_CHECK(iot_contains(m, path), "%s: message should name the file: %s", what, m);
    TU_CHECK(iot_contains(m, w1), "%s: message should mention '%s': %s", what, w1, m);
    if (w2) TU_CHECK(iot_contains(m, w2), "%s: message should mention '%s': %s", what, w2, m);
    TU_CHECK(!strchr(m, '\n'), "%s: message must be one line: %s", what, m);
    free(t);
}

/* Corrupt a copy of `good` with f and check the error. */
static void corrupt_case(const uint8_t *good, size_t len, const char *what, void (*f)(uint8_t *, size_t *),
                         const char *w1, const char *w2) {
    char path[600];
    snprintf(path, sizeof path, "%s/bad_%s.bin", dir, what);
    uint8_t *b = malloc(len + 64);
    memcpy(b, good, len);
    size_t l = len;
    f(b, &l);
    iot_write(path, b, l);
    expect_bad(path, what, w1, w2);
    free(b);
}

static void f_magic(uint8_t *b, size_t *l) { (void)l, b[0] = 'X'; }
static void f_version(uint8_t *b, size_t *l) { (void)l, put32(b + 8, 2); }
static void f_hdrbytes(uint8_t *b, size_t *l) { (void)l, put32(b + 12, 128); }
static void f_width(uint8_t *b, size_t *l) { (void)l, put32(b + 16, 4); }
static void f_vocab0(uint8_t *b, size_t *l) { (void)l, put32(b + 20, 0); }
static void f_trunc(uint8_t *b, size_t *l) { (void)b, *l -= 3; }
static void f_trunc_hdr(uint8_t *b, size_t *l) { (void)b, *l = 40; }
static void f_extra(uint8_t *b, size_t *l) { b[*l] = 0, b[*l + 1] = 0, *l += 2; }
static void f_count(uint8_t *b, size_t *l) { (void)l, put64(b + 24, (uint64_t)1 << 62); }
static void f_payload(uint8_t *b, size_t *l) { b[*l - 1] ^= 1; } /* token stays < vocab, checksum breaks */
static void f_reserved(uint8_t *b, size_t *l) { (void)l, b[50] = 7; }
static void f_token(uint8_t *b,
                    size_t *l) { /* token >= vocab with a CORRECT checksum: only the range check catches it */
    b[64] = 0xff, b[65] = 0x7f;  /* 32767 >= 1000 */
    put64(b + 32, XXH3_64bits(b + 64, *l - 64));
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("shards"));
    char p2[600], p4[600], pe[600];
    snprintf(p2, sizeof p2, "%s/w2.bin", dir);
    snprintf(p4, sizeof p4, "%s/w4.bin", dir);
    snprintf(pe, sizeof pe, "%s/empty.bin", dir);

    /* round trip, 2-byte tokens */
    enum { N = 5000 };
    int32_t *t = malloc(N * sizeof *t);
    for (int i = 0; i < N; i++) t[i] = (int32_t)((i * 7919u) % 1000u);
    TU_CHECK(sl_shard_write(p2, t, N, 1000) == SL_OK, "%s", sl_errmsg());
    size_t len;
    uint8_t *raw = (uint8_t *)iot_read(p2, &len);
    TU_CHECK(len == 64 + 2 * N, "file size %zu", len);
    TU_CHECK(!memcmp(raw, "SLTOKSH1", 8), "magic");
    sl_shard_header h;
    int32_t *got;
    int64_t n;
    TU_CHECK(sl_shard_read(p2, &h, &got, &n) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(n == N && h.token_bytes == 2 && h.vocab_size == 1000 && h.version == 1, "header n=%lld w=%u",
             (long long)n, h.token_bytes);
    TU_CHECK(got && !memcmp(got, t, N * sizeof *t), "tokens differ after round trip");
    free(got);

    /* 4-byte tokens when vocab > 65536, boundary values */
    int32_t big[4] = {0, 65535, 65536, 99999};
    TU_CHECK(sl_shard_write(p4, big, 4, 100000) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(sl_shard_read(p4, &h, &got, &n) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(n == 4 && h.token_bytes == 4 && !memcmp(got, big, sizeof big), "4-byte round trip");
    free(got);
    int32_t edge[2] = {0, 65535}; /* vocab exactly 65536 still fits 2 bytes */
    TU_CHECK(sl_shard_write(p4, edge, 2, 65536) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(sl_shard_read(p4, &h, &got, &n) == SL_OK && h.token_bytes == 2 && got[1] == 65535,
             "vocab 65536 width");
    free(got);

    /* empty shard is valid */
    TU_CHECK(sl_shard_write(pe, NULL, 0, 256) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(sl_shard_read(pe, &h, &got, &n) == SL_OK && n == 0, "empty shard: %s", sl_errmsg());
    free(got);

    /* writer refuses tokens outside the vocab */
    int32_t bad[2] = {3, 256};
    TU_CHECK(sl_shard_write(p4, bad, 2, 256) == SL_ERR_INVALID, "writer accepted token 256 for vocab 256");
    bad[1] = -1;
    TU_CHECK(sl_shard_write(p4, bad, 2, 256) == SL_ERR_INVALID, "writer accepted token -1");

    /* corruptions */
    corrupt_case(raw, len, "magic", f_magic, "magic", NULL);
    corrupt_case(raw, len, "version", f_version, "version", "2");
    corrupt_case(raw, len, "header_bytes", f_hdrbytes, "header_bytes", NULL);
    corrupt_case(raw, len, "token_bytes", f_width, "token_bytes", NULL);
    corrupt_case(raw, len, "vocab0", f_vocab0, "vocab_size", NULL);
    corrupt_case(raw, len, "truncated", f_trunc, "truncated", "num_tokens");
    corrupt_case(raw, len, "truncated_header", f_trunc_hdr, "truncated header", NULL);
    corrupt_case(raw, len, "extra", f_extra, "file size", "num_tokens");
    corrupt_case(raw, len, "count", f_count, "num_tokens", NULL);
    corrupt_case(raw, len, "payload", f_payload, "checksum", NULL);
    corrupt_case(raw, len, "reserved", f_reserved, "reserved", NULL);
    corrupt_case(raw, len, "token", f_token, "token 32767", "vocab_size 1000");
    /* foreign file */
    char pf[600];
    snprintf(pf, sizeof pf, "%s/foreign.bin", dir);
    const char *txt = "This is not a shard, it is a text file that happens to be long enough for a header.\n";
    iot_write(pf, txt, strlen(txt));
    expect_bad(pf, "foreign", "magic", NULL);
    char pm[600];
    snprintf(pm, sizeof pm, "%s/missing.bin", dir);
    expect_bad(pm, "missing", "cannot open", NULL);

    free(raw);
    free(t);
    iot_cleanup(dir);
    return tu_finish("test_io_shards");
}
