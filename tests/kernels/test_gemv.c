/* test_gemv — the M = 1 path of sl_sgemm / sl_gemm_bf16 (+ _bias): Note [GEMV for decoding] in
 * src/device/cpu/kernels/gemv.c, against a double-accumulating scalar reference.
 *
 * Run once per ISA path (ctest sets SUANLI_ISA=scalar|avx2|avx512; on AVX512_BF16 hosts avx512 is the
 * vdpbf16ps kernel). Shapes cover K below, at and past each vector width and its tails (1, 7, 15, 31, 33,
 * 1000, 4109), N below a 4-row group, uneven group tails and thread ranges, and decode-sized rows (K = 2048,
 * N = 700). Checks: values (beta 0 on a NaN-filled C, beta 1, alpha 0.5, bias), a leading dimension of B
 * larger than K, untouched memory past N, and bitwise equality between 1 and 2 threads and run to run.
 *
 * Tolerance: each term a_k b_k is exact in double (and, for bf16 inputs, in fp32); an fp32 sum of K terms
 * in any order is within gamma_K * sum |a_k b_k| of the exact sum, gamma_K ~ K * 2^-24 (first-order bound;
 * the double reference itself moves by ~K * 2^-53 relative, negligible), plus one rounding of alpha * s
 * and of the epilogue add: |got - ref| <= (K + 2) * 2^-24 * (sum |a_k b_k| + |beta c| + |bias|). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels/gemm.h"
#include "suanli/base.h"
#include "testutil.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
static void *xalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}
static float wid(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* mode 0: beta 0 (C NaN before), 1: beta 1, 2: alpha 0.5, 3: bias */
static void run(int bf, int mode, int64_t N, int64_t K, int64_t ldb, const void *x, const void *B,
                const float *bias, float *C) {
    float alpha = mode == 2 ? 0.5f : 1.0f, beta = mode == 1 ? 1.0f : 0.0f;
    if (bf && mode == 3)
        sl_gemm_bf16_bias(0, 1, 1, N, K, 1.0f, x, K, B, ldb, bias, C, N);
    else if (bf)
        sl_gemm_bf16(0, 1, 1, N, K, alpha, x, K, B, ldb, beta, C, N);
    else if (mode == 3)
        sl_sgemm_bias(0, 1, 1, N, K, 1.0f, x, K, B, ldb, bias, C, N);
    else
        sl_sgemm(0, 1, 1, N, K, alpha, x, K, B, ldb, beta, C, N);
}

static void test_case(int bf, int mode, int64_t N, int64_t K, int64_t pad) {
    int64_t ldb = K + pad;
    size_t es = bf ? 2 : 4;
    float *xf = xalloc(4 * (size_t)K), *Bf = xalloc(4 * (size_t)(N * ldb)), *bias = xalloc(4 * (size_t)N);
    float *C0 = xalloc(4 * (size_t)(N + 1)), *C = xalloc(4 * (size_t)(N + 1)),
          *C2 = xalloc(4 * (size_t)(N + 1));
    void *x = xalloc(es * (size_t)K), *B = xalloc(es * (size_t)(N * ldb));
    for (int64_t k = 0; k < K; k++) xf[k] = frand();
    for (int64_t i = 0; i < N * ldb; i++) Bf[i] = frand();
    for (int64_t j = 0; j < N; j++) bias[j] = frand();
    for (int64_t j = 0; j <= N; j++) C0[j] = mode == 0 ? NAN : frand();
    C0[N] = 12345.0f; /* past the output: must stay */
    if (bf) {         /* the inputs are bf16 values; the reference uses the same values */
        for (int64_t k = 0; k < K; k++)
            ((uint16_t *)x)[k] = sl_f32_to_bf16(xf[k]), xf[k] = wid(((uint16_t *)x)[k]);
        for (int64_t i = 0; i < N * ldb; i++)
            ((uint16_t *)B)[i] = sl_f32_to_bf16(Bf[i]), Bf[i] = wid(((uint16_t *)B)[i]);
    } else {
        memcpy(x, xf, 4 * (size_t)K);
        memcpy(B, Bf, 4 * (size_t)(N * ldb));
    }
    float alpha = mode == 2 ? 0.5f : 1.0f;
    double worst = 0;
    int64_t wj = -1;
    int bad = 0;
    for (int nt = 1; nt <= 2; nt++) {
        set_threads(nt);
        float *out = nt == 1 ? C : C2;
        memcpy(out, C0, 4 * (size_t)(N + 1));
        run(bf, mode, N, K, ldb, x, B, bias, out);
    }
    for (int64_t j = 0; j < N; j++) {
        double s = 0, a = 0;
        for (int64_t k = 0; k < K; k++) {
            double t = (double)xf[k] * (double)Bf[j * ldb + k];
            s += t;
            a += fabs(t);
        }
        double extra = mode == 1 ? fabs((double)C0[j]) : mode == 3 ? fabs((double)bias[j]) : 0;
        double ref = alpha * s + (mode == 1 ? C0[j] : 0) + (mode == 3 ? bias[j] : 0);
        double tol = (double)(K + 2) * 0x1p-24 * (a + extra) + 1e-30;
        double e = fabs((double)C[j] - ref);
        if (!(e <= tol)) bad++;
        if (!(e / tol <= worst)) worst = e / tol, wj = j;
    }
    TU_CHECK(bad == 0, "%s mode %d N=%lld K=%lld ldb=%lld: %d outputs off, worst at j=%lld (err/bound %.3g)",
             bf ? "bf16" : "f32", mode, (long long)N, (long long)K, (long long)ldb, bad, (long long)wj,
             worst);
    TU_CHECK(C[N] == 12345.0f, "wrote past N");
    TU_CHECK(memcmp(C, C2, 4 * (size_t)N) == 0, "%s N=%lld K=%lld: 1 and 2 threads differ",
             bf ? "bf16" : "f32", (long long)N, (long long)K);
    memcpy(C2, C0, 4 * (size_t)(N + 1));
    run(bf, mode, N, K, ldb, x, B, bias, C2); /* 2 threads again: run to run */
    TU_CHECK(memcmp(C, C2, 4 * (size_t)N) == 0, "run to run differs");
    free(xf), free(Bf), free(bias), free(C0), free(C), free(C2), free(x), free(B);
}

/* sl_cpu_features.zen (the GEMV's prefetch choice, Note [GEMV prefetch on Zen]) is the kernel's vendor_id */
static void test_vendor(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return; /* not Linux: nothing to compare with */
    char line[256];
    int want = -1;
    while (want < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, "vendor_id", 9))
            want = strstr(line, "AuthenticAMD") != NULL || strstr(line, "HygonGenuine") != NULL;
    fclose(f);
    if (want >= 0)
        TU_CHECK(sl_cpu_features_get()->zen == want, "cpu features: zen %d, /proc/cpuinfo says %d",
                 sl_cpu_features_get()->zen, want);
}

int main(void) {
    printf("gemm kernel: %s\n", sl_gemm_kernel_name());
    test_vendor();
    const int64_t shapes[][2] = {{1, 1},   {3, 7},    {5, 15},   {4, 16},   {9, 31},     {13, 32},
                                 {37, 33}, {64, 100}, {65, 257}, {7, 1000}, {700, 2048}, {129, 4109}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int bf = 0; bf <= 1; bf++)
            for (int mode = 0; mode < 4; mode++)
                test_case(bf, mode, shapes[s][0], shapes[s][1], mode == 1 ? 5 : 0);
    /* a GEMV result is a GEMM result: the M = 2 blocked GEMM's first row agrees within the same bound */
    int64_t N = 300, K = 1111;
    uint16_t *x = xalloc(2 * 2 * (size_t)K), *B = xalloc(2 * (size_t)(N * K));
    float *c1 = xalloc(4 * (size_t)N), *c2 = xalloc(4 * 2 * (size_t)N);
    for (int64_t i = 0; i < 2 * K; i++) x[i] = sl_f32_to_bf16(frand());
    for (int64_t i = 0; i < N * K; i++) B[i] = sl_f32_to_bf16(frand());
    sl_gemm_bf16(0, 1, 1, N, K, 1.0f, x, K, B, K, 0.0f, c1, N);
    sl_gemm_bf16(0, 1, 2, N, K, 1.0f, x, K, B, K, 0.0f, c2, N);
    double worst = 0;
    for (int64_t j = 0; j < N; j++) {
        double a = 0;
        for (int64_t k = 0; k < K; k++) a += fabs((double)wid(x[k]) * wid(B[j * K + k]));
        double r = fabs((double)c1[j] - c2[j]) / (2.0 * (double)(K + 2) * 0x1p-24 * a);
        if (r > worst) worst = r;
    }
    printf("gemv vs gemm row 0: worst |diff| / (2 x bound) = %.3g\n", worst);
    TU_CHECK(worst <= 1.0, "gemv and gemm disagree beyond two rounding bounds (%.3g)", worst);
    free(x), free(B), free(c1), free(c2);
    return tu_finish("test_gemv");
}
