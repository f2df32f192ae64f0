/* test_gemm — sl_sgemm / sl_sgemm_batched / sl_gemm_bf16 against the double-accumulating reference.
 *
 * Run once per ISA path (ctest sets SUANLI_ISA=scalar|avx2|avx512). Covers awkward shapes (1, 3, 17, 63,
 * 65, 255, 1000), all four transpose cases, alpha/beta variants (beta = 0 on a NaN-filled C must not
 * propagate the NaN), leading dimensions larger than the row length, batched calls, bf16 inputs, and
 * bitwise determinism (run-to-run with the same thread count, and 1 thread vs 2 threads), and the bias
 * epilogue (sl_sgemm_bias, sl_gemm_bf16_bias).
 *
 * Tolerance: inputs are uniform in [-1, 1], so every product is at most 1 in magnitude and an fp32 sum of
 * K of them is within about K * 2^-24 of the exact sum; we allow |got - ref| <= 1e-6 * (K + 8) + 1e-5 * |ref|
 * (bf16: the reference rounds inputs to bf16 first, products of bf16 are exact in fp32, same bound). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels/gemm.h"
#include "device/cpu/kernels/gemm_internal.h"
#include "device/cpu/kernels/simd_math.h"
#include "suanli/base.h"
#include "testutil.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
static float *falloc(int64_t n) {
    float *p = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) abort();
    return p;
}
static void fill(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = frand();
}
static float tol_atol(int64_t K) { return 1e-6f * (float)(K + 8); }

/* Compare the M x N window (leading dimension ldc) of got against ref; untouched padding must match too. */
static int check_c(const char *what, const float *got, const float *ref, int64_t rows, int64_t ldc,
                   int64_t K) {
    return tu_allclose(what, got, ref, rows * ldc, tol_atol(K), 1e-5f);
}

typedef struct shape {
    int64_t M, N, K;
} shape;

static const shape shapes[] = {
    {1, 1, 1},     {1, 17, 3},    {3, 1, 17},     {17, 3, 1},     {63, 65, 17},   {65, 63, 255},
    {255, 17, 65}, {17, 255, 63}, {1000, 17, 63}, {3, 1000, 65},  {63, 65, 1000}, {255, 255, 255},
    {1000, 65, 3}, {8, 48, 384},  {97, 145, 769}, {1601, 33, 40}, /* more rows than one A block (AVX2: mc_max
                                                                     1536, blocks of 384) */
};

static int test_sgemm_case(int tA, int tB, shape s, float alpha, float beta, int pad, int nan_c) {
    int64_t M = s.M, N = s.N, K = s.K;
    int64_t lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N + pad;
    int64_t arows = tA ? K : M, brows = tB ? N : K;
    float *A = falloc(arows * lda), *B = falloc(brows * ldb), *C = falloc(M * ldc), *R = falloc(M * ldc);
    fill(A, arows * lda);
    fill(B, brows * ldb);
    fill(C, M * ldc);
    if (nan_c)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = NAN;
    memcpy(R, C, (size_t)(M * ldc) * sizeof(float));
    sl_sgemm_ref(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, R, ldc);
    sl_sgemm(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    char what[160];
    snprintf(what, sizeof what, "sgemm %s%s M=%lld N=%lld K=%lld alpha=%g beta=%g pad=%d nanC=%d",
             tA ? "T" : "N", tB ? "T" : "N", (long long)M, (long long)N, (long long)K, alpha, beta, pad,
             nan_c);
    int ok = check_c(what, C, R, M, ldc, K);
    TU_CHECK(ok, "%s", what);
    free(A), free(B), free(C), free(R);
    return ok;
}

static void test_sgemm_all(void) {
    int n = (int)(sizeof shapes / sizeof shapes[0]);
    for (int si = 0; si < n; si++) {
        for (int t = 0; t < 4; t++) {
            int tA = t >> 1, tB = t & 1;
            int pad = (si + t) % 3 == 0 ? 0 : 5 + si;
            test_sgemm_case(tA, tB, shapes[si], 1.0f, 0.0f, pad, 1);
            /* the heavier shapes get one alpha/beta variant each, the light ones all of them */
            int64_t work = shapes[si].M * shapes[si].N * shapes[si].K;
            if (work > 3000000 && t != si % 4) continue;
            test_sgemm_case(tA, tB, shapes[si], 1.0f, 1.0f, pad, 0);
            test_sgemm_case(tA, tB, shapes[si], -1.5f, 0.5f, pad + 1, 0);
            test_sgemm_case(tA, tB, shapes[si], 0.75f, 0.0f, pad, 0);
        }
    }
    /* alpha == 0 and K == 0: C = beta * C exactly (and beta == 0 clears NaN) */
    float Cz[6] = {1, 2, 3, NAN, 5, 6}, A1[3] = {1, 2, 3}, B1[6] = {1, 2, 3, 4, 5, 6};
    sl_sgemm(0, 0, 2, 3, 0, 1.0f, A1, 1, B1, 3, 0.0f, Cz, 3);
    for (int i = 0; i < 6; i++) TU_CHECK(Cz[i] == 0.0f, "K=0 beta=0 C[%d]=%g", i, Cz[i]);
    float Cb[6] = {1, 2, 3, 4, 5, 6};
    sl_sgemm(0, 0, 2, 3, 1, 0.0f, A1, 1, B1, 3, 2.0f, Cb, 3);
    for (int i = 0; i < 6; i++) TU_CHECK(Cb[i] == 2.0f * (float)(i + 1), "alpha=0 beta=2 C[%d]=%g", i, Cb[i]);
}

/* sl_sgemm_bias / sl_gemm_bf16_bias: C = alpha op(A) op(B) + bias on every row (a NaN-filled C is
 * overwritten), all transpose cases, every shape (K > kc: the bias enters before the first K block); the
 * bf16 entry point against the fp32 one on bf16-exact inputs; 1 vs 2 threads bitwise. */
static void test_bias(void) {
    int n = (int)(sizeof shapes / sizeof shapes[0]);
    for (int si = 0; si < n; si++) {
        for (int t = 0; t < 4; t++) {
            int tA = t >> 1, tB = t & 1;
            int64_t M = shapes[si].M, N = shapes[si].N, K = shapes[si].K, pad = t == 1 ? 3 : 0;
            int64_t lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N + pad;
            int64_t arows = tA ? K : M, brows = tB ? N : K;
            float *A = falloc(arows * lda), *B = falloc(brows * ldb), *C = falloc(M * ldc),
                  *R = falloc(M * ldc), *bias = falloc(N);
            fill(A, arows * lda), fill(B, brows * ldb), fill(bias, N);
            for (int64_t i = 0; i < M * ldc; i++) C[i] = R[i] = NAN;
            float alpha = t == 3 ? -0.5f : 1.0f;
            sl_sgemm_ref(tA, tB, M, N, K, alpha, A, lda, B, ldb, 0.0f, R, ldc);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) R[i * ldc + j] += bias[j];
            sl_sgemm_bias(tA, tB, M, N, K, alpha, A, lda, B, ldb, bias, C, ldc);
            for (int64_t i = 0; i < M * ldc; i++)
                if (isnan(R[i]) && isnan(C[i])) R[i] = C[i] = 0.0f; /* untouched padding */
            char what[128];
            snprintf(what, sizeof what, "sgemm_bias %s%s M=%lld N=%lld K=%lld", tA ? "T" : "N",
                     tB ? "T" : "N", (long long)M, (long long)N, (long long)K);
            TU_CHECK(check_c(what, C, R, M, ldc, K), "%s", what);
            free(A), free(B), free(C), free(R), free(bias);
        }
    }
    /* K == 0: C = bias */
    float Cz[6] = {NAN, 2, 3, NAN, 5, 6}, A1[1] = {1}, B1[3] = {1, 2, 3}, b3[3] = {7, 8, 9};
    sl_sgemm_bias(0, 0, 2, 3, 0, 1.0f, A1, 1, B1, 3, b3, Cz, 3);
    for (int i = 0; i < 6; i++) TU_CHECK(Cz[i] == b3[i % 3], "K=0 bias C[%d]=%g", i, Cz[i]);
    /* bf16 inputs (bf16-exact values) give the fp32 result; threads do not change a bit */
    int64_t M = 130, N = 70, K = 900;
    float *A = falloc(M * K), *B = falloc(K * N), *bias = falloc(N), *C1 = falloc(M * N), *C2 = falloc(M * N),
          *C3 = falloc(M * N);
    uint16_t *Ah = malloc(sizeof(uint16_t) * (size_t)(M * K)),
             *Bh = malloc(sizeof(uint16_t) * (size_t)(K * N));
    fill(A, M * K), fill(B, K * N), fill(bias, N);
    for (int64_t i = 0; i < M * K; i++) A[i] = sl_bf16_to_f32(Ah[i] = sl_f32_to_bf16(A[i]));
    for (int64_t i = 0; i < K * N; i++) B[i] = sl_bf16_to_f32(Bh[i] = sl_f32_to_bf16(B[i]));
    int saved = sl_threads_get();
    sl_threads_set(2);
    sl_sgemm_bias(0, 1, M, N, K, 1.0f, A, K, B, K, bias, C1, N);
    sl_gemm_bf16_bias(0, 1, M, N, K, 1.0f, Ah, K, Bh, K, bias, C3, N);
    TU_CHECK(tu_allclose("gemm_bf16_bias vs sgemm_bias", C3, C1, M * N, tol_atol(K), 1e-5f), "bf16 bias");
    sl_threads_set(1);
    sl_sgemm_bias(0, 1, M, N, K, 1.0f, A, K, B, K, bias, C2, N);
    sl_threads_set(saved);
    TU_CHECK(!memcmp(C1, C2, sizeof(float) * (size_t)(M * N)), "sgemm_bias 1 vs 2 threads differ");
    free(A), free(B), free(bias), free(C1), free(C2), free(C3), free(Ah), free(Bh);
}

static void test_batched(void) {
    const int64_t batches[] = {1, 2, 7};
    const shape bs[] = {{17, 63, 65}, {64, 64, 64}, {3, 100, 9}};
    for (int bi = 0; bi < 3; bi++) {
        for (int si = 0; si < 3; si++) {
            for (int t = 0; t < 4; t++) {
                int tA = t >> 1, tB = t & 1;
                int64_t batch = batches[bi], M = bs[si].M, N = bs[si].N, K = bs[si].K;
                int64_t lda = (tA ? M : K) + 3, ldb = (tB ? K : N) + 1, ldc = N + 2;
                int64_t sA = (tA ? K : M) * lda + 7, sB = (tB ? N : K) * ldb + 5, sC = M * ldc + 11;
                float *A = falloc(batch * sA), *B = falloc(batch * sB), *C = falloc(batch * sC),
                      *R = falloc(batch * sC);
                fill(A, batch * sA), fill(B, batch * sB), fill(C, batch * sC);
                memcpy(R, C, (size_t)(batch * sC) * sizeof(float));
                float alpha = 0.5f, beta = t == 2 ? 0.0f : -1.0f;
                for (int64_t b = 0; b < batch; b++)
                    sl_sgemm_ref(tA, tB, M, N, K, alpha, A + b * sA, lda, B + b * sB, ldb, beta, R + b * sC,
                                 ldc);
                sl_sgemm_batched(tA, tB, batch, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC);
                char what[128];
                snprintf(what, sizeof what, "batched %s%s batch=%lld M=%lld N=%lld K=%lld", tA ? "T" : "N",
                         tB ? "T" : "N", (long long)batch, (long long)M, (long long)N, (long long)K);
                TU_CHECK(check_c(what, C, R, batch * sC / ldc, ldc, K), "%s", what);
                free(A), free(B), free(C), free(R);
            }
        }
    }
}

static void test_bf16(void) {
    /* the last two: full 32 x 32 AMX tiles (C stored from the tiles directly at alpha 1, beta 0) and K past
     * the AMX kernel's K block of 1024 (later blocks accumulate onto C in the tiles) */
    const shape bs[] = {{1, 1, 1},       {17, 63, 65}, {65, 17, 3},    {63, 255, 255},
                        {100, 97, 1000}, {8, 48, 769}, {64, 96, 2100}, {96, 64, 1100}};
    for (int si = 0; si < 8; si++) {
        for (int t = 0; t < 4; t++) {
            int tA = t >> 1, tB = t & 1;
            int64_t M = bs[si].M, N = bs[si].N, K = bs[si].K;
            int64_t lda = (tA ? M : K) + (t & 1) * 3, ldb = (tB ? K : N) + (t >> 1) * 2, ldc = N + 1;
            int64_t na = (tA ? K : M) * lda, nb = (tB ? N : K) * ldb;
            float *Af = falloc(na), *Bf = falloc(nb), *C = falloc(M * ldc), *R = falloc(M * ldc);
            uint16_t *A = (uint16_t *)malloc((size_t)na * 2), *B = (uint16_t *)malloc((size_t)nb * 2);
            if (!A || !B) abort();
            fill(Af, na), fill(Bf, nb), fill(C, M * ldc);
            for (int64_t i = 0; i < na; i++) A[i] = sl_f32_to_bf16(Af[i]), Af[i] = sl_bf16_to_f32(A[i]);
            for (int64_t i = 0; i < nb; i++) B[i] = sl_f32_to_bf16(Bf[i]), Bf[i] = sl_bf16_to_f32(B[i]);
            float beta = t == 1 ? 0.25f : 0.0f, alpha = t == 3 ? -2.0f : 1.0f;
            if (beta == 0.0f)
                for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN;
            memcpy(R, C, (size_t)(M * ldc) * sizeof(float));
            sl_sgemm_ref(tA, tB, M, N, K, alpha, Af, lda, Bf, ldb, beta, R, ldc);
            sl_gemm_bf16(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            /* the padding column of C is not written: NaN == NaN there */
            for (int64_t i = 0; i < M * ldc; i++)
                if (isnan(R[i]) && isnan(C[i])) R[i] = C[i] = 0.0f;
            char what[128];
            snprintf(what, sizeof what, "bf16 %s%s M=%lld N=%lld K=%lld", tA ? "T" : "N", tB ? "T" : "N",
                     (long long)M, (long long)N, (long long)K);
            TU_CHECK(check_c(what, C, R, M, ldc, K), "%s", what);
            free(Af), free(Bf), free(A), free(B), free(C), free(R);
        }
    }
}

/* fp32 B rounded as it enters the product (sl_gemm_bf16_f32b: packed from fp32 by the AMX kernel, a rounded
 * copy in chunks of 4800 columns for the others) is bitwise sl_gemm_bf16 on B rounded by sl_f32_to_bf16:
 * all four layouts, a bias, M = 1 (the GEMV), N past one chunk, padded leading dimensions */
static void test_bf16_f32b(void) {
    const shape fs[] = {{1, 77, 65}, {37, 70, 129}, {64, 96, 1100}, {9, 5000, 40}};
    for (int si = 0; si < 4; si++)
        for (int t = 0; t < 8; t++) {
            int tA = (t >> 1) & 1, tB = t & 1, with_bias = t >> 2;
            int64_t M = fs[si].M, N = fs[si].N, K = fs[si].K;
            int64_t lda = (tA ? M : K) + 1, ldb = (tB ? K : N) + 2, ldc = N;
            int64_t na = (tA ? K : M) * lda, nb = (tB ? N : K) * ldb;
            float *Af = falloc(na), *Bf = falloc(nb), *bias = falloc(N), *C1 = falloc(M * ldc),
                  *C2 = falloc(M * ldc);
            uint16_t *A = (uint16_t *)malloc((size_t)na * 2), *Bh = (uint16_t *)malloc((size_t)nb * 2);
            if (!A || !Bh) abort();
            fill(Af, na), fill(Bf, nb), fill(bias, N);
            for (int64_t i = 0; i < na; i++) A[i] = sl_f32_to_bf16(Af[i]);
            for (int64_t i = 0; i < nb; i++) Bh[i] = sl_f32_to_bf16(Bf[i]);
            for (int64_t i = 0; i < M * ldc; i++) C1[i] = C2[i] = NAN;
            if (with_bias) {
                sl_gemm_bf16_bias(tA, tB, M, N, K, 1.0f, A, lda, Bh, ldb, bias, C1, ldc);
                sl_gemm_bf16_f32b(tA, tB, M, N, K, 1.0f, A, lda, Bf, ldb, 0.0f, bias, C2, ldc);
            } else {
                sl_gemm_bf16(tA, tB, M, N, K, 0.5f, A, lda, Bh, ldb, 0.0f, C1, ldc);
                sl_gemm_bf16_f32b(tA, tB, M, N, K, 0.5f, A, lda, Bf, ldb, 0.0f, NULL, C2, ldc);
            }
            TU_CHECK(!memcmp(C1, C2, (size_t)(M * ldc) * sizeof(float)),
                     "bf16 x rounded f32 B %s%s%s M=%lld N=%lld K=%lld: not bitwise the bf16 GEMM",
                     tA ? "T" : "N", tB ? "T" : "N", with_bias ? " bias" : "", (long long)M, (long long)N,
                     (long long)K);
            /* the rounded output (Note [Rounded Linear outputs]): bitwise C2 cast to bf16 and back, for any
             * K (1100 spans several K blocks of every kernel) and through the GEMV at M = 1 */
            for (int64_t i = 0; i < M * ldc; i++) C1[i] = NAN;
            sl_gemm_bf16_f32b_round(tA, tB, M, N, K, with_bias ? 1.0f : 0.5f, A, lda, Bf, ldb, 0.0f,
                                    with_bias ? bias : NULL, C1, ldc);
            int64_t bad = -1, moved = 0;
            for (int64_t i = 0; i < M * ldc; i++) {
                float r = sl_bf16_to_f32(sl_f32_to_bf16(C2[i]));
                if (memcmp(&r, &C1[i], sizeof r) && bad < 0) bad = i;
                moved += r != C2[i];
            }
            TU_CHECK(bad < 0, "rounded output %s%s%s M=%lld N=%lld K=%lld: element %lld is %g, want %g",
                     tA ? "T" : "N", tB ? "T" : "N", with_bias ? " bias" : "", (long long)M, (long long)N,
                     (long long)K, (long long)bad, bad < 0 ? 0.0 : (double)C1[bad],
                     bad < 0 ? 0.0 : (double)sl_bf16_to_f32(sl_f32_to_bf16(C2[bad])));
            TU_CHECK(moved > M * N / 2,
                     "rounded output M=%lld N=%lld K=%lld: only %lld of the products moved", (long long)M,
                     (long long)N, (long long)K, (long long)moved);
            free(Af), free(Bf), free(bias), free(C1), free(C2), free(A), free(Bh);
        }
}

/* Subnormal values reach the rounding of a Linear's output where the sum is (near) zero and the bias is
 * tiny. The rounding in the kernel's writeback (Note [Rounding in the writeback], gemm.c) uses vcvtneps2bf16
 * where it can, which flushes subnormals; a vector holding one must take the exact rounding. Rows of zeros
 * in A, a bias of subnormals (every third column, with low bits that the rounding changes) among normal
 * values: each output is sl_f32_to_bf16's rounding of bias + sum, bit for bit. */
static void test_rounded_subnormal(void) {
    const int64_t M = 16, N = 101, K = 32;
    float *Bf = falloc(N * K), *bias = falloc(N), *C1 = falloc(M * N), *C2 = falloc(M * N);
    uint16_t *A = (uint16_t *)calloc((size_t)(M * K), 2);
    if (!A) abort();
    fill(Bf, N * K);
    fill(bias, N);
    for (int64_t i = 0; i < M; i += 2)
        for (int64_t k = 0; k < K; k++) A[i * K + k] = sl_f32_to_bf16(0.25f * (float)((i + k) % 7) - 0.75f);
    int64_t changed = 0;
    for (int64_t j = 0; j < N; j += 3) {
        uint32_t u = 0x00012345u * (uint32_t)(j + 1) & 0x007fffffu; /* exponent 0: subnormal */
        if (j % 2) u |= 0x80000000u;
        memcpy(&bias[j], &u, 4);
        changed += sl_bf16_to_f32(sl_f32_to_bf16(bias[j])) != bias[j];
    }
    sl_gemm_bf16_f32b(0, 1, M, N, K, 1.0f, A, K, Bf, K, 0.0f, bias, C2, N);
    sl_gemm_bf16_f32b_round(0, 1, M, N, K, 1.0f, A, K, Bf, K, 0.0f, bias, C1, N);
    int64_t bad = -1;
    for (int64_t i = 0; i < M * N && bad < 0; i++) {
        float r = sl_bf16_to_f32(sl_f32_to_bf16(C2[i]));
        if (memcmp(&r, &C1[i], 4)) bad = i;
    }
    TU_CHECK(changed > 10, "subnormal bias: only %lld values change when rounded", (long long)changed);
    TU_CHECK(bad < 0, "rounded output with subnormal values: element %lld is %a, want %a", (long long)bad,
             bad < 0 ? 0.0 : (double)C1[bad],
             bad < 0 ? 0.0 : (double)sl_bf16_to_f32(sl_f32_to_bf16(C2[bad])));
    free(Bf), free(bias), free(C1), free(C2), free(A);
}

/* sl_gemm_rounded (Note [Rounded products in the GEMM]): C (= | +=) bf16(product) rounded tile by tile
 * inside the GEMM is bitwise the product written out and rounded by the scalar sl_round_bf16_f32, for fp32
 * and bf16 operands, all four layouts, padded leading dimensions, edge tiles, store and add. K above the
 * kernel's K block is refused (0) with C untouched, M = 1 too (the GEMV). */
static void test_rounded(void) {
    const shape rs[] = {{37, 70, 64}, {100, 130, 33}, {2, 5, 256}, {65, 97, 1100}, {1, 40, 16}};
    for (int si = 0; si < 5; si++)
        for (int t = 0; t < 16; t++) {
            int tA = (t >> 1) & 1, tB = t & 1, add = (t >> 2) & 1, bf = t >> 3;
            int64_t M = rs[si].M, N = rs[si].N, K = rs[si].K;
            int64_t lda = (tA ? M : K) + 3, ldb = (tB ? K : N) + 1, ldc = N + 5;
            int64_t na = (tA ? K : M) * lda, nb = (tB ? N : K) * ldb;
            float *Af = falloc(na), *Bf = falloc(nb), *P = falloc(M * N), *C1 = falloc(M * ldc),
                  *C2 = falloc(M * ldc);
            uint16_t *Ah = (uint16_t *)malloc((size_t)na * 2), *Bh = (uint16_t *)malloc((size_t)nb * 2);
            if (!Ah || !Bh) abort();
            fill(Af, na), fill(Bf, nb), fill(C1, M * ldc);
            memcpy(C2, C1, (size_t)(M * ldc) * sizeof(float));
            for (int64_t i = 0; i < na; i++) Ah[i] = sl_f32_to_bf16(Af[i]);
            for (int64_t i = 0; i < nb; i++) Bh[i] = sl_f32_to_bf16(Bf[i]);
            if (bf)
                sl_gemm_bf16(tA, tB, M, N, K, 1.0f, Ah, lda, Bh, ldb, 0.0f, P, N);
            else
                sl_sgemm(tA, tB, M, N, K, 1.0f, Af, lda, Bf, ldb, 0.0f, P, N);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    float r = sl_round_bf16_f32(P[i * N + j]);
                    C1[i * ldc + j] = add ? C1[i * ldc + j] + r : r;
                }
            int done = sl_gemm_rounded(bf, tA, tB, M, N, K, bf ? (const void *)Ah : Af, lda,
                                       bf ? (const void *)Bh : Bf, ldb, C2, ldc, add);
            char what[128];
            snprintf(what, sizeof what, "rounded %s %s%s%s M=%lld N=%lld K=%lld", bf ? "bf16" : "f32",
                     tA ? "T" : "N", tB ? "T" : "N", add ? " add" : "", (long long)M, (long long)N,
                     (long long)K);
            if (K > 1024 || M == 1) {
                TU_CHECK(!done, "%s: must be refused (K above every kernel's K block, or one row)", what);
            } else {
                TU_CHECK(done, "%s: refused", what);
                TU_CHECK(!memcmp(C1, C2, (size_t)(M * ldc) * sizeof(float)), "%s: not bitwise the two passes",
                         what);
            }
            free(Af), free(Bf), free(P), free(C1), free(C2), free(Ah), free(Bh);
        }
}

/* AMX with a few rows (Note [AMX GEMM for a few rows], gemm_amx.c): a prompt's M <= 256 rows times a bf16
 * weight, the weight's rows loaded as A tiles, is bitwise the blocked driver's result (the path switched off)
 * for full and edge row blocks, K over one and several K blocks (kc 1024), alpha, beta 0 / 1 / 0.5, a bias,
 * padded leading dimensions. Only where the bf16 kernel is AMX (elsewhere the path is never taken). */
static void test_amx_few_rows(void) {
    if (strcmp(sl_gemm_bf16_kernel_name(), "amx") != 0) return;
    const int Ms[] = {2, 8, 31, 32, 33, 64, 100, 256};
    const int64_t Ks[] = {64, 2080}, N = 96;
    for (int mi = 0; mi < 8; mi++)
        for (int ki = 0; ki < 2; ki++)
            for (int v = 0; v < 4; v++) {
                int64_t M = Ms[mi], K = Ks[ki], lda = K + 32, ldb = K + 64, ldc = N + 3;
                float alpha = v == 3 ? 0.5f : 1.0f, beta = v == 1 ? 1.0f : v == 3 ? 0.5f : 0.0f;
                int with_bias = v == 2;
                float *Af = falloc(M * lda), *Bf = falloc(N * ldb), *bias = falloc(N), *C1 = falloc(M * ldc),
                      *C2 = falloc(M * ldc);
                uint16_t *A = (uint16_t *)malloc((size_t)(M * lda) * 2),
                         *B = (uint16_t *)malloc((size_t)(N * ldb) * 2);
                if (!A || !B) abort();
                fill(Af, M * lda), fill(Bf, N * ldb), fill(bias, N), fill(C1, M * ldc);
                memcpy(C2, C1, (size_t)(M * ldc) * sizeof(float));
                for (int64_t i = 0; i < M * lda; i++) A[i] = sl_f32_to_bf16(Af[i]);
                for (int64_t i = 0; i < N * ldb; i++) B[i] = sl_f32_to_bf16(Bf[i]);
                for (int path = 0; path < 2; path++) {
                    float *C = path ? C2 : C1;
                    sl_gemm_amx_few_rows_set(path);
                    if (with_bias)
                        sl_gemm_bf16_bias(0, 1, M, N, K, alpha, A, lda, B, ldb, bias, C, ldc);
                    else
                        sl_gemm_bf16(0, 1, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
                }
                sl_gemm_amx_few_rows_set(1);
                TU_CHECK(!memcmp(C1, C2, (size_t)(M * ldc) * sizeof(float)),
                         "AMX few rows M=%lld K=%lld alpha %g beta %g%s: not bitwise the blocked driver's",
                         (long long)M, (long long)K, alpha, beta, with_bias ? " bias" : "");
                free(Af), free(Bf), free(bias), free(C1), free(C2), free(A), free(B);
            }
}

/* Same inputs -> bitwise-identical outputs: twice with the same thread count, and with 1 vs 2 threads. */
static void test_determinism(void) {
    /* {2000, 40, 70}: 1 thread packs A in row blocks, 2 threads (split M) in one block each */
    const shape ds[] = {{200, 300, 1000}, {1000, 96, 130}, {64, 2000, 64}, {2000, 40, 70}};
    for (int si = 0; si < 4; si++) {
        int64_t M = ds[si].M, N = ds[si].N, K = ds[si].K;
        for (int t = 0; t < 4; t++) {
            int tA = t >> 1, tB = t & 1;
            float *A = falloc(M * K), *B = falloc(K * N), *C1 = falloc(M * N), *C2 = falloc(M * N),
                  *C3 = falloc(M * N);
            fill(A, M * K), fill(B, K * N);
            int64_t lda = tA ? M : K, ldb = tB ? K : N;
            int saved = sl_threads_get();
            sl_threads_set(2);
            sl_sgemm(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C1, N);
            sl_sgemm(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C2, N);
            sl_threads_set(1);
            sl_sgemm(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C3, N);
            sl_threads_set(saved);
            TU_CHECK(!memcmp(C1, C2, (size_t)(M * N) * sizeof(float)),
                     "run-to-run differs %lld %lld %lld t=%d", (long long)M, (long long)N, (long long)K, t);
            TU_CHECK(!memcmp(C1, C3, (size_t)(M * N) * sizeof(float)),
                     "1 vs 2 threads differ %lld %lld %lld t=%d", (long long)M, (long long)N, (long long)K,
                     t);
            /* the bf16 kernel (AMX tiles, vdpbf16ps or widened) likewise */
            uint16_t *Ah = (uint16_t *)malloc((size_t)(M * K) * 2),
                     *Bh = (uint16_t *)malloc((size_t)(K * N) * 2);
            if (!Ah || !Bh) abort();
            for (int64_t i = 0; i < M * K; i++) Ah[i] = sl_f32_to_bf16(A[i]);
            for (int64_t i = 0; i < K * N; i++) Bh[i] = sl_f32_to_bf16(B[i]);
            sl_threads_set(2);
            sl_gemm_bf16(tA, tB, M, N, K, 1.0f, Ah, lda, Bh, ldb, 0.0f, C1, N);
            sl_threads_set(1);
            sl_gemm_bf16(tA, tB, M, N, K, 1.0f, Ah, lda, Bh, ldb, 0.0f, C3, N);
            sl_threads_set(saved);
            TU_CHECK(!memcmp(C1, C3, (size_t)(M * N) * sizeof(float)),
                     "bf16: 1 vs 2 threads differ %lld %lld %lld t=%d", (long long)M, (long long)N,
                     (long long)K, t);
            free(Ah), free(Bh);
            free(A), free(B), free(C1), free(C2), free(C3);
        }
    }
}

/* The shared mode (Note [GEMM units]: several units per thread, claimed by whichever thread is free, with
 * the team bound one CPU each) gives bitwise the 1-thread result: fp32 with beta and with a bias, bf16, and
 * the rounded products, on shapes split along M and along N into 8 units. */
static void test_shared_units(void) {
    const shape ds[] = {{200, 300, 1000}, {1000, 96, 130}, {64, 2000, 64}, {2000, 40, 70}, {37, 515, 400}};
    int saved = sl_threads_get();
    for (int si = 0; si < 5; si++) {
        int64_t M = ds[si].M, N = ds[si].N, K = ds[si].K;
        for (int t = 0; t < 4; t++) {
            int tA = t >> 1, tB = t & 1;
            int64_t lda = tA ? M : K, ldb = tB ? K : N;
            float *A = falloc(M * K), *B = falloc(K * N), *bias = falloc(N), *C[2], *D[2], *H[2], *R[2];
            float *C0 = falloc(M * N), *R0 = falloc(M * N); /* the initial C of the beta and rounded runs */
            uint16_t *Ah = (uint16_t *)malloc((size_t)(M * K) * 2),
                     *Bh = (uint16_t *)malloc((size_t)(K * N) * 2);
            if (!Ah || !Bh) abort();
            fill(A, M * K), fill(B, K * N), fill(bias, N), fill(C0, M * N), fill(R0, M * N);
            for (int64_t i = 0; i < M * K; i++) Ah[i] = sl_f32_to_bf16(A[i]);
            for (int64_t i = 0; i < K * N; i++) Bh[i] = sl_f32_to_bf16(B[i]);
            for (int r = 0; r < 2; r++) { /* r 0: one thread; r 1: two threads in the shared mode */
                C[r] = falloc(M * N), D[r] = falloc(M * N), H[r] = falloc(M * N), R[r] = falloc(M * N);
                memcpy(C[r], C0, (size_t)(M * N) * sizeof(float));
                memcpy(R[r], R0, (size_t)(M * N) * sizeof(float));
                sl_threads_set(r ? 2 : 1);
                sl_threads_shared_mode(r ? 2 : 1, r);
                TU_CHECK(sl_threads_shared() == r, "shared flag %d, want %d", sl_threads_shared(), r);
                sl_sgemm(tA, tB, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C[r], N);
                sl_sgemm_bias(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, bias, D[r], N);
                sl_gemm_bf16(tA, tB, M, N, K, 1.0f, Ah, lda, Bh, ldb, 0.0f, H[r], N);
                sl_gemm_rounded(1, tA, tB, M, N, K, Ah, lda, Bh, ldb, R[r], N, 1);
                sl_threads_shared_mode(r ? 2 : 1, 0);
            }
            size_t bytes = (size_t)(M * N) * sizeof(float);
            TU_CHECK(
                !memcmp(C[0], C[1], bytes) && !memcmp(D[0], D[1], bytes) && !memcmp(H[0], H[1], bytes) &&
                    !memcmp(R[0], R[1], bytes),
                "shared units differ from 1 thread: %lld %lld %lld t=%d (beta %d bias %d bf16 %d round %d)",
                (long long)M, (long long)N, (long long)K, t, !!memcmp(C[0], C[1], bytes),
                !!memcmp(D[0], D[1], bytes), !!memcmp(H[0], H[1], bytes), !!memcmp(R[0], R[1], bytes));
            for (int r = 0; r < 2; r++) free(C[r]), free(D[r]), free(H[r]), free(R[r]);
            free(A), free(B), free(bias), free(Ah), free(Bh), free(C0), free(R0);
        }
    }
    sl_threads_set(saved);
}

/* Note [Unpacked A]: a row-major fp32 A read in place gives bitwise the packed path's C, with partial
 * panels at the bottom (M = 37, 63, 255), right-edge panels of 16, 32 and 48 columns, N wider than one B
 * chunk (1000), K above the K block,
 * alpha / beta and a bias, at 1 and 2 threads. */
static void test_unpacked_a(void) {
    const shape ds[] = {{37, 128, 200},  {63, 65, 1000}, {255, 512, 130},
                        {768, 128, 512}, {96, 17, 64},   {41, 1000, 100}};
    int saved = sl_threads_get();
    for (int si = 0; si < (int)(sizeof ds / sizeof ds[0]); si++)
        for (int tB = 0; tB < 2; tB++)
            for (int thr = 1; thr <= 2; thr++) {
                int64_t M = ds[si].M, N = ds[si].N, K = ds[si].K, ldb = tB ? K : N;
                float *A = falloc(M * K), *B = falloc(K * N), *bias = falloc(N), *C0 = falloc(M * N), *C[2],
                      *D[2];
                fill(A, M * K), fill(B, K * N), fill(bias, N), fill(C0, M * N);
                sl_threads_set(thr);
                for (int r = 0; r < 2; r++) { /* r 0: packed; r 1: in place */
                    C[r] = falloc(M * N), D[r] = falloc(M * N);
                    memcpy(C[r], C0, (size_t)(M * N) * sizeof(float));
                    sl_gemm_unpacked_a_set(r);
                    sl_sgemm(0, tB, M, N, K, -1.25f, A, K, B, ldb, 0.5f, C[r], N);
                    sl_sgemm_bias(0, tB, M, N, K, 1.0f, A, K, B, ldb, bias, D[r], N);
                }
                sl_gemm_unpacked_a_set(1);
                size_t bytes = (size_t)(M * N) * sizeof(float);
                TU_CHECK(!memcmp(C[0], C[1], bytes) && !memcmp(D[0], D[1], bytes),
                         "unpacked A differs from packed: %lld %lld %lld tB=%d threads %d (beta %d bias %d)",
                         (long long)M, (long long)N, (long long)K, tB, thr, !!memcmp(C[0], C[1], bytes),
                         !!memcmp(D[0], D[1], bytes));
                float *R = falloc(M * N); /* and it is right: the double-accumulating reference */
                memcpy(R, C0, bytes);
                sl_sgemm_ref(0, tB, M, N, K, -1.25f, A, K, B, ldb, 0.5f, R, N);
                TU_CHECK(check_c("unpacked A vs reference", C[1], R, M, N, K), "unpacked A vs reference");
                free(R);
                for (int r = 0; r < 2; r++) free(C[r]), free(D[r]);
                free(A), free(B), free(bias), free(C0);
            }
    sl_threads_set(saved);
}

/* Note [Packing B in the first tile]: a K x N B whose full panels are packed by the first row panel's kernel
 * gives bitwise the C of packing every panel first: partial row panels (M = 37, 63), a partial right-edge
 * panel (N = 128, 1000), several B chunks (N = 1000), two K blocks (K = 1001), K steps that are not a
 * multiple of 4 (the prefetching kernel's tail: K = 301, 1001), rows of B 4 floats off the cache line
 * (ldb = N + 1), A transposed or not, packed or read in place, alpha / beta and a bias, 1 and 2 threads; the
 * same for the bf16 GEMM's pair kernel (bf16 B, fp32 B rounded as it is packed, and C rounded in the
 * writeback; odd K blocks keep the packer); a transposed B walked panel by panel with the next panel's run
 * prefetched (one K block, ldb = K) or not (ldb = K + 1, two K blocks); and the fp32 product is right
 * against the double-accumulating reference. */
static void test_fused_b_pack(void) {
    const shape ds[] = {{37, 128, 200}, {63, 1000, 1001}, {256, 768, 301}, {8, 48, 16}, {41, 96, 100}};
    int saved = sl_threads_get();
    for (int si = 0; si < (int)(sizeof ds / sizeof ds[0]); si++)
        for (int v = 0; v < 16; v++) {
            const int tA = v & 1, pad = (v >> 1) & 1, thr = 1 + ((v >> 2) & 1), tB = v >> 3;
            int64_t M = ds[si].M, N = ds[si].N, K = ds[si].K, lda = tA ? M : K, ldb = (tB ? K : N) + pad,
                    nb = (tB ? N : K) * ldb;
            float *A = falloc(M * K), *B = falloc(nb), *bias = falloc(N), *C0 = falloc(M * N), *C[2], *D[2],
                  *H[2], *F[2], *R2[2];
            uint16_t *Ah = malloc((size_t)(M * K) * 2), *Bh = malloc((size_t)nb * 2);
            fill(A, M * K), fill(B, nb), fill(bias, N), fill(C0, M * N);
            for (int64_t i = 0; i < M * K; i++) Ah[i] = sl_f32_to_bf16(A[i]);
            for (int64_t i = 0; i < nb; i++) Bh[i] = sl_f32_to_bf16(B[i]);
            sl_threads_set(thr);
            for (int r = 0; r < 2; r++) { /* r 0: every panel packed first; r 1: packed by the first tile */
                C[r] = falloc(M * N), D[r] = falloc(M * N), H[r] = falloc(M * N), F[r] = falloc(M * N),
                R2[r] = falloc(M * N);
                memcpy(C[r], C0, (size_t)(M * N) * sizeof(float));
                memcpy(H[r], C0, (size_t)(M * N) * sizeof(float));
                sl_gemm_fused_b_pack_set(r ? 2 : 0); /* 2: walked on every host (Note [Walk or chunk]) */
                sl_gemm_unpacked_a_set(si % 2);      /* A read in place (!tA) on odd shapes */
                sl_sgemm(tA, tB, M, N, K, -1.25f, A, lda, B, ldb, 0.5f, C[r], N);
                sl_sgemm_bias(tA, tB, M, N, K, 1.0f, A, lda, B, ldb, bias, D[r], N);
                /* the bf16 GEMM's pair kernel: bf16 B, fp32 B rounded (b_f32), and its rounded writeback */
                sl_gemm_bf16(tA, tB, M, N, K, -1.25f, Ah, lda, Bh, ldb, 0.5f, H[r], N);
                sl_gemm_bf16_f32b(tA, tB, M, N, K, 1.0f, Ah, lda, B, ldb, 0.0f, bias, F[r], N);
                sl_gemm_bf16_f32b_round(tA, tB, M, N, K, 1.0f, Ah, lda, B, ldb, 0.0f, bias, R2[r], N);
            }
            sl_gemm_fused_b_pack_set(1);
            sl_gemm_unpacked_a_set(1);
            size_t bytes = (size_t)(M * N) * sizeof(float);
            TU_CHECK(
                !memcmp(C[0], C[1], bytes) && !memcmp(D[0], D[1], bytes) && !memcmp(H[0], H[1], bytes) &&
                    !memcmp(F[0], F[1], bytes) && !memcmp(R2[0], R2[1], bytes),
                "B packed in the first tile differs from packed first: %lld %lld %lld tA=%d tB=%d ldb+%d "
                "threads %d (beta %d bias %d bf16 %d f32b %d round %d)",
                (long long)M, (long long)N, (long long)K, tA, tB, pad, thr, !!memcmp(C[0], C[1], bytes),
                !!memcmp(D[0], D[1], bytes), !!memcmp(H[0], H[1], bytes), !!memcmp(F[0], F[1], bytes),
                !!memcmp(R2[0], R2[1], bytes));
            float *R = falloc(M * N);
            memcpy(R, C0, bytes);
            sl_sgemm_ref(tA, tB, M, N, K, -1.25f, A, lda, B, ldb, 0.5f, R, N);
            TU_CHECK(check_c("B packed in the first tile vs reference", C[1], R, M, N, K),
                     "B packed in the first tile vs reference");
            free(R);
            for (int r = 0; r < 2; r++) free(C[r]), free(D[r]), free(H[r]), free(F[r]), free(R2[r]);
            free(A), free(B), free(bias), free(C0), free(Ah), free(Bh);
        }
    sl_threads_set(saved);
}

int main(void) {
    const char *isa = getenv("SUANLI_ISA");
    printf("gemm kernel: %s, bf16 %s (SUANLI_ISA=%s, cpu isa %s)\n", sl_gemm_kernel_name(),
           sl_gemm_bf16_kernel_name(), isa ? isa : "unset", sl_cpu_isa_name());
    if (isa && !strcmp(isa, "avx512"))
        TU_CHECK(strcmp(sl_gemm_bf16_kernel_name(), "amx") != 0, "SUANLI_ISA=avx512 must leave AMX out");
    if (sl_cpu_features_get()->amx_bf16)
        TU_CHECK(!strcmp(sl_gemm_bf16_kernel_name(), "amx"), "AMX found, not used");
    TU_CHECK(!strcmp(sl_gemm_kernel_name(), sl_cpu_isa_name()), "kernel %s vs isa %s", sl_gemm_kernel_name(),
             sl_cpu_isa_name());
    /* SUANLI_BF16_GEMM picks the AVX-512 bf16 kernel without the probe (Note [Widened bf16 GEMM]) */
    const char *bp = getenv("SUANLI_BF16_GEMM");
    if (bp && isa && !strcmp(isa, "avx512") && !strcmp(sl_cpu_isa_name(), "avx512")) {
        const char *want =
            !strcmp(bp, "dp") && sl_cpu_features_get()->avx512_bf16 ? "avx512_bf16" : "avx512_widened";
        TU_CHECK(!strcmp(sl_gemm_bf16_kernel_name(), want), "SUANLI_BF16_GEMM=%s ran %s, not %s", bp,
                 sl_gemm_bf16_kernel_name(), want);
    }
    test_sgemm_all();
    test_bias();
    test_batched();
    test_bf16();
    test_bf16_f32b();
    test_rounded();
    test_rounded_subnormal();
    test_amx_few_rows();
    test_determinism();
    test_shared_units();
    test_unpacked_a();
    test_fused_b_pack();
    return tu_finish("test_gemm");
}
