/* gemm_avx2.c — AVX2+FMA micro-kernel for the blocked GEMM (see Note [GEMM structure], gemm_internal.h).
 * 6x16 register tile: 12 ymm accumulators, 2 ymm of B, 1 broadcast of A (15 of 16 ymm registers).
 * Compiled with a target attribute so the library needs no -march flag; only called when CPUID says
 * AVX2 and FMA are present. Packing uses the generic packers of gemm.c. */
#include <immintrin.h>
#include <string.h>

#include "device/cpu/kernels/gemm_internal.h"

#define SL_TARGET_AVX2 __attribute__((target("avx2,fma")))

enum { MR = 6, NR = 16 };

SL_TARGET_AVX2 static void kernel_avx2_6x16(int64_t ksteps, const void *a_, const void *b_, float *c,
                                            int64_t ldc, float alpha, float beta, int mr, int nr) {
    const float *a = (const float *)a_, *b = (const float *)b_;
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int64_t k = 0; k < ksteps; k++) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 av = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    if (mr == MR && nr == NR) {
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            float *cr = c + i * ldc;
            __m256 t0 = _mm256_mul_ps(va, acc[i][0]), t1 = _mm256_mul_ps(va, acc[i][1]);
            if (beta != 0.0f) {
                t0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), t0);
                t1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), t1);
            }
            _mm256_storeu_ps(cr, t0);
            _mm256_storeu_ps(cr + 8, t1);
        }
        return;
    }
    float tile[MR][NR];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) {
        _mm256_storeu_ps(tile[i], _mm256_mul_ps(va, acc[i][0]));
        _mm256_storeu_ps(tile[i] + 8, _mm256_mul_ps(va, acc[i][1]));
    }
    for (int i = 0; i < mr; i++) {
        float *cr = c + i * ldc;
        if (beta == 0.0f)
            for (int j = 0; j < nr; j++) cr[j] = tile[i][j];
        else
            for (int j = 0; j < nr; j++) cr[j] = beta * cr[j] + tile[i][j];
    }
}

const sl_gemm_impl sl_gemm_impl_avx2_f32 = {
    .name = "avx2", .mr = MR, .nr = NR, .kgran = 1, .esz = 4, .in_bf16 = 0, .kc = 256, .mc = 1536, .nc = 512,
    .pack_a = sl_gemm_pack_a_f32, .pack_b = sl_gemm_pack_b_f32, .kernel = kernel_avx2_6x16};
const sl_gemm_impl sl_gemm_impl_avx2_bf16emu = {
    .name = "avx2", .mr = MR, .nr = NR, .kgran = 1, .esz = 4, .in_bf16 = 1, .kc = 256, .mc = 1536, .nc = 512,
    .pack_a = sl_gemm_pack_a_bf16_f32, .pack_b = sl_gemm_pack_b_bf16_f32, .kernel = kernel_avx2_6x16};
