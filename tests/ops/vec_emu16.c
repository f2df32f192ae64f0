/* A 16-lane instantiation of vec_kernels.inc built from pairs of AVX2 vectors, for tests only: it runs
 * the code paths that the AVX-512 build takes (16 lanes, one vector per 16-key attention tile row,
 * 8-row register blocks, 64-column sum blocks, lane masks up to 16) on CPUs without AVX-512, so they
 * are checked against the scalar reference even where vec_avx512.c cannot execute. The intrinsic
 * mappings of vec_avx512.c themselves are only exercised on AVX-512 hardware. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/simd_math.h"
#include "device/cpu/kernels/vec_kernels.h"

#if SL_HAVE_X86
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#pragma GCC target("avx2,fma")

typedef struct {
    __m256 lo, hi;
} vf;
#define VL 16
static inline vf e_set1(float x) { return (vf){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
static inline vf e_load(const float *p) { return (vf){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void e_store(float *p, vf v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
#define E2(name, op)                                                                                         \
    static inline vf name(vf a, vf b) { return (vf){op(a.lo, b.lo), op(a.hi, b.hi)}; }
E2(e_add, _mm256_add_ps)
E2(e_sub, _mm256_sub_ps)
E2(e_mul, _mm256_mul_ps)
E2(e_max, _mm256_max_ps)
static inline vf e_fma(vf a, vf b, vf c) {
    return (vf){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline vf e_fnma(vf a, vf b, vf c) {
    return (vf){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
static inline vf e_exp(vf a) { return (vf){sl_exp_avx2(a.lo), sl_exp_avx2(a.hi)}; }
static inline vf e_gelu_exp(vf a) { /* Note [GELU as x sigmoid(2u)]: as vec_avx2.c */
    const __m256 c = _mm256_set1_ps(SL_GELU_ZMAX);
    return (vf){sl_exp_avx2(_mm256_min_ps(a.lo, c)), sl_exp_avx2(_mm256_min_ps(a.hi, c))};
}
static inline vf e_recip(vf d) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return (vf){_mm256_div_ps(one, d.lo), _mm256_div_ps(one, d.hi)};
}
static inline float e_hsum(vf v) {
    float t[16], s = 0;
    e_store(t, v);
    for (int i = 0; i < 16; i++) s += t[i];
    return s;
}
static inline float e_hmax(vf v) {
    float t[16], m = -INFINITY;
    e_store(t, v);
    for (int i = 0; i < 16; i++) m = t[i] > m ? t[i] : m;
    return m;
}
static inline vf e_loadn(const float *p, int64_t n, float fill) {
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = i < n ? p[i] : fill;
    return e_load(t);
}
static inline void e_storen(float *p, vf v, int64_t n) {
    float t[16];
    e_store(t, v);
    for (int i = 0; i < n; i++) p[i] = t[i];
}
#define VZERO e_set1(0.0f)
#define VSET1 e_set1
#define VLOAD e_load
#define VSTORE e_store
#define VADD e_add
#define VSUB e_sub
#define VMUL e_mul
#define VMAX e_max
#define VFMA e_fma
#define VFNMA e_fnma
#define VEXP e_exp
#define VGELU_EXP e_gelu_exp
#define VRECIP e_recip
#define VHSUM e_hsum
#define VHMAX e_hmax
#define VLOADN e_loadn
#define VSTOREN e_storen
#define FN(name) emu16_##name
static inline __m256 e_sel8(__m256 v, __m256 x, __m256 lo, __m256 hi, __m256 other) {
    __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), _mm256_cmp_ps(x, hi, _CMP_LE_OQ));
    return _mm256_blendv_ps(other, v, in);
}
static inline vf e_sel_range(vf v, vf x, vf lo, vf hi, vf other) {
    return (vf){e_sel8(v.lo, x.lo, lo.lo, hi.lo, other.lo), e_sel8(v.hi, x.hi, lo.hi, hi.hi, other.hi)};
}
#define VSEL_RANGE e_sel_range
#define VEC_TABLE sl_vec_ops_emu16
#define VEC_NAME "emu16"

#include "device/cpu/kernels/vec_kernels.inc"

#pragma GCC pop_options
#endif
