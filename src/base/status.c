/* Status codes and thread-local error messages. */
#include "suanli/base.h"

#include <string.h>

static const char *const k_status_names[] = {
    "ok",          "invalid argument", "I/O error",    "format error", "out of memory",
    "unsupported", "timeout",          "peer failure", "aborted",      "internal error",
};
_Static_assert(sizeof(k_status_names) / sizeof(k_status_names[0]) == SL_STATUS_COUNT,
               "status name table out of sync");

static _Thread_local char t_errmsg[1024];

const char *sl_status_name(sl_status st) {
    if ((int)st < 0 || st >= SL_STATUS_COUNT) return "unknown status";
    return k_status_names[st];
}

sl_status sl_fail(sl_status st, const char *fmt, ...) {
    char buf[sizeof t_errmsg]; /* formatted here first: the arguments may point into t_errmsg */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(t_errmsg, buf, strlen(buf) + 1);
    /* keep it one line */
    for (char *p = t_errmsg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return st;
}

const char *sl_errmsg(void) { return t_errmsg; }
void sl_clear_error(void) { t_errmsg[0] = 0; }

_Noreturn void sl_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "suanli: assertion failed: %s (%s:%d)\n", cond, file, line);
    fflush(stderr);
    abort();
}
