/* transpose_avx512.h — the 16 x 16 transpose of 32-bit words in AVX-512 registers, shared by the GEMM packers
 * (gemm_avx512.c: fp32 panels; gemm_amx.c: bf16 pairs) and the attention's transposed tiles (vec_avx512.c).
 * The includer provides the intrinsics (<immintrin.h>, or SIMDe in the emulation tests) and defines
 * SL_TR16_ATTR, the target attribute of its AVX-512 functions (empty where the whole file is built for
 * AVX-512 or emulated). Not a public header. */
#ifndef SL_DEVICE_CPU_KERNELS_TRANSPOSE_AVX512_H
#define SL_DEVICE_CPU_KERNELS_TRANSPOSE_AVX512_H

/* r[c] = column c of the 16 x 16 matrix whose rows are r[0..15]. Stage 1 interleaves row pairs, stage 2
 * builds 4-row columns in each 128-bit lane, stage 3 transposes the 4 x 4 grid of lanes (64 shuffles). */
SL_TR16_ATTR static inline void sl_tr16_ps(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* r[4g + m], lane L: column 4L + m of rows 4g .. 4g + 3 */
        __m512 *tt = t + 4 * g;
        r[4 * g + 0] = _mm512_shuffle_ps(tt[0], tt[2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * g + 1] = _mm512_shuffle_ps(tt[0], tt[2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * g + 2] = _mm512_shuffle_ps(tt[1], tt[3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * g + 3] = _mm512_shuffle_ps(tt[1], tt[3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    }
    for (int c = 0; c < 8; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
    }
}

/* the same on integer registers (bf16 pairs as 32-bit words); the casts are free */
SL_TR16_ATTR static inline void sl_tr16_epi32(__m512i r[16]) {
    __m512 f[16];
    for (int i = 0; i < 16; i++) f[i] = _mm512_castsi512_ps(r[i]);
    sl_tr16_ps(f);
    for (int i = 0; i < 16; i++) r[i] = _mm512_castps_si512(f[i]);
}

#endif
