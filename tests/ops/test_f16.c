/* IEEE binary16 (issue 19): the scalar conversions against a double-precision nearest-even oracle, the
 * F16C / AVX-512 paths against the scalar ones bit for bit (every f16 value; 2^22 f32 bit patterns plus the
 * boundaries), and the f16 kernels: CAST f32 <-> f16 on strided views and MATMUL f16 x f16 (bitwise equal to
 * the f32 GEMM on the widened operands, Note [f16 GEMM]), plus the casts' gradient rule (an f32 gradient
 * reaching an f16 node is rounded to f16). Exact comparisons throughout: all of it is exact arithmetic. */
#include <math.h>
#include <string.h>

#include "device/cpu/kernels/f16.h"
#include "suanli/graph.h"
#include "gradcheck.h"
#include "testutil.h"

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* nearest f16 by search over the two neighbours of the truncation, ties to even, in double */
static uint16_t oracle(float f) {
    if (isnan(f)) return 0x7e00;
    double x = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (x >= 65520.0) return sign | 0x7c00;
    uint16_t best = 0;
    double bd = INFINITY;
    for (uint32_t h = 0; h < 0x7c00; h++) { /* called on a small sample only */
        double d = fabs((double)sl_f16_to_f32((uint16_t)h) - x);
        if (d < bd || (d == bd && !(h & 1))) bd = d, best = (uint16_t)h;
        if ((double)sl_f16_to_f32((uint16_t)h) > x) break;
    }
    return sign | best;
}

static void test_conversions(void) {
    /* every f16 -> f32 -> f16 is the identity (NaNs: stay NaN), and the SIMD widening agrees */
    static uint16_t all[65536], back[65536];
    static float wide[65536], simd[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    sl_f16_to_f32_ref(wide, all, 65536);
    sl_f16_to_f32_n(simd, all, 65536);
    sl_f16_from_f32_ref(back, wide, 65536);
    int bad = 0, bad_simd = 0;
    for (int i = 0; i < 65536; i++) {
        int nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
        if (nan ? !isnan(wide[i]) : back[i] != i) bad++;
        if (nan ? !isnan(simd[i]) : bits(simd[i]) != bits(wide[i])) bad_simd++;
    }
    TU_CHECK(bad == 0, "f16 -> f32 -> f16 round trip: %d of 65536 differ", bad);
    TU_CHECK(bad_simd == 0, "f16 -> f32 %s vs scalar: %d differ", sl_f16_path_name(), bad_simd);
    TU_CHECK(sl_f16_to_f32(0x3c00) == 1.0f && sl_f16_to_f32(0x7bff) == 65504.0f &&
                 sl_f16_to_f32(0x0001) == ldexpf(1.0f, -24) && isinf(sl_f16_to_f32(0x7c00)),
             "f16 constants");
    /* f32 -> f16: boundaries against the oracle */
    const float edge[] = {0.0f,
                          -0.0f,
                          1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          65536.0f,
                          1e30f,
                          INFINITY,
                          -INFINITY,
                          ldexpf(1.0f, -24),
                          ldexpf(1.0f, -25),
                          ldexpf(1.5f, -25),
                          ldexpf(1.0f, -26),
                          ldexpf(1.0f, -14),
                          ldexpf(1023.5f, -24),
                          1.0f + ldexpf(1.0f, -11),
                          1.0f + ldexpf(3.0f, -11),
                          2049.0f,
                          2051.0f,
                          1e-10f,
                          3.14159265f,
                          -7.0e-6f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        uint16_t h = sl_f32_to_f16(edge[i]), o = oracle(edge[i]);
        TU_CHECK(h == o, "f32 -> f16 of %.9g: 0x%04x, nearest-even 0x%04x", (double)edge[i], h, o);
    }
    /* random f32 bit patterns (all exponents, NaNs included): SIMD == scalar; a sample against the oracle */
    enum { N = 1 << 22 };
    float *x = malloc(sizeof(float) * N);
    uint16_t *hs = malloc(2 * N), *hv = malloc(2 * N);
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        uint32_t u = s;
        if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(100 + (i >> 1) % 50) << 23); /* f16's range */
        x[i] = from_bits(u);
    }
    sl_f16_from_f32_ref(hs, x, N);
    sl_f16_from_f32(hv, x, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += hs[i] != hv[i];
    TU_CHECK(bad == 0, "f32 -> f16 %s vs scalar: %d of %d differ", sl_f16_path_name(), bad, N);
    bad = 0;
    for (int i = 0; i < N; i += 4099) /* NaN: any quiet NaN with the payload's top bits (checked above) */
        bad += isnan(x[i]) ? (hs[i] & 0x7e00) != 0x7e00 : hs[i] != oracle(x[i]);
    TU_CHECK(bad == 0, "f32 -> f16 scalar vs nearest-even oracle: %d differ", bad);
    free(x);
    free(hs);
    free(hv);
}

/* matmul(cast(A, f16), cast(B, f16)) == matmul(round(A), round(B)) bit for bit, on a transposed, strided
 * view; and the gradient of A through the f16 operand is an f16 value */
static void test_kernels(void) {
    const int64_t M = 13, K = 37, N = 11;
    for (int tB = 0; tB < 2; tB++) {
        tc t = {0};
        t.ctx = sl_ctx_new(256);
        sl_tensor *A = param(&t, 2, (int64_t[]){M, 2 * K}, 3.0f);
        sl_tensor *Bm = param(&t, 2, tB ? (int64_t[]){N, K} : (int64_t[]){K, N}, 3.0f);
        sl_tensor *As = sl_slice(t.ctx, A, 1, 5, K); /* a strided view: rows of 2K, K used */
        sl_tensor *a16 = sl_cast(t.ctx, sl_cont(t.ctx, As), SL_F16), *b16 = sl_cast(t.ctx, Bm, SL_F16);
        float *got = fwd(&t, sl_matmul(t.ctx, a16, b16, 0, tB));
        float *ref = fwd(&t, sl_matmul(t.ctx, sl_cont(t.ctx, sl_round_half(t.ctx, As, SL_F16)),
                                       sl_round_half(t.ctx, Bm, SL_F16), 0, tB));
        float *cast = fwd(&t, sl_round_half(t.ctx, As, SL_F16)); /* strided CAST (scalar-stride path) */
        int bad = 0, notf16 = 0;
        for (int64_t i = 0; i < M * N; i++) bad += bits(got[i]) != bits(ref[i]);
        for (int64_t i = 0; i < M * K; i++) {
            float v = t.pdata[0][(i / K) * 2 * K + 5 + i % K];
            notf16 += bits(cast[i]) != bits(sl_f16_to_f32(sl_f32_to_f16(v)));
        }
        TU_CHECK(bad == 0, "matmul f16 tB%d: %d of %lld differ from the f32 GEMM on widened operands", tB,
                 bad, (long long)(M * N));
        TU_CHECK(notf16 == 0, "cast f32 -> f16 -> f32 on a strided view: %d wrong", notf16);
        free(got);
        free(ref);
        free(cast);
        tc_free(&t);
    }
    /* backward: loss = sum(cast(a) @ cast(b) * R): the gradient of a arrives as a GEMM product and leaves
     * the f16 cast rounded to f16 (the autocast rule), so every element is an f16 value */
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *a = param(&t, 2, (int64_t[]){M, K}, 1.0f), *b = param(&t, 2, (int64_t[]){K, N}, 1.0f);
    sl_tensor *y = sl_matmul(t.ctx, sl_cast(t.ctx, a, SL_F16), sl_cast(t.ctx, b, SL_F16), 0, 0);
    float *rd = malloc(sizeof(float) * (size_t)(M * N));
    sl_rng_fill_normal(rd, M * N, 9, 99, 0.0f, 1.0f);
    sl_tensor *R = sl_new_tensor_2d(t.ctx, SL_F32, M, N);
    sl_tensor_bind(R, rd);
    sl_tensor *loss = sl_sum_to(t.ctx, sl_mul(t.ctx, y, R), sl_new_tensor_1d(t.ctx, SL_F32, 1));
    sl_graph *g = sl_graph_new(t.ctx);
    sl_graph_build_forward(g, loss);
    sl_graph_build_backward(g, loss, 1.0f);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute: %s", sl_errmsg());
    int notf16 = 0, nonzero = 0;
    for (int64_t i = 0; i < M * K; i++) {
        float v = t.gdata[0][i];
        notf16 += bits(v) != bits(sl_f16_to_f32(sl_f32_to_f16(v)));
        nonzero += v != 0;
    }
    TU_CHECK(notf16 == 0 && nonzero > 0, "gradient through an f16 cast: %d of %lld not f16 values", notf16,
             (long long)(M * K));
    sl_graph_free(g);
    free(rd);
    tc_free(&t);
}

int main(void) {
    sl_threads_set(2);
    test_conversions();
    test_kernels();
    return tu_finish("test_f16");
}
