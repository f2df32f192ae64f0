#include "cli/flags.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

static sl_flag *find(sl_flag *flags, int n, const char *name, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(flags[i].name) == len && !strncmp(flags[i].name, name, len)) return &flags[i];
    return NULL;
}

const sl_flag *sl_flags_find(const sl_flag *flags, int n, const char *name) {
    return find((sl_flag *)flags, n, name, strlen(name));
}

static sl_status set_value(sl_flag *f, const char *v, const char *where) {
    char *end;
    errno = 0;
    switch (f->type) {
    case SL_FLAG_INT: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno)
            return sl_fail(SL_ERR_INVALID, "%s--%s: '%s' is not an integer", where, f->name, v);
        if ((double)x < f->lo || (double)x > f->hi)
            return sl_fail(SL_ERR_INVALID, "%s--%s: %lld out of range [%.0f, %.0f]", where, f->name, x, f->lo,
                           f->hi);
        *(int64_t *)f->dst = x;
        break;
    }
    case SL_FLAG_FLOAT: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x))
            return sl_fail(SL_ERR_INVALID, "%s--%s: '%s' is not a number", where, f->name, v);
        if (x < f->lo || x > f->hi)
            return sl_fail(SL_ERR_INVALID, "%s--%s: %g out of range [%g, %g]", where, f->name, x, f->lo,
                           f->hi);
        *(double *)f->dst = x;
        break;
    }
    case SL_FLAG_STR:
        if (!*v) return sl_fail(SL_ERR_INVALID, "%s--%s: empty value", where, f->name);
        *(const char **)f->dst = v;
        break;
    case SL_FLAG_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true"))
            *(int *)f->dst = 1;
        else if (!strcmp(v, "0") || !strcmp(v, "false"))
            *(int *)f->dst = 0;
        else
            return sl_fail(SL_ERR_INVALID, "%s--%s: '%s' is not a boolean", where, f->name, v);
        break;
    }
    f->set = 1;
    return SL_OK;
}

/* Config strings must outlive parsing (string flags point at them): each is kept in this list until
 * sl_flags_config_release (which a command never needs to call; a fuzzer parsing many files does). */
static char **g_kept;
static size_t g_nkept, g_capkept;

static const char *keep(const char *s) {
    if (g_nkept == g_capkept) {
        size_t cap = g_capkept ? 2 * g_capkept : 16;
        char **p = realloc(g_kept, cap * sizeof *p);
        if (!p) return NULL;
        g_kept = p, g_capkept = cap;
    }
    char *d = strdup(s);
    if (d) g_kept[g_nkept++] = d;
    return d;
}

void sl_flags_config_release(void) {
    for (size_t i = 0; i < g_nkept; i++) free(g_kept[i]);
    free(g_kept);
    g_kept = NULL, g_nkept = g_capkept = 0;
}

static sl_status apply_config(sl_flag *flags, int n, const char *path) {
    char *text;
    size_t len;
    SL_TRY(sl_file_read_all(path, &text, &len));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int trailing = 0; /* text after the object ('{..}{..}': its keys were silently ignored) */
    for (const char *p = root ? end : text + len; p < text + len; p++)
        trailing |= !isspace((unsigned char)*p);
    free(text);
    if (!root || !cJSON_IsObject(root) || trailing) {
        cJSON_Delete(root);
        return sl_fail(SL_ERR_FORMAT, "%s: not a JSON object%s", path, trailing ? " (text after it)" : "");
    }
    char where[600];
    snprintf(where, sizeof where, "%s: ", path);
    sl_status st = SL_OK;
    for (cJSON *it = root->child; it; it = it->next) {
        char key[128];
        snprintf(key, sizeof key, "%s", it->string ? it->string : "");
        for (char *p = key; *p; p++)
            if (*p == '_') *p = '-';
        sl_flag *f = find(flags, n, key, strlen(key));
        if (!f || !strcmp(key, "config")) {
            st = sl_fail(SL_ERR_INVALID, "%s: unknown config key '%s'", path, it->string);
            break;
        }
        char buf[64];
        const char *v = NULL;
        if (cJSON_IsString(it)) {
            v = keep(it->valuestring);
        } else if (cJSON_IsBool(it)) {
            if (f->type != SL_FLAG_BOOL) { /* true read as 1: {"lr": true} trained at lr 1 */
                st = sl_fail(SL_ERR_INVALID, "%s: key '%s' is a boolean, expected a %s", path, it->string,
                             f->type == SL_FLAG_STR ? "string" : "number");
                break;
            }
            v = cJSON_IsTrue(it) ? "1" : "0";
        } else if (cJSON_IsNumber(it)) {
            if (f->type == SL_FLAG_INT && it->valuedouble != floor(it->valuedouble)) {
                st = sl_fail(SL_ERR_INVALID, "%s: key '%s' must be an integer", path, it->string);
                break;
            }
            if (f->type == SL_FLAG_INT && fabs(it->valuedouble) >= 9e18) {
                /* past long long: 1e300 printed to 64 bytes gave "'1000...5411' is not an integer" */
                st = sl_fail(SL_ERR_INVALID, "%s--%s: %g out of range [%.0f, %.0f]", where, f->name,
                             it->valuedouble, f->lo, f->hi);
                break;
            }
            if (f->type == SL_FLAG_INT)
                snprintf(buf, sizeof buf, "%.0f", it->valuedouble);
            else
                snprintf(buf, sizeof buf, "%.17g", it->valuedouble);
            v = f->type == SL_FLAG_STR ? keep(buf) : buf;
        } else {
            st = sl_fail(SL_ERR_INVALID, "%s: key '%s' has an unsupported type", path, it->string);
            break;
        }
        if (!v) {
            st = sl_fail(SL_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        if ((st = set_value(f, v, where)) != SL_OK) break;
    }
    cJSON_Delete(root);
    return st;
}

sl_status sl_flags_parse(sl_flag *flags, int n, int argc, char **argv, int first) {
    /* pass 1: config file */
    sl_flag *cfg = find(flags, n, "config", 6);
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--config", 8) && (a[8] == 0 || a[8] == '=')) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[i + 1] : NULL);
            if (!cfg) return sl_fail(SL_ERR_INVALID, "unknown flag --config");
            if (!v) return sl_fail(SL_ERR_INVALID, "--config: missing value");
            SL_TRY(set_value(cfg, v, "")); /* first: "--config=" gave ": cannot open" */
            SL_TRY(apply_config(flags, n, v));
        }
    }
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) return sl_fail(SL_ERR_INVALID, "unexpected argument '%s'", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        sl_flag *f = find(flags, n, name, len);
        if (!f) return sl_fail(SL_ERR_INVALID, "unknown flag --%.*s", (int)len, name);
        const char *v;
        if (eq)
            v = eq + 1;
        else if (f->type == SL_FLAG_BOOL && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)))
            v = "1";
        else if (i + 1 < argc)
            v = argv[++i];
        else
            return sl_fail(SL_ERR_INVALID, "--%s: missing value", f->name);
        if (f == cfg) continue;
        SL_TRY(set_value(f, v, ""));
    }
    return SL_OK;
}

void sl_flags_usage(const sl_flag *flags, int n, FILE *f) {
    for (int i = 0; i < n; i++) {
        const char *t = flags[i].type == SL_FLAG_INT     ? "N"
                        : flags[i].type == SL_FLAG_FLOAT ? "X"
                        : flags[i].type == SL_FLAG_STR   ? "S"
                                                         : "";
        char left[64];
        snprintf(left, sizeof left, "--%s %s", flags[i].name, t);
        fprintf(f, "  %-34s %s\n", left, flags[i].help);
    }
}

int sl_cli_find_in_path(const char *prog, char *out, size_t cap) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    while (*path) {
        const char *e = strchr(path, ':');
        size_t n = e ? (size_t)(e - path) : strlen(path);
        if (n > 0 && n + strlen(prog) + 2 < cap) {
            snprintf(out, cap, "%.*s/%s", (int)n, path, prog);
            if (access(out, X_OK) == 0) return 1;
        }
        path += n + (e ? 1 : 0);
    }
    return 0;
}

int sl_flags_help(const sl_flag *flags, int n, int argc, char **argv, const char *usage) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%s\n", usage);
            sl_flags_usage(flags, n, stdout);
            return 1;
        }
    return 0;
}
