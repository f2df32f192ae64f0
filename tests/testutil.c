#include <stdarg.h>
#define _GNU_SOURCE
#include "testutil.h"

#include "suanli/base.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int tu_failures, tu_checks;

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

int tu_finish(const char *name) {
    printf("%s: %d checks, %d failures\n", name, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

int tu_run(const char *cmd, char *buf, size_t cap) {
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

const char *tu_tmpdir(const char *tag) {
    static char path[512];
    snprintf(path, sizeof path, "/tmp/suanli-test-%s-XXXXXX", tag);
    if (!mkdtemp(path)) {
        perror("mkdtemp");
        exit(2);
    }
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

int tu_cli_run(char *out, size_t cap, const char *fmt, ...) {
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", tu_cli(), args);
    return tu_run(cmd, out, cap);
}
