/* TensorBoard event files: TFRecord framing with CRC32C and a hand-written Event protobuf
 * (Note [TensorBoard events] in include/suanli/metrics.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "suanli/metrics.h"

/* ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven ---- */
static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
    __atomic_store_n(&crc_ready, 1, __ATOMIC_RELEASE);
}

uint32_t sl_crc32c(uint32_t crc, const void *data, size_t n) {
    if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE)) crc_init(); /* idempotent: a race writes the same */
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t sl_crc32c_masked(const void *data, size_t n) {
    uint32_t c = sl_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- a tiny protobuf writer (varints, fixed64/fixed32, length-delimited) ---- */
typedef struct {
    unsigned char b[512];
    size_t n;
} pb;

static void pb_varint(pb *p, uint64_t v) {
    while (v >= 0x80 && p->n < sizeof p->b) {
        p->b[p->n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    if (p->n < sizeof p->b) p->b[p->n++] = (unsigned char)v;
}
static void pb_bytes(pb *p, const void *d, size_t n) {
    SL_ASSERT(p->n + n <= sizeof p->b);
    memcpy(p->b + p->n, d, n);
    p->n += n;
}
static void pb_key(pb *p, int field, int wire) { pb_varint(p, (uint64_t)(field << 3 | wire)); }
static void pb_fixed64(pb *p, int field, uint64_t v) {
    pb_key(p, field, 1);
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(v >> (8 * i));
    pb_bytes(p, le, 8);
}
static void pb_fixed32(pb *p, int field, uint32_t v) {
    pb_key(p, field, 5);
    unsigned char le[4];
    for (int i = 0; i < 4; i++) le[i] = (unsigned char)(v >> (8 * i));
    pb_bytes(p, le, 4);
}
static void pb_len(pb *p, int field, const void *d, size_t n) {
    pb_key(p, field, 2);
    pb_varint(p, n);
    pb_bytes(p, d, n);
}

struct sl_tb_writer {
    FILE *f;
    char path[4400];
};

static sl_status write_record(sl_tb_writer *w, const pb *ev) {
    unsigned char hdr[12];
    uint64_t len = ev->n;
    for (int i = 0; i < 8; i++) hdr[i] = (unsigned char)(len >> (8 * i));
    uint32_t c = sl_crc32c_masked(hdr, 8), d = sl_crc32c_masked(ev->b, ev->n);
    for (int i = 0; i < 4; i++) hdr[8 + i] = (unsigned char)(c >> (8 * i));
    unsigned char tail[4];
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(d >> (8 * i));
    if (fwrite(hdr, 1, 12, w->f) != 12 || fwrite(ev->b, 1, ev->n, w->f) != ev->n ||
        fwrite(tail, 1, 4, w->f) != 4)
        return sl_fail(SL_ERR_IO, "%s: write failed", w->path);
    return SL_OK;
}

/* Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5 (Summary) */
static void event_head(pb *p, double wall_time, int64_t step) {
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    pb_fixed64(p, 1, bits);
    if (step) {
        pb_key(p, 2, 0);
        pb_varint(p, (uint64_t)step);
    }
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

sl_status sl_tb_writer_open(const char *dir, sl_tb_writer **out) {
    *out = NULL;
    SL_TRY(sl_mkdirs(dir));
    sl_tb_writer *w = calloc(1, sizeof *w);
    if (!w) return sl_fail(SL_ERR_NOMEM, "tensorboard: out of memory");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    double now = wall_now();
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d.suanli", dir, (long long)now, host,
             (int)getpid());
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        sl_status st = sl_fail(SL_ERR_IO, "cannot write %s", w->path);
        free(w);
        return st;
    }
    pb ev = {.n = 0};
    event_head(&ev, now, 0);
    pb_len(&ev, 3, "brain.Event:2", 13);
    sl_status st = write_record(w, &ev);
    if (st == SL_OK) st = sl_tb_writer_flush(w);
    if (st != SL_OK) { /* no half-written event file left behind */
        fclose(w->f);
        remove(w->path);
        free(w);
        return st;
    }
    *out = w;
    return SL_OK;
}

sl_status sl_tb_writer_scalar(sl_tb_writer *w, int64_t step, double wall_time, const char *tag, float value) {
    size_t tl = strlen(tag);
    if (tl > 200) return sl_fail(SL_ERR_INVALID, "tensorboard: tag too long: %.40s...", tag);
    pb val = {.n = 0}, sum = {.n = 0}, ev = {.n = 0};
    uint32_t fb;
    memcpy(&fb, &value, 4);
    pb_len(&val, 1, tag, tl); /* Summary.Value: tag = 1, simple_value = 2 (float) */
    pb_fixed32(&val, 2, fb);
    pb_len(&sum, 1, val.b, val.n); /* Summary: value = 1 (repeated) */
    event_head(&ev, wall_time > 0 ? wall_time : wall_now(), step);
    pb_len(&ev, 5, sum.b, sum.n);
    return write_record(w, &ev);
}

/* Event.session_log = 6 (SessionLog: status = 1, enum SessionStatus {STATUS_UNSPECIFIED, START, STOP,
 * CHECKPOINT}). tensorboard's event accumulator (_CheckForRestartAndMaybePurge) purges, on a START event,
 * every event it holds with a step >= the START event's step. */
sl_status sl_tb_writer_session_start(sl_tb_writer *w, int64_t step, double wall_time) {
    pb sl = {.n = 0}, ev = {.n = 0};
    pb_key(&sl, 1, 0);
    pb_varint(&sl, 1); /* START */
    event_head(&ev, wall_time > 0 ? wall_time : wall_now(), step);
    pb_len(&ev, 6, sl.b, sl.n);
    return write_record(w, &ev);
}

sl_status sl_tb_writer_flush(sl_tb_writer *w) {
    if (fflush(w->f) != 0) return sl_fail(SL_ERR_IO, "%s: write failed", w->path);
    return SL_OK;
}

const char *sl_tb_writer_path(const sl_tb_writer *w) { return w->path; }

void sl_tb_writer_close(sl_tb_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w);
}
