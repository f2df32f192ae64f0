/* gemm_avx512.c — AVX-512 micro-kernels and packers for the blocked GEMM (see Note [GEMM structure],
 * gemm_internal.h).
 *
 * fp32: 8x48 register tile = 24 zmm accumulators; per k step 3 zmm loads of B and 8 broadcasts of A feed
 * 24 FMAs (Zen 4 retires one zmm FMA per cycle with 4-cycle latency, so 24 independent chains keep the
 * pipes full). MR = 8 divides the token counts (B*T) we see; NR = 48 divides GPT-2's widths (768, 2304,
 * 3072, 50304). Edges use masked loads and stores.
 * bf16: the same tile with vdpbf16ps on k pairs (AVX512_BF16): panel[k/2][i][k%2].
 * Packers transpose 8x8 / 16x16 blocks in registers for the transposed layouts.
 * Compiled with target attributes; only called when CPUID reports the features. */
#include <string.h>

#include "device/cpu/kernels/gemm_internal.h"
#include "suanli/base.h"

#ifdef SL_GEMM_AVX512_EMULATED
/* tests/kernels/test_gemm_avx512_emu.c includes this file after SIMDe (portable C versions of the
 * intrinsics), so the AVX-512 code is tested on CPUs without AVX-512. */
#define SL_TARGET_AVX512
#define SL_TARGET_AVX512BF16
#else
#include <immintrin.h>
#define SL_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define SL_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#endif

#define SL_TR16_ATTR SL_TARGET_AVX512
#define SL_TR8_ATTR SL_TARGET_AVX512
#include "device/cpu/kernels/transpose_simd.h"

enum { MR = 8, NR = 48 };

static inline __mmask16 mask_n(int n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}

/* C tile writeback: C = alpha*acc + beta*C on rows < mr, columns < nr. */
#define SL_WRITEBACK_8x48(acc)                                                                               \
    do {                                                                                                     \
        const __m512 va_ = _mm512_set1_ps(alpha), vb_ = _mm512_set1_ps(beta);                                \
        const __mmask16 m0_ = mask_n(nr), m1_ = mask_n(nr - 16), m2_ = mask_n(nr - 32);                      \
        _Pragma("GCC unroll 8") for (int i_ = 0; i_ < MR; i_++) {                                            \
            if (i_ < mr) {                                                                                   \
                float *cr_ = c + i_ * ldc;                                                                   \
                __m512 t0_ = acc[i_][0], t1_ = acc[i_][1], t2_ = acc[i_][2];                                 \
                if (alpha != 1.0f) {                                                                         \
                    t0_ = _mm512_mul_ps(va_, t0_);                                                           \
                    t1_ = _mm512_mul_ps(va_, t1_);                                                           \
                    t2_ = _mm512_mul_ps(va_, t2_);                                                           \
                }                                                                                            \
                if (beta == 1.0f) {                                                                          \
                    t0_ = _mm512_add_ps(t0_, _mm512_maskz_loadu_ps(m0_, cr_));                               \
                    t1_ = _mm512_add_ps(t1_, _mm512_maskz_loadu_ps(m1_, cr_ + 16));                          \
                    t2_ = _mm512_add_ps(t2_, _mm512_maskz_loadu_ps(m2_, cr_ + 32));                          \
                } else if (beta != 0.0f) {                                                                   \
                    t0_ = _mm512_fmadd_ps(vb_, _mm512_maskz_loadu_ps(m0_, cr_), t0_);                        \
                    t1_ = _mm512_fmadd_ps(vb_, _mm512_maskz_loadu_ps(m1_, cr_ + 16), t1_);                   \
                    t2_ = _mm512_fmadd_ps(vb_, _mm512_maskz_loadu_ps(m2_, cr_ + 32), t2_);                   \
                }                                                                                            \
                _mm512_mask_storeu_ps(cr_, m0_, t0_);                                                        \
                _mm512_mask_storeu_ps(cr_ + 16, m1_, t1_);                                                   \
                _mm512_mask_storeu_ps(cr_ + 32, m2_, t2_);                                                   \
            }                                                                                                \
        }                                                                                                    \
    } while (0)

/* Note [GEMM kernel without prefetch]
 * The k loop used to prefetch B eight steps ahead (three prefetcht0 per step). B's packed panel is one
 * contiguous stream from L2, which the hardware prefetchers follow; the extra load-port uops only cost:
 * without them the stand-alone kernel (A in L1, a 7-panel B chunk in L2, Intel AMX host) went from 86-87 %
 * to 91-92 % of the FMA peak, and bench ops' 30 shapes gained 1.5-2.5 % at 1 thread (same-process A/B,
 * both orders). The C prefetches at the start stay: C is written kc steps later. The AVX2 kernel had one
 * prefetcht0 per k step (one B line) since 89ee6a6 (added with the C prefetch, not measured alone); run as
 * SUANLI_ISA=avx2 on the same Intel host against oneDNN limited to AVX2, dropping it gained 4-5 % on the 30
 * shapes (both orders). Not measured on Zen 3, where the AVX2 kernel was tuned.
 * The plain kernels' C prefetch at the start is issued only when the tile reads C (beta != 0: a later K
 * block, or a bias copied in first). A write-only tile (beta 0: the first K block) has nothing to wait for,
 * and its 32 prefetches only took fill buffers from B's stream: on the Intel Xeon without AMX (Emerald
 * Rapids VM), 1 thread, the dW products with K = 256 (one 256-deep K block, so every tile's C is
 * write-only) gained 1.6-2.7 % in bench/tools/gemm_ab.c (per-call alternation, the 15 GPT-2 shapes at BT
 * 256 +0.7 %, at BT 1024 +0.1 %), and bench ops' worst shape against oneDNN (TN 768 x 768 x 256) went from
 * 0.86-0.90x to 0.92-0.97x in two alternated runs each (medians 0.991 / 0.998 before, 1.002 / 0.996 after).
 * A Zen core wants the opposite: on Zen 4 (1 MiB L2, 1 thread, the same tool, two runs) prefetching the
 * write-only tiles' C too made the dW products with K = 256 faster by 1.7-8.5 % (15 shapes: geomean
 * +1.1 / +2.1 %), and dropping it from the vdpbf16ps kernel (SL_ACC_INIT_8x48) cost its TN 2304 x 768 x 256
 * 9 % against oneDNN. So the plain kernels keep the write-only prefetch where sl_cpu_features.zen is set, and
 * the vdpbf16ps kernels (which run on Zen 4 only: Intel cores take AMX or the widened path, Note [Widened
 * bf16 GEMM]) always prefetch. */
static int c_prefetch_always(void) {
    static int zen = -1; /* racing first calls read the same value */
    int v = __atomic_load_n(&zen, __ATOMIC_RELAXED);
    if (v < 0) __atomic_store_n(&zen, v = sl_cpu_features_get()->zen, __ATOMIC_RELAXED);
    return v;
}

/* The 8 x 48 micro-kernel on NC of its three 16-column vectors: a panel at the right edge of C with nr <= 32
 * (N = 128: panels of 48, 48, 32) or nr <= 16 skips the FMAs of columns it does not store. Each stored
 * element gets the same FMAs in the same order as in the full kernel, so the result is the same bits.
 * A_AT(i) is row i's element at the current k, A_NEXT steps k: the packed panel, or the rows of A in place
 * (Note [Unpacked A]). */
#define SL_KERNEL_8x48_BODY(NC, A_AT, A_NEXT)                                                                \
    do {                                                                                                     \
        const float *b = (const float *)b_;                                                                  \
        __m512 acc[MR][3];                                                                                   \
        const int pf_c_ = beta != 0.0f || c_prefetch_always(); /* Note [GEMM kernel without prefetch] */     \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                               \
            acc[i][0] = acc[i][1] = acc[i][2] = _mm512_setzero_ps();                                         \
            if (pf_c_ && i < mr)                                                                             \
                for (int v = 0; v < NC; v++)                                                                 \
                    _mm_prefetch((const char *)(c + i * ldc + 16 * v), _MM_HINT_T0);                         \
            if (pf_c_ && i < mr && NC == 3) _mm_prefetch((const char *)(c + i * ldc + 47), _MM_HINT_T0);     \
        }                                                                                                    \
        _Pragma("GCC unroll 4") for (int64_t k = 0; k < ksteps; k++) {                                       \
            __m512 bv[3];                                                                                    \
            for (int v = 0; v < NC; v++) bv[v] = _mm512_load_ps(b + 16 * v);                                 \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                                           \
                __m512 av = _mm512_set1_ps(A_AT(i));                                                         \
                for (int v = 0; v < NC; v++) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);              \
            }                                                                                                \
            A_NEXT;                                                                                          \
            b += NR;                                                                                         \
        }                                                                                                    \
        SL_WRITEBACK_8x48(acc);                                                                              \
    } while (0)
#define SL_A_PACKED(i) a[i]
#define SL_A_ROWS(i) a[(i)*lda]

#define SL_KERNEL_8x48_VARIANTS(NAME, ARGS, A_AT, A_NEXT)                                                    \
    SL_TARGET_AVX512 static void NAME##_nc1 ARGS { SL_KERNEL_8x48_BODY(1, A_AT, A_NEXT); }                   \
    SL_TARGET_AVX512 static void NAME##_nc2 ARGS { SL_KERNEL_8x48_BODY(2, A_AT, A_NEXT); }                   \
    SL_TARGET_AVX512 static void NAME##_nc3 ARGS { SL_KERNEL_8x48_BODY(3, A_AT, A_NEXT); }

SL_KERNEL_8x48_VARIANTS(k8x48_packed,
                        (int64_t ksteps, const float *a, const void *b_, float *c, int64_t ldc, float alpha,
                         float beta, int mr, int nr),
                        SL_A_PACKED, a += MR)
    SL_KERNEL_8x48_VARIANTS(k8x48_rows,
                            (int64_t ksteps, const float *a, int64_t lda, const void *b_, float *c,
                             int64_t ldc, float alpha, float beta, int mr, int nr),
                            SL_A_ROWS, a++)

        SL_TARGET_AVX512
    static void kernel_avx512_8x48(int64_t ksteps, const void *a_, const void *b_, float *c, int64_t ldc,
                                   float alpha, float beta, int mr, int nr) {
    const float *a = (const float *)a_;
    if (nr <= 16)
        k8x48_packed_nc1(ksteps, a, b_, c, ldc, alpha, beta, mr, nr);
    else if (nr <= 32)
        k8x48_packed_nc2(ksteps, a, b_, c, ldc, alpha, beta, mr, nr);
    else
        k8x48_packed_nc3(ksteps, a, b_, c, ldc, alpha, beta, mr, nr);
}

/* zero the 8 x 48 accumulators and prefetch the C rows the writeback will touch (rows < mr, 48 columns) */
#define SL_ACC_INIT_8x48(acc)                                                                                \
    _Pragma("GCC unroll 8") for (int i_ = 0; i_ < MR; i_++) {                                                \
        acc[i_][0] = acc[i_][1] = acc[i_][2] = _mm512_setzero_ps();                                          \
        if (i_ < mr) {                                                                                       \
            for (int v_ = 0; v_ < 3; v_++)                                                                   \
                _mm_prefetch((const char *)(c + i_ * ldc + 16 * v_), _MM_HINT_T0);                           \
            _mm_prefetch((const char *)(c + i_ * ldc + 47), _MM_HINT_T0);                                    \
        }                                                                                                    \
    }

/* acc[i][v] += A(i) * bv[v] for the 8 rows and 3 column vectors of a full tile */
#define SL_FMA_ROWS_8x48(acc, A_AT, bv)                                                                      \
    _Pragma("GCC unroll 8") for (int i_ = 0; i_ < MR; i_++) {                                                \
        __m512 av_ = _mm512_set1_ps(A_AT(i_));                                                               \
        for (int v_ = 0; v_ < 3; v_++) acc[i_][v_] = _mm512_fmadd_ps(av_, bv[v_], acc[i_][v_]);              \
    }

/* prefetch into L1 a row of B that starts at pf: its first lines (0, 64, o2) and its last byte (last) */
#define SL_PF_ROW(pf, o2, last)                                                                              \
    do {                                                                                                     \
        _mm_prefetch((pf), _MM_HINT_T0);                                                                     \
        _mm_prefetch((pf) + 64, _MM_HINT_T0);                                                                \
        _mm_prefetch((pf) + (o2), _MM_HINT_T0);                                                              \
        _mm_prefetch((pf) + (last), _MM_HINT_T0); /* a further line if the row is not 64-aligned */          \
    } while (0)

/* Note [Packing B in the first tile]: the 8 x 48 kernel on a full panel of a K x N fp32 B read in place
 * (rows ldb apart), storing each row's 48 values into the packed panel as it loads them; the FMAs and their
 * order are the packed kernel's. A is a packed panel (lda 0, any mr) or MR rows in place (lda apart). */
enum { PB_PF_ROWS = 8 }; /* B's rows are prefetched this far ahead */
#define SL_KERNEL_8x48_PB_BODY(A_AT, A_NEXT) SL_KERNEL_8x48_PB_BODY_B(A_AT, A_NEXT, _mm512_loadu_ps, 128, 191)
/* B_LOAD(p): 16 values of B's row from p as fp32 (the widened impl rounds or widens them); the row's 48
 * values span bytes [0, PF_LAST] (PF_O2: its third line's offset for the prefetch) */
#define SL_KERNEL_8x48_PB_BODY_B(A_AT, A_NEXT, B_LOAD, PF_O2, PF_LAST)                                       \
    do {                                                                                                     \
        __m512 acc[MR][3];                                                                                   \
        SL_ACC_INIT_8x48(acc);                                                                               \
        const int64_t pf = PB_PF_ROWS * ldb;                                                                 \
        float *d = (float *)bpack;                                                                           \
        _Pragma("GCC unroll 4") for (int64_t k = 0; k < ksteps; k++) {                                       \
            __m512 bv[3];                                                                                    \
            SL_PF_ROW((const char *)(b + pf), PF_O2, PF_LAST); /* four lines if not 64-aligned */            \
            for (int v = 0; v < 3; v++) {                                                                    \
                bv[v] = B_LOAD(b + 16 * v);                                                                  \
                _mm512_store_ps(d + 16 * v, bv[v]);                                                          \
            }                                                                                                \
            SL_FMA_ROWS_8x48(acc, A_AT, bv);                                                                 \
            A_NEXT;                                                                                          \
            b += ldb;                                                                                        \
            d += NR;                                                                                         \
        }                                                                                                    \
        const int nr = NR;                                                                                   \
        SL_WRITEBACK_8x48(acc);                                                                              \
    } while (0)
SL_TARGET_AVX512 static void k8x48_pb_packed(int64_t ksteps, const float *a, const float *b, int64_t ldb,
                                             void *bpack, float *c, int64_t ldc, float alpha, float beta,
                                             int mr) {
    SL_KERNEL_8x48_PB_BODY(SL_A_PACKED, a += MR);
}
SL_TARGET_AVX512 static void k8x48_pb_rows(int64_t ksteps, const float *a, int64_t lda, const float *b,
                                           int64_t ldb, void *bpack, float *c, int64_t ldc, float alpha,
                                           float beta) {
    const int mr = MR;
    SL_KERNEL_8x48_PB_BODY(SL_A_ROWS, a++);
}
/* The 8 x 48 kernel on a full packed panel that also prefetches one row (pf_bytes, up to four lines) of `pf`
 * into L1 every pf_every k steps, pf_ld bytes apart: the source rows of the next B panel, which the next
 * kernel_pb reads (Note [Packing B in the first tile]). Same FMAs in the same order as k8x48_*_nc3. */
#define SL_KERNEL_8x48_PF_STEP(A_AT, A_NEXT)                                                                 \
    do {                                                                                                     \
        __m512 bv[3];                                                                                        \
        for (int v = 0; v < 3; v++) bv[v] = _mm512_load_ps(b + 16 * v);                                      \
        SL_FMA_ROWS_8x48(acc, A_AT, bv);                                                                     \
        A_NEXT;                                                                                              \
        b += NR;                                                                                             \
    } while (0)
#define SL_KERNEL_8x48_PF_BODY(A_AT, A_NEXT)                                                                 \
    do {                                                                                                     \
        const float *b = (const float *)b_;                                                                  \
        const int o2 = pf_bytes > 128 ? 128 : pf_bytes - 1, last = pf_bytes - 1;                             \
        __m512 acc[MR][3];                                                                                   \
        SL_ACC_INIT_8x48(acc);                                                                               \
        int64_t k = 0;                                                                                       \
        for (; k + pf_every <= ksteps; k += pf_every) {                                                      \
            SL_PF_ROW(pf, o2, last);                                                                         \
            pf += pf_ld;                                                                                     \
            _Pragma("GCC unroll 4") for (int u = 0; u < pf_every; u++) SL_KERNEL_8x48_PF_STEP(A_AT, A_NEXT); \
        }                                                                                                    \
        for (; k < ksteps; k++) SL_KERNEL_8x48_PF_STEP(A_AT, A_NEXT);                                        \
        const int nr = NR;                                                                                   \
        SL_WRITEBACK_8x48(acc);                                                                              \
    } while (0)
SL_TARGET_AVX512 static void k8x48_pf_packed(int64_t ksteps, const float *a, const void *b_, float *c,
                                             int64_t ldc, float alpha, float beta, int mr, const char *pf,
                                             int64_t pf_ld, int pf_bytes, int pf_every) {
    SL_KERNEL_8x48_PF_BODY(SL_A_PACKED, a += MR);
}
SL_TARGET_AVX512 static void k8x48_pf_rows(int64_t ksteps, const float *a, int64_t lda, const void *b_,
                                           float *c, int64_t ldc, float alpha, float beta, const char *pf,
                                           int64_t pf_ld, int pf_bytes, int pf_every) {
    const int mr = MR;
    SL_KERNEL_8x48_PF_BODY(SL_A_ROWS, a++);
}
SL_TARGET_AVX512 static void kernel_avx512_8x48_pf(int64_t ksteps, const void *a, int64_t lda, const void *b,
                                                   float *c, int64_t ldc, float alpha, float beta,
                                                   const float *bias, int rnd, int mr, const char *pf,
                                                   int64_t pf_ld, int pf_bytes, int pf_every) {
    (void)bias, (void)rnd; /* this impl has no kernel_round */
    if (lda)
        k8x48_pf_rows(ksteps, a, lda, b, c, ldc, alpha, beta, pf, pf_ld, pf_bytes, pf_every);
    else
        k8x48_pf_packed(ksteps, a, b, c, ldc, alpha, beta, mr, pf, pf_ld, pf_bytes, pf_every);
}

SL_TARGET_AVX512 static void kernel_avx512_8x48_pb(int64_t ksteps, const void *a, int64_t lda, const void *b,
                                                   int64_t ldb, int b_f32, void *bpack, float *c, int64_t ldc,
                                                   float alpha, float beta, const float *bias, int rnd,
                                                   int mr) {
    (void)b_f32, (void)bias, (void)rnd; /* fp32 B; this impl has no kernel_round */
    if (lda)
        k8x48_pb_rows(ksteps, a, lda, b, ldb, bpack, c, ldc, alpha, beta);
    else
        k8x48_pb_packed(ksteps, a, b, ldb, bpack, c, ldc, alpha, beta, mr);
}

/* mr must be MR: the caller packs a partial panel */
SL_TARGET_AVX512 static void kernel_avx512_8x48_rows(int64_t ksteps, const float *a, int64_t lda,
                                                     const void *b_, float *c, int64_t ldc, float alpha,
                                                     float beta, int mr, int nr) {
    if (nr <= 16)
        k8x48_rows_nc1(ksteps, a, lda, b_, c, ldc, alpha, beta, mr, nr);
    else if (nr <= 32)
        k8x48_rows_nc2(ksteps, a, lda, b_, c, ldc, alpha, beta, mr, nr);
    else
        k8x48_rows_nc3(ksteps, a, lda, b_, c, ldc, alpha, beta, mr, nr);
}

/* ---- in-register transposes ---- */

/* ---- fp32 packers (32-bit elements; reused for bf16 pairs) ---- */

/* dst[k*8 + i] = src[i*ld + k] for i < ni (else 0), k < kc: 8 rows, contiguous in k. The rows are ld_bytes
 * apart, any multiple of 2 (bf16 pairs of a row with an odd leading dimension are 32-bit values at 2-byte
 * alignment: the loads are unaligned anyway). */
SL_TARGET_AVX512 static void pack_rows8_t32b(const void *base, int64_t ld_bytes, int ni, int64_t kc,
                                             uint32_t *dst) {
    const char *src = base;
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            r[i] = i < ni ? _mm256_loadu_ps((const float *)(src + i * ld_bytes) + k) : _mm256_setzero_ps();
        sl_tr8_ps(r);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) _mm256_storeu_ps((float *)(dst + (k + j) * 8), r[j]);
    }
    if (k < kc) {
        int rem = (int)(kc - k);
        __mmask8 m = (__mmask8)((1u << rem) - 1u);
        __m256 r[8];
        for (int i = 0; i < 8; i++)
            r[i] = i < ni ? _mm256_maskz_loadu_ps(m, (const float *)(src + i * ld_bytes) + k)
                          : _mm256_setzero_ps();
        sl_tr8_ps(r);
        for (int j = 0; j < rem; j++) _mm256_storeu_ps((float *)(dst + (k + j) * 8), r[j]);
    }
}
SL_TARGET_AVX512 static void pack_rows8_t32(const uint32_t *src, int64_t ld, int ni, int64_t kc,
                                            uint32_t *dst) {
    pack_rows8_t32b(src, ld * 4, ni, kc, dst);
}

/* dst[k*48 + j] = src[j*ld + k] for j < nj (else 0), k < kc: 48 rows, contiguous in k. */
/* Packing a transposed B (N x K, each weight row a stream) reads 48 rows side by side, more streams than the
 * hardware prefetcher follows: each row's line two ahead (32 floats) is prefetched as its current line is
 * loaded. Intel AMX host, 1 thread: the vocabulary shape (256 x 50304 x 768, NT) 135.9 -> 144.3 GFLOP/s, the
 * 1024-row NT shapes +0-2 %; the same for B's rows of a K x N B (NN) gained nothing and is not done. */
#define PACK_PF 32
SL_TARGET_AVX512 static void pack_rows48_t32(const uint32_t *src, int64_t ld, int nj, int64_t kc,
                                             uint32_t *dst) {
    for (int64_t k = 0; k < kc; k += 16) {
        int rem = kc - k < 16 ? (int)(kc - k) : 16;
        __mmask16 m = mask_n(rem);
        for (int g = 0; g < 3; g++) {
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                int j = g * 16 + i;
                if (j < nj) _mm_prefetch((const char *)(src + j * ld + k + PACK_PF), _MM_HINT_T0);
                r[i] = j < nj ? _mm512_maskz_loadu_ps(m, (const float *)(src + j * ld + k))
                              : _mm512_setzero_ps();
            }
            sl_tr16_ps(r);
            for (int kk = 0; kk < rem; kk++) _mm512_store_ps((float *)(dst + (k + kk) * 48 + g * 16), r[kk]);
        }
    }
}

SL_TARGET_AVX512 static void pack_a_f32_panel(const sl_gemm_args *g, int64_t i0, int ni, int64_t k0,
                                              int64_t kc, void *dst_) {
    float *dst = (float *)dst_;
    const float *A = (const float *)g->A;
    if (g->transA) { /* A is K x M */
        __mmask8 m = (__mmask8)((1u << ni) - 1u);
        for (int64_t k = 0; k < kc; k++)
            _mm256_store_ps(dst + k * 8, _mm256_maskz_loadu_ps(m, A + (k0 + k) * g->lda + i0));
    } else {
        pack_rows8_t32((const uint32_t *)(A + i0 * g->lda + k0), g->lda, ni, kc, (uint32_t *)dst);
    }
}

SL_TARGET_AVX512 static void pack_b_f32_panel(const sl_gemm_args *g, int64_t j0, int nj, int64_t k0,
                                              int64_t kc, void *dst_) {
    float *dst = (float *)dst_;
    const float *B = (const float *)g->B;
    if (!g->transB) { /* B is K x N */
        __mmask16 m0 = mask_n(nj), m1 = mask_n(nj - 16), m2 = mask_n(nj - 32);
        for (int64_t k = 0; k < kc; k++) {
            const float *s = B + (k0 + k) * g->ldb + j0;
            float *d = dst + k * 48;
            _mm512_store_ps(d, _mm512_maskz_loadu_ps(m0, s));
            _mm512_store_ps(d + 16, _mm512_maskz_loadu_ps(m1, s + 16));
            _mm512_store_ps(d + 32, _mm512_maskz_loadu_ps(m2, s + 32));
        }
    } else {
        pack_rows48_t32((const uint32_t *)(B + j0 * g->ldb + k0), g->ldb, nj, kc, (uint32_t *)dst);
    }
}

/* A transposed (K x M, dW's dY^T): row k of A holds M contiguous values, and a panel takes 8 of them (32
 * bytes) from each of kc rows lda apart, a page apart for GPT-2's widths. Eight panels are packed per pass
 * over the rows, so each row gives 256 contiguous bytes (four whole lines) instead of half a line eight
 * times over: dW shapes +1-4 % at 1 thread (pack_a 8.5 -> 5.6 % of the 3072 x 768 x 1024 call). */
enum { PACK_AT_GROUP = 8 };
SL_TARGET_AVX512 static void pack_a_t_group(const float *A, int64_t lda, int64_t i0, int64_t k0, int64_t kc,
                                            float *dst) {
    const float *s = A + k0 * lda + i0;
    for (int64_t k = 0; k < kc; k++, s += lda) {
#pragma GCC unroll 8
        for (int q = 0; q < PACK_AT_GROUP; q++)
            _mm256_store_ps(dst + q * kc * MR + k * MR, _mm256_loadu_ps(s + q * MR));
    }
}

SL_TARGET_AVX512 static void pack_a_f32_avx512(const sl_gemm_args *g, int64_t i0, int64_t ni, int64_t k0,
                                               int64_t kc, int mr, void *dst) {
    (void)mr;
    int64_t p = 0;
    if (g->transA)
        for (; (p + PACK_AT_GROUP) * MR <= ni; p += PACK_AT_GROUP)
            pack_a_t_group((const float *)g->A, g->lda, i0 + p * MR, k0, kc, (float *)dst + p * kc * MR);
    for (; p * MR < ni; p++)
        pack_a_f32_panel(g, i0 + p * MR, ni - p * MR < MR ? (int)(ni - p * MR) : MR, k0, kc,
                         (float *)dst + p * kc * MR);
}

SL_TARGET_AVX512 static void pack_b_f32_avx512(const sl_gemm_args *g, int64_t j0, int64_t nj, int64_t k0,
                                               int64_t kc, int nr, void *dst) {
    (void)nr;
    for (int64_t p = 0; p * NR < nj; p++)
        pack_b_f32_panel(g, j0 + p * NR, nj - p * NR < NR ? (int)(nj - p * NR) : NR, k0, kc,
                         (float *)dst + p * kc * NR);
}

/* kc 768: GPT-2's K = 768 products run as one K block, so C is written once instead of written, then read
 * and written again (bench ops at 1 thread: the 768-deep forward shapes +3-6 %, the rest +-1 %; 512 and 1024
 * measured the same as 768). The packed B chunk is then 336 x 768 x 4 = 1 MiB of the 2 MiB L2. */
const sl_gemm_impl sl_gemm_impl_avx512_f32 = {.name = "avx512",
                                              .mr = MR,
                                              .nr = NR,
                                              .kgran = 1,
                                              .esz = 4,
                                              .in_bf16 = 0,
                                              .kc = 768,
                                              .kc_even = 1,
                                              .mc = 1536,
                                              .nc = 336,
                                              .pack_a = pack_a_f32_avx512,
                                              .pack_b = pack_b_f32_avx512,
                                              .kernel = kernel_avx512_8x48,
                                              .kernel_ua = kernel_avx512_8x48_rows,
                                              .kernel_pb = kernel_avx512_8x48_pb,
                                              .kernel_pf = kernel_avx512_8x48_pf};
/* ---- bf16 (vdpbf16ps) ---- */
#include "device/cpu/kernels/gemm_avx512_bf16.inc"

/* ---- bf16 on the fp32 kernel (widened) ---- */
#include "device/cpu/kernels/gemm_avx512_widen.inc"
