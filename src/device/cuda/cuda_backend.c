/* The CUDA backend: device selection, memory (cudaMalloc'd buffers), copies on the backend's stream, the
 * state operations, and the contract struct. Ops are in cuda_ops.c / cuda_ops_nn.c, kernels in
 * kernels/ (*.cu, built by nvcc: Note [CUDA build: nvcc as a custom step] in cmake/cuda.cmake).
 *
 * Note [CUDA device addresses]
 * sl_buffer.base is the cudaMalloc'd device pointer itself (caps.host_visible = 0: sl_buffer_map is
 * refused). The executor computes a tensor's data address as base + offset, so kernels receive t->data
 * directly; with unified virtual addressing no host allocation can share an address with device memory.
 * A kernel launch resolves each tensor through t->buffer when it is one of ours, else by finding the live
 * buffer whose range holds t->data; a tensor in neither (a leaf bound to host memory with sl_tensor_bind)
 * is refused with a message naming it.
 *
 * Note [CUDA stream order]
 * Everything goes on one non-blocking stream: copies (cudaMemcpyAsync; the synchronous ones then wait with
 * cudaStreamSynchronize), memsets, kernels, cuBLAS (cublasSetStream). So an async copy is ordered before
 * every later call, as the contract asks, and synchronize is cudaStreamSynchronize. Host memory is pageable
 * (no pinned staging yet): a device-to-host async copy to pageable memory completes before it returns. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/accel_support.h"
#include "device/cuda/cuda_internal.h"

cu_state g_cu;
static sl_backend g_be;

static struct {
    sl_buffer **v;
    int n, cap;
} g_bufs; /* every live buffer, for address lookups */

sl_status cu_fail(cudaError_t err, const char *what) {
    return sl_fail(SL_ERR_INTERNAL, "cuda backend: %s failed (%s: %s) on %s", what, cudaGetErrorName(err),
                   cudaGetErrorString(err), g_cu.device_name[0] ? g_cu.device_name : "no device");
}
sl_status cu_blas_fail(cublasStatus_t st, const char *what) {
    return sl_fail(SL_ERR_INTERNAL, "cuda backend: %s failed (cuBLAS status %d) on %s", what, (int)st,
                   g_cu.device_name);
}

/* ---------------- initialisation ---------------- */

static sl_status init_fail(const char *msg) {
    snprintf(g_cu.init_err, sizeof g_cu.init_err, "%s", msg);
    return sl_fail(SL_ERR_UNSUPPORTED, "%s", msg);
}

static int env_on(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

static sl_status init_device(void) {
    int n = 0;
    char msg[400];
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        snprintf(msg, sizeof msg, "cuda backend: no device (cudaGetDeviceCount: %s)",
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return init_fail(msg);
    }
    const char *e = getenv("SUANLI_CUDA_DEVICE");
    int want = e && *e ? atoi(e) : 0;
    if (want < 0 || want >= n) {
        snprintf(msg, sizeof msg, "cuda backend: no device %d (%d CUDA device%s found)", want, n,
                 n == 1 ? "" : "s");
        return init_fail(msg);
    }
    g_cu.device = want;
    if ((err = cudaSetDevice(want)) != cudaSuccess) {
        snprintf(msg, sizeof msg, "cuda backend: no device (cudaSetDevice(%d): %s)", want,
                 cudaGetErrorString(err));
        return init_fail(msg);
    }
    struct cudaDeviceProp prop;
    if ((err = cudaGetDeviceProperties(&prop, want)) != cudaSuccess)
        return cu_fail(err, "cudaGetDeviceProperties");
    snprintf(g_cu.device_name, sizeof g_cu.device_name, "%s", prop.name);
    g_cu.cc_major = prop.major;
    g_cu.cc_minor = prop.minor;
    g_cu.total_mem = prop.totalGlobalMem;
    if ((err = cudaStreamCreateWithFlags(&g_cu.stream, cudaStreamNonBlocking)) != cudaSuccess)
        return cu_fail(err, "cudaStreamCreate");
    if (cu_blas_load(msg, sizeof msg) != SL_OK) return init_fail(msg);
    cublasStatus_t bs = g_blas.create(&g_cu.blas);
    if (bs != CUBLAS_STATUS_SUCCESS) return cu_blas_fail(bs, "cublasCreate");
    if ((bs = g_blas.set_stream(g_cu.blas, g_cu.stream)) != CUBLAS_STATUS_SUCCESS)
        return cu_blas_fail(bs, "cublasSetStream");
    g_cu.tf32 = env_on("SUANLI_CUDA_TF32");
    g_cu.deterministic = env_on("SUANLI_CUDA_DETERMINISTIC");
    if ((err = cudaMalloc((void **)&g_cu.flag, 2 * sizeof(int))) != cudaSuccess)
        return cu_fail(err, "cudaMalloc (flag)");
    if ((err = cudaMemsetAsync(g_cu.flag, 0, 2 * sizeof(int), g_cu.stream)) != cudaSuccess)
        return cu_fail(err, "cudaMemset (flag)");
    SL_LOGI("cuda backend: %s (sm_%d%d, %.1f GiB)%s", g_cu.device_name, g_cu.cc_major, g_cu.cc_minor,
            (double)g_cu.total_mem / (1u << 30), g_cu.tf32 ? ", TF32 GEMMs" : "");
    return SL_OK;
}

/* Always declared in suanli/device.h. Returns NULL with a message (containing "no device" when no CUDA
 * device or driver is usable) when the device cannot be initialised; the first call decides. */
sl_backend *sl_backend_cuda(void) {
    if (!g_cu.tried) {
        g_cu.tried = 1;
        g_cu.init_st = init_device();
        if (g_cu.init_st != SL_OK && !g_cu.init_err[0])
            snprintf(g_cu.init_err, sizeof g_cu.init_err, "%s", sl_errmsg());
    }
    if (g_cu.init_st != SL_OK) {
        sl_fail(g_cu.init_st, "%s", g_cu.init_err);
        return NULL;
    }
    return &g_be;
}

/* ---------------- helpers ---------------- */

sl_status cu_scratch(size_t bytes, void **out) {
    if (bytes > g_cu.scratch_size) {
        if (g_cu.scratch) cudaFree(g_cu.scratch); /* cudaFree waits for the work queued on it */
        size_t sz = bytes < 4096 ? 4096 : bytes;
        cudaError_t err = cudaMalloc(&g_cu.scratch, sz);
        if (err != cudaSuccess) {
            g_cu.scratch = NULL;
            g_cu.scratch_size = 0;
            return cu_fail(err, "cudaMalloc (scratch)");
        }
        g_cu.scratch_size = sz;
    }
    *out = g_cu.scratch;
    return SL_OK;
}

sl_status cu_check_flag(const char *what, int64_t limit) {
    int f[2] = {0, 0};
    cudaError_t err = cudaMemcpyAsync(f, g_cu.flag, sizeof f, cudaMemcpyDeviceToHost, g_cu.stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(g_cu.stream);
    if (err != cudaSuccess) return cu_fail(err, "reading the id check");
    if (!f[0]) return SL_OK;
    cudaMemsetAsync(g_cu.flag, 0, sizeof f, g_cu.stream);
    return sl_fail(SL_ERR_INVALID, "%s: id %d out of range [0, %lld)", what, f[1], (long long)limit);
}

/* ---------------- tensors -> device pointers ---------------- */

/* bytes spanned by t's elements (strided) */
static size_t extent_bytes(const sl_tensor *t) {
    int64_t hi = 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->ne[d] > 0) hi += (t->ne[d] - 1) * t->nb[d];
    return (size_t)(hi + 1) * sl_dtype_size(t->dtype);
}

static int holds(const sl_buffer *b, const void *p, size_t n) {
    const char *c = p, *base = b->base;
    return c >= base && c + n <= base + (b->size ? b->size : 1);
}

sl_status cu_ptr_of(const sl_tensor *n, const sl_tensor *t, void **p) {
    size_t need = extent_bytes(t) + (t == n ? n->aux_bytes : 0);
    const sl_buffer *b = NULL;
    if (t->buffer && t->buffer->backend == &g_be && holds(t->buffer, t->data, need)) b = t->buffer;
    for (int i = 0; !b && i < g_bufs.n; i++)
        if (holds(g_bufs.v[i], t->data, need)) b = g_bufs.v[i];
    if (!b) {
        if (t == n)
            return sl_fail(SL_ERR_INVALID, "cuda backend: node '%s' (%s) writes outside device memory",
                           n->name, sl_op_name(n->op));
        return sl_fail(SL_ERR_INVALID,
                       "cuda backend: node '%s' (%s) reads '%s' outside device memory (a host pointer bound "
                       "with sl_tensor_bind?)",
                       n->name, sl_op_name(n->op), t->name);
    }
    size_t off = (size_t)((const char *)t->data - (const char *)b->base), es = sl_dtype_size(t->dtype);
    if (off % es)
        return sl_fail(SL_ERR_INVALID, "cuda backend: tensor '%s' at byte %zu is not %zu-byte aligned",
                       t->name, off, es);
    *p = t->data;
    return SL_OK;
}

sl_status cu_aux_of(const sl_tensor *n, const sl_tensor *t, float **p) {
    void *q;
    SL_TRY(cu_ptr_of(n, t, &q));
    size_t off = sl_nbytes(t);
    if (off % sizeof(float))
        return sl_fail(SL_ERR_INVALID, "cuda backend: aux of '%s' is not 4-byte aligned", t->name);
    *p = (float *)((char *)q + off);
    return SL_OK;
}

/* ---------------- memory ---------------- */

static sl_status cuda_alloc(sl_backend *be, size_t bytes, sl_buffer **out) {
    sl_buffer *b = calloc(1, sizeof *b);
    if (g_bufs.n == g_bufs.cap) {
        int cap = g_bufs.cap ? 2 * g_bufs.cap : 64;
        sl_buffer **v = realloc(g_bufs.v, sizeof *v * (size_t)cap);
        if (v) g_bufs.v = v, g_bufs.cap = cap;
    }
    if (!b || g_bufs.n == g_bufs.cap) {
        free(b);
        return sl_fail(SL_ERR_NOMEM, "cuda backend: out of host memory");
    }
    size_t sz = bytes ? (bytes + 255) / 256 * 256 : 256;
    cudaError_t err = cudaMalloc(&b->base, sz);
    if (err == cudaSuccess) err = cudaMemsetAsync(b->base, 0, sz, g_cu.stream);
    if (err != cudaSuccess) {
        if (b->base) cudaFree(b->base);
        free(b);
        return sl_fail(SL_ERR_NOMEM, "cuda backend: cannot allocate %zu bytes on %s (%s)", bytes,
                       g_cu.device_name, cudaGetErrorString(err));
    }
    b->size = bytes;
    b->backend = be;
    g_bufs.v[g_bufs.n++] = b;
    *out = b;
    return SL_OK;
}

static void cuda_free(sl_backend *be, sl_buffer *b) {
    (void)be;
    for (int i = 0; i < g_bufs.n; i++)
        if (g_bufs.v[i] == b) {
            g_bufs.v[i] = g_bufs.v[--g_bufs.n];
            break;
        }
    cudaFree(b->base); /* waits for queued work */
    free(b);
}

/* Ranges are checked by the generic helpers (src/device/registry.c) before these run. */
static sl_status cuda_copy_in_async(sl_buffer *dst, size_t off, const void *host, size_t n) {
    cudaError_t err = cudaMemcpyAsync((char *)dst->base + off, host, n, cudaMemcpyHostToDevice, g_cu.stream);
    return cu_ok(err, "copy_in");
}
static sl_status cuda_copy_out_async(const sl_buffer *src, size_t off, void *host, size_t n) {
    cudaError_t err =
        cudaMemcpyAsync(host, (const char *)src->base + off, n, cudaMemcpyDeviceToHost, g_cu.stream);
    return cu_ok(err, "copy_out");
}
static sl_status cuda_sync(sl_backend *be) {
    (void)be;
    return cu_ok(cudaStreamSynchronize(g_cu.stream), "cudaStreamSynchronize");
}
static sl_status cuda_copy_in(sl_buffer *dst, size_t off, const void *host, size_t n) {
    SL_TRY(cuda_copy_in_async(dst, off, host, n));
    return cuda_sync(NULL);
}
static sl_status cuda_copy_out(const sl_buffer *src, size_t off, void *host, size_t n) {
    SL_TRY(cuda_copy_out_async(src, off, host, n));
    return cuda_sync(NULL);
}
static sl_status cuda_memset(sl_buffer *b, size_t off, size_t n) {
    if (off > b->size || n > b->size - off)
        return sl_fail(SL_ERR_INVALID, "cuda backend: memset out of range");
    if (!n) return SL_OK;
    return cu_ok(cudaMemsetAsync((char *)b->base + off, 0, n, g_cu.stream), "memset_zero");
}
static sl_status cuda_copy(sl_buffer *dst, size_t doff, const sl_buffer *src, size_t soff, size_t n) {
    if (src->backend != dst->backend) return sl_fail(SL_ERR_INVALID, "cuda backend: copy across backends");
    if (doff > dst->size || n > dst->size - doff || soff > src->size || n > src->size - soff)
        return sl_fail(SL_ERR_INVALID, "cuda backend: copy of %zu bytes out of range", n);
    if (src == dst && doff < soff + n && soff < doff + n)
        return sl_fail(SL_ERR_INVALID, "cuda backend: copy between overlapping regions");
    if (!n) return SL_OK;
    cudaError_t err = cudaMemcpyAsync((char *)dst->base + doff, (const char *)src->base + soff, n,
                                      cudaMemcpyDeviceToDevice, g_cu.stream);
    return cu_ok(err, "copy");
}

/* ---------------- state operations ---------------- */

static float *f32_at(const sl_buffer *b, int64_t off) { return (float *)b->base + off; }

/* Note [AdamW order of operations] (src/device/cpu/kernels/optim.c): kernels/optim.cu computes each element
 * with the same single-precision operations in the same order, with the step constants computed here as
 * the CPU does. One launch per span. */
static sl_status cuda_adamw(sl_backend *be, const sl_adamw_call *c) {
    (void)be;
    SL_TRY(sl_accel_adamw_check(c, "cuda"));
    sl_accel_adamw_consts ac = sl_accel_adamw_consts_of(c);
    float step = ac.step, bc2s = ac.bc2_sqrt, dec_on = ac.decay_on;
    for (int i = 0; i < c->n_spans; i++) {
        const sl_adamw_span *s = &c->spans[i];
        SL_TRY(
            cu_ok(cu_adamw(g_cu.stream, f32_at(c->p, s->p_offs), f32_at(c->g, s->g_offs),
                           f32_at(c->m, s->s_offs), f32_at(c->v, s->s_offs), s->n, s->decay ? dec_on : 1.0f,
                           c->gscale, c->hp.beta1, c->hp.beta2, c->hp.eps, step, bc2s),
                  "adamw"));
    }
    return SL_OK;
}

/* Note [CUDA sumsq order] (kernels/optim.cu): chunk sums on the device, added here in chunk order. */
static sl_status cuda_sumsq(sl_backend *be, const sl_buffer *b, int64_t off, int64_t n, double *out) {
    (void)be;
    if (!sl_accel_span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "cuda backend: sumsq out of range");
    int64_t nch = (n + 65535) / 65536;
    *out = 0;
    if (!nch) return SL_OK;
    void *part;
    SL_TRY(cu_scratch(sizeof(double) * (size_t)nch, &part));
    SL_TRY(cu_ok(cu_sumsq_chunks(g_cu.stream, f32_at(b, off), n, part), "sumsq"));
    double local[64], *h = nch <= 64 ? local : malloc(sizeof(double) * (size_t)nch);
    if (!h) return sl_fail(SL_ERR_NOMEM, "cuda backend: sumsq: out of memory");
    cudaError_t err =
        cudaMemcpyAsync(h, part, sizeof(double) * (size_t)nch, cudaMemcpyDeviceToHost, g_cu.stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(g_cu.stream);
    double ss = 0;
    for (int64_t i = 0; err == cudaSuccess && i < nch; i++) ss += h[i];
    if (h != local) free(h);
    if (err != cudaSuccess) return cu_fail(err, "sumsq read");
    *out = ss;
    return SL_OK;
}

static sl_status cuda_scale(sl_backend *be, sl_buffer *b, int64_t off, int64_t n, float s) {
    (void)be;
    if (!sl_accel_span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "cuda backend: scale out of range");
    return cu_ew_flat(CU_EW_SCALE, s, f32_at(b, off), n);
}
static sl_status cuda_fill(sl_backend *be, sl_buffer *b, int64_t off, int64_t n, float v) {
    (void)be;
    if (!sl_accel_span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "cuda backend: fill out of range");
    return cu_ew_flat(CU_EW_FILL, v, f32_at(b, off), n);
}

/* ---------------- compute ---------------- */

static int cuda_supports_be(sl_backend *be, const sl_tensor *n) {
    (void)be;
    return cu_supports(n);
}

static sl_status cuda_compute_be(sl_backend *be, sl_tensor *n) {
    be->stats.nodes++;
    return cu_compute(n);
}

static sl_backend g_be = {
    .name = "cuda",
    .caps = {.alignment = 256, .host_visible = 0, .async_copies = 1},
    .buffer_alloc = cuda_alloc,
    .buffer_free = cuda_free,
    .copy_in = cuda_copy_in,
    .copy_out = cuda_copy_out,
    .memset_zero = cuda_memset,
    .copy = cuda_copy,
    .copy_in_async = cuda_copy_in_async,
    .copy_out_async = cuda_copy_out_async,
    .synchronize = cuda_sync,
    .supports_op = cuda_supports_be,
    .compute_node = cuda_compute_be,
    .adamw = cuda_adamw,
    .sumsq = cuda_sumsq,
    .scale = cuda_scale,
    .fill = cuda_fill,
};

/* ---------------- inventory (suanli devices) ---------------- */

void sl_cuda_inventory(sl_runtime_info *rt, sl_device_info *devs, int cap, int *n) {
    *n = 0;
    snprintf(rt->name, sizeof rt->name, "cuda");
    rt->built = 1;
    int count = 0, rtv = 0, drv = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    (void)cudaRuntimeGetVersion(&rtv);
    (void)cudaDriverGetVersion(&drv);
    if (err != cudaSuccess || count == 0) {
        rt->n_devices = 0;
        snprintf(rt->note, sizeof rt->note, "runtime %d.%d, driver %d.%d: no device (%s)", rtv / 1000,
                 rtv % 1000 / 10, drv / 1000, drv % 1000 / 10,
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return;
    }
    rt->n_devices = count;
    snprintf(rt->note, sizeof rt->note, "runtime %d.%d, driver %d.%d, %d device%s", rtv / 1000,
             rtv % 1000 / 10, drv / 1000, drv % 1000 / 10, count, count == 1 ? "" : "s");
    for (int i = 0; i < count && *n < cap; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        sl_device_info *d = &devs[(*n)++];
        memset(d, 0, sizeof *d);
        snprintf(d->backend, sizeof d->backend, "cuda");
        d->index = i;
        snprintf(d->name, sizeof d->name, "%.127s", p.name);
        snprintf(d->vendor, sizeof d->vendor, "NVIDIA");
        snprintf(d->driver, sizeof d->driver, "%d.%d", drv / 1000, drv % 1000 / 10);
        snprintf(d->version, sizeof d->version, "compute capability %d.%d", p.major, p.minor);
        snprintf(d->type, sizeof d->type, "gpu");
        d->compute_units = p.multiProcessorCount;
        d->global_mem = (int64_t)p.totalGlobalMem;
        d->local_mem = (int64_t)p.sharedMemPerBlock;
        d->max_alloc = (int64_t)p.totalGlobalMem;
        d->max_work_group = p.maxThreadsPerBlock;
        d->fp64 = 1;
        d->fp16 = p.major >= 6;
    }
}
