/* simd_math.h — vector exp/tanh for the CPU kernels (internal header), and the ISA choice of the
 * non-GEMM kernels.
 *
 * Usage (inside a function compiled for AVX-512, e.g. in vec_avx512.c):
 *   __m512 y = sl_exp_avx512(x);            // e^x, <= 2 ulp on [-87.3, 88.7]; 0 below (and -inf), +inf above
 *   __m512 t = sl_tanh_avx512(x);           // tanh, <= 2 ulp
 * Scalar twins (sl_exp_poly, sl_tanh_poly) evaluate the same polynomials; the tests measure their ulp
 * error against libm in double.
 *
 * Note [Vector exp and tanh]
 * exp: x = n ln2 + r with n = round(x log2 e) and a two-constant Cody-Waite ln2 (Cephes' split), then
 * e^r = 1 + r + r^2 P(r) with Cephes' degree-5 P on |r| <= ln2/2, then 2^n by scalef (AVX-512) or by
 * multiplying by two exponent-built powers (AVX2; inputs below -87.34 return 0).
 * tanh: odd Taylor series through u^17 for |u| < 0.55 (truncation < 1 ulp there), otherwise
 * sign(u) (1 - 2 / (e^{2|u|} + 1)) with |u| clamped to 9.1 (tanh(u) rounds to 1 in fp32 from u = 9.02 on).
 * Both branches are computed and blended per lane, so results do not depend on the position of an element.
 */
#ifndef SL_DEVICE_CPU_KERNELS_SIMD_MATH_H
#define SL_DEVICE_CPU_KERNELS_SIMD_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SL_HAVE_X86 1
#else
#define SL_HAVE_X86 0
#endif

/* f32 -> bf16 -> f32 as sl_f32_to_bf16 rounds (nearest even; a NaN kept quiet: the same bits), without
 * branches, so the loops around it vectorize (the bf16-rounded weight gradients in matmul.c, the eager half
 * attention's rounding points in attention.c) */
static inline float sl_round_bf16_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u, q = (u & 0xffff0000u) | 0x400000u;
    u = (u & 0x7fffffffu) > 0x7f800000u ? q : r;
    memcpy(&x, &u, 4);
    return x;
}

/* Which variant the non-GEMM kernels run. Chosen once from CPUID (respecting SUANLI_ISA); tests may
 * force a narrower one with sl_kern_isa_force (-1 restores the detected one). Not thread-safe: call it
 * from serial code, between kernel launches. */
enum { SL_KISA_SCALAR = 0, SL_KISA_AVX2 = 1, SL_KISA_AVX512 = 2 };
int sl_kern_isa(void);
void sl_kern_isa_force(int isa);
const char *sl_kern_isa_name(int isa);

#define SL_EXP_HI 88.7228317f
#define SL_EXP_LO (-87.3365479f)
#define SL_LOG2E 1.44269504088896341f
#define SL_EXP_C1 0.693359375f
#define SL_EXP_C2 (-2.12194440e-4f)
#define SL_EXP_P0 1.9875691500e-4f
#define SL_EXP_P1 1.3981999507e-3f
#define SL_EXP_P2 8.3334519073e-3f
#define SL_EXP_P3 4.1665795894e-2f
#define SL_EXP_P4 1.6666665459e-1f
#define SL_EXP_P5 5.0000001201e-1f
/* tanh(u) = u * (1 + u^2 T(u^2)) near 0: Taylor coefficients of u^3 .. u^17 */
#define SL_TANH_T1 (-3.33333333333e-1f)
#define SL_TANH_T2 1.33333333333e-1f
#define SL_TANH_T3 (-5.39682539683e-2f)
#define SL_TANH_T4 2.18694885362e-2f
#define SL_TANH_T5 (-8.86323552990e-3f)
#define SL_TANH_T6 3.59212803657e-3f
#define SL_TANH_T7 (-1.45583438705e-3f)
#define SL_TANH_T8 5.90027440946e-4f
#define SL_TANH_SMALL 0.55f
#define SL_TANH_CLAMP 9.1f

/* ---- scalar twins (same formulas; for tests and scalar tails) ---- */
static inline float sl_exp_poly(float x) {
    if (!(x >= SL_EXP_LO)) return x != x ? x : 0.0f;
    if (x > SL_EXP_HI) return INFINITY;
    float n = nearbyintf(x * SL_LOG2E);
    float r = fmaf(-n, SL_EXP_C1, x);
    r = fmaf(-n, SL_EXP_C2, r);
    float p = SL_EXP_P0;
    p = fmaf(p, r, SL_EXP_P1);
    p = fmaf(p, r, SL_EXP_P2);
    p = fmaf(p, r, SL_EXP_P3);
    p = fmaf(p, r, SL_EXP_P4);
    p = fmaf(p, r, SL_EXP_P5);
    p = fmaf(p, r * r, r + 1.0f);
    return ldexpf(p, (int)n);
}

static inline float sl_tanh_poly(float u) {
    float a = fabsf(u);
    if (a < SL_TANH_SMALL) {
        float z = u * u, p = SL_TANH_T8;
        p = fmaf(p, z, SL_TANH_T7);
        p = fmaf(p, z, SL_TANH_T6);
        p = fmaf(p, z, SL_TANH_T5);
        p = fmaf(p, z, SL_TANH_T4);
        p = fmaf(p, z, SL_TANH_T3);
        p = fmaf(p, z, SL_TANH_T2);
        p = fmaf(p, z, SL_TANH_T1);
        return fmaf(u * z, p, u);
    }
    if (a > SL_TANH_CLAMP) a = SL_TANH_CLAMP;
    float t = 1.0f - 2.0f / (sl_exp_poly(2.0f * a) + 1.0f);
    return copysignf(t, u);
}

#if SL_HAVE_X86
/* sl_round_bf16_f32 on 16 lanes (the same bits: nearest even, a NaN kept quiet); AVX-512F alone, so that
 * any AVX-512 function may inline it (gemm.c's rounded outputs, attention.c's rounded transposed keys) */
static inline __attribute__((target("avx512f"), always_inline)) __m512 sl_round_bf16_avx512(__m512 x) {
    const __m512i u = _mm512_castps_si512(x), hi = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r =
        _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), hi);
    const __m512i q = _mm512_or_si512(_mm512_and_si512(u, hi), _mm512_set1_epi32(0x400000));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, r, q));
}
#define SL_TGT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"), always_inline))
#define SL_TGT_AVX2 __attribute__((target("avx2,fma"), always_inline))

/* ---- AVX-512 ---- */
/* Inputs below SL_EXP_LO give 0 like the scalar and AVX2 twins, and are replaced by 0 before scalef: a
 * product that scalef takes into the subnormal range costs a microcode assist (~150 cycles on Intel,
 * unless FTZ is set), and a causal softmax feeds it -inf for every masked score; that assist was 40 % of
 * the baby model's attention forward. sl_exp_avx512_in is the body for inputs known to be in range (lanes
 * off in `keep` give 0): tanh calls it on 2|u| >= 0, where the range test cost GELU ~10 %. */
static inline SL_TGT_AVX512 __m512 sl_exp_avx512_in(__m512 x, __mmask16 keep) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(SL_EXP_LO)), _mm512_set1_ps(SL_EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(SL_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SL_EXP_C1), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SL_EXP_C2), r);
    __m512 p = _mm512_set1_ps(SL_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(keep, p, n);
}
static inline SL_TGT_AVX512 __m512 sl_exp_avx512(__m512 x) {
    __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SL_EXP_LO), _CMP_LT_OQ);
    return sl_exp_avx512_in(_mm512_mask_mov_ps(x, under, _mm512_setzero_ps()), (__mmask16)~under);
}

static inline SL_TGT_AVX512 __m512 sl_tanh_avx512(__m512 u) {
    __m512 a = _mm512_abs_ps(u);
    __m512 z = _mm512_mul_ps(u, u), p = _mm512_set1_ps(SL_TANH_T8);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(SL_TANH_T7));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(SL_TANH_T6));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(SL_TANH_T5));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(SL_TANH_T4));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(SL_TANH_T3));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(SL_TANH_T2));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(SL_TANH_T1));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(u, z), p, u);
    __m512 ac = _mm512_min_ps(a, _mm512_set1_ps(SL_TANH_CLAMP));
    __m512 e = sl_exp_avx512_in(_mm512_add_ps(ac, ac), (__mmask16)0xFFFF); /* 2|u| >= 0: no underflow */
    __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                               _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    /* copy u's sign onto big */
    big = _mm512_or_ps(big, _mm512_and_ps(u, _mm512_set1_ps(-0.0f)));
    __mmask16 m = _mm512_cmp_ps_mask(a, _mm512_set1_ps(SL_TANH_SMALL), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(m, big, small);
}

/* ---- AVX2 + FMA ---- */
static inline SL_TGT_AVX2 __m256 sl_exp_avx2(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(SL_EXP_LO), _CMP_LT_OQ);
    __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(SL_EXP_HI), _CMP_GT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(SL_EXP_LO)), _mm256_set1_ps(SL_EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(SL_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SL_EXP_C1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SL_EXP_C2), r);
    __m256 p = _mm256_set1_ps(SL_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n as 2^n1 * 2^n2 with n1 = floor(n/2): both factors stay normal for every n in [-126, 128] */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    y = _mm256_andnot_ps(under, y);
    return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
}

static inline SL_TGT_AVX2 __m256 sl_tanh_avx2(__m256 u) {
    __m256 sign = _mm256_and_ps(u, _mm256_set1_ps(-0.0f));
    __m256 a = _mm256_xor_ps(u, sign);
    __m256 z = _mm256_mul_ps(u, u), p = _mm256_set1_ps(SL_TANH_T8);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(SL_TANH_T7));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(SL_TANH_T6));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(SL_TANH_T5));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(SL_TANH_T4));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(SL_TANH_T3));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(SL_TANH_T2));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(SL_TANH_T1));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(u, z), p, u);
    __m256 ac = _mm256_min_ps(a, _mm256_set1_ps(SL_TANH_CLAMP));
    __m256 e = sl_exp_avx2(_mm256_add_ps(ac, ac));
    __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                               _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    big = _mm256_or_ps(big, sign);
    __m256 m = _mm256_cmp_ps(a, _mm256_set1_ps(SL_TANH_SMALL), _CMP_LT_OQ);
    return _mm256_blendv_ps(big, small, m);
}
#endif /* SL_HAVE_X86 */

#endif
