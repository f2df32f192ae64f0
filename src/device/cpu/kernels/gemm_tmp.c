/* TEMPORARY simple GEMM used until the packed SIMD GEMM lands (branch gemm). */
#include <string.h>

#include "device/cpu/kernels/gemm.h"

void sl_sgemm_ref(int tA, int tB, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (double)(tA ? A[k * lda + i] : A[i * lda + k]) * (tB ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = (float)(alpha * s + (beta == 0 ? 0.0 : (double)beta * C[i * ldc + j]));
        }
}

void sl_sgemm(int tA, int tB, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (beta == 0) memset(c, 0, sizeof(float) * (size_t)N);
        else if (beta != 1)
            for (int64_t j = 0; j < N; j++) c[j] *= beta;
        if (!tB) {
            for (int64_t k = 0; k < K; k++) {
                float a = alpha * (tA ? A[k * lda + i] : A[i * lda + k]);
                const float *b = B + k * ldb;
#pragma omp simd
                for (int64_t j = 0; j < N; j++) c[j] += a * b[j];
            }
        } else {
            for (int64_t j = 0; j < N; j++) {
                const float *b = B + j * ldb;
                float s = 0;
                if (!tA) {
                    const float *a = A + i * lda;
#pragma omp simd reduction(+ : s)
                    for (int64_t k = 0; k < K; k++) s += a[k] * b[k];
                } else {
                    for (int64_t k = 0; k < K; k++) s += A[k * lda + i] * b[k];
                }
                c[j] += alpha * s;
            }
        }
    }
}

void sl_sgemm_batched(int tA, int tB, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB, float beta, float *C,
                      int64_t ldc, int64_t sC) {
    for (int64_t b = 0; b < batch; b++)
        sl_sgemm(tA, tB, M, N, K, alpha, A + b * sA, lda, B + b * sB, ldb, beta, C + b * sC, ldc);
}

void sl_gemm_bf16(int tA, int tB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)tA; (void)tB; (void)M; (void)N; (void)K; (void)alpha; (void)A; (void)lda; (void)B; (void)ldb;
    (void)beta; (void)C; (void)ldc;
}

const char *sl_gemm_kernel_name(void) { return "tmp"; }
