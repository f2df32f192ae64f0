/* MATMUL node -> GEMM calls (folded linear layers and batched products). Operands are both f32
 * (sl_sgemm) or both bf16 (sl_gemm_bf16: fp32 accumulation); the output is always f32. */
#include "device/cpu/kernels/gemm.h"
#include "device/cpu/kernels/kernels.h"

sl_status sl_k_matmul(sl_tensor *n) {
    sl_tensor *a = n->src[0], *b = n->src[1];
    int tA = n->iparams[0], tB = n->iparams[1];
    int na = a->ndim, nbd = b->ndim, no = n->ndim;
    int64_t K = tA ? a->ne[na - 2] : a->ne[na - 1];
    int64_t N = n->ne[no - 1];
    int64_t lda = a->nb[na - 2], ldb = b->nb[nbd - 2], ldc = n->nb[no - 2];
    const float *pa = a->data, *pb = b->data;
    float *pc = n->data;
    int bf = a->dtype == SL_BF16;
    if (bf && b->dtype != SL_BF16) return sl_fail(SL_ERR_UNSUPPORTED, "matmul: mixed operand dtypes");
    if (nbd == 2 && na > 2) { /* folded: a's leading dims are rows */
        int64_t M = 1;
        for (int d = 0; d < na - 1; d++) M *= a->ne[d];
        if (bf)
            sl_gemm_bf16(0, tB, M, N, K, 1.0f, a->data, lda, b->data, ldb, 0.0f, pc, N);
        else
            sl_sgemm(0, tB, M, N, K, 1.0f, pa, lda, pb, ldb, 0.0f, pc, N);
        return SL_OK;
    }
    /* iparams[2]: accumulate into the output (in place on view_src; see ops_internal.h) */
    float beta = n->iparams[2] ? 1.0f : 0.0f;
    int64_t M = n->ne[no - 2];
    /* batch dims (up to 3) with arbitrary strides */
    sl_it5 ia = sl_it5_of(a), ib = sl_it5_of(b), ic = sl_it5_of(n);
    for (int64_t i0 = 0; i0 < ic.ne[0]; i0++)
        for (int64_t i1 = 0; i1 < ic.ne[1]; i1++)
            for (int64_t i2 = 0; i2 < ic.ne[2]; i2++) {
                int64_t oa = i0 * ia.nb[0] + i1 * ia.nb[1] + i2 * ia.nb[2];
                int64_t ob = i0 * ib.nb[0] + i1 * ib.nb[1] + i2 * ib.nb[2];
                float *C = pc + i0 * ic.nb[0] + i1 * ic.nb[1] + i2 * ic.nb[2];
                if (bf)
                    sl_gemm_bf16(tA, tB, M, N, K, 1.0f, (const uint16_t *)a->data + oa, lda,
                                 (const uint16_t *)b->data + ob, ldb, beta, C, ldc);
                else
                    sl_sgemm(tA, tB, M, N, K, 1.0f, pa + oa, lda, pb + ob, ldb, beta, C, ldc);
            }
    return SL_OK;
}
