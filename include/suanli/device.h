/* suanli/device.h — the backend contract. A backend is a struct of function pointers over opaque buffers.
 *
 * Usage:
 *   sl_backend *be = sl_backend_get("cpu");               // borrowed, lives for the process
 *   sl_buffer *buf; sl_backend_alloc(be, bytes, &buf);
 *   sl_backend_copy_in(buf, 0, host, bytes);               // host -> device
 *   if (be->supports_op(be, node)) be->compute_node(be, node);
 *   sl_backend_copy_out(buf, 0, host, bytes);              // device -> host
 *   float *p = sl_buffer_map(buf);                          // NULL unless be->caps.host_visible
 *   sl_backend_free(be, buf);
 *
 * Note [Device-resident state]
 * Parameters, gradients, optimizer moments, activations and the loss live in buffers of a backend. Code
 * above src/device never dereferences a device address (sl_tensor.data, sl_buffer_base): it moves bytes
 * with copy_in / copy_out, or maps a buffer when the backend declares its memory host-visible
 * (caps.host_visible: the CPU backend). The state operations a training step needs besides the graph
 * (AdamW over spans of the flat buffers, the gradient sum of squares, scaling, zeroing, buffer-to-buffer
 * copies) are members of the contract too, so the optimizer, clipping and the data-parallel buffer
 * operations run where the state lives. The `strict` test backend keeps its memory PROT_NONE outside its
 * own calls, so any host dereference of device memory faults; tests/backend runs every model through it.
 *
 * Note [Unsupported ops]
 * A backend says which nodes it can run (supports_op: op, dtypes, layout). The executor refuses a graph
 * with a node the backend does not support, with one message naming the backend, the op and the dtype
 * (SL_ERR_UNSUPPORTED); there is no silent fallback. The user may ask for one: with SUANLI_HOST_FALLBACK=1
 * the executor runs such a node on the CPU backend on copies of its operands (Note [Host fallback],
 * src/graph/host_fallback.c; a warning per op kind) and counts it in stats.fallback_nodes. A backend that
 * wants the CPU to run an op for it may also do so inside its own compute_node and count it there.
 *
 * Adding a backend: copy src/device/null/, fill in the members, give an honest supports_op, add one line
 * to the registry in src/device/registry.c. docs/ADDING-A-BACKEND.md walks through it.
 */
#ifndef SUANLI_DEVICE_H
#define SUANLI_DEVICE_H

#include "suanli/base.h"
#include "suanli/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_backend sl_backend;
typedef struct sl_graph sl_graph;
/* Completion hook: called after node `n` (position `i`) has been computed. Returning non-OK stops. */
typedef sl_status (*sl_node_hook)(sl_graph *g, int i, sl_tensor *n, void *user);

typedef struct sl_buffer {
    struct sl_backend *backend;
    void *base; /* device address of byte 0 (dereferenceable only when the backend is host-visible) */
    size_t size;
    void *impl; /* backend-private */
} sl_buffer;

/* What a backend's memory is (ggml-backend's buffer type, reduced to what callers need). */
typedef struct sl_backend_caps {
    size_t alignment; /* every buffer base is aligned to this (bytes, power of two) */
    int host_visible; /* 1: device addresses are host pointers (sl_buffer_map works) */
    int async_copies; /* 1: copy_in_async/copy_out_async complete only at synchronize */
    /* 1: the kernels of the ops in sl_op_may_overwrite (graph.c) read each input element before writing the
     * output element at the same index, so the planner may give an output the storage of an input that
     * dies there (Note [Donated storage]) */
    int donate_inputs;
    /* 1: MATMUL runs a bf16 A with an f32 B rounded to bf16 (iparams[SL_MATMUL_IP_HALF_B]), so models build
     * autocast Linears without weight casts (Note [Fused weight casts], src/ops/backward.c) */
    int matmul_half_b;
} sl_backend_caps;

/* Counters a backend keeps (for tests and diagnostics). */
typedef struct sl_backend_stats {
    int64_t nodes;          /* compute_node calls */
    int64_t state_ops;      /* adamw / sumsq / scale / fill / copy calls */
    int64_t bytes_in;       /* host -> device */
    int64_t bytes_out;      /* device -> host */
    int64_t fallback_nodes; /* nodes run on the CPU for this backend (see Note [Unsupported ops]) */
} sl_backend_stats;

/* AdamW hyper-parameters (PyTorch names) */
typedef struct sl_adamw_hparams {
    float beta1, beta2, eps, weight_decay;
} sl_adamw_hparams;

/* One contiguous span of an AdamW update: n elements of p at p_offs (elements), of g at g_offs and of
 * both moments at s_offs; decay: weight decay applies. */
typedef struct sl_adamw_span {
    int64_t p_offs, g_offs, s_offs, n;
    int decay;
} sl_adamw_span;

/* One AdamW step over spans of f32 buffers (Note [AdamW order of operations] in
 * src/device/cpu/kernels/optim.c): gradients are multiplied by gscale as they are read (clipping),
 * t >= 1 is the step number for bias correction. */
typedef struct sl_adamw_call {
    sl_buffer *p, *g, *m, *v;
    const sl_adamw_span *spans;
    int n_spans;
    float lr, gscale;
    sl_adamw_hparams hp;
    int64_t t;
} sl_adamw_call;

struct sl_backend {
    const char *name;
    void *impl; /* backend-private state */
    sl_backend_caps caps;
    sl_backend_stats stats;
    /* ---- memory (required) ---- */
    sl_status (*buffer_alloc)(sl_backend *be, size_t bytes, sl_buffer **out); /* zero-filled */
    void (*buffer_free)(sl_backend *be, sl_buffer *buf);
    sl_status (*copy_in)(sl_buffer *dst, size_t offset, const void *host, size_t bytes);
    sl_status (*copy_out)(const sl_buffer *src, size_t offset, void *host, size_t bytes);
    sl_status (*memset_zero)(sl_buffer *buf, size_t offset, size_t bytes);
    /* optional, host-visible backends only: a buffer over existing host memory (not freed with it), e.g. a
     * communicator's shared-memory window that data parallelism keeps the gradients in */
    sl_status (*buffer_from_host)(sl_backend *be, void *ptr, size_t bytes, sl_buffer **out);
    /* device -> device within this backend; regions may not overlap */
    sl_status (*copy)(sl_buffer *dst, size_t dst_offset, const sl_buffer *src, size_t src_offset,
                      size_t bytes);
    /* ---- asynchrony (optional: NULL means copies are synchronous) ----
     * An async copy is ordered before every later call on the backend; the host memory must stay valid
     * (and, for copy_out_async, must not be read) until synchronize returns. */
    sl_status (*copy_in_async)(sl_buffer *dst, size_t offset, const void *host, size_t bytes);
    sl_status (*copy_out_async)(const sl_buffer *src, size_t offset, void *host, size_t bytes);
    sl_status (*synchronize)(sl_backend *be); /* waits for everything issued so far */
    /* ---- compute (required) ---- */
    int (*supports_op)(sl_backend *be, const sl_tensor *node);
    sl_status (*compute_node)(sl_backend *be, sl_tensor *node);
    /* optional: run nodes [start,end) of a graph at once (fusion, launch batching). If NULL the
     * executor calls compute_node per node. */
    sl_status (*graph_compute)(sl_backend *be, sl_graph *g, int start, int end, sl_node_hook hook,
                               void *user);
    /* ---- state operations on f32 buffers (required for training) ---- */
    sl_status (*adamw)(sl_backend *be, const sl_adamw_call *c);
    /* sum of squares of n f32 elements at element offset off, in double, in an order fixed by (off, n)
     * (65536-element chunks of 8 lanes): the same bits for any thread count. */
    sl_status (*sumsq)(sl_backend *be, const sl_buffer *buf, int64_t off, int64_t n, double *out);
    sl_status (*scale)(sl_backend *be, sl_buffer *buf, int64_t off, int64_t n, float s); /* x *= s */
    sl_status (*fill)(sl_backend *be, sl_buffer *buf, int64_t off, int64_t n, float v);  /* x = v */
};

/* Registry: "cpu" always, "strict" (test backend, memory not host-addressable), "null" (template).
 * Returns NULL (with sl_errmsg naming the backend and the known ones) if unknown.
 * Note [Device names with a suffix]
 * "NAME:ARG" picks backend NAME and passes ARG to its selector: "opencl:N" is device N of the OpenCL
 * device list (every platform's devices in order, as `suanli devices` prints them). A backend without a
 * selector refuses a suffix. One device per backend per process: selecting another device of a backend
 * that is already initialised is refused. */
sl_backend *sl_backend_get(const char *name);
sl_backend *sl_backend_cpu(void);
sl_backend *sl_backend_null(void);
sl_backend *sl_backend_strict(void);
/* The OpenCL backend ("opencl", src/device/opencl): always declared. Returns NULL with sl_errmsg saying why
 * when it was not built (SL_OPENCL off or no OpenCL at configure time; the registry then does not list it)
 * or when no OpenCL device is present (the message says "no device"). SUANLI_OPENCL_DEVICE picks a device. */
sl_backend *sl_backend_opencl(void);
/* The CUDA backend ("cuda", src/device/cuda): always declared, like sl_backend_opencl. Returns NULL with
 * sl_errmsg saying why when it was not built (SL_CUDA off or no toolkit at configure time) or when no CUDA
 * device is usable (the message says "no device" and gives cudaGetDeviceCount's error). SUANLI_CUDA_DEVICE
 * picks a device. */
sl_backend *sl_backend_cuda(void);
/* "opencl:ARG": ARG is a device index (decimal, >= 0) into the OpenCL device list; overrides
 * SUANLI_OPENCL_DEVICE. NULL with sl_errmsg on a malformed index, a missing device, or when the backend is
 * already initialised on another device. */
sl_backend *sl_backend_opencl_select(const char *arg);
/* Names of the registered backends, NULL-terminated (borrowed). */
const char *const *sl_backend_names(void);

/* Inventory (`suanli devices`): the registered backends and the devices each runtime reports, filled
 * without initialising any backend. Strings are empty when unknown, numbers -1. */
typedef struct sl_device_info {
    char backend[16];   /* "opencl", "cuda" */
    int index;          /* its NAME:N index */
    char platform[128]; /* OpenCL platform name */
    char name[128], vendor[128], driver[64], version[128];
    char type[16]; /* "cpu", "gpu", "accelerator", "other" */
    int compute_units;
    int64_t global_mem, local_mem, max_alloc; /* bytes */
    int64_t max_work_group;
    int fp64, fp16; /* 1: supported (cl_khr_fp64 / cl_khr_fp16), 0: not */
} sl_device_info;

typedef struct sl_runtime_info {
    char name[16];  /* "cpu", "strict", "null", "opencl", "cuda" */
    int built;      /* compiled into this library */
    int registered; /* listed by sl_backend_names */
    int n_devices;  /* devices reported by the runtime (-1: does not apply) */
    char note[256]; /* one line: cpu ISA and threads; a runtime's platforms; why none is present */
} sl_runtime_info;

#define SL_INVENTORY_MAX_DEVICES 64
#define SL_INVENTORY_MAX_RUNTIMES 8
typedef struct sl_device_inventory {
    int n_runtimes, n_devices;
    sl_runtime_info runtimes[SL_INVENTORY_MAX_RUNTIMES];
    sl_device_info devices[SL_INVENTORY_MAX_DEVICES];
} sl_device_inventory;

/* Fills inv (registered backends first, then the runtimes not built). Never fails: a missing
 * runtime is a runtime with n_devices 0 and a note saying so. */
void sl_device_inventory_get(sl_device_inventory *inv);
/* The OpenCL part of the inventory (src/device/opencl; the stub reports it as not built). */
void sl_opencl_inventory(sl_runtime_info *rt, sl_device_info *devs, int cap, int *n);
/* The CUDA part (src/device/cuda; the stub reports it as not built). */
void sl_cuda_inventory(sl_runtime_info *rt, sl_device_info *devs, int cap, int *n);

sl_status sl_backend_alloc(sl_backend *be, size_t bytes, sl_buffer **out);
void sl_backend_free(sl_backend *be, sl_buffer *buf);
/* A buffer over host memory the caller owns (backends with buffer_from_host; else SL_ERR_UNSUPPORTED). */
sl_status sl_backend_wrap_host(sl_backend *be, void *ptr, size_t bytes, sl_buffer **out);
/* Copies through the contract (checked: range, backend members). Async variants fall back to the
 * synchronous copy when the backend has none. */
sl_status sl_backend_copy_in(sl_buffer *dst, size_t offset, const void *host, size_t bytes);
sl_status sl_backend_copy_out(const sl_buffer *src, size_t offset, void *host, size_t bytes);
sl_status sl_backend_copy_in_async(sl_buffer *dst, size_t offset, const void *host, size_t bytes);
sl_status sl_backend_copy_out_async(const sl_buffer *src, size_t offset, void *host, size_t bytes);
sl_status sl_backend_synchronize(sl_backend *be);
/* State operations through the contract (a backend lacking one: SL_ERR_UNSUPPORTED naming it). Offsets and
 * counts of adamw/sumsq/scale/fill are in f32 elements; memset_zero and copy in bytes. */
sl_status sl_backend_adamw(sl_backend *be, const sl_adamw_call *c);
sl_status sl_backend_sumsq(sl_backend *be, const sl_buffer *buf, int64_t off, int64_t n, double *out);
sl_status sl_backend_scale(sl_backend *be, sl_buffer *buf, int64_t off, int64_t n, float s);
sl_status sl_backend_fill(sl_backend *be, sl_buffer *buf, int64_t off, int64_t n, float v);
sl_status sl_backend_memset_zero(sl_buffer *buf, size_t offset, size_t bytes);
sl_status sl_backend_copy(sl_buffer *dst, size_t dst_offset, const sl_buffer *src, size_t src_offset,
                          size_t bytes);
/* Host pointer of a host-visible buffer's byte 0, or NULL (with sl_errmsg) when the backend's memory is
 * not host-visible. */
void *sl_buffer_map(sl_buffer *buf);
/* Device address of byte 0, for binding tensors (never dereferenced above src/device). */
static inline void *sl_buffer_base(const sl_buffer *buf) { return buf->base; }

/* Bind a leaf tensor to bytes [offset, offset + nbytes) of buf. */
void sl_tensor_bind_buffer(sl_tensor *t, sl_buffer *buf, size_t offset);
/* Contiguous tensor <-> host copies through its buffer (t->buffer must be set; t is resolved, i.e. a leaf
 * bound with sl_tensor_bind_buffer or a node of a planned and computed graph). */
sl_status sl_tensor_copy_in(sl_tensor *t, const void *host);
sl_status sl_tensor_copy_out(const sl_tensor *t, void *host);

#ifdef __cplusplus
}
#endif
#endif
