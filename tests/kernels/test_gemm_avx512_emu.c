/* test_gemm_avx512_emu — the AVX-512 GEMM code (fp32 8x48 kernel, its transposing packers, the vdpbf16ps
 * kernel and bf16-pair packers) run through SIMDe's portable intrinsics, against the reference. This
 * checks the AVX-512 logic on machines whose CPU lacks AVX-512 (built only when SIMDe is installed:
 * libsimde-dev). A few intrinsics SIMDe 0.7 lacks are written out below, lane by lane (with memcpy: the
 * instructions need no alignment, and the bf16 packers load 32-bit pairs at 2-byte alignment).
 * Tolerance as in test_gemm: |got - ref| <= 1e-6 * (K + 8) + 1e-5 * |ref|. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <string.h>

/* ---- types and intrinsics missing from SIMDe 0.7 (lane-by-lane) ---- */
typedef simde__mmask16 __mmask16;
typedef simde__mmask8 __mmask8;
static inline __m512 sh_mm512_maskz_loadu_ps(__mmask16 k, const void *p) {
    float t[16] = {0};
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) memcpy(t + i, (const char *)p + 4 * i, 4);
    return _mm512_loadu_ps(t);
}
static inline void sh_mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 v) {
    float t[16];
    _mm512_storeu_ps(t, v);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) memcpy((char *)p + 4 * i, t + i, 4);
}
static inline __m256 sh_mm256_maskz_loadu_ps(__mmask8 k, const void *p) {
    float t[8] = {0};
    for (int i = 0; i < 8; i++)
        if ((k >> i) & 1) memcpy(t + i, (const char *)p + 4 * i, 4);
    return _mm256_loadu_ps(t);
}
static inline __m512 sh_mm512_shuffle_f32x4(__m512 a, __m512 b, int imm) {
    float x[16], y[16], r[16];
    _mm512_storeu_ps(x, a);
    _mm512_storeu_ps(y, b);
    for (int l = 0; l < 4; l++) {
        int sel = (imm >> (2 * l)) & 3;
        memcpy(r + 4 * l, (l < 2 ? x : y) + 4 * sel, 16);
    }
    return _mm512_loadu_ps(r);
}
static inline __m512i sh_mm512_cvtepu16_epi32(__m256i a) {
    uint16_t x[16];
    uint32_t r[16];
    _mm256_storeu_si256((__m256i *)x, a);
    for (int i = 0; i < 16; i++) r[i] = x[i];
    return _mm512_loadu_si512(r);
}
static inline __m256i sh_mm256_maskz_loadu_epi16(__mmask16 k, const void *p) {
    uint16_t t[16];
    for (int i = 0; i < 16; i++) t[i] = (k >> i) & 1 ? ((const uint16_t *)p)[i] : 0;
    return _mm256_loadu_si256((const __m256i *)t);
}
static inline __m128i sh_mm_maskz_loadu_epi16(__mmask8 k, const void *p) {
    uint16_t t[8];
    for (int i = 0; i < 8; i++) t[i] = (k >> i) & 1 ? ((const uint16_t *)p)[i] : 0;
    return _mm_loadu_si128((const __m128i *)t);
}
static inline __m256i sh_mm512_cvtepi32_epi16(__m512i a) {
    uint32_t x[16];
    uint16_t r[16];
    _mm512_storeu_si512(x, a);
    for (int i = 0; i < 16; i++) r[i] = (uint16_t)x[i];
    return _mm256_loadu_si256((const __m256i *)r);
}
static inline void sh_mm256_mask_storeu_epi16(void *p, __mmask16 k, __m256i v) {
    uint16_t t[16];
    _mm256_storeu_si256((__m256i *)t, v);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) memcpy((char *)p + 2 * i, t + i, 2);
}
#define _mm512_maskz_loadu_ps sh_mm512_maskz_loadu_ps
#define _mm512_cvtepi32_epi16 sh_mm512_cvtepi32_epi16
#define _mm256_mask_storeu_epi16 sh_mm256_mask_storeu_epi16
#define _mm512_mask_storeu_ps sh_mm512_mask_storeu_ps
#define _mm256_maskz_loadu_ps sh_mm256_maskz_loadu_ps
#define _mm512_shuffle_f32x4 sh_mm512_shuffle_f32x4
#define _mm512_cvtepu16_epi32 sh_mm512_cvtepu16_epi32
#define _mm256_maskz_loadu_epi16 sh_mm256_maskz_loadu_epi16
#define _mm_maskz_loadu_epi16 sh_mm_maskz_loadu_epi16

/* ---- the code under test, under private names ---- */
#define SL_GEMM_AVX512_EMULATED 1
#define sl_gemm_impl_avx512_f32 emu_impl_f32
#define sl_gemm_impl_avx512_bf16emu emu_impl_bf16emu
#define sl_gemm_impl_avx512_bf16 emu_impl_bf16
#include "device/cpu/kernels/gemm_avx512.c"

#include "device/cpu/kernels/gemm.h"
#include "testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static void run_case(const sl_gemm_impl *im, int bf16, int tA, int tB, int64_t M, int64_t N, int64_t K,
                     int pad, float alpha, float beta, int nthr) {
    int64_t lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N + pad;
    int64_t na = (tA ? K : M) * lda, nb = (tB ? N : K) * ldb, nc = M * ldc;
    float *Af = malloc((size_t)na * 4), *Bf = malloc((size_t)nb * 4), *C = malloc((size_t)nc * 4),
          *R = malloc((size_t)nc * 4);
    uint16_t *Ah = malloc((size_t)na * 2), *Bh = malloc((size_t)nb * 2);
    if (!Af || !Bf || !C || !R || !Ah || !Bh) abort();
    for (int64_t i = 0; i < na; i++) Af[i] = frand();
    for (int64_t i = 0; i < nb; i++) Bf[i] = frand();
    for (int64_t i = 0; i < nc; i++) C[i] = beta == 0.0f ? NAN : frand();
    if (bf16) {
        for (int64_t i = 0; i < na; i++) Ah[i] = sl_f32_to_bf16(Af[i]), Af[i] = sl_bf16_to_f32(Ah[i]);
        for (int64_t i = 0; i < nb; i++) Bh[i] = sl_f32_to_bf16(Bf[i]), Bf[i] = sl_bf16_to_f32(Bh[i]);
    }
    memcpy(R, C, (size_t)nc * 4);
    sl_sgemm_ref(tA, tB, M, N, K, alpha, Af, lda, Bf, ldb, beta, R, ldc);
    sl_gemm_args g = {
        tA,  tB, M,   N,    K, alpha, beta, bf16 ? (const void *)Ah : Af, lda, bf16 ? (const void *)Bh : Bf,
        ldb, C,  ldc, NULL, 0, 0};
    sl_gemm_run(&g, im, nthr);
    for (int64_t i = 0; i < nc; i++)
        if (isnan(R[i]) && isnan(C[i])) R[i] = C[i] = 0.0f; /* untouched padding of a NaN-filled C */
    char what[160];
    snprintf(what, sizeof what, "%s %s%s M=%lld N=%lld K=%lld pad=%d alpha=%g beta=%g thr=%d",
             im == &emu_impl_f32 ? "f32" : (im == &emu_impl_bf16 ? "bf16" : "bf16emu"), tA ? "T" : "N",
             tB ? "T" : "N", (long long)M, (long long)N, (long long)K, pad, alpha, beta, nthr);
    TU_CHECK(tu_allclose(what, C, R, nc, 1e-6f * (float)(K + 8), 1e-5f), "%s", what);
    free(Af), free(Bf), free(C), free(R), free(Ah), free(Bh);
}

/* fp32 B with b_f32 (Note [Fused weight casts on AVX512_BF16]): rounded as it is packed, through the
 * per-thread buffer or (bconv_fail) the stack blocks, bitwise the GEMM on a rounded bf16 copy of B */
static void run_f32b(int tA, int tB, int64_t M, int64_t N, int64_t K, int pad, int bconv_fail, int nthr) {
    int64_t lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N;
    int64_t na = (tA ? K : M) * lda, nb = (tB ? N : K) * ldb, nc = M * ldc;
    float *Bf = malloc((size_t)nb * 4), *C1 = malloc((size_t)nc * 4), *C2 = malloc((size_t)nc * 4);
    uint16_t *Ah = malloc((size_t)na * 2), *Bh = malloc((size_t)nb * 2);
    if (!Bf || !C1 || !C2 || !Ah || !Bh) abort();
    for (int64_t i = 0; i < na; i++) Ah[i] = sl_f32_to_bf16(frand());
    for (int64_t i = 0; i < nb; i++) {
        Bf[i] = frand() * 3.0f;
        if (i % 7 == 3) { /* an exact tie between two bf16 values: rounded to the even one */
            uint32_t u;
            memcpy(&u, Bf + i, 4);
            u = (u & 0xffff0000u) | 0x8000u;
            memcpy(Bf + i, &u, 4);
        }
    }
    const uint32_t nan_bits = 0x7fffffffu; /* a NaN whose rounding would carry into the sign: kept quiet */
    memcpy(Bf + nb / 2, &nan_bits, 4);
    for (int64_t i = 0; i < nb; i++) Bh[i] = sl_f32_to_bf16(Bf[i]);
    sl_gemm_args g = {tA, tB, M, N, K, 1.0f, 0.0f, Ah, lda, Bh, ldb, C1, ldc, NULL, 0, 0};
    sl_gemm_run(&g, &emu_impl_bf16, nthr);
    g.B = Bf, g.b_f32 = 1, g.C = C2;
    emu_bconv_fail = bconv_fail;
    sl_gemm_run(&g, &emu_impl_bf16, nthr);
    emu_bconv_fail = 0;
    TU_CHECK(!memcmp(C1, C2, (size_t)nc * 4), "bf16 x fp32 B %s%s M=%lld N=%lld K=%lld pad=%d%s: not bitwise",
             tA ? "T" : "N", tB ? "T" : "N", (long long)M, (long long)N, (long long)K, pad,
             bconv_fail ? " (stack blocks)" : "");
    free(Bf), free(C1), free(C2), free(Ah), free(Bh);
}

/* Note [Rounding in the writeback] (gemm.c): the vdpbf16ps kernel that rounds its tile in registers is
 * bitwise the kernel followed by the driver's rounding passes (the impl without kernel_round), for a rounded
 * product stored or added, a rounded output with alpha / beta and with a late bias, over one K block and
 * several, full and edge tiles; and what it stores is a bf16 value (or C plus one). */
static void run_round(int c_round, int tA, int tB, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                      int with_bias, int nthr) {
    int64_t lda = (tA ? M : K) + 1, ldb = (tB ? K : N) + 2, ldc = N + 3;
    int64_t na = (tA ? K : M) * lda, nb = (tB ? N : K) * ldb, nc = M * ldc;
    uint16_t *Ah = malloc((size_t)na * 2), *Bh = malloc((size_t)nb * 2);
    float *C0 = malloc((size_t)nc * 4), *C1 = malloc((size_t)nc * 4), *C2 = malloc((size_t)nc * 4),
          *bias = malloc((size_t)N * 4);
    if (!Ah || !Bh || !C0 || !C1 || !C2 || !bias) abort();
    for (int64_t i = 0; i < na; i++) Ah[i] = sl_f32_to_bf16(frand());
    for (int64_t i = 0; i < nb; i++) Bh[i] = sl_f32_to_bf16(frand());
    for (int64_t i = 0; i < nc; i++)
        C0[i] = sl_bf16_to_f32(sl_f32_to_bf16(frand())); /* ROUND_ADD's C: gradients so far */
    for (int64_t i = 0; i < N; i++) bias[i] = frand();
    memcpy(C1, C0, (size_t)nc * 4);
    memcpy(C2, C0, (size_t)nc * 4);
    sl_gemm_impl two_pass = emu_impl_bf16;
    two_pass.kernel_round = NULL;
    sl_gemm_args g = {tA, tB,     M, N, K, alpha, beta, Ah, lda, Bh, ldb, C1, ldc, with_bias ? bias : NULL,
                      0,  c_round};
    sl_gemm_run(&g, &emu_impl_bf16, nthr);
    g.C = C2;
    sl_gemm_run(&g, &two_pass, nthr);
    int64_t not_half = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float x = C1[i * ldc + j] - (c_round == SL_GEMM_ROUND_ADD ? C0[i * ldc + j] : 0.0f);
            not_half += sl_bf16_to_f32(sl_f32_to_bf16(x)) != x;
        }
    const char *mode = c_round == SL_GEMM_ROUND_STORE ? "store"
                       : c_round == SL_GEMM_ROUND_ADD ? "add"
                                                      : "out";
    TU_CHECK(!memcmp(C1, C2, (size_t)nc * 4),
             "rounding in the writeback (%s) %s%s M=%lld N=%lld K=%lld alpha=%g beta=%g bias=%d thr=%d: not "
             "bitwise the two passes",
             mode, tA ? "T" : "N", tB ? "T" : "N", (long long)M, (long long)N, (long long)K, alpha, beta,
             with_bias, nthr);
    TU_CHECK(c_round == SL_GEMM_ROUND_ADD || not_half == 0,
             "rounding in the writeback (%s): %lld values not bf16", mode, (long long)not_half);
    free(Ah), free(Bh), free(C0), free(C1), free(C2), free(bias);
}

int main(void) {
    /* shapes exercise full tiles, row/column edges, k tails of the 8x8/16x16 transposes, odd K for
     * bf16 pairs, and more than one K block (kc 384 fp32 / 512 bf16). */
    static const int64_t shapes[][3] = {{1, 1, 1},    {8, 48, 16},   {9, 49, 17},   {17, 100, 3},
                                        {63, 65, 33}, {24, 96, 385}, {7, 47, 1031}, {130, 20, 64}};
    const sl_gemm_impl *impls[3] = {&emu_impl_f32, &emu_impl_bf16, &emu_impl_bf16emu};
    for (int ii = 0; ii < 3; ii++)
        for (int s = 0; s < 8; s++)
            for (int t = 0; t < 4; t++) {
                int pad = (s + t) % 2 ? 3 : 0;
                run_case(impls[ii], ii > 0, t >> 1, t & 1, shapes[s][0], shapes[s][1], shapes[s][2], pad,
                         1.0f, 0.0f, 1);
                run_case(impls[ii], ii > 0, t >> 1, t & 1, shapes[s][0], shapes[s][1], shapes[s][2], pad + 1,
                         -0.5f, 1.0f, 2);
                if (s % 3 == 0)
                    run_case(impls[ii], ii > 0, t >> 1, t & 1, shapes[s][0], shapes[s][1], shapes[s][2], pad,
                             2.0f, 0.25f, 2);
            }
    static const int64_t fb[][3] = {{9, 49, 17}, {24, 96, 385}, {7, 47, 1031}, {3, 400, 130}};
    for (int s = 0; s < 4; s++)
        for (int t = 0; t < 4; t++)
            for (int fail = 0; fail < 2; fail++)
                run_f32b(t >> 1, t & 1, fb[s][0], fb[s][1], fb[s][2], (s + t) % 2 ? 3 : 0, fail, 1 + s % 2);
    static const int64_t rs[][3] = {{8, 48, 16}, {9, 49, 17}, {63, 100, 130}, {17, 70, 1031}};
    for (int s = 0; s < 4; s++)
        for (int t = 0; t < 4; t++) {
            int tA = t >> 1, tB = t & 1, nthr = 1 + t % 2;
            if (rs[s][2] <= emu_impl_bf16.kc) { /* a rounded product: its sum in one K block */
                run_round(SL_GEMM_ROUND_STORE, tA, tB, rs[s][0], rs[s][1], rs[s][2], 1.0f, 0.0f, 0, nthr);
                run_round(SL_GEMM_ROUND_ADD, tA, tB, rs[s][0], rs[s][1], rs[s][2], 1.0f, 0.0f, 0, nthr);
            }
            run_round(SL_GEMM_ROUND_OUT, tA, tB, rs[s][0], rs[s][1], rs[s][2], 1.0f, 0.0f, 1, nthr);
            run_round(SL_GEMM_ROUND_OUT, tA, tB, rs[s][0], rs[s][1], rs[s][2], 0.5f, 0.0f, 0, nthr);
            run_round(SL_GEMM_ROUND_OUT, tA, tB, rs[s][0], rs[s][1], rs[s][2], -2.0f, 1.0f, 0, nthr);
            run_round(SL_GEMM_ROUND_OUT, tA, tB, rs[s][0], rs[s][1], rs[s][2], 1.0f, 0.25f, 0, nthr);
        }
    return tu_finish("test_gemm_avx512_emu");
}
