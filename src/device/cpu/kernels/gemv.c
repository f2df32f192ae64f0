/* gemv.c — the M = 1 case of the GEMM entry points: y[1,N] = x[1,K] @ B[N,K]^T (transB, the layout of
 * every Linear weight), fp32 or bf16 inputs, fp32 out.
 *
 * Note [GEMV for decoding]
 * Decoding one token multiplies one activation row by each weight matrix. The blocked GEMM would pack
 * all of B (read it, write a packed copy, read that again) for a single row of output: three passes over
 * memory where one is needed. Here each output is a dot product of x with one contiguous row of B, read
 * straight from memory once: bf16 rows through vdpbf16ps (AVX512_BF16: 32 bf16 pairs per instruction),
 * else widened to fp32 in registers (AVX-512F, AVX2) and summed with FMA; a scalar loop otherwise.
 * Rows are taken one after the other, so a thread reads its part of B as one sequential stream (the
 * hardware prefetcher's best case; interleaving four rows, i.e. four short streams of 2-22 KB each, measured
 * 0.55x the read probe on one Zen 4 core against 0.83-0.98x for one row at a time, CPU time), with four
 * accumulator vectors per row to cover the FMA / vdpbf16ps latency; x stays in L1. Threads take contiguous
 * ranges of rows (one OpenMP region per call, no other synchronisation). Each row is summed in an order
 * fixed by K and the kernel variant only (four accumulators over k, the leftover vectors into the first,
 * a masked or scalar tail, a fixed horizontal reduction), never by a thread's range: the result is bitwise
 * the same for any thread count, as for the blocked GEMM, but its rounding differs from the GEMM's (other
 * summation order, within the bound of test_gemv / test_gemm).
 * The AVX-512 kernels also prefetch the row 1 KiB ahead of the loads (GEMV_PF_BYTES; past a row's end that
 * is the next row, past B's end a prefetch, which never faults). On an Intel AMX host the hardware
 * prefetcher alone kept a bf16 GEMV at 0.75x of a read-only pass over the same bytes (20 of 26.7 GB/s on 2
 * threads, 90 MB matrices); with the prefetch 0.92x (24 GB/s); 512 B ahead 0.94x of a slower probe pass,
 * 4 KiB ahead 0.74x. Zen cores want the opposite (Note [GEMV prefetch on Zen]). */
/* Note [GEMV prefetch on Zen]
 * On Zen 4 (AMD EPYC, family 25 model 17) the Intel host's prefetch into L1 1 KiB ahead made the vdpbf16ps
 * GEMV slower than no prefetch at all: 16.9 against 20.8 GB/s on one core, 28.5 against 31.4 on two, with
 * the read probe at 22.2 / 32.3 (six 90 MB matrices, best of 6; docs/BENCHMARKS.md "Zen 4, third visit").
 * Prefetching into L2 (_MM_HINT_T1) 4 KiB ahead read at the probe's speed: 22.1 and 31.8 GB/s (2 KiB: 20.5
 * / 31.2, 6 KiB: 21.4 / 31.3, T2 4 KiB: 21.9 / 31.4). So on Zen cores (CPUID vendor AMD or Hygon,
 * sl_cpu_features.zen) the kernels prefetch GEMV_PF_FAR bytes ahead into L2; elsewhere as measured on
 * Intel. Only the prefetch differs: the sums are the same. The loop must not test `far` per iteration (that
 * alone held one core at 0.81x the probe): each kernel has a copy per value. In `bench generate` on that
 * host: TinyLlama-1.1B 12.5-13.0 -> 14.4-14.7 tokens/s (0.84-0.87 -> 0.93-0.96 of the probe's limit),
 * Llama-2-7B 2.98 -> 3.38 tokens/s when the probe read 59-61 GB/s. */
#include <immintrin.h>
#include <string.h>

#include "device/cpu/kernels/gemm_internal.h"
#include "device/cpu/kernels/simd_math.h"
#include "suanli/base.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define T_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define T_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define T_AVX2 __attribute__((target("avx2,fma")))
#define GEMV_PF_BYTES 1024
#define GEMV_PF_FAR 4096
/* prefetch the `bytes` (a multiple of 64) that follow p + GEMV_PF_BYTES into L1, or with far (Zen: Note
 * [GEMV prefetch on Zen]) those that follow p + GEMV_PF_FAR into L2 */
#define GEMV_PF(p, bytes, far)                                                                               \
    do {                                                                                                     \
        if (far)                                                                                             \
            for (int pf_ = 0; pf_ < (bytes); pf_ += 64)                                                      \
                _mm_prefetch((const char *)(p) + GEMV_PF_FAR + pf_, _MM_HINT_T1);                            \
        else                                                                                                 \
            for (int pf_ = 0; pf_ < (bytes); pf_ += 64)                                                      \
                _mm_prefetch((const char *)(p) + GEMV_PF_BYTES + pf_, _MM_HINT_T0);                          \
    } while (0)

static float bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- scalar ---- */
static void rows_f32_scalar(const void *x_, const void *b_, int64_t ldb, int64_t K, int64_t n, float *y) {
    const float *x = x_, *b = b_;
    for (int64_t j = 0; j < n; j++) {
        float s = 0;
        for (int64_t k = 0; k < K; k++) s += x[k] * b[j * ldb + k];
        y[j] = s;
    }
}
static void rows_bf16_scalar(const void *x_, const void *b_, int64_t ldb, int64_t K, int64_t n, float *y) {
    const uint16_t *x = x_, *b = b_;
    for (int64_t j = 0; j < n; j++) {
        float s = 0;
        for (int64_t k = 0; k < K; k++) s += bf(x[k]) * bf(b[j * ldb + k]);
        y[j] = s;
    }
}

/* ---- AVX2 (8 fp32 lanes; the K % 8 tail is summed in scalar after the horizontal sum) ---- */
T_AVX2 static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
T_AVX2 static __m256 ld8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#define ROWS_AVX2(NAME, T, LOAD, SCAL)                                                                       \
    T_AVX2 static void NAME(const void *x_, const void *b_, int64_t ldb, int64_t K, int64_t n, float *y) {   \
        const T *x = x_, *b = b_;                                                                            \
        for (int64_t j = 0; j < n; j++) {                                                                    \
            const T *r = b + j * ldb;                                                                        \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                      \
            int64_t k = 0;                                                                                   \
            for (; k + 32 <= K; k += 32) {                                                                   \
                a0 = _mm256_fmadd_ps(LOAD(x + k), LOAD(r + k), a0);                                          \
                a1 = _mm256_fmadd_ps(LOAD(x + k + 8), LOAD(r + k + 8), a1);                                  \
                a2 = _mm256_fmadd_ps(LOAD(x + k + 16), LOAD(r + k + 16), a2);                                \
                a3 = _mm256_fmadd_ps(LOAD(x + k + 24), LOAD(r + k + 24), a3);                                \
            }                                                                                                \
            for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(LOAD(x + k), LOAD(r + k), a0);                   \
            float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));                    \
            for (; k < K; k++) s += SCAL(x[k]) * SCAL(r[k]);                                                 \
            y[j] = s;                                                                                        \
        }                                                                                                    \
    }
#define ID(v) (v)
ROWS_AVX2(rows_f32_avx2, float, _mm256_loadu_ps, ID)
ROWS_AVX2(rows_bf16_avx2, uint16_t, ld8_bf16, bf)

/* ---- AVX-512 (16 fp32 lanes, masked tail; bf16 widened in registers) ---- */
T_AVX512 static __m512 ld16_f32(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
T_AVX512 static __m512 ld16_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
#define ROWS_AVX512(NAME, T, LOAD)                                                                           \
    T_AVX512 static inline __attribute__((always_inline)) void NAME##_body(                                  \
        const void *x_, const void *b_, int64_t ldb, int64_t K, int64_t n, float *y, const int far) {        \
        const T *x = x_, *b = b_;                                                                            \
        __mmask16 all = 0xffff, mt = (__mmask16)((1u << (K & 15)) - 1);                                      \
        for (int64_t j = 0; j < n; j++) {                                                                    \
            const T *r = b + j * ldb;                                                                        \
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                      \
            int64_t k = 0;                                                                                   \
            for (; k + 64 <= K; k += 64) {                                                                   \
                GEMV_PF(r + k, 64 * (int)sizeof(T), far);                                                    \
                a0 = _mm512_fmadd_ps(LOAD(x + k, all), LOAD(r + k, all), a0);                                \
                a1 = _mm512_fmadd_ps(LOAD(x + k + 16, all), LOAD(r + k + 16, all), a1);                      \
                a2 = _mm512_fmadd_ps(LOAD(x + k + 32, all), LOAD(r + k + 32, all), a2);                      \
                a3 = _mm512_fmadd_ps(LOAD(x + k + 48, all), LOAD(r + k + 48, all), a3);                      \
            }                                                                                                \
            for (; k + 16 <= K; k += 16) a0 = _mm512_fmadd_ps(LOAD(x + k, all), LOAD(r + k, all), a0);       \
            if (mt) a1 = _mm512_fmadd_ps(LOAD(x + k, mt), LOAD(r + k, mt), a1);                              \
            y[j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));        \
        }                                                                                                    \
    }                                                                                                        \
    T_AVX512 static void NAME(const void *x_, const void *b_, int64_t ldb, int64_t K, int64_t n, float *y) { \
        if (sl_cpu_features_get()->zen)                                                                      \
            NAME##_body(x_, b_, ldb, K, n, y, 1);                                                            \
        else                                                                                                 \
            NAME##_body(x_, b_, ldb, K, n, y, 0);                                                            \
    }
ROWS_AVX512(rows_f32_avx512, float, ld16_f32)
ROWS_AVX512(rows_bf16_avx512, uint16_t, ld16_bf16)

/* ---- AVX512_BF16: vdpbf16ps on 32 bf16 (16 pairs) per step, masked tail (zeros add nothing) ---- */
T_AVX512BF16 static __m512bh ld32_bf16(const uint16_t *p, __mmask32 m) {
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
}
/* far: a constant in each of the two copies below (the loop is not branching on it) */
T_AVX512BF16 static inline __attribute__((always_inline)) void rows_bf16_dp_body(const void *x_,
                                                                                 const void *b_, int64_t ldb,
                                                                                 int64_t K, int64_t n,
                                                                                 float *y, const int far) {
    const uint16_t *x = x_, *b = b_;
    __mmask32 all = 0xffffffffu, mt = (__mmask32)((1ull << (K & 31)) - 1);
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *r = b + j * ldb;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k + 128 <= K; k += 128) {
            GEMV_PF(r + k, 256, far);
            a0 = _mm512_dpbf16_ps(a0, ld32_bf16(x + k, all), ld32_bf16(r + k, all));
            a1 = _mm512_dpbf16_ps(a1, ld32_bf16(x + k + 32, all), ld32_bf16(r + k + 32, all));
            a2 = _mm512_dpbf16_ps(a2, ld32_bf16(x + k + 64, all), ld32_bf16(r + k + 64, all));
            a3 = _mm512_dpbf16_ps(a3, ld32_bf16(x + k + 96, all), ld32_bf16(r + k + 96, all));
        }
        for (; k + 32 <= K; k += 32) a0 = _mm512_dpbf16_ps(a0, ld32_bf16(x + k, all), ld32_bf16(r + k, all));
        if (mt) a1 = _mm512_dpbf16_ps(a1, ld32_bf16(x + k, mt), ld32_bf16(r + k, mt));
        y[j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}
T_AVX512BF16 static void rows_bf16_dp(const void *x_, const void *b_, int64_t ldb, int64_t K, int64_t n,
                                      float *y) {
    if (sl_cpu_features_get()->zen)
        rows_bf16_dp_body(x_, b_, ldb, K, n, y, 1);
    else
        rows_bf16_dp_body(x_, b_, ldb, K, n, y, 0);
}

const sl_gemv_impl sl_gemv_scalar = {"scalar", rows_f32_scalar, rows_bf16_scalar};
const sl_gemv_impl sl_gemv_avx2 = {"avx2", rows_f32_avx2, rows_bf16_avx2};
const sl_gemv_impl sl_gemv_avx512 = {"avx512", rows_f32_avx512, rows_bf16_avx512};
const sl_gemv_impl sl_gemv_avx512_bf16 = {"avx512_bf16", rows_f32_avx512, rows_bf16_dp};

/* rows [j0, j1) of C: dots in pieces of 64, then the GEMM's epilogue (alpha, beta or bias) */
static void gemv_range(const sl_gemm_args *g, sl_gemv_rows_fn fn, size_t esz, int64_t j0, int64_t j1) {
    float d[64];
    for (int64_t j = j0; j < j1; j += 64) {
        int64_t n = j1 - j < 64 ? j1 - j : 64;
        fn(g->A, (const char *)g->B + (size_t)(j * g->ldb) * esz, g->ldb, g->K, n, d);
        float *c = g->C + j;
        for (int64_t i = 0; i < n; i++) {
            float v = g->alpha * d[i];
            c[i] = g->bias ? g->bias[j + i] + v : g->beta == 0.0f ? v : v + g->beta * c[i];
            if (g->c_round == SL_GEMM_ROUND_OUT) c[i] = sl_round_bf16_f32(c[i]); /* gemm.c */
        }
    }
}

int sl_gemv_run(const sl_gemm_args *g, const sl_gemv_impl *im, int in_bf16, int nthr) {
    if (g->M != 1 || g->transA || !g->transB || g->N <= 0 || g->K <= 0) return 0;
    sl_gemv_rows_fn fn = in_bf16 ? im->rows_bf16 : im->rows_f32;
    size_t esz = in_bf16 ? 2 : 4;
    int64_t N = g->N;
    /* below ~32k multiply-adds one thread is faster than waking the others */
    if (nthr <= 1 || N * g->K < (1 << 15) || N < 8) {
        gemv_range(g, fn, esz, 0, N);
        return 1;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nthr)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        /* contiguous ranges, multiples of 4 rows (the kernels' groups) */
        int64_t groups = (N + 3) / 4, a = groups * t / nt * 4, b = groups * (t + 1) / nt * 4;
        if (b > N) b = N;
        if (a < b) gemv_range(g, fn, esz, a, b);
    }
#else
    gemv_range(g, fn, esz, 0, N);
#endif
    return 1;
}
