/* The register-blocked GEMM for CPU-type devices (PoCL), Note [OpenCL GEMM tiles] in opencl_backend.c:
 * C = op(A) op(B) [+ bias] [+ C], fp32. A work-group is one work-item; it computes MR x 32 blocks of C
 * with 2*MR float16 accumulators (MR = GEMM_MR from the build options), reading op(A) and
 * op(B) as panels: element (i, k) of A's panel p at A + p*a_pan + k*a_k + i, element (k, j) of B's panel q
 * at B + q*b_pan + k*b_k + j. Operands whose layout is already a panel (A^T, B with rows a multiple of 32)
 * are read in place (a_k = lda); the others are first packed by k_gemm_pack_t / k_gemm_pack_n into
 * scratch memory ([panels][K][width], zero padded). */
#pragma OPENCL FP_CONTRACT OFF

#ifndef GEMM_MR
#define GEMM_MR 8
#endif
#define MR GEMM_MR

/* batch offset of flat batch index z (three batch dims bne.s0..s2) for strides bs */
static long gemm_boff(long z, long4 bne, long4 bs) {
    long i2 = z % bne.s2, i1 = (z / bne.s2) % bne.s1, i0 = z / (bne.s2 * bne.s1);
    return i0 * bs.s0 + i1 * bs.s1 + i2 * bs.s2;
}

/* Pack rows of a row-major matrix S (rows x K, leading dim ld) into panels of W rows:
 * P[(p*K + k)*W + r] = S[(p*W + r)*ld + k] (0 beyond rows). One work-item per (panel, 16 columns of k):
 * 16-float row reads, transposed in private memory, W-float writes. */
#define GEMM_PACK_T(NAME, W, ST, LOAD16, LOAD1)                                                              \
    kernel void NAME(int rows, int K, global const ST *S, long so, long ld, global float *P, long po,         \
                     long pz, long4 bne, long4 bss) {                                                        \
        const int p = get_global_id(0), c = get_global_id(1);                                                \
        const long z = get_global_id(2);                                                                     \
        S += so + gemm_boff(z, bne, bss);                                                                    \
        P += po + z * pz + (long)p * W * K;                                                                  \
        const int k0 = c * 16, nk = min(16, K - k0);                                                         \
        float t[W][16];                                                                                      \
        for (int r = 0; r < W; r++) {                                                                        \
            int row = p * W + r;                                                                             \
            global const ST *s = S + (long)row * ld + k0;                                                    \
            if (row < rows && nk == 16) {                                                                    \
                float16 v = LOAD16(0, s);                                                                    \
                vstore16(v, 0, t[r]);                                                                        \
            } else {                                                                                         \
                for (int kk = 0; kk < 16; kk++) t[r][kk] = row < rows && kk < nk ? LOAD1(kk, s) : 0.0f;      \
            }                                                                                                \
        }                                                                                                    \
        for (int kk = 0; kk < nk; kk++) {                                                                    \
            global float *d = P + (long)(k0 + kk) * W;                                                       \
            for (int r = 0; r < W; r++) d[r] = t[r][kk];                                                     \
        }                                                                                                    \
    }
#define LOAD_F32(i, p) ((p)[i])
GEMM_PACK_T(k_gemm_pack_ta, MR, float, vload16, LOAD_F32)
GEMM_PACK_T(k_gemm_pack_tb, 32, float, vload16, LOAD_F32)
/* f16 operands (Note [OpenCL f16 storage]): widened to f32 panels as they are packed */
GEMM_PACK_T(k_gemm_pack_ta_h, MR, half, vload_half16, vload_half)
GEMM_PACK_T(k_gemm_pack_tb_h, 32, half, vload_half16, vload_half)
/* bf16 operands (Note [OpenCL bf16 GEMM]): a bf16 is the high half of an f32, widened exactly by a shift */
inline float bf16_1(long i, global const ushort *p) { return as_float((uint)p[i] << 16); }
inline float8 bf16_8(long i, global const ushort *p) { return as_float8(convert_uint8(vload8(i, p)) << (uint8)(16)); }
inline float16 bf16_16(long i, global const ushort *p) {
    return as_float16(convert_uint16(vload16(i, p)) << (uint16)(16));
}
GEMM_PACK_T(k_gemm_pack_ta_b, MR, ushort, bf16_16, bf16_1)
GEMM_PACK_T(k_gemm_pack_tb_b, 32, ushort, bf16_16, bf16_1)
/* f32 weights rounded to bf16 as they are packed (Note [OpenCL fused weight casts]): B only, width 32 */
#define RBF16_1(i, p) rbf16((p)[i])
#define RBF16_8(i, p) rbf16_16((float16)(vload8(i, p), (float8)(0.0f))).lo
#define RBF16_16(i, p) rbf16_16(vload16(i, p))
GEMM_PACK_T(k_gemm_pack_tb_r, 32, float, RBF16_16, RBF16_1)
/* f32 activations rounded to bf16 as they are packed: A of LINEAR_BF16 (Note [OpenCL bf16 linear]) */
GEMM_PACK_T(k_gemm_pack_ta_r, MR, float, RBF16_16, RBF16_1)

/* Pack a k-major matrix S (K x cols, leading dim ld) into panels of W columns:
 * P[(p*K + k)*W + r] = S[k*ld + p*W + r] (0 beyond cols). One work-item per (panel, 16 rows of k): a
 * work-item per (panel, k) moved 32 or 128 bytes and cost more in PoCL's work-item overhead than the copy
 * (Note [OpenCL GEMM packing]); full panels of the two widths the GEMM uses move as one vector per row. */
#define GEMM_PACK_N(NAME, ST, LOAD1, LOAD8, LOAD16)                                                          \
    kernel void NAME(int cols, int K, int W, global const ST *S, long so, long ld, global float *P, long po,  \
                     long pz, long4 bne, long4 bss) {                                                        \
        const int p = get_global_id(0), k0 = get_global_id(1) * 16, k1 = min(K, k0 + 16);                    \
        const long z = get_global_id(2);                                                                     \
        const int c0 = p * W, full = c0 + W <= cols;                                                         \
        S += so + gemm_boff(z, bne, bss) + c0;                                                               \
        P += po + z * pz + (long)p * W * K;                                                                  \
        for (int k = k0; k < k1; k++) {                                                                      \
            global const ST *s = S + (long)k * ld;                                                           \
            global float *d = P + (long)k * W;                                                               \
            if (full && W == 32) {                                                                           \
                vstore16(LOAD16(0, s), 0, d);                                                                \
                vstore16(LOAD16(1, s), 1, d);                                                                \
            } else if (full && W == 8) {                                                                     \
                vstore8(LOAD8(0, s), 0, d);                                                                  \
            } else {                                                                                         \
                for (int r = 0; r < W; r++) d[r] = c0 + r < cols ? LOAD1(r, s) : 0.0f;                      \
            }                                                                                                \
        }                                                                                                    \
    }
GEMM_PACK_N(k_gemm_pack_n, float, LOAD_F32, vload8, vload16)
GEMM_PACK_N(k_gemm_pack_n_h, half, vload_half, vload_half8, vload_half16)
GEMM_PACK_N(k_gemm_pack_n_b, ushort, bf16_1, bf16_8, bf16_16)
GEMM_PACK_N(k_gemm_pack_n_r, float, RBF16_1, RBF16_8, RBF16_16)

/* Note [OpenCL bf16 GEMM]
 * bf16 x bf16 -> f32 (the bf16 autocast Linear) widens both operands exactly into the f32 panels as they are
 * packed, as the f16 path does, and sums in f32. round = 1 (MATMUL iparams[SL_MATMUL_IP_ROUND] = bf16:
 * rounded Linear outputs and weight gradients) rounds each element of the product, with its bias, to bf16
 * before it is stored or accumulated, exactly as sl_f32_to_bf16 (round to nearest even; a NaN keeps its
 * high half with the quiet bit set), the CPU's rounding (rbf16 / rbf16_16 in 0_common.cl).
 *
 * Note [OpenCL fused weight casts]
 * A MATMUL marked iparams[SL_MATMUL_IP_HALF_B] = bf16 (a bf16 A and an f32 weight B: Note [Fused weight casts]
 * in src/ops/backward.c, built where caps.matmul_half_b, which this backend sets with the register GEMM)
 * rounds B to bf16 as it packs B's panels (k_gemm_pack_tb_r / k_gemm_pack_n_r, rbf16: the CAST kernel's
 * rounding, NaN included). The panels then hold exactly what a CAST to bf16 followed by the bf16 packer
 * (an exact widening) put there, and the GEMM itself is unchanged, so the product is bitwise that of the
 * cast node and the bf16 x bf16 GEMM, without the cast's pass over the weights (4 bytes read, 2 written per
 * parameter, twice a step: forward, and the recomputed cast of the backward). */

/* One work-item: B's panel nb against MG consecutive A panels (m-blocks g*MG ...), K in blocks of
 * KC: within a k-block the 32 x KC slice of B's panel (32 KiB at KC 256) stays in L1 across the MG
 * m-blocks. Between k-blocks a tile's partial sums go through Cp (only used when K > KC): Mp rows of cpld
 * floats, the columns of the panels nb0 .. this launch covers (the host splits N into launches so that Cp
 * stays bounded, Note [OpenCL GEMM tiles]); the sum over k runs in the same order either way. */
kernel void k_gemm_reg(int M, int N, int K, global const float *A, long ao, long a_pan, long a_k, long4 bsa,
                       global const float *B, long bo, long b_pan, long b_k, long4 bsb, global float *C, long co,
                       long ldc, long4 bsc, int beta1, global const float *bias, long biaso, int has_bias,
                       long4 bne, global float *Cp, long cpo, int KC, int MG, int round, int nb0, int cpld) {
    const int nb = nb0 + (int)get_global_id(0), g = get_global_id(1);
    const long z = get_global_id(2);
    const int nmb = (M + MR - 1) / MR, Np = cpld;
    A += ao + gemm_boff(z, bne, bsa);
    B += bo + gemm_boff(z, bne, bsb) + (long)nb * b_pan;
    C += co + gemm_boff(z, bne, bsc);
    Cp += cpo + z * (long)nmb * MR * Np + (long)(nb - nb0) * nmb * MR * 32;
    const int n0 = nb * 32, full = n0 + 32 <= N;
    float16 bb0 = (float16)(0.0f), bb1 = (float16)(0.0f);
    if (has_bias && full) {
        bb0 = vload16(0, bias + biaso + n0);
        bb1 = vload16(1, bias + biaso + n0);
    }
    /* KC and MG are arguments, not build options: Note [OpenCL GEMM tiles] (a PoCL 3.1 pitfall) */
    const int nkb = K > 0 ? (K + KC - 1) / KC : 1;
    const int mb0 = g * MG, mb1 = min(nmb, mb0 + MG);
    for (int kb = 0; kb < nkb; kb++) {
        const int k0 = kb * KC, k1 = min(K, k0 + KC), last = kb == nkb - 1;
        for (int mb = mb0; mb < mb1; mb++) {
            const int m0 = mb * MR;
            global float *cp = Cp + (long)m0 * 32;
            float16 c0[MR], c1[MR];
            _Pragma("unroll") for (int i = 0; i < MR; i++) c0[i] = c1[i] = (float16)(0.0f);
            if (kb > 0) {
                _Pragma("unroll") for (int i = 0; i < MR; i++) {
                    c0[i] = vload16(0, cp + i * 32);
                    c1[i] = vload16(1, cp + i * 32);
                }
            }
            global const float *ap = A + (long)mb * a_pan;
            for (int k = k0; k < k1; k++) {
                global const float *bk = B + (long)k * b_k, *ak = ap + (long)k * a_k;
                const float16 b0 = vload16(0, bk), b1 = vload16(1, bk);
                _Pragma("unroll") for (int i = 0; i < MR; i++) {
                    const float16 a = (float16)(ak[i]);
                    c0[i] = fma(a, b0, c0[i]);
                    c1[i] = fma(a, b1, c1[i]);
                }
            }
            if (!last) {
                _Pragma("unroll") for (int i = 0; i < MR; i++) {
                    vstore16(c0[i], 0, cp + i * 32);
                    vstore16(c1[i], 1, cp + i * 32);
                }
            } else {
                _Pragma("unroll") for (int i = 0; i < MR; i++) {
                    const int m = m0 + i;
                    global float *c = C + (long)m * ldc + n0;
                    if (m < M && full) {
                        float16 v0 = c0[i], v1 = c1[i];
                        if (has_bias) v0 += bb0, v1 += bb1;
                        if (round) v0 = rbf16_16(v0), v1 = rbf16_16(v1);
                        if (beta1) v0 = vload16(0, c) + v0, v1 = vload16(1, c) + v1;
                        vstore16(v0, 0, c);
                        vstore16(v1, 1, c);
                    } else if (m < M) {
                        float r[32];
                        vstore16(c0[i], 0, r);
                        vstore16(c1[i], 1, r);
                        for (int j = 0; j < 32 && n0 + j < N; j++) {
                            float v = r[j];
                            if (has_bias) v += bias[biaso + n0 + j];
                            if (round) v = rbf16(v);
                            if (beta1) v = c[j] + v;
                            c[j] = v;
                        }
                    }
                }
            }
        }
    }
}
