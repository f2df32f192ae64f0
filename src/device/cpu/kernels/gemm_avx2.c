/* gemm_avx2.c — AVX2+FMA micro-kernel for the blocked GEMM (see Note [GEMM structure], gemm_internal.h).
 * 6x16 register tile: 12 ymm accumulators, 2 ymm of B, 1 broadcast of A (15 of 16 ymm registers).
 * Compiled with a target attribute so the library needs no -march flag; only called when CPUID says
 * AVX2 and FMA are present. Packers: gemm_avx2_pack.inc, for fp32 and (widening) bf16 inputs. */
#include <immintrin.h>
#include <string.h>

#include "device/cpu/kernels/gemm_internal.h"

#define SL_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define SL_TR8_ATTR SL_TARGET_AVX2
#include "device/cpu/kernels/transpose_simd.h"

enum { MR = 6, NR = 16 };

#define SL_A6_PACKED(i) (a + (i))
#define SL_A6_ROWS(i) (a + (i)*lda)
/* The 6 x 16 kernel on a packed A panel (A_AT(i): a[i], A_NEXT: a += MR) or on MR rows of a row-major A read
 * in place (a[i * lda], a++: Note [Unpacked A] in gemm.c): the same FMAs in the same order, the same bits. */
#define SL_KERNEL_6x16_BODY(A_AT, A_NEXT)                                                                    \
    __m256 acc[MR][2];                                                                                       \
    _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                                   \
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();                                                         \
        /* C is read (beta != 0) or written after ~ksteps*6 cycles: start fetching it now */                 \
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);                                              \
        _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);                                     \
    }                                                                                                        \
    _Pragma("GCC unroll 4") for (int64_t k = 0; k < ksteps;                                                  \
                                 k++) { /* B: no software prefetch (Note [GEMM kernel without prefetch]) */  \
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);                                         \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                               \
            __m256 av = _mm256_broadcast_ss(A_AT(i));                                                        \
            acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);                                                  \
            acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);                                                  \
        }                                                                                                    \
        A_NEXT;                                                                                              \
        b += NR;                                                                                             \
    }                                                                                                        \
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);                                      \
    if (mr == MR && nr == NR) {                                                                              \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                               \
            float *cr = c + i * ldc;                                                                         \
            __m256 t0 = acc[i][0], t1 = acc[i][1];                                                           \
            if (alpha != 1.0f) t0 = _mm256_mul_ps(va, t0), t1 = _mm256_mul_ps(va, t1);                       \
            if (beta == 1.0f) {                                                                              \
                t0 = _mm256_add_ps(_mm256_loadu_ps(cr), t0);                                                 \
                t1 = _mm256_add_ps(_mm256_loadu_ps(cr + 8), t1);                                             \
            } else if (beta != 0.0f) {                                                                       \
                t0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), t0);                                           \
                t1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), t1);                                       \
            }                                                                                                \
            _mm256_storeu_ps(cr, t0);                                                                        \
            _mm256_storeu_ps(cr + 8, t1);                                                                    \
        }                                                                                                    \
        return;                                                                                              \
    }                                                                                                        \
    float tile[MR][NR];                                                                                      \
    _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                                   \
        _mm256_storeu_ps(tile[i], _mm256_mul_ps(va, acc[i][0]));                                             \
        _mm256_storeu_ps(tile[i] + 8, _mm256_mul_ps(va, acc[i][1]));                                         \
    }                                                                                                        \
    for (int i = 0; i < mr; i++) {                                                                           \
        float *cr = c + i * ldc;                                                                             \
        if (beta == 0.0f)                                                                                    \
            for (int j = 0; j < nr; j++) cr[j] = tile[i][j];                                                 \
        else                                                                                                 \
            for (int j = 0; j < nr; j++) cr[j] = beta * cr[j] + tile[i][j];                                  \
    }

SL_TARGET_AVX2 static void kernel_avx2_6x16(int64_t ksteps, const void *a_, const void *b_, float *c,
                                            int64_t ldc, float alpha, float beta, int mr, int nr) {
    const float *a = (const float *)a_, *b = (const float *)b_;
    SL_KERNEL_6x16_BODY(SL_A6_PACKED, a += MR);
}

/* mr must be MR (the driver packs a partial panel) */
SL_TARGET_AVX2 static void kernel_avx2_6x16_rows(int64_t ksteps, const float *a, int64_t lda, const void *b_,
                                                 float *c, int64_t ldc, float alpha, float beta, int mr,
                                                 int nr) {
    const float *b = (const float *)b_;
    SL_KERNEL_6x16_BODY(SL_A6_ROWS, a++);
}

/* Note [GEMM blocking on Zen 3]
 * kc = 768, nc = 96: the A micro-panel (6 x kc, 18 KiB) stays in L1, a packed B chunk (kc x nc, 288 KiB)
 * in L2 (512 KiB). Against kc = 384 / nc = 192 (the same L2 footprint) this halves the K blocks of the
 * K = 768 GEMMs (one pass over C instead of two, one A packing instead of two): fwd +3-8 %, dX -3..+3 %
 * per call, 1 thread (session 3, docs/BENCHMARKS-ops.md). mc = 384 / mc_max = 1536: a thread's rows are
 * packed as one block up to 1536 of them (B packed once, as before); beyond that (the LM head's dW,
 * M = 50304; qkv/fc dW at 1 thread) in blocks of 384 rows x kc (at K = 256: 384 KiB, in L2) instead
 * of one block of up to 3072 rows that streamed from L3: LM-head dW +5-10 %. */

/* ---- packers ---- */

/* Store 6 floats of v at d (no write past d[5]). */
SL_TARGET_AVX2 static inline void store6(float *d, __m256 v) {
    _mm_storeu_ps(d, _mm256_castps256_ps128(v));
    _mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(v, 1));
}

#define SL_CAT_(a, b) a##b
#define SL_CAT(a, b) SL_CAT_(a, b)

/* 8 bf16 -> 8 fp32 (exact: bf16 is the top half of an fp32) */
SL_TARGET_AVX2 static inline __m256 bf16x8_to_f32(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define SL_T float
#define SL_NAME(x) SL_CAT(x, f32)
#define SL_LD8(p) _mm256_loadu_ps(p)
#define SL_LD1(x) (x)
#define SL_IS_F32 1
#include "device/cpu/kernels/gemm_avx2_pack.inc"
#undef SL_T
#undef SL_NAME
#undef SL_LD8
#undef SL_LD1
#undef SL_IS_F32

#define SL_T uint16_t
#define SL_NAME(x) SL_CAT(x, bf16)
#define SL_LD8(p) bf16x8_to_f32(p)
#define SL_LD1(x) bf16_to_f32(x)
#define SL_IS_F32 0
#include "device/cpu/kernels/gemm_avx2_pack.inc"

const sl_gemm_impl sl_gemm_impl_avx2_f32 = {.name = "avx2",
                                            .mr = MR,
                                            .nr = NR,
                                            .kgran = 1,
                                            .esz = 4,
                                            .in_bf16 = 0,
                                            .kc = 768,
                                            .kc_even = 1,
                                            .mc = 384,
                                            .mc_max = 1536,
                                            .nc = 96,
                                            .pack_a = pack_a_avx2_f32,
                                            .pack_b = pack_b_avx2_f32,
                                            .kernel = kernel_avx2_6x16,
                                            .kernel_ua = kernel_avx2_6x16_rows};
const sl_gemm_impl sl_gemm_impl_avx2_bf16emu = {.name = "avx2",
                                                .mr = MR,
                                                .nr = NR,
                                                .kgran = 1,
                                                .esz = 4,
                                                .in_bf16 = 1,
                                                .kc = 768,
                                                .kc_even = 1,
                                                .mc = 384,
                                                .mc_max = 1536,
                                                .nc = 96,
                                                .pack_a = pack_a_avx2_bf16,
                                                .pack_b = pack_b_avx2_bf16,
                                                .kernel = kernel_avx2_6x16};
