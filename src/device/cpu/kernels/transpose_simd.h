/* transpose_simd.h — in-register transposes shared by the kernels: 16 x 16 of 32-bit words in AVX-512
 * registers (the AVX-512 and AMX GEMM packers, the attention's transposed tiles in vec_avx512.c) and 8 x 8
 * floats in AVX registers (the AVX2 and AVX-512 GEMM packers). The includer provides the intrinsics
 * (<immintrin.h>, or their emulation in tests) and defines SL_TR16_ATTR and / or SL_TR8_ATTR, the target
 * attribute of the functions that call them (empty where the whole file is built for the ISA, or emulated);
 * only the sizes whose attribute is defined are compiled. Not a public header. */
#ifndef SL_DEVICE_CPU_KERNELS_TRANSPOSE_SIMD_H
#define SL_DEVICE_CPU_KERNELS_TRANSPOSE_SIMD_H

#ifdef SL_TR8_ATTR
/* r[0..8) rows of 8 -> r[j] = column j */
SL_TR8_ATTR static inline void sl_tr8_ps(__m256 r[8]) {
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
#endif

#ifdef SL_TR16_ATTR

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
#endif /* SL_TR16_ATTR */

#endif
