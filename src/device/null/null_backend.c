/* The null backend: the template for a new chip. It owns host memory (so buffers work) but supports
 * no op, so every graph run reports SL_ERR_UNSUPPORTED naming the first op. Copy this folder, fill in
 * the members for the device, and make supports_op honest. */
#include <string.h>

#include "suanli/device.h"

static sl_status null_alloc(sl_backend *be, size_t bytes, sl_buffer **out) {
    sl_buffer *b = calloc(1, sizeof *b);
    if (!b) return sl_fail(SL_ERR_NOMEM, "null backend: out of memory");
    b->base = calloc(1, bytes ? bytes : 1);
    if (!b->base) {
        free(b);
        return sl_fail(SL_ERR_NOMEM, "null backend: cannot allocate %zu bytes", bytes);
    }
    b->size = bytes;
    b->backend = be;
    *out = b;
    return SL_OK;
}
static void null_free(sl_backend *be, sl_buffer *b) {
    (void)be;
    free(b->base);
    free(b);
}
static void *null_base(sl_buffer *b) { return b->base; }
static sl_status null_copy_in(sl_buffer *dst, size_t off, const void *host, size_t n) {
    if (off + n > dst->size) return sl_fail(SL_ERR_INVALID, "null backend: copy_in out of range");
    memcpy((char *)dst->base + off, host, n);
    return SL_OK;
}
static sl_status null_copy_out(const sl_buffer *src, size_t off, void *host, size_t n) {
    if (off + n > src->size) return sl_fail(SL_ERR_INVALID, "null backend: copy_out out of range");
    memcpy(host, (const char *)src->base + off, n);
    return SL_OK;
}
static int null_supports(sl_backend *be, const sl_tensor *n) {
    (void)be;
    (void)n;
    return 0;
}
static sl_status null_compute(sl_backend *be, sl_tensor *n) {
    (void)be;
    return sl_fail(SL_ERR_UNSUPPORTED, "null backend: op %s not supported", sl_op_name(n->op));
}

static sl_backend g_null = {
    .name = "null",
    .buffer_alloc = null_alloc,
    .buffer_free = null_free,
    .buffer_base = null_base,
    .copy_in = null_copy_in,
    .copy_out = null_copy_out,
    .supports_op = null_supports,
    .compute_node = null_compute,
};

sl_backend *sl_backend_null(void) { return &g_null; }
