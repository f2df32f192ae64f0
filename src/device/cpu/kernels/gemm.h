/* Row-major GEMM of the CPU backend. */
#ifndef SL_CPU_GEMM_H
#define SL_CPU_GEMM_H
#include <stdint.h>

/* Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C. op(A) is M x K: A is M x K (lda >= K) or, if transA,
 * K x M (lda >= M). op(B) is K x N: B is K x N (ldb >= N) or, if transB, N x K (ldb >= K). ldc >= N.
 * beta == 0 means C is write-only (may hold NaN). Threads: uses OpenMP internally (call from serial code);
 * deterministic: same inputs and thread count -> bitwise-identical output. */
void sl_sgemm(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Scalar reference (double accumulation), the test oracle. */
void sl_sgemm_ref(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Batched: for b in [0,batch): same with A + b*strideA etc. */
void sl_sgemm_batched(int transA, int transB, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, int64_t strideA, const float *B, int64_t ldb, int64_t strideB,
                      float beta, float *C, int64_t ldc, int64_t strideC);
/* bf16 inputs, fp32 accumulate and output. */
void sl_gemm_bf16(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A,
                  int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc);
const char *sl_gemm_kernel_name(void);
#endif
