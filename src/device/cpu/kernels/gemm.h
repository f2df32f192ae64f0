/* gemm.h — dense matrix multiply kernels of the CPU backend (internal header).
 *
 * Usage:
 *   // Y[BT,OC] = X[BT,C] @ W[OC,C]^T   (a Linear layer's forward pass)
 *   sl_sgemm(0, 1, BT, OC, C, 1.0f, X, C, W, C, 0.0f, Y, OC);
 *
 * Row-major throughout. Every entry point picks the micro-kernel for the running CPU (AVX-512, AVX2+FMA or
 * scalar; SUANLI_ISA=scalar|avx2|avx512 forces one) and threads with OpenMP. Results are deterministic:
 * each element of C is summed in an order fixed by the blocking, never by the thread schedule, so the
 * same inputs give bitwise-identical output for any thread count on the same kernel variant.
 */
#ifndef SL_DEVICE_CPU_KERNELS_GEMM_H
#define SL_DEVICE_CPU_KERNELS_GEMM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C. op(A) is M x K: A is M x K (lda >= K) or, if transA,
 * K x M (lda >= M). op(B) is K x N: B is K x N (ldb >= N) or, if transB, N x K (ldb >= K). ldc >= N.
 * beta == 0 means C is write-only (may hold NaN). Threads: uses OpenMP internally (call from serial code);
 * deterministic: same inputs and thread count -> bitwise-identical output. */
void sl_sgemm(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* C[M,N] = alpha * op(A) @ op(B) + bias[None, :] (bias: N floats): a Linear layer with its bias added in
 * the GEMM (no separate pass over C). Same threading and determinism as sl_sgemm. */
void sl_sgemm_bias(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                   int64_t lda, const float *B, int64_t ldb, const float *bias, float *C, int64_t ldc);
/* Scalar reference (double accumulation), the test oracle. */
void sl_sgemm_ref(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Batched: for b in [0,batch): same with A + b*strideA etc. Parallelise over batch when batch is large. */
void sl_sgemm_batched(int transA, int transB, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, int64_t strideA, const float *B, int64_t ldb,
                      int64_t strideB, float beta, float *C, int64_t ldc, int64_t strideC);
/* bf16 inputs (uint16_t storage, RNE-rounded bf16), fp32 accumulate and fp32 output C. Uses AMX tiles
 * (AMX-BF16) when present and permitted, else vdpbf16ps (AVX512_BF16), else an exact emulated path. */
void sl_gemm_bf16(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A,
                  int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* bf16 inputs with a bias (see sl_sgemm_bias). */
void sl_gemm_bf16_bias(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, const float *bias,
                       float *C, int64_t ldc);
/* bf16 A times fp32 B rounded to bf16 (sl_f32_to_bf16) as it is packed: bitwise sl_gemm_bf16 on a rounded
 * copy of B, without that copy where the kernel packs fp32 itself (AMX). bias: NULL or N floats (then beta
 * is ignored: C = alpha op(A) op(B) + bias). */
void sl_gemm_bf16_f32b(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       const float *bias, float *C, int64_t ldc);
/* sl_gemm_bf16_f32b with each finished element of C (alpha, beta and bias applied) rounded to bf16, bitwise
 * the plain call followed by a cast to bf16 and back (Note [Rounded Linear outputs], gemm.c); any K. */
void sl_gemm_bf16_f32b_round(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                             const uint16_t *A, int64_t lda, const float *B, int64_t ldb, float beta,
                             const float *bias, float *C, int64_t ldc);
/* C (= | += when add) bf16(op(A) op(B)): each element of the product rounded to bf16 (sl_round_bf16_f32)
 * before it is stored or added, inside the GEMM (Note [Rounded products in the GEMM], gemm.c). A and B are
 * both bf16 (in_bf16) or both fp32. Bitwise the product written to a buffer and rounded in a second pass.
 * Returns 0 without touching C when it cannot (K above the kernel's K block, M == 1): the caller then does
 * the two passes. */
int sl_gemm_rounded(int in_bf16, int transA, int transB, int64_t M, int64_t N, int64_t K, const void *A,
                    int64_t lda, const void *B, int64_t ldb, float *C, int64_t ldc, int add);
/* c[i*ldc + j] (= | +=) sl_round_bf16_f32(t[i*ldt + j]) for i < rows, j < n (AVX-512 lanes where present,
 * the same bits as the scalar loop) */
void sl_round_bf16_rows(float *c, int64_t ldc, const float *t, int64_t ldt, int64_t rows, int64_t n, int add);
const char *sl_gemm_kernel_name(void); /* which variant runs: "avx512", "avx2", "scalar" */
/* which variant runs the bf16 entry points: "amx" (tiles), "avx512_bf16" (vdpbf16ps), or the fp32 kernel's
 * name (inputs widened to fp32 when packed) */
const char *sl_gemm_bf16_kernel_name(void);

#ifdef __cplusplus
}
#endif
#endif
