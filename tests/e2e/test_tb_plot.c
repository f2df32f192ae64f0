/* `suanli train --tensorboard-dir` and `suanli plot` end to end (issue 20 item 7).
 *
 * TensorBoard: the run recorded in tests/fixtures/tb/scalars.json (scripts/gen_tb_fixture.py: a tiny
 * fixed-seed run, one thread, SUANLI_ISA=avx2) is repeated; the event file is read back with this file's own
 * TFRecord + protobuf parser (every length and payload CRC32C checked; the first event is file_version
 * "brain.Event:2") and compared
 *   - with metrics.jsonl of the same run: the JSON has %.6f / %.6e / %.1f text, so the tolerance is half its
 *     last digit plus float32 rounding (loss, val loss, grad norm: 5e-7 + 1e-6*|v|; lr: 1e-6*|v|;
 *     tokens/s: 0.05 + 1e-6*|v|);
 *   - with the fixture (what tensorboard's EventAccumulator read from the script's run): float32 values
 *     exactly equal (same seed, threads and ISA), same steps; tokens-per-sec is wall-clock and only checked
 *     to exist.
 * Plot: exit codes, a well-formed SVG (starts with <svg, every emitted element closed in order, one
 * polyline per run and panel, the title XML-escaped), default output paths, and every bad-input path
 * (one line, exit 2, nothing written). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "suanli/base.h"
#include "suanli/metrics.h"
#include "testutil.h"

static char out[1 << 16];
static char dir[512];

#define run(...) tu_cli_run(out, sizeof out, __VA_ARGS__)

#define TINY_TB                                                                                              \
    "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "          \
    "--lr-decay-iters 8 --eval-interval 0 --eval-iters 1 --threads 1"

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static int one_line(void) {
    size_t n = strlen(out);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += out[i] == '\n';
    return lines == 1 && n > 0 && out[n - 1] == '\n';
}

/* ---- our own reader: CRC32C bit by bit (independent of the library's table) ---- */
static uint32_t crc32c_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}
static uint32_t masked(const unsigned char *p, size_t n) {
    uint32_t c = crc32c_bitwise(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static int varint(const unsigned char **p, const unsigned char *end, uint64_t *v) {
    *v = 0;
    for (int s = 0; *p < end && s < 64; s += 7) {
        unsigned char b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) return 1;
    }
    return 0;
}

typedef struct {
    char tag[64];
    int64_t step;
    float value;
} scalar;

typedef struct {
    scalar *s;
    int n, cap, records, bad_crc, bad_pb;
    char first_version[64];
    int starts, start_record; /* SessionLog START events (Event.session_log = 6, status = 1 START) */
    int64_t start_step;       /* the last one's step, and its record index (1-based) */
} events;

/* One protobuf field: returns 0 on malformed input. For wire 2, *sub points at the payload of v bytes. */
static int pb_field(const unsigned char **p, const unsigned char *end, int *field, int *wire, uint64_t *v,
                    const unsigned char **sub) {
    uint64_t key;
    if (!varint(p, end, &key)) return 0;
    *field = (int)(key >> 3);
    *wire = (int)(key & 7);
    switch (*wire) {
    case 0:
        return varint(p, end, v);
    case 1:
        if (end - *p < 8) return 0;
        *v = le(*p, 8), *p += 8;
        return 1;
    case 5:
        if (end - *p < 4) return 0;
        *v = le(*p, 4), *p += 4;
        return 1;
    case 2:
        if (!varint(p, end, v) || (uint64_t)(end - *p) < *v) return 0;
        *sub = *p, *p += *v;
        return 1;
    default:
        return 0;
    }
}

static void parse_event(events *ev, const unsigned char *p, const unsigned char *end) {
    int64_t step = 0;
    const unsigned char *sum = NULL, *sumend = NULL;
    while (p < end) {
        int f, w;
        uint64_t v;
        const unsigned char *sub = NULL;
        if (!pb_field(&p, end, &f, &w, &v, &sub)) {
            ev->bad_pb++;
            return;
        }
        if (f == 2 && w == 0) step = (int64_t)v;
        if (f == 3 && w == 2 && ev->records == 1)
            snprintf(ev->first_version, sizeof ev->first_version, "%.*s", (int)v, sub);
        if (f == 5 && w == 2) sum = sub, sumend = sub + v;
        if (f == 6 && w == 2) { /* SessionLog: status = 1 (varint) */
            const unsigned char *q = sub, *qend = sub + v;
            while (q < qend) {
                int f2, w2;
                uint64_t v2;
                const unsigned char *t = NULL;
                if (!pb_field(&q, qend, &f2, &w2, &v2, &t)) {
                    ev->bad_pb++;
                    return;
                }
                if (f2 == 1 && w2 == 0 && v2 == 1)
                    ev->starts++, ev->start_record = ev->records, ev->start_step = -1;
            }
        }
    }
    if (ev->start_record == ev->records && ev->start_step == -1) ev->start_step = step;
    while (sum && sum < sumend) { /* Summary.value (1) -> Value{tag 1, simple_value 2} */
        int f, w;
        uint64_t v;
        const unsigned char *val = NULL;
        if (!pb_field(&sum, sumend, &f, &w, &v, &val) || f != 1 || w != 2) {
            ev->bad_pb++;
            return;
        }
        const unsigned char *q = val, *qend = val + v;
        scalar s = {.step = step};
        while (q < qend) {
            int f2, w2;
            uint64_t v2;
            const unsigned char *t = NULL;
            if (!pb_field(&q, qend, &f2, &w2, &v2, &t)) {
                ev->bad_pb++;
                return;
            }
            if (f2 == 1 && w2 == 2) snprintf(s.tag, sizeof s.tag, "%.*s", (int)v2, t);
            if (f2 == 2 && w2 == 5) {
                uint32_t b = (uint32_t)v2;
                memcpy(&s.value, &b, 4);
            }
        }
        if (ev->n == ev->cap) {
            ev->cap = ev->cap ? 2 * ev->cap : 64;
            ev->s = realloc(ev->s, ev->cap * sizeof *ev->s);
        }
        ev->s[ev->n++] = s;
    }
}

static void read_events(const char *path, events *ev) {
    char *buf = NULL;
    size_t n = 0;
    memset(ev, 0, sizeof *ev);
    TU_CHECK(sl_file_read_all(path, &buf, &n) == SL_OK, "read %s", path);
    const unsigned char *p = (const unsigned char *)buf, *end = p + n;
    while (p < end) {
        if (end - p < 12) {
            ev->bad_crc++;
            break;
        }
        uint64_t len = le(p, 8);
        if (masked(p, 8) != (uint32_t)le(p + 8, 4) || (uint64_t)(end - p - 12) < len + 4) {
            ev->bad_crc++;
            break;
        }
        const unsigned char *d = p + 12;
        if (masked(d, len) != (uint32_t)le(d + len, 4)) ev->bad_crc++;
        ev->records++;
        parse_event(ev, d, d + len);
        p = d + len + 4;
    }
    free(buf);
}

static int find_event_file(const char *tbdir, char *path, size_t cap) {
    DIR *d = opendir(tbdir);
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, "tfevents")) snprintf(path, cap, "%s/%s", tbdir, e->d_name), found++;
    if (d) closedir(d);
    return found;
}

/* the scalars of `tag`, in file order */
static int tag_values(const events *ev, const char *tag, int64_t *steps, float *vals, int cap) {
    int k = 0;
    for (int i = 0; i < ev->n; i++)
        if (!strcmp(ev->s[i].tag, tag) && k < cap) steps[k] = ev->s[i].step, vals[k++] = ev->s[i].value;
    return k;
}

/* A resume writes a SessionLog START at its first step (TensorBoard then purges the dead attempt's events
 * from that step on): an 8-step run with checkpoints at 4 and 8, rewound to step 4 (--load RUN/step-4
 * --save RUN) for 2 more steps: its event file (CRCs valid) has START at step 5 right after the
 * file_version record, then its own scalars of steps 5 and 6; the fresh run's file has no START. */
static void test_tb_resume(const char *data) {
    int rc = run("train --data-path %s " TINY_TB " --train-iters 8 --save %s/tbr --save-interval 4 "
                 "--tensorboard-dir %s/tbr_tb",
                 data, dir, dir);
    TU_CHECK(rc == 0, "train: %s", out);
    rc = run("train --data-path %s " TINY_TB " --train-iters 6 --save %s/tbr --load %s/tbr/step-0000004 "
             "--save-interval 4 --tensorboard-dir %s/tbr_tb",
             data, dir, dir, dir);
    TU_CHECK(rc == 0 && strstr(out, "at step 4"), "resume: %s", out);
    char tbdir[600];
    snprintf(tbdir, sizeof tbdir, "%s/tbr_tb", dir);
    DIR *d = opendir(tbdir);
    int files = 0, fresh = 0, resumed = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strstr(e->d_name, "tfevents")) continue;
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", tbdir, e->d_name);
        events ev;
        read_events(path, &ev);
        files++;
        int64_t st[64];
        float va[64];
        int n = tag_values(&ev, "lm loss", st, va, 64);
        TU_CHECK(ev.bad_crc == 0 && ev.bad_pb == 0, "%s: bad crc %d, bad protobuf %d", path, ev.bad_crc,
                 ev.bad_pb);
        if (n == 8 && st[0] == 1) {
            fresh++;
            TU_CHECK(ev.starts == 0, "the fresh run wrote %d SessionLog START", ev.starts);
        } else {
            resumed++;
            TU_CHECK(n == 2 && st[0] == 5 && st[1] == 6, "resumed run: %d 'lm loss' events from step %lld", n,
                     (long long)(n ? st[0] : -1));
            TU_CHECK(ev.starts == 1 && ev.start_step == 5 && ev.start_record == 2,
                     "resumed run: %d START events, step %lld, record %d (want 1, 5, 2)", ev.starts,
                     (long long)ev.start_step, ev.start_record);
        }
        free(ev.s);
    }
    if (d) closedir(d);
    TU_CHECK(files == 2 && fresh == 1 && resumed == 1, "%d event files: %d fresh, %d resumed", files, fresh,
             resumed);
}

static void test_tensorboard(const char *data, const cJSON *fx) {
    const char *args = cJSON_GetObjectItem(fx, "args")->valuestring;
    const cJSON *env = cJSON_GetObjectItem(fx, "env");
    for (const cJSON *e = env ? env->child : NULL; e; e = e->next) setenv(e->string, e->valuestring, 1);
    int rc = run("train --data-path %s %s --save %s/tbrun --tensorboard-dir %s/tb", data, args, dir, dir);
    TU_CHECK(rc == 0, "train --tensorboard-dir: %s", out);
    unsetenv("SUANLI_ISA");
    char tbdir[600], ev_path[1200];
    snprintf(tbdir, sizeof tbdir, "%s/tb", dir);
    TU_CHECK(find_event_file(tbdir, ev_path, sizeof ev_path) == 1, "one event file in %s", tbdir);
    events ev;
    read_events(ev_path, &ev);
    TU_CHECK(ev.bad_crc == 0 && ev.bad_pb == 0 && ev.records > 1, "records %d, bad crc %d, bad protobuf %d",
             ev.records, ev.bad_crc, ev.bad_pb);
    TU_CHECK(!strcmp(ev.first_version, "brain.Event:2"), "first event file_version '%s'", ev.first_version);

    /* against metrics.jsonl */
    char mp[700], *mtext = NULL;
    size_t mlen;
    snprintf(mp, sizeof mp, "%s/tbrun/metrics.jsonl", dir);
    TU_CHECK(sl_file_read_all(mp, &mtext, &mlen) == SL_OK, "read %s", mp);
    static const struct {
        const char *tag, *key;
        double atol, rtol;
    } map[] = {{"lm loss", "loss", 5e-7, 1e-6},
               {"lm loss validation", "val_loss", 5e-7, 1e-6},
               {"learning-rate", "lr", 0, 1e-6},
               {"grad-norm", "grad_norm", 5e-7, 1e-6},
               {"tokens-per-sec", "tokens_per_s", 0.05, 1e-6}};
    int64_t st[64];
    float va[64];
    for (size_t m = 0; m < sizeof map / sizeof map[0]; m++) {
        int n = tag_values(&ev, map[m].tag, st, va, 64), k = 0, lines = 0;
        char *copy = strdup(mtext ? mtext : "");
        for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
            cJSON *o = cJSON_Parse(line);
            const cJSON *v = cJSON_GetObjectItem(o, map[m].key), *s = cJSON_GetObjectItem(o, "step");
            lines++;
            if (v && k < n) {
                double want = v->valuedouble, err = fabs(va[k] - want);
                TU_CHECK(st[k] == (int64_t)s->valuedouble && err <= map[m].atol + map[m].rtol * fabs(want),
                         "%s event %d: step %lld value %.9g; metrics.jsonl step %d %s %.9g (err %.3g)",
                         map[m].tag, k, (long long)st[k], va[k], (int)s->valuedouble, map[m].key, want, err);
            }
            k += v != NULL;
            cJSON_Delete(o);
        }
        free(copy);
        TU_CHECK(k == n && n > 0, "%s: %d events, %d metrics.jsonl values (%d lines)", map[m].tag, n, k,
                 lines);
    }
    free(mtext);

    /* against the fixture: exact */
    const cJSON *sc = cJSON_GetObjectItem(fx, "scalars");
    for (const cJSON *t = sc ? sc->child : NULL; t; t = t->next) {
        int n = tag_values(&ev, t->string, st, va, 64), want = cJSON_GetArraySize(t), i = 0;
        TU_CHECK(n == want, "%s: %d events, fixture has %d", t->string, n, want);
        for (const cJSON *pair = t->child; pair && i < n; pair = pair->next, i++) {
            int64_t fs = (int64_t)cJSON_GetArrayItem(pair, 0)->valuedouble;
            float fv = (float)cJSON_GetArrayItem(pair, 1)->valuedouble;
            TU_CHECK(st[i] == fs && va[i] == fv,
                     "%s [%d]: step %lld value %.9g; fixture step %lld value %.9g", t->string, i,
                     (long long)st[i], va[i], (long long)fs, fv);
        }
    }
    const cJSON *tags = cJSON_GetObjectItem(fx, "all_tags");
    for (const cJSON *t = tags ? tags->child : NULL; t; t = t->next)
        TU_CHECK(tag_values(&ev, t->valuestring, st, va, 64) > 0,
                 "tag '%s' (EventAccumulator saw it) missing", t->valuestring);
    free(ev.s);

    /* the reader notices a flipped payload byte */
    char *buf;
    size_t n;
    TU_CHECK(sl_file_read_all(ev_path, &buf, &n) == SL_OK, "reread");
    buf[n - 6] ^= 1;
    char bad[700];
    snprintf(bad, sizeof bad, "%s/corrupt.tfevents", dir);
    TU_CHECK(sl_file_write_atomic(bad, buf, n) == SL_OK, "write corrupt copy");
    free(buf);
    read_events(bad, &ev);
    TU_CHECK(ev.bad_crc == 1, "flipped byte: %d bad CRCs", ev.bad_crc);
    free(ev.s);

    /* the library's CRC32C: the standard check value and our bitwise one */
    TU_CHECK(sl_crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c check value %08x",
             sl_crc32c(0, "123456789", 9));
    TU_CHECK(sl_crc32c_masked("brain.Event:2", 13) == masked((const unsigned char *)"brain.Event:2", 13),
             "mask");

    /* an unusable --tensorboard-dir is bad input */
    rc = run("train --data-path %s %s --tensorboard-dir %s/tbrun/metrics.jsonl/x", data, args, dir);
    TU_CHECK(rc == 2 && strstr(out, "--tensorboard-dir") && one_line(), "bad --tensorboard-dir: %d %s", rc,
             out);
}

/* ---- SVG checks ---- */
static int count(const char *s, const char *needle) {
    int k = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) k++;
    return k;
}

/* Starts with <svg, ends with </svg>; every element opened is closed in order (or self-closed). */
static int well_formed(const char *s, char *why, size_t cap) {
    if (strncmp(s, "<svg", 4) != 0) return snprintf(why, cap, "does not start with <svg"), 0;
    char stack[64][16];
    int depth = 0;
    for (const char *p = strchr(s, '<'); p; p = strchr(p + 1, '<')) {
        const char *gt = strchr(p, '>');
        if (!gt) return snprintf(why, cap, "unterminated tag"), 0;
        int close = p[1] == '/', self = gt[-1] == '/';
        const char *name = p + 1 + close;
        size_t len = strcspn(name, " />");
        if (len == 0 || len >= 16) return snprintf(why, cap, "bad tag name at %.20s", p), 0;
        if (close) {
            if (!depth || strncmp(stack[depth - 1], name, len) || stack[depth - 1][len])
                return snprintf(why, cap, "</%.*s> closes %s", (int)len, name,
                                depth ? stack[depth - 1] : "nothing"),
                       0;
            depth--;
        } else if (!self) {
            if (depth == 64) return snprintf(why, cap, "too deep"), 0;
            snprintf(stack[depth++], 16, "%.*s", (int)len, name);
        }
        if (memchr(p + 1, '<', (size_t)(gt - p - 1))) return snprintf(why, cap, "'<' inside a tag"), 0;
        if (!strncmp(name, "script", 6) || strstr(name, "href"))
            return snprintf(why, cap, "external reference"), 0;
    }
    if (depth) return snprintf(why, cap, "<%s> never closed", stack[depth - 1]), 0;
    size_t n = strlen(s);
    if (n < 7 || strcmp(s + n - 7, "</svg>\n")) return snprintf(why, cap, "does not end with </svg>"), 0;
    return 1;
}

static void check_svg(const char *path, int polylines, const char *needle) {
    char *svg = NULL, why[200] = "";
    size_t n;
    TU_CHECK(sl_file_read_all(path, &svg, &n) == SL_OK, "read %s", path);
    if (!svg) return;
    TU_CHECK(well_formed(svg, why, sizeof why), "%s: %s", path, why);
    TU_CHECK(count(svg, "<polyline") == polylines, "%s: %d polylines, want %d", path, count(svg, "<polyline"),
             polylines);
    TU_CHECK(!strstr(svg, "href") && !strstr(svg, "@import") && !strstr(svg, "url("),
             "%s: external references", path);
    const char *labels[] = {"train loss", "val loss", "tokens/s", "learning rate", ">step<"};
    for (int i = 0; i < 5; i++) TU_CHECK(strstr(svg, labels[i]), "%s: no '%s'", path, labels[i]);
    if (needle) TU_CHECK(strstr(svg, needle), "%s: lacks %s", path, needle);
    free(svg);
}

static void write_text(const char *path, const char *text) {
    TU_CHECK(sl_file_write_atomic(path, text, strlen(text)) == SL_OK, "write %s", path);
}

static void bad(const char *what, int rc, const char *needle, const char *must_not_exist) {
    TU_CHECK(rc == 2, "%s: exit %d (want 2): %s", what, rc, out);
    TU_CHECK(strstr(out, needle) != NULL, "%s: message lacks '%s': %s", what, needle, out);
    TU_CHECK(one_line(), "%s: not one line: %s", what, out);
    if (must_not_exist) TU_CHECK(!exists(must_not_exist), "%s: %s was written", what, must_not_exist);
    TU_CHECK(tu_unchanged(), "%s: the run changed the test dir", what); /* tu_watch(dir) in main */
}

static void test_plot(void) {
    char run1[600], run2[600], p[1400], cmd[2048];
    snprintf(run1, sizeof run1, "%s/tbrun", dir);
    snprintf(run2, sizeof run2, "%s/run2", dir);
    /* one run, default output */
    int rc = run("plot %s", run1);
    snprintf(p, sizeof p, "%s/loss.svg", run1);
    TU_CHECK(rc == 0 && strstr(out, p), "plot one run: %d %s", rc, out);
    check_svg(p, 4, run1);
    /* a second run made by hand: all panels, odd values (steps out of order are drawn as given) */
    TU_CHECK(sl_mkdirs(run2) == SL_OK, "mkdir");
    snprintf(p, sizeof p, "%s/metrics.jsonl", run2);
    write_text(p,
               "{\"step\": 1, \"loss\": 6.0, \"lr\": 1e-4, \"tokens_per_s\": 1000.0}\n"
               "\n"
               "{\"step\": 2, \"loss\": 5.0, \"lr\": 2e-4, \"tokens_per_s\": 1200.0, \"val_loss\": 5.5}\n"
               "{\"step\": 3, \"loss\": 4.0, \"lr\": 3e-4, \"tokens_per_s\": 1100.0, \"val_loss\": 4.5}\n");
    snprintf(p, sizeof p, "%s/cmp.svg", dir);
    rc = run("plot %s %s --output %s --title 'a & <b>'", run1, run2, p);
    TU_CHECK(rc == 0, "plot two runs: %s", out);
    check_svg(p, 8, "a &amp; &lt;b&gt;");
    /* several runs, default: ./loss.svg */
    snprintf(cmd, sizeof cmd, "cd %s && %s plot tbrun run2", dir, tu_cli());
    rc = tu_run(cmd, out, sizeof out);
    snprintf(p, sizeof p, "%s/loss.svg", dir);
    TU_CHECK(rc == 0 && exists(p), "plot in cwd: %d %s", rc, out);
    check_svg(p, 8, ">run2<");
    /* a run without val loss: that panel has no line for it */
    snprintf(p, sizeof p, "%s/run3", dir);
    sl_mkdirs(p);
    snprintf(p, sizeof p, "%s/run3/metrics.jsonl", dir);
    write_text(p, "{\"step\": 1, \"loss\": 3.0, \"lr\": 1e-3, \"tokens_per_s\": 10.0}\n");
    snprintf(p, sizeof p, "%s/run3", dir);
    rc = run("plot %s", p);
    snprintf(p, sizeof p, "%s/run3/loss.svg", dir);
    TU_CHECK(rc == 0, "plot run3: %s", out);
    check_svg(p, 3, "no data");

    /* extreme values (all finite): the axes' range overflows or their step underflows; an SVG, no hang */
    const char *extreme[] = {"{\"step\": 1, \"loss\": 1e308}\n{\"step\": 2, \"loss\": -1e308}\n",
                             "{\"step\": 1, \"loss\": 0}\n{\"step\": 2, \"loss\": 5e-324}\n",
                             "{\"step\": -1e308, \"loss\": 1}\n{\"step\": 1e308, \"loss\": 2}\n"};
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/run3/metrics.jsonl", dir);
        write_text(p, extreme[k]);
        snprintf(cmd, sizeof cmd, "timeout 20 %s plot %s/run3 --output %s/run3/x.svg", tu_cli(), dir, dir);
        rc = tu_run(cmd, out, sizeof out);
        TU_CHECK(rc == 0, "extreme values %d: exit %d: %s", k, rc, out);
        /* every coordinate a number (the range's overflow made them nan; the step's underflow too) */
        char *svg = NULL;
        size_t n;
        snprintf(p, sizeof p, "%s/run3/x.svg", dir);
        TU_CHECK(sl_file_read_all(p, &svg, &n) == SL_OK && svg, "extreme values %d: read %s", k, p);
        if (svg)
            TU_CHECK(!strstr(svg, "nan") && !strstr(svg, "inf") && count(svg, "<polyline") == 1,
                     "extreme values %d: non-finite coordinates or no line in %s", k, p);
        free(svg);
    }

    /* bad input: one line, exit 2, nothing written (no entry under dir created, removed or modified) */
    tu_watch(dir);
    char o[700], bd[600];
    snprintf(o, sizeof o, "%s/never.svg", dir);
    rc = run("plot %s/nope --output %s", dir, o);
    bad("missing dir", rc, "nope", o);
    snprintf(bd, sizeof bd, "%s/bad", dir);
    sl_mkdirs(bd);
    rc = run("plot %s --output %s", bd, o);
    bad("no metrics.jsonl", rc, "metrics.jsonl", o);
    snprintf(p, sizeof p, "%s/metrics.jsonl", bd);
    write_text(p, "{\"step\": 1, \"loss\": 3.0}\n{\"step\": 2, \"loss\": 2.9\n");
    rc = run("plot %s %s --output %s", run1, bd, o);
    bad("malformed line", rc, "metrics.jsonl:2:", o);
    write_text(p, "{\"step\": 1, \"loss\": 3.0}\n[1, 2]\n");
    rc = run("plot %s --output %s", bd, o);
    bad("not an object", rc, "metrics.jsonl:2: not a JSON object", o);
    write_text(p, "{\"step\": 1, \"loss\": \"3.0\"}\n");
    rc = run("plot %s --output %s", bd, o);
    bad("string loss", rc, "metrics.jsonl:1: no numeric \"loss\"", o);
    write_text(p, "\n\n");
    rc = run("plot %s", bd);
    snprintf(o, sizeof o, "%s/loss.svg", bd);
    bad("no steps", rc, "no steps", o);
    rc = run("plot %s --output %s/no/such/dir/x.svg", run1, dir);
    snprintf(p, sizeof p, "--output: %s/no/such/dir/x.svg: %s/no/such/dir/x.svg.tmp.", dir, dir);
    bad("unwritable output", rc, p, NULL);
    snprintf(p, sizeof p, "%s/metrics.jsonl", run1);
    rc = run("plot %s --output %s", run1, p);
    bad("output is an input", rc, "is the input", NULL);
    rc = run("plot %s --colour red", run1);
    bad("unknown flag", rc, "unknown flag --colour", NULL);
    rc = run("plot %s --output", run1);
    bad("missing value", rc, "--output: missing value", NULL);
    rc = run("plot %s --output ''", run1); /* was "--output: : rename failed" */
    bad("empty output", rc, "--output: empty value", NULL);
    rc = run("plot");
    TU_CHECK(rc == 2 && strstr(out, "usage"), "no args: %d %s", rc, out);
    DIR *d = opendir(bd); /* no temp files left behind */
    for (struct dirent *e; d && (e = readdir(d));)
        TU_CHECK(!strstr(e->d_name, ".tmp") && !strstr(e->d_name, ".svg"), "left behind: %s", e->d_name);
    if (d) closedir(d);
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("tbplot"));
    char fp[600], *ftext = NULL, cmd[2048], data[600];
    size_t flen;
    snprintf(fp, sizeof fp, "%s/tests/fixtures/tb/scalars.json", SL_SOURCE_DIR);
    TU_CHECK(sl_file_read_all(fp, &ftext, &flen) == SL_OK, "fixture %s (scripts/gen_tb_fixture.py)", fp);
    cJSON *fx = ftext ? cJSON_Parse(ftext) : NULL;
    free(ftext);
    TU_CHECK(fx && cJSON_IsString(cJSON_GetObjectItem(fx, "args")), "fixture JSON");
    if (!fx) return tu_finish("test_tb_plot");
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(cmd, sizeof cmd, "head -c %d %s/data/tinyshakespeare.txt > %s/small.txt",
             (int)cJSON_GetObjectItem(fx, "corpus_bytes")->valuedouble, SL_SOURCE_DIR, dir);
    TU_CHECK(system(cmd) == 0, "corpus");
    int rc = run("data prepare --input %s/small.txt --output-prefix %s --tokenizer-type byte", dir, data);
    TU_CHECK(rc == 0, "prepare: %s", out);
    test_tensorboard(data, fx);
    test_tb_resume(data);
    test_plot();
    cJSON_Delete(fx);
    return tu_finish("test_tb_plot");
}
