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
    for (int i = 0; i < MR; i++) {
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        /* C is read (beta != 0) or written after ~ksteps*6 cycles: start fetching it now */
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < ksteps; k++) {
        _mm_prefetch((const char *)(b + 8 * NR), _MM_HINT_T0);
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

/* ---- packers ---- */

/* r[0..8) rows of 8 -> r[j] = column j. */
SL_TARGET_AVX2 static inline void transpose8x8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        __m256 *tt = t + 4 * h, *uu = u + 4 * h;
        uu[0] = _mm256_shuffle_ps(tt[0], tt[2], _MM_SHUFFLE(1, 0, 1, 0));
        uu[1] = _mm256_shuffle_ps(tt[0], tt[2], _MM_SHUFFLE(3, 2, 3, 2));
        uu[2] = _mm256_shuffle_ps(tt[1], tt[3], _MM_SHUFFLE(1, 0, 1, 0));
        uu[3] = _mm256_shuffle_ps(tt[1], tt[3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

/* Store 6 floats of v at d (no write past d[5]). */
SL_TARGET_AVX2 static inline void store6(float *d, __m256 v) {
    _mm_storeu_ps(d, _mm256_castps256_ps128(v));
    _mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(v, 1));
}

/* op(A) rows [i0, i0+ni) for a row-major A (M x K): panel[k][i] = A[i0+i][k0+k]. */
SL_TARGET_AVX2 static void pack_a_rows(const float *A, int64_t lda, int64_t i0, int64_t ni, int64_t k0, int64_t kc,
                                       float *dst) {
    for (int64_t p = 0; p * MR < ni; p++, dst += kc * MR) {
        int n = ni - p * MR < MR ? (int)(ni - p * MR) : MR;
        const float *src = A + (i0 + p * MR) * lda + k0;
        int64_t k = 0;
        if (n == MR) {
            for (; k + 8 <= kc; k += 8) {
                __m256 r[8];
                for (int i = 0; i < MR; i++) r[i] = _mm256_loadu_ps(src + i * lda + k);
                r[6] = r[7] = _mm256_setzero_ps();
                transpose8x8(r);
                for (int j = 0; j < 8; j++) store6(dst + (k + j) * MR, r[j]);
            }
        }
        for (; k < kc; k++)
            for (int i = 0; i < MR; i++) dst[k * MR + i] = i < n ? src[i * lda + k] : 0.0f;
    }
}

/* op(A) rows [i0, i0+ni) for a transposed A (K x M): panel[k][i] = A[k0+k][i0+i]. Panel by panel, so the
 * writes are sequential; the reads of neighbouring panels share cache lines while they are still in L1. */
SL_TARGET_AVX2 static void pack_a_cols(const float *A, int64_t lda, int64_t i0, int64_t ni, int64_t k0, int64_t kc,
                                       float *dst) {
    for (int64_t p = 0; p * MR < ni; p++, dst += kc * MR) {
        int n = ni - p * MR < MR ? (int)(ni - p * MR) : MR;
        const float *src = A + k0 * lda + i0 + p * MR;
        if (n == MR) {
            for (int64_t k = 0; k < kc; k++) {
                const float *s = src + k * lda;
                _mm_storeu_ps(dst + k * MR, _mm_loadu_ps(s));
                _mm_storel_pi((__m64 *)(dst + k * MR + 4), _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(s + 4)));
            }
        } else {
            for (int64_t k = 0; k < kc; k++)
                for (int i = 0; i < MR; i++) dst[k * MR + i] = i < n ? src[k * lda + i] : 0.0f;
        }
    }
}

/* op(B) columns [j0, j0+nj) for a row-major B (K x N): panel[k][j] = B[k0+k][j0+j]. Panel by panel. */
SL_TARGET_AVX2 static void pack_b_rows(const float *B, int64_t ldb, int64_t j0, int64_t nj, int64_t k0, int64_t kc,
                                       float *dst) {
    for (int64_t p = 0; p * NR < nj; p++, dst += kc * NR) {
        int n = nj - p * NR < NR ? (int)(nj - p * NR) : NR;
        const float *src = B + k0 * ldb + j0 + p * NR;
        if (n == NR) {
            for (int64_t k = 0; k < kc; k++) {
                _mm256_storeu_ps(dst + k * NR, _mm256_loadu_ps(src + k * ldb));
                _mm256_storeu_ps(dst + k * NR + 8, _mm256_loadu_ps(src + k * ldb + 8));
            }
        } else {
            for (int64_t k = 0; k < kc; k++)
                for (int j = 0; j < NR; j++) dst[k * NR + j] = j < n ? src[k * ldb + j] : 0.0f;
        }
    }
}

/* op(B) columns [j0, j0+nj) for a transposed B (N x K): panel[k][j] = B[j0+j][k0+k]. */
SL_TARGET_AVX2 static void pack_b_cols(const float *B, int64_t ldb, int64_t j0, int64_t nj, int64_t k0, int64_t kc,
                                       float *dst) {
    for (int64_t p = 0; p * NR < nj; p++, dst += kc * NR) {
        int n = nj - p * NR < NR ? (int)(nj - p * NR) : NR;
        const float *src = B + (j0 + p * NR) * ldb + k0;
        int64_t k = 0;
        if (n == NR) {
            for (; k + 8 <= kc; k += 8) {
                for (int h = 0; h < 2; h++) {
                    __m256 r[8];
                    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (h * 8 + i) * ldb + k);
                    transpose8x8(r);
                    for (int j = 0; j < 8; j++) _mm256_storeu_ps(dst + (k + j) * NR + h * 8, r[j]);
                }
            }
        }
        for (; k < kc; k++)
            for (int j = 0; j < NR; j++) dst[k * NR + j] = j < n ? src[j * ldb + k] : 0.0f;
    }
}

SL_TARGET_AVX2 static void pack_a_avx2(const sl_gemm_args *g, int64_t i0, int64_t ni, int64_t k0, int64_t kc, int mr,
                                       void *dst) {
    (void)mr;
    if (g->transA) pack_a_cols((const float *)g->A, g->lda, i0, ni, k0, kc, (float *)dst);
    else pack_a_rows((const float *)g->A, g->lda, i0, ni, k0, kc, (float *)dst);
}

SL_TARGET_AVX2 static void pack_b_avx2(const sl_gemm_args *g, int64_t j0, int64_t nj, int64_t k0, int64_t kc, int nr,
                                       void *dst) {
    (void)nr;
    if (g->transB) pack_b_cols((const float *)g->B, g->ldb, j0, nj, k0, kc, (float *)dst);
    else pack_b_rows((const float *)g->B, g->ldb, j0, nj, k0, kc, (float *)dst);
}

const sl_gemm_impl sl_gemm_impl_avx2_f32 = {
    .name = "avx2", .mr = MR, .nr = NR, .kgran = 1, .esz = 4, .in_bf16 = 0, .kc = 384, .mc = 1536, .nc = 192,
    .pack_a = pack_a_avx2, .pack_b = pack_b_avx2, .kernel = kernel_avx2_6x16};
const sl_gemm_impl sl_gemm_impl_avx2_bf16emu = {
    .name = "avx2", .mr = MR, .nr = NR, .kgran = 1, .esz = 4, .in_bf16 = 1, .kc = 384, .mc = 1536, .nc = 192,
    .pack_a = sl_gemm_pack_a_bf16_f32, .pack_b = sl_gemm_pack_b_bf16_f32, .kernel = kernel_avx2_6x16};
