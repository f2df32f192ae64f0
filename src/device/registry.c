/* Backend registry and the generic helpers every backend shares: checked copies, mapping, tensor binding. */
#include <stdio.h>
#include <string.h>

#include "device/cpu/kernels/gemm.h"
#include "suanli/device.h"

/* The registry: one line per backend, X(name), where the backend's folder defines
 * `sl_backend *sl_backend_<name>(void)` (docs/ADDING-A-BACKEND.md). The order is the order of
 * `sl_backend_names` and of the error message for an unknown name. */
#ifdef SL_HAVE_OPENCL /* built with SL_OPENCL (cmake/opencl.cmake) */
#define SL_BACKENDS_OPENCL(X) X(opencl)
#else
#define SL_BACKENDS_OPENCL(X)
#endif
#ifdef SL_HAVE_CUDA /* built with SL_CUDA (cmake/cuda.cmake) */
#define SL_BACKENDS_CUDA(X) X(cuda)
#else
#define SL_BACKENDS_CUDA(X)
#endif
#define SL_BACKENDS(X)                                                                                       \
    X(cpu)                                                                                                   \
    X(strict)                                                                                                \
    X(null)                                                                                                  \
    SL_BACKENDS_OPENCL(X)                                                                                    \
    SL_BACKENDS_CUDA(X)

#define DECLARE(name) sl_backend *sl_backend_##name(void);
SL_BACKENDS(DECLARE)
#undef DECLARE

/* Selectors for "NAME:ARG" (Note [Device names with a suffix] in suanli/device.h): one line per backend
 * that has one; the others refuse a suffix. */
static sl_backend *(*selector_of(const char *name))(const char *) {
#ifdef SL_HAVE_OPENCL
    if (!strcmp(name, "opencl")) return sl_backend_opencl_select;
#endif
    (void)name;
    return NULL;
}

static const struct {
    const char *name;
    sl_backend *(*get)(void);
} k_registry[] = {
#define ENTRY(name) {#name, sl_backend_##name},
    SL_BACKENDS(ENTRY)
#undef ENTRY
};
#define N_REGISTRY ((int)(sizeof k_registry / sizeof k_registry[0]))

const char *const *sl_backend_names(void) {
    static const char *names[N_REGISTRY + 1];
    for (int i = 0; i < N_REGISTRY; i++) names[i] = k_registry[i].name;
    names[N_REGISTRY] = NULL;
    return names;
}

sl_backend *sl_backend_get(const char *name) {
    char known[128] = "", base[32] = "";
    const char *colon = name ? strchr(name, ':') : NULL;
    if (colon && (size_t)(colon - name) < sizeof base) memcpy(base, name, (size_t)(colon - name));
    for (int i = 0; i < N_REGISTRY; i++) {
        if (name && !colon && !strcmp(name, k_registry[i].name)) return k_registry[i].get();
        if (colon && !strcmp(base, k_registry[i].name)) {
            sl_backend *(*sel)(const char *) = selector_of(base);
            if (!sel) {
                sl_fail(SL_ERR_INVALID, "device '%s': the %s backend takes no ':' suffix", name, base);
                return NULL;
            }
            return sel(colon + 1);
        }
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                 k_registry[i].name);
    }
    sl_fail(SL_ERR_INVALID, "unknown device '%s' (available: %s)", name ? name : "(null)", known);
    return NULL;
}

sl_status sl_backend_alloc(sl_backend *be, size_t bytes, sl_buffer **out) {
    *out = NULL;
    SL_TRY(be->buffer_alloc(be, bytes, out));
    SL_ASSERT(((uintptr_t)(*out)->base & (be->caps.alignment - 1)) == 0);
    return SL_OK;
}
void sl_backend_free(sl_backend *be, sl_buffer *buf) {
    if (buf) be->buffer_free(be, buf);
}
sl_status sl_backend_wrap_host(sl_backend *be, void *ptr, size_t bytes, sl_buffer **out) {
    *out = NULL;
    if (!be->buffer_from_host || !be->caps.host_visible)
        return sl_fail(SL_ERR_UNSUPPORTED, "%s backend: cannot use host memory as device memory", be->name);
    return be->buffer_from_host(be, ptr, bytes, out);
}

static sl_status check_range(const sl_buffer *b, size_t off, size_t n, const char *what) {
    if (off > b->size || n > b->size - off)
        return sl_fail(SL_ERR_INVALID, "%s backend: %s of %zu bytes at %zu beyond a %zu-byte buffer",
                       b->backend->name, what, n, off, b->size);
    return SL_OK;
}

sl_status sl_backend_copy_in(sl_buffer *dst, size_t off, const void *host, size_t n) {
    SL_TRY(check_range(dst, off, n, "copy_in"));
    if (!n) return SL_OK;
    dst->backend->stats.bytes_in += (int64_t)n;
    return dst->backend->copy_in(dst, off, host, n);
}
sl_status sl_backend_copy_out(const sl_buffer *src, size_t off, void *host, size_t n) {
    SL_TRY(check_range(src, off, n, "copy_out"));
    if (!n) return SL_OK;
    src->backend->stats.bytes_out += (int64_t)n;
    return src->backend->copy_out(src, off, host, n);
}
sl_status sl_backend_copy_in_async(sl_buffer *dst, size_t off, const void *host, size_t n) {
    if (!dst->backend->copy_in_async) return sl_backend_copy_in(dst, off, host, n);
    SL_TRY(check_range(dst, off, n, "copy_in_async"));
    if (!n) return SL_OK;
    dst->backend->stats.bytes_in += (int64_t)n;
    return dst->backend->copy_in_async(dst, off, host, n);
}
sl_status sl_backend_copy_out_async(const sl_buffer *src, size_t off, void *host, size_t n) {
    if (!src->backend->copy_out_async) return sl_backend_copy_out(src, off, host, n);
    SL_TRY(check_range(src, off, n, "copy_out_async"));
    if (!n) return SL_OK;
    src->backend->stats.bytes_out += (int64_t)n;
    return src->backend->copy_out_async(src, off, host, n);
}
sl_status sl_backend_synchronize(sl_backend *be) { return be->synchronize ? be->synchronize(be) : SL_OK; }

void *sl_buffer_map(sl_buffer *buf) {
    if (!buf) return NULL;
    if (!buf->backend->caps.host_visible) {
        sl_fail(SL_ERR_UNSUPPORTED, "%s backend: memory is not host-visible (use copies)",
                buf->backend->name);
        return NULL;
    }
    return buf->base;
}

void sl_tensor_bind_buffer(sl_tensor *t, sl_buffer *buf, size_t off) {
    SL_ASSERT(t->op == SL_OP_NONE);
    SL_ASSERT(off + sl_nbytes(t) <= buf->size);
    t->data = (char *)buf->base + off;
    t->buffer = buf;
    t->buffer_offs = off;
}

static sl_status tensor_check(const sl_tensor *t, const char *what) {
    if (!t->buffer)
        return sl_fail(SL_ERR_INVALID, "tensor '%s': %s needs a tensor in a backend buffer", t->name, what);
    if (!sl_is_contiguous(t))
        return sl_fail(SL_ERR_INVALID, "tensor '%s': %s of a non-contiguous tensor", t->name, what);
    return SL_OK;
}
sl_status sl_tensor_copy_in(sl_tensor *t, const void *host) {
    SL_TRY(tensor_check(t, "copy_in"));
    return sl_backend_copy_in(t->buffer, t->buffer_offs, host, sl_nbytes(t));
}
sl_status sl_tensor_copy_out(const sl_tensor *t, void *host) {
    SL_TRY(tensor_check(t, "copy_out"));
    return sl_backend_copy_out(t->buffer, t->buffer_offs, host, sl_nbytes(t));
}

#define NEED(be, member)                                                                                     \
    do {                                                                                                     \
        if (!(be)->member)                                                                                   \
            return sl_fail(SL_ERR_UNSUPPORTED, "%s backend: no '%s' operation", (be)->name, #member);        \
        (be)->stats.state_ops++;                                                                             \
    } while (0)

sl_status sl_backend_adamw(sl_backend *be, const sl_adamw_call *c) {
    NEED(be, adamw);
    if (c->p->backend != be || c->g->backend != be || c->m->backend != be || c->v->backend != be)
        return sl_fail(SL_ERR_INVALID, "%s backend: adamw over buffers of another backend", be->name);
    return be->adamw(be, c);
}
sl_status sl_backend_sumsq(sl_backend *be, const sl_buffer *buf, int64_t off, int64_t n, double *out) {
    NEED(be, sumsq);
    return be->sumsq(be, buf, off, n, out);
}
sl_status sl_backend_scale(sl_backend *be, sl_buffer *buf, int64_t off, int64_t n, float s) {
    NEED(be, scale);
    return be->scale(be, buf, off, n, s);
}
sl_status sl_backend_fill(sl_backend *be, sl_buffer *buf, int64_t off, int64_t n, float v) {
    NEED(be, fill);
    return be->fill(be, buf, off, n, v);
}
sl_status sl_backend_memset_zero(sl_buffer *buf, size_t off, size_t n) {
    sl_backend *be = buf->backend;
    NEED(be, memset_zero);
    SL_TRY(check_range(buf, off, n, "memset_zero"));
    return n ? be->memset_zero(buf, off, n) : SL_OK;
}
sl_status sl_backend_copy(sl_buffer *dst, size_t doff, const sl_buffer *src, size_t soff, size_t n) {
    sl_backend *be = dst->backend;
    NEED(be, copy);
    if (src->backend != be)
        return sl_fail(SL_ERR_INVALID, "%s backend: copy from a %s buffer", be->name, src->backend->name);
    SL_TRY(check_range(dst, doff, n, "copy"));
    SL_TRY(check_range(src, soff, n, "copy"));
    return n ? be->copy(dst, doff, src, soff, n) : SL_OK;
}

/* ---------------- inventory ---------------- */

void sl_device_inventory_get(sl_device_inventory *inv) {
    memset(inv, 0, sizeof *inv);
    int have_opencl = 0, have_cuda = 0;
    for (int i = 0; i < N_REGISTRY && inv->n_runtimes < SL_INVENTORY_MAX_RUNTIMES; i++) {
        sl_runtime_info *r = &inv->runtimes[inv->n_runtimes++];
        const char *nm = k_registry[i].name;
        snprintf(r->name, sizeof r->name, "%s", nm);
        r->built = r->registered = 1;
        r->n_devices = -1;
        if (!strcmp(nm, "cpu")) {
            const char *k = sl_gemm_bf16_kernel_name(); /* Note [Widened bf16 GEMM] */
            snprintf(r->note, sizeof r->note,
                     "host CPU, ISA %s, bf16 GEMM on %s, %d thread%s (OMP_NUM_THREADS / --threads)",
                     sl_cpu_isa_name(),
                     !strcmp(k, "amx")           ? "AMX tiles"
                     : !strcmp(k, "avx512_bf16") ? "vdpbf16ps"
                                                 : "fp32 (widened)",
                     sl_threads_get(), sl_threads_get() == 1 ? "" : "s");
        } else if (!strcmp(nm, "strict"))
            snprintf(r->note, sizeof r->note,
                     "test backend: the CPU kernels behind memory the host cannot touch (PROT_NONE)");
        else if (!strcmp(nm, "null"))
            snprintf(r->note, sizeof r->note, "template backend: supports no op");
        else if (!strcmp(nm, "opencl")) {
            int n = 0;
            sl_opencl_inventory(r, inv->devices + inv->n_devices, SL_INVENTORY_MAX_DEVICES - inv->n_devices,
                                &n);
            r->registered = 1;
            inv->n_devices += n;
            have_opencl = 1;
        } else if (!strcmp(nm, "cuda")) {
            int n = 0;
            sl_cuda_inventory(r, inv->devices + inv->n_devices, SL_INVENTORY_MAX_DEVICES - inv->n_devices,
                              &n);
            r->registered = 1;
            inv->n_devices += n;
            have_cuda = 1;
        }
    }
    if (!have_opencl && inv->n_runtimes < SL_INVENTORY_MAX_RUNTIMES) {
        int n = 0;
        sl_opencl_inventory(&inv->runtimes[inv->n_runtimes++], inv->devices, 0, &n);
    }
    if (!have_cuda && inv->n_runtimes < SL_INVENTORY_MAX_RUNTIMES) {
        int n = 0;
        sl_cuda_inventory(&inv->runtimes[inv->n_runtimes++], inv->devices, 0, &n);
    }
}
