/* Backend registry and generic buffer helpers. */
#include <string.h>

#include "suanli/device.h"

sl_backend *sl_backend_get(const char *name) {
    if (!strcmp(name, "cpu")) return sl_backend_cpu();
    if (!strcmp(name, "null")) return sl_backend_null();
    sl_fail(SL_ERR_INVALID, "unknown backend '%s' (available: cpu, null)", name);
    return NULL;
}

sl_status sl_backend_alloc(sl_backend *be, size_t bytes, sl_buffer **out) {
    return be->buffer_alloc(be, bytes, out);
}
void sl_backend_free(sl_backend *be, sl_buffer *buf) {
    if (buf) be->buffer_free(be, buf);
}
