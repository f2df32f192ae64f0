/* AVX2+FMA instantiation of vec_kernels.inc (8 fp32 lanes; tails by maskload/maskstore). */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/simd_math.h"
#include "device/cpu/kernels/vec_kernels.h"

#if SL_HAVE_X86
#pragma GCC push_options
/* fp-contract off: a product is fused into an add only where the source says VFMA (exact cancellation
 * in e.g. layernorm backward with C = 1 depends on it) */
#pragma GCC optimize("fp-contract=off")
#pragma GCC target("avx2,fma")

typedef __m256 vf;
#define VL 8
#define VZERO _mm256_setzero_ps()
#define VSET1 _mm256_set1_ps
#define VLOAD _mm256_loadu_ps
#define VLOAD_BF16(p) /* 8 bf16 values widened (exact) */                                                    \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define VSTORE _mm256_storeu_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VMAX _mm256_max_ps
#define VFMA _mm256_fmadd_ps   /* a*b + c */
#define VFNMA _mm256_fnmadd_ps /* c - a*b */
#define VEXP sl_exp_avx2
/* Note [GELU as x sigmoid(2u)] (vec_kernels.inc): exp of -2u clamped at SL_GELU_ZMAX, and 1 / d */
#define VGELU_EXP(z) sl_exp_avx2(_mm256_min_ps((z), _mm256_set1_ps(SL_GELU_ZMAX)))
#define VRECIP(d) _mm256_div_ps(_mm256_set1_ps(1.0f), (d))

static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
static inline float hmax8(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
static inline __m256i lanes_below(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256 loadn8(const float *p, int64_t n, float fill) {
    __m256i m = lanes_below(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
#define VHSUM hsum8
#define VHMAX hmax8
#define VLOADN(p, n, fill) loadn8((p), (n), (fill))
#define VSTOREN(p, v, n) _mm256_maskstore_ps((p), lanes_below(n), (v))
#define FN(name) v256_##name
/* lanes with lo <= x <= hi take v, the others `other` */
static inline __m256 sel_range8(__m256 v, __m256 x, __m256 lo, __m256 hi, __m256 other) {
    __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), _mm256_cmp_ps(x, hi, _CMP_LE_OQ));
    return _mm256_blendv_ps(other, v, in);
}
#define VSEL_RANGE sel_range8
#define VEC_TABLE sl_vec_ops_avx2
#define VEC_NAME "avx2"

#include "device/cpu/kernels/vec_kernels.inc"

#pragma GCC pop_options
#else
const sl_vec_ops sl_vec_ops_avx2 = {0};
#endif
