/* Internal interface of the OpenCL backend: the device state, buffers, tensor references and kernel
 * launches shared by opencl_backend.c (memory, state operations), opencl_program.c (build + disk cache)
 * and opencl_ops*.c (one launch function per op). Nothing outside src/device/opencl includes it. */
#ifndef SL_OPENCL_INTERNAL_H
#define SL_OPENCL_INTERNAL_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include "suanli/device.h"

/* Kernels by name (kernels/ (*.cl)); the table in opencl_program.c holds their names. */
typedef enum ocl_kernel_id {
    OK_EW = 0,         /* elementwise.cl: strided 5-D elementwise ops on 32-bit elements */
    OK_EW16,           /* elementwise.cl: 16-bit copies and f32 <-> bf16 casts */
    OK_EW16V,          /* elementwise.cl: the same over contiguous tensors, 16 per work-item */
    OK_SUM_TO,         /* elementwise.cl */
    OK_EWC,            /* elementwise.cl: contiguous k_ew (Note [OpenCL contiguous elementwise]) */
    OK_EWV,            /* elementwise.cl: contiguous, 16 per work-item (Note [OpenCL vector elementwise]) */
    OK_SUM_ROWS,       /* elementwise.cl: sum over leading rows of a contiguous tensor */
    OK_SUM_ROWS_B,     /* elementwise.cl: the same from bf16 */
    OK_GEMM,           /* gemm.cl: tiled in local memory (GPU-type devices) */
    OK_GEMM_REG,       /* gemm_reg.cl: register-blocked, panels (CPU-type devices) */
    OK_GEMM_PACK_TA,   /* gemm_reg.cl: row-major A into MR-wide panels */
    OK_GEMM_PACK_TB,   /* gemm_reg.cl: row-major B^T into 32-wide panels */
    OK_GEMM_PACK_N,    /* gemm_reg.cl: k-major operand into panels */
    OK_GEMM_PACK_TA_H, /* gemm_reg.cl: the same three from f16 operands (Note [OpenCL f16 storage]) */
    OK_GEMM_PACK_TB_H,
    OK_GEMM_PACK_N_H,
    OK_GEMM_PACK_TA_B, /* gemm_reg.cl: the same three from bf16 operands (Note [OpenCL bf16 GEMM]) */
    OK_GEMM_PACK_TB_B,
    OK_GEMM_PACK_N_B,
    OK_GEMM_PACK_TB_R, /* gemm_reg.cl: f32 B rounded to bf16 as packed (Note [OpenCL fused weight casts]) */
    OK_GEMM_PACK_N_R,
    OK_GEMM_PACK_TA_R,    /* gemm_reg.cl: f32 A rounded to bf16 as packed (Note [OpenCL bf16 linear]) */
    OK_LAYERNORM,         /* norm.cl */
    OK_LN_BACK_X,         /* norm.cl */
    OK_LN_BACK_WB,        /* norm.cl */
    OK_RMSNORM,           /* norm.cl */
    OK_RMS_BACK_X,        /* norm.cl */
    OK_RMS_BACK_W,        /* norm.cl */
    OK_SOFTMAX,           /* norm.cl */
    OK_SOFTMAX_BACK,      /* norm.cl */
    OK_ATTN_FWD,          /* attention.cl */
    OK_ATTN_BWD_DQ,       /* attention.cl */
    OK_ATTN_BWD_DKV,      /* attention.cl */
    OK_ATTN_KV,           /* attention.cl */
    OK_EMBED,             /* loss.cl */
    OK_EMBED_BACK,        /* loss.cl */
    OK_CE_LSE,            /* loss.cl */
    OK_CE_MEAN,           /* loss.cl */
    OK_CE_BACK,           /* loss.cl */
    OK_ROPE,              /* llama.cl */
    OK_TOPK,              /* llama.cl */
    OK_MOE_UP,            /* llama.cl */
    OK_MOE_DOWN,          /* llama.cl */
    OK_ADAMW,             /* optim.cl */
    OK_SUMSQ,             /* optim.cl (needs cl_khr_fp64) */
    OK_ATTN_HALF,         /* attention_half.cl (Note [OpenCL half attention]) */
    OK_ATTN_HALF_KT,      /* attention_half.cl: K / V transposed (forward and backward) */
    OK_ATTN_HALF_BACK_Q,  /* dq, then */
    OK_ATTN_HALF_BACK_KV, /* dk, dv */
    OK_EMBED_SHARD,       /* loss.cl (Note [OpenCL tensor parallelism]) */
    OK_EMBED_BACK_SHARD,  /* loss.cl */
    OK_CE_VP_STATS,       /* loss.cl */
    OK_CE_VP,             /* loss.cl */
    OK_DROPOUT,           /* dropout.cl (Note [OpenCL dropout], 0_common.cl) */
    OK_MOE_ROUTE_ROW,     /* moe.cl (Note [OpenCL MoE kernels], opencl_ops_moe.c) */
    OK_MOE_ROUTE_CAP,
    OK_MOE_ROUTE_BACK,
    OK_MOE_ROUTER_LOSS, /* moe.cl, needs cl_khr_fp64 */
    OK_MOE_ROUTER_LOSS_BACK,
    OK_MOE_KEPT_MAP,
    OK_MOE_ROWS,
    OK_MOE_COMBINE,
    OK_MOE_COMBINE_BACK_GATE,
    OK_MOE_EP_COUNTS,
    OK_MOE_COL_COUNT,
    OK_MOE_PAIR_ROWS,
    OK_MOE_PACK,
    OK_MOE_UNPACK,
    OK_MOE_UNPACK_BACK_GATE,
    OK_MOE_EP_MAP,
    OK_MOE_SWIGLU,
    OK_MOE_SWIGLU_BACK,
    OK_MOE_ROUND,
    OK_MOE_ADD_ROUNDED,
    OK_MOE_ACC_ROUNDED,
    OK_MOE_GATE_MAP,
    OK_MOE_GATE_ROWS_BF,
    OK_MOE_GATE_SCATTER,
    OK_COUNT
} ocl_kernel_id;

/* Elementwise op codes of k_ew (kernels/elementwise.cl) */
enum {
    EW_ADD = 0,
    EW_MUL,
    EW_COPY_A, /* o = a (bit copy) */
    EW_SCALE,  /* o = a * f */
    EW_GELU,
    EW_GELU_BACK, /* a = x, b = dy */
    EW_SILU,
    EW_SILU_BACK, /* a = x, b = dy */
    EW_FILL,      /* o = f */
    EW_COPY_B,    /* o = b (bit copy) */
};

enum { OCL_GEMM_TILED = 0, OCL_GEMM_REG = 1 };

/* default bytes of the register GEMM's k-block partial sums (Cp) per launch (g_ocl.gemm_cp_max, override
 * SUANLI_OPENCL_GEMM_CP); a wider N is split into launches */
#define OCL_GEMM_CP_MAX ((int64_t)32 << 20)

/* rows per attention tile (ATT_B in kernels/attention.cl, passed with -D; Note [OpenCL flash attention]) */
#define OCL_ATT_B 16
/* local memory the attention backward needs at head size hs (its largest kernel: 8 tiles + 2 rows) */
#define OCL_ATT_LOCAL(hs) (sizeof(float) * OCL_ATT_B * (8 * (size_t)(hs) + 2))

typedef struct ocl_state {
    int tried;          /* initialisation attempted */
    sl_status init_st;  /* its result */
    char init_err[512]; /* its message */
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue queue;
    cl_program program;
    cl_kernel k[OK_COUNT];
    int index; /* position in the OpenCL device list ("opencl:N") */
    char device_name[256], driver[128];
    int has_fp64;
    int row_wg; /* work-items per row of the row kernels (a power of two) */
    int prof;   /* SUANLI_PROFILE set: finish every node (its device time in the op profile) */
    size_t max_wg;
    cl_ulong local_mem;
    int gemm_kind;        /* OCL_GEMM_TILED or OCL_GEMM_REG (Note [OpenCL GEMM tiles]) */
    int gemm_ts, gemm_tk; /* tiled GEMM: TS x TS outputs per work-group, TK deep */
    int gemm_mr, gemm_kc,
        gemm_mg;         /* register-blocked GEMM: MR x 32 tiles, k-blocks of KC, MG tiles per item */
    int64_t gemm_cp_max; /* register-blocked GEMM: bytes of partial sums per launch */
    cl_mem scratch;      /* grown on demand: per-node temporaries (ordered by the in-order queue) */
    size_t scratch_size;
    cl_mem scratch2; /* a second one, for temporaries that live across GEMM calls (opencl_ops_moe.c) */
    size_t scratch2_size;
    cl_mem flag; /* 2 ints: an out-of-range id seen by a kernel (1, value) */
} ocl_state;

extern ocl_state g_ocl;

/* impl of an sl_buffer */
typedef struct ocl_buf {
    cl_mem mem;
    size_t reserved; /* bytes of the PROT_NONE range that gives the buffer its unique base */
} ocl_buf;

/* A tensor's place on the device: memory object + element offset (of 4- or 2-byte elements). */
typedef struct ocl_ref {
    cl_mem mem;
    int64_t off;
} ocl_ref;

sl_status ocl_fail(cl_int err, const char *what);
/* Resolve tensor t (a source or the output of node n) to its buffer, refusing host memory by name. */
sl_status ocl_ref_of(const sl_tensor *n, const sl_tensor *t, ocl_ref *r);
/* The aux area after t's data (float elements) */
sl_status ocl_aux_of(const sl_tensor *n, const sl_tensor *t, ocl_ref *r);
/* A scratch region of at least `bytes` (valid until the next ocl_scratch call) */
sl_status ocl_scratch(size_t bytes, cl_mem *out);
/* A second scratch region, not touched by the GEMM (which uses the first) */
sl_status ocl_scratch2(size_t bytes, cl_mem *out);
/* Build or load the program (opencl_program.c) */
sl_status ocl_program_build(ocl_state *s);

/* Kernel launch helper: args in order, the first error is kept and reported at launch. */
typedef struct ocl_call {
    cl_kernel k;
    cl_uint n;
    cl_int err;
    const char *name;
} ocl_call;

ocl_call ocl_begin(ocl_kernel_id id);
void ocl_arg(ocl_call *c, size_t size, const void *v);
static inline void ocl_mem(ocl_call *c, cl_mem m) { ocl_arg(c, sizeof m, &m); }
static inline void ocl_ref_arg(ocl_call *c, ocl_ref r) {
    cl_long o = r.off;
    ocl_mem(c, r.mem);
    ocl_arg(c, sizeof o, &o);
}
static inline void ocl_long(ocl_call *c, int64_t v) {
    cl_long x = v;
    ocl_arg(c, sizeof x, &x);
}
static inline void ocl_int(ocl_call *c, int v) {
    cl_int x = v;
    ocl_arg(c, sizeof x, &x);
}
static inline void ocl_float(ocl_call *c, float v) { ocl_arg(c, sizeof v, &v); }
/* 1-D launch over n items (local size chosen by the runtime); n == 0 launches nothing */
sl_status ocl_run1(ocl_call *c, size_t n);
/* N-D launch with explicit global/local sizes (local may be NULL) */
sl_status ocl_run(ocl_call *c, cl_uint dims, const size_t *global, const size_t *local);

/* 5-D iteration form (leading 1s), as cl_long8 (lanes 0..4 used) */
typedef struct ocl_it5 {
    cl_long8 ne, nb;
} ocl_it5;
ocl_it5 ocl_it5_of(const sl_tensor *t);
/* b's strides broadcast to out's shape (0 on broadcast dims) */
ocl_it5 ocl_it5_broadcast(const sl_tensor *b, const sl_tensor *out);
/* contiguous strides of a shape */
cl_long8 ocl_contig_nb(cl_long8 ne);

/* k_ew: o[it] = op(a[it], b[it]) over shape ne, each operand with its own strides */
sl_status ocl_ew(int op, float f, ocl_ref o, cl_long8 nbo, ocl_ref a, cl_long8 nba, ocl_ref b, cl_long8 nbb,
                 cl_long8 ne);
/* flat span versions of scale / fill / zero over a buffer */
sl_status ocl_ew_flat(int op, float f, cl_mem m, int64_t off, int64_t n);

/* per-op launches (opencl_ops.c, opencl_ops_nn.c) */
int ocl_supports(const sl_tensor *n);
sl_status ocl_compute(sl_tensor *n);
sl_status ocl_op_matmul(sl_tensor *n);
sl_status ocl_op_nn(sl_tensor *n); /* norms, softmax, attention, embedding, loss, llama ops */
/* f32 C (M x N, ldc) = op(A) op(B) (+ C when beta1): one GEMM on the backend's kernel (opencl_ops.c); dt: the
 * operands' type (f32; bf16 on the register-blocked GEMM only), half_b: an f32 B rounded to bf16 as packed
 * (Note [OpenCL fused weight casts]), round: the product rounded to bf16 (Note [OpenCL bf16 GEMM]) */
sl_status ocl_gemm(int M, int N, int K, ocl_ref a, int64_t lda, int tA, ocl_ref b, int64_t ldb, int tB,
                   ocl_ref c, int64_t ldc, int beta1, sl_dtype dt, int half_b, int round);
/* the trainable MoE ops (opencl_ops_moe.c) */
int ocl_moe_supports(const sl_tensor *n);
sl_status ocl_op_moe(sl_tensor *n);
/* read the kernels' out-of-range flag; non-zero -> an error naming `what` */
/* read the kernels' flag (g_ocl.flag: [set, value]) and clear it when set; `reading` names a failed read */
sl_status ocl_read_flag(const char *reading, int *set, int *value);
sl_status ocl_check_flag(const char *what, int64_t limit);
#endif
