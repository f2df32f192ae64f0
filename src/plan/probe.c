/* The calibration probe: GEMM FLOP/s of the CPU backend at a GPT-2 training shape and the copy bandwidth,
 * measured in about a second, so the roofline uses what this backend reaches on this host now (the
 * machine is shared: the probe's number includes today's contention). */
#include <stdlib.h>
#include <string.h>

#include "suanli/graph.h"
#include "suanli/plan.h"

enum { PM = 256, PK = 768, PN = 2304, REPS = 5 };

static sl_status gemm_rate(double *flops) {
    sl_ctx *ctx = sl_ctx_new(64);
    if (!ctx) return sl_fail(SL_ERR_NOMEM, "probe: out of memory");
    sl_tensor *a = sl_new_tensor_2d(ctx, SL_F32, PM, PK), *w = sl_new_tensor_2d(ctx, SL_F32, PN, PK);
    sl_set_input(a);
    sl_set_input(w);
    sl_tensor *y = sl_matmul(ctx, a, w, 0, 1); /* (PM, PN) */
    sl_set_output(y);
    float *ha = calloc((size_t)PM * PK, sizeof(float)), *hw = calloc((size_t)PN * PK, sizeof(float));
    sl_graph *g = sl_graph_new(ctx);
    sl_status st = ha && hw && g ? SL_OK : sl_fail(SL_ERR_NOMEM, "probe: out of memory");
    if (st == SL_OK) {
        for (int64_t i = 0; i < (int64_t)PM * PK; i++) ha[i] = (float)(i % 7) * 0.01f;
        for (int64_t i = 0; i < (int64_t)PN * PK; i++) hw[i] = (float)(i % 5) * 0.01f;
        sl_tensor_bind(a, ha);
        sl_tensor_bind(w, hw);
        sl_graph_build_forward(g, y);
        st = sl_graph_plan(g, sl_backend_cpu(), NULL);
    }
    double best = 1e30;
    for (int r = 0; st == SL_OK && r < REPS; r++) {
        double t0 = sl_time_sec();
        st = sl_graph_compute(g, NULL, NULL);
        double dt = sl_time_sec() - t0;
        if (r > 0 && dt < best) best = dt; /* the first run warms caches and threads */
    }
    if (st == SL_OK) *flops = 2.0 * PM * PK * PN / best;
    if (g) sl_graph_free(g);
    sl_ctx_free(ctx);
    free(ha);
    free(hw);
    return st;
}

static sl_status copy_rate(double *bps) {
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return sl_fail(SL_ERR_NOMEM, "probe: out of memory");
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = sl_time_sec();
        memcpy(b, a, n);
        double dt = sl_time_sec() - t0;
        if (dt < best) best = dt;
        a[r] = b[n - 1 - (size_t)r]; /* keep the copies observable */
    }
    free(a);
    free(b);
    *bps = 2.0 * (double)n / best; /* read + written bytes, like STREAM copy */
    return SL_OK;
}

sl_status sl_plan_probe(int threads, double *gemm_flops, double *copy_Bps) {
    int old = sl_threads_get();
    if (threads > 0) sl_threads_set(threads);
    sl_status st = gemm_rate(gemm_flops);
    if (threads > 0) sl_threads_set(old);
    if (st == SL_OK) st = copy_rate(copy_Bps);
    return st;
}
