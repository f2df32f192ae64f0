/* The null backend: the template for a new chip. It owns host memory (so buffers and copies work) but
 * supports no op and no state operation, so every graph run reports SL_ERR_UNSUPPORTED naming the first
 * op, and an optimizer step names the missing member. Copy this folder, fill in the members for the
 * device, and make supports_op honest (docs/ADDING-A-BACKEND.md). */
#include <string.h>

#include "suanli/device.h"

static sl_status null_alloc(sl_backend *be, size_t bytes, sl_buffer **out) {
    sl_buffer *b = calloc(1, sizeof *b);
    if (!b) return sl_fail(SL_ERR_NOMEM, "null backend: out of memory");
    b->base = sl_malloc_aligned(bytes ? bytes : 64);
    if (!b->base) {
        free(b);
        return sl_fail(SL_ERR_NOMEM, "null backend: cannot allocate %zu bytes", bytes);
    }
    memset(b->base, 0, bytes);
    b->size = bytes;
    b->backend = be;
    *out = b;
    return SL_OK;
}
static void null_free(sl_backend *be, sl_buffer *b) {
    (void)be;
    sl_free_aligned(b->base);
    free(b);
}
/* ranges are checked by the generic helpers (src/device/registry.c) */
static sl_status null_copy_in(sl_buffer *dst, size_t off, const void *host, size_t n) {
    memcpy((char *)dst->base + off, host, n);
    return SL_OK;
}
static sl_status null_copy_out(const sl_buffer *src, size_t off, void *host, size_t n) {
    memcpy(host, (const char *)src->base + off, n);
    return SL_OK;
}
static sl_status null_memset(sl_buffer *b, size_t off, size_t n) {
    memset((char *)b->base + off, 0, n);
    return SL_OK;
}
static sl_status null_copy(sl_buffer *dst, size_t doff, const sl_buffer *src, size_t soff, size_t n) {
    memmove((char *)dst->base + doff, (const char *)src->base + soff, n);
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
    .caps = {.alignment = 64, .host_visible = 0, .async_copies = 0},
    .buffer_alloc = null_alloc,
    .buffer_free = null_free,
    .copy_in = null_copy_in,
    .copy_out = null_copy_out,
    .memset_zero = null_memset,
    .copy = null_copy,
    .supports_op = null_supports,
    .compute_node = null_compute,
    /* adamw, sumsq, scale, fill: NULL until the device has them */
};

sl_backend *sl_backend_null(void) { return &g_null; }
