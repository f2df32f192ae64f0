/* The CUDA backend's op table: supports_op (honest: op, dtypes, layouts), the dispatch of compute_node, the
 * elementwise / data-movement ops (cu_ew, cu_ew16, cu_sum_to), and MATMUL / LINEAR_BF16 through cuBLAS. The
 * other ops are in cuda_ops_nn.c. Semantics of every op: the enum in suanli/tensor.h and the CPU kernels. */
#include <string.h>

#include "device/accel_support.h"
#include "device/cuda/cuda_internal.h"

/* ---------------- iteration forms ---------------- */

cu_it5 cu_it5_of(const sl_tensor *t) {
    cu_it5 r;
    int pad = 5 - t->ndim;
    for (int d = 0; d < 5; d++) {
        r.ne.v[d] = d < pad ? 1 : t->ne[d - pad];
        r.nb.v[d] = d < pad ? 0 : t->nb[d - pad];
    }
    return r;
}

cu_it5 cu_it5_broadcast(const sl_tensor *b, const sl_tensor *out) {
    cu_it5 o = cu_it5_of(out), r = cu_it5_of(b);
    for (int d = 0; d < 5; d++) {
        if (r.ne.v[d] != o.ne.v[d]) r.nb.v[d] = 0; /* broadcast dim (size 1) */
        r.ne.v[d] = o.ne.v[d];
    }
    return r;
}

cu_v5 cu_contig_nb(cu_v5 ne) {
    cu_v5 nb;
    int64_t s = 1;
    for (int d = 4; d >= 0; d--) {
        nb.v[d] = s;
        s *= ne.v[d];
    }
    return nb;
}

cu_v5 cu_flat_ne(int64_t n) {
    cu_v5 ne = {{1, 1, 1, 1, n}};
    return ne;
}

sl_status cu_ew_flat(int op, float f, float *p, int64_t n) {
    cu_v5 ne = cu_flat_ne(n), nb = cu_contig_nb(ne);
    return cu_ok(cu_ew(g_cu.stream, op, f, p, nb, p, nb, p, nb, ne), "elementwise");
}

/* ---------------- supports_op ---------------- */

/* Note [CUDA supported ops]
 * The shared accelerator table (Note [Accelerator supported ops], src/device/accel_support.c: every f32 op
 * of GPT-2 / Llama-family training and KV-cache generation, sliding-window attention included; CONT /
 * CONCAT / ZEROS in f32 / i32 / bf16; CAST f32 <-> bf16) plus bf16 compute in the GEMMs: MATMUL with bf16 x
 * bf16 operands (f32 out, f32 bias) and LINEAR_BF16, both cublasGemmEx with CUBLAS_COMPUTE_32F (fp32
 * accumulation, as the CPU's sl_gemm_bf16), and f16 storage (Note [CUDA f16 storage]). Dropout (DROPOUT, and
 * ATTENTION / ATTENTION_BACK with dropout of the probabilities) draws the CPU's masks (Note [CUDA dropout],
 * kernels/common.cuh); tensor parallelism's vocabulary-parallel ops run on their own kernels (Note [CUDA
 * tensor parallelism], kernels/loss.cu); the half numerics of ROPE (Note [RoPE numerics], kernels/llama.cu)
 * and the eager half attention (modes 1-4, Note [CUDA half attention], kernels/attention_half.cu) too. The
 * bf16-numerics variants of ATTENTION_KV / MOE_EXPERT (and MOE_EXPERT with bf16 weights) are refused, so the
 * executor names the op and dtype.
 *
 * Note [CUDA f16 storage]
 * The port of Note [OpenCL f16 storage]: f16 is a storage format with every operation in f32. CAST f32 <->
 * f16 is the CPU's sl_f32_to_f16 / sl_f16_to_f32 bit for bit (kernels/common.cuh); CONT / CONCAT / ZEROS move
 * 16-bit elements; MATMUL with f16 x f16 operands (f32 out and bias, the fp16 autocast GEMM) is cublasGemmEx
 * with CUDA_R_16F operands and CUBLAS_COMPUTE_32F: each product of two f16 values is exact in f32 and the
 * sums are fp32, as the CPU's widened f16 GEMM (the summation order is cuBLAS's). An f16 MATMUL rounded to
 * bf16 (SL_MATMUL_IP_ROUND) is refused, as on OpenCL. Compiled and linked, not yet run on a GPU. */
/* what this backend adds to the shared table: dropout (Note [CUDA dropout]), the vocab-parallel ops (Note
 * [CUDA tensor parallelism], kernels/loss.cu), f16 storage (Note [CUDA f16 storage]), the half numerics of
 * attention (Note [CUDA half attention], kernels/attention_half.cu) and RoPE (k_rope in kernels/llama.cu) */
#define CU_EXTRA (SL_ACCEL_DROPOUT | SL_ACCEL_VOCAB_SHARD | SL_ACCEL_F16_STORAGE | SL_ACCEL_HALF_NUMERICS)

int cu_supports(const sl_tensor *n) {
    const sl_tensor *a = n->src[0], *b = n->src[1];
    switch (n->op) {
    case SL_OP_MATMUL: {
        /* bf16 x bf16 or f16 x f16 operands, f32 out and bias (cublasGemmEx, fp32 accumulation) */
        int bf =
            n->dtype == SL_F32 &&
            ((a->dtype == SL_BF16 && b->dtype == SL_BF16) || (a->dtype == SL_F16 && b->dtype == SL_F16)) &&
            (!n->src[2] || n->src[2]->dtype == SL_F32);
        int rnd = n->iparams[SL_MATMUL_IP_ROUND]; /* Note [Rounded weight gradients]: 2-D, no bias (CPU) */
        if (rnd && (rnd != SL_BF16 || a->ndim != 2 || b->ndim != 2 || n->ndim != 2 || n->src[2])) return 0;
        if (rnd && a->dtype == SL_F16) return 0; /* as the OpenCL backend: no f16 GEMM rounded to bf16 */
        return (sl_accel_all_f32(n) || bf) && a->ndim >= 2 && b->ndim >= 2 && n->ndim >= 2 &&
               sl_accel_last_unit(a) && sl_accel_last_unit(b) && sl_accel_last_unit(n) &&
               (!n->src[2] || sl_is_contiguous(n->src[2]));
    }
    case SL_OP_LINEAR_BF16:
        return n->dtype == SL_F32 && a->dtype == SL_F32 && b->dtype == SL_BF16 && b->ndim == 2 &&
               sl_accel_last_unit(a) && sl_is_contiguous(b) && sl_is_contiguous(n);
    default:
        return sl_accel_supports_ex(n, CU_EXTRA);
    }
}

/* ---------------- elementwise and data movement ---------------- */

#define PTR(t, p) SL_TRY(cu_ptr_of(n, (t), (void **)(p)))
#define EW(call) SL_TRY(cu_ok((call), sl_op_name(n->op)))

/* o (with strides nbo) = copy of a, 32- or 16-bit elements, or a cast */
static sl_status op_copy(sl_tensor *n, const sl_tensor *a, char *o, cu_v5 nbo, int cast) {
    void *pa;
    PTR(a, &pa);
    cu_it5 ia = cu_it5_of(a);
    if (cast) { /* f32 <-> bf16, f32 <-> f16 (Note [CUDA f16 storage]) */
        int half = a->dtype == SL_F16 || n->dtype == SL_F16;
        int op = a->dtype == SL_F32 ? (half ? CU_EW16_F32_TO_F16 : CU_EW16_F32_TO_BF16)
                                    : (half ? CU_EW16_F16_TO_F32 : CU_EW16_BF16_TO_F32);
        EW(cu_ew16(g_cu.stream, op, o, nbo, pa, ia.nb, ia.ne));
    } else if (sl_dtype_size(a->dtype) == 2)
        EW(cu_ew16(g_cu.stream, CU_EW16_COPY, o, nbo, pa, ia.nb, ia.ne));
    else
        EW(cu_ew(g_cu.stream, CU_EW_COPY_A, 0, o, nbo, pa, ia.nb, pa, ia.nb, ia.ne));
    return SL_OK;
}

static sl_status op_concat(sl_tensor *n) {
    char *o;
    PTR(n, &o);
    cu_it5 io = cu_it5_of(n);
    int dim = n->iparams[0];
    SL_TRY(op_copy(n, n->src[0], o, io.nb, 0));
    o += (size_t)(n->src[0]->ne[dim] * n->nb[dim]) * sl_dtype_size(n->dtype);
    return op_copy(n, n->src[1], o, io.nb, 0);
}

static sl_status op_binary(sl_tensor *n, int op) {
    float *o, *a, *b;
    PTR(n, &o);
    PTR(n->src[0], &a);
    cu_it5 io = cu_it5_of(n), ia = cu_it5_of(n->src[0]), ib;
    if (n->src[1]) {
        PTR(n->src[1], &b);
        ib = cu_it5_broadcast(n->src[1], n);
    } else {
        b = a;
        ib = ia;
    }
    EW(cu_ew(g_cu.stream, op, n->fparams[0], o, io.nb, a, ia.nb, b, ib.nb, io.ne));
    return SL_OK;
}

/* DROPOUT (Note [CUDA dropout], kernels/common.cuh and dropout.cu; the port of the OpenCL backend's): x * m
 * (+ a residual); turned off, the copy or the add of the CPU's sl_k_dropout, the same bits */
static sl_status op_dropout(sl_tensor *n) {
    float *o, *x, *r = NULL;
    PTR(n, &o);
    PTR(n->src[0], &x);
    const sl_tensor *res = n->src[1];
    if (res) PTR(res, &r);
    int64_t N = sl_nelements(n);
    sl_accel_dropout d = sl_accel_dropout_of(n);
    if (!d.on) {
        cu_v5 ne = cu_flat_ne(N), nb = cu_contig_nb(ne);
        if (res)
            EW(cu_ew(g_cu.stream, CU_EW_ADD, 0, o, nb, r, nb, x, nb, ne));
        else if (o != x)
            EW(cu_ew(g_cu.stream, CU_EW_COPY_A, 0, o, nb, x, nb, x, nb, ne));
        return SL_OK;
    }
    /* a sequence shard (B, Tl, R) of a (B, seq, R) tensor: one block per batch row */
    int shard = d.seq > 0 && n->ndim >= 2;
    int64_t nb = shard ? n->ne[0] : 1, blk = N / (nb ? nb : 1);
    int64_t R = shard && n->ne[1] > 0 ? blk / n->ne[1] : 0;
    cu_drop cd = {.on = 1, .thr = d.thr, .seed = d.seed, .hi = d.hi, .keep = d.keep};
    EW(cu_dropout(g_cu.stream, o, x, r, nb, blk, R, shard ? d.seq : 0, d.t0, cd));
    return SL_OK;
}

static sl_status op_sum_to(sl_tensor *n) {
    float *o, *a;
    PTR(n, &o);
    PTR(n->src[0], &a);
    cu_it5 ia = cu_it5_of(n->src[0]), io = cu_it5_of(n);
    EW(cu_sum_to(g_cu.stream, o, a, ia.ne, ia.nb, io.ne, sl_nelements(n)));
    return SL_OK;
}

static sl_status op_acc(sl_tensor *n) {
    const sl_tensor *dst = n->src[0], *src = n->src[1];
    float *d, *s;
    PTR(dst, &d);
    PTR(src, &s);
    int op = n->iparams[0] ? CU_EW_COPY_B : CU_EW_ADD; /* Note [Overwriting first gradient writes] */
    if (sl_is_contiguous(dst) && sl_is_contiguous(src)) {
        cu_v5 ne = cu_flat_ne(sl_nelements(dst)), nb = cu_contig_nb(ne);
        EW(cu_ew(g_cu.stream, op, 0, d, nb, d, nb, s, nb, ne));
        return SL_OK;
    }
    cu_it5 id = cu_it5_of(dst), is = cu_it5_of(src);
    EW(cu_ew(g_cu.stream, op, 0, d, id.nb, d, id.nb, s, is.nb, id.ne));
    return SL_OK;
}

static sl_status op_scatter_add(sl_tensor *n) {
    const sl_tensor *src = n->src[1];
    float *d, *s;
    PTR(n, &d);
    PTR(src, &s);
    cu_it5 is = cu_it5_of(src);
    cu_v5 nbv = is.nb;
    int vnd = n->iparams[5], pad = 5 - vnd;
    for (int k = 0; k < 5; k++) nbv.v[k] = k < pad ? 0 : n->iparams[1 + k - pad];
    d += n->iparams[0];
    EW(cu_ew(g_cu.stream, CU_EW_ADD, 0, d, nbv, d, nbv, s, is.nb, is.ne));
    return SL_OK;
}

static sl_status op_zeros(sl_tensor *n) {
    void *o;
    PTR(n, &o);
    size_t bytes = sl_nbytes(n);
    return bytes ? cu_ok(cudaMemsetAsync(o, 0, bytes, g_cu.stream), "zeros") : SL_OK;
}

static sl_status op_kv_store(sl_tensor *n) {
    const sl_tensor *x = n->src[1];
    int64_t T = x->ne[1], NKV = x->ne[2], hs = x->ne[3], S = n->ne[1], pos0 = n->iparams[0];
    if (pos0 < 0 || pos0 + T > S)
        return sl_fail(SL_ERR_INVALID, "kv cache: position %lld + %lld exceeds capacity %lld",
                       (long long)pos0, (long long)T, (long long)S);
    float *o, *px;
    PTR(n, &o);
    PTR(x, &px);
    cu_it5 ix = cu_it5_of(x);
    cu_v5 nbo = {{0, S * NKV * hs, NKV * hs, hs, 1}};
    o += pos0 * NKV * hs;
    EW(cu_ew(g_cu.stream, CU_EW_COPY_A, 0, o, nbo, px, ix.nb, px, ix.nb, ix.ne));
    return SL_OK;
}

/* ---------------- GEMMs (cuBLAS) ---------------- */

/* Note [Row-major GEMMs on cuBLAS]
 * suanli's matrices are row-major (PyTorch layouts); cuBLAS is column-major. A row-major M x N matrix with
 * leading dimension ld is the column-major N x M matrix with the same ld, so C = op(A) op(B) is computed
 * as C^T = op(B)^T op(A)^T: cublasGemmEx(opB, opA, N, M, K, B, ldb, A, lda, C, ldc), where op is T when the
 * operand is transposed in suanli's terms. Batches: the innermost batch dim is one strided-batched call,
 * the outer two are loops. fp32 operands use CUBLAS_COMPUTE_32F (exact fp32), or
 * CUBLAS_COMPUTE_32F_FAST_TF32 under SUANLI_CUDA_TF32=1; bf16 and f16 operands CUBLAS_COMPUTE_32F. A bias is
 * first broadcast into C, then the GEMM adds onto it (beta = 1). */
typedef struct gemm_args {
    int bf, tA, tB; /* bf: 16-bit operands, bf16 or (f16 set) f16 */
    int f16;
    int64_t M, N, K, lda, ldb, ldc;
    const void *A, *B;
    float *C;
    float beta;
    int64_t batch, sA, sB, sC; /* innermost batch dim: count and strides (elements) */
} gemm_args;

/* cuBLAS wants ld >= the stored column length even where the other extent is 1 and the stride is moot */
static int64_t fix_ld(int64_t ld, int64_t col_len, int64_t other) {
    return ld < col_len && other == 1 ? col_len : ld;
}

static sl_status gemm(const gemm_args *g0) {
    gemm_args gg = *g0, *g = &gg;
    if (g->M <= 0 || g->N <= 0 || g->batch <= 0) return SL_OK;
    g->lda = fix_ld(g->lda, g->tA ? g->M : g->K, g->tA ? g->K : g->M);
    g->ldb = fix_ld(g->ldb, g->tB ? g->K : g->N, g->tB ? g->N : g->K);
    g->ldc = fix_ld(g->ldc, g->N, g->M);
    if (g->M > INT32_MAX || g->N > INT32_MAX || g->K > INT32_MAX || g->lda > INT32_MAX ||
        g->ldb > INT32_MAX || g->ldc > INT32_MAX || g->batch > INT32_MAX)
        return sl_fail(SL_ERR_UNSUPPORTED, "cuda backend: GEMM of %lld x %lld x %lld too large for cuBLAS",
                       (long long)g->M, (long long)g->N, (long long)g->K);
    float alpha = 1.0f, beta = g->beta;
    cudaDataType_t ab = g->bf ? (g->f16 ? CUDA_R_16F : CUDA_R_16BF) : CUDA_R_32F;
    cublasComputeType_t ct = !g->bf && g_cu.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasOperation_t oa = g->tA ? CUBLAS_OP_T : CUBLAS_OP_N, ob = g->tB ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (g->K == 0) { /* C = beta * C (cuBLAS needs k >= 1 only for some paths; do it ourselves) */
        if (beta == 0.0f) {
            cu_v5 ne = {{1, 1, g->batch, g->M, g->N}}, nb = {{0, 0, g->sC, g->ldc, 1}};
            return cu_ok(cu_ew(g_cu.stream, CU_EW_FILL, 0, g->C, nb, g->C, nb, g->C, nb, ne), "matmul");
        }
        return SL_OK;
    }
    cublasStatus_t st;
    if (g->batch == 1)
        st = g_blas.gemm_ex(g_cu.blas, ob, oa, (int)g->N, (int)g->M, (int)g->K, &alpha, g->B, ab, (int)g->ldb,
                            g->A, ab, (int)g->lda, &beta, g->C, CUDA_R_32F, (int)g->ldc, ct,
                            CUBLAS_GEMM_DEFAULT);
    else
        st = g_blas.gemm_strided_batched_ex(g_cu.blas, ob, oa, (int)g->N, (int)g->M, (int)g->K, &alpha, g->B,
                                            ab, (int)g->ldb, g->sB, g->A, ab, (int)g->lda, g->sA, &beta, g->C,
                                            CUDA_R_32F, (int)g->ldc, g->sC, (int)g->batch, ct,
                                            CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? SL_OK : cu_blas_fail(st, "cublasGemmEx");
}

/* broadcast bias (N) into every row of C: shape (b0, b1, b2, M, N), strides of C */
static sl_status bias_rows(float *C, cu_v5 ne, cu_v5 nbc, const float *bias) {
    cu_v5 nbb = {{0, 0, 0, 0, 1}};
    return cu_ok(cu_ew(g_cu.stream, CU_EW_COPY_A, 0, C, nbc, bias, nbb, bias, nbb, ne), "matmul bias");
}

/* Note [Rounded weight gradients] (src/ops/ops_internal.h): iparams[SL_MATMUL_IP_ROUND] = SL_BF16 rounds each
 * element of the product to bf16 before it is stored or added to the output, as the CPU's matmul_rounded
 * (2-D operands, no bias: supports_op). The product goes to scratch, then is rounded into C. */
static sl_status matmul_rounded(gemm_args *g) {
    float *C = g->C;
    int64_t ldc = g->ldc, M = g->M, N = g->N;
    int add = g->beta != 0.0f;
    void *tmp;
    SL_TRY(cu_scratch(sizeof(float) * (size_t)(M * N > 0 ? M * N : 1), &tmp));
    g->C = tmp, g->ldc = N, g->beta = 0.0f;
    SL_TRY(gemm(g));
    cu_v5 ne = {{1, 1, 1, M, N}}, nbt = {{0, 0, 0, N, 1}}, nbc = {{0, 0, 0, ldc, 1}};
    if (!add)
        return cu_ok(cu_ew16(g_cu.stream, CU_EW16_ROUND_BF16, C, nbc, tmp, nbt, ne), "matmul (rounded)");
    SL_TRY(cu_ok(cu_ew16(g_cu.stream, CU_EW16_ROUND_BF16, tmp, nbt, tmp, nbt, ne), "matmul (rounded)"));
    return cu_ok(cu_ew(g_cu.stream, CU_EW_ADD, 0, C, nbc, C, nbc, tmp, nbt, ne), "matmul (rounded)");
}

static sl_status op_matmul(sl_tensor *n) {
    const sl_tensor *a = n->src[0], *b = n->src[1], *bias = n->src[2];
    int na = a->ndim, nbd = b->ndim, no = n->ndim;
    size_t es = sl_dtype_size(a->dtype);
    gemm_args g = {.bf = a->dtype == SL_BF16 || a->dtype == SL_F16,
                   .f16 = a->dtype == SL_F16,
                   .tA = n->iparams[0],
                   .tB = n->iparams[1]};
    g.K = g.tA ? a->ne[na - 2] : a->ne[na - 1];
    g.N = n->ne[no - 1];
    g.lda = a->nb[na - 2];
    g.ldb = b->nb[nbd - 2];
    g.ldc = n->nb[no - 2];
    char *pa, *pb;
    float *pc, *pbias = NULL;
    PTR(n, &pc);
    PTR(a, &pa);
    PTR(b, &pb);
    if (bias) PTR(bias, &pbias);
    /* iparams[2]: 1 accumulates into the output (in place on view_src), 2 overwrites it; a bias overwrites
     * (as the CPU's sl_sgemm_bias) */
    g.beta = n->iparams[2] == 1 ? 1.0f : 0.0f;
    if (n->iparams[SL_MATMUL_IP_ROUND]) { /* 2-D, no bias (supports_op) */
        g.M = n->ne[0];
        g.A = pa, g.B = pb, g.C = pc, g.batch = 1;
        return matmul_rounded(&g);
    }
    if (nbd == 2 && na > 2) { /* folded: a's leading dims are rows */
        g.M = 1;
        for (int d = 0; d < na - 1; d++) g.M *= a->ne[d];
        g.tA = 0;
        g.ldc = g.N;
        g.A = pa, g.B = pb, g.C = pc, g.batch = 1;
        if (pbias) {
            cu_v5 ne = {{1, 1, 1, g.M, g.N}}, nbc = {{0, 0, 0, g.ldc, 1}};
            SL_TRY(bias_rows(pc, ne, nbc, pbias));
            g.beta = 1.0f;
        }
        return gemm(&g);
    }
    g.M = n->ne[no - 2];
    cu_it5 ia = cu_it5_of(a), ib = cu_it5_of(b), ic = cu_it5_of(n);
    if (pbias) {
        cu_v5 ne = {{ic.ne.v[0], ic.ne.v[1], ic.ne.v[2], g.M, g.N}},
              nbc = {{ic.nb.v[0], ic.nb.v[1], ic.nb.v[2], g.ldc, 1}};
        SL_TRY(bias_rows(pc, ne, nbc, pbias));
        g.beta = 1.0f;
    }
    g.batch = ic.ne.v[2];
    g.sA = ia.nb.v[2], g.sB = ib.nb.v[2], g.sC = ic.nb.v[2];
    for (int64_t i0 = 0; i0 < ic.ne.v[0]; i0++)
        for (int64_t i1 = 0; i1 < ic.ne.v[1]; i1++) {
            g.A = pa + (size_t)(i0 * ia.nb.v[0] + i1 * ia.nb.v[1]) * es;
            g.B = pb + (size_t)(i0 * ib.nb.v[0] + i1 * ib.nb.v[1]) * es;
            g.C = pc + i0 * ic.nb.v[0] + i1 * ic.nb.v[1];
            SL_TRY(gemm(&g));
        }
    return SL_OK;
}

/* LINEAR_BF16: y (M, N) = bf16(x) (M, K) @ op(w), w bf16 (N, K) when transB else (K, N); x rounded to bf16
 * into scratch first (as the CPU does), fp32 accumulation; iparams[1]: y rounded to bf16 */
static sl_status op_linear_bf16(sl_tensor *n) {
    const sl_tensor *x = n->src[0], *w = n->src[1];
    int transB = n->iparams[0];
    int64_t K = x->ne[x->ndim - 1], M = K ? sl_nelements(x) / K : 0, N = n->ne[n->ndim - 1];
    int64_t xs = x->ndim >= 2 ? x->nb[x->ndim - 2] : K;
    float *px, *y;
    void *pw, *xb;
    PTR(x, &px);
    PTR(w, &pw);
    PTR(n, &y);
    SL_TRY(cu_scratch(sizeof(uint16_t) * (size_t)(M * K > 0 ? M * K : 1), &xb));
    cu_v5 ne = {{1, 1, 1, M, K}}, nbx = {{0, 0, 0, xs, 1}}, nbo = {{0, 0, 0, K, 1}};
    EW(cu_ew16(g_cu.stream, CU_EW16_F32_TO_BF16, xb, nbo, px, nbx, ne));
    gemm_args g = {.bf = 1,
                   .tA = 0,
                   .tB = transB,
                   .M = M,
                   .N = N,
                   .K = K,
                   .lda = K,
                   .ldb = transB ? K : N,
                   .ldc = N,
                   .A = xb,
                   .B = pw,
                   .C = y,
                   .beta = 0.0f,
                   .batch = 1};
    SL_TRY(gemm(&g));
    if (n->iparams[1]) {
        cu_v5 ney = cu_flat_ne(M * N), nby = cu_contig_nb(ney);
        EW(cu_ew16(g_cu.stream, CU_EW16_ROUND_BF16, y, nby, y, nby, ney));
    }
    return SL_OK;
}

/* ---------------- dispatch ---------------- */

sl_status cu_compute(sl_tensor *n) {
    char *o;
    switch (n->op) {
    case SL_OP_VIEW:
        return SL_OK;
    case SL_OP_CONT:
    case SL_OP_CAST:
        PTR(n, &o);
        return op_copy(n, n->src[0], o, cu_it5_of(n).nb, n->op == SL_OP_CAST && n->dtype != n->src[0]->dtype);
    case SL_OP_CONCAT:
        return op_concat(n);
    case SL_OP_ADD:
        return op_binary(n, CU_EW_ADD);
    case SL_OP_MUL:
        return op_binary(n, CU_EW_MUL);
    case SL_OP_SCALE:
        return op_binary(n, CU_EW_SCALE);
    case SL_OP_GELU:
        return op_binary(n, CU_EW_GELU);
    case SL_OP_GELU_BACK:
        return op_binary(n, CU_EW_GELU_BACK);
    case SL_OP_SILU:
        return op_binary(n, CU_EW_SILU);
    case SL_OP_SILU_BACK:
        return op_binary(n, CU_EW_SILU_BACK);
    case SL_OP_FILL:
        PTR(n, &o);
        return cu_ew_flat(CU_EW_FILL, n->fparams[0], (float *)o, sl_nelements(n));
    case SL_OP_SUM_TO:
        return op_sum_to(n);
    case SL_OP_ACC:
        return op_acc(n);
    case SL_OP_SCATTER_ADD:
        return op_scatter_add(n);
    case SL_OP_DROPOUT:
        return op_dropout(n);
    case SL_OP_ZEROS:
        return op_zeros(n);
    case SL_OP_KV_STORE:
        return op_kv_store(n);
    case SL_OP_MATMUL:
        return op_matmul(n);
    case SL_OP_LINEAR_BF16:
        return op_linear_bf16(n);
    default:
        return cu_op_nn(n);
    }
}
