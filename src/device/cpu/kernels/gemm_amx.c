/* gemm_amx.c — the AMX-BF16 micro-kernel and its packers for the blocked GEMM (Note [GEMM structure],
 * gemm_internal.h; Note [AMX GEMM] below). Compiled with target attributes; only called when
 * sl_cpu_features_get() reports amx_bf16 (CPUID, XCR0 and the process's permission: Note [AMX permission]
 * in src/base/cpu.c). tests/kernels/test_gemm_amx_emu.c includes this file with SL_GEMM_AMX_EMULATED to run
 * the packers and the kernel's tile program on CPUs without AMX. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/gemm_internal.h"
#include "suanli/base.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef SL_GEMM_AMX_EMULATED
/* the includer defines the intrinsics (SIMDe for AVX-512, C for the tiles) */
#define SL_TARGET_AMX
#else
#include <immintrin.h>
#define SL_TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#endif
#define SL_TR16_ATTR SL_TARGET_AMX
#include "device/cpu/kernels/transpose_simd.h"

/* Note [AMX GEMM]
 * An AMX tile register holds up to 16 rows of 64 bytes; tdpbf16ps C, A, B adds to the 16 x 16 fp32 tile C
 * the product of A (16 rows x 32 bf16: row i, k ascending) and B (16 rows of 16 bf16 pairs: row p, column j
 * holds B(2p, j), B(2p+1, j)): per element, the 16 even and the 16 odd products are summed apart (fp32, in
 * k order) and their sum added to C (the SDM's pseudocode; bitwise the hardware's, test_gemm_amx_emu). The
 * kernel keeps a 32 x 32
 * block of C in four tiles (0-3), and per step of 32 k loads two A tiles (4, 5: rows 0-15, 16-31) and two B
 * tiles (6, 7: columns 0-15, 16-31), so 4 KiB of loads feed 4 tile products (16 cycles each on Sapphire
 * Rapids, against about 8 per tile load from L1).
 * Packed layouts (kgran 32, esz 2), one 2 KiB block per step of 32 k, k past kc zero:
 *   A: [i 0..31][k 0..31], so each A tile is 1 KiB contiguous (stride 64 bytes);
 *   B: [half 0..1][p 0..15][j 0..15][t 0..1] = B(32s + 2p + t, 16 half + j): each B tile 1 KiB contiguous.
 * The transposed layouts go through a 16 x 16 transpose of 32-bit words in registers: a bf16 pair is one
 * 32-bit word, so B^T (N x K, pairs along rows) transposes straight into the pair layout, and A^T (K x M)
 * first interleaves two k rows into pairs, then transposes those into rows of i.
 * C: a full 32 x 32 tile with alpha 1 and beta 0 or 1 is loaded into (beta 1) and stored from the tiles
 * directly, so the sum runs C + (the products of each step of 32 k); an edge tile, or another alpha or
 * beta, goes through a
 * buffer: alpha * sum + beta * C, as in the other kernels. Each element of C always lands in the same kind
 * of tile (the driver's partitions start at multiples of 32), so results do not depend on the thread count.
 * The tile configuration is loaded once per thread and GEMM call (thread_begin) and released after it
 * (thread_end): a library that shares our threads (oneDNN, under the same OpenMP runtime) loads its own. */
enum { AMR = 32, ANR = 32, AKS = 32 };

typedef struct amx_tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

SL_TARGET_AMX static void amx_begin(void) {
    static const amx_tilecfg cfg = {
        .palette = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};
    _tile_loadconfig(&cfg);
}

SL_TARGET_AMX static void amx_end(void) { _tile_release(); }

static inline __mmask32 mask32(int64_t n) {
    return n >= 32 ? (__mmask32)0xffffffffu : n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1u);
}

SL_TARGET_AMX static void kernel_amx_32x32(int64_t ksteps, const void *a_, const void *b_, float *c,
                                           int64_t ldc, float alpha, float beta, int mr, int nr) {
    const char *a = (const char *)a_, *b = (const char *)b_;
    const int direct = mr == AMR && nr == ANR && alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
    const size_t ldcb = (size_t)ldc * sizeof(float);
    if (direct && beta == 1.0f) {
        _tile_loadd(0, c, ldcb);
        _tile_loadd(1, c + 16, ldcb);
        _tile_loadd(2, c + 16 * ldc, ldcb);
        _tile_loadd(3, c + 16 * ldc + 16, ldcb);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t s = 0; s < ksteps; s++) {
        _tile_loadd(4, a, 64);
        _tile_loadd(6, b, 64);
        _tile_loadd(5, a + 1024, 64);
        _tile_loadd(7, b + 1024, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        a += 2048;
        b += 2048;
    }
    if (direct) {
        _tile_stored(0, c, ldcb);
        _tile_stored(1, c + 16, ldcb);
        _tile_stored(2, c + 16 * ldc, ldcb);
        _tile_stored(3, c + 16 * ldc + 16, ldcb);
        return;
    }
    float buf[AMR * ANR] __attribute__((aligned(64)));
    _tile_stored(0, buf, ANR * sizeof(float));
    _tile_stored(1, buf + 16, ANR * sizeof(float));
    _tile_stored(2, buf + 16 * ANR, ANR * sizeof(float));
    _tile_stored(3, buf + 16 * ANR + 16, ANR * sizeof(float));
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const __mmask16 m0 = (__mmask16)(mask32(nr) & 0xffff), m1 = (__mmask16)(mask32(nr - 16) & 0xffff);
    for (int i = 0; i < mr; i++) {
        float *cr = c + i * ldc;
        __m512 t0 = _mm512_load_ps(buf + i * ANR), t1 = _mm512_load_ps(buf + i * ANR + 16);
        if (alpha != 1.0f) {
            t0 = _mm512_mul_ps(va, t0);
            t1 = _mm512_mul_ps(va, t1);
        }
        if (beta == 1.0f) {
            t0 = _mm512_add_ps(t0, _mm512_maskz_loadu_ps(m0, cr));
            t1 = _mm512_add_ps(t1, _mm512_maskz_loadu_ps(m1, cr + 16));
        } else if (beta != 0.0f) {
            t0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), t0);
            t1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), t1);
        }
        _mm512_mask_storeu_ps(cr, m0, t0);
        _mm512_mask_storeu_ps(cr + 16, m1, t1);
    }
}

/* One A panel: rows [i0, i0+ni) (ni <= 32) of op(A), k in [k0, k0+kc) */
SL_TARGET_AMX static void pack_a_amx_panel(const sl_gemm_args *g, int64_t i0, int ni, int64_t k0, int64_t kc,
                                           uint16_t *dst) {
    const uint16_t *A = (const uint16_t *)g->A;
    const int64_t lda = g->lda, steps = (kc + AKS - 1) / AKS;
    for (int64_t s = 0; s < steps; s++, dst += AMR * AKS) {
        const int64_t kb = k0 + s * AKS, kv = kc - s * AKS;
        if (!g->transA) { /* rows of A are rows of the panel */
            const __mmask32 km = mask32(kv);
            for (int i = 0; i < AMR; i++)
                _mm512_storeu_si512((void *)(dst + i * AKS),
                                    i < ni ? _mm512_maskz_loadu_epi16(km, A + (i0 + i) * lda + kb)
                                           : _mm512_setzero_si512());
            continue;
        }
        /* A is K x M: two k rows interleaved give a row of pairs per i, 16 x 16 transposes give rows of i */
        const __mmask32 im = mask32(ni);
        __m512i lo[16], hi[16];
        for (int p = 0; p < 16; p++) {
            __m512i r0 = 2 * p < kv ? _mm512_maskz_loadu_epi16(im, A + (kb + 2 * p) * lda + i0)
                                    : _mm512_setzero_si512(),
                    r1 = 2 * p + 1 < kv ? _mm512_maskz_loadu_epi16(im, A + (kb + 2 * p + 1) * lda + i0)
                                        : _mm512_setzero_si512();
            /* 128-bit lane L: lo holds the pairs of i = 8L .. 8L+3, hi those of 8L+4 .. 8L+7 */
            lo[p] = _mm512_unpacklo_epi16(r0, r1);
            hi[p] = _mm512_unpackhi_epi16(r0, r1);
        }
        sl_tr16_epi32(lo);
        sl_tr16_epi32(hi);
        for (int c = 0; c < 16; c++) {
            int i = 8 * (c / 4) + c % 4;
            _mm512_storeu_si512((void *)(dst + i * AKS), lo[c]);
            _mm512_storeu_si512((void *)(dst + (i + 4) * AKS), hi[c]);
        }
    }
}

/* 16 fp32 words to bf16 in their low halves, rounded as sl_f32_to_bf16 (nearest even; NaN kept quiet) */
SL_TARGET_AMX static inline __m512i round_bf16_lo(__m512i u) {
    __m512i r =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                           _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))),
                          16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

/* n floats to bf16 with sl_f32_to_bf16's rounding (the same bits as a CAST node's); `next` (or NULL): the
 * row read after this one, whose lines are prefetched meanwhile (rows of a chunk are strided, and the
 * hardware prefetcher starts cold on each) */
SL_TARGET_AMX static void round_row_bf16(const float *src, uint16_t *dst, int64_t n, const float *next) {
    const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30,
                                          28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int64_t i = 0; i < n; i += 32) {
        const __mmask32 m = mask32(n - i);
        if (next) {
            _mm_prefetch((const char *)(next + i), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + i + 16), _MM_HINT_T0);
        }
        __m512i u0 = _mm512_maskz_loadu_epi32((__mmask16)(m & 0xffffu), src + i),
                u1 = _mm512_maskz_loadu_epi32((__mmask16)(m >> 16), src + i + 16);
        _mm512_mask_storeu_epi16(dst + i, m,
                                 _mm512_permutex2var_epi16(round_bf16_lo(u0), even, round_bf16_lo(u1)));
    }
}

/* One B panel: columns [j0, j0+nj) (nj <= 32) of op(B), k in [k0, k0+kc) */
SL_TARGET_AMX static void pack_b_amx_panel(const sl_gemm_args *g, int64_t j0, int nj, int64_t k0, int64_t kc,
                                           uint16_t *dst) {
    const uint16_t *B = (const uint16_t *)g->B;
    const int64_t ldb = g->ldb, steps = (kc + AKS - 1) / AKS;
    /* interleave two k rows' columns 16h .. 16h+15: word j = B(k, 16h+j) | B(k+1, 16h+j) << 16 */
    const __m512i ix0 = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                         38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0),
                  ix1 = _mm512_add_epi16(ix0, _mm512_set1_epi16(16));
    for (int64_t s = 0; s < steps; s++, dst += ANR * AKS) {
        const int64_t kb = k0 + s * AKS, kv = kc - s * AKS;
        if (g->transB) { /* B is N x K: a row of B is a row of pairs; transpose 16 rows at a time */
            const __mmask32 km = mask32(kv);
            for (int h = 0; h < 2; h++) {
                __m512i r[16];
                for (int j = 0; j < 16; j++)
                    r[j] = 16 * h + j < nj ? _mm512_maskz_loadu_epi16(km, B + (j0 + 16 * h + j) * ldb + kb)
                                           : _mm512_setzero_si512();
                sl_tr16_epi32(r);
                for (int p = 0; p < 16; p++) _mm512_storeu_si512((void *)(dst + (h * 16 + p) * 32), r[p]);
            }
            continue;
        }
        const __mmask32 jm = mask32(nj);
        for (int p = 0; p < 16; p++) {
            __m512i r0 = 2 * p < kv ? _mm512_maskz_loadu_epi16(jm, B + (kb + 2 * p) * ldb + j0)
                                    : _mm512_setzero_si512(),
                    r1 = 2 * p + 1 < kv ? _mm512_maskz_loadu_epi16(jm, B + (kb + 2 * p + 1) * ldb + j0)
                                        : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(dst + p * 32), _mm512_permutex2var_epi16(r0, ix0, r1));
            _mm512_storeu_si512((void *)(dst + (16 + p) * 32), _mm512_permutex2var_epi16(r0, ix1, r1));
        }
    }
}

SL_TARGET_AMX static void pack_a_amx(const sl_gemm_args *g, int64_t i0, int64_t ni, int64_t k0, int64_t kc,
                                     int mr, void *dst) {
    (void)mr;
    const int64_t panel = (kc + AKS - 1) / AKS * AKS * AMR;
    for (int64_t p = 0; p * AMR < ni; p++)
        pack_a_amx_panel(g, i0 + p * AMR, ni - p * AMR < AMR ? (int)(ni - p * AMR) : AMR, k0, kc,
                         (uint16_t *)dst + p * panel);
}

/* fp32 B (sl_gemm_args.b_f32: Note [Fused weight casts] in src/ops/backward.c) is first rounded into a
 * per-thread buffer, the chunk's kc x nj block read row by row (contiguous runs that the prefetchers follow:
 * packing straight from fp32 read 16-32 strided rows per tile and made the packing 2.7x slower), then packed
 * from there as bf16 (kc x nc x 2 bytes = 1 MiB: it stays in L2). Without the buffer, one 32 x 32 block at a
 * time through the stack (slower, the same bits). */
static uint16_t *bconv_get(size_t bytes) {
#ifdef SL_GEMM_AMX_EMULATED
    if (emu_bconv_fail) return NULL; /* the test's way into the fallback */
#endif
    return (uint16_t *)sl_gemm_tlbuf(SL_GEMM_TLB_BCONV, bytes);
}

SL_TARGET_AMX static void pack_b_amx(const sl_gemm_args *g, int64_t j0, int64_t nj, int64_t k0, int64_t kc,
                                     int nr, void *dst) {
    (void)nr;
    const int64_t panel = (kc + AKS - 1) / AKS * AKS * ANR;
    if (g->b_f32) {
        const float *B = (const float *)g->B;
        sl_gemm_args r = *g;
        r.b_f32 = 0;
        uint16_t *t = bconv_get((size_t)(nj * kc) * sizeof(uint16_t));
        if (t) {
            if (g->transB)
                for (int64_t j = 0; j < nj; j++)
                    round_row_bf16(B + (j0 + j) * g->ldb + k0, t + j * kc, kc,
                                   j + 1 < nj ? B + (j0 + j + 1) * g->ldb + k0 : NULL);
            else
                for (int64_t k = 0; k < kc; k++)
                    round_row_bf16(B + (k0 + k) * g->ldb + j0, t + k * nj, nj,
                                   k + 1 < kc ? B + (k0 + k + 1) * g->ldb + j0 : NULL);
            r.B = t;
            r.ldb = g->transB ? kc : nj;
            pack_b_amx(&r, 0, nj, 0, kc, nr, dst);
            return;
        }
        uint16_t blk[ANR * AKS] __attribute__((aligned(64)));
        r.B = blk;
        r.ldb = AKS;
        for (int64_t p = 0; p * ANR < nj; p++)
            for (int64_t s = 0; s * AKS < kc; s++) {
                const int64_t jn = nj - p * ANR < ANR ? nj - p * ANR : ANR,
                              kn = kc - s * AKS < AKS ? kc - s * AKS : AKS, jb = j0 + p * ANR,
                              kb = k0 + s * AKS;
                if (g->transB)
                    for (int64_t j = 0; j < jn; j++)
                        round_row_bf16(B + (jb + j) * g->ldb + kb, blk + j * AKS, kn, NULL);
                else
                    for (int64_t k = 0; k < kn; k++)
                        round_row_bf16(B + (kb + k) * g->ldb + jb, blk + k * AKS, jn, NULL);
                pack_b_amx_panel(&r, 0, (int)jn, 0, kn, (uint16_t *)dst + p * panel + s * ANR * AKS);
            }
        return;
    }
    for (int64_t p = 0; p * ANR < nj; p++)
        pack_b_amx_panel(g, j0 + p * ANR, nj - p * ANR < ANR ? (int)(nj - p * ANR) : ANR, k0, kc,
                         (uint16_t *)dst + p * panel);
}

const sl_gemm_impl sl_gemm_impl_amx_bf16 = {.name = "amx",
                                            .mr = AMR,
                                            .nr = ANR,
                                            .kgran = AKS,
                                            .esz = 2,
                                            .in_bf16 = 1,
                                            .kc = 1024,
                                            .mc = 4096,
                                            .mc_max = 4096,
                                            .nc = 512,
                                            .pack_a = pack_a_amx,
                                            .pack_b = pack_b_amx,
                                            .kernel = kernel_amx_32x32,
                                            .thread_begin = amx_begin,
                                            .thread_end = amx_end,
                                            .b_f32 = 1};

/* Note [AMX GEMM for a few rows]
 * A prompt of a few tokens times a bf16 weight W (N x K, the Linear layout: transB) would pack all of W
 * into B tiles for a few rows of output: on an AMX host the packing took 5x the tile products' time in a
 * 32-token Llama prefill. A tile's A operand is row-major (16 rows of 32 bf16), which is what W's rows
 * already are, so C^T = W x^T is computed instead: A tiles loaded straight from W (stride ldb), B tiles from
 * x packed once per call (pack_b_amx_panel on x as a transposed B), and each 32 x 32 block of C^T transposed
 * into C. tdpbf16ps sums the same even and odd products of each element whichever operand is A, and the
 * blocks replay the blocked driver's epilogue (Note [AMX GEMM]) in a C^T staging buffer: the same K blocks of
 * kc, the tile loaded from C (or the bias) where the driver's tile is full with alpha 1 and beta 0 or 1, else
 * the block's sum from zero, times alpha, plus (beta times) the staged C. So C is bitwise the blocked
 * driver's (test_gemm compares the two on AMX hosts; tests switch this path off with
 * sl_gemm_amx_few_rows_set). Taken for M <= FEW_ROWS_MAX (256), K and N multiples of 32, bf16 B. */
/* up to this many rows: with more the packed weight is reused enough (1B shape, 2 threads: the prompt's
 * tokens/s at 128 rows 261 packed -> 299 here, the MLP GEMM 682 -> 928 GFLOP/s; at 256 rows 275 -> 269 and
 * 995 -> 1,083 GFLOP/s) */
#define FEW_ROWS_MAX 256
static int g_few_rows = 1;
void sl_gemm_amx_few_rows_set(int on) { g_few_rows = on; }

/* C^T block of W rows [n0, n0 + 32) and x rows [m0, m0 + mr) (mr <= 32) over all of K, into C */
SL_TARGET_AMX static void few_rows_block(const sl_gemm_args *g, const uint16_t *xp, int64_t n0, int64_t m0,
                                         int mr) {
    float ct[32 * 32] __attribute__((aligned(64))), tmp[32 * 32] __attribute__((aligned(64)));
    const uint16_t *W = (const uint16_t *)g->B;
    const size_t ldw = (size_t)g->ldb * sizeof(uint16_t);
    const int64_t kc = sl_gemm_impl_amx_bf16.kc;
    for (int n = 0; n < 32; n++) /* the driver's C before its first K block: the bias, or C for beta */
        for (int m = 0; m < 32; m++)
            ct[n * 32 + m] = m >= mr           ? 0.0f
                             : g->bias         ? g->bias[n0 + n]
                             : g->beta != 0.0f ? g->C[(m0 + m) * g->ldc + n0 + n]
                                               : 0.0f;
    for (int64_t k0 = 0; k0 < g->K; k0 += kc) {
        const int64_t steps = (g->K - k0 < kc ? g->K - k0 : kc) / AKS;
        const float beta = k0 == 0 && !g->bias ? g->beta : 1.0f;
        const int direct = mr == AMR && g->alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
        if (direct && beta == 1.0f) {
            _tile_loadd(0, ct, 128);
            _tile_loadd(1, ct + 16, 128);
            _tile_loadd(2, ct + 16 * 32, 128);
            _tile_loadd(3, ct + 16 * 32 + 16, 128);
        } else {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
        }
        const uint16_t *w = W + (size_t)n0 * (size_t)g->ldb + k0, *b = xp + k0 / AKS * (ANR * AKS);
        for (int64_t s = 0; s < steps; s++, w += AKS, b += ANR * AKS) {
            _tile_loadd(4, w, ldw);
            _tile_loadd(6, b, 64);
            _tile_loadd(5, w + 16 * (size_t)g->ldb, ldw);
            _tile_loadd(7, b + 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        float *dst = direct ? ct : tmp;
        _tile_stored(0, dst, 128);
        _tile_stored(1, dst + 16, 128);
        _tile_stored(2, dst + 16 * 32, 128);
        _tile_stored(3, dst + 16 * 32 + 16, 128);
        if (direct) continue;
        for (int n = 0; n < 32; n++) /* kernel_amx_32x32's buffered epilogue, element by element */
            for (int m = 0; m < mr; m++) {
                float t = tmp[n * 32 + m], *c = &ct[n * 32 + m];
                if (g->alpha != 1.0f) t = g->alpha * t;
                *c = beta == 1.0f ? t + *c : beta != 0.0f ? fmaf(beta, *c, t) : t;
            }
    }
    for (int m = 0; m < mr; m++)
        for (int n = 0; n < 32; n++) g->C[(m0 + m) * g->ldc + n0 + n] = ct[n * 32 + m];
}

int sl_gemm_amx_few_rows(const sl_gemm_args *g, int nthr) {
    if (!g_few_rows || g->M > FEW_ROWS_MAX || g->M < 1 || g->transA || !g->transB || g->b_f32 || g->c_round ||
        g->K % AKS || g->N % ANR || g->K <= 0 || g->N <= 0)
        return 0;
    const int64_t mblocks = (g->M + AMR - 1) / AMR, steps = g->K / AKS, nblocks = g->N / ANR;
    const size_t per = (size_t)steps * ANR * AKS; /* packed x^T of one block of 32 rows */
    uint16_t *xp = (uint16_t *)sl_gemm_tlbuf(SL_GEMM_TLB_BCONV, per * (size_t)mblocks * sizeof(uint16_t));
    if (!xp) return 0;
    sl_gemm_args xa = *g; /* x as a transposed B: B(k, j) = x[j][k] */
    xa.B = g->A;
    xa.ldb = g->lda;
    xa.transB = 1;
    for (int64_t mb = 0; mb < mblocks; mb++) {
        const int64_t m0 = mb * AMR;
        pack_b_amx_panel(&xa, m0, g->M - m0 < AMR ? (int)(g->M - m0) : AMR, 0, g->K, xp + mb * per);
    }
    if (nthr > nblocks) nthr = (int)nblocks;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthr) if (nthr > 1)
#endif
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        amx_begin();
        for (int64_t nb = nblocks * t / nt; nb < nblocks * (t + 1) / nt; nb++)
            for (int64_t mb = 0; mb < mblocks; mb++) {
                const int64_t m0 = mb * AMR;
                few_rows_block(g, xp + mb * per, nb * ANR, m0, g->M - m0 < AMR ? (int)(g->M - m0) : AMR);
            }
        amx_end();
    }
    return 1;
}
