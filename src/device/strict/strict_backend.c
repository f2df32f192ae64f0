/* The strict test backend: device memory the host cannot touch.
 *
 * Note [Strict backend]
 * Every buffer is its own anonymous mapping kept PROT_NONE except while one of this backend's own calls
 * runs (a copy, a kernel, a state operation), so any dereference of device memory from above src/device
 * faults at once, and a test run through this backend proves that nothing there touches device memory.
 * The kernels are the CPU backend's, reached through the contract (sl_backend_cpu()->compute_node etc.):
 * no backend includes another. Before a node runs, every address it reads or writes must lie inside a
 * strict buffer; a leaf bound to host memory (sl_tensor_bind) is refused with a message naming it, which
 * is what a real accelerator would do with a host pointer. Copies declared asynchronous really are: they
 * are queued and performed at the next synchronize (or before the next call that could observe them), so
 * a caller that reads a copy_out_async destination before synchronizing sees stale bytes and fails its
 * test. Test-only: slow (two mprotect calls per buffer per node), single-threaded callers only. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "suanli/device.h"

#define MAX_BUFS 256
#define MAX_PENDING 64

typedef struct {
    int out; /* 1: device -> host */
    sl_buffer *buf;
    size_t off, n;
    void *host;
} pending_copy;

static struct {
    sl_buffer *bufs[MAX_BUFS];
    int n_bufs;
    pending_copy pending[MAX_PENDING];
    int n_pending;
} g_st;

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}
static size_t mapped_size(const sl_buffer *b) { return page_round(b->size ? b->size : 1); }

static void protect(sl_buffer *b, int rw) {
    int rc = mprotect(b->base, mapped_size(b), rw ? PROT_READ | PROT_WRITE : PROT_NONE);
    SL_ASSERT(rc == 0);
}
static void protect_all(int rw) {
    for (int i = 0; i < g_st.n_bufs; i++) protect(g_st.bufs[i], rw);
}

static sl_status flush_pending(void) {
    for (int i = 0; i < g_st.n_pending; i++) {
        pending_copy *c = &g_st.pending[i];
        protect(c->buf, 1);
        if (c->out)
            memcpy(c->host, (char *)c->buf->base + c->off, c->n);
        else
            memcpy((char *)c->buf->base + c->off, c->host, c->n);
        protect(c->buf, 0);
    }
    g_st.n_pending = 0;
    return SL_OK;
}

static sl_status strict_alloc(sl_backend *be, size_t bytes, sl_buffer **out) {
    if (g_st.n_bufs == MAX_BUFS)
        return sl_fail(SL_ERR_NOMEM, "strict backend: more than %d buffers", MAX_BUFS);
    sl_buffer *b = calloc(1, sizeof *b);
    if (!b) return sl_fail(SL_ERR_NOMEM, "strict backend: out of memory");
    b->size = bytes;
    b->backend = be;
    b->base = mmap(NULL, mapped_size(b), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* zero-filled */
    if (b->base == MAP_FAILED) {
        free(b);
        return sl_fail(SL_ERR_NOMEM, "strict backend: cannot map %zu bytes", bytes);
    }
    g_st.bufs[g_st.n_bufs++] = b;
    *out = b;
    return SL_OK;
}

static void strict_free(sl_backend *be, sl_buffer *b) {
    (void)be;
    (void)flush_pending();
    for (int i = 0; i < g_st.n_bufs; i++)
        if (g_st.bufs[i] == b) {
            g_st.bufs[i] = g_st.bufs[--g_st.n_bufs];
            break;
        }
    munmap(b->base, mapped_size(b));
    free(b);
}

static sl_status strict_copy_in(sl_buffer *dst, size_t off, const void *host, size_t n) {
    SL_TRY(flush_pending());
    protect(dst, 1);
    memcpy((char *)dst->base + off, host, n);
    protect(dst, 0);
    return SL_OK;
}
static sl_status strict_copy_out(const sl_buffer *src, size_t off, void *host, size_t n) {
    SL_TRY(flush_pending());
    sl_buffer *b = (sl_buffer *)src;
    protect(b, 1);
    memcpy(host, (char *)b->base + off, n);
    protect(b, 0);
    return SL_OK;
}
static sl_status enqueue(int out, const sl_buffer *b, size_t off, void *host, size_t n) {
    if (g_st.n_pending == MAX_PENDING) SL_TRY(flush_pending());
    g_st.pending[g_st.n_pending++] = (pending_copy){out, (sl_buffer *)b, off, n, host};
    return SL_OK;
}
static sl_status strict_copy_in_async(sl_buffer *dst, size_t off, const void *host, size_t n) {
    return enqueue(0, dst, off, (void *)host, n);
}
static sl_status strict_copy_out_async(const sl_buffer *src, size_t off, void *host, size_t n) {
    return enqueue(1, src, off, host, n);
}
static sl_status strict_sync(sl_backend *be) {
    (void)be;
    return flush_pending();
}
static sl_status strict_memset(sl_buffer *b, size_t off, size_t n) {
    SL_TRY(flush_pending());
    if (off > b->size || n > b->size - off)
        return sl_fail(SL_ERR_INVALID, "strict backend: memset out of range");
    protect(b, 1);
    memset((char *)b->base + off, 0, n);
    protect(b, 0);
    return SL_OK;
}
static sl_status strict_copy(sl_buffer *dst, size_t doff, const sl_buffer *src, size_t soff, size_t n) {
    SL_TRY(flush_pending());
    if (src->backend != dst->backend) return sl_fail(SL_ERR_INVALID, "strict backend: copy across backends");
    if (doff > dst->size || n > dst->size - doff || soff > src->size || n > src->size - soff)
        return sl_fail(SL_ERR_INVALID, "strict backend: copy of %zu bytes out of range", n);
    protect(dst, 1);
    protect((sl_buffer *)src, 1);
    memmove((char *)dst->base + doff, (const char *)src->base + soff, n);
    protect((sl_buffer *)src, 0);
    protect(dst, 0);
    return SL_OK;
}

/* 1 when [p, p + n) lies inside one strict buffer */
static int inside(const void *p, size_t n) {
    const char *c = p;
    for (int i = 0; i < g_st.n_bufs; i++) {
        const char *b = g_st.bufs[i]->base;
        if (c >= b && c + n <= b + g_st.bufs[i]->size) return 1;
    }
    return 0;
}

static size_t extent_bytes(const sl_tensor *t) {
    int64_t hi = 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->ne[d] > 0) hi += (t->ne[d] - 1) * t->nb[d];
    return (size_t)(hi + 1) * sl_dtype_size(t->dtype);
}

/* SUANLI_STRICT_REFUSE: a comma-separated list of op names (sl_op_name) this backend claims not to run, or
 * "all", so that the executor's host fallback (Note [Host fallback], src/graph/host_fallback.c) runs them
 * with device memory closed: a fallback that missed an operand faults */
static int refused(const sl_tensor *n) {
    const char *e = getenv("SUANLI_STRICT_REFUSE");
    if (!e || !*e) return 0;
    if (!strcmp(e, "all")) return 1;
    const char *name = sl_op_name(n->op);
    size_t len = strlen(name);
    for (const char *p = e; *p;) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l == len && !strncmp(p, name, l)) return 1;
        p += l + (c != NULL);
    }
    return 0;
}

static int strict_supports(sl_backend *be, const sl_tensor *n) {
    (void)be;
    sl_backend *cpu = sl_backend_cpu();
    return !refused(n) && cpu->supports_op(cpu, n);
}

static sl_status strict_compute(sl_backend *be, sl_tensor *n) {
    SL_TRY(flush_pending());
    if (!inside(n->data, extent_bytes(n) + n->aux_bytes))
        return sl_fail(SL_ERR_INVALID, "strict backend: node '%s' (%s) writes outside device memory", n->name,
                       sl_op_name(n->op));
    for (int i = 0; i < SL_MAX_SRC; i++) {
        const sl_tensor *s = n->src[i];
        if (s && !inside(s->data, extent_bytes(s)))
            return sl_fail(SL_ERR_INVALID,
                           "strict backend: node '%s' (%s) reads '%s' outside device memory (a host pointer "
                           "bound with sl_tensor_bind?)",
                           n->name, sl_op_name(n->op), s->name);
    }
    be->stats.nodes++;
    sl_backend *cpu = sl_backend_cpu();
    protect_all(1);
    sl_status st = cpu->compute_node(cpu, n);
    protect_all(0);
    return st;
}

/* state operations: the CPU's, with the memory opened around the call */
static sl_status strict_adamw(sl_backend *be, const sl_adamw_call *c) {
    (void)be;
    SL_TRY(flush_pending());
    sl_backend *cpu = sl_backend_cpu();
    protect_all(1);
    sl_status st = cpu->adamw(cpu, c);
    protect_all(0);
    return st;
}
static sl_status strict_sumsq(sl_backend *be, const sl_buffer *b, int64_t off, int64_t n, double *out) {
    (void)be;
    SL_TRY(flush_pending());
    sl_backend *cpu = sl_backend_cpu();
    protect((sl_buffer *)b, 1);
    sl_status st = cpu->sumsq(cpu, b, off, n, out);
    protect((sl_buffer *)b, 0);
    return st;
}
static sl_status strict_scale(sl_backend *be, sl_buffer *b, int64_t off, int64_t n, float s) {
    (void)be;
    SL_TRY(flush_pending());
    sl_backend *cpu = sl_backend_cpu();
    protect(b, 1);
    sl_status st = cpu->scale(cpu, b, off, n, s);
    protect(b, 0);
    return st;
}
static sl_status strict_fill(sl_backend *be, sl_buffer *b, int64_t off, int64_t n, float v) {
    (void)be;
    SL_TRY(flush_pending());
    sl_backend *cpu = sl_backend_cpu();
    protect(b, 1);
    sl_status st = cpu->fill(cpu, b, off, n, v);
    protect(b, 0);
    return st;
}

static sl_backend g_strict = {
    .name = "strict",
    .caps = {.alignment = 4096,
             .host_visible = 0,
             .async_copies = 1,
             .matmul_half_b = 1}, /* the CPU's kernels */
    .buffer_alloc = strict_alloc,
    .buffer_free = strict_free,
    .copy_in = strict_copy_in,
    .copy_out = strict_copy_out,
    .memset_zero = strict_memset,
    .copy = strict_copy,
    .copy_in_async = strict_copy_in_async,
    .copy_out_async = strict_copy_out_async,
    .synchronize = strict_sync,
    .supports_op = strict_supports,
    .compute_node = strict_compute,
    .adamw = strict_adamw,
    .sumsq = strict_sumsq,
    .scale = strict_scale,
    .fill = strict_fill,
};

sl_backend *sl_backend_strict(void) { return &g_strict; }
