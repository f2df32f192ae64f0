/* MATMUL node -> GEMM calls (folded linear layers and batched products). Operands are both f32
 * (sl_sgemm), both bf16 (sl_gemm_bf16: fp32 accumulation) or both f16 (widened: f16.c); the output is always
 * f32. An f32 bias (src2) is added by the GEMM itself (sl_sgemm_bias / sl_gemm_bf16_bias); iparams[2] = 1
 * accumulates into the output (beta = 1), iparams[2] = 2 overwrites it in place (beta = 0; Note [Overwriting
 * first gradient writes]). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels/f16.h"
#include "device/cpu/kernels/gemm.h"
#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/simd_math.h"
#if SL_HAVE_X86
#include <immintrin.h>
#endif

/* bf: bf16 operands; 2: bf16 A and f32 B rounded to bf16 (Note [Fused weight casts], src/ops/backward.c);
 * 3: as 2, each element of C rounded to bf16 once final (Note [Rounded Linear outputs], gemm.c) */
static void gemm_call(int bf, int tA, int tB, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, float beta, const float *bias, float *C, int64_t ldc) {
    if (bf == 3)
        sl_gemm_bf16_f32b_round(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, bias, C, ldc);
    else if (bf == 2)
        sl_gemm_bf16_f32b(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, bias, C, ldc);
    else if (bf && bias)
        sl_gemm_bf16_bias(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, bias, C, ldc);
    else if (bf)
        sl_gemm_bf16(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    else if (bias)
        sl_sgemm_bias(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, bias, C, ldc);
    else
        sl_sgemm(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

/* A per-thread scratch for the rounded product (Note [Rounded weight gradients]): executors of
 * threads-as-ranks runs each have their own; freed when the thread exits. */
#define ROUND_SCRATCH_FLOATS (1 << 19) /* 2 MiB */
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static void scratch_key_init(void) { (void)pthread_key_create(&g_scratch_key, free); }
static float *round_scratch(void) {
    (void)pthread_once(&g_scratch_once, scratch_key_init);
    float *p = pthread_getspecific(g_scratch_key);
    if (!p && (p = malloc(sizeof(float) * ROUND_SCRATCH_FLOATS)) && pthread_setspecific(g_scratch_key, p)) {
        free(p);
        p = NULL;
    }
    return p;
}

/* C (=|+=) bf16(op(A) op(B)) for 2-D operands: the product in blocks of rows through the scratch, each
 * element rounded to bf16 (as sl_f32_to_bf16, the CAST kernel's rounding) before it is stored or added.
 * A block's elements are the same sums as the whole GEMM's (row blocks do not change an element's
 * reduction over K). */
static sl_status matmul_rounded(sl_tensor *n, int bf, int tA, int tB, int64_t K, int64_t N, float beta) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    if (a->ndim != 2 || b->ndim != 2 || n->ndim != 2 || n->src[2] ||
        n->iparams[SL_MATMUL_IP_ROUND] != SL_BF16)
        return sl_fail(SL_ERR_UNSUPPORTED, "matmul '%s': bf16-rounded product needs 2-D operands", n->name);
    int64_t M = n->ne[0], ldc = n->nb[0], lda = a->nb[0], ldb = b->nb[0];
    const int add = beta != 0.0f;
    /* rounded as each micro-tile is finished (Note [Rounded products in the GEMM], gemm.c); the scratch
     * below where the GEMM cannot (K above its K block) */
    if (bf != 2 && sl_gemm_rounded(bf, tA, tB, M, N, K, a->data, lda, b->data, ldb, n->data, ldc, add))
        return SL_OK;
    float *tmp = round_scratch();
    if (!tmp) return sl_fail(SL_ERR_NOMEM, "matmul '%s': out of memory for the rounding scratch", n->name);
    int64_t R = ROUND_SCRATCH_FLOATS / (N > 0 ? N : 1);
    if (R < 1)
        return sl_fail(SL_ERR_UNSUPPORTED, "matmul '%s': %lld columns exceed the rounding scratch", n->name,
                       (long long)N);
    size_t es = bf ? 2 : 4;
    float *pc = n->data;
    for (int64_t r0 = 0; r0 < M; r0 += R) {
        int64_t r = M - r0 < R ? M - r0 : R;
        const char *pa = (const char *)a->data + (size_t)(tA ? r0 : r0 * lda) * es;
        gemm_call(bf, tA, tB, r, N, K, pa, lda, b->data, ldb, 0.0f, NULL, tmp, N);
#pragma omp parallel for schedule(static) if (r * N > 65536)
        for (int64_t i = 0; i < r; i++)
            sl_round_bf16_rows(pc + (r0 + i) * ldc, ldc, tmp + i * N, N, 1, N, add);
    }
    return SL_OK;
}

sl_status sl_k_matmul(sl_tensor *n) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    int tA = n->iparams[0], tB = n->iparams[1];
    int na = a->ndim, nbd = b->ndim, no = n->ndim;
    int64_t K = tA ? a->ne[na - 2] : a->ne[na - 1];
    int64_t N = n->ne[no - 1];
    int64_t lda = a->nb[na - 2], ldb = b->nb[nbd - 2], ldc = n->nb[no - 2];
    float *pc = n->data;
    if (a->dtype == SL_F16) return sl_k_matmul_f16(n); /* widened to f32: Note [f16 GEMM] */
    int bf = a->dtype == SL_BF16;
    if (bf && b->dtype == SL_F32 && n->iparams[SL_MATMUL_IP_HALF_B] == SL_BF16)
        bf = 2; /* Note [Fused weight casts] */
    else if (bf && b->dtype != SL_BF16)
        return sl_fail(SL_ERR_UNSUPPORTED, "matmul: mixed operand dtypes");
    const float *bias = n->src[2] ? (const float *)n->src[2]->data : NULL;
    /* iparams[2]: accumulate into the output (in place on view_src; see ops_internal.h) */
    float beta = n->iparams[2] == 1 ? 1.0f : 0.0f;
    if (n->iparams[SL_MATMUL_IP_ROUND]) {
        /* a rounded Linear output (no accumulation): rounded in the GEMM for any K, folded or batched */
        if (bf != 2 || beta != 0.0f) return matmul_rounded(n, bf, tA, tB, K, N, beta);
        bf = 3;
    }
    if (nbd == 2 && na > 2) { /* folded: a's leading dims are rows */
        int64_t M = 1;
        for (int d = 0; d < na - 1; d++) M *= a->ne[d];
        gemm_call(bf, 0, tB, M, N, K, a->data, lda, b->data, ldb, beta, bias, pc, N);
        return SL_OK;
    }
    int64_t M = n->ne[no - 2];
    /* batch dims (up to 3) with arbitrary strides */
    sl_it5 ia = sl_it5_of(a), ib = sl_it5_of(b), ic = sl_it5_of(n);
    for (int64_t i0 = 0; i0 < ic.ne[0]; i0++)
        for (int64_t i1 = 0; i1 < ic.ne[1]; i1++)
            for (int64_t i2 = 0; i2 < ic.ne[2]; i2++) {
                int64_t oa = i0 * ia.nb[0] + i1 * ia.nb[1] + i2 * ia.nb[2];
                int64_t ob = i0 * ib.nb[0] + i1 * ib.nb[1] + i2 * ib.nb[2];
                float *C = pc + i0 * ic.nb[0] + i1 * ic.nb[1] + i2 * ic.nb[2];
                int64_t esa = bf ? 2 : 4, esb = bf == 1 ? 2 : 4;
                gemm_call(bf, tA, tB, M, N, K, (const char *)a->data + oa * esa, lda,
                          (const char *)b->data + ob * esb, ldb, beta, bias, C, ldc);
            }
    return SL_OK;
}
