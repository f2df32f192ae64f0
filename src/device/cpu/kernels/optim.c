/* State kernels of the CPU backend: AdamW over spans of the flat buffers, the gradient sum of squares,
 * scale and fill. Moved here from src/optim so the optimizer runs where the state lives (Note
 * [Device-resident state] in suanli/device.h). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/simd_math.h"
#include "suanli/device.h"

/* Note [AdamW order of operations]
 * Mirrors torch.optim.AdamW (single-tensor path) operation by operation so fp32 results agree to
 * rounding: p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = v*b2 + (1-b2)*g*g;
 * p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
 * Every element is computed with IEEE single-precision operations in that order (no FMA contraction),
 * so the SIMD width (SSE2 or AVX2) and the thread partition do not change a single bit. One parallel
 * region covers all spans: each thread updates a contiguous share of every span (no barriers). */
typedef struct {
    float b1, b2, eps, step_size, bc2_sqrt;
} adamw_k;

#define ADAMW_SPAN_BODY                                                                                      \
    for (int64_t k = 0; k < n; k++) {                                                                        \
        float gk = g[k] * gscale;                                                                            \
        p[k] *= decay;                                                                                       \
        mm[k] += (1.0f - c.b1) * (gk - mm[k]);                                                               \
        vv[k] = vv[k] * c.b2 + (1.0f - c.b2) * gk * gk;                                                      \
        float denom = sqrtf(vv[k]) / c.bc2_sqrt + c.eps;                                                     \
        p[k] += -c.step_size * (mm[k] / denom);                                                              \
    }

__attribute__((optimize("fp-contract=off"))) static void
adamw_span(float *restrict p, const float *restrict g, float *restrict mm, float *restrict vv, int64_t n,
           float decay, float gscale, adamw_k c) {
#pragma omp simd
    ADAMW_SPAN_BODY
}

#if defined(__x86_64__)
#include <immintrin.h>
/* Explicit AVX2: GCC does not vectorise ADAMW_SPAN_BODY (sqrtf may set errno), and the scalar loop's
 * sqrt and two divides per element made the update compute-bound. Each _mm256_* op is the IEEE single
 * operation of the scalar body in the same order (no FMA), so the result is bitwise the same. */
__attribute__((target("avx2"), optimize("fp-contract=off"))) static void
adamw_span_avx2(float *restrict p, const float *restrict g, float *restrict mm, float *restrict vv, int64_t n,
                float decay, float gscale, adamw_k c) {
    const __m256 vdecay = _mm256_set1_ps(decay), omb1 = _mm256_set1_ps(1.0f - c.b1),
                 b2 = _mm256_set1_ps(c.b2), omb2 = _mm256_set1_ps(1.0f - c.b2),
                 bc2 = _mm256_set1_ps(c.bc2_sqrt), eps = _mm256_set1_ps(c.eps),
                 nstep = _mm256_set1_ps(-c.step_size), vgs = _mm256_set1_ps(gscale);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 gk = _mm256_mul_ps(_mm256_loadu_ps(g + k), vgs);
        __m256 pk = _mm256_mul_ps(_mm256_loadu_ps(p + k), vdecay);
        __m256 mk = _mm256_loadu_ps(mm + k);
        mk = _mm256_add_ps(mk, _mm256_mul_ps(omb1, _mm256_sub_ps(gk, mk)));
        __m256 vk = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(vv + k), b2),
                                  _mm256_mul_ps(_mm256_mul_ps(omb2, gk), gk));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vk), bc2), eps);
        pk = _mm256_add_ps(pk, _mm256_mul_ps(nstep, _mm256_div_ps(mk, denom)));
        _mm256_storeu_ps(mm + k, mk);
        _mm256_storeu_ps(vv + k, vk);
        _mm256_storeu_ps(p + k, pk);
    }
    adamw_span(p + k, g + k, mm + k, vv + k, n - k, decay, gscale, c);
}
#endif

static int use_avx2(void) {
#if defined(__x86_64__)
    return sl_kern_isa() >= SL_KISA_AVX2;
#else
    return 0;
#endif
}

/* one span with the best available body */
static void adamw_span_any(float *p, const float *g, float *mm, float *vv, int64_t n, float decay,
                           float gscale, adamw_k c, int avx2) {
#if defined(__x86_64__)
    if (avx2) {
        adamw_span_avx2(p, g, mm, vv, n, decay, gscale, c);
        return;
    }
#endif
    (void)avx2;
    adamw_span(p, g, mm, vv, n, decay, gscale, c);
}

void sl_k_adamw(float *p, const float *g, float *m, float *v, const sl_adamw_span *spans, int n_spans,
                float lr, float gscale, sl_adamw_hparams hp, int64_t t) {
    double bc1 = 1.0 - pow((double)hp.beta1, (double)t), bc2 = 1.0 - pow((double)hp.beta2, (double)t);
    adamw_k c = {hp.beta1, hp.beta2, hp.eps, (float)(lr / bc1), (float)sqrt(bc2)};
    float dec_on = 1.0f - lr * hp.weight_decay;
    int64_t total = 0;
    for (int i = 0; i < n_spans; i++) total += spans[i].n;
    int avx2 = use_avx2();
#pragma omp parallel if (total > 32768)
    {
        int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
        for (int i = 0; i < n_spans; i++) {
            const sl_adamw_span *s = &spans[i];
            int64_t n = s->n, a = n * tid / nt, e = n * (tid + 1) / nt;
            if (e > a)
                adamw_span_any(p + s->p_offs + a, g + s->g_offs + a, m + s->s_offs + a, v + s->s_offs + a,
                               e - a, s->decay ? dec_on : 1.0f, gscale, c, avx2);
        }
    }
}

/* Note [Gradient sum of squares]
 * Sum of g[k]^2 in double over 32 lanes (lane j takes k = j mod 32), the lanes combined by halving (lane j
 * += lane j + w for w = 16, 8, 4, 2, 1), the tail added last. The products are exact in double and every
 * version adds the same numbers in the same order, so scalar, AVX2 and AVX-512 give the same bits. With 8
 * lanes (before) each lane's chain of dependent double adds (4 cycles each) bounded the pass at ~8 bytes
 * per cycle: 19 GB/s on 2 threads, half the memory bandwidth the AdamW pass reaches, 5 % of the bf16
 * GPT-2 124M step on an AMX host. 32 lanes make it memory-bound. */
enum { SUMSQ_LANES = 32 };
static double sumsq_combine(double acc[SUMSQ_LANES]) {
    for (int w = SUMSQ_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

static double sumsq_span(const float *g, int64_t n) {
    double acc[SUMSQ_LANES] = {0};
    int64_t k = 0;
    for (; k + SUMSQ_LANES <= n; k += SUMSQ_LANES)
        for (int j = 0; j < SUMSQ_LANES; j++) acc[j] += (double)g[k + j] * g[k + j];
    double s = sumsq_combine(acc);
    for (; k < n; k++) s += (double)g[k] * g[k];
    return s;
}

#if defined(__x86_64__)
/* 8 x 4 lanes: r[i] holds lanes 4i .. 4i+3 */
__attribute__((target("avx2"))) static double sumsq_span_avx2(const float *g, int64_t n) {
    __m256d r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_setzero_pd();
    int64_t k = 0;
    for (; k + SUMSQ_LANES <= n; k += SUMSQ_LANES)
        for (int i = 0; i < 8; i++) {
            __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(g + k + 4 * i));
            r[i] = _mm256_add_pd(r[i], _mm256_mul_pd(x, x));
        }
    double acc[SUMSQ_LANES];
    for (int i = 0; i < 8; i++) _mm256_storeu_pd(acc + 4 * i, r[i]);
    double s = sumsq_combine(acc);
    for (; k < n; k++) s += (double)g[k] * g[k];
    return s;
}

/* 4 x 8 lanes: z[i] holds lanes 8i .. 8i+7 */
__attribute__((target("avx512f"))) static double sumsq_span_avx512(const float *g, int64_t n) {
    __m512d z[4];
    for (int i = 0; i < 4; i++) z[i] = _mm512_setzero_pd();
    int64_t k = 0;
    for (; k + SUMSQ_LANES <= n; k += SUMSQ_LANES)
        for (int i = 0; i < 4; i++) {
            __m512d x = _mm512_cvtps_pd(_mm256_loadu_ps(g + k + 8 * i));
            z[i] = _mm512_add_pd(z[i], _mm512_mul_pd(x, x));
        }
    double acc[SUMSQ_LANES];
    for (int i = 0; i < 4; i++) _mm512_storeu_pd(acc + 8 * i, z[i]);
    double s = sumsq_combine(acc);
    for (; k < n; k++) s += (double)g[k] * g[k];
    return s;
}
#endif

/* 65536-element chunks summed in chunk order: deterministic for any thread count */
double sl_k_sumsq(const float *g, int64_t n) {
    enum { CHUNK = 65536, LOCAL = 64 };
    int64_t nchunks = (n + CHUNK - 1) / CHUNK;
    double local[LOCAL];
    double *part = nchunks <= LOCAL ? local : malloc(sizeof(double) * (size_t)nchunks);
    if (!part) { /* sequential, same order */
        double ss = 0;
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t a = c * CHUNK, b = a + CHUNK < n ? a + CHUNK : n;
            ss += sumsq_span(g + a, b - a);
        }
        return ss;
    }
    int avx2 = use_avx2();
#if defined(__x86_64__)
    int avx512 = sl_kern_isa() >= SL_KISA_AVX512;
#else
    int avx512 = 0;
#endif
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t a = c * CHUNK, b = a + CHUNK < n ? a + CHUNK : n;
#if defined(__x86_64__)
        if (avx512) {
            part[c] = sumsq_span_avx512(g + a, b - a);
            continue;
        }
        if (avx2) {
            part[c] = sumsq_span_avx2(g + a, b - a);
            continue;
        }
#endif
        part[c] = sumsq_span(g + a, b - a);
    }
    (void)avx2, (void)avx512;
    double ss = 0;
    for (int64_t c = 0; c < nchunks; c++) ss += part[c];
    if (part != local) free(part);
    return ss;
}

void sl_k_scale_span(float *x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n > 32768)
    for (int64_t k = 0; k < n; k++) x[k] *= s;
}

void sl_k_fill_span(float *x, int64_t n, float v) {
#pragma omp parallel for simd schedule(static) if (n > 32768)
    for (int64_t k = 0; k < n; k++) x[k] = v;
}

sl_status sl_k_fill(sl_tensor *n) {
    sl_k_fill_span(n->data, sl_nelements(n), n->fparams[0]);
    return SL_OK;
}
