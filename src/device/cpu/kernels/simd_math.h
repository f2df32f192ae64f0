/* simd_math.h — vector exp for the CPU kernels (internal header), and the ISA choice of the
 * non-GEMM kernels.
 *
 * Usage (inside a function compiled for AVX-512, e.g. in vec_avx512.c):
 *   __m512 y = sl_exp_avx512(x);            // e^x, <= 2 ulp on [-87.3, 88.7]; 0 below (and -inf), +inf
 * above;
 *                                           // the bits of the scalar twin sl_exp_poly for every input
 * Scalar twins (sl_exp_poly) evaluate the same polynomials; the tests measure their ulp
 * error against libm in double.
 *
 * Note [Vector exp]
 * exp: x = n ln2 + r with n = round(x log2 e) and a two-constant Cody-Waite ln2 (Cephes' split), then
 * e^r = 1 + r + r^2 P(r) with Cephes' degree-5 P on |r| <= ln2/2, then 2^n by scalef (AVX-512) or by
 * multiplying by two exponent-built powers (AVX2; inputs below -87.34 return 0).
 * (A vector tanh lived here for GELU until GELU became x sigmoid(2u), Note [GELU as x sigmoid(2u)] in
 * vec_kernels.inc.)
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
#define SL_GELU_ZMAX 80.0f /* GELU's exp argument -2u is clamped here (Note [GELU as x sigmoid(2u)]) */
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

/* Note [Rounded exp]
 * sl_exp_acc(x): e^x rounded to float once from a double-precision value (x = n ln2 + r in double with a
 * two-constant ln2, |r| <= ln2/2, then the Taylor polynomial of e^r through r^11: relative error below
 * 2^-45 before the final rounding), so the result is the correctly rounded e^x except where e^x lies within
 * ~2^-45 of a rounding midpoint: like libm's expf (0.502 ulp), unlike the fast sl_exp_poly (1.24 ulp). The
 * eager half attention's softmax uses it (Note [Eager half attention, vectorized] in attention.c): its
 * probabilities stay fp32 in the Llama modes, where the fast polynomial's last bits moved the step-0
 * gradients from 0.001 to 0.025 of PyTorch's own fp32-vs-autocast gap. The vector twins below compute the
 * same double operations in the same order: the same bits for every input (NaN kept, +inf above 88.72,
 * 0 below -103.97). */
#define SL_EXPD_LOG2E 1.4426950408889634
#define SL_EXPD_LN2_HI 0x1.62e42fefa39efp-1
#define SL_EXPD_LN2_LO 0x1.abc9e3b39803fp-56
#define SL_EXPD_LO (-104.0)
#define SL_EXPD_HI 89.0
/* 1/k! for k = 11 .. 2 */
#define SL_EXPD_C11 (1.0 / 39916800.0)
#define SL_EXPD_C10 (1.0 / 3628800.0)
#define SL_EXPD_C9 (1.0 / 362880.0)
#define SL_EXPD_C8 (1.0 / 40320.0)
#define SL_EXPD_C7 (1.0 / 5040.0)
#define SL_EXPD_C6 (1.0 / 720.0)
#define SL_EXPD_C5 (1.0 / 120.0)
#define SL_EXPD_C4 (1.0 / 24.0)
#define SL_EXPD_C3 (1.0 / 6.0)
#define SL_EXPD_C2 0.5
static inline float sl_exp_acc(float x) {
    if (x != x) return x;
    double xd = x < SL_EXPD_LO ? SL_EXPD_LO : x > SL_EXPD_HI ? SL_EXPD_HI : (double)x;
    double n = nearbyint(xd * SL_EXPD_LOG2E);
    double r = fma(-n, SL_EXPD_LN2_HI, xd);
    r = fma(-n, SL_EXPD_LN2_LO, r);
    double p = SL_EXPD_C11;
    p = fma(p, r, SL_EXPD_C10);
    p = fma(p, r, SL_EXPD_C9);
    p = fma(p, r, SL_EXPD_C8);
    p = fma(p, r, SL_EXPD_C7);
    p = fma(p, r, SL_EXPD_C6);
    p = fma(p, r, SL_EXPD_C5);
    p = fma(p, r, SL_EXPD_C4);
    p = fma(p, r, SL_EXPD_C3);
    p = fma(p, r, SL_EXPD_C2);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    return (float)ldexp(p, (int)n);
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
 * off in `keep` give 0): GELU calls it on a clamped -2u (Note [GELU as x sigmoid(2u)]), where the range test
 * cost GELU ~10 %. */
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
/* sl_exp_poly's bits for every input: +inf above SL_EXP_HI, and a NaN kept (a NaN score must reach the loss,
 * where the fp16 loss scaler looks for it) */
static inline SL_TGT_AVX512 __m512 sl_exp_avx512(__m512 x) {
    __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SL_EXP_LO), _CMP_LT_OQ);
    __m512 y = sl_exp_avx512_in(_mm512_mask_mov_ps(x, under, _mm512_setzero_ps()), (__mmask16)~under);
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(SL_EXP_HI), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

/* sl_exp_acc on 8 doubles (Note [Rounded exp]), before the rounding to float */
static inline SL_TGT_AVX512 __m512d sl_exp_acc_pd_avx512(__m512d xd) {
    __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(xd, _mm512_set1_pd(SL_EXPD_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(SL_EXPD_LN2_HI), xd);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(SL_EXPD_LN2_LO), r);
    __m512d p = _mm512_set1_pd(SL_EXPD_C11);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C10));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C9));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C8));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C7));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C6));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C4));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C3));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(SL_EXPD_C2));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    return _mm512_scalef_pd(p, n); /* exact: n in [-151, 129] keeps p 2^n a normal double */
}
static inline SL_TGT_AVX512 __m512 sl_exp_acc_avx512(__m512 x) {
    __m512 xc =
        _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps((float)SL_EXPD_LO)), _mm512_set1_ps((float)SL_EXPD_HI));
    __m256 lo = _mm512_cvtpd_ps(sl_exp_acc_pd_avx512(_mm512_cvtps_pd(_mm512_castps512_ps256(xc))));
    __m256 hi = _mm512_cvtpd_ps(sl_exp_acc_pd_avx512(_mm512_cvtps_pd(_mm512_extractf32x8_ps(xc, 1))));
    __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

/* ---- AVX2 + FMA ---- */
static inline SL_TGT_AVX2 __m256 sl_exp_avx2(__m256 x) {
    const __m256 x0 = x;
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
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
    return _mm256_blendv_ps(y, x0, _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q)); /* a NaN kept, as sl_exp_poly */
}

/* sl_exp_acc on 4 doubles (Note [Rounded exp]) */
static inline SL_TGT_AVX2 __m256d sl_exp_acc_pd_avx2(__m256d xd) {
    __m256d n = _mm256_round_pd(_mm256_mul_pd(xd, _mm256_set1_pd(SL_EXPD_LOG2E)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(SL_EXPD_LN2_HI), xd);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(SL_EXPD_LN2_LO), r);
    __m256d p = _mm256_set1_pd(SL_EXPD_C11);
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C10));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C9));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C8));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C7));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C6));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C5));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C4));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C3));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(SL_EXPD_C2));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    /* 2^n from its exponent bits (n in [-151, 129]: a normal double), so the product is exact */
    __m256i e = _mm256_slli_epi64(
        _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n)), _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}
static inline SL_TGT_AVX2 __m256 sl_exp_acc_avx2(__m256 x) {
    __m256 xc =
        _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps((float)SL_EXPD_LO)), _mm256_set1_ps((float)SL_EXPD_HI));
    __m128 lo = _mm256_cvtpd_ps(sl_exp_acc_pd_avx2(_mm256_cvtps_pd(_mm256_castps256_ps128(xc))));
    __m128 hi = _mm256_cvtpd_ps(sl_exp_acc_pd_avx2(_mm256_cvtps_pd(_mm256_extractf128_ps(xc, 1))));
    __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

#endif /* SL_HAVE_X86 */

#endif
