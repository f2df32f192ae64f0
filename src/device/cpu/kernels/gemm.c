/* gemm.c — GEMM entry points, the blocked driver, generic packing, the scalar reference and the scalar
 * micro-kernel. ISA-specific micro-kernels live in gemm_avx2.c and gemm_avx512.c. See Note [GEMM structure]
 * in gemm_internal.h. */
#include "device/cpu/kernels/gemm.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "device/cpu/kernels/gemm_internal.h"
#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/simd_math.h"
#include "suanli/base.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if SL_HAVE_X86
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Reference                                                                                        */

void sl_sgemm_ref(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = transA ? A[k * lda + i] : A[i * lda + k];
                double b = transB ? B[j * ldb + k] : B[k * ldb + j];
                s += a * b;
            }
            double r = (double)alpha * s;
            if (beta != 0.0f) r += (double)beta * C[i * ldc + j];
            C[i * ldc + j] = (float)r;
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Generic packing (kgran 1, fp32 panels)                                                           */

#define SL_PACK_A_GENERIC(NAME, T, LOAD)                                                                     \
    static void NAME##_panel(const sl_gemm_args *g, int64_t i0, int ni, int64_t k0, int64_t kc, int mr,      \
                             float *dst) {                                                                   \
        const T *A = (const T *)g->A;                                                                        \
        int64_t lda = g->lda;                                                                                \
        if (g->transA) { /* A is K x M: row k holds op(A)[., k] contiguously */                              \
            for (int64_t k = 0; k < kc; k++) {                                                               \
                const T *src = A + (k0 + k) * lda + i0;                                                      \
                float *d = dst + k * mr;                                                                     \
                int i = 0;                                                                                   \
                for (; i < ni; i++) d[i] = LOAD(src[i]);                                                     \
                for (; i < mr; i++) d[i] = 0.0f;                                                             \
            }                                                                                                \
        } else {                                                                                             \
            for (int i = 0; i < ni; i++) {                                                                   \
                const T *src = A + (i0 + i) * lda + k0;                                                      \
                for (int64_t k = 0; k < kc; k++) dst[k * mr + i] = LOAD(src[k]);                             \
            }                                                                                                \
            for (int i = ni; i < mr; i++)                                                                    \
                for (int64_t k = 0; k < kc; k++) dst[k * mr + i] = 0.0f;                                     \
        }                                                                                                    \
    }

#define SL_PACK_B_GENERIC(NAME, T, LOAD)                                                                     \
    static void NAME##_panel(const sl_gemm_args *g, int64_t j0, int nj, int64_t k0, int64_t kc, int nr,      \
                             float *dst) {                                                                   \
        const T *B = (const T *)g->B;                                                                        \
        int64_t ldb = g->ldb;                                                                                \
        if (!g->transB) { /* B is K x N */                                                                   \
            for (int64_t k = 0; k < kc; k++) {                                                               \
                const T *src = B + (k0 + k) * ldb + j0;                                                      \
                float *d = dst + k * nr;                                                                     \
                int j = 0;                                                                                   \
                for (; j < nj; j++) d[j] = LOAD(src[j]);                                                     \
                for (; j < nr; j++) d[j] = 0.0f;                                                             \
            }                                                                                                \
        } else { /* B is N x K */                                                                            \
            for (int j = 0; j < nj; j++) {                                                                   \
                const T *src = B + (j0 + j) * ldb + k0;                                                      \
                for (int64_t k = 0; k < kc; k++) dst[k * nr + j] = LOAD(src[k]);                             \
            }                                                                                                \
            for (int j = nj; j < nr; j++)                                                                    \
                for (int64_t k = 0; k < kc; k++) dst[k * nr + j] = 0.0f;                                     \
        }                                                                                                    \
    }

/* Panel loop around a one-panel packer. */
#define SL_PACK_PANELS(NAME, W)                                                                              \
    void NAME(const sl_gemm_args *g, int64_t x0, int64_t nx, int64_t k0, int64_t kc, int W, void *dst) {     \
        for (int64_t p = 0; p * W < nx; p++) {                                                               \
            int n = nx - p * W < W ? (int)(nx - p * W) : W;                                                  \
            NAME##_panel(g, x0 + p * W, n, k0, kc, W, (float *)dst + p * kc * W);                            \
        }                                                                                                    \
    }

#define SL_LOAD_F32(x) (x)
#define SL_LOAD_BF16(x) sl_bf16_to_f32(x)
SL_PACK_A_GENERIC(sl_gemm_pack_a_f32, float, SL_LOAD_F32)
SL_PACK_B_GENERIC(sl_gemm_pack_b_f32, float, SL_LOAD_F32)
SL_PACK_A_GENERIC(sl_gemm_pack_a_bf16_f32, uint16_t, SL_LOAD_BF16)
SL_PACK_B_GENERIC(sl_gemm_pack_b_bf16_f32, uint16_t, SL_LOAD_BF16)
SL_PACK_PANELS(sl_gemm_pack_a_f32, mr)
SL_PACK_PANELS(sl_gemm_pack_b_f32, nr)
SL_PACK_PANELS(sl_gemm_pack_a_bf16_f32, mr)
SL_PACK_PANELS(sl_gemm_pack_b_bf16_f32, nr)

/* ------------------------------------------------------------------------------------------------ */
/* Scalar micro-kernel (portable C; the compiler may vectorise it with the baseline ISA)             */

enum { SC_MR = 4, SC_NR = 16 };

static void kernel_scalar_4x16(int64_t ksteps, const void *a_, const void *b_, float *c, int64_t ldc,
                               float alpha, float beta, int mr, int nr) {
    const float *a = (const float *)a_, *b = (const float *)b_;
    float acc[SC_MR][SC_NR];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < ksteps; k++) {
        for (int i = 0; i < SC_MR; i++) {
            float av = a[k * SC_MR + i];
            for (int j = 0; j < SC_NR; j++) acc[i][j] += av * b[k * SC_NR + j];
        }
    }
    for (int i = 0; i < mr; i++) {
        float *cr = c + i * ldc;
        for (int j = 0; j < nr; j++) {
            float t = alpha * acc[i][j];
            cr[j] = beta == 0.0f ? t : (beta == 1.0f ? t + cr[j] : beta * cr[j] + t);
        }
    }
}

static const sl_gemm_impl impl_scalar_f32 = {.name = "scalar",
                                             .mr = SC_MR,
                                             .nr = SC_NR,
                                             .kgran = 1,
                                             .esz = 4,
                                             .in_bf16 = 0,
                                             .kc = 256,
                                             .mc = 256,
                                             .nc = 1024,
                                             .pack_a = sl_gemm_pack_a_f32,
                                             .pack_b = sl_gemm_pack_b_f32,
                                             .kernel = kernel_scalar_4x16};
static const sl_gemm_impl impl_scalar_bf16 = {.name = "scalar",
                                              .mr = SC_MR,
                                              .nr = SC_NR,
                                              .kgran = 1,
                                              .esz = 4,
                                              .in_bf16 = 1,
                                              .kc = 256,
                                              .mc = 256,
                                              .nc = 1024,
                                              .pack_a = sl_gemm_pack_a_bf16_f32,
                                              .pack_b = sl_gemm_pack_b_bf16_f32,
                                              .kernel = kernel_scalar_4x16};

/* ------------------------------------------------------------------------------------------------ */
/* Per-thread buffers (sl_gemm_tlbuf): grown on demand, reused across calls                        */

typedef struct gemm_tlbufs {
    void *p[SL_GEMM_TLB_COUNT];
    size_t cap[SL_GEMM_TLB_COUNT];
} gemm_tlbufs;
static _Thread_local gemm_tlbufs tl_bufs;
/* a thread-exit destructor frees the buffers of threads that end (e.g. ranks run as threads); it gets the
 * exiting thread's own gemm_tlbufs */
static pthread_key_t tlb_key;
static pthread_once_t tlb_once = PTHREAD_ONCE_INIT;
static void tlb_free(void *arg) {
    gemm_tlbufs *t = (gemm_tlbufs *)arg;
    for (int i = 0; i < SL_GEMM_TLB_COUNT; i++) {
        sl_free_aligned(t->p[i]);
        t->p[i] = NULL;
        t->cap[i] = 0;
    }
}
static void tlb_key_init(void) { (void)pthread_key_create(&tlb_key, tlb_free); }

void *sl_gemm_tlbuf(int slot, size_t bytes) {
    if (bytes > tl_bufs.cap[slot]) {
        pthread_once(&tlb_once, tlb_key_init);
        sl_free_aligned(tl_bufs.p[slot]);
        tl_bufs.p[slot] = sl_malloc_aligned(bytes ? bytes : 64);
        tl_bufs.cap[slot] = tl_bufs.p[slot] ? bytes : 0;
        (void)pthread_setspecific(tlb_key, &tl_bufs); /* non-NULL: the destructor runs at thread exit */
    }
    return tl_bufs.p[slot];
}

/* ------------------------------------------------------------------------------------------------ */
/* Driver                                                                                           */

static inline int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline size_t round_up_sz(size_t a, size_t b) { return (a + b - 1) / b * b; }

/* C = beta * C (beta == 0: C = 0; with a bias: C = bias), for K == 0 or alpha == 0. */
static void scale_c(const sl_gemm_args *g) {
    for (int64_t i = 0; i < g->M; i++) {
        float *c = g->C + i * g->ldc;
        if (g->bias)
            memcpy(c, g->bias, (size_t)g->N * sizeof(float));
        else if (g->beta == 0.0f)
            memset(c, 0, (size_t)g->N * sizeof(float));
        else if (g->beta != 1.0f)
            for (int64_t j = 0; j < g->N; j++) c[j] *= g->beta;
    }
}

enum { GEMM_UNITS_MAX = 64 };
/* Note [Unpacked A]
 * Packing A costs a read and a write per element against 2 N FMAs' worth of work per element: for N = 128
 * (the small model's attention and MLP projections and their dX) it was 7 % of the step's samples, as much
 * as 1/5 of the kernel's time; for GPT-2 124M's 768-wide products 5-6 % of the call. A row-major fp32 A is
 * therefore read in place whenever the impl has such a kernel (kernel_ua): the micro-kernel broadcasts
 * A[i][k] from its 8 rows (8 streams, 8 x kc floats = 24 KiB of L1 at kc 768) instead of the packed panel,
 * with the same FMAs in the same order (the same bits); a partial panel at the bottom is still packed.
 * Until 2026-12-05 this was done only for units of at most 512 columns; on the Intel AMX host the wide
 * products gained as well (N 768: +2-4 %, N 2304-50304: +-1 %, `suanli bench ops`). The AVX2 impl has the
 * kernel too since then (6 rows in place; SUANLI_ISA=avx2 on that host, both orders: fwd and dX +2-4 %; on
 * Zen 1 in an earlier session such a kernel measured within noise). */
static int g_ua_off; /* tests: 1 packs every A (sl_gemm_unpacked_a_set) */
void sl_gemm_unpacked_a_set(int on) { __atomic_store_n(&g_ua_off, !on, __ATOMIC_RELAXED); }
enum { PB_PF_TILES = 4, PB_PF_TILES_L2 = 16 }; /* Note [Packing B in the first tile] */
static int g_pb_mode = 1;                      /* tests: sl_gemm_fused_b_pack_set */
void sl_gemm_fused_b_pack_set(int mode) { __atomic_store_n(&g_pb_mode, mode, __ATOMIC_RELAXED); }

/* Note [Walk or chunk]
 * The panel walk (Note [Packing B in the first tile]) was made on Zen 4, whose 1 MiB L2 cannot hold a packed
 * B chunk (336 x 768 fp32, 1 MiB) beside A's rows. An Intel Xeon core (Emerald Rapids, 2 MiB L2) holds it,
 * and there the chunk order (each row panel across the whole chunk, its A panel in L1) is the faster one
 * once a block has more than PB_WALK_PANELS row panels: 1 thread, in-process alternation with oneDNN, fp32
 * NN / TN 768 x 3072 x 256 0.92-0.95 of oneDNN walked, 0.97-1.00 in chunks; NN 1024 x 768 x 3072 0.90-0.93
 * and 0.96-1.00; NT 1024 x 3072 x 768 0.945 and 0.989. With 32 row panels (M = 256) the walk still wins
 * there: NN 256 x 768 x {2304, 3072} 0.96 against 0.91-0.92, NT 256 x 2304 x 768 1.00 against 0.97, as
 * B's panels come from DRAM for fewer tiles each. Packing B inside the first tile of a chunk instead (each
 * panel's first tile packs it into its slot, then the chunk order) measured as the chunk order, and below
 * it on the 50304-deep products, so the chunk order packs as before. A core whose L2 (sysconf) holds less
 * than two of the impl's chunks keeps the walk everywhere, as measured on Zen 4. Zen cores keep it in any
 * case: the bf16 (vdpbf16ps) chunk is 336 x 768 x 2 bytes, two of which (1.03 MB) just fit Zen 4's 1 MiB L2
 * as two fp32 chunks fit the Xeon's 2 MiB, and there the chunk order lost. bench ops, bf16, 1 thread, the
 * two orders alternated on Zen 4 (2026-12-07): median 0.983-0.985x oneDNN in chunks, 1.002-1.012x walked
 * (the 1024-row NT / NN products 0.975-0.989 -> 0.96-1.016); 2 threads 1.017x -> 1.020x (worst 0.864 ->
 * 0.939). */
enum { PB_WALK_PANELS = 32 };
static int l2_holds_two_chunks(const sl_gemm_impl *im) {
    static long l2 = -2; /* racing first calls read the same value (-1: a Zen core, walk) */
    long v = __atomic_load_n(&l2, __ATOMIC_RELAXED);
    if (v == -2)
        __atomic_store_n(&l2, v = sl_cpu_features_get()->zen ? -1 : sysconf(_SC_LEVEL2_CACHE_SIZE),
                         __ATOMIC_RELAXED);
    return v > 0 && (double)v >= 2.0 * (double)im->nc * (double)im->kc * (double)im->esz;
}

typedef struct gemm_plan {
    const sl_gemm_args *g;
    const sl_gemm_impl *im;
    int nthr;
    int split_n;    /* 1: threads split N; 0: threads split M */
    int64_t kc;     /* the K block of this call (Note [Even K blocks]) */
    size_t a_bytes; /* one packed A block (mc x kc) */
    size_t b_bytes; /* one packed B chunk (kc x nc) */
    char *ws;       /* [A t0][B t0][A t1][B t1]... */
    int units;      /* work units along the split dimension, claimed in order by whichever thread is free */
    int64_t ubound[GEMM_UNITS_MAX + 1]; /* unit u covers micro-panels [ubound[u], ubound[u+1]) */
    int next;                           /* the next unclaimed unit (atomic) */
    char *bshared; /* all of op(B) packed once by the team (Note [Shared B panels]); NULL: each unit packs */
} gemm_plan;

/* c[i][j] = round_bf16(c[i][j] + bias[j]) for a finished micro-tile (block_times_b's late bias) */
#if SL_HAVE_X86
__attribute__((target("avx512f,avx512bw"))) static void
round_rows_bias_avx512(float *c, int64_t ldc, const float *bias, int64_t rows, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        const __m512 b = _mm512_maskz_loadu_ps(m, bias + j);
        for (int64_t i = 0; i < rows; i++) {
            float *ci = c + i * ldc + j;
            _mm512_mask_storeu_ps(ci, m,
                                  sl_round_bf16_avx512(_mm512_add_ps(_mm512_maskz_loadu_ps(m, ci), b)));
        }
    }
}
#endif
static void round_rows_bias(float *c, int64_t ldc, const float *bias, int64_t rows, int64_t n) {
#if SL_HAVE_X86
    if (sl_kern_isa() >= SL_KISA_AVX512 && sl_cpu_features_get()->avx512bw) {
        round_rows_bias_avx512(c, ldc, bias, rows, n);
        return;
    }
#endif
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < n; j++) c[i * ldc + j] = sl_round_bf16_f32(c[i * ldc + j] + bias[j]);
}

/* Note [Packing B in the first tile]
 * A dX product (NN: dY times the weight, 256 x 768 x 2304 for GPT-2 at B4 T64) reads its B panels from
 * DRAM, and packing them was 9 % of the call at 1 thread on Zen 4 (pack_b_f32_avx512 in perf), where
 * oneDNN's sgemm finished the same shapes 7-9 % sooner. oneDNN's JIT code for these shapes loads B in place
 * in the first tile of a strip and copies it as it goes; an earlier attempt here that read B in place in
 * every tile lost 4-20 % (B's rows ldb apart fall into a few L1 sets and evict each other). So for a K x N
 * op(B) (transB 0: the dX and dW products) an impl with kernel_pb computes the first row panel's tile
 * straight from B's rows, storing each row's values into the packed panel as it loads them, and the other
 * row panels use that packed panel as before: the packing loads are the ones the kernel makes anyway, and
 * the FMAs run while they arrive. The vdpbf16ps impl does the same on k pairs: two rows per step, bf16, or
 * fp32 rounded as its packer rounds them (b_f32, the bf16 step's weights), merged into pair lanes; a K block
 * of odd length keeps the packer. The chunk is walked panel by panel (every row panel on one B panel, then
 * the next), each panel packed into the chunk's first slot, so the packed B that the kernels read is one
 * panel (147 KiB fp32 at kc 768) instead of a 1 MiB chunk, beside the 1 MiB L2 of a Zen 4 core. A partial
 * panel at the right edge is packed first, as before. Reading B from DRAM, the first tile still took about
 * 2.5 tiles' time (1.3 with B in L2), so the last PB_PF_TILES tiles of a panel (kernel_pf) prefetch the next
 * full panel's rows into L1, a quarter each. Bursts of prefetches issued between tiles, into L2 over the
 * whole panel or into L1 over its last 2-8 tiles, gained nothing measurable (presumably the bursts stall
 * the kernel, and A's rows, streamed past once per panel, evict the early lines from L2). On a core whose L2
 * holds two chunks (Note [Walk or chunk]; Intel Xeon, 2 MiB), four tiles asked for B faster than DRAM gives
 * it: each of them streams 37 KiB in the time of a tile (about 10 GB/s, this VM's single-core bandwidth), and
 * perf put them at 1.65x a plain tile's time on NN 256 x 768 x 50304. There a block of more than
 * PB_PF_TILES_L2 row panels spreads the prefetches over its last PB_PF_TILES_L2 tiles (one row every 16 k),
 * in-process alternation with oneDNN at 1 thread: NN 256 x 768 x 50304 0.90-0.91 -> 0.96-0.97 of oneDNN, NT
 * 256 x 50304 x 768 1.06-1.07 -> 1.13, the 768- to 3072-deep NN shapes +0.5-2 %; 2 threads NN 50304-deep
 * 0.966 -> 0.997, NT 1.096 -> 1.140. With kernel_round
 * the tiles keep their rounding writeback. A transposed fp32 B (the forward, NT) cannot be packed inside
 * the FMA loop (its panel is a transpose of 48 rows), but when its K block is all of K (ldb = K) a panel's
 * source is one contiguous run of 48 rows: the chunk is walked panel by panel as above, each panel packed
 * by pack_b just before its tiles, and the last tiles prefetch the next panel's run (nt_walk): NT 256 x
 * {2304, 3072, 50304} x 768 at 1 thread 99-101 -> 109-110 GFLOP/s (oneDNN 103-104). The vdpbf16ps impl walks
 * a transposed B the same way, bf16 (K even: whole k pairs) or fp32 rounded as it is packed (b_f32), the run
 * 48 x K x 2 or 4 bytes (128 or 256 prefetched per k): before, its whole chunk was transposed from L3 up
 * front (pack_rows48_t32 12 % of the call). Zen 4, 1 thread, in-process alternation with oneDNN's
 * gemm_bf16bf16f32: NT 256 x {2304, 3072, 50304} x 768 0.94-0.99 -> 1.07 of oneDNN with bf16 B, 0.955-0.984
 * -> 0.996-1.009 with fp32 B (the bf16 step's forward); the 1024-row NT shapes unchanged (+-2 %, noise).
 * The products and their
 * order are the packed kernels', so C is the same bits (test_gemm compares the two paths for the fp32, bf16,
 * fp32-rounded and rounded-output calls; test_gemm_avx512_emu runs the kernels under SIMDe). Zen 4, 1 thread,
 * in-process alternation (docs/BENCHMARKS.md "Zen 4, eighth visit"): fp32 NN 256 x 768 x 2304 102 -> 111
 * GFLOP/s (oneDNN 111.5), dW +1-2 %; bf16 A x fp32 B, the same shape, 184 -> 211. B's rows should be 64-byte
 * aligned: a malloc'ed B 16 bytes off the line gains less (a 48-float row then spans four lines). */
/* the bias into a tile's rows of C, which its kernel then adds to (beta 1) */
static inline void tile_bias(float *c, int64_t ldc, const float *bias, int64_t rows, int64_t n) {
    for (int64_t i = 0; i < rows; i++) memcpy(c + i * ldc, bias, (size_t)n * sizeof(float));
}

/* Multiply the packed A block (npa micro-panels) by op(B) columns [n0, n1), K block (k0, kc). */
static void block_times_b(const gemm_plan *p, const char *apack, const float *ua, int64_t ic, int64_t mcur,
                          int64_t k0, int64_t kc, int64_t n0, int64_t n1, char *bpack, float *tile) {
    const sl_gemm_args *g = p->g;
    const sl_gemm_impl *im = p->im;
    const int mr = im->mr, nr = im->nr;
    const int64_t ksteps = ceil_div(kc, im->kgran);
    const size_t apanel = (size_t)ksteps * im->kgran * mr * im->esz;
    const size_t bpanel = (size_t)ksteps * im->kgran * nr * im->esz;
    const int64_t npa = ceil_div(mcur, mr);
    /* Note [Rounded Linear outputs]: after the last K block each finished micro-tile is rounded in place */
    const int round_out = g->c_round == SL_GEMM_ROUND_OUT && k0 + kc >= g->K;
    /* ... and with one K block the bias joins there too (c = round(sum + bias): the sum the kernel would
     * have added to the bias copied into C, the same add), instead of being copied into C first */
    const int bias_late = g->bias && round_out && k0 == 0 && !ua;
    const float beta = bias_late ? 0.0f : k0 == 0 && !g->bias ? g->beta : 1.0f;
    /* Note [GEMM structure]: the bias first, each tile's just before its kernel adds to it */
    const float *bias_first = k0 == 0 && g->bias && !bias_late ? g->bias : NULL;
    if (n1 <= n0) return;
    const int pb_mode = __atomic_load_n(&g_pb_mode, __ATOMIC_RELAXED);
    const int pb_on =
        !p->bshared && !tile && pb_mode &&
        (pb_mode == 2 || npa <= PB_WALK_PANELS || !l2_holds_two_chunks(im)); /* Note [Walk or chunk] */
    const int fuse_b = pb_on && im->kernel_pb && !g->transB && kc % im->kgran == 0;
    /* a transposed fp32 B in one K block: each panel's source is one run of 48 whole rows (fp32 B with
     * b_f32 in an impl that packs fp32: the widened one, Note [Widened bf16 GEMM]) */
    const int nt_walk = pb_on && im->kernel_pf && g->transB &&
                        (!im->in_bf16 || g->b_f32 || (im->esz == 2 && g->K % 2 == 0)) && kc == g->K &&
                        g->ldb == g->K;
    /* the bytes of B's source per k in one panel's run (48 rows of fp32, or of bf16), prefetched per row */
    const int nt_pf_row = g->b_f32 || !im->in_bf16 ? 256 : 128;
    /* split [n0,n1) into equal chunks of at most nc columns (multiples of nr) */
    int64_t len = n1 - n0, nchunks = ceil_div(len, im->nc);
    int64_t chunk = ceil_div(ceil_div(len, nchunks), nr) * nr;
    for (int64_t jc = n0; jc < n1; jc += chunk) {
        int64_t ncur = imin64(chunk, n1 - jc);
        int64_t npb = ceil_div(ncur, nr);
        /* Note [Packing B in the first tile]: full panels are packed one at a time in the panel walk */
        const int64_t nfull = fuse_b || nt_walk ? ncur / nr : 0;
        if (p->bshared) /* the team packed every panel (Note [Shared B panels]) */
            bpack = p->bshared + (size_t)(jc / nr) * bpanel;
        else if (nfull < npb)
            im->pack_b(g, jc + nfull * nr, ncur - nfull * nr, k0, kc, nr, bpack + (size_t)nfull * bpanel);
        if (nfull) { /* panel by panel into the chunk's first slot (Note [Packing B in the first tile]) */
            const size_t bsz = g->b_f32 || !im->in_bf16 ? sizeof(float) : sizeof(uint16_t);
            const char *B = (const char *)g->B + (size_t)(k0 * g->ldb + jc) * bsz;
            const int pf_tiles =
                npa > PB_PF_TILES_L2 && l2_holds_two_chunks(im) ? PB_PF_TILES_L2 : PB_PF_TILES;
            const int64_t pf_from = im->kernel_pf ? imax64(1, npa - pf_tiles) : npa;
            /* with kernel_round the tiles are rounded in its writeback (Note [Rounding in the writeback]) */
            const int rnd = im->kernel_round && (bias_late || round_out);
            for (int64_t q = 0; q < nfull; q++) {
                const float *lb = bias_late ? g->bias + jc + q * nr : NULL;
                if (nt_walk) im->pack_b(g, jc + q * nr, nr, k0, kc, nr, bpack);
                for (int64_t pa = 0; pa < npa; pa++) {
                    int mi = (int)imin64(mr, mcur - pa * mr);
                    const char *a = ua ? apack : apack + pa * apanel;
                    const int rows = ua && mi == mr;
                    const float *ar = rows ? ua + pa * mr * g->lda : (const float *)a;
                    float *c = g->C + (ic + pa * mr) * g->ldc + jc + q * nr;
                    if (bias_first) tile_bias(c, g->ldc, bias_first + jc + q * nr, mi, nr);
                    if (pa == 0 && !nt_walk) {
                        im->kernel_pb(ksteps, rows ? (const void *)ar : a, rows ? g->lda : 0,
                                      B + (size_t)(q * nr) * bsz, g->ldb, g->b_f32, bpack, c, g->ldc,
                                      g->alpha, beta, rnd ? lb : NULL, rnd, mi);
                    } else if (pa >= pf_from && jc + (q + 2) * nr <= n1) {
                        /* the last pf_tiles tiles bring the next full panel's rows of B into L1, a
                         * 1 / pf_tiles of them each (a prefetch past B's end is dropped, never a fault) */
                        const int64_t r0 = (pa - pf_from) * (kc / pf_tiles);
                        if (nt_walk) /* the next panel's run, kc x nt_pf_row / pf_tiles bytes per tile */
                            im->kernel_pf(ksteps, rows ? (const void *)ar : a, rows ? g->lda : 0, bpack, c,
                                          g->ldc, g->alpha, beta, rnd ? lb : NULL, rnd, mi,
                                          (const char *)g->B + (size_t)((jc + (q + 1) * nr) * g->ldb) * bsz +
                                              (size_t)(r0 * nt_pf_row),
                                          nt_pf_row, nt_pf_row, pf_tiles);
                        else
                            im->kernel_pf(ksteps, rows ? (const void *)ar : a, rows ? g->lda : 0, bpack, c,
                                          g->ldc, g->alpha, beta, rnd ? lb : NULL, rnd, mi,
                                          B + (size_t)((q + 1) * nr + r0 * g->ldb) * bsz,
                                          g->ldb * (int64_t)bsz, (int)(nr * bsz), pf_tiles);
                    } else if (rnd) {
                        im->kernel_round(ksteps, a, bpack, c, g->ldc, g->alpha, beta, lb, 0, mi, nr);
                    } else {
                        if (rows)
                            im->kernel_ua(ksteps, ar, g->lda, bpack, c, g->ldc, g->alpha, beta, mi, nr);
                        else
                            im->kernel(ksteps, a, bpack, c, g->ldc, g->alpha, beta, mi, nr);
                    }
                    if (rnd) continue;
                    if (bias_late)
                        round_rows_bias(c, g->ldc, g->bias + jc + q * nr, mi, nr);
                    else if (round_out)
                        sl_round_bf16_rows(c, g->ldc, c, g->ldc, mi, nr, 0);
                }
            }
        }
        for (int64_t pa = 0; pa < npa && nfull < npb; pa++) {
            int mi = (int)imin64(mr, mcur - pa * mr);
            /* unpacked A: full panels read in place, the partial one packed alone (Note [Unpacked A]) */
            const char *a = ua ? apack : apack + pa * apanel;
            float *crow = g->C + (ic + pa * mr) * g->ldc + jc;
            if (ua && mi == mr) {
                for (int64_t q = nfull; q < npb; q++) {
                    int nj = (int)imin64(nr, ncur - q * nr);
                    if (bias_first) tile_bias(crow + q * nr, g->ldc, bias_first + jc + q * nr, mi, nj);
                    im->kernel_ua(ksteps, ua + pa * mr * g->lda, g->lda, bpack + q * bpanel, crow + q * nr,
                                  g->ldc, g->alpha, beta, mi, nj);
                    if (round_out)
                        sl_round_bf16_rows(crow + q * nr, g->ldc, crow + q * nr, g->ldc, mi, nj, 0);
                }
                continue;
            }
            for (int64_t q = nfull; q < npb; q++) {
                int nj = (int)imin64(nr, ncur - q * nr);
                if (bias_first) tile_bias(crow + q * nr, g->ldc, bias_first + jc + q * nr, mi, nj);
                if (im->kernel_round &&
                    (tile || bias_late || round_out)) { /* Note [Rounding in the writeback] */
                    const int add = tile && g->c_round == SL_GEMM_ROUND_ADD;
                    im->kernel_round(ksteps, a, bpack + q * bpanel, crow + q * nr, g->ldc,
                                     tile ? 1.0f : g->alpha, tile ? 0.0f : beta,
                                     bias_late ? g->bias + jc + q * nr : NULL, add, mi, nj);
                    continue;
                }
                if (tile) { /* Note [Rounded products in the GEMM] */
                    im->kernel(ksteps, a, bpack + q * bpanel, tile, nr, 1.0f, 0.0f, mi, nj);
                    sl_round_bf16_rows(crow + q * nr, g->ldc, tile, nr, mi, nj,
                                       g->c_round == SL_GEMM_ROUND_ADD);
                    continue;
                }
                im->kernel(ksteps, a, bpack + q * bpanel, crow + q * nr, g->ldc, g->alpha, beta, mi, nj);
                if (bias_late)
                    round_rows_bias(crow + q * nr, g->ldc, g->bias + jc + q * nr, mi, nj);
                else if (round_out)
                    sl_round_bf16_rows(crow + q * nr, g->ldc, crow + q * nr, g->ldc, mi, nj, 0);
            }
        }
    }
}

/* Note [Even K blocks]
 * C is read and written once per K block. Blocks of exactly kc leave a short last block when K is not a
 * multiple of kc: K = 1024 at kc 768 ran a full block and a 256-deep one, which writes C a second time for a
 * third of the work. An impl with kc_even cuts K into ceil(K / kc) equal blocks instead (1024: two of 512).
 * The blocks depend only on K, so every partition still sums each element of C in the same order
 * (Note [GEMM structure]). dW shapes with K = 1024, 1 thread: +1-2 %. */

/* Unit `u` of the plan (Note [GEMM units]) is a block of C, C[m0:m1, n0:n1]; the thread that claims it packs
 * its own A blocks and B chunks into its own workspace. Threads never wait for each other: on a shared
 * machine a descheduled thread delays only the unit it holds (sharing one packed A block would need a
 * barrier per K block, and every barrier would wait for the slowest thread). The price is packing the
 * other operand once per unit, which the split choice in sl_gemm_run keeps to the smaller of A and B. */
static void gemm_unit(const gemm_plan *p, int u, char *apack, char *bpack, float *tile) {
    const sl_gemm_args *g = p->g;
    const sl_gemm_impl *im = p->im;
    int64_t m0 = 0, m1 = g->M, n0 = 0, n1 = g->N;
    if (p->split_n) {
        n0 = imin64(g->N, p->ubound[u] * im->nr);
        n1 = imin64(g->N, p->ubound[u + 1] * im->nr);
    } else {
        m0 = imin64(g->M, p->ubound[u] * im->mr);
        m1 = imin64(g->M, p->ubound[u + 1] * im->mr);
    }
    if (m1 <= m0 || n1 <= n0) return;
    const int64_t mc = m1 - m0 <= imax64(im->mc, im->mc_max) ? m1 - m0 : im->mc;
    const int ua = !__atomic_load_n(&g_ua_off, __ATOMIC_RELAXED) && im->kernel_ua && !g->transA &&
                   (!g->c_round || g->c_round == SL_GEMM_ROUND_OUT) && !g->b_f32;
    for (int64_t ic = m0; ic < m1; ic += mc) {
        int64_t mcur = imin64(mc, m1 - ic);
        for (int64_t k0 = 0; k0 < g->K; k0 += p->kc) {
            int64_t kc = imin64(p->kc, g->K - k0);
            if (!ua) {
                im->pack_a(g, ic, mcur, k0, kc, im->mr, apack);
                block_times_b(p, apack, NULL, ic, mcur, k0, kc, n0, n1, bpack, tile);
                continue;
            }
            int64_t full = mcur / im->mr * im->mr; /* only the partial panel is packed */
            if (full < mcur) im->pack_a(g, ic + full, mcur - full, k0, kc, im->mr, apack);
            block_times_b(p, apack, (const float *)g->A + ic * g->lda + k0, ic, mcur, k0, kc, n0, n1, bpack,
                          tile);
        }
    }
}

/* Thread `tid` claims units until none is left. */
static void gemm_thread(gemm_plan *p, int tid) {
    const sl_gemm_args *g = p->g;
    const sl_gemm_impl *im = p->im;
    char *apack = p->ws + (size_t)tid * (p->a_bytes + p->b_bytes);
    char *bpack = apack + p->a_bytes;
    float tile_buf[SL_GEMM_TILE_MAX] __attribute__((aligned(64))); /* sl_gemm_rounded checks mr x nr fits */
    float *tile = g->c_round == SL_GEMM_ROUND_STORE || g->c_round == SL_GEMM_ROUND_ADD ? tile_buf : NULL;
    if (im->thread_begin) im->thread_begin();
    for (;;) {
        int u = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (u >= p->units) break;
        gemm_unit(p, u, apack, bpack, tile);
    }
    if (im->thread_end) im->thread_end();
}

/* Note [GEMM units]
 * The split dimension's micro-panels are dealt in units, and each thread claims the next unit from a shared
 * counter until none is left. On a quiet machine there is one unit per thread, of equal size (the static
 * split: a thread that is late to wake leaves its unit to whichever thread is free). In the shared mode
 * (Note [Binding on a shared machine]) there are GEMM_UNITS_SHARED per thread, so a thread that shares its
 * CPU with a neighbour takes fewer of them. A unit packs the other operand for itself, so units cost packing:
 * 3-7 % on GPT-2 shapes with 2 units per thread on a quiet machine, 10-20 % with guided sizes; hence one
 * unit per thread unless the machine is shared, or B is packed once for the team (Note [Shared B panels]:
 * then a unit packs only its own rows of A, and the rows go in GEMM_UNITS_SHARED_B units per thread). No
 * result depends on the units: each C element is computed whole by one thread, in the same K order. */
enum { GEMM_UNITS_SHARED = 4 };

static void plan_units(gemm_plan *p, int64_t panels, int per_thread) {
    int64_t n = p->nthr > 1 && sl_threads_shared() ? (int64_t)GEMM_UNITS_SHARED * p->nthr
                                                   : (int64_t)per_thread * p->nthr;
    n = imin64(imin64(n, panels), GEMM_UNITS_MAX);
    if (n < 1) n = 1;
    for (int64_t i = 0; i <= n; i++) p->ubound[i] = panels * i / n;
    p->units = (int)n;
}

/* Load balance of splitting `panels` micro-panels over nthr threads (1 = perfect). */
static double split_balance(int64_t panels, int nthr) {
    return (double)panels / ((double)nthr * (double)ceil_div(panels, nthr));
}

/* Note [Shared B panels]
 * With the M dimension split, every unit multiplies its rows by all of op(B), and a unit packs each B chunk
 * it needs for itself (Note [GEMM units]): on the small model's products (K <= 768, N <= 512) each of two
 * threads packed all of B, the f32 weights rounded to bf16 as they are packed (Note [Fused weight casts]),
 * ~5 % of the bf16 step, half of it the same work done twice. When the call has one K block, the machine
 * is quiet and all of packed B fits SHARED_B_MAX, the team packs B once instead: each
 * thread packs its share of the panels into one buffer, one barrier, and every unit reads the panels it
 * needs from there. The panels are those a unit would have packed (packing is per panel: a chunk is whole
 * panels), so every product is unchanged to the bit. A shared machine keeps the per-unit packing: there a
 * barrier would wait for the thread that shares its CPU. With B shared, a unit costs no packing beyond its
 * own rows of A, so the rows are dealt in GEMM_UNITS_SHARED_B units per thread, claimed by whichever thread
 * is free: within a training step the two threads of this VM finish equal halves up to ~10 % apart. The 12
 * shapes of the baby bf16 step, each call's variant drawn at random within one run (2 threads): 1.877 ->
 * 1.847 s over 300 steps with the machine at full speed, 2.826 -> 2.577 s in its slow phase. Alone in a loop
 * (warm caches, nothing else running) the finer units measure within noise of one per thread. */
enum { SHARED_B_MAX = 1 << 20, GEMM_UNITS_SHARED_B = 4 };
static size_t shared_panel_bytes(const gemm_plan *p) {
    const sl_gemm_impl *im = p->im;
    return (size_t)ceil_div(p->g->K, im->kgran) * (size_t)im->kgran * (size_t)im->nr * (size_t)im->esz;
}
static size_t shared_b_bytes(const gemm_plan *p) {
    const sl_gemm_args *g = p->g;
    if (p->nthr < 2 || p->split_n || g->K > p->kc || sl_threads_shared()) return 0;
    size_t bytes = (size_t)ceil_div(g->N, p->im->nr) * shared_panel_bytes(p);
    return bytes <= SHARED_B_MAX ? round_up_sz(bytes, 4096) : 0;
}

/* Last resort when the workspace cannot be allocated: correct, unblocked, slow. */
static void gemm_unpacked(const sl_gemm_args *g, const sl_gemm_impl *im) {
    int bf16 = im->in_bf16;
    for (int64_t i = 0; i < g->M; i++) {
        for (int64_t j = 0; j < g->N; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < g->K; k++) {
                int64_t ia = g->transA ? k * g->lda + i : i * g->lda + k;
                int64_t ib = g->transB ? j * g->ldb + k : k * g->ldb + j;
                float a = bf16 ? sl_bf16_to_f32(((const uint16_t *)g->A)[ia]) : ((const float *)g->A)[ia];
                float b = g->b_f32 ? sl_bf16_to_f32(sl_f32_to_bf16(((const float *)g->B)[ib]))
                          : bf16   ? sl_bf16_to_f32(((const uint16_t *)g->B)[ib])
                                   : ((const float *)g->B)[ib];
                s += a * b;
            }
            float *c = g->C + i * g->ldc + j;
            if (g->c_round == SL_GEMM_ROUND_STORE || g->c_round == SL_GEMM_ROUND_ADD)
                *c = g->c_round == SL_GEMM_ROUND_ADD ? *c + sl_round_bf16_f32(s) : sl_round_bf16_f32(s);
            else if (g->bias)
                *c = g->bias[j] + g->alpha * s;
            else
                *c = g->beta == 0.0f ? g->alpha * s : g->alpha * s + g->beta * *c;
            if (g->c_round == SL_GEMM_ROUND_OUT) *c = sl_round_bf16_f32(*c);
        }
    }
}

void sl_gemm_run(const sl_gemm_args *g, const sl_gemm_impl *im, int nthr) {
    if (g->M <= 0 || g->N <= 0) return;
    if (g->K <= 0 || g->alpha == 0.0f) {
        scale_c(g);
        if (g->c_round == SL_GEMM_ROUND_OUT) sl_round_bf16_rows(g->C, g->ldc, g->C, g->ldc, g->M, g->N, 0);
        return;
    }
    /* Threads only pay off with enough work: ~4 MFLOP per thread. */
    double flops = 2.0 * (double)g->M * (double)g->N * (double)g->K;
    if (nthr > 1 && flops < 4e6 * nthr) nthr = (int)(flops / 4e6) > 1 ? (int)(flops / 4e6) : 1;
    if (nthr < 1) nthr = 1;

    gemm_plan p = {.g = g, .im = im, .nthr = nthr};
    int64_t kc = imin64(im->kc, ceil_div(g->K, im->kgran) * im->kgran);
    if (im->kc_even) /* Note [Even K blocks] */
        kc = ceil_div(ceil_div(g->K, ceil_div(g->K, kc)), im->kgran) * im->kgran;
    p.kc = kc;
    int64_t mc = imin64(imax64(im->mc, im->mc_max), ceil_div(g->M, im->mr) * im->mr);
    int64_t nc = imin64(im->nc, ceil_div(g->N, im->nr) * im->nr);
    p.a_bytes = round_up_sz((size_t)mc * (size_t)kc * (size_t)im->esz, 4096);
    p.b_bytes = round_up_sz((size_t)nc * (size_t)kc * (size_t)im->esz, 4096);
    /* Split the dimension that shares out more evenly; if both do, split N when A is the smaller operand
     * (each thread then packs all of A) and M otherwise (each packs all of B). */
    double bal_n = split_balance(ceil_div(g->N, im->nr), nthr),
           bal_m = split_balance(ceil_div(g->M, im->mr), nthr);
    p.split_n = bal_n > bal_m + 0.05 ? 1 : bal_m > bal_n + 0.05 ? 0 : g->M <= g->N;
    size_t shared = shared_b_bytes(&p);
    plan_units(&p, p.split_n ? ceil_div(g->N, im->nr) : ceil_div(g->M, im->mr),
               shared ? GEMM_UNITS_SHARED_B : 1); /* Note [GEMM units] */
    size_t total = (size_t)nthr * (p.a_bytes + p.b_bytes);
    p.ws = (char *)sl_gemm_tlbuf(SL_GEMM_TLB_PACK, total + shared);
    if (!p.ws) {
        SL_LOGW("sl_gemm: cannot allocate %zu bytes of packing workspace; using the slow unpacked loop",
                total);
        gemm_unpacked(g, im);
        return;
    }
    if (nthr == 1) {
        gemm_thread(&p, 0);
        return;
    }
#ifdef _OPENMP
    if (shared) p.bshared = p.ws + total;
#pragma omp parallel num_threads(nthr)
    {
        /* The runtime may give fewer threads than asked: the units are claimed by whoever runs, and the
         * shared panels are split among the threads there are. */
        if (p.bshared) {
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            int64_t np = ceil_div(g->N, im->nr), p0 = np * t / nt, p1 = np * (t + 1) / nt;
            if (p1 > p0)
                im->pack_b(g, p0 * im->nr, imin64(g->N, p1 * im->nr) - p0 * im->nr, 0, g->K, im->nr,
                           p.bshared + (size_t)p0 * shared_panel_bytes(&p));
#pragma omp barrier
        }
        if (omp_get_thread_num() < nthr) gemm_thread(&p, omp_get_thread_num());
    }
#else
    gemm_thread(&p, 0);
#endif
}

/* ------------------------------------------------------------------------------------------------ */
/* Dispatch and entry points                                                                        */

typedef struct gemm_dispatch {
    const sl_gemm_impl *f32, *bf16;
    const sl_gemv_impl *gemv;
    const char *name;
} gemm_dispatch;

/* Note [Widened bf16 GEMM]
 * vdpbf16ps does 64 FLOP an instruction where a zmm FMA does 32, but not every core issues it as often: on
 * Zen 4 it runs at the FMA's rate, two a cycle, twice the FLOP; on the Intel Xeon (Sapphire / Emerald
 * Rapids) of a VM that hides AMX, at one every two cycles (probe: 86 GFLOP/s against the FMAs' 165 on one
 * core), half the FMAs' FLOP. oneDNN's gemm_bf16bf16f32 runs its vdpbf16ps kernels there and reaches 72-85
 * GFLOP/s, and so did suanli's. Widening bf16 to fp32 is exact, and so is the product of two widened
 * values, so the fp32 kernel on operands widened while they are packed (gemm_avx512_widen.inc) computes the
 * same products in fp32 sums, at the FMAs' rate: 1.6-1.8x oneDNN's bf16 GEMM there (docs/BENCHMARKS.md).
 * The first bf16 call times both instructions (24 chains each, the best of 4 runs, under 1 ms) and keeps
 * vdpbf16ps where its FLOP/s reach 0.75 of the FMAs' (at equal rates it still wins: half the bytes packed
 * and loaded per FLOP). SUANLI_BF16_GEMM=dp or =widened chooses without the probe (tests, A/B runs). The
 * two paths differ only in how the exact products are summed (pairwise in vdpbf16ps, one by one here);
 * the widened path is the one AVX-512 hosts without AVX512_BF16 run. */
static int bf16_dp_fast(void) {
    const char *e = getenv("SUANLI_BF16_GEMM");
    if (e && !strcmp(e, "dp")) return 1;
    if (e && !strcmp(e, "widened")) return 0;
    if (e && *e) SL_LOGW("SUANLI_BF16_GEMM=%s: not dp or widened; ignored", e);
#if SL_HAVE_X86
    return sl_gemm_avx512_dp_ratio() >= 0.75;
#else
    return 1;
#endif
}

static gemm_dispatch g_dispatch;
static pthread_once_t dispatch_once = PTHREAD_ONCE_INIT;
/* once per process: the bf16 probe must not give racing first calls two answers */
static void dispatch_init(void) {
    const sl_cpu_features *f = sl_cpu_features_get();
    gemm_dispatch t = {&impl_scalar_f32, &impl_scalar_bf16, &sl_gemv_scalar, "scalar"};
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx2 && f->fma) {
        t.f32 = &sl_gemm_impl_avx512_f32;
        t.bf16 = f->amx_bf16                        ? &sl_gemm_impl_amx_bf16
                 : f->avx512_bf16 && bf16_dp_fast() ? &sl_gemm_impl_avx512_bf16
                                                    : &sl_gemm_impl_avx512_bf16emu;
        t.gemv = f->avx512_bf16 ? &sl_gemv_avx512_bf16 : &sl_gemv_avx512;
        t.name = "avx512";
    } else if (f->avx2 && f->fma) {
        t.f32 = &sl_gemm_impl_avx2_f32;
        t.bf16 = &sl_gemm_impl_avx2_bf16emu;
        t.gemv = &sl_gemv_avx2;
        t.name = "avx2";
    }
    g_dispatch = t;
}

static const gemm_dispatch *dispatch_get(void) {
    pthread_once(&dispatch_once, dispatch_init);
    return &g_dispatch;
}

const char *sl_gemm_kernel_name(void) { return dispatch_get()->name; }
const char *sl_gemm_bf16_kernel_name(void) {
    const sl_gemm_impl *im = dispatch_get()->bf16;
    return im == &sl_gemm_impl_amx_bf16         ? "amx"
           : im == &sl_gemm_impl_avx512_bf16    ? "avx512_bf16"
           : im == &sl_gemm_impl_avx512_bf16emu ? "avx512_widened" /* Note [Widened bf16 GEMM] */
                                                : im->name;        /* fp32 kernels on widened bf16 */
}

static int threads_for_call(void) {
#ifdef _OPENMP
    if (omp_in_parallel()) return 1;
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* one row (decode): the GEMV, which reads B once (Note [GEMV for decoding]); else the blocked GEMM */
static void run_f32(const sl_gemm_args *g) {
    const gemm_dispatch *d = dispatch_get();
    int nthr = threads_for_call();
    if (!sl_gemv_run(g, d->gemv, 0, nthr)) sl_gemm_run(g, d->f32, nthr);
}
/* fp32 B for a kernel that packs bf16 only (or the GEMV): B rounded (the CAST kernel's conversion: the same
 * bits as a CAST node's) into a per-thread buffer, BROUND_COLS columns of op(B) at a time. The chunks start
 * at multiples of every kernel's nr (48, 32, 16), so each element of C lands in the same kind of tile and
 * is summed in the same order as in one call: bitwise sl_gemm_bf16 on a rounded copy of B (Note [Fused
 * weight casts], src/ops/backward.c), with a buffer of at most BROUND_COLS x K instead of all of B. */
enum { BROUND_COLS = 4800 };

static void run_bf16_rounded_b(const sl_gemm_args *g, const gemm_dispatch *d, int nthr) {
    const float *B = (const float *)g->B;
    const int64_t chunk = g->N < BROUND_COLS ? g->N : BROUND_COLS;
    uint16_t *buf =
        sl_gemm_tlbuf(SL_GEMM_TLB_BROUND, (size_t)(chunk * (g->K > 0 ? g->K : 1)) * sizeof(uint16_t));
    if (!buf) {
        SL_LOGW("sl_gemm: cannot allocate the rounded copy of B; using the slow unpacked loop");
        gemm_unpacked(g, d->bf16);
        return;
    }
    for (int64_t j0 = 0; j0 < g->N; j0 += chunk) {
        const int64_t nj = g->N - j0 < chunk ? g->N - j0 : chunk;
        sl_gemm_args r = *g;
        if (g->transB) { /* rows j0 .. j0+nj of the N x K matrix */
            if (g->ldb == g->K)
                sl_k_cast_f32_bf16(B + j0 * g->ldb, buf, nj * g->K);
            else
                for (int64_t j = 0; j < nj; j++)
                    sl_k_cast_f32_bf16(B + (j0 + j) * g->ldb, buf + j * g->K, g->K);
            r.ldb = g->K;
        } else { /* columns j0 .. j0+nj of the K x N matrix */
            if (g->ldb == nj && j0 == 0)
                sl_k_cast_f32_bf16(B, buf, g->K * nj);
            else
                for (int64_t k = 0; k < g->K; k++) sl_k_cast_f32_bf16(B + k * g->ldb + j0, buf + k * nj, nj);
            r.ldb = nj;
        }
        r.B = buf;
        r.N = nj;
        r.C = g->C + j0;
        r.bias = g->bias ? g->bias + j0 : NULL;
        r.b_f32 = 0;
        if (!sl_gemv_run(&r, d->gemv, 1, nthr)) sl_gemm_run(&r, d->bf16, nthr);
    }
}

static void run_bf16(const sl_gemm_args *g) {
    const gemm_dispatch *d = dispatch_get();
    int nthr = threads_for_call();
    if (g->b_f32 && (g->M == 1 || !d->bf16->b_f32)) {
        run_bf16_rounded_b(g, d, nthr);
        return;
    }
    if (sl_gemv_run(g, d->gemv, 1, nthr)) return;
    if (d->bf16 == &sl_gemm_impl_amx_bf16 && sl_gemm_amx_few_rows(g, nthr)) return; /* a prompt's rows */
    sl_gemm_run(g, d->bf16, nthr);
}

void sl_sgemm(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    sl_gemm_args g = {transA, transB, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, NULL, 0, 0};
    run_f32(&g);
}

void sl_gemm_bf16(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A,
                  int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    sl_gemm_args g = {transA, transB, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, NULL, 0, 0};
    run_bf16(&g);
}

void sl_sgemm_bias(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                   int64_t lda, const float *B, int64_t ldb, const float *bias, float *C, int64_t ldc) {
    sl_gemm_args g = {transA, transB, M, N, K, alpha, 0.0f, A, lda, B, ldb, C, ldc, bias, 0, 0};
    run_f32(&g);
}

void sl_gemm_bf16_bias(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, const float *bias,
                       float *C, int64_t ldc) {
    sl_gemm_args g = {transA, transB, M, N, K, alpha, 0.0f, A, lda, B, ldb, C, ldc, bias, 0, 0};
    run_bf16(&g);
}

void sl_gemm_bf16_f32b(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       const float *bias, float *C, int64_t ldc) {
    sl_gemm_args g = {transA, transB, M, N, K, alpha, bias ? 0.0f : beta, A, lda, B, ldb, C, ldc, bias, 1, 0};
    run_bf16(&g);
}

/* Note [Rounded Linear outputs]
 * Under bf16 autocast a Linear's output is a bf16 tensor that the fp32 ops after it read widened: built as
 * cast(cast(y, bf16), f32) after the GEMM, two passes that read 4 + 2 and write 2 + 4 bytes per element
 * (GPT-2 124M at B4 T64: about 380 MB per step in forward alone, with the logits). SL_GEMM_ROUND_OUT rounds
 * each element of C (sl_round_bf16_f32: the CAST kernel's rounding, exact on the way back) once its value
 * is final: in the blocked driver each micro-tile right after the kernel call of the last K block, while
 * it is in L1, and in the GEMV and the fallback loop each element after its epilogue. The rounded values
 * are those of the two casts applied to the unrounded product, bit for bit, for any K (unlike the tile
 * path of Note [Rounded products in the GEMM], which must see a tile's whole sum in one K block). */
void sl_gemm_bf16_f32b_round(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                             const uint16_t *A, int64_t lda, const float *B, int64_t ldb, float beta,
                             const float *bias, float *C, int64_t ldc) {
    sl_gemm_args g = {transA, transB, M, N,   K,    alpha, bias ? 0.0f : beta, A, lda,
                      B,      ldb,    C, ldc, bias, 1,     SL_GEMM_ROUND_OUT};
    run_bf16(&g);
}

/* Note [Rounding in the writeback]
 * The roundings of Note [Rounded products in the GEMM] (stored or added) and Note [Rounded Linear outputs]
 * (with a late bias or without) each followed the kernel as a pass of its own over the finished micro-tile:
 * the kernel stored it (to C, or to the stack tile), and a loop per row loaded it back, rounded it and stored
 * it again. An impl with kernel_round does it in the kernel's writeback, on the sums still in registers: the
 * same operations on the same values in the same order (alpha, then beta as the plain writeback, then the
 * bias, then sl_round_bf16_f32; or C plus the rounded sum), so the same bits (test_gemm against the two
 * passes; test_gemm_avx512_emu runs both on every host through SIMDe, with the integer rounding, since
 * SIMDe has no vcvtneps2bf16; test_gemm's subnormal case covers that instruction's fallback where the CPU
 * has it). The kernel also prefetches the tile of C it will add to, where the rounded-product pass found the
 * gradient's lines cold. GPT-2 124M's forward and weight-gradient GEMMs (B4 T64, Zen 4): 3-5 % faster in a
 * loop at 1 and 2 threads; the whole bf16 step at 1 thread, two builds side by side: 1238 -> 1206 ms (mean
 * of 6). The small model's K = 128 products measure the same either way (their C stays in cache). */

/* Note [Rounded products in the GEMM]
 * Under autocast a weight's gradient is the bf16 GEMM's output rounded to bf16 and added to the fp32 .grad
 * (Note [Rounded weight gradients], src/ops/ops_internal.h). Done as two passes, the GEMM wrote the fp32
 * product to a scratch and a loop read it back, read the gradient and wrote it: 1.5 GB of memory traffic
 * per GPT-2 124M step beside the GEMM's own 0.5 GB, 6 % of the bf16 step on an AMX host. When K fits in
 * one K block of the kernel (K <= kc: the token count of a micro-batch, up to 1,024 on AMX and 384-768 on
 * the others), each micro-tile's sum is complete when the kernel returns; the driver then has the kernel
 * write the tile to a stack buffer (beta 0, ldc = nr: in L1) and rounds it into C (store or add), so C is
 * read and written once and the product never reaches memory. The same values are rounded with the same
 * function as in the two passes, so the result is bitwise theirs (test_gemm checks it for every kernel);
 * K above kc keeps the two passes (a tile's sum is spread over K blocks). */
#if SL_HAVE_X86
__attribute__((target("avx512f,avx512bw"))) static void round_row_avx512(float *c, const float *t, int64_t n,
                                                                         int add) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 v = sl_round_bf16_avx512(_mm512_maskz_loadu_ps(m, t + j));
        if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, c + j), v);
        _mm512_mask_storeu_ps(c + j, m, v);
    }
}
#endif

void sl_round_bf16_rows(float *c, int64_t ldc, const float *t, int64_t ldt, int64_t rows, int64_t n,
                        int add) {
#if SL_HAVE_X86
    if (sl_kern_isa() >= SL_KISA_AVX512 && sl_cpu_features_get()->avx512bw) {
        for (int64_t i = 0; i < rows; i++) round_row_avx512(c + i * ldc, t + i * ldt, n, add);
        return;
    }
#endif
    for (int64_t i = 0; i < rows; i++) {
        float *ci = c + i * ldc;
        const float *ti = t + i * ldt;
        if (add)
            for (int64_t j = 0; j < n; j++) ci[j] += sl_round_bf16_f32(ti[j]);
        else
            for (int64_t j = 0; j < n; j++) ci[j] = sl_round_bf16_f32(ti[j]);
    }
}

int sl_gemm_rounded(int in_bf16, int transA, int transB, int64_t M, int64_t N, int64_t K, const void *A,
                    int64_t lda, const void *B, int64_t ldb, float *C, int64_t ldc, int add) {
    const gemm_dispatch *d = dispatch_get();
    const sl_gemm_impl *im = in_bf16 ? d->bf16 : d->f32;
    if (M <= 1 || N <= 0 || K <= 0 || K > im->kc || im->mr * im->nr > SL_GEMM_TILE_MAX) return 0;
    sl_gemm_args g = {transA, transB, M,   N, K,   1.0f, 0.0f, A,
                      lda,    B,      ldb, C, ldc, NULL, 0,    add ? SL_GEMM_ROUND_ADD : SL_GEMM_ROUND_STORE};
    sl_gemm_run(&g, im, threads_for_call());
    return 1;
}

void sl_sgemm_batched(int transA, int transB, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, int64_t strideA, const float *B, int64_t ldb,
                      int64_t strideB, float beta, float *C, int64_t ldc, int64_t strideC) {
    const sl_gemm_impl *im = dispatch_get()->f32;
    int nthr = threads_for_call();
    if (batch <= 0) return;
    /* Many small problems: one thread per problem. Few: thread inside each. Either way each problem is
     * computed by the same single-problem code, so the result does not depend on the choice. */
    if (nthr > 1 && batch >= 2 * nthr) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nthr)
#endif
        for (int64_t b = 0; b < batch; b++) {
            sl_gemm_args g = {
                transA, transB,          M,   N,    K, alpha, beta, A + b * strideA, lda, B + b * strideB,
                ldb,    C + b * strideC, ldc, NULL, 0, 0};
            sl_gemm_run(&g, im, 1);
        }
    } else {
        for (int64_t b = 0; b < batch; b++) {
            sl_gemm_args g = {
                transA, transB,          M,   N,    K, alpha, beta, A + b * strideA, lda, B + b * strideB,
                ldb,    C + b * strideC, ldc, NULL, 0, 0};
            sl_gemm_run(&g, im, nthr);
        }
    }
}
