/* The OpenCL backend: device selection, memory (cl_mem buffers behind fake device addresses), copies,
 * the state operations, and the contract struct. Ops are in opencl_ops.c / opencl_ops_nn.c, the program
 * build and its disk cache in opencl_program.c, the kernels in kernels/ (*.cl).
 *
 * Note [OpenCL device addresses]
 * The executor computes a tensor's data address as buffer base + offset, and kernels receive tensors, so
 * every sl_buffer needs a unique base address although its memory is a cl_mem the host cannot address
 * (caps.host_visible = 0). Each buffer reserves a PROT_NONE, MAP_NORESERVE range of its size (no memory
 * is committed): the bases are unique, never overlap a host allocation, and a host dereference faults at
 * once, as with the strict backend. A kernel launch turns each tensor back into (cl_mem, element offset):
 * from t->buffer when it is one of ours (the executor and sl_tensor_bind_buffer set it), else by finding
 * the buffer whose range holds t->data; a tensor in neither (a leaf bound to host memory with
 * sl_tensor_bind) is refused with a message naming it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "device/accel_support.h"
#include "device/opencl/opencl_internal.h"

ocl_state g_ocl;
static sl_backend g_be;
static int g_want = -1; /* device index from "opencl:N" (-1: SUANLI_OPENCL_DEVICE, else 0) */

/* every live buffer, for address lookups */
static struct {
    sl_buffer **v;
    int n, cap;
} g_bufs;

sl_status ocl_fail(cl_int err, const char *what) {
    return sl_fail(SL_ERR_INTERNAL, "opencl backend: %s failed (OpenCL error %d) on %s", what, (int)err,
                   g_ocl.device_name[0] ? g_ocl.device_name : "no device");
}

/* ---------------- initialisation ---------------- */

static sl_status init_fail(const char *msg) {
    snprintf(g_ocl.init_err, sizeof g_ocl.init_err, "%s", msg);
    return sl_fail(SL_ERR_UNSUPPORTED, "%s", msg);
}

/* Device N (SUANLI_OPENCL_DEVICE, default 0) counting the devices of every platform in order. */
static sl_status pick_device(void) {
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    char msg[256];
    if (err != CL_SUCCESS || np == 0) {
        snprintf(msg, sizeof msg,
                 "opencl backend: no device (no OpenCL platform found, clGetPlatformIDs: %d; install an "
                 "ICD such as pocl-opencl-icd)",
                 (int)err);
        return init_fail(msg);
    }
    cl_platform_id plats[16];
    if (np > 16) np = 16;
    clGetPlatformIDs(np, plats, NULL);
    const char *e = getenv("SUANLI_OPENCL_DEVICE");
    int want = g_want >= 0 ? g_want : e && *e ? atoi(e) : 0, seen = 0;
    g_ocl.index = want;
    for (cl_uint p = 0; p < np; p++) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
        cl_device_id devs[64];
        if (nd > 64) nd = 64;
        clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, NULL);
        if (want < seen + (int)nd) {
            g_ocl.platform = plats[p];
            g_ocl.device = devs[want - seen];
            return SL_OK;
        }
        seen += (int)nd;
    }
    snprintf(msg, sizeof msg, "opencl backend: no device %d (%d OpenCL device%s found on %u platform%s)",
             want, seen, seen == 1 ? "" : "s", np, np == 1 ? "" : "s");
    return init_fail(msg);
}

/* Note [OpenCL GEMM tiles]
 * Two GEMM kernels, chosen per device type (CL_DEVICE_TYPE):
 * - GPU-type devices: k_gemm (kernels/gemm.cl), tiled in local memory. A work-group computes a TS x TS
 *   block of C, each work-item a 4 x 4 sub-block in registers; A and B are staged through local memory TK
 *   columns at a time (2 * TK * (TS + 1) floats: one word of padding per row keeps the column writes of
 *   neighbouring work-items in different banks). TS is the largest of 64, 32, 16 whose work-group
 *   ((TS/4)^2 items) fits CL_DEVICE_MAX_WORK_GROUP_SIZE and whose tiles fit half of
 *   CL_DEVICE_LOCAL_MEM_SIZE; TK = 16.
 * - CPU-type devices (PoCL): k_gemm_reg (kernels/gemm_reg.cl), register-blocked like a CPU BLAS
 *   micro-kernel. A work-group is a single work-item (PoCL then runs it as plain vector code: no
 *   work-item loop, no barriers). It computes MR x 32 tiles with 2*MR float16 accumulators (16 zmm
 *   registers at MR 8: one vector load of B and MR broadcasts of A per 2*MR FMAs); operands are read as
 *   panels ([panels][K][width], vector loads along the panel), always packed first by k_gemm_pack_*
 *   (Note [OpenCL GEMM packing]). K runs in blocks of KC, and each work-item
 *   takes MG consecutive m-tiles against one 32-wide B panel, so the 32 x KC slice of B (32 KiB at KC 256)
 *   stays in L1 across the MG tiles; partial sums between k-blocks go through a scratch Cp (M x N floats,
 *   each work-item's MG*MR x 32 block contiguous), in the same k order (Cp is allocated only when K > KC). KC
 * and MG are kernel arguments, MR a build option (it sizes the accumulator arrays). Defaults MR 8, KC 256,
 * MG 8. Measured (2026-12-01, PoCL 3.1, 2 Zen 4 cores, docs/BENCHMARKS.md "OpenCL backend on PoCL (issue
 *   14)"): the tiled kernel reaches 4-8 GFLOP/s there (~4% of the CPU backend); k_gemm_reg 50-210 GFLOP/s
 *   (roughly 50-100% of the CPU backend in the same run); MG 8-32 and KC 128-512 within the noise of a
 *   shared machine, MG 1 without k-blocks ~10% slower per CPU-second.
 *   PoCL 3.1 / LLVM 15 pitfall: with KC and MG as compile-time constants (-D options) some values (KC >=
 * 1024, MG 32) produced a kernel that wrote outside its buffers or skipped work (valgrind: invalid writes in
 *   k_gemm_reg; wrong results at 2x the machine's peak); as run-time arguments every value tested is
 *   correct. Not understood further; bench ops --device now checks every result against the CPU backend.
 * Overrides: SUANLI_OPENCL_GEMM=tiled|reg picks the kernel; SUANLI_OPENCL_GEMM_TILE (16, 32, 64) forces
 * TS and the tiled kernel; SUANLI_OPENCL_GEMM_MR, _KC, _MG set the register-blocked kernel's sizes.
 * Partial sums between k-blocks (Cp) were Mp x Np floats per GEMM (206 MB for the GPT-2 LM head at B*T =
 * 1024); now N is split into launches of as many 32-column panels as fit OCL_GEMM_CP_MAX (32 MiB;
 * SUANLI_OPENCL_GEMM_CP bytes overrides, which the tests use to force many launches). */
/* Note [OpenCL GEMM packing]
 * k_gemm_reg reads both operands from packed panels, also an A^T or B whose layout is already a panel
 * (until 2026-12-05 those were read in place). In place, consecutive k of a panel are ld floats apart: at
 * GPT-2's widths (768, 2304, 3072, 50304 floats) that stride maps the 2 cache lines of each k of B's
 * 32-wide panel into 4-16 of the 64 sets of a 48 KiB L1, so the KC x 32 slice that should stay in L1
 * across the MG m-tiles (256 k = 512 lines) kept evicting itself; perf put a third of k_gemm_reg's samples
 * on its B loads. The k-major pack (k_gemm_pack_n) moves 16 k per work-item with one vector per row; a
 * work-item per k cost more in PoCL's per-work-item overhead than the copy. Measured on PoCL 3.1, Intel
 * Xeon (AVX-512), bench ops --device opencl:0 --quick: docs/BENCHMARKS.md "OpenCL GEMM: packed panels".
 * The cost is scratch memory: op(A) and op(B) packed (the LM head's dX at B*T 256: 51 + 154 MB, where
 * 51 MB were packed before). */
static void choose_tiles(void) {
    const int cand[3] = {64, 32, 16};
    g_ocl.gemm_tk = 16;
    g_ocl.gemm_ts = 16;
    for (int i = 0; i < 3; i++) {
        size_t wg = (size_t)(cand[i] / 4) * (size_t)(cand[i] / 4);
        size_t lm = 2 * (size_t)g_ocl.gemm_tk * (size_t)(cand[i] + 1) * sizeof(float);
        if (wg <= g_ocl.max_wg && lm <= g_ocl.local_mem / 2) {
            g_ocl.gemm_ts = cand[i];
            break;
        }
    }
    cl_device_type type = 0;
    clGetDeviceInfo(g_ocl.device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    g_ocl.gemm_kind = (type & CL_DEVICE_TYPE_CPU) ? OCL_GEMM_REG : OCL_GEMM_TILED;
    /* row kernels (Note [OpenCL row reductions]): one vector of lanes per row on a CPU device, where the
     * work-items of a group are a loop (16: one zmm of floats), 256 work-items on a GPU */
    g_ocl.row_wg = (type & CL_DEVICE_TYPE_CPU) ? 16 : 256;
    g_ocl.gemm_mr = 8;
    if (type & CL_DEVICE_TYPE_CPU) g_ocl.gemm_ts = 16;
    const char *e = getenv("SUANLI_OPENCL_GEMM_TILE");
    if (e && (!strcmp(e, "16") || !strcmp(e, "32") || !strcmp(e, "64"))) {
        g_ocl.gemm_ts = atoi(e);
        g_ocl.gemm_kind = OCL_GEMM_TILED;
    }
    e = getenv("SUANLI_OPENCL_GEMM");
    if (e && !strcmp(e, "tiled")) g_ocl.gemm_kind = OCL_GEMM_TILED;
    if (e && !strcmp(e, "reg")) g_ocl.gemm_kind = OCL_GEMM_REG;
    e = getenv("SUANLI_OPENCL_GEMM_MR");
    if (e && atoi(e) >= 1 && atoi(e) <= 12) g_ocl.gemm_mr = atoi(e);
    g_ocl.gemm_kc = 256;
    g_ocl.gemm_mg = 8;
    e = getenv("SUANLI_OPENCL_GEMM_KC");
    if (e && atoi(e) >= 1 && atoi(e) <= 65536) g_ocl.gemm_kc = atoi(e);
    e = getenv("SUANLI_OPENCL_GEMM_MG");
    if (e && atoi(e) >= 1 && atoi(e) <= 4096) g_ocl.gemm_mg = atoi(e);
    g_ocl.gemm_cp_max = OCL_GEMM_CP_MAX;
    e = getenv("SUANLI_OPENCL_GEMM_CP");
    if (e && atoll(e) >= 1) g_ocl.gemm_cp_max = atoll(e);
}

static sl_status init_device(void) {
    SL_TRY(pick_device());
    cl_device_id d = g_ocl.device;
    clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof g_ocl.device_name - 1, g_ocl.device_name, NULL);
    clGetDeviceInfo(d, CL_DRIVER_VERSION, sizeof g_ocl.driver - 1, g_ocl.driver, NULL);
    cl_device_fp_config dfp = 0;
    clGetDeviceInfo(d, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof dfp, &dfp, NULL);
    g_ocl.has_fp64 = dfp != 0;
    clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof g_ocl.max_wg, &g_ocl.max_wg, NULL);
    clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof g_ocl.local_mem, &g_ocl.local_mem, NULL);
    choose_tiles();
    /* the register GEMM rounds an f32 weight into its bf16 panels (Note [OpenCL fused weight casts]) */
    g_be.caps.matmul_half_b = g_ocl.gemm_kind == OCL_GEMM_REG;
    const char *pe = getenv("SUANLI_PROFILE");
    g_ocl.prof = pe && *pe && strcmp(pe, "0") != 0;
    cl_int err;
    g_ocl.ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    if (err != CL_SUCCESS) return ocl_fail(err, "clCreateContext");
    g_ocl.queue = clCreateCommandQueue(g_ocl.ctx, d, 0, &err); /* in order */
    if (err != CL_SUCCESS) return ocl_fail(err, "clCreateCommandQueue");
    SL_TRY(ocl_program_build(&g_ocl));
    g_ocl.flag = clCreateBuffer(g_ocl.ctx, CL_MEM_READ_WRITE, 2 * sizeof(cl_int), NULL, &err);
    if (err != CL_SUCCESS) return ocl_fail(err, "clCreateBuffer (flag)");
    cl_int zero[2] = {0, 0};
    err = clEnqueueWriteBuffer(g_ocl.queue, g_ocl.flag, CL_TRUE, 0, sizeof zero, zero, 0, NULL, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "clEnqueueWriteBuffer (flag)");
    return SL_OK;
}

/* Always declared in suanli/device.h. Returns NULL with a message (naming "no device" when no OpenCL
 * platform or device is present) when the device cannot be initialised; the first call decides. */
sl_backend *sl_backend_opencl(void) {
    if (!g_ocl.tried) {
        g_ocl.tried = 1;
        g_ocl.init_st = init_device();
        if (g_ocl.init_st != SL_OK && !g_ocl.init_err[0])
            snprintf(g_ocl.init_err, sizeof g_ocl.init_err, "%s", sl_errmsg());
    }
    if (g_ocl.init_st != SL_OK) {
        sl_fail(g_ocl.init_st, "%s", g_ocl.init_err);
        return NULL;
    }
    return &g_be;
}

/* "opencl:N" (Note [Device names with a suffix] in suanli/device.h) */
sl_backend *sl_backend_opencl_select(const char *arg) {
    char *end = NULL;
    long v = arg && *arg >= '0' && *arg <= '9' ? strtol(arg, &end, 10) : -1;
    if (v < 0 || v > 4096 || !end || *end) {
        sl_fail(SL_ERR_INVALID,
                "device 'opencl:%s': expected opencl:N with N a device index (suanli devices)",
                arg ? arg : "");
        return NULL;
    }
    if (g_ocl.tried && g_ocl.init_st == SL_OK && g_ocl.index != (int)v) {
        sl_fail(SL_ERR_INVALID,
                "device 'opencl:%ld': the opencl backend already runs on device %d (%s); one "
                "OpenCL device per process",
                v, g_ocl.index, g_ocl.device_name);
        return NULL;
    }
    if (g_ocl.tried && g_ocl.init_st != SL_OK && g_want != (int)v) {
        g_ocl.tried = 0; /* a failed selection may be retried with another index */
        g_ocl.init_err[0] = 0;
    }
    g_want = (int)v;
    return sl_backend_opencl();
}

/* ---------------- inventory ---------------- */

static void dev_str(cl_device_id d, cl_device_info what, char *dst, size_t cap) {
    dst[0] = 0;
    if (clGetDeviceInfo(d, what, cap - 1, dst, NULL) != CL_SUCCESS) dst[0] = 0;
    dst[cap - 1] = 0;
}

/* suanli/device.h: the platforms and devices, queried without initialising the backend. */
void sl_opencl_inventory(sl_runtime_info *rt, sl_device_info *devs, int cap, int *n) {
    *n = 0;
    snprintf(rt->name, sizeof rt->name, "opencl");
    rt->built = 1;
    rt->n_devices = 0;
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    if (err != CL_SUCCESS || np == 0) {
        snprintf(rt->note, sizeof rt->note,
                 "runtime missing: no OpenCL platform found (clGetPlatformIDs: %d; install an ICD such as "
                 "pocl-opencl-icd, or a vendor driver)",
                 (int)err);
        return;
    }
    cl_platform_id plats[16];
    if (np > 16) np = 16;
    clGetPlatformIDs(np, plats, NULL);
    int len = snprintf(rt->note, sizeof rt->note, "%u platform%s:", np, np == 1 ? "" : "s");
    for (cl_uint p = 0; p < np; p++) {
        char pname[128] = "", pver[128] = "";
        clGetPlatformInfo(plats[p], CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
        clGetPlatformInfo(plats[p], CL_PLATFORM_VERSION, sizeof pver - 1, pver, NULL);
        if (len > 0 && (size_t)len < sizeof rt->note)
            len += snprintf(rt->note + len, sizeof rt->note - (size_t)len, "%s %s (%s)", p ? ";" : "", pname,
                            pver);
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
        cl_device_id ids[64];
        if (nd > 64) nd = 64;
        clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, ids, NULL);
        for (cl_uint i = 0; i < nd; i++, rt->n_devices++) {
            if (*n >= cap) continue;
            sl_device_info *o = &devs[(*n)++];
            memset(o, 0, sizeof *o);
            cl_device_id d = ids[i];
            snprintf(o->backend, sizeof o->backend, "opencl");
            o->index = rt->n_devices;
            snprintf(o->platform, sizeof o->platform, "%s", pname);
            dev_str(d, CL_DEVICE_NAME, o->name, sizeof o->name);
            dev_str(d, CL_DEVICE_VENDOR, o->vendor, sizeof o->vendor);
            dev_str(d, CL_DRIVER_VERSION, o->driver, sizeof o->driver);
            dev_str(d, CL_DEVICE_VERSION, o->version, sizeof o->version);
            cl_device_type t = 0;
            clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof t, &t, NULL);
            snprintf(o->type, sizeof o->type, "%s",
                     t & CL_DEVICE_TYPE_GPU           ? "gpu"
                     : t & CL_DEVICE_TYPE_CPU         ? "cpu"
                     : t & CL_DEVICE_TYPE_ACCELERATOR ? "accelerator"
                                                      : "other");
            cl_uint cu = 0;
            cl_ulong gm = 0, lm = 0, ma = 0;
            size_t wg = 0;
            cl_device_fp_config dfp = 0;
            o->compute_units =
                clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL) ? -1 : (int)cu;
            o->global_mem =
                clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gm, &gm, NULL) ? -1 : (int64_t)gm;
            o->local_mem =
                clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lm, &lm, NULL) ? -1 : (int64_t)lm;
            o->max_alloc =
                clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof ma, &ma, NULL) ? -1 : (int64_t)ma;
            o->max_work_group =
                clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) ? -1 : (int64_t)wg;
            clGetDeviceInfo(d, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof dfp, &dfp, NULL);
            o->fp64 = dfp != 0;
            size_t xn = 0;
            clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, 0, NULL, &xn);
            char *ext = xn ? calloc(1, xn + 1) : NULL;
            if (ext && clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, xn, ext, NULL) == CL_SUCCESS)
                o->fp16 = strstr(ext, "cl_khr_fp16") != NULL;
            free(ext);
        }
    }
    if (rt->n_devices == 0 && len > 0 && (size_t)len < sizeof rt->note)
        snprintf(rt->note + len, sizeof rt->note - (size_t)len, "; no device on any platform");
}

/* ---------------- launches ---------------- */

ocl_call ocl_begin(ocl_kernel_id id) {
    ocl_call c = {g_ocl.k[id], 0, CL_SUCCESS, NULL};
    if (!c.k) c.err = CL_INVALID_KERNEL;
    return c;
}

void ocl_arg(ocl_call *c, size_t size, const void *v) {
    if (c->err == CL_SUCCESS) c->err = clSetKernelArg(c->k, c->n, size, v);
    c->n++;
}

sl_status ocl_run(ocl_call *c, cl_uint dims, const size_t *global, const size_t *local) {
    char what[96];
    if (c->err != CL_SUCCESS) {
        snprintf(what, sizeof what, "setting argument %u of a kernel", c->n);
        return ocl_fail(c->err, what);
    }
    for (cl_uint i = 0; i < dims; i++)
        if (!global[i]) return SL_OK;
    cl_int err = clEnqueueNDRangeKernel(g_ocl.queue, c->k, dims, NULL, global, local, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        char name[64] = "?";
        clGetKernelInfo(c->k, CL_KERNEL_FUNCTION_NAME, sizeof name - 1, name, NULL);
        snprintf(what, sizeof what, "launching %s", name);
        return ocl_fail(err, what);
    }
    return SL_OK;
}

sl_status ocl_run1(ocl_call *c, size_t n) { return ocl_run(c, 1, &n, NULL); }

static sl_status grow_scratch(cl_mem *m, size_t *size, size_t bytes, const char *what) {
    if (bytes > *size) {
        if (*m) { /* after the queued work that uses it (rare: the scratch only grows) */
            cl_int ferr = clFinish(g_ocl.queue);
            if (ferr != CL_SUCCESS) return ocl_fail(ferr, "clFinish (scratch)");
            clReleaseMemObject(*m);
        }
        cl_int err;
        size_t sz = bytes < 4096 ? 4096 : bytes;
        *m = clCreateBuffer(g_ocl.ctx, CL_MEM_READ_WRITE, sz, NULL, &err);
        if (err != CL_SUCCESS) {
            *m = NULL;
            *size = 0;
            return ocl_fail(err, what);
        }
        *size = sz;
    }
    return SL_OK;
}

sl_status ocl_scratch(size_t bytes, cl_mem *out) {
    SL_TRY(grow_scratch(&g_ocl.scratch, &g_ocl.scratch_size, bytes, "clCreateBuffer (scratch)"));
    *out = g_ocl.scratch;
    return SL_OK;
}

sl_status ocl_scratch2(size_t bytes, cl_mem *out) {
    SL_TRY(grow_scratch(&g_ocl.scratch2, &g_ocl.scratch2_size, bytes, "clCreateBuffer (scratch2)"));
    *out = g_ocl.scratch2;
    return SL_OK;
}

sl_status ocl_read_flag(const char *reading, int *set, int *value) {
    cl_int f[2];
    cl_int err = clEnqueueReadBuffer(g_ocl.queue, g_ocl.flag, CL_TRUE, 0, sizeof f, f, 0, NULL, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, reading);
    *set = f[0] != 0, *value = f[1];
    if (!f[0]) return SL_OK;
    cl_int zero[2] = {0, 0};
    clEnqueueWriteBuffer(g_ocl.queue, g_ocl.flag, CL_TRUE, 0, sizeof zero, zero, 0, NULL, NULL);
    return SL_OK;
}

sl_status ocl_check_flag(const char *what, int64_t limit) {
    int set, v;
    SL_TRY(ocl_read_flag("reading the id check", &set, &v));
    if (!set) return SL_OK;
    return sl_fail(SL_ERR_INVALID, "%s: id %d out of range [0, %lld)", what, v, (long long)limit);
}

/* ---------------- tensors -> (cl_mem, offset) ---------------- */

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

sl_status ocl_ref_of(const sl_tensor *n, const sl_tensor *t, ocl_ref *r) {
    size_t need = extent_bytes(t) + (t == n ? n->aux_bytes : 0);
    const sl_buffer *b = NULL;
    if (t->buffer && t->buffer->backend == &g_be && holds(t->buffer, t->data, need)) b = t->buffer;
    for (int i = 0; !b && i < g_bufs.n; i++)
        if (holds(g_bufs.v[i], t->data, need)) b = g_bufs.v[i];
    if (!b) {
        if (t == n)
            return sl_fail(SL_ERR_INVALID, "opencl backend: node '%s' (%s) writes outside device memory",
                           n->name, sl_op_name(n->op));
        return sl_fail(
            SL_ERR_INVALID,
            "opencl backend: node '%s' (%s) reads '%s' outside device memory (a host pointer bound "
            "with sl_tensor_bind?)",
            n->name, sl_op_name(n->op), t->name);
    }
    size_t off = (size_t)((const char *)t->data - (const char *)b->base), es = sl_dtype_size(t->dtype);
    if (off % es)
        return sl_fail(SL_ERR_INVALID, "opencl backend: tensor '%s' at byte %zu is not %zu-byte aligned",
                       t->name, off, es);
    r->mem = ((const ocl_buf *)b->impl)->mem;
    r->off = (int64_t)(off / es);
    return SL_OK;
}

sl_status ocl_aux_of(const sl_tensor *n, const sl_tensor *t, ocl_ref *r) {
    SL_TRY(ocl_ref_of(n, t, r));
    r->off = (r->off * (int64_t)sl_dtype_size(t->dtype) + (int64_t)sl_nbytes(t)) / (int64_t)sizeof(float);
    return SL_OK;
}

/* ---------------- memory ---------------- */

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static sl_status ocl_alloc(sl_backend *be, size_t bytes, sl_buffer **out) {
    sl_buffer *b = calloc(1, sizeof *b);
    ocl_buf *ob = calloc(1, sizeof *ob);
    if (g_bufs.n == g_bufs.cap) {
        int cap = g_bufs.cap ? 2 * g_bufs.cap : 64;
        sl_buffer **v = realloc(g_bufs.v, sizeof *v * (size_t)cap);
        if (v) g_bufs.v = v, g_bufs.cap = cap;
    }
    if (!b || !ob || g_bufs.n == g_bufs.cap) {
        free(b);
        free(ob);
        return sl_fail(SL_ERR_NOMEM, "opencl backend: out of host memory");
    }
    cl_int err;
    size_t sz = bytes ? (bytes + 3) / 4 * 4 : 4;
    ob->mem = clCreateBuffer(g_ocl.ctx, CL_MEM_READ_WRITE, sz, NULL, &err);
    if (err == CL_SUCCESS) {
        cl_uchar zero = 0;
        err = clEnqueueFillBuffer(g_ocl.queue, ob->mem, &zero, 1, 0, sz, 0, NULL, NULL);
    }
    ob->reserved = page_round(sz);
    b->base = err == CL_SUCCESS
                  ? mmap(NULL, ob->reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                  : MAP_FAILED;
    if (b->base == MAP_FAILED) {
        if (ob->mem) clReleaseMemObject(ob->mem);
        free(b);
        free(ob);
        return err == CL_SUCCESS
                   ? sl_fail(SL_ERR_NOMEM, "opencl backend: cannot reserve %zu bytes", bytes)
                   : sl_fail(SL_ERR_NOMEM, "opencl backend: cannot allocate %zu bytes on %s (%d)", bytes,
                             g_ocl.device_name, (int)err);
    }
    b->size = bytes;
    b->backend = be;
    b->impl = ob;
    g_bufs.v[g_bufs.n++] = b;
    *out = b;
    return SL_OK;
}

static void ocl_free(sl_backend *be, sl_buffer *b) {
    (void)be;
    ocl_buf *ob = b->impl;
    for (int i = 0; i < g_bufs.n; i++)
        if (g_bufs.v[i] == b) {
            g_bufs.v[i] = g_bufs.v[--g_bufs.n];
            break;
        }
    clReleaseMemObject(ob->mem); /* the runtime keeps it until queued commands using it are done */
    munmap(b->base, ob->reserved);
    free(ob);
    free(b);
}

static cl_mem mem_of(const sl_buffer *b) { return ((const ocl_buf *)b->impl)->mem; }

/* Ranges are checked by the generic helpers (src/device/registry.c) before these run. */
static sl_status ocl_copy_in(sl_buffer *dst, size_t off, const void *host, size_t n) {
    cl_int err = clEnqueueWriteBuffer(g_ocl.queue, mem_of(dst), CL_TRUE, off, n, host, 0, NULL, NULL);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "copy_in");
}
static sl_status ocl_copy_out(const sl_buffer *src, size_t off, void *host, size_t n) {
    cl_int err = clEnqueueReadBuffer(g_ocl.queue, mem_of(src), CL_TRUE, off, n, host, 0, NULL, NULL);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "copy_out");
}
static sl_status ocl_copy_in_async(sl_buffer *dst, size_t off, const void *host, size_t n) {
    cl_int err = clEnqueueWriteBuffer(g_ocl.queue, mem_of(dst), CL_FALSE, off, n, host, 0, NULL, NULL);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "copy_in_async");
}
static sl_status ocl_copy_out_async(const sl_buffer *src, size_t off, void *host, size_t n) {
    cl_int err = clEnqueueReadBuffer(g_ocl.queue, mem_of(src), CL_FALSE, off, n, host, 0, NULL, NULL);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "copy_out_async");
}
static sl_status ocl_sync(sl_backend *be) {
    (void)be;
    cl_int err = clFinish(g_ocl.queue);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "clFinish");
}
static sl_status ocl_memset(sl_buffer *b, size_t off, size_t n) {
    if (off > b->size || n > b->size - off)
        return sl_fail(SL_ERR_INVALID, "opencl backend: memset out of range");
    if (!n) return SL_OK;
    cl_uchar zero = 0;
    cl_int err = clEnqueueFillBuffer(g_ocl.queue, mem_of(b), &zero, 1, off, n, 0, NULL, NULL);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "memset_zero");
}
static sl_status ocl_copy(sl_buffer *dst, size_t doff, const sl_buffer *src, size_t soff, size_t n) {
    if (src->backend != dst->backend) return sl_fail(SL_ERR_INVALID, "opencl backend: copy across backends");
    if (doff > dst->size || n > dst->size - doff || soff > src->size || n > src->size - soff)
        return sl_fail(SL_ERR_INVALID, "opencl backend: copy of %zu bytes out of range", n);
    if (src == dst && doff < soff + n && soff < doff + n)
        return sl_fail(SL_ERR_INVALID, "opencl backend: copy between overlapping regions");
    if (!n) return SL_OK;
    cl_int err = clEnqueueCopyBuffer(g_ocl.queue, mem_of(src), mem_of(dst), soff, doff, n, 0, NULL, NULL);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "copy");
}

/* ---------------- state operations ---------------- */

/* Note [AdamW order of operations] (src/device/cpu/kernels/optim.c): kernels/optim.cl computes each
 * element with the same single-precision operations in the same order (FP_CONTRACT off; division and
 * sqrt correctly rounded when the device offers it), with the step constants computed here as the CPU
 * does. One launch per span. */
static sl_status ocl_adamw(sl_backend *be, const sl_adamw_call *c) {
    (void)be;
    SL_TRY(sl_accel_adamw_check(c, "opencl"));
    sl_accel_adamw_consts ac = sl_accel_adamw_consts_of(c);
    float step = ac.step, bc2s = ac.bc2_sqrt, dec_on = ac.decay_on;
    for (int i = 0; i < c->n_spans; i++) {
        const sl_adamw_span *s = &c->spans[i];
        ocl_call k = ocl_begin(OK_ADAMW);
        ocl_mem(&k, mem_of(c->p));
        ocl_long(&k, s->p_offs);
        ocl_mem(&k, mem_of(c->g));
        ocl_long(&k, s->g_offs);
        ocl_mem(&k, mem_of(c->m));
        ocl_mem(&k, mem_of(c->v));
        ocl_long(&k, s->s_offs);
        ocl_float(&k, s->decay ? dec_on : 1.0f);
        ocl_float(&k, c->gscale);
        ocl_float(&k, c->hp.beta1);
        ocl_float(&k, c->hp.beta2);
        ocl_float(&k, c->hp.eps);
        ocl_float(&k, step);
        ocl_float(&k, bc2s);
        SL_TRY(ocl_run1(&k, (size_t)s->n));
    }
    return SL_OK;
}

/* The CPU's order exactly: 65536-element chunks, 8 double lanes per chunk combined as the CPU does (one
 * work-item per chunk), chunk sums added here in chunk order, so the result is bitwise the CPU's. */
static sl_status ocl_sumsq(sl_backend *be, const sl_buffer *b, int64_t off, int64_t n, double *out) {
    (void)be;
    if (!sl_accel_span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "opencl backend: sumsq out of range");
    if (!g_ocl.has_fp64)
        return sl_fail(SL_ERR_UNSUPPORTED,
                       "opencl backend: sumsq needs double precision (cl_khr_fp64), which %s lacks",
                       g_ocl.device_name);
    int64_t nch = (n + 65535) / 65536;
    *out = 0;
    if (!nch) return SL_OK;
    cl_mem part;
    SL_TRY(ocl_scratch(sizeof(double) * (size_t)nch, &part));
    ocl_call k = ocl_begin(OK_SUMSQ);
    ocl_mem(&k, mem_of(b));
    ocl_long(&k, off);
    ocl_long(&k, n);
    ocl_mem(&k, part);
    SL_TRY(ocl_run1(&k, (size_t)nch));
    double local[64], *h = nch <= 64 ? local : malloc(sizeof(double) * (size_t)nch);
    if (!h) return sl_fail(SL_ERR_NOMEM, "opencl backend: sumsq: out of memory");
    cl_int err =
        clEnqueueReadBuffer(g_ocl.queue, part, CL_TRUE, 0, sizeof(double) * (size_t)nch, h, 0, NULL, NULL);
    double ss = 0;
    for (int64_t i = 0; i < nch; i++) ss += h[i];
    if (h != local) free(h);
    if (err != CL_SUCCESS) return ocl_fail(err, "sumsq read");
    *out = ss;
    return SL_OK;
}

static sl_status ocl_scale(sl_backend *be, sl_buffer *b, int64_t off, int64_t n, float s) {
    (void)be;
    if (!sl_accel_span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "opencl backend: scale out of range");
    return ocl_ew_flat(EW_SCALE, s, mem_of(b), off, n);
}
static sl_status ocl_fill(sl_backend *be, sl_buffer *b, int64_t off, int64_t n, float v) {
    (void)be;
    if (!sl_accel_span_ok(b, off, n)) return sl_fail(SL_ERR_INVALID, "opencl backend: fill out of range");
    return ocl_ew_flat(EW_FILL, v, mem_of(b), off, n);
}

/* ---------------- compute ---------------- */

static int ocl_supports_be(sl_backend *be, const sl_tensor *n) {
    (void)be;
    return ocl_supports(n);
}

/* Under SUANLI_PROFILE=1 each node is finished before it returns, so the executor's per-op wall time
 * (Note [Op profile] in src/graph/graph.c) is the node's device time and not its enqueue time. */
static sl_status ocl_compute_be(sl_backend *be, sl_tensor *n) {
    be->stats.nodes++;
    SL_TRY(ocl_compute(n));
    if (!g_ocl.prof) return SL_OK;
    cl_int err = clFinish(g_ocl.queue);
    return err == CL_SUCCESS ? SL_OK : ocl_fail(err, "clFinish (profile)");
}

static sl_backend g_be = {
    .name = "opencl",
    .caps = {.alignment = 4096, .host_visible = 0, .async_copies = 1},
    .buffer_alloc = ocl_alloc,
    .buffer_free = ocl_free,
    .copy_in = ocl_copy_in,
    .copy_out = ocl_copy_out,
    .memset_zero = ocl_memset,
    .copy = ocl_copy,
    .copy_in_async = ocl_copy_in_async,
    .copy_out_async = ocl_copy_out_async,
    .synchronize = ocl_sync,
    .supports_op = ocl_supports_be,
    .compute_node = ocl_compute_be,
    .adamw = ocl_adamw,
    .sumsq = ocl_sumsq,
    .scale = ocl_scale,
    .fill = ocl_fill,
};
