/* Leveled logging to stderr. Level from SUANLI_LOG or sl_log_set_level. */
#include "suanli/base.h"

#include <string.h>

static int g_level = -1;

static sl_log_level level_from_env(void) {
    const char *e = getenv("SUANLI_LOG");
    if (!e) return SL_LOG_INFO;
    if (!strcmp(e, "error")) return SL_LOG_ERROR;
    if (!strcmp(e, "warn")) return SL_LOG_WARN;
    if (!strcmp(e, "debug")) return SL_LOG_DEBUG;
    return SL_LOG_INFO;
}

void sl_log_set_level(sl_log_level lvl) { g_level = (int)lvl; }
sl_log_level sl_log_get_level(void) {
    if (g_level < 0) g_level = (int)level_from_env();
    return (sl_log_level)g_level;
}

void sl_log(sl_log_level lvl, const char *fmt, ...) {
    static const char *const tags[] = {"error", "warn", "info", "debug"};
    _Static_assert(sizeof(tags) / sizeof(tags[0]) == SL_LOG_LEVEL_COUNT, "log tags");
    if (lvl > sl_log_get_level()) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[suanli %s] %s\n", tags[lvl], buf);
}
