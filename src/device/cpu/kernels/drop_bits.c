/* Dropout masks kept as bits between a forward node and its backward (Note [Dropout bits], kernels.h): the
 * header that names a mask, and the packers of a run of multipliers. */
#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/simd_math.h"

/* seed, stream and site (hi), p and the mask's extent n (a row length T or an element count) */
static void header_of(uint64_t seed, uint64_t hi, float p, int64_t n, uint64_t h[4]) {
    uint32_t pb;
    memcpy(&pb, &p, 4);
    h[0] = seed ^ 0x9E3779B97F4A7C15ull;
    h[1] = hi;
    h[2] = (uint64_t)pb | (uint64_t)n << 32;
    h[3] = 0x6B73616D74706F72ull; /* nonzero: a zeroed header names no mask */
}
void sl_k_drop_header_set(void *hdr, uint64_t seed, uint64_t hi, float p, int64_t n, int valid) {
    uint64_t h[4] = {0, 0, 0, 0};
    if (valid) header_of(seed, hi, p, n, h);
    memcpy(hdr, h, sizeof h);
}
int sl_k_drop_header_valid(const void *hdr, uint64_t seed, uint64_t hi, float p, int64_t n) {
    uint64_t h[4], w[4];
    header_of(seed, hi, p, n, w);
    memcpy(h, hdr, sizeof h);
    return memcmp(h, w, sizeof h) == 0;
}

/* the multipliers mk[0 .. n) (keep or 0) as bits, and back; keep is the drawing's 1 / (1 - p) */
static void bits_pack_base(const float *mk, int64_t n, uint16_t *bits) {
    for (int64_t j = 0; j < n; j += 16) {
        unsigned w = 0;
        for (int64_t k = 0; k < 16 && j + k < n; k++) w |= (unsigned)(mk[j + k] != 0.0f) << k;
        bits[j / 16] = (uint16_t)w;
    }
}
static void bits_unpack_base(const uint16_t *bits, int64_t n, float keep, float *mk) {
    for (int64_t j = 0; j < n; j++) mk[j] = (bits[j >> 4] >> (j & 15)) & 1u ? keep : 0.0f;
}
#if SL_HAVE_X86
__attribute__((target("avx512f"))) static void bits_pack_avx512(const float *mk, int64_t n, uint16_t *bits) {
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
        bits[j / 16] = (uint16_t)_mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, mk + j),
                                                         _mm512_setzero_ps(), _CMP_NEQ_OQ);
    }
}
__attribute__((target("avx512f"))) static void bits_unpack_avx512(const uint16_t *bits, int64_t n, float keep,
                                                                  float *mk) {
    const __m512 vk = _mm512_set1_ps(keep);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
        _mm512_mask_storeu_ps(mk + j, k, _mm512_maskz_mov_ps((__mmask16)bits[j / 16], vk));
    }
}
#endif
sl_bits_pack_fn sl_k_bits_pack(int isa) {
#if SL_HAVE_X86
    if (isa >= SL_KISA_AVX512) return bits_pack_avx512;
#endif
    (void)isa;
    return bits_pack_base;
}
sl_bits_unpack_fn sl_k_bits_unpack(int isa) {
#if SL_HAVE_X86
    if (isa >= SL_KISA_AVX512) return bits_unpack_avx512;
#endif
    (void)isa;
    return bits_unpack_base;
}
