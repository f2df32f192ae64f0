/* suanli plot: metrics.jsonl files -> one self-contained SVG (train loss, val loss, tokens/s, learning
 * rate; runs overlaid; for MoE runs a third row: each expert's share of the routed tokens over time (the
 * first MoE run; one line per expert) and the dropped-token fraction). No fonts or scripts are
 * referenced: text uses the generic sans-serif family. */
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "suanli/metrics.h"

enum { P_LOSS, P_VAL, P_TPS, P_LR, P_DROP, P_COUNT };
static const char *const panel_title[P_COUNT] = {"train loss", "val loss", "tokens/s", "learning rate",
                                                 "MoE dropped-token fraction"};
static const char *const panel_key[P_COUNT] = {"loss", "val_loss", "tokens_per_s", "lr", "moe_dropped_frac"};
enum { MAX_PLOT_EXPERTS = 64 }; /* experts drawn in the load panel */
_Static_assert(sizeof panel_title / sizeof panel_title[0] == P_COUNT, "panel_title");
_Static_assert(sizeof panel_key / sizeof panel_key[0] == P_COUNT, "panel_key");

/* tab10: distinct on white, in print and for the common color-vision deficiencies */
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

typedef struct {
    double *x, *y;
    int n, cap;
} series;

typedef struct {
    const char *name;
    series s[P_COUNT];
    series load[MAX_PLOT_EXPERTS]; /* moe_load: each expert's share of the step's routed tokens */
    int n_experts;
} run;

static sl_status series_push(series *s, double x, double y) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (nx) s->x = nx;
        double *ny = nx ? realloc(s->y, cap * sizeof *ny) : NULL;
        if (!ny) return sl_fail(SL_ERR_NOMEM, "plot: out of memory");
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return SL_OK;
}

static void run_free(run *r) {
    for (int p = 0; p < P_COUNT; p++) {
        free(r->s[p].x);
        free(r->s[p].y);
    }
    for (int e = 0; e < MAX_PLOT_EXPERTS; e++) {
        free(r->load[e].x);
        free(r->load[e].y);
    }
}

/* "moe_load": [tokens per expert] -> shares */
static sl_status load_push(run *r, double x, const cJSON *a) {
    if (!cJSON_IsArray(a)) return SL_OK;
    int n = cJSON_GetArraySize(a);
    double tot = 0;
    for (int e = 0; e < n; e++) tot += cJSON_GetArrayItem(a, e)->valuedouble;
    if (!(tot > 0)) return SL_OK;
    if (n > MAX_PLOT_EXPERTS) n = MAX_PLOT_EXPERTS;
    if (n > r->n_experts) r->n_experts = n;
    for (int e = 0; e < n; e++)
        SL_TRY(series_push(&r->load[e], x, cJSON_GetArrayItem(a, e)->valuedouble / tot));
    return SL_OK;
}

static sl_status run_read(run *r, const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return sl_fail(SL_ERR_INVALID, "%s: no such run directory", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *text;
    size_t len;
    if (sl_file_read_all(path, &text, &len) != SL_OK)
        return sl_fail(SL_ERR_INVALID, "%s: cannot read (not a --save dir of suanli train?)", path);
    sl_status st = SL_OK;
    int lineno = 0, steps = 0;
    for (char *line = text, *next; line && *line && st == SL_OK; line = next) {
        lineno++;
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (strspn(line, " \t\r") == strlen(line)) continue;
        cJSON *o = cJSON_Parse(line);
        if (!cJSON_IsObject(o)) {
            st = sl_fail(SL_ERR_INVALID, "%s:%d: not a JSON object", path, lineno);
        } else {
            const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
            const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
            /* an evaluation without a step (Note [No steps to run]): val_loss alone */
            const cJSON *val = cJSON_GetObjectItemCaseSensitive(o, "val_loss");
            if (!cJSON_IsNumber(loss) && !(!loss && cJSON_IsNumber(val))) {
                st = sl_fail(SL_ERR_INVALID, "%s:%d: no numeric \"loss\"", path, lineno);
            } else {
                double x = cJSON_IsNumber(step) ? step->valuedouble : steps + 1;
                for (int p = 0; p < P_COUNT && st == SL_OK; p++) {
                    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, panel_key[p]);
                    if (cJSON_IsNumber(v) && isfinite(v->valuedouble))
                        st = series_push(&r->s[p], x, v->valuedouble);
                }
                if (st == SL_OK) st = load_push(r, x, cJSON_GetObjectItemCaseSensitive(o, "moe_load"));
                steps++;
            }
        }
        cJSON_Delete(o);
    }
    free(text);
    if (st == SL_OK && steps == 0) st = sl_fail(SL_ERR_INVALID, "%s: no steps", path);
    return st;
}

/* ---- the SVG text ---- */
typedef struct {
    char *b;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
    if (s->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(s->b ? s->b + s->n : NULL, s->b ? s->cap - s->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            s->oom = 1;
            return;
        }
        if (s->b && s->n + (size_t)k < s->cap) {
            s->n += (size_t)k;
            return;
        }
        size_t cap = s->cap ? s->cap : 1 << 16;
        while (cap <= s->n + (size_t)k) cap *= 2;
        char *nb = realloc(s->b, cap);
        if (!nb) {
            s->oom = 1;
            return;
        }
        s->b = nb;
        s->cap = cap;
    }
}

static void sb_text(sbuf *s, const char *t) { /* XML-escaped */
    for (; *t; t++) {
        switch (*t) {
        case '&':
            sb_printf(s, "&amp;");
            break;
        case '<':
            sb_printf(s, "&lt;");
            break;
        case '>':
            sb_printf(s, "&gt;");
            break;
        case '"':
            sb_printf(s, "&quot;");
            break;
        default:
            sb_printf(s, "%c", *t);
        }
    }
}

/* Note [Nice ticks]: about five ticks at 1, 2 or 5 times a power of ten, the axis widened to whole ticks
 * (Heckbert, "Nice numbers for graph labels", Graphics Gems, 1990). */
typedef struct {
    double lo, hi, step;
    int decimals; /* -1: exponent notation */
} axis;

static axis nice_axis(double mn, double mx, int want) {
    axis a;
    double big = fmax(fabs(mn), fabs(mx));
    if (!isfinite(mx - mn)) { /* the range overflows: the same axis on values scaled into range */
        a = nice_axis(mn / big, mx / big, want);
        a.lo = fmax(a.lo * big, -DBL_MAX);
        a.hi = fmin(a.hi * big, DBL_MAX);
        a.step *= big;
        a.decimals = -1;
        return a;
    }
    if (!(mx > mn) || !((mx - mn) / want >= DBL_MIN)) { /* one value, or a range whose step underflows */
        double d = big > 0 && big * 0.1 >= DBL_MIN * want ? big * 0.1 : 1;
        mn -= d;
        mx += d;
    }
    double raw = (mx - mn) / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    a.step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    a.lo = floor(mn / a.step + 1e-9) * a.step;
    a.hi = ceil(mx / a.step - 1e-9) * a.step;
    int d = (int)-floor(log10(a.step) + 1e-9);
    a.decimals = d < 0 ? 0 : d;
    if (a.decimals > 6 || fmax(fabs(a.lo), fabs(a.hi)) >= 1e7) a.decimals = -1;
    return a;
}

static void tick_label(const axis *a, double v, char *buf, size_t n) {
    if (fabs(v) < a->step * 1e-6) v = 0;
    if (a->decimals < 0) { /* as many significant digits as tell the ticks apart */
        double big = fmax(fabs(a->lo), fabs(a->hi));
        int digits = (int)(floor(log10(big)) - floor(log10(a->step) + 1e-9)) + 1;
        snprintf(buf, n, "%.*e", digits < 1 ? 0 : digits > 8 ? 7 : digits - 1, v);
    } else
        snprintf(buf, n, "%.*f", a->decimals, v);
}

enum { W = 1000, PANEL_W = 500, PANEL_H = 300, ML = 78, MR = 22, MT = 34, MB = 46 };

/* where v lies on the axis, 0 at lo and 1 at hi; halved first, so that no difference of finite values
 * overflows */
static double frac(double v, const axis *a) { return (v / 2 - a->lo / 2) / (a->hi / 2 - a->lo / 2); }

/* tick k: lo + k step, also where k step alone would overflow (the same value otherwise: halving is exact) */
static double tick_at(const axis *a, int k) { return 2 * (a->lo / 2 + k * (a->step / 2)); }

/* one panel: series ser[0..n) (colour i: run i, or expert i), on the shared step axis */
static void draw_panel(sbuf *s, const series *const *ser, int n, const char *title, double ox, double oy,
                       const axis *ax) {
    double x0 = ox + ML, y0 = oy + MT, pw = PANEL_W - ML - MR, ph = PANEL_H - MT - MB;
    int has = 0;
    double mn = INFINITY, mx = -INFINITY;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < ser[r]->n; i++) {
            mn = fmin(mn, ser[r]->y[i]);
            mx = fmax(mx, ser[r]->y[i]);
            has = 1;
        }
    sb_printf(s, "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"15\" font-weight=\"bold\">", x0, oy + 22);
    sb_text(s, title);
    sb_printf(s, "</text>\n");
    sb_printf(
        s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fcfcfc\" stroke=\"#444\"/>\n",
        x0, y0, pw, ph);
    if (!has) {
        sb_printf(s,
                  "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" fill=\"#888\" text-anchor=\"middle\">no "
                  "data</text>\n</g>\n",
                  x0 + pw / 2, y0 + ph / 2);
        return;
    }
    axis ay = nice_axis(mn, mx, 5);
    char lb[64];
#define SX(v) (x0 + frac(v, ax) * pw)
#define SY(v) (y0 + ph - frac(v, &ay) * ph)
    /* at most 100 ticks: a range that overflows (or a step that underflows) gives no finite step */
    for (int k = 0; k <= 100; k++) { /* y grid, ticks and labels */
        double v = tick_at(&ay, k);
        if (v > ay.hi + ay.step * 1e-6) break;
        double y = SY(v);
        tick_label(&ay, v, lb, sizeof lb);
        sb_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", x0, y,
                  x0 + pw, y);
        sb_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n", x0 - 5, y,
                  x0, y);
        sb_printf(s, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">%s</text>\n", x0 - 8,
                  y + 4, lb);
    }
    for (int k = 0; k <= 100; k++) { /* x grid, ticks and labels */
        double v = tick_at(ax, k);
        if (v > ax->hi + ax->step * 1e-6) break;
        double x = SX(v);
        tick_label(ax, v, lb, sizeof lb);
        sb_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", x, y0, x,
                  y0 + ph);
        sb_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n", x, y0 + ph,
                  x, y0 + ph + 5);
        sb_printf(s, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n", x,
                  y0 + ph + 19, lb);
    }
    sb_printf(s, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">step</text>\n",
              x0 + pw / 2, y0 + ph + 38);
    for (int r = 0; r < n; r++) {
        const series *d = ser[r];
        if (!d->n) continue;
        const char *c = palette[r % (int)(sizeof palette / sizeof palette[0])];
        sb_printf(
            s,
            "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"",
            c);
        for (int i = 0; i < d->n; i++) sb_printf(s, "%s%.1f,%.1f", i ? " " : "", SX(d->x[i]), SY(d->y[i]));
        sb_printf(s, "\"/>\n");
        if (d->n <= 60) /* sparse series (val loss): mark the points */
            for (int i = 0; i < d->n; i++)
                sb_printf(s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.8\" fill=\"%s\"/>\n", SX(d->x[i]),
                          SY(d->y[i]), c);
    }
#undef SX
#undef SY
    sb_printf(s, "</g>\n");
}

static char *svg_render(const run *runs, int n_runs, const char *title) {
    sbuf s = {0};
    int per_row = 3, rows = (n_runs + per_row - 1) / per_row;
    const run *moe = NULL; /* the first run with an expert-load series */
    for (int r = 0; r < n_runs && !moe; r++)
        if (runs[r].n_experts > 0) moe = &runs[r];
    double head = 44 + 20.0 * rows, H = head + (moe ? 3 : 2) * PANEL_H;
    double xmin = INFINITY, xmax = -INFINITY; /* one step axis for every panel */
    for (int r = 0; r < n_runs; r++)
        for (int p = 0; p < P_COUNT; p++)
            for (int i = 0; i < runs[r].s[p].n; i++) {
                xmin = fmin(xmin, runs[r].s[p].x[i]);
                xmax = fmax(xmax, runs[r].s[p].x[i]);
            }
    axis ax = nice_axis(xmin, xmax, 6);
    if (ax.decimals > 0 && ax.step < 1) { /* steps are integers */
        ax = (axis){floor(xmin), ceil(xmax), 1, 0};
        if (!(ax.hi > ax.lo)) ax.lo -= 1, ax.hi += 1; /* one step: in the middle */
    }
    sb_printf(
        &s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\" "
        "font-family=\"sans-serif\">\n",
        W, H, W, H);
    sb_printf(&s, "<rect width=\"%d\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W, H);
    sb_printf(&s, "<text x=\"%d\" y=\"28\" font-size=\"18\" font-weight=\"bold\" text-anchor=\"middle\">",
              W / 2);
    sb_text(&s, title);
    sb_printf(&s, "</text>\n<g>\n");
    for (int r = 0; r < n_runs; r++) { /* legend */
        double lx = ML + (r % per_row) * 300.0, ly = 50 + 20.0 * (r / per_row);
        const char *c = palette[r % (int)(sizeof palette / sizeof palette[0])];
        sb_printf(
            &s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n",
            lx, ly - 4, lx + 24, ly - 4, c);
        sb_printf(&s, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">", lx + 30, ly);
        sb_text(&s, runs[r].name);
        sb_printf(&s, "</text>\n");
    }
    sb_printf(&s, "</g>\n");
    const series *ser[MAX_PLOT_EXPERTS > 64 ? MAX_PLOT_EXPERTS : 64];
    for (int p = 0; p < P_LR + 1; p++) { /* the 2 x 2 panels; runs overlaid */
        for (int r = 0; r < n_runs && r < 64; r++) ser[r] = &runs[r].s[p];
        draw_panel(&s, ser, n_runs < 64 ? n_runs : 64, panel_title[p], (p % 2) * PANEL_W,
                   head + (p / 2) * PANEL_H, &ax);
    }
    if (moe) { /* the MoE row: expert load of the first MoE run, dropped fraction of every run */
        char t[1200];
        snprintf(t, sizeof t, "expert load share (%s)", moe->name);
        for (int e = 0; e < moe->n_experts; e++) ser[e] = &moe->load[e];
        draw_panel(&s, ser, moe->n_experts, t, 0, head + 2 * PANEL_H, &ax);
        int nk = moe->n_experts < 16 ? moe->n_experts : 16; /* expert key, inside the box's top right */
        for (int e = 0; e < nk; e++)
            sb_printf(&s, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"%s\">e%d</text>\n",
                      (double)(PANEL_W - MR - 22 * (nk - e)), head + 2 * PANEL_H + MT + 13.0,
                      palette[e % (int)(sizeof palette / sizeof palette[0])], e);
        for (int r = 0; r < n_runs && r < 64; r++) ser[r] = &runs[r].s[P_DROP];
        draw_panel(&s, ser, n_runs < 64 ? n_runs : 64, panel_title[P_DROP], PANEL_W, head + 2 * PANEL_H, &ax);
    }
    sb_printf(&s, "</svg>\n");
    if (s.oom) {
        free(s.b);
        return NULL;
    }
    return s.b;
}

sl_status sl_plot_runs(const char *const *run_dirs, int n_runs, const sl_plot_opts *opts, char *written,
                       size_t cap) {
    if (n_runs < 1) return sl_fail(SL_ERR_INVALID, "plot: no run directories given");
    sl_plot_opts o = opts ? *opts : (sl_plot_opts){0};
    run *runs = calloc((size_t)n_runs, sizeof *runs);
    if (!runs) return sl_fail(SL_ERR_NOMEM, "plot: out of memory");
    sl_status st = SL_OK;
    char out[4200], title[1024];
    char *svg = NULL;
    for (int r = 0; r < n_runs && st == SL_OK; r++) {
        runs[r].name = run_dirs[r];
        st = run_read(&runs[r], run_dirs[r]);
    }
    if (st != SL_OK) goto done;
    if (o.output)
        snprintf(out, sizeof out, "%s", o.output);
    else if (n_runs == 1)
        snprintf(out, sizeof out, "%s/loss.svg", run_dirs[0]);
    else
        snprintf(out, sizeof out, "loss.svg");
    struct stat osb, isb; /* --output naming an input would replace it */
    for (int r = 0; r < n_runs && stat(out, &osb) == 0; r++) {
        char in[4200];
        snprintf(in, sizeof in, "%s/metrics.jsonl", run_dirs[r]);
        if (stat(in, &isb) == 0 && isb.st_dev == osb.st_dev && isb.st_ino == osb.st_ino) {
            st = sl_fail(SL_ERR_INVALID, "--output: %s is the input %s", out, in);
            goto done;
        }
    }
    if (!o.title) {
        size_t k = (size_t)snprintf(title, sizeof title, "suanli:");
        for (int r = 0; r < n_runs && k < sizeof title; r++)
            k += (size_t)snprintf(title + k, sizeof title - k, "%s%s", r ? ", " : " ", run_dirs[r]);
        o.title = title;
    }
    svg = svg_render(runs, n_runs, o.title);
    if (!svg) {
        st = sl_fail(SL_ERR_NOMEM, "plot: out of memory");
        goto done;
    }
    if (sl_file_write_atomic(out, svg, strlen(svg)) != SL_OK) {
        st = sl_fail(SL_ERR_INVALID, "--output: %s", sl_errmsg());
        goto done;
    }
    if (written) snprintf(written, cap, "%s", out);
done:
    free(svg);
    for (int r = 0; r < n_runs; r++) run_free(&runs[r]);
    free(runs);
    return st;
}
