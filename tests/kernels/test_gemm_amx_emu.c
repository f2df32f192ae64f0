/* test_gemm_amx_emu — the AMX-BF16 GEMM code (gemm_amx.c: the 32x32 tile kernel and its bf16-pair packers)
 * run on CPUs without AMX or AVX-512 (most CI machines): every AVX-512 intrinsic it uses is written out below
 * in plain C on a 64-byte value, and the eight AMX tile registers are emulated in C (tile configuration,
 * tileloadd, tilestored, tilezero, tdpbf16ps), per thread. Then gemm_amx.c is included with
 * SL_GEMM_AMX_EMULATED under a private name for its impl, and run through the library's blocked driver
 * (sl_gemm_run) against the double-precision reference sl_sgemm_ref on bf16-rounded inputs. Tolerance as in
 * test_gemm: |got - ref| <= 1e-6 * (K + 8) + 1e-5 * |ref| (products of bf16 values are exact in fp32, so the
 * error is the fp32 accumulation alone). The emulation is strict where the hardware faults: tile use without
 * a loaded configuration (#UD), a configuration with reserved bits set, tdpbf16ps on mismatched shapes, and
 * an unaligned _mm512_load_ps abort the test; masked loads and stores touch only their enabled elements (an
 * ASan build checks that the packers never read past the operands). On a CPU with usable AMX the library's
 * real kernel is also run on some cases and must match the emulation bit for bit (that checks the emulation
 * itself). */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int emu_bconv_fail; /* 1: gemm_amx.c's rounding buffer for fp32 B "cannot be allocated" */

/* ---- AVX-512 types and intrinsics, lane by lane (Intel's semantics) ---- */
typedef struct {
    float f[16];
} __m512;
typedef union {
    uint16_t h[32];
    uint32_t w[16];
    uint64_t q[8];
} __m512i;
typedef uint16_t __mmask16;
typedef uint32_t __mmask32;

static void emu_fault(const char *what) {
    fprintf(stderr, "test_gemm_amx_emu: the hardware would fault here: %s\n", what);
    abort();
}

static inline __m512i _mm512_setzero_si512(void) {
    __m512i r;
    memset(&r, 0, sizeof r);
    return r;
}
/* masked-out elements are zero and their memory is not read */
static inline __m512i _mm512_maskz_loadu_epi16(__mmask32 k, const void *p) {
    __m512i r = _mm512_setzero_si512();
    for (int i = 0; i < 32; i++)
        if ((k >> i) & 1) memcpy(&r.h[i], (const char *)p + 2 * i, 2);
    return r;
}
static inline void _mm512_storeu_si512(void *p, __m512i a) { memcpy(p, &a, 64); }
#define _MM_HINT_T0 3
static inline void _mm_prefetch(const char *p, int hint) { (void)p, (void)hint; } /* a hint: never faults */
/* masked-out elements are neither written nor read */
static inline void _mm512_mask_storeu_epi16(void *p, __mmask32 k, __m512i a) {
    for (int i = 0; i < 32; i++)
        if ((k >> i) & 1) memcpy((char *)p + 2 * i, &a.h[i], 2);
}
static inline __m512i _mm512_set1_epi16(short x) {
    __m512i r;
    for (int i = 0; i < 32; i++) r.h[i] = (uint16_t)x;
    return r;
}
/* the first argument is element 31 */
static inline __m512i _mm512_set_epi16(short e31, short e30, short e29, short e28, short e27, short e26,
                                       short e25, short e24, short e23, short e22, short e21, short e20,
                                       short e19, short e18, short e17, short e16, short e15, short e14,
                                       short e13, short e12, short e11, short e10, short e9, short e8,
                                       short e7, short e6, short e5, short e4, short e3, short e2, short e1,
                                       short e0) {
    const short e[32] = {e0,  e1,  e2,  e3,  e4,  e5,  e6,  e7,  e8,  e9,  e10, e11, e12, e13, e14, e15,
                         e16, e17, e18, e19, e20, e21, e22, e23, e24, e25, e26, e27, e28, e29, e30, e31};
    __m512i r;
    for (int i = 0; i < 32; i++) r.h[i] = (uint16_t)e[i];
    return r;
}
static inline __m512i _mm512_add_epi16(__m512i a, __m512i b) {
    for (int i = 0; i < 32; i++) a.h[i] = (uint16_t)(a.h[i] + b.h[i]);
    return a;
}
/* the 32-bit integer ops of the fp32 -> bf16 rounding (load_b32 with sl_gemm_args.b_f32) */
static inline __m512i _mm512_set1_epi32(int x) {
    __m512i r;
    for (int i = 0; i < 16; i++) r.w[i] = (uint32_t)x;
    return r;
}
static inline __m512i _mm512_maskz_loadu_epi32(__mmask16 k, const void *p) {
    __m512i r = _mm512_setzero_si512();
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) memcpy(&r.w[i], (const char *)p + 4 * i, 4);
    return r;
}
static inline __m512i _mm512_add_epi32(__m512i a, __m512i b) {
    for (int i = 0; i < 16; i++) a.w[i] += b.w[i];
    return a;
}
static inline __m512i _mm512_and_si512(__m512i a, __m512i b) {
    for (int i = 0; i < 8; i++) a.q[i] &= b.q[i];
    return a;
}
static inline __m512i _mm512_srli_epi32(__m512i a, unsigned n) {
    for (int i = 0; i < 16; i++) a.w[i] = n > 31 ? 0 : a.w[i] >> n;
    return a;
}
static inline __mmask16 _mm512_cmpgt_epu32_mask(__m512i a, __m512i b) {
    __mmask16 k = 0;
    for (int i = 0; i < 16; i++) k |= (__mmask16)((a.w[i] > b.w[i]) << i);
    return k;
}
/* elements selected by k: a | b; the others from src */
static inline __m512i _mm512_mask_or_epi32(__m512i src, __mmask16 k, __m512i a, __m512i b) {
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) src.w[i] = a.w[i] | b.w[i];
    return src;
}
/* unpack*: within each 128-bit lane L, interleave the low (high) halves of a's and b's elements */
static inline __m512i _mm512_unpacklo_epi16(__m512i a, __m512i b) {
    __m512i r;
    for (int L = 0; L < 4; L++)
        for (int i = 0; i < 4; i++)
            r.h[8 * L + 2 * i] = a.h[8 * L + i], r.h[8 * L + 2 * i + 1] = b.h[8 * L + i];
    return r;
}
static inline __m512i _mm512_unpackhi_epi16(__m512i a, __m512i b) {
    __m512i r;
    for (int L = 0; L < 4; L++)
        for (int i = 0; i < 4; i++)
            r.h[8 * L + 2 * i] = a.h[8 * L + 4 + i], r.h[8 * L + 2 * i + 1] = b.h[8 * L + 4 + i];
    return r;
}
/* the float shuffles of the 16 x 16 transpose (transpose_simd.h); casts keep the bits */
static inline __m512 _mm512_castsi512_ps(__m512i a) {
    __m512 r;
    memcpy(&r, &a, 64);
    return r;
}
static inline __m512i _mm512_castps_si512(__m512 a) {
    __m512i r;
    memcpy(&r, &a, 64);
    return r;
}
static inline __m512 _mm512_unpacklo_ps(__m512 a, __m512 b) {
    __m512 r;
    for (int L = 0; L < 4; L++)
        for (int i = 0; i < 2; i++)
            r.f[4 * L + 2 * i] = a.f[4 * L + i], r.f[4 * L + 2 * i + 1] = b.f[4 * L + i];
    return r;
}
static inline __m512 _mm512_unpackhi_ps(__m512 a, __m512 b) {
    __m512 r;
    for (int L = 0; L < 4; L++)
        for (int i = 0; i < 2; i++)
            r.f[4 * L + 2 * i] = a.f[4 * L + 2 + i], r.f[4 * L + 2 * i + 1] = b.f[4 * L + 2 + i];
    return r;
}
#define _MM_SHUFFLE(z, y, x, w) (((z) << 6) | ((y) << 4) | ((x) << 2) | (w))
/* in each 128-bit lane: two elements of a, then two of b, each picked by two bits of imm */
static inline __m512 _mm512_shuffle_ps(__m512 a, __m512 b, int imm) {
    __m512 r;
    for (int L = 0; L < 4; L++)
        for (int i = 0; i < 4; i++) r.f[4 * L + i] = (i < 2 ? a : b).f[4 * L + ((imm >> (2 * i)) & 3)];
    return r;
}
/* 128-bit lanes 0, 1 of the result come from a, lanes 2, 3 from b, each picked by two bits of imm */
static inline __m512 _mm512_shuffle_f32x4(__m512 a, __m512 b, int imm) {
    __m512 r;
    for (int L = 0; L < 4; L++) memcpy(&r.f[4 * L], &(L < 2 ? a : b).f[4 * ((imm >> (2 * L)) & 3)], 16);
    return r;
}
/* element i: idx bits 0-4 pick the element, bit 5 the source (0: a, 1: b); higher bits are ignored */
static inline __m512i _mm512_permutex2var_epi16(__m512i a, __m512i idx, __m512i b) {
    __m512i r;
    for (int i = 0; i < 32; i++) r.h[i] = (idx.h[i] & 32 ? b : a).h[idx.h[i] & 31];
    return r;
}

static inline __m512 _mm512_set1_ps(float x) {
    __m512 r;
    for (int i = 0; i < 16; i++) r.f[i] = x;
    return r;
}
static inline __m512 _mm512_load_ps(const void *p) {
    if ((uintptr_t)p % 64) emu_fault("_mm512_load_ps of an address not 64-byte aligned");
    __m512 r;
    memcpy(r.f, p, 64);
    return r;
}
static inline __m512 _mm512_maskz_loadu_ps(__mmask16 k, const void *p) {
    __m512 r = _mm512_set1_ps(0.0f);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) memcpy(&r.f[i], (const char *)p + 4 * i, 4);
    return r;
}
static inline void _mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 a) {
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) memcpy((char *)p + 4 * i, &a.f[i], 4);
}
static inline __m512 _mm512_mul_ps(__m512 a, __m512 b) {
    for (int i = 0; i < 16; i++) a.f[i] *= b.f[i];
    return a;
}
static inline __m512 _mm512_add_ps(__m512 a, __m512 b) {
    for (int i = 0; i < 16; i++) a.f[i] += b.f[i];
    return a;
}
static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) { /* one rounding */
    for (int i = 0; i < 16; i++) a.f[i] = fmaf(a.f[i], b.f[i], c.f[i]);
    return a;
}

/* ---- AMX: eight tile registers per thread (palette 1: up to 16 rows of 64 bytes) ---- */
typedef struct emu_amx_state {
    int configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    unsigned char t[8][16][64];
} emu_amx_state;
static _Thread_local emu_amx_state emu_amx;
/* what the kernels did, over all threads (checked per case: the hooks paired, the paths of Note [AMX GEMM]
 * taken: tile loads and stores straight from and to C) */
static atomic_long emu_cfg_loads, emu_cfg_releases, emu_dps, emu_tile_c_loads, emu_tile_c_stores;

static void emu_tile_loadconfig(const void *cfg) {
    const unsigned char *b = (const unsigned char *)cfg;
    if (b[0] != 1) emu_fault("ldtilecfg: palette other than 1");
    for (int i = 1; i < 16; i++) /* start_row (must be 0 for a fresh configuration) and reserved bytes */
        if (b[i]) emu_fault("ldtilecfg: start_row or reserved byte not zero");
    memset(&emu_amx, 0, sizeof emu_amx);
    for (int t = 0; t < 16; t++) {
        uint16_t colsb;
        memcpy(&colsb, b + 16 + 2 * t, 2);
        uint8_t rows = b[48 + t];
        if (t >= 8 ? colsb || rows : colsb > 64 || rows > 16 || (!colsb != !rows))
            emu_fault("ldtilecfg: invalid tile shape");
        if (t < 8) emu_amx.colsb[t] = colsb, emu_amx.rows[t] = rows;
    }
    emu_amx.configured = 1;
    atomic_fetch_add(&emu_cfg_loads, 1);
}
static void emu_tile_release(void) {
    memset(&emu_amx, 0, sizeof emu_amx);
    atomic_fetch_add(&emu_cfg_releases, 1);
}
static void emu_tile_check(int t) {
    if (!emu_amx.configured) emu_fault("tile instruction without a loaded tile configuration");
    if (t < 0 || t >= 8 || !emu_amx.rows[t]) emu_fault("tile register not configured");
}
static void emu_tile_zero(int t) {
    emu_tile_check(t);
    memset(emu_amx.t[t], 0, sizeof emu_amx.t[t]);
}
/* rows[t] rows of colsb[t] bytes, row r at base + r * stride; the rest of the register is zeroed */
static void emu_tile_loadd(int t, const void *base, long stride) {
    emu_tile_check(t);
    memset(emu_amx.t[t], 0, sizeof emu_amx.t[t]);
    for (int r = 0; r < emu_amx.rows[t]; r++)
        memcpy(emu_amx.t[t][r], (const char *)base + r * stride, emu_amx.colsb[t]);
    if (stride != 64) atomic_fetch_add(&emu_tile_c_loads, 1); /* packed panels have stride 64: C */
}
static void emu_tile_stored(int t, void *base, long stride) {
    emu_tile_check(t);
    for (int r = 0; r < emu_amx.rows[t]; r++)
        memcpy((char *)base + r * stride, emu_amx.t[t][r], emu_amx.colsb[t]);
    if (stride != 128) atomic_fetch_add(&emu_tile_c_stores, 1); /* the kernel's buffer has stride 128: C */
}
/* bf16 -> fp32, input denormals treated as zero (DAZ, as the hardware does) */
static float emu_bf16_daz(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (h & 0x7f80u) ? (uint32_t)h << 16 : (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* output denormals flushed to zero (FTZ) */
static float emu_ftz(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }
/* tdpbf16ps dst, a, b as the Intel SDM's pseudocode has it (not the intrinsics guide's, which adds each
 * product to dst in turn): for each row m and column n of dst, the even and the odd products of the pairs
 * p = 0, 1, .. of a's row are summed separately from zero, in fp32 (round to nearest even; a product of two
 * bf16 values is exact in fp32, so each step is one fma), then dst[m][n] += even + odd. Input denormals are
 * treated as zero (DAZ) and output denormals flushed (FTZ), as the hardware does whatever MXCSR says.
 * On a CPU with AMX, main() checks that this is bitwise what the hardware computes (it was, on a Xeon with
 * AMX-BF16, where the intrinsics guide's order was not). */
static void emu_tile_dpbf16ps(int d, int a, int b) {
    emu_tile_check(d), emu_tile_check(a), emu_tile_check(b);
    if (d == a || d == b || a == b) emu_fault("tdpbf16ps: tile operands not distinct");
    const int M = emu_amx.rows[d], N = emu_amx.colsb[d] / 4, P = emu_amx.colsb[a] / 4;
    if (emu_amx.colsb[d] % 4 || emu_amx.colsb[a] % 4 || emu_amx.rows[a] != M || emu_amx.rows[b] != P ||
        emu_amx.colsb[b] != emu_amx.colsb[d])
        emu_fault("tdpbf16ps: tile shapes do not match");
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float even = 0.0f, odd = 0.0f, c;
            for (int p = 0; p < P; p++) {
#ifdef AMX_EMU_BREAK /* deliberately wrong (proves the test can fail): the odd element of b's pair */
                float x0 = emu_bf16_daz(&emu_amx.t[a][m][4 * p]) * emu_bf16_daz(&emu_amx.t[b][p][4 * n + 2]);
#else
                float x0 = emu_bf16_daz(&emu_amx.t[a][m][4 * p]) * emu_bf16_daz(&emu_amx.t[b][p][4 * n]);
#endif
                float x1 =
                    emu_bf16_daz(&emu_amx.t[a][m][4 * p + 2]) * emu_bf16_daz(&emu_amx.t[b][p][4 * n + 2]);
                even = emu_ftz(even + x0);
                odd = emu_ftz(odd + x1);
            }
            memcpy(&c, &emu_amx.t[d][m][4 * n], 4);
            c = emu_ftz(c + emu_ftz(even + odd));
            memcpy(&emu_amx.t[d][m][4 * n], &c, 4);
        }
    atomic_fetch_add(&emu_dps, 1);
}
/* the real intrinsics take tile numbers as compile-time constants */
#define _tile_loadconfig(cfg) emu_tile_loadconfig(cfg)
#define _tile_release() emu_tile_release()
#define _tile_zero(t) emu_tile_zero(t)
#define _tile_loadd(t, base, stride) emu_tile_loadd((t), (base), (long)(stride))
#define _tile_stored(t, base, stride) emu_tile_stored((t), (base), (long)(stride))
#define _tile_dpbf16ps(d, a, b) emu_tile_dpbf16ps((d), (a), (b))

/* ---- the code under test, under a private name (the library has its own copy) ---- */
#define SL_GEMM_AMX_EMULATED 1
#define sl_gemm_impl_amx_bf16 emu_gemm_impl_amx_bf16
#define sl_gemm_amx_few_rows emu_gemm_amx_few_rows
#define sl_gemm_amx_few_rows_set emu_gemm_amx_few_rows_set
#include "device/cpu/kernels/gemm_amx.c"
#undef sl_gemm_amx_few_rows
#undef sl_gemm_amx_few_rows_set
/* the library's own, on the real tiles (the cross-check on CPUs with AMX) */
#undef sl_gemm_impl_amx_bf16
extern const sl_gemm_impl sl_gemm_impl_amx_bf16;

#include "device/cpu/kernels/gemm.h"
#include "testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* Packed layouts of Note [AMX GEMM], element by element: A [step][i 0..31][k 0..31], B [step][half][p][j][t],
 * zero past the panel's rows / columns and past kc. */
static void check_packing(int tA, int tB, int64_t M, int64_t N, int64_t K, int64_t pad) {
    const sl_gemm_impl *im = &emu_gemm_impl_amx_bf16;
    int64_t lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad;
    int64_t na = (tA ? K : M) * lda, nb = (tB ? N : K) * ldb;
    uint16_t *A = malloc((size_t)na * 2), *B = malloc((size_t)nb * 2);
    if (!A || !B) abort();
    for (int64_t i = 0; i < na; i++)
        A[i] = (uint16_t)(rng_state = rng_state * 6364136223846793005ull + 1, rng_state >> 48);
    for (int64_t i = 0; i < nb; i++)
        B[i] = (uint16_t)(rng_state = rng_state * 6364136223846793005ull + 1, rng_state >> 48);
    sl_gemm_args g = {.transA = tA,
                      .transB = tB,
                      .M = M,
                      .N = N,
                      .K = K,
                      .alpha = 1.0f,
                      .A = A,
                      .lda = lda,
                      .B = B,
                      .ldb = ldb};
    /* one K block starting at k0 = 1 (the driver's k0 is a multiple of kc; any offset must work) */
    const int64_t k0 = K > 1 ? 1 : 0, kc = K - k0, steps = (kc + 31) / 32;
    const int64_t np_a = (M + 31) / 32, np_b = (N + 31) / 32;
    uint16_t *pa = malloc((size_t)(np_a * steps * 1024) * 2), *pb = malloc((size_t)(np_b * steps * 1024) * 2);
    if (!pa || !pb) abort();
    im->pack_a(&g, 0, M, k0, kc, 32, pa);
    im->pack_b(&g, 0, N, k0, kc, 32, pb);
    int64_t bad_a = 0, bad_b = 0;
    for (int64_t i = 0; i < np_a * 32; i++)
        for (int64_t k = 0; k < steps * 32; k++) {
            uint16_t want = i < M && k < kc ? A[tA ? (k0 + k) * lda + i : i * lda + k0 + k] : 0;
            bad_a += pa[(i / 32) * steps * 1024 + (k / 32) * 1024 + (i % 32) * 32 + k % 32] != want;
        }
    for (int64_t j = 0; j < np_b * 32; j++)
        for (int64_t k = 0; k < steps * 32; k++) {
            uint16_t want = j < N && k < kc ? B[tB ? j * ldb + k0 + k : (k0 + k) * ldb + j] : 0;
            int64_t jj = j % 32, kk = k % 32;
            bad_b += pb[(j / 32) * steps * 1024 + (k / 32) * 1024 + (jj / 16) * 512 + (kk / 2) * 32 +
                        (jj % 16) * 2 + kk % 2] != want;
        }
    TU_CHECK(bad_a == 0 && bad_b == 0,
             "packing %s%s M=%lld N=%lld K=%lld pad=%lld: %lld A, %lld B elements wrong", tA ? "T" : "N",
             tB ? "T" : "N", (long long)M, (long long)N, (long long)K, (long long)pad, (long long)bad_a,
             (long long)bad_b);
    free(A), free(B), free(pa), free(pb);
}

/* fp32 B (sl_gemm_args.b_f32: Note [Fused weight casts]) packs to exactly the panels of its bf16 rounding:
 * values that are not bf16, round-to-even ties, a NaN, infinities, a denormal and the largest finite float
 * (which rounds to inf) */
static void check_packing_f32(int tB, int64_t N, int64_t K, int64_t pad) {
    const sl_gemm_impl *im = &emu_gemm_impl_amx_bf16;
    const int64_t ldb = (tB ? K : N) + pad, nb = (tB ? N : K) * ldb;
    float *Bf = malloc((size_t)nb * 4);
    uint16_t *Bh = malloc((size_t)nb * 2);
    if (!Bf || !Bh) abort();
    const uint32_t special[] = {0x7fc00001u, 0x7f800000u, 0xff800000u, 0x00000001u,
                                0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0xbf808000u};
    for (int64_t i = 0; i < nb; i++) {
        Bf[i] = frand() * 3.0f;
        if (i % 13 == 5) memcpy(&Bf[i], &special[(i / 13) % 8], 4);
        Bh[i] = sl_f32_to_bf16(Bf[i]);
    }
    sl_gemm_args g = {.transB = tB, .M = 1, .N = N, .K = K, .alpha = 1.0f, .B = Bh, .ldb = ldb};
    const int64_t k0 = K > 1 ? 1 : 0, kc = K - k0, steps = (kc + 31) / 32, np_b = (N + 31) / 32;
    uint16_t *p16 = malloc((size_t)(np_b * steps * 1024) * 2),
             *p32 = malloc((size_t)(np_b * steps * 1024) * 2);
    if (!p16 || !p32) abort();
    im->pack_b(&g, 0, N, k0, kc, 32, p16);
    g.B = Bf;
    g.b_f32 = 1;
    for (int fail = 0; fail < 2; fail++) { /* through the rounding buffer, and block by block without it */
        memset(p32, 0xa5, (size_t)(np_b * steps * 1024) * 2);
        emu_bconv_fail = fail;
        im->pack_b(&g, 0, N, k0, kc, 32, p32);
        emu_bconv_fail = 0;
        TU_CHECK(!memcmp(p16, p32, (size_t)(np_b * steps * 1024) * 2),
                 "packing fp32 B (%s) N=%lld K=%lld pad=%lld%s: not the panels of its bf16 rounding",
                 tB ? "T" : "N", (long long)N, (long long)K, (long long)pad,
                 fail ? " without the buffer" : "");
    }
    free(Bf), free(Bh), free(p16), free(p32);
}

typedef struct gemm_case {
    int tA, tB;
    int64_t M, N, K, pad; /* leading dimensions: row length + pad */
    float alpha, beta;
    int bias; /* 1: a bias row (then beta is 0) */
} gemm_case;

/* Runs case c with impl im (the emulated one, or the library's on a CPU with AMX) and nthr threads; returns
 * C ((M-1) * ldc + N floats, caller frees) for bitwise comparisons. The inputs are a function of the shape.
 * The operands are allocated to their exact size, so an ASan build catches any access past them. */
static float *run_case(const gemm_case *c, const sl_gemm_impl *im, int nthr) {
    const int64_t M = c->M, N = c->N, K = c->K;
    int64_t lda = (c->tA ? M : K) + c->pad, ldb = (c->tB ? K : N) + c->pad, ldc = N + c->pad;
    int64_t na = (c->tA ? K : M) * lda, nb = (c->tB ? N : K) * ldb, nc = (M - 1) * ldc + N;
    float *Af = malloc((size_t)na * 4), *Bf = malloc((size_t)nb * 4), *C = malloc((size_t)nc * 4),
          *C0 = malloc((size_t)nc * 4), *R = malloc((size_t)nc * 4), *bias = malloc((size_t)N * 4);
    float *got = malloc((size_t)(M * N) * 4), *want = malloc((size_t)(M * N) * 4);
    uint16_t *Ah = malloc((size_t)na * 2), *Bh = malloc((size_t)nb * 2);
    if (!Af || !Bf || !C || !C0 || !R || !bias || !got || !want || !Ah || !Bh) abort();
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)(M * 1000003 + N * 1009 + K);
    for (int64_t i = 0; i < na; i++) Ah[i] = sl_f32_to_bf16(frand()), Af[i] = sl_bf16_to_f32(Ah[i]);
    for (int64_t i = 0; i < nb; i++) Bh[i] = sl_f32_to_bf16(frand()), Bf[i] = sl_bf16_to_f32(Bh[i]);
    for (int64_t j = 0; j < N; j++) bias[j] = frand();
    for (int64_t i = 0; i < nc; i++) C[i] = frand();
    if (c->beta == 0.0f || c->bias) /* must be overwritten, never read */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = NAN;
    memcpy(C0, C, (size_t)nc * 4);
    memcpy(R, C, (size_t)nc * 4);
    if (c->bias) /* reference: C = bias + alpha * sum, as beta 1 on a C holding the bias */
        for (int64_t i = 0; i < M; i++) memcpy(R + i * ldc, bias, (size_t)N * 4);
    sl_sgemm_ref(c->tA, c->tB, M, N, K, c->alpha, Af, lda, Bf, ldb, c->bias ? 1.0f : c->beta, R, ldc);

    long loads0 = atomic_load(&emu_cfg_loads), rel0 = atomic_load(&emu_cfg_releases),
         dps0 = atomic_load(&emu_dps), cl0 = atomic_load(&emu_tile_c_loads),
         cs0 = atomic_load(&emu_tile_c_stores);
    sl_gemm_args g = {.transA = c->tA,
                      .transB = c->tB,
                      .M = M,
                      .N = N,
                      .K = K,
                      .alpha = c->alpha,
                      .beta = c->bias ? 0.0f : c->beta,
                      .A = Ah,
                      .lda = lda,
                      .B = Bh,
                      .ldb = ldb,
                      .C = C,
                      .ldc = ldc,
                      .bias = c->bias ? bias : NULL};
    sl_gemm_run(&g, im, nthr);
    long loads = atomic_load(&emu_cfg_loads) - loads0, rels = atomic_load(&emu_cfg_releases) - rel0,
         dps = atomic_load(&emu_dps) - dps0, cloads = atomic_load(&emu_tile_c_loads) - cl0,
         cstores = atomic_load(&emu_tile_c_stores) - cs0;

    char what[200];
    const int emu = im == &emu_gemm_impl_amx_bf16;
    snprintf(what, sizeof what, "%s %s%s M=%lld N=%lld K=%lld pad=%lld alpha=%g beta=%g%s thr=%d",
             emu ? "emu" : "hw", c->tA ? "T" : "N", c->tB ? "T" : "N", (long long)M, (long long)N,
             (long long)K, (long long)c->pad, c->alpha, c->beta, c->bias ? " bias" : "", nthr);
    int64_t pad_changed = 0;
    for (int64_t i = 0; i < M; i++) {
        memcpy(got + i * N, C + i * ldc, (size_t)N * 4);
        memcpy(want + i * N, R + i * ldc, (size_t)N * 4);
        if (i < M - 1) pad_changed += memcmp(C + i * ldc + N, C0 + i * ldc + N, (size_t)c->pad * 4) != 0;
    }
    tu_allclose(what, got, want, M * N, 1e-6f * (float)(K + 8), 1e-5f);
    TU_CHECK(pad_changed == 0, "%s: C written past column N in %lld rows", what, (long long)pad_changed);
    if (emu) {
        /* the tile configuration is loaded and released once per working thread; the tiles did the work */
        TU_CHECK(loads >= 1 && loads <= nthr && rels == loads,
                 "%s: %ld tile configurations loaded, %ld released", what, loads, rels);
        TU_CHECK(dps > 0, "%s: no tdpbf16ps", what);
        /* Note [AMX GEMM]: full 32x32 tiles with alpha 1 and beta 0 / 1 (or a bias: beta 1 on it) go straight
         * between C and the tiles (stride ldc, not the packed 64 or the buffer's 128 bytes) */
        if (ldc != 32 && ldc != 16) { /* (else the strides do not tell the paths apart) */
            const int direct =
                M >= 32 && N >= 32 && c->alpha == 1.0f && (c->bias || c->beta == 0.0f || c->beta == 1.0f);
            const int direct_loads = direct && (c->bias || c->beta == 1.0f || K > 1024);
            TU_CHECK(direct ? cstores > 0 : cstores == 0, "%s: %ld tile stores to C (direct path %s)", what,
                     cstores, direct ? "expected" : "not expected");
            TU_CHECK(direct_loads ? cloads > 0 : cloads == 0, "%s: %ld tile loads from C (%s)", what, cloads,
                     direct_loads ? "expected" : "not expected");
        }
    }
    free(Af), free(Bf), free(C0), free(R), free(bias), free(got), free(want), free(Ah), free(Bh);
    return C;
}

int main(void) {
    /* The layouts themselves, in every transpose case, with edges, k tails and odd leading dimensions. */
    static const int64_t pshapes[][4] = {
        {1, 1, 1, 0}, {32, 32, 33, 0}, {33, 47, 77, 3}, {70, 5, 64, 1}, {5, 70, 100, 2}};
    for (int s = 0; s < 5; s++)
        for (int t = 0; t < 4; t++)
            check_packing(t >> 1, t & 1, pshapes[s][0], pshapes[s][1], pshapes[s][2], pshapes[s][3]);
    for (int s = 0; s < 5; s++)
        for (int tB = 0; tB < 2; tB++) check_packing_f32(tB, pshapes[s][1], pshapes[s][2], pshapes[s][3]);

    /* Shapes: full tiles (M, N multiples of 32), edge tiles, K not a multiple of 32 (and odd), K > kc = 1024
     * (two K blocks: the second accumulates through the tiles or the buffer with beta 1). */
    static const int64_t shapes[][3] = {{32, 32, 32},   {64, 96, 64},   {1, 1, 1},
                                        {33, 47, 77},   {31, 33, 31},   {100, 70, 45},
                                        {64, 64, 1100}, {40, 96, 1030}, {17, 100, 1056}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < nshapes; s++)
        for (int t = 0; t < 4; t++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            const int tA = t >> 1, tB = t & 1, odd = (s + t) % 2;
            const gemm_case cases[] = {
                {tA, tB, M, N, K, 0, 1.0f, 0.0f, 0},           /* direct, beta 0 over NaN */
                {tA, tB, M, N, K, odd ? 3 : 1, 1.0f, 1.0f, 0}, /* direct, beta 1 */
                {tA, tB, M, N, K, odd ? 5 : 2, -0.5f, 0.25f, 0},
                {tA, tB, M, N, K, odd ? 7 : 0, 1.5f, 0.0f, 0}, /* buffer, beta 0 over NaN */
                {tA, tB, M, N, K, odd ? 1 : 0, 1.0f, 0.0f, 1}, /* bias, direct */
                {tA, tB, M, N, K, 3, 2.0f, 0.0f, 1},           /* bias, buffer */
            };
            for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++)
                free(run_case(&cases[c], &emu_gemm_impl_amx_bf16, 1 + (c & 1)));
        }

    /* 1 vs 2 threads, bitwise (large enough that sl_gemm_run keeps 2 threads: >= 8 MFLOP), with a partition
     * that gives one thread full and edge tiles. */
    static const gemm_case tcases[] = {
        {0, 0, 100, 96, 1100, 1, 1.0f, 1.0f, 0},
        {1, 1, 100, 96, 1100, 0, 0.5f, 0.25f, 0},
        {0, 1, 96, 100, 1100, 3, 1.0f, 0.0f, 1},
        {1, 0, 72, 100, 1100, 2, 1.0f, 0.0f, 0},
    };
    for (int c = 0; c < 4; c++) {
        const gemm_case *tc = &tcases[c];
        long loads0 = atomic_load(&emu_cfg_loads);
        float *c1 = run_case(tc, &emu_gemm_impl_amx_bf16, 1);
        long loads1 = atomic_load(&emu_cfg_loads);
        float *c2 = run_case(tc, &emu_gemm_impl_amx_bf16, 2);
        long loads2 = atomic_load(&emu_cfg_loads);
        size_t bytes = (size_t)((tc->M - 1) * (tc->N + tc->pad) + tc->N) * 4;
        TU_CHECK(memcmp(c1, c2, bytes) == 0, "case %d: 1 and 2 threads differ", c);
        TU_CHECK(loads1 - loads0 == 1 && loads2 - loads1 == 2,
                 "case %d: expected 1 then 2 working threads, got %ld, %ld", c, loads1 - loads0,
                 loads2 - loads1);
        free(c1), free(c2);
    }

    /* On a CPU with AMX (and permission to use it): the emulation is bitwise what the tiles compute, so the
     * emulated runs above stand for the hardware's. Skipped elsewhere (SUANLI_ISA=avx512 skips it too). */
    if (sl_cpu_features_get()->amx_bf16) {
        static const gemm_case hcases[] = {
            {0, 0, 64, 64, 1100, 0, 1.0f, 0.0f, 0}, {0, 1, 64, 96, 77, 1, 1.0f, 1.0f, 0},
            {1, 0, 33, 47, 1030, 3, 1.0f, 0.0f, 0}, {1, 1, 100, 70, 45, 2, -0.5f, 0.25f, 0},
            {0, 0, 96, 64, 1056, 1, 1.0f, 0.0f, 1}, {1, 1, 40, 96, 1100, 0, 2.0f, 0.0f, 1},
        };
        for (int c = 0; c < (int)(sizeof hcases / sizeof hcases[0]); c++) {
            const gemm_case *hc = &hcases[c];
            float *ce = run_case(hc, &emu_gemm_impl_amx_bf16, 1),
                  *ch = run_case(hc, &sl_gemm_impl_amx_bf16, 1);
            int64_t ldc = hc->N + hc->pad, differ = 0;
            for (int64_t i = 0; i < hc->M; i++)
                for (int64_t j = 0; j < hc->N; j++)
                    differ += memcmp(&ce[i * ldc + j], &ch[i * ldc + j], 4) != 0;
            TU_CHECK(differ == 0,
                     "hardware cross-check case %d: %lld of %lld elements differ from the emulation", c,
                     (long long)differ, (long long)(hc->M * hc->N));
            free(ce), free(ch);
        }
        printf("test_gemm_amx_emu: cross-checked against the AMX hardware\n");
    } else
        printf("test_gemm_amx_emu: no usable AMX here: hardware cross-check skipped\n");
    return tu_finish("test_gemm_amx_emu");
}
