/* Host fallback: a node whose op the graph's backend does not support runs on the CPU backend, its operands
 * copied out of device memory and its result copied back.
 *
 * Note [Host fallback]
 * A vendor brings a backend up op by op (docs/ADDING-A-BACKEND.md); until every op of a model has a kernel
 * the executor refuses the first one it lacks, naming it. With SUANLI_HOST_FALLBACK=1 (as PyTorch's
 * PYTORCH_ENABLE_MPS_FALLBACK) it runs that node on the CPU backend instead:
 *   1. the tensors the CPU kernel may read: the node and its sources to four levels (a backward op reads
 *      its forward node's inputs; the packed experts' dx reads its backward's forward's input's route), with
 *      the storages of in-place nodes (view_src), each with its byte extent (strided span, plus aux_bytes
 *      for a node that owns storage);
 *   2. per device buffer, those extents merged into disjoint intervals (aliases, in-place outputs and
 *      donated storage share one interval, so the host sees the same aliasing the device has), each copied
 *      out once into a 64-byte aligned host block that keeps the interval's offset modulo 64;
 *   3. every staged tensor's data pointer switched to its host copy, the CPU backend's compute_node run,
 *      the pointers restored;
 *   4. the node's own extent copied back, with the storages it lives in for an in-place node (view_src to
 *      the owner, with its aux bytes: a chain of in-place MOE_PACKED_FFN nodes fills its first node's aux).
 *      Nothing else is written: a CPU kernel writes only its node's storage.
 * Tensors in host-visible memory (or bound to host memory) are used where they are. Results are the CPU
 * backend's bits. The copies are synchronous, so a fallback node costs two transfers of what it touches:
 * the first use of each op kind logs one warning naming it. The strict backend (src/device/strict) proves
 * the staging complete: with SUANLI_STRICT_REFUSE naming ops, those run here while device memory is
 * PROT_NONE, so a kernel that reached an unstaged tensor would fault, and training must stay bitwise the
 * CPU's (tests/backend/test_host_fallback.c). */
#include <stdlib.h>
#include <string.h>

#include "graph/graph_internal.h"

#define FB_DEPTH 4 /* source levels: MOE_PACKED_FFN_DX reads its backward's forward's input's route */

typedef struct {
    sl_tensor *t;
    void *data; /* the device address, restored after */
    size_t lo, hi;
    int iv;  /* interval index */
    int out; /* the node or a storage it writes in place */
} fb_item;

typedef struct {
    sl_buffer *buf;
    size_t lo, hi;
    char *mem, *host; /* allocation; host = byte lo of the interval */
} fb_interval;

static size_t span_bytes(const sl_tensor *t) {
    int64_t hi = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->ne[d] <= 0) return 0;
        hi += (t->ne[d] - 1) * t->nb[d];
    }
    return (size_t)(hi + 1) * sl_dtype_size(t->dtype);
}

static int staged(const sl_tensor *t) {
    return t && t->data && t->buffer && !t->buffer->backend->caps.host_visible;
}

/* t and the chain of storages it lives in (an in-place node's view_src, and so on to the node that owns the
 * storage and its aux bytes: a chain of in-place MOE_PACKED_FFN nodes writes its first node's aux); `out`:
 * copied back after the kernel */
typedef struct {
    fb_item *v;
    int n, cap;
} fb_items;

static sl_status add(fb_items *it, sl_tensor *t, int out) {
    for (; t; t = t->view_src) {
        if (!staged(t)) continue;
        int i = 0;
        while (i < it->n && it->v[i].t != t) i++;
        if (i < it->n) {
            it->v[i].out |= out;
            continue;
        }
        size_t bytes = span_bytes(t) + (t->op != SL_OP_NONE && t->op != SL_OP_VIEW ? t->aux_bytes : 0);
        if (!bytes) continue;
        if (it->n == it->cap) {
            fb_item *p = realloc(it->v, sizeof *p * (size_t)(it->cap = it->cap ? 2 * it->cap : 32));
            if (!p) return sl_fail(SL_ERR_NOMEM, "host fallback: out of memory");
            it->v = p;
        }
        it->v[it->n++] = (fb_item){t, t->data, t->buffer_offs, t->buffer_offs + bytes, -1, out};
    }
    return SL_OK;
}

/* t, its storage, and its sources to `depth` levels below FB_DEPTH */
static sl_status gather(fb_items *it, sl_tensor *t, int depth) {
    SL_TRY(add(it, t, depth == FB_DEPTH));
    for (int s = 0; s < SL_MAX_SRC && depth > 0; s++)
        if (t->src[s]) SL_TRY(gather(it, t->src[s], depth - 1));
    return SL_OK;
}

static int by_buffer_lo(const void *a, const void *b) {
    const fb_item *x = a, *y = b;
    if (x->t->buffer != y->t->buffer) return (uintptr_t)x->t->buffer < (uintptr_t)y->t->buffer ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void warn_once(const sl_backend *be, const sl_tensor *t) {
    static unsigned char warned[SL_OP_COUNT];
    if (warned[t->op]) return;
    warned[t->op] = 1;
    SL_LOGW("backend %s: op %s (%s) runs on the host (SUANLI_HOST_FALLBACK=1): its operands are copied out "
            "and back at each call",
            be->name, sl_op_name(t->op), sl_dtype_name(t->dtype));
}

int sl_host_fallback_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("SUANLI_HOST_FALLBACK");
        on = e && *e && strcmp(e, "0") != 0;
    }
    return on;
}

int sl_graph_can_run(sl_backend *be, const sl_tensor *n) {
    if (be->supports_op(be, n)) return 1;
    sl_backend *cpu = sl_backend_cpu();
    return !be->caps.host_visible && sl_host_fallback_enabled() && cpu->supports_op(cpu, n);
}

sl_status sl_host_fallback(sl_backend *be, sl_tensor *t) {
    sl_backend *cpu = sl_backend_cpu();
    if (!cpu->supports_op(cpu, t))
        return sl_fail(SL_ERR_UNSUPPORTED, "backend %s: op %s (%s) not supported, not even on the host",
                       be->name, sl_op_name(t->op), sl_dtype_name(t->dtype));
    warn_once(be, t);
    be->stats.fallback_nodes++;
    fb_items items = {NULL, 0, 0};
    sl_status st = gather(&items, t, FB_DEPTH);
    fb_item *it = items.v;
    int n = items.n, niv = 0;
    fb_interval *iv = st == SL_OK && n ? malloc(sizeof *iv * (size_t)n) : NULL;
    if (st == SL_OK && n && !iv) st = sl_fail(SL_ERR_NOMEM, "host fallback: out of memory");
    if (st != SL_OK) {
        free(it);
        return st;
    }
    if (n) qsort(it, (size_t)n, sizeof *it, by_buffer_lo);
    for (int i = 0; i < n; i++) { /* merge overlapping extents of one buffer */
        fb_interval *last = niv ? &iv[niv - 1] : NULL;
        if (last && last->buf == it[i].t->buffer && it[i].lo < last->hi) {
            if (it[i].hi > last->hi) last->hi = it[i].hi;
        } else {
            iv[niv++] = (fb_interval){it[i].t->buffer, it[i].lo & ~(size_t)63, it[i].hi, NULL, NULL};
        }
        it[i].iv = niv - 1;
    }
    int ready = 0;
    for (; ready < niv && st == SL_OK; ready++) {
        fb_interval *v = &iv[ready];
        if (v->hi > v->buf->size) v->hi = v->buf->size; /* (a tensor never lies past its buffer) */
        size_t len = v->hi - v->lo;
        if (!(v->mem = aligned_alloc(64, (len + 63) & ~(size_t)63))) {
            st = sl_fail(SL_ERR_NOMEM, "host fallback: out of memory for %zu bytes (op %s)", len,
                         sl_op_name(t->op));
            break;
        }
        v->host = v->mem;
        st = sl_backend_copy_out(v->buf, v->lo, v->host, len);
    }
    if (st == SL_OK) {
        for (int i = 0; i < n; i++) it[i].t->data = iv[it[i].iv].host + (it[i].lo - iv[it[i].iv].lo);
        st = cpu->compute_node(cpu, t);
        for (int i = 0; i < n; i++) it[i].t->data = it[i].data;
    }
    for (int i = 0; i < n && st == SL_OK; i++) { /* the node's own storage back to the device */
        if (!it[i].out) continue;
        fb_interval *v = &iv[it[i].iv];
        size_t hi = it[i].hi < v->hi ? it[i].hi : v->hi;
        st = sl_backend_copy_in(v->buf, it[i].lo, v->host + (it[i].lo - v->lo), hi - it[i].lo);
    }
    for (int i = 0; i < ready; i++) free(iv[i].mem);
    free(iv);
    free(it);
    return st;
}
