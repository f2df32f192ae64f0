/* AVX-512 instantiation of vec_kernels.inc (16 fp32 lanes; tails by lane masks). */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/simd_math.h"
#include "device/cpu/kernels/vec_kernels.h"
#define SL_TR16_ATTR /* the whole file is built for AVX-512 (CMakeLists.txt) */
#include "device/cpu/kernels/transpose_simd.h"

#if SL_HAVE_X86
#pragma GCC push_options
/* fp-contract off: a product is fused into an add only where the source says VFMA (exact cancellation
 * in e.g. layernorm backward with C = 1 depends on it) */
#pragma GCC optimize("fp-contract=off")
/* avx512bf16 for vcvtneps2bf16 alone, run only where CPUID reports it (round_bf16_pack) */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

typedef __m512 vf;
#define VL 16
#define VZERO _mm512_setzero_ps()
#define VSET1 _mm512_set1_ps
#define VLOAD _mm512_loadu_ps
/* 16 floats rounded to bf16 as sl_f32_to_bf16 rounds (nearest even, NaN kept quiet), in the low halves:
 * vcvtneps2bf16 where the CPU has AVX512_BF16 (one instruction; it gives sl_f32_to_bf16's bits for every
 * input but subnormals, which it flushes to zero: checked over all 2^32 floats on Zen 4), else, and for a
 * vector holding a subnormal, the integer rounding of sl_round_bf16_avx512. The integer path alone made a
 * GELU that stores bf16 (Note [Half outputs]) 35 % slower than the f32 one on Zen 4. */
static int g_cvt_bf16 = -1;
static inline __attribute__((always_inline)) __m256i round_bf16_pack(__m512 v) {
    int f = __atomic_load_n(&g_cvt_bf16, __ATOMIC_RELAXED);
    if (f < 0) __atomic_store_n(&g_cvt_bf16, f = sl_cpu_features_get()->avx512_bf16 != 0, __ATOMIC_RELAXED);
    if (f && !_mm512_fpclass_ps_mask(v, 0x20)) return (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(sl_round_bf16_avx512(v)), 16));
}
#define VSTOREN_BF16(p, v, k) /* k lanes rounded (round_bf16_pack) and stored */                             \
    do {                                                                                                     \
        const __m256i h_ = round_bf16_pack(v);                                                               \
        if ((k) >= 16)                                                                                       \
            _mm256_storeu_si256((__m256i *)(void *)(p), h_);                                                 \
        else                                                                                                 \
            _mm256_mask_storeu_epi16((p), (__mmask16)((1u << (k)) - 1u), h_);                                \
    } while (0)
#define VLOAD_BF16(p) /* 16 bf16 values widened (exact) */                                                   \
    _mm512_castsi512_ps(                                                                                     \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define VSTORE _mm512_storeu_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VMAX _mm512_max_ps
#define VFMA _mm512_fmadd_ps   /* a*b + c */
#define VFNMA _mm512_fnmadd_ps /* c - a*b */
#define VEXP sl_exp_avx512
/* Note [GELU as x sigmoid(2u)] (vec_kernels.inc): exp of -2u clamped at SL_GELU_ZMAX, and 1 / d for d >= 1 */
#define VGELU_EXP(z) sl_exp_avx512_in(_mm512_min_ps((z), _mm512_set1_ps(SL_GELU_ZMAX)), (__mmask16)0xFFFF)
static inline __attribute__((always_inline)) __m512 recip_nr(__m512 d) {
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
}
#define VRECIP recip_nr
#define VHSUM _mm512_reduce_add_ps
#define VHMAX _mm512_reduce_max_ps
/* n in [0, VL]: lanes >= n read as `fill` / are not written */
#define VLOADN(p, n, fill) _mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << (n)) - 1u), (p))
#define VSTOREN(p, v, n) _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1u), (v))
#define FN(name) v512_##name
/* lanes with lo <= x <= hi take v, the others `other` */
#define VSEL_RANGE(v, x, lo, hi, other)                                                                      \
    _mm512_mask_blend_ps(                                                                                    \
        _mm512_cmp_ps_mask((x), (lo), _CMP_GE_OQ) & _mm512_cmp_ps_mask((x), (hi), _CMP_LE_OQ), (other), (v))
/* Philox-4x32-10 on 16 counters (dropout masks, Note [Dropout from counters]). GCC vectorised the lane
 * loop with 64 x 64-bit vpmullq on zero-extended words (3 uops, 15 cycles of latency on Intel: 9 % of a
 * small model's step); vpmuludq multiplies the even 32-bit lanes into 64-bit products in one uop, so each
 * 32 x 32 -> 64 product of the round is two of those (even and odd lanes) and blends. Exact integer
 * arithmetic: the same words as sl_rng_dropout's (test_kernels_simd checks every ISA's masks against it). */
/* One Philox round on 16 lanes, x[0..3] the four words: 64-bit products of the even lanes, and of the odd
 * lanes moved down, blended back into high and low words */
static inline __attribute__((always_inline)) void v512_philox_round(__m512i x[4], __m512i vk0, __m512i vk1) {
    const __m512i m0 = _mm512_set1_epi64(0xD2511F53u), m1 = _mm512_set1_epi64(0xCD9E8D57u);
    const __mmask16 odd = 0xAAAA;
    __m512i e0 = _mm512_mul_epu32(x[0], m0), o0 = _mm512_mul_epu32(_mm512_srli_epi64(x[0], 32), m0);
    __m512i e2 = _mm512_mul_epu32(x[2], m1), o2 = _mm512_mul_epu32(_mm512_srli_epi64(x[2], 32), m1);
    __m512i hi0 = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(e0, 32), o0),
            lo0 = _mm512_mask_blend_epi32(odd, e0, _mm512_slli_epi64(o0, 32));
    __m512i hi2 = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(e2, 32), o2),
            lo2 = _mm512_mask_blend_epi32(odd, e2, _mm512_slli_epi64(o2, 32));
    __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi2, x[1]), vk0),
            n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, x[3]), vk1);
    x[1] = lo2;
    x[3] = lo0;
    x[0] = n0;
    x[2] = n2;
}

/* 10 rounds on NS sets of 16 lanes (c0 .. c3 hold 16 NS words each); with NS = 2 the sets' rounds interleave,
 * so one set's multiplies (5 cycles) run while the other waits on its own: a single set's 10-round chain left
 * the core idle between dependent steps (~2 cycles per mask element, against ~1) */
static inline __attribute__((always_inline)) void v512_philox_sets(uint32_t *c0, uint32_t *c1, uint32_t *c2,
                                                                   uint32_t *c3, uint32_t k0, uint32_t k1,
                                                                   const int NS) {
    __m512i x[2][4];
#pragma GCC unroll 2
    for (int h = 0; h < NS; h++) {
        x[h][0] = _mm512_loadu_si512(c0 + 16 * h);
        x[h][1] = _mm512_loadu_si512(c1 + 16 * h);
        x[h][2] = _mm512_loadu_si512(c2 + 16 * h);
        x[h][3] = _mm512_loadu_si512(c3 + 16 * h);
    }
#pragma GCC unroll 10
    for (int r = 0; r < 10; r++) {
        const __m512i vk0 = _mm512_set1_epi32((int)k0), vk1 = _mm512_set1_epi32((int)k1);
#pragma GCC unroll 2
        for (int h = 0; h < NS; h++) v512_philox_round(x[h], vk0, vk1);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
#pragma GCC unroll 2
    for (int h = 0; h < NS; h++) {
        _mm512_storeu_si512(c0 + 16 * h, x[h][0]);
        _mm512_storeu_si512(c1 + 16 * h, x[h][1]);
        _mm512_storeu_si512(c2 + 16 * h, x[h][2]);
        _mm512_storeu_si512(c3 + 16 * h, x[h][3]);
    }
}
static inline void v512_philox16(uint32_t *c0, uint32_t *c1, uint32_t *c2, uint32_t *c3, uint32_t k0,
                                 uint32_t k1) {
    v512_philox_sets(c0, c1, c2, c3, k0, k1, 1);
}
static inline void v512_philox32(uint32_t *c0, uint32_t *c1, uint32_t *c2, uint32_t *c3, uint32_t k0,
                                 uint32_t k1) {
    v512_philox_sets(c0, c1, c2, c3, k0, k1, 2);
}
#define VEC_PHILOX16 v512_philox16
#define VEC_PHILOX32 v512_philox32

/* dst[d ldd + r] = src[r lds + d] for r, d < 16, zero for rows r >= nr and columns d >= nd (the attention's
 * transposed tiles: 64 shuffles where the scalar copy took 256 loads and 256 strided stores) */
static inline void v512_tr16(const float *src, int64_t lds, int64_t nr, int64_t nd, float *dst, int64_t ldd) {
    __m512 r[16];
    const __mmask16 km = nd >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nd > 0 ? nd : 0)) - 1u);
    for (int i = 0; i < 16; i++)
        r[i] = i < nr ? _mm512_maskz_loadu_ps(km, src + i * lds) : _mm512_setzero_ps();
    sl_tr16_ps(r);
    for (int c = 0; c < 16; c++) _mm512_storeu_ps(dst + c * ldd, r[c]);
}
#define VTRANSPOSE16 v512_tr16
#define VEC_TABLE sl_vec_ops_avx512
#define VEC_NAME "avx512"

#include "device/cpu/kernels/vec_kernels.inc"

#pragma GCC pop_options
#else
const sl_vec_ops sl_vec_ops_avx512 = {0};
#endif
