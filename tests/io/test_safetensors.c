/* safetensors: write -> read round trip over many dtypes, reading a file written by the reference
 * implementation (fixtures/hf_fixture.safetensors, made by fixtures/make_fixture.py), writer argument checks,
 * and every class of malformed file giving a clear error and never a crash (plus a seeded mutation loop). */
#include <string.h>
#include <unistd.h>

#include "io_testutil.h"
#include "suanli/safetensors.h"
#include "testutil.h"

static char dir[512];
static int ncase;

/* File = u64 header length (hl, or strlen(h) if hl == UINT64_MAX) + h + data. */
static void craft(const char *path, const char *h, uint64_t hl, const void *data, size_t dlen) {
    size_t n = strlen(h);
    if (hl == UINT64_MAX) hl = n;
    uint8_t *b = malloc(8 + n + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hl >> (8 * i));
    memcpy(b + 8, h, n);
    if (dlen) memcpy(b + 8 + n, data, dlen);
    iot_write(path, b, 8 + n + dlen);
    free(b);
}

static void expect_bad(const char *what, const char *h, uint64_t hl, size_t dlen, const char *word) {
    char path[700];
    snprintf(path, sizeof path, "%s/bad%02d.safetensors", dir, ncase++);
    uint8_t data[256] = {0};
    craft(path, h, hl, data, dlen);
    sl_safetensors *st = NULL;
    sl_status s = sl_safetensors_open(path, &st);
    TU_CHECK(s == SL_ERR_FORMAT && !st, "%s: expected a format error, got %s", what, sl_status_name(s));
    TU_CHECK(iot_contains(sl_errmsg(), path), "%s: message should name the file: %s", what, sl_errmsg());
    TU_CHECK(iot_contains(sl_errmsg(), word), "%s: message should mention '%s': %s", what, word, sl_errmsg());
    TU_CHECK(!strchr(sl_errmsg(), '\n'), "%s: one-line message", what);
    sl_safetensors_close(st);
}

static int valid_layout(const sl_safetensors *st, const uint8_t *lo, size_t size) {
    (void)lo, (void)size;
    for (int i = 0; i < sl_safetensors_count(st); i++) {
        const sl_st_tensor *t = sl_safetensors_get(st, i);
        if (!t || !t->name || !t->dtype) return 0;
        if (sl_safetensors_find(st, t->name) != t) return 0;
        size_t es = sl_safetensors_dtype_size(t->dtype);
        uint64_t n = es;
        for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
        if (n != t->nbytes) return 0;
        volatile uint8_t sink = 0; /* touch every byte: ASan/SEGV if a range escaped the mapping */
        for (size_t k = 0; k < t->nbytes; k++) sink ^= ((const uint8_t *)t->data)[k];
        (void)sink;
    }
    return 1;
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("st"));
    char path[700];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);

    /* ---- round trip ---- */
    float f32[6] = {0.5f, -1.25f, 3.0f, 1e-30f, -0.0f, 65504.0f};
    uint16_t bf16[4] = {sl_f32_to_bf16(1.0f), sl_f32_to_bf16(-2.5f), sl_f32_to_bf16(3.140625f), 0x7fc0};
    int32_t i32[3] = {-7, 0, 2147483647};
    int64_t i64[2] = {-((int64_t)1 << 62), 12345678901234LL};
    uint16_t f16[2] = {0x3c00, 0xc000};
    uint8_t u8[5] = {0, 1, 127, 128, 255};
    double f64 = 2.718281828459045;
    uint8_t bools[3] = {1, 0, 1};
    sl_st_tensor ts[] = {
        {"u8", "U8", 1, {5}, u8, sizeof u8}, /* odd size first: later tensors are unaligned, must still work
                                              */
        {"layer.0.w", "F32", 2, {2, 3}, f32, sizeof f32},
        {"bf", "BF16", 2, {2, 2}, bf16, sizeof bf16},
        {"i32", "I32", 1, {3}, i32, sizeof i32},
        {"i64", "I64", 1, {2}, i64, sizeof i64},
        {"half", "F16", 1, {2}, f16, sizeof f16},
        {"scalar", "F64", 0, {0}, &f64, sizeof f64},
        {"mask", "BOOL", 1, {3}, bools, sizeof bools},
        {"empty", "F32", 2, {0, 7}, NULL, 0},
        {"name with \"quotes\" and \xc3\xa9", "I32", 1, {1}, i32, 4},
    };
    int nt = (int)(sizeof ts / sizeof ts[0]);
    const char *meta[] = {"format", "pt", "step", "100", "json", "{\"a\": [1, 2]}", NULL};
    TU_CHECK(sl_safetensors_write(path, ts, nt, meta) == SL_OK, "%s", sl_errmsg());
    size_t flen;
    uint8_t *raw = (uint8_t *)iot_read(path, &flen);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)raw[i] << (8 * i);
    TU_CHECK((8 + hl) % 8 == 0, "data start %llu not 8-byte aligned", (unsigned long long)(8 + hl));
    TU_CHECK(raw[8] == '{', "header starts with '{'");
    sl_safetensors *st = NULL;
    TU_CHECK(sl_safetensors_open(path, &st) == SL_OK, "%s", sl_errmsg());
    if (st) {
        TU_CHECK(sl_safetensors_count(st) == nt, "count %d", sl_safetensors_count(st));
        for (int i = 0; i < nt; i++) {
            const sl_st_tensor *t = sl_safetensors_find(st, ts[i].name);
            TU_CHECK(t != NULL, "tensor '%s' missing", ts[i].name);
            if (!t) continue;
            TU_CHECK(!strcmp(t->dtype, ts[i].dtype) && t->ndim == ts[i].ndim && t->nbytes == ts[i].nbytes,
                     "'%s': dtype %s ndim %d nbytes %zu", ts[i].name, t->dtype, t->ndim, t->nbytes);
            TU_CHECK(!memcmp(t->shape, ts[i].shape, (size_t)ts[i].ndim * sizeof(int64_t)), "'%s': shape",
                     ts[i].name);
            TU_CHECK(ts[i].nbytes == 0 || !memcmp(t->data, ts[i].data, ts[i].nbytes), "'%s': data differs",
                     ts[i].name);
        }
        /* get() is in data order = write order */
        TU_CHECK(!strcmp(sl_safetensors_get(st, 0)->name, "u8") &&
                     !strcmp(sl_safetensors_get(st, 1)->name, "layer.0.w"),
                 "get order");
        TU_CHECK(sl_safetensors_get(st, nt) == NULL && sl_safetensors_get(st, -1) == NULL,
                 "get out of range");
        TU_CHECK(sl_safetensors_find(st, "nope") == NULL, "find absent");
        TU_CHECK(sl_safetensors_meta(st, "step") && !strcmp(sl_safetensors_meta(st, "step"), "100"),
                 "meta step");
        TU_CHECK(sl_safetensors_meta(st, "json") &&
                     !strcmp(sl_safetensors_meta(st, "json"), "{\"a\": [1, 2]}"),
                 "meta with JSON text");
        TU_CHECK(sl_safetensors_meta(st, "absent") == NULL && sl_safetensors_meta_count(st) == 3,
                 "meta absent/count");
        const sl_st_tensor *w = sl_safetensors_find(st, "layer.0.w");
        float back[6];
        memcpy(back, w->data, sizeof back);
        TU_CHECK(back[3] == 1e-30f && back[5] == 65504.0f, "f32 values");
        sl_safetensors_close(st);
    }
    free(raw);
    /* no metadata, zero tensors */
    TU_CHECK(sl_safetensors_write(path, NULL, 0, NULL) == SL_OK, "%s", sl_errmsg());
    TU_CHECK(sl_safetensors_open(path, &st) == SL_OK && sl_safetensors_count(st) == 0 &&
                 sl_safetensors_meta(st, "format") == NULL,
             "empty file: %s", sl_errmsg());
    sl_safetensors_close(st);

    /* dtype helpers */
    TU_CHECK(sl_safetensors_dtype_size("BF16") == 2 && sl_safetensors_dtype_size("F8_E4M3") == 1 &&
                 sl_safetensors_dtype_size("F7") == 0 && sl_safetensors_dtype_size(NULL) == 0,
             "dtype sizes");
    TU_CHECK(!strcmp(sl_safetensors_dtype_name(SL_BF16), "BF16") &&
                 sl_safetensors_dtype_parse("I32") == SL_I32 &&
                 sl_safetensors_dtype_parse("U8") == SL_DTYPE_COUNT,
             "sl_dtype mapping");

    /* ---- a file written by the reference implementation ---- */
    TU_CHECK(sl_safetensors_open(SL_SOURCE_DIR "/tests/io/fixtures/hf_fixture.safetensors", &st) == SL_OK,
             "%s", sl_errmsg());
    if (st) {
        const sl_st_tensor *a = sl_safetensors_find(st, "a"), *b = sl_safetensors_find(st, "b"),
                           *c = sl_safetensors_find(st, "c"), *d = sl_safetensors_find(st, "d"),
                           *e = sl_safetensors_find(st, "e"), *s = sl_safetensors_find(st, "s"),
                           *i = sl_safetensors_find(st, "i"), *z = sl_safetensors_find(st, "z");
        TU_CHECK(a && b && c && d && e && s && i && z && sl_safetensors_count(st) == 8, "fixture tensors");
        if (a && b && c && d && e && s && i && z) {
            float av[6];
            memcpy(av, a->data, sizeof av);
            TU_CHECK(a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3 && av[5] == 2.5f && av[1] == 0.5f,
                     "a");
            int64_t bv[4];
            memcpy(bv, b->data, sizeof bv);
            TU_CHECK(!strcmp(b->dtype, "I64") && bv[0] == -1 && bv[3] == (int64_t)1 << 40, "b");
            uint16_t cv[2], ev[2];
            memcpy(cv, c->data, 4), memcpy(ev, e->data, 4);
            TU_CHECK(!strcmp(c->dtype, "F16") && cv[0] == 0x3c00 && cv[1] == 0xc000, "c f16 bits");
            TU_CHECK(!strcmp(e->dtype, "BF16") && sl_bf16_to_f32(ev[0]) == 1.0f &&
                         sl_bf16_to_f32(ev[1]) == -0.5f,
                     "e");
            TU_CHECK(!strcmp(d->dtype, "U8") && ((const uint8_t *)d->data)[2] == 255, "d");
            double sv;
            memcpy(&sv, s->data, 8);
            TU_CHECK(s->ndim == 0 && sv == 3.25, "scalar");
            int32_t iv[2];
            memcpy(iv, i->data, 8);
            TU_CHECK(i->shape[0] == 1 && i->shape[1] == 2 && iv[0] == 7 && iv[1] == -8, "i");
            TU_CHECK(z->nbytes == 0 && z->shape[0] == 0 && z->shape[1] == 4, "z");
        }
        TU_CHECK(sl_safetensors_meta(st, "note") && !strcmp(sl_safetensors_meta(st, "note"), "fixture"),
                 "fixture meta");
        sl_safetensors_close(st);
    }

    /* ---- writer argument checks ---- */
    {
        sl_st_tensor bad = {"x", "F7", 1, {2}, f32, 8};
        TU_CHECK(sl_safetensors_write(path, &bad, 1, NULL) == SL_ERR_INVALID &&
                     iot_contains(sl_errmsg(), "dtype"),
                 "unknown dtype: %s", sl_errmsg());
        bad.dtype = "F32", bad.nbytes = 12;
        TU_CHECK(sl_safetensors_write(path, &bad, 1, NULL) == SL_ERR_INVALID, "nbytes mismatch accepted");
        bad.nbytes = 8, bad.ndim = 9;
        TU_CHECK(sl_safetensors_write(path, &bad, 1, NULL) == SL_ERR_INVALID, "ndim 9 accepted");
        bad.ndim = 1, bad.shape[0] = -2;
        TU_CHECK(sl_safetensors_write(path, &bad, 1, NULL) == SL_ERR_INVALID, "negative dim accepted");
        sl_st_tensor two[2] = {{"x", "F32", 1, {2}, f32, 8}, {"x", "F32", 1, {2}, f32, 8}};
        TU_CHECK(sl_safetensors_write(path, two, 2, NULL) == SL_ERR_INVALID &&
                     iot_contains(sl_errmsg(), "duplicate"),
                 "duplicate names: %s", sl_errmsg());
        two[1].name = "__metadata__";
        TU_CHECK(sl_safetensors_write(path, two, 2, NULL) == SL_ERR_INVALID, "reserved name accepted");
        two[1].name = "";
        TU_CHECK(sl_safetensors_write(path, two, 2, NULL) == SL_ERR_INVALID, "empty name accepted");
        const char *odd[] = {"k", NULL};
        TU_CHECK(sl_safetensors_write(path, two, 1, odd) == SL_ERR_INVALID,
                 "metadata key without value accepted");
        char unw[800];
        snprintf(unw, sizeof unw, "%s/rt.safetensors/x.safetensors", dir); /* parent is a regular file */
        TU_CHECK(sl_safetensors_write(unw, two, 1, NULL) == SL_ERR_IO, "write under a file: %s", sl_errmsg());
        TU_CHECK(iot_count_entries(dir, ".tmp.") == 0, "temporary files left behind");
    }

    /* ---- malformed files ---- */
    char p[700];
    snprintf(p, sizeof p, "%s/short.safetensors", dir);
    iot_write(p, "\x05\x00\x00", 3);
    TU_CHECK(sl_safetensors_open(p, &st) == SL_ERR_FORMAT && iot_contains(sl_errmsg(), "truncated"),
             "3-byte file: %s", sl_errmsg());
    snprintf(p, sizeof p, "%s/missing.safetensors", dir);
    TU_CHECK(sl_safetensors_open(p, &st) == SL_ERR_IO && iot_contains(sl_errmsg(), "missing.safetensors"),
             "missing");
    const char *T1 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_bad("header length > file", T1, 4096, 8, "larger than the file");
    expect_bad("huge header length 2^60", T1, (uint64_t)1 << 60, 8, "exceeds");
    expect_bad("header length 2^64-2", T1, UINT64_MAX - 1, 8, "exceeds");
    expect_bad("offsets outside file", "{\"a\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[0,100]}}",
               UINT64_MAX, 8, "outside");
    expect_bad("overlap",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               UINT64_MAX, 12, "overlaps");
    expect_bad("begin > end", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", UINT64_MAX,
               8, "out of order");
    expect_bad("hole",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               UINT64_MAX, 12, "hole");
    expect_bad("trailing data", T1, UINT64_MAX, 16, "trailing");
    expect_bad("shape x dtype != range", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
               UINT64_MAX, 8, "span");
    expect_bad("numel overflow",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,1099511627776],\"data_"
               "offsets\":[0,0]}}",
               UINT64_MAX, 0, "2^64");
    expect_bad("non-JSON header", "this is not JSON at all", UINT64_MAX, 0, "JSON");
    expect_bad("JSON array header", "[1,2,3]", UINT64_MAX, 0, "JSON object");
    expect_bad("header truncated mid-JSON", "{\"a\":{\"dtype\":\"F32\",\"sha", UINT64_MAX, 0, "JSON");
    expect_bad("trailing garbage", "{}xyz", UINT64_MAX, 0, "trailing");
    expect_bad("unknown dtype", "{\"a\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,8]}}", UINT64_MAX,
               8, "unknown dtype 'F7'");
    expect_bad("dtype not a string", "{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", UINT64_MAX,
               8, "dtype");
    expect_bad("duplicate name",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               UINT64_MAX, 8, "duplicate");
    expect_bad("negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
               UINT64_MAX, 8, "shape[0]");
    expect_bad("fractional dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}",
               UINT64_MAX, 8, "shape[0]");
    expect_bad("9 dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}",
               UINT64_MAX, 8, "dims");
    expect_bad("offsets missing", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", UINT64_MAX, 8, "data_offsets");
    expect_bad("offsets 3 items", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}",
               UINT64_MAX, 8, "data_offsets");
    expect_bad("offset 2^64",
               "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[18446744073709551615,8]}}",
               UINT64_MAX, 8, "data_offsets");
    expect_bad("tensor entry not object", "{\"a\":[1]}", UINT64_MAX, 0, "not an object");
    expect_bad("metadata value not string", "{\"__metadata__\":{\"k\":5}}", UINT64_MAX, 0, "not a string");
    expect_bad("metadata not object", "{\"__metadata__\":[\"k\"]}", UINT64_MAX, 0, "__metadata__");
    expect_bad("header length 0", "", UINT64_MAX, 0, "too small");
    {
        /* deep nesting must not overflow the stack */
        size_t depth = 200000;
        char *deep = malloc(2 * depth + 8);
        memset(deep, '[', depth);
        memset(deep + depth, ']', depth);
        deep[2 * depth] = 0;
        expect_bad("deeply nested JSON", deep, UINT64_MAX, 0, "JSON");
        free(deep);
    }

    /* ---- every truncation of a valid file fails cleanly ---- */
    TU_CHECK(sl_safetensors_write(path, ts, nt, meta) == SL_OK, "%s", sl_errmsg());
    raw = (uint8_t *)iot_read(path, &flen);
    /* the loops below rewrite a file thousands of times: use tmpfs when there is one (disk /tmp is slow) */
    char fast[512];
    snprintf(fast, sizeof fast, "/dev/shm/suanli-st-%d.safetensors", (int)getpid());
    if (iot_write(fast, "", 0) == 0)
        snprintf(p, sizeof p, "%s", fast);
    else
        snprintf(p, sizeof p, "%s/trunc.safetensors", dir);
    int trunc_ok = 1;
    for (size_t l = 0; l < flen; l++) {
        iot_write(p, raw, l);
        sl_safetensors *x = NULL;
        if (sl_safetensors_open(p, &x) == SL_OK || x) trunc_ok = 0;
        sl_safetensors_close(x);
    }
    TU_CHECK(trunc_ok, "a truncated file was accepted");

    /* ---- seeded mutations: never crash; whatever opens has every range inside the mapping ---- */
    int opened = 0;
    uint8_t *mut = malloc(flen);
    for (uint64_t it = 0; it < 3000; it++) {
        memcpy(mut, raw, flen);
        int flips = 1 + (int)(sl_rng_u64(11, it, 0) % 4);
        for (int k = 0; k < flips; k++) {
            uint64_t r = sl_rng_u64(11, it, (uint64_t)k + 1);
            size_t pos = (size_t)(r % (8 + hl)); /* mostly header bytes */
            const char pick[] = "0123456789[]{},:\"-. eE";
            mut[pos] = (r >> 32) & 1 ? (uint8_t)(r >> 40) : (uint8_t)pick[(r >> 40) % (sizeof pick - 1)];
        }
        iot_write(p, mut, flen);
        sl_safetensors *x = NULL;
        if (sl_safetensors_open(p, &x) == SL_OK) {
            opened++;
            TU_CHECK(valid_layout(x, NULL, 0), "mutation %llu opened with an inconsistent layout",
                     (unsigned long long)it);
        }
        sl_safetensors_close(x);
    }
    printf("mutations: %d of 3000 still valid files\n", opened);
    unlink(fast);
    free(mut);
    free(raw);
    iot_cleanup(dir);
    return tu_finish("test_io_safetensors");
}
