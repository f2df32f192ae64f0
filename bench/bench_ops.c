/* bench_ops.c — `suanli bench ops`: sgemm (and bf16 gemm) on GPT-2 124M training shapes.
 *
 * For BT in {256, 1024} and each Linear (out, in) of GPT-2 124M, the three GEMMs of training:
 *   fwd  Y[BT,out]  = X[BT,in] @ W[out,in]^T   NT  (M=BT,  N=out, K=in)
 *   dX   dX[BT,in]  = dY[BT,out] @ W[out,in]   NN  (M=BT,  N=in,  K=out)
 *   dW   dW[out,in] = dY[BT,out]^T @ X[BT,in]  TN  (M=out, N=in,  K=BT)
 * at 1 and N threads, through suanli, OpenBLAS (cblas_sgemm) and oneDNN (dnnl_sgemm), interleaved in the
 * same run (this machine is shared and noisy: medians of --reps runs, and ratios). The anchors are loaded
 * with dlopen so suanli has no link dependency on them; a missing one prints "n/a".
 * The fp32 FMA peak is measured in the same run (12 independent FMA chains per thread, widest vectors
 * the CPU has), and each result is reported as a percentage of it. */
#include "bench_ops.h"

#include <dlfcn.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/cpu/kernels/gemm.h"
#include "suanli/base.h"
#include "suanli/graph.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- anchors (dlopen) ---- */
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                               float, float *, int);
typedef void (*openblas_set_threads_fn)(int);
typedef const char *(*openblas_str_fn)(void);
typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                             const float *, int64_t, float, float *, int64_t);
typedef int (*dnnl_gemm_bf16_fn)(char, char, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t,
                                 const uint16_t *, int64_t, float, float *, int64_t);

static struct {
    cblas_sgemm_fn ob_sgemm;
    openblas_set_threads_fn ob_threads;
    const char *ob_core, *ob_config;
    dnnl_sgemm_fn dn_sgemm;
    dnnl_gemm_bf16_fn dn_bf16;
} anc;

static void anchors_load(void) {
    /* OpenBLAS's pthread workers spin for 2^28 cycles (~70 ms) after each call before they sleep, on the
     * cores the next library's timed call then runs on: at 2 threads single rows of suanli (the library timed
     * after oneDNN, which is timed after OpenBLAS) read 0.5-0.8x in about half of the runs. 2^4 cycles puts
     * them to sleep at once (the user's own setting wins). */
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
    void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
    if (h) {
        anc.ob_sgemm = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
        anc.ob_threads = (openblas_set_threads_fn)dlsym(h, "openblas_set_num_threads");
        openblas_str_fn core = (openblas_str_fn)dlsym(h, "openblas_get_corename");
        openblas_str_fn cfg = (openblas_str_fn)dlsym(h, "openblas_get_config");
        anc.ob_core = core ? core() : "?";
        anc.ob_config = cfg ? cfg() : "?";
    }
    h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libdnnl.so", RTLD_NOW | RTLD_LOCAL);
    if (h) {
        anc.dn_sgemm = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm");
        anc.dn_bf16 = (dnnl_gemm_bf16_fn)dlsym(h, "dnnl_gemm_bf16bf16f32");
    }
}

static void set_threads(int t) {
#ifdef _OPENMP
    omp_set_num_threads(t);
#endif
    if (anc.ob_threads) anc.ob_threads(t);
}

/* ---- FMA peak ---- */
#define PEAK_ITERS 20000000LL

/* 12 independent FMA chains; the compiler cannot reassociate or drop them. */
#define SL_FMA12(T, FMA, SET1, STORE, W)                                                                     \
    T a0 = SET1(0.f), a1 = SET1(1.f), a2 = SET1(2.f), a3 = SET1(3.f), a4 = SET1(4.f), a5 = SET1(5.f);        \
    T a6 = SET1(6.f), a7 = SET1(7.f), a8 = SET1(8.f), a9 = SET1(9.f), a10 = SET1(10.f), a11 = SET1(11.f);    \
    const T x = SET1(0.999999f), y = SET1(1e-7f);                                                            \
    for (int64_t n = 0; n < iters; n++) {                                                                    \
        a0 = FMA(a0, x, y), a1 = FMA(a1, x, y), a2 = FMA(a2, x, y), a3 = FMA(a3, x, y);                      \
        a4 = FMA(a4, x, y), a5 = FMA(a5, x, y), a6 = FMA(a6, x, y), a7 = FMA(a7, x, y);                      \
        a8 = FMA(a8, x, y), a9 = FMA(a9, x, y), a10 = FMA(a10, x, y), a11 = FMA(a11, x, y);                  \
    }                                                                                                        \
    float t[W], s = 0;                                                                                       \
    T all[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};                                          \
    for (int i = 0; i < 12; i++) {                                                                           \
        STORE(t, all[i]);                                                                                    \
        for (int j = 0; j < W; j++) s += t[j];                                                               \
    }                                                                                                        \
    return (double)s;

__attribute__((target("avx512f"))) static double fma_loop_zmm(int64_t iters) {
    SL_FMA12(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_storeu_ps, 16)
}

__attribute__((target("avx2,fma"))) static double fma_loop_ymm(int64_t iters) {
    SL_FMA12(__m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_storeu_ps, 8)
}

/* FLOP per iteration of the loop that runs here (0: no FMA unit we can drive). */
static int peak_flops_per_iter(void) {
    const sl_cpu_features *f = sl_cpu_features_get();
    if (f->avx512f) return 12 * 16 * 2;
    if (f->avx2 && f->fma) return 12 * 8 * 2;
    return 0;
}

/* the best of 3 timed runs of `loop` (PEAK_ITERS iterations of `flops` FLOP) on nthr threads, in GFLOP/s */
static double best_of_3(double (*loop)(int64_t), double flops, int nthr) {
    double best = 0.0;
    volatile double sink = 0.0;
    for (int trial = 0; trial < 3; trial++) {
        double t0 = sl_time_sec();
#ifdef _OPENMP
#pragma omp parallel num_threads(nthr) reduction(+ : sink)
#endif
        sink += loop(PEAK_ITERS);
        double dt = sl_time_sec() - t0;
        double g = flops * (double)PEAK_ITERS * nthr / dt * 1e-9;
        if (g > best) best = g;
    }
    (void)sink;
    return best;
}

double sl_bench_fma_peak(int nthr) {
    int per = peak_flops_per_iter();
    if (!per) return 0.0;
    return best_of_3(sl_cpu_features_get()->avx512f ? fma_loop_zmm : fma_loop_ymm, (double)per, nthr);
}

/* 12 independent vdpbf16ps chains in registers: 64 FLOP each (16 lanes x 2 bf16 pairs x multiply-add) */
#define SL_DP(a) a = _mm512_dpbf16_ps(a, x, y)
__attribute__((target("avx512f,avx512bf16"))) static double dpbf16_loop(int64_t iters) {
    __m512 a0 = _mm512_set1_ps(0.f), a1 = _mm512_set1_ps(1.f), a2 = _mm512_set1_ps(2.f),
           a3 = _mm512_set1_ps(3.f), a4 = _mm512_set1_ps(4.f), a5 = _mm512_set1_ps(5.f),
           a6 = _mm512_set1_ps(6.f), a7 = _mm512_set1_ps(7.f), a8 = _mm512_set1_ps(8.f),
           a9 = _mm512_set1_ps(9.f), a10 = _mm512_set1_ps(10.f), a11 = _mm512_set1_ps(11.f);
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), y = (__m512bh)_mm512_set1_epi32(0x33d633d6);
    for (int64_t n = 0; n < iters; n++) {
        SL_DP(a0), SL_DP(a1), SL_DP(a2), SL_DP(a3), SL_DP(a4), SL_DP(a5);
        SL_DP(a6), SL_DP(a7), SL_DP(a8), SL_DP(a9), SL_DP(a10), SL_DP(a11);
    }
    __m512 all[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
    float t[16], s = 0;
    for (int i = 0; i < 12; i++) {
        _mm512_storeu_ps(t, all[i]);
        for (int j = 0; j < 16; j++) s += t[j];
    }
    return (double)s;
}
#undef SL_DP

/* 4 independent tdpbf16ps chains on tiles loaded once (the AMX GEMM kernel's 2 x 2 block without its
 * loads): 16 x 16 x 32 x 2 = 16384 FLOP each; iters / 16 iterations, so a call takes about as long as the
 * vector loops */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} bench_tilecfg;
__attribute__((target("amx-tile,amx-bf16"))) static double amx_loop(int64_t iters) {
    static const bench_tilecfg cfg = {
        .palette = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};
    uint16_t src[16 * 32] __attribute__((aligned(64)));
    float out[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) src[i] = (uint16_t)(i % 3 ? 0x3c00 : 0xbc00); /* +-2^-7 */
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    for (int64_t n = 0; n < iters / 16; n++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return (double)out[0];
}

double sl_bench_bf16_peak(int nthr) {
    const sl_cpu_features *f = sl_cpu_features_get();
    const char *k = sl_gemm_bf16_kernel_name(); /* the peak of the kernel that runs */
    if (f->amx_bf16 && !strcmp(k, "amx")) return best_of_3(amx_loop, 4.0 * 16384.0 / 16.0, nthr);
    if (!f->avx512_bf16 || strcmp(k, "avx512_bf16")) return sl_bench_fma_peak(nthr); /* widened: f32 FMAs */
    return best_of_3(dpbf16_loop, 12.0 * 64.0, nthr);
}

/* 1-minute load average (-1 if unknown): how busy the shared machine was. */
static double loadavg(void) {
    double l = -1.0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1.0;
        fclose(f);
    }
    return l;
}

/* ---- timing ---- */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum { LIB_SUANLI, LIB_OPENBLAS, LIB_ONEDNN, LIB_COUNT };
static const char *lib_names[LIB_COUNT] = {"suanli", "openblas", "onednn"};

typedef struct gcase {
    const char *pass, *trans;
    int tA, tB, bf16;
    int64_t M, N, K;
} gcase;

static int lib_available(int lib, int bf16) {
    if (lib == LIB_SUANLI) return 1;
    if (bf16) return lib == LIB_ONEDNN && anc.dn_bf16;
    return lib == LIB_OPENBLAS ? anc.ob_sgemm != NULL : anc.dn_sgemm != NULL;
}

/* One call of case c through library lib; seconds, or -1 if the library refused the call. */
static double run_once(int lib, const gcase *c, const void *A, const void *B, float *C) {
    int64_t lda = c->tA ? c->M : c->K, ldb = c->tB ? c->K : c->N, ldc = c->N;
    int st = 0;
    double t0 = sl_time_sec();
    if (c->bf16) {
        if (lib == LIB_SUANLI)
            sl_gemm_bf16(c->tA, c->tB, c->M, c->N, c->K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
        else
            st = anc.dn_bf16(c->tA ? 'T' : 'N', c->tB ? 'T' : 'N', c->M, c->N, c->K, 1.0f, A, lda, B, ldb,
                             0.0f, C, ldc);
    } else if (lib == LIB_SUANLI) {
        sl_sgemm(c->tA, c->tB, c->M, c->N, c->K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
    } else if (lib == LIB_OPENBLAS) {
        anc.ob_sgemm(101, c->tA ? 112 : 111, c->tB ? 112 : 111, (int)c->M, (int)c->N, (int)c->K, 1.0f, A,
                     (int)lda, B, (int)ldb, 0.0f, C, (int)ldc);
    } else {
        st = anc.dn_sgemm(c->tA ? 'T' : 'N', c->tB ? 'T' : 'N', c->M, c->N, c->K, 1.0f, A, lda, B, ldb, 0.0f,
                          C, ldc);
    }
    double dt = sl_time_sec() - t0;
    return st == 0 ? dt : -1.0; /* dnnl_status_t: 0 is dnnl_success */
}

typedef struct brow {
    gcase c;
    int threads;
    double gflops[LIB_COUNT]; /* median; < 0: n/a */
    double paired[LIB_COUNT]; /* Note [Paired ratios]: median over reps of t_lib / t_suanli; < 0: n/a */
    double peak;
} brow;

/* Note [Paired ratios]
 * vs_<lib> is the ratio of the two medians of --reps single calls. Each rep also runs suanli and the anchor
 * back to back (in alternating order), so the ratio of their two times within a rep compares them in the
 * same seconds of a VM whose speed drifts by the minute; vs_<lib>_paired is the median of those per-rep
 * ratios. The summary gives, per dtype and thread count, the median and the worst row of both. */
static double paired_median(const double *num, const double *den, int n) {
    double r[64];
    for (int i = 0; i < n; i++) r[i] = num[i] / den[i];
    return median(r, n);
}
/* median and minimum of the rows' vs_onednn (paired: of vs_onednn_paired) for one dtype and thread count;
 * returns the number of rows with a value */
static int summary_of(const brow *rows, int nrows, int bf16, int threads, int paired, double *med,
                      double *worst) {
    double v[256];
    int n = 0;
    for (int i = 0; i < nrows && n < 256; i++) {
        const brow *r = &rows[i];
        if (r->c.bf16 != bf16 || r->threads != threads) continue;
        double x = paired ? r->paired[LIB_ONEDNN]
                          : (r->gflops[LIB_ONEDNN] > 0 ? r->gflops[0] / r->gflops[LIB_ONEDNN] : -1.0);
        if (x > 0) v[n++] = x;
    }
    if (!n) return 0;
    *med = median(v, n); /* sorts v */
    *worst = v[0];
    return n;
}

/* the summary of summary_of per dtype and thread count: text lines, or JSON objects (comma-separated) */
static void print_summary(const brow *rows, int nrows, const int *thr_list, int nthr, int json) {
    if (!json)
        printf(
            "against oneDNN, median (worst) of the rows; paired: per-rep ratios (Note [Paired ratios]):\n");
    int ns = 0;
    for (int bf = 0; bf < 2; bf++)
        for (int t = 0; t < nthr; t++) {
            double m, w, pm, pw;
            if (!summary_of(rows, nrows, bf, thr_list[t], 0, &m, &w) ||
                !summary_of(rows, nrows, bf, thr_list[t], 1, &pm, &pw))
                continue;
            if (json)
                printf(
                    "%s{\"dtype\":\"%s\",\"threads\":%d,\"median_vs_onednn\":%.3f,\"worst_vs_onednn\":%.3f,"
                    "\"median_vs_onednn_paired\":%.3f,\"worst_vs_onednn_paired\":%.3f}",
                    ns++ ? "," : "", bf ? "bf16" : "fp32", thr_list[t], m, w, pm, pw);
            else
                printf("  %s, %d thread(s): %.3fx (%.3fx), paired %.3fx (%.3fx)\n", bf ? "bf16" : "fp32",
                       thr_list[t], m, w, pm, pw);
        }
}

/* one row of the JSON "rows" array */
static void print_row_json(const brow *r, int first) {
    printf("%s{\"dtype\":\"%s\",\"pass\":\"%s\",\"trans\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,"
           "\"threads\":%d,\"peak_gflops\":%.2f",
           first ? "" : ",", r->c.bf16 ? "bf16" : "fp32", r->c.pass, r->c.trans, (long long)r->c.M,
           (long long)r->c.N, (long long)r->c.K, r->threads, r->peak);
    for (int lib = 0; lib < LIB_COUNT; lib++) {
        if (r->gflops[lib] < 0)
            printf(",\"%s_gflops\":null", lib_names[lib]);
        else
            printf(",\"%s_gflops\":%.2f", lib_names[lib], r->gflops[lib]);
    }
    printf(",\"pct_peak\":%.2f", r->peak > 0 ? 100.0 * r->gflops[0] / r->peak : 0.0);
    for (int lib = 1; lib < LIB_COUNT; lib++) {
        if (r->gflops[lib] > 0)
            printf(",\"vs_%s\":%.3f", lib_names[lib], r->gflops[0] / r->gflops[lib]);
        else
            printf(",\"vs_%s\":null", lib_names[lib]);
        if (r->paired[lib] > 0)
            printf(",\"vs_%s_paired\":%.3f", lib_names[lib], r->paired[lib]);
        else
            printf(",\"vs_%s_paired\":null", lib_names[lib]);
    }
    printf("}");
}

static void print_num(FILE *f, double v, const char *fmt) {
    if (v < 0)
        fprintf(f, "%8s", "n/a");
    else
        fprintf(f, fmt, v);
}

/* ---- --device: the GEMMs as MATMUL nodes through a backend ----
 * Note [bench ops --device]
 * With --device NAME (not cpu) each fp32 case runs as one MATMUL node (sl_matmul, a planned graph on the
 * backend, operands in its buffers, timed to sl_backend_synchronize) on NAME and, in the same run and
 * interleaved, on the CPU backend through the same path at --threads threads: the device's GFLOP/s, the
 * CPU backend's, their ratio, and the largest difference of the outputs relative to the largest CPU output
 * (a case beyond 1e-4 fails the run: exit 1). bf16 rows are left out (the OpenCL backend refuses bf16). */
typedef struct mm_run {
    sl_backend *be;
    sl_ctx *ctx;
    sl_graph *g;
    sl_buffer *ba, *bb;
    sl_tensor *y;
} mm_run;

static void mm_free(mm_run *r) {
    if (r->ba) sl_backend_free(r->be, r->ba);
    if (r->bb) sl_backend_free(r->be, r->bb);
    sl_graph_free(r->g);
    sl_ctx_free(r->ctx);
    memset(r, 0, sizeof *r);
}

static sl_status mm_setup(mm_run *r, sl_backend *be, const gcase *c, const float *A, const float *B) {
    memset(r, 0, sizeof *r);
    r->be = be;
    r->ctx = sl_ctx_new(16);
    sl_tensor *a =
        c->tA ? sl_new_tensor_2d(r->ctx, SL_F32, c->K, c->M) : sl_new_tensor_2d(r->ctx, SL_F32, c->M, c->K);
    sl_tensor *b =
        c->tB ? sl_new_tensor_2d(r->ctx, SL_F32, c->N, c->K) : sl_new_tensor_2d(r->ctx, SL_F32, c->K, c->N);
    sl_set_input(a);
    sl_set_input(b);
    sl_tensor *y = r->y = sl_matmul(r->ctx, a, b, c->tA, c->tB);
    r->g = sl_graph_new(r->ctx);
    sl_graph_build_forward(r->g, y);
    SL_TRY(sl_graph_plan(r->g, be, NULL));
    SL_TRY(sl_backend_alloc(be, sl_nbytes(a), &r->ba));
    SL_TRY(sl_backend_alloc(be, sl_nbytes(b), &r->bb));
    sl_tensor_bind_buffer(a, r->ba, 0);
    sl_tensor_bind_buffer(b, r->bb, 0);
    SL_TRY(sl_tensor_copy_in(a, A));
    SL_TRY(sl_tensor_copy_in(b, B));
    return sl_backend_synchronize(be);
}

/* CPU seconds of this process (every thread) */
static double cpu_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* wall seconds of one run; *cpu: the process's CPU seconds during it */
static double mm_time(mm_run *r, double *cpu) {
    double t0 = sl_time_sec(), c0 = cpu_sec();
    if (sl_graph_compute(r->g, NULL, NULL) != SL_OK || sl_backend_synchronize(r->be) != SL_OK) return -1.0;
    *cpu = cpu_sec() - c0;
    return sl_time_sec() - t0;
}

/* max |d - c| / max |c| of the two runs' outputs (-1 when they cannot be read) */
static double mm_diff(mm_run *d, mm_run *c, int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    double md = -1.0;
    if (x && y && sl_tensor_copy_out(d->y, x) == SL_OK && sl_tensor_copy_out(c->y, y) == SL_OK) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; i++) {
            double e = fabs((double)x[i] - (double)y[i]), v = fabs((double)y[i]);
            num = e > num ? e : num;
            den = v > den ? v : den;
        }
        md = den > 0 ? num / den : num;
    }
    free(x);
    free(y);
    return md;
}

static int bench_ops_device(const char *dev, gcase *cases, int nc, const float *A, const float *B, int json,
                            int threads, int reps) {
    sl_backend *be = sl_backend_get(dev), *cpu = sl_backend_get("cpu");
    if (!be) {
        fprintf(stderr, "bench ops: --device %s: %s\n", dev, sl_errmsg());
        return 2;
    }
    sl_threads_set(threads);
    double load0 = loadavg();
    if (!json) {
        printf("suanli bench ops --device %s: MATMUL nodes on %s vs the cpu backend (gemm kernel %s, cpu isa "
               "%s, "
               "%d thread(s)), reps %d (median), GFLOP/s\n",
               dev, be->name, sl_gemm_kernel_name(), sl_cpu_isa_name(), threads, reps);
        printf("load average at start: %.2f\n", load0);
        printf("%-4s %-5s %-5s %6s %6s %6s %10s %10s %8s %9s\n", "dt", "pass", "trans", "M", "N", "K", dev,
               "cpu", "vs_cpu", "max_rel");
        fflush(stdout);
    } else {
        printf("{\"bench\":\"ops\",\"device\":\"%s\",\"kernel\":\"%s\",\"isa\":\"%s\",\"threads\":%d,"
               "\"reps\":%d,\"load_avg_start\":%.2f,\"rows\":[",
               dev, sl_gemm_kernel_name(), sl_cpu_isa_name(), threads, reps, load0);
    }
    int first = 1, rc = 0;
    double logsum = 0;
    int nlog = 0;
    for (int i = 0; i < nc; i++) {
        const gcase *c = &cases[i];
        if (c->bf16) continue;
        mm_run rd, rcpu;
        if (mm_setup(&rd, be, c, A, B) != SL_OK || mm_setup(&rcpu, cpu, c, A, B) != SL_OK) {
            fprintf(stderr, "bench ops: --device %s: %s\n", dev, sl_errmsg());
            rc = 1;
            break;
        }
        double td[64], tc[64], cd[64], cc[64], flop = 2.0 * (double)c->M * (double)c->N * (double)c->K;
        int ok = mm_time(&rd, cd) >= 0 && mm_time(&rcpu, cc) >= 0; /* warm-up */
        for (int r = 0; ok && r < reps; r++) {
            if (r % 2) { /* alternate the order to cancel drift */
                tc[r] = mm_time(&rcpu, &cc[r]);
                td[r] = mm_time(&rd, &cd[r]);
            } else {
                td[r] = mm_time(&rd, &cd[r]);
                tc[r] = mm_time(&rcpu, &cc[r]);
            }
            ok = td[r] >= 0 && tc[r] >= 0;
        }
        double md = ok ? mm_diff(&rd, &rcpu, c->M * c->N) : -1.0;
        mm_free(&rd);
        mm_free(&rcpu);
        if (ok && !(md >= 0 && md <= 1e-4)) {
            fprintf(stderr,
                    "bench ops: --device %s: %s %s M%lld N%lld K%lld differs from the cpu backend: %.3g\n",
                    dev, c->pass, c->trans, (long long)c->M, (long long)c->N, (long long)c->K, md);
            rc = 1;
        }
        if (!ok) {
            fprintf(stderr, "bench ops: --device %s: %s\n", dev, sl_errmsg());
            rc = 1;
            break;
        }
        double gd = flop / median(td, reps) * 1e-9, gc = flop / median(tc, reps) * 1e-9;
        /* per CPU-second of the whole process: steadier than wall time when other jobs share the cores */
        double gdc = flop / median(cd, reps) * 1e-9;
        logsum += log(gd / gc);
        nlog++;
        if (json) {
            printf("%s{\"dtype\":\"fp32\",\"pass\":\"%s\",\"trans\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,"
                   "\"device_gflops\":%.2f,\"cpu_gflops\":%.2f,\"vs_cpu\":%.4f,\"max_rel_diff\":%.3g,"
                   "\"device_gflop_per_cpu_s\":%.2f}",
                   first ? "" : ",", c->pass, c->trans, (long long)c->M, (long long)c->N, (long long)c->K, gd,
                   gc, gd / gc, md, gdc);
        } else {
            printf("%-4s %-5s %-5s %6lld %6lld %6lld %10.1f %10.1f %7.1f%% %9.1e\n", "fp32", c->pass,
                   c->trans, (long long)c->M, (long long)c->N, (long long)c->K, gd, gc, 100.0 * gd / gc, md);
            fflush(stdout);
        }
        first = 0;
    }
    double geo = nlog ? exp(logsum / nlog) : 0;
    if (json)
        printf("],\"geomean_vs_cpu\":%.4f,\"load_avg_end\":%.2f}\n", geo, loadavg());
    else
        printf("geometric mean %s / cpu: %.1f%%; load average at end: %.2f\n", dev, 100.0 * geo, loadavg());
    return rc;
}

/* The GEMMs of GPT-2 124M's Linear layers (forward, dX, dW) at B*T = 256 (and 1024 unless quick), plus the
 * bf16 GEMMs (forward, dX, dW) at 256 (bench train's B4 T64) and 1024 unless quick; returns the count (<=
 * 60). */
static int gpt2_cases(int quick, gcase *cases) {
    static const int64_t lin[5][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}, {50304, 768}};
    const int64_t bts[2] = {256, 1024};
    int nc = 0;
    for (int bi = 0; bi < (quick ? 1 : 2); bi++) {
        int64_t BT = bts[bi];
        for (int l = 0; l < 5; l++) {
            int64_t out = lin[l][0], in = lin[l][1];
            cases[nc++] = (gcase){"fwd", "NT", 0, 1, 0, BT, out, in};
            cases[nc++] = (gcase){"dX", "NN", 0, 0, 0, BT, in, out};
            cases[nc++] = (gcase){"dW", "TN", 1, 0, 0, out, in, BT};
        }
    }
    for (int bi = 0; bi < (quick ? 0 : 2); bi++) {
        int64_t BT = bts[bi];
        for (int l = 0; l < 5; l++) {
            int64_t out = lin[l][0], in = lin[l][1];
            cases[nc++] = (gcase){"fwd", "NT", 0, 1, 1, BT, out, in};
            cases[nc++] = (gcase){"dX", "NN", 0, 0, 1, BT, in, out};
            cases[nc++] = (gcase){"dW", "TN", 1, 0, 1, out, in, BT};
        }
    }
    return nc;
}

/* the fp32 FMA peak (and the bf16 one) at each thread count, kept where larger than the values given: the
 * peaks are measured before and after the GEMMs, and on a shared machine either may land in a busy moment */
static void measure_peaks(const int *thr_list, int n, int bf16, double *peak, double *peak_bf16) {
    for (int t = 0; t < n; t++) {
        double p = sl_bench_fma_peak(thr_list[t]);
        if (p > peak[t]) peak[t] = p;
        p = bf16 ? sl_bench_bf16_peak(thr_list[t]) : 0.0;
        if (p > peak_bf16[t]) peak_bf16[t] = p;
    }
}

int sl_bench_ops(int argc, char **argv) {
    int json = 0, quick = 0, maxthr = 2, reps = 3, reps_set = 0;
    const char *device = "cpu";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--threads") || !strcmp(argv[i], "--reps")) {
            /* atoi read '3x' as 3, overflowed on 99999999999; a missing value was an "unknown flag" */
            const char *v = i + 1 < argc ? argv[i + 1] : "";
            char *end;
            long x = strtol(v, &end, 10);
            if (!*v || *end || x < 1 || x > 1024) {
                fprintf(stderr, "bench ops: %s: expected an integer in 1..1024, got '%s'\n", argv[i], v);
                return 2;
            }
            if (argv[i][2] == 't')
                maxthr = (int)x;
            else
                reps = (int)x, reps_set = 1;
            i++;
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strncmp(argv[i], "--device=", 9))
            device = argv[i] + 9;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli bench ops [--json] [--threads N] [--reps R] [--quick] [--device NAME]\n"
                   "  --device NAME: MATMUL nodes on backend NAME (e.g. opencl, opencl:1) beside the cpu "
                   "backend at N threads, same run\n");
            return 0;
        } else if (!strcmp(argv[i], "--device")) { /* last on the line: it was an "unknown flag" */
            fprintf(stderr, "bench ops: --device: missing value\n");
            return 2;
        } else {
            fprintf(stderr, "bench ops: unknown flag '%s'\n", argv[i]);
            return 2;
        }
    }
    if (quick && !reps_set) reps = 1;
    if (reps > 64) reps = 64;
    int on_device = strcmp(device, "cpu") != 0;
    if (!on_device) anchors_load();
    int thr_list[2] = {1, maxthr}, nthr_list = maxthr > 1 ? 2 : 1;
    double peak[2] = {0, 0}, peak_bf16[2] = {0, 0}; /* bf16 rows: the peak of the kernel that runs them */
    int any_bf16 = !quick;
    if (!on_device) measure_peaks(thr_list, nthr_list, any_bf16, peak, peak_bf16);
    double load0 = loadavg();

    gcase cases[64];
    int nc = gpt2_cases(quick, cases);

    /* operands sized for the largest case, filled once */
    int64_t maxa = 0, maxb = 0, maxc = 0;
    for (int i = 0; i < nc; i++) {
        if (cases[i].M * cases[i].K > maxa) maxa = cases[i].M * cases[i].K;
        if (cases[i].K * cases[i].N > maxb) maxb = cases[i].K * cases[i].N;
        if (cases[i].M * cases[i].N > maxc) maxc = cases[i].M * cases[i].N;
    }
    float *A = sl_malloc_aligned((size_t)maxa * 4), *B = sl_malloc_aligned((size_t)maxb * 4);
    float *C = sl_malloc_aligned((size_t)maxc * 4);
    uint16_t *Ah = sl_malloc_aligned((size_t)maxa * 2), *Bh = sl_malloc_aligned((size_t)maxb * 2);
    brow *rows = calloc((size_t)nc * 2, sizeof *rows);
    if (!A || !B || !C || !Ah || !Bh || !rows) {
        fprintf(stderr, "bench ops: out of memory\n");
        return 1;
    }
    sl_rng_fill_normal(A, maxa, 1, 0, 0.0f, 1.0f);
    sl_rng_fill_normal(B, maxb, 1, 1, 0.0f, 0.02f);
    for (int64_t i = 0; i < maxa; i++) Ah[i] = sl_f32_to_bf16(A[i]);
    for (int64_t i = 0; i < maxb; i++) Bh[i] = sl_f32_to_bf16(B[i]);
    if (on_device) {
        int rc = bench_ops_device(device, cases, nc, A, B, json, maxthr, reps);
        sl_free_aligned(A), sl_free_aligned(B), sl_free_aligned(C), sl_free_aligned(Ah), sl_free_aligned(Bh);
        free(rows);
        return rc;
    }

    const char *coretype = getenv("OPENBLAS_CORETYPE");
    if (!json) {
        printf("suanli bench ops: gemm kernel %s (bf16: %s), cpu isa %s, reps %d (median), GFLOP/s\n",
               sl_gemm_kernel_name(), sl_gemm_bf16_kernel_name(), sl_cpu_isa_name(), reps);
        printf("anchors: openblas %s (core %s, OPENBLAS_CORETYPE=%s), onednn %s\n",
               anc.ob_sgemm ? "yes" : "n/a", anc.ob_core ? anc.ob_core : "-", coretype ? coretype : "unset",
               anc.dn_sgemm ? "yes" : "n/a");
        for (int t = 0; t < nthr_list; t++)
            printf("fp32 FMA peak, %d thread(s): %.1f GFLOP/s (measured again at the end; %%peak uses the "
                   "larger)\n",
                   thr_list[t], peak[t]);
        for (int t = 0; any_bf16 && t < nthr_list; t++)
            printf("bf16 peak (%s), %d thread(s): %.1f GFLOP/s\n", sl_gemm_bf16_kernel_name(), thr_list[t],
                   peak_bf16[t]);
        printf("load average at start: %.2f\n", load0);
        printf("%-4s %-5s %-5s %6s %6s %6s %3s %8s %6s %8s %8s %7s %7s\n", "dt", "pass", "trans", "M", "N",
               "K", "thr", "suanli", "%peak", "openblas", "onednn", "vs_ob", "vs_dnnl");
        fflush(stdout);
    }
    int nrows = 0;
    double dt[LIB_COUNT][64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < nc; i++) {
        const gcase *c = &cases[i];
        const void *a = c->bf16 ? (const void *)Ah : (const void *)A,
                   *b = c->bf16 ? (const void *)Bh : (const void *)B;
        double flop = 2.0 * (double)c->M * (double)c->N * (double)c->K;
        for (int t = 0; t < nthr_list; t++) {
            set_threads(thr_list[t]);
            int ok[LIB_COUNT];
            for (int lib = 0; lib < LIB_COUNT; lib++) /* warm-up; a library that refuses the case is n/a */
                ok[lib] = lib_available(lib, c->bf16) && run_once(lib, c, a, b, C) >= 0.0;
            for (int r = 0; r < reps; r++)
                for (int l = 0; l < LIB_COUNT; l++) {
                    int lib = r % 2 ? LIB_COUNT - 1 - l : l; /* alternate the order to cancel drift */
                    if (ok[lib]) dt[lib][r] = run_once(lib, c, a, b, C);
                }
            brow *row = &rows[nrows++];
            row->c = *c;
            row->threads = thr_list[t];
            row->peak = c->bf16 ? peak_bf16[t] : peak[t];
            for (int lib = 0; lib < LIB_COUNT; lib++)
                row->paired[lib] = lib && ok[lib] && ok[0] ? paired_median(dt[lib], dt[0], reps) : -1.0;
            for (int lib = 0; lib < LIB_COUNT; lib++)
                row->gflops[lib] = ok[lib] ? flop / median(dt[lib], reps) * 1e-9 : -1.0;
            if (!json) {
                double *g = row->gflops;
                printf("%-4s %-5s %-5s %6lld %6lld %6lld %3d ", c->bf16 ? "bf16" : "fp32", c->pass, c->trans,
                       (long long)c->M, (long long)c->N, (long long)c->K, row->threads);
                print_num(stdout, g[0], "%8.1f");
                printf(" %5.1f%% ", row->peak > 0 ? 100.0 * g[0] / row->peak : 0.0);
                print_num(stdout, g[1], "%8.1f");
                printf(" ");
                print_num(stdout, g[2], "%8.1f");
                printf(" ");
                if (g[1] > 0)
                    printf("%6.2fx ", g[0] / g[1]);
                else
                    printf("%7s ", "n/a");
                if (g[2] > 0)
                    printf("%6.2fx\n", g[0] / g[2]);
                else
                    printf("%7s\n", "n/a");
                fflush(stdout);
            }
        }
    }
    double load1 = loadavg();
    measure_peaks(thr_list, nthr_list, any_bf16, peak, peak_bf16);
    for (int i = 0; i < nrows; i++) {
        int t = rows[i].threads == thr_list[0] ? 0 : 1;
        rows[i].peak = rows[i].c.bf16 ? peak_bf16[t] : peak[t];
    }
    if (!json) {
        for (int t = 0; t < nthr_list; t++)
            printf("fp32 FMA peak, %d thread(s), max of start and end: %.1f GFLOP/s\n", thr_list[t], peak[t]);
        printf("load average at end: %.2f\n", load1);
        printf("summary (%%peak against the final peak):\n");
        for (int i = 0; i < nrows; i++) {
            const brow *r = &rows[i];
            printf("  %-4s %-4s %-3s %5lld %5lld %5lld thr %d: suanli %6.1f = %5.1f%% of peak",
                   r->c.bf16 ? "bf16" : "fp32", r->c.pass, r->c.trans, (long long)r->c.M, (long long)r->c.N,
                   (long long)r->c.K, r->threads, r->gflops[0], 100.0 * r->gflops[0] / r->peak);
            if (r->gflops[2] > 0) printf(", %.2fx onednn", r->gflops[0] / r->gflops[2]);
            if (r->gflops[1] > 0) printf(", %.2fx openblas", r->gflops[0] / r->gflops[1]);
            printf("\n");
        }
        print_summary(rows, nrows, thr_list, nthr_list, 0);
    }
    if (json) {
        printf("{\"bench\":\"ops\",\"device\":\"cpu\",\"load_avg_start\":%.2f,\"load_avg_end\":%.2f,"
               "\"kernel\":\"%s\",\"kernel_bf16\":\"%s\",\"isa\":"
               "\"%s\",\"reps\":%d,\"openblas_coretype\":\"%s\","
               "\"openblas_core\":\"%s\",\"peak_gflops\":{",
               load0, load1, sl_gemm_kernel_name(), sl_gemm_bf16_kernel_name(), sl_cpu_isa_name(), reps,
               coretype ? coretype : "", anc.ob_core ? anc.ob_core : "");
        for (int t = 0; t < nthr_list; t++) printf("%s\"%d\":%.2f", t ? "," : "", thr_list[t], peak[t]);
        printf("},\"peak_bf16_gflops\":{");
        for (int t = 0; t < nthr_list; t++) printf("%s\"%d\":%.2f", t ? "," : "", thr_list[t], peak_bf16[t]);
        printf("},\"rows\":[");
        for (int i = 0; i < nrows; i++) print_row_json(&rows[i], i == 0);
        printf("],\"summary\":[");
        print_summary(rows, nrows, thr_list, nthr_list, 1);
        printf("]}\n");
    }
    sl_free_aligned(A), sl_free_aligned(B), sl_free_aligned(C), sl_free_aligned(Ah), sl_free_aligned(Bh);
    free(rows);
    return 0;
}
