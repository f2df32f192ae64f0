#include <stdarg.h>
#define _GNU_SOURCE
#include "testutil.h"

#include "suanli/base.h"

#include <ftw.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

_Atomic int tu_failures, tu_checks;

int tu_allclose(const char *what, const float *got, const float *ref, int64_t n, float atol, float rtol) {
    int64_t worst = -1, bad = 0;
    double worst_excess = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        double tol = atol + rtol * fabs((double)ref[i]);
        if (!(d <= tol)) { /* catches NaN */
            bad++;
            double ex = isnan(d) ? INFINITY : d - tol;
            if (worst < 0 || ex > worst_excess) worst = i, worst_excess = ex;
        }
    }
    tu_checks++;
    if (bad) {
        tu_failures++;
        fprintf(stderr, "FAIL %s: %lld/%lld elements off; worst [%lld] got %.8g ref %.8g (atol %g rtol %g)\n",
                what, (long long)bad, (long long)n, (long long)worst, got[worst], ref[worst], atol, rtol);
        return 0;
    }
    return 1;
}

double tu_rel_maxdiff(const float *got, const float *ref, int64_t n) {
    double md = 0, mr = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (isnan(d)) return INFINITY;
        if (d > md) md = d;
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return mr > 0 ? md / mr : md;
}

#if defined(__SANITIZE_ADDRESS__)
#define TU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_ASAN 1
#endif
#endif
#ifdef TU_ASAN
#include <sanitizer/lsan_interface.h>
void tu_leak_check_now(void) { __lsan_do_leak_check(); }
#else
void tu_leak_check_now(void) {}
#endif

int tu_finish(const char *name) {
    printf("%s: %d checks, %d failures\n", name, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

static uint64_t g_sig, g_sig_pre;
static size_t g_sig_root;
static char g_watch[1024];

static uint64_t mix(uint64_t h, uint64_t v) { /* FNV-1a over the 8 bytes of v */
    for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    return h;
}

static int sig_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)ftw;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = path + g_sig_root; *p; p++) h = mix(h, (unsigned char)*p);
    h = mix(h, (uint64_t)type);
    h = mix(h, (uint64_t)sb->st_size);
    h = mix(h, (uint64_t)sb->st_mtim.tv_sec * 1000000000ull + (uint64_t)sb->st_mtim.tv_nsec);
    g_sig += h; /* order-independent: nftw's order is the directory's */
    return 0;
}

uint64_t tu_tree_sig(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0) return 0;
    g_sig = 1;
    g_sig_root = strlen(dir);
    nftw(dir, sig_entry, 16, FTW_PHYS);
    return g_sig;
}

void tu_watch(const char *dir) { snprintf(g_watch, sizeof g_watch, "%s", dir ? dir : ""); }

int tu_unchanged(void) { return g_watch[0] && tu_tree_sig(g_watch) == g_sig_pre; }

int tu_run(const char *cmd, char *buf, size_t cap) {
    if (g_watch[0]) g_sig_pre = tu_tree_sig(g_watch);
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = 0;
    if (buf && cap) buf[0] = 0;
    char tmp[4096];
    size_t got;
    while ((got = fread(tmp, 1, sizeof tmp, p)) > 0) {
        if (buf && n + 1 < cap) {
            size_t c = got < cap - 1 - n ? got : cap - 1 - n;
            memcpy(buf + n, tmp, c);
            n += c;
            buf[n] = 0;
        }
    }
    int rc = pclose(p);
    if (rc == -1) return -1;
    if (WIFEXITED(rc)) return WEXITSTATUS(rc);
    return 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
}

const char *tu_cli(void) {
    const char *c = getenv("SUANLI_CLI");
    return c ? c : "suanli";
}

/* Scratch directories are removed when the test process exits with no failed check; a failing run keeps
 * them as evidence and names them on stderr. Only the process that made a directory removes it, so forked
 * children that exit() leave it alone. */
enum { TMPDIR_MAX = 64 };
static char *g_tmpdirs[TMPDIR_MAX];
static int g_ntmpdirs;
static pid_t g_tmpdir_owner;

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(p);
    return 0;
}

static void tmpdirs_cleanup(void) {
    if (getpid() != g_tmpdir_owner) return;
    for (int i = 0; i < g_ntmpdirs; i++) {
        if (tu_failures)
            fprintf(stderr, "kept %s (a check failed)\n", g_tmpdirs[i]);
        else
            nftw(g_tmpdirs[i], rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        free(g_tmpdirs[i]);
    }
    g_ntmpdirs = 0;
}

const char *tu_tmpdir(const char *tag) {
    static char path[512];
    snprintf(path, sizeof path, "/tmp/suanli-test-%s-XXXXXX", tag);
    if (!mkdtemp(path)) {
        perror("mkdtemp");
        exit(2);
    }
    if (g_ntmpdirs == 0 && g_tmpdir_owner != getpid()) {
        g_tmpdir_owner = getpid();
        atexit(tmpdirs_cleanup);
    }
    if (g_ntmpdirs < TMPDIR_MAX) g_tmpdirs[g_ntmpdirs++] = strdup(path);
    return path;
}

int tu_same_file(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    if (sl_file_read_all(a, &x, &nx) != SL_OK) return 0;
    if (sl_file_read_all(b, &y, &ny) != SL_OK) {
        free(x);
        return 0;
    }
    int eq = nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return eq;
}

int tu_count_names(const char *d, const char *part) {
    DIR *dd = opendir(d);
    int n = 0;
    struct dirent *de;
    while (dd && (de = readdir(dd)))
        if (strstr(de->d_name, part)) n++;
    if (dd) closedir(dd);
    return n;
}

int tu_file_is(const char *path, const void *a, size_t an, const void *b, size_t bn) {
    char *text;
    size_t len;
    if (sl_file_read_all(path, &text, &len) != SL_OK) return 0;
    int ok = len == an + bn && !memcmp(text, a, an) && !memcmp(text + an, b, bn);
    free(text);
    return ok;
}

int tu_cli_run(char *out, size_t cap, const char *fmt, ...) {
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", tu_cli(), args);
    return tu_run(cmd, out, cap);
}

int tu_runf(char *out, size_t cap, const char *prefix, const char *fmt, ...) {
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", prefix, args);
    return tu_run(cmd, out, cap);
}

double tu_metric_at(const char *metrics_path, int step, const char *key) {
    FILE *f = fopen(metrics_path, "r");
    if (!f) return NAN;
    char line[4096], pat[96];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    double v = NAN;
    while (fgets(line, sizeof line, f)) {
        int s;
        const char *k = strstr(line, pat);
        if (sscanf(line, "{\"step\": %d", &s) == 1 && s == step && k) v = atof(k + strlen(pat));
    }
    fclose(f);
    return v;
}

void tu_synth_tokens(int B, int T, int V, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    for (int i = 0; i < B * (T + 1); i++) {
        int b = i / (T + 1), t = i % (T + 1);
        uint64_t r = sl_rng_u64(5, (uint64_t)(step * 1000 + micro), (uint64_t)b);
        int32_t tok = (int32_t)((r + (uint64_t)t * 7) % (uint64_t)V);
        if (sl_rng_uniform(6, (uint64_t)(step * 1000 + micro), (uint64_t)i) < 0.2) tok = (int32_t)(r % 13);
        if (t < T) ids[b * T + t] = tok;
        if (t > 0) tg[b * T + t - 1] = tok;
    }
}

int tu_prepare_corpus(const char *dir, int bytes, char *data, size_t data_cap, char *out, size_t cap) {
    snprintf(data, data_cap, "%s/data", dir);
    return tu_runf(
        out, cap, "",
        "sh -c 'head -c %d %s/data/tinyshakespeare.txt > %s/s.txt && %s data prepare --input %s/s.txt "
        "--output-prefix %s'",
        bytes, SL_SOURCE_DIR, dir, tu_cli(), dir, data);
}
