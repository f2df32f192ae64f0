/* Building the program: the embedded kernel sources (kernels/ (*.cl), turned into C strings at build time by
 * cmake/embed_cl.cmake) compiled with clBuildProgram for the chosen device, and a disk cache of the
 * resulting binary.
 *
 * Note [OpenCL program cache]
 * Compiling the kernels takes seconds (PoCL runs LLVM), so the binary is kept on disk under
 * SUANLI_OPENCL_CACHE (default $XDG_CACHE_HOME/suanli, else ~/.cache/suanli; "off" disables), in a file
 * named by a 64-bit FNV-1a hash of the sources, the build options, the platform version, the device name
 * and the driver version: a new source, device or driver misses the cache and rebuilds. A cached binary
 * that fails to load or build is ignored and rebuilt from source. Files are written to a temporary name and
 * renamed, so concurrent processes never read a torn binary. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/opencl/opencl_internal.h"

extern const char *const sl_ocl_sources[];
extern const char *const sl_ocl_source_names[];
extern const int sl_ocl_n_sources;

static const char *const k_names[OK_COUNT] = {
    [OK_EW] = "k_ew",
    [OK_EW16] = "k_ew16",
    [OK_EW16V] = "k_ew16v",
    [OK_SUM_TO] = "k_sum_to",
    [OK_EWC] = "k_ewc",
    [OK_EWV] = "k_ewv",
    [OK_SUM_ROWS] = "k_sum_rows",
    [OK_SUM_ROWS_B] = "k_sum_rows_b",
    [OK_GEMM] = "k_gemm",
    [OK_GEMM_REG] = "k_gemm_reg",
    [OK_GEMM_PACK_TA] = "k_gemm_pack_ta",
    [OK_GEMM_PACK_TB] = "k_gemm_pack_tb",
    [OK_GEMM_PACK_N] = "k_gemm_pack_n",
    [OK_GEMM_PACK_TA_H] = "k_gemm_pack_ta_h",
    [OK_GEMM_PACK_TB_H] = "k_gemm_pack_tb_h",
    [OK_GEMM_PACK_N_H] = "k_gemm_pack_n_h",
    [OK_GEMM_PACK_TA_B] = "k_gemm_pack_ta_b",
    [OK_GEMM_PACK_TB_B] = "k_gemm_pack_tb_b",
    [OK_GEMM_PACK_N_B] = "k_gemm_pack_n_b",
    [OK_GEMM_PACK_TB_R] = "k_gemm_pack_tb_r",
    [OK_GEMM_PACK_N_R] = "k_gemm_pack_n_r",
    [OK_GEMM_PACK_TA_R] = "k_gemm_pack_ta_r",
    [OK_LAYERNORM] = "k_layernorm",
    [OK_LN_BACK_X] = "k_layernorm_back_x",
    [OK_LN_BACK_WB] = "k_layernorm_back_wb",
    [OK_RMSNORM] = "k_rmsnorm",
    [OK_RMS_BACK_X] = "k_rmsnorm_back_x",
    [OK_RMS_BACK_W] = "k_rmsnorm_back_w",
    [OK_SOFTMAX] = "k_softmax",
    [OK_SOFTMAX_BACK] = "k_softmax_back",
    [OK_ATTN_FWD] = "k_attention",
    [OK_ATTN_BWD_DQ] = "k_attention_back_dq",
    [OK_ATTN_BWD_DKV] = "k_attention_back_dkv",
    [OK_ATTN_KV] = "k_attention_kv",
    [OK_EMBED] = "k_embedding",
    [OK_EMBED_BACK] = "k_embedding_back",
    [OK_CE_LSE] = "k_ce_lse",
    [OK_CE_MEAN] = "k_ce_mean",
    [OK_CE_BACK] = "k_ce_back",
    [OK_ROPE] = "k_rope",
    [OK_TOPK] = "k_topk_gate",
    [OK_MOE_UP] = "k_moe_up",
    [OK_MOE_DOWN] = "k_moe_down",
    [OK_ADAMW] = "k_adamw",
    [OK_SUMSQ] = "k_sumsq",
    [OK_ATTN_HALF] = "k_attention_half",
    [OK_ATTN_HALF_KT] = "k_attention_half_kt",
    [OK_ATTN_HALF_BACK_Q] = "k_attention_half_back_q",
    [OK_ATTN_HALF_BACK_KV] = "k_attention_half_back_kv",
    [OK_EMBED_SHARD] = "k_embedding_shard",
    [OK_EMBED_BACK_SHARD] = "k_embedding_back_shard",
    [OK_CE_VP_STATS] = "k_ce_vp_stats",
    [OK_CE_VP] = "k_ce_vp",
    [OK_DROPOUT] = "k_dropout",
    [OK_MOE_ROUTE_ROW] = "k_moe_route_row",
    [OK_MOE_ROUTE_CAP] = "k_moe_route_cap",
    [OK_MOE_ROUTE_BACK] = "k_moe_route_back",
    [OK_MOE_ROUTER_LOSS] = "k_moe_router_loss",
    [OK_MOE_ROUTER_LOSS_BACK] = "k_moe_router_loss_back",
    [OK_MOE_KEPT_MAP] = "k_moe_kept_map",
    [OK_MOE_ROWS] = "k_moe_rows",
    [OK_MOE_COMBINE] = "k_moe_combine",
    [OK_MOE_COMBINE_BACK_GATE] = "k_moe_combine_back_gate",
    [OK_MOE_EP_COUNTS] = "k_moe_ep_counts",
    [OK_MOE_COL_COUNT] = "k_moe_col_count",
    [OK_MOE_PAIR_ROWS] = "k_moe_pair_rows",
    [OK_MOE_PACK] = "k_moe_pack",
    [OK_MOE_UNPACK] = "k_moe_unpack",
    [OK_MOE_UNPACK_BACK_GATE] = "k_moe_unpack_back_gate",
    [OK_MOE_EP_MAP] = "k_moe_ep_map",
    [OK_MOE_SWIGLU] = "k_moe_swiglu",
    [OK_MOE_SWIGLU_BACK] = "k_moe_swiglu_back",
    [OK_MOE_ROUND] = "k_moe_round",
    [OK_MOE_ADD_ROUNDED] = "k_moe_add_rounded",
    [OK_MOE_ACC_ROUNDED] = "k_moe_acc_rounded",
    [OK_MOE_GATE_MAP] = "k_moe_gate_map",
    [OK_MOE_GATE_ROWS_BF] = "k_moe_gate_rows_bf",
    [OK_MOE_GATE_SCATTER] = "k_moe_gate_scatter",
};
_Static_assert(sizeof k_names / sizeof k_names[0] == OK_COUNT, "one name per kernel");

static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (h ^ 0xff) * 1099511628211ull; /* separator */
}

/* the cache folder (created), or "" when disabled / unavailable */
static void cache_dir(char *dir, size_t cap) {
    const char *e = getenv("SUANLI_OPENCL_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    dir[0] = 0;
    if (e && (!strcmp(e, "off") || !strcmp(e, "0"))) return;
    if (e && *e)
        snprintf(dir, cap, "%s", e);
    else if (x && *x)
        snprintf(dir, cap, "%s/suanli", x);
    else if (h && *h)
        snprintf(dir, cap, "%s/.cache/suanli", h);
    else
        return;
    /* mkdir -p */
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0755);
            *p = '/';
        }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) dir[0] = 0;
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = sz > 0 ? malloc((size_t)sz) : NULL;
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = b ? (size_t)sz : 0;
    return b;
}

static void write_cache(const char *path, cl_program p) {
    size_t sz = 0;
    if (clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof sz, &sz, NULL) != CL_SUCCESS || !sz) return;
    unsigned char *bin = malloc(sz);
    if (!bin) return;
    if (clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS) {
        char tmp[1200];
        snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f) {
            int ok = fwrite(bin, 1, sz, f) == sz;
            ok = fclose(f) == 0 && ok;
            if (ok && rename(tmp, path) == 0) tmp[0] = 0;
            if (tmp[0]) remove(tmp);
        }
    }
    free(bin);
}

static sl_status build_log_fail(ocl_state *s, cl_program p, cl_int err) {
    size_t n = 0;
    clGetProgramBuildInfo(p, s->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    char *log = malloc(n + 1);
    if (log) {
        clGetProgramBuildInfo(p, s->device, CL_PROGRAM_BUILD_LOG, n, log, NULL);
        log[n] = 0;
    }
    sl_status st =
        sl_fail(SL_ERR_INTERNAL, "opencl backend: building the kernels for %s failed (%d):\n%.3000s",
                s->device_name, (int)err, log ? log : "(no log)");
    free(log);
    clReleaseProgram(p);
    return st;
}

static cl_program from_binary(ocl_state *s, const char *path, const char *opts) {
    size_t n = 0;
    unsigned char *bin = read_file(path, &n);
    if (!bin) return NULL;
    cl_int err, bst;
    const unsigned char *cb = bin;
    cl_program p = clCreateProgramWithBinary(s->ctx, 1, &s->device, &n, &cb, &bst, &err);
    free(bin);
    if (err != CL_SUCCESS || bst != CL_SUCCESS) return NULL;
    if (clBuildProgram(p, 1, &s->device, opts, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(p);
        return NULL;
    }
    return p;
}

sl_status ocl_program_build(ocl_state *s) {
    char opts[256], plat[256] = "";
    cl_device_fp_config sfp = 0;
    clGetDeviceInfo(s->device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof sfp, &sfp, NULL);
    clGetPlatformInfo(s->platform, CL_PLATFORM_VERSION, sizeof plat - 1, plat, NULL);
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DTS=%d -DTK=%d -DGEMM_MR=%d -DATT_B=%d%s%s", s->gemm_ts,
             s->gemm_tk, s->gemm_mr, OCL_ATT_B, s->has_fp64 ? " -DSL_FP64=1" : "",
             (sfp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) ? " -cl-fp32-correctly-rounded-divide-sqrt" : "");
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < sl_ocl_n_sources; i++) h = fnv(fnv(h, sl_ocl_source_names[i]), sl_ocl_sources[i]);
    h = fnv(fnv(fnv(fnv(h, opts), plat), s->device_name), s->driver);
    char dir[1024], path[1100] = "";
    cache_dir(dir, sizeof dir);
    if (dir[0]) snprintf(path, sizeof path, "%s/opencl-%016llx.bin", dir, (unsigned long long)h);
    cl_program p = path[0] ? from_binary(s, path, opts) : NULL;
    if (!p) {
        cl_int err;
        p = clCreateProgramWithSource(s->ctx, (cl_uint)sl_ocl_n_sources, (const char **)sl_ocl_sources, NULL,
                                      &err);
        if (err != CL_SUCCESS) return ocl_fail(err, "clCreateProgramWithSource");
        err = clBuildProgram(p, 1, &s->device, opts, NULL, NULL);
        if (err != CL_SUCCESS) return build_log_fail(s, p, err);
        if (path[0]) write_cache(path, p);
    }
    s->program = p;
    for (int i = 0; i < OK_COUNT; i++) {
        if ((i == OK_SUMSQ || i == OK_MOE_ROUTER_LOSS || i == OK_MOE_ROUTER_LOSS_BACK) && !s->has_fp64)
            continue; /* sumsq and the router losses are refused by name without fp64 */
        cl_int err;
        s->k[i] = clCreateKernel(p, k_names[i], &err);
        if (err != CL_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "clCreateKernel(%s)", k_names[i]);
            return ocl_fail(err, what);
        }
    }
    return SL_OK;
}
