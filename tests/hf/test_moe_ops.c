/* The mixture-of-experts ops (src/ops/moe_ops.c): routing forward against scalar references (softmax then
 * top-k, top-k then softmax = Mixtral's SL_OP_TOPK_GATE, DeepSeek-V3's sigmoid + bias + group-limited
 * top-k + scaling, capacity dropping in token order), the router losses against their formulas in double,
 * dispatch (gather -> expert -> combine) against the dense form sum_e w[:, e] * expert_e(x), and every
 * backward against central finite differences. Tolerances: forward 1e-6 abs + 1e-5 rel (fp32 of the same
 * formula); gradients 5e-3 rel of max |FD| (grad_check). */
#include <math.h>
#include <string.h>

#include "suanli/device.h"
#include "suanli/graph.h"
#include "gradcheck.h"
#include "testutil.h"

static sl_moe_route_opts opts(int k, sl_moe_score s, int norm) {
    return (sl_moe_route_opts){.k = k, .score = s, .norm_topk = norm, .scale = 1.0f};
}

/* softmax + top-k + renormalisation is Mixtral's top-k-then-softmax */
static void test_route_softmax(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    int64_t N = 9, E = 6;
    sl_tensor *x = param(&t, 2, (int64_t[]){N, E}, 1.5f);
    sl_moe_route_opts o = opts(2, SL_MOE_SCORE_SOFTMAX, 1);
    float *got = fwd(&t, sl_moe_route(t.ctx, x, NULL, &o));
    float *ref = fwd(&t, sl_topk_gate(t.ctx, x, 2));
    tu_allclose("route softmax+norm == topk_gate", got, ref, N * E, 1e-6f, 1e-5f);
    free(got);
    o.norm_topk = 0; /* Qwen2-MoE's default: the selected softmax probabilities themselves */
    got = fwd(&t, sl_moe_route(t.ctx, x, NULL, &o));
    for (int64_t r = 0; r < N; r++) {
        double mx = -1e30, s = 0;
        for (int64_t e = 0; e < E; e++) mx = fmax(mx, t.pdata[0][r * E + e]);
        for (int64_t e = 0; e < E; e++) s += exp(t.pdata[0][r * E + e] - mx);
        for (int64_t e = 0; e < E; e++)
            ref[r * E + e] = ref[r * E + e] != 0 ? (float)(exp(t.pdata[0][r * E + e] - mx) / s) : 0.0f;
    }
    tu_allclose("route softmax, no norm", got, ref, N * E, 1e-6f, 1e-5f);
    free(got), free(ref);
    tc_free(&t);
}

/* DeepSeek-V3 on a hand-made row: 8 experts in 4 groups, keep 2 groups, k = 2, bias moves the choice */
static void test_route_deepseek(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *x = param(&t, 2, (int64_t[]){1, 8}, 1.0f), *b = param(&t, 1, (int64_t[]){8}, 1.0f);
    const float xv[8] = {2.0f, -1.0f, 0.5f, 0.4f, 1.0f, 1.1f, -2.0f, 3.0f};
    const float bv[8] = {0, 0, 0, 0, 0, 0, 0, -0.9f};
    memcpy(t.pdata[0], xv, sizeof xv);
    memcpy(t.pdata[1], bv, sizeof bv);
    /* sigmoid s; choice = s + b; group sums of top two: g0 = s0+s1, g1 = s2+s3, g2 = s4+s5, g3 = s6+s7-0.9
     * -> groups 2 (1.48) and 0 (1.15) are kept (g1 = 1.22 ... computed below); the top two choices win */
    double s[8], c[8], g[4];
    for (int i = 0; i < 8; i++) s[i] = 1 / (1 + exp(-xv[i])), c[i] = s[i] + bv[i];
    for (int i = 0; i < 4; i++) g[i] = c[2 * i] + c[2 * i + 1];
    int g1 = 0, g2 = -1;
    for (int i = 1; i < 4; i++) g1 = g[i] > g[g1] ? i : g1;
    for (int i = 0; i < 4; i++)
        if (i != g1 && (g2 < 0 || g[i] > g[g2])) g2 = i;
    int e1 = -1, e2 = -1;
    for (int i = 0; i < 8; i++)
        if ((i / 2 == g1 || i / 2 == g2) && (e1 < 0 || c[i] > c[e1])) e1 = i;
    for (int i = 0; i < 8; i++)
        if ((i / 2 == g1 || i / 2 == g2) && i != e1 && (e2 < 0 || c[i] > c[e2])) e2 = i;
    float ref[8] = {0};
    ref[e1] = (float)(2.5 * s[e1] / (s[e1] + s[e2]));
    ref[e2] = (float)(2.5 * s[e2] / (s[e1] + s[e2]));
    sl_moe_route_opts o = {
        .k = 2, .score = SL_MOE_SCORE_SIGMOID, .norm_topk = 1, .n_group = 4, .topk_group = 2, .scale = 2.5f};
    float *got = fwd(&t, sl_moe_route(t.ctx, x, b, &o));
    tu_allclose("route deepseek-v3 (groups, bias, scale)", got, ref, 8, 1e-6f, 1e-5f);
    TU_CHECK(e1 != 7 && e2 != 7, "the bias pushed expert 7 out (got %d %d)", e1, e2);
    free(got);
    tc_free(&t);
}

/* capacity 2 with top-1 routing of 5 tokens that all prefer expert 0: tokens 0, 1 kept, 2.. dropped;
 * counts: routed 5 / kept 2 */
static void test_route_capacity(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *x = param(&t, 2, (int64_t[]){5, 3}, 1.0f);
    for (int r = 0; r < 5; r++)
        t.pdata[0][r * 3] = 5.0f + (float)r, t.pdata[0][r * 3 + 1] = 0, t.pdata[0][r * 3 + 2] = 0;
    sl_moe_route_opts o = opts(1, SL_MOE_SCORE_SOFTMAX, 0);
    o.capacity = 2;
    sl_tensor *rt = sl_moe_route(t.ctx, x, NULL, &o);
    sl_set_output(rt);
    sl_graph *g = sl_graph_new(t.ctx);
    sl_graph_build_forward(g, rt);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute: %s", sl_errmsg());
    const float *w = rt->data,
                *cnt = (const float *)((const char *)rt->data + sl_moe_route_counts_offset(rt));
    for (int r = 0; r < 5; r++) TU_CHECK((w[r * 3] > 0) == (r < 2), "token %d kept iff among the first 2", r);
    TU_CHECK(cnt[0] == 5 && cnt[3] == 2 && cnt[1] == 0 && cnt[4] == 0, "counts routed %g kept %g", cnt[0],
             cnt[3]);
    sl_graph_free(g);
    tc_free(&t);
}

/* Note [Capacity under sequence parallelism]: the rows of B batch rows x T tokens split into P sequence
 * shards; each shard routes its rows without a capacity, counts them per batch row
 * (sl_moe_route_block_counts), and its capacity route, given every shard's counts (sl_moe_route_shard: the
 * all-gather done here by hand), keeps and drops exactly what the one route over all B T rows does:
 * weights, mask-derived counts summed over the shards, bitwise */
static void test_route_shards(int P) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    enum { B = 3, T = 8, E = 6, N = B * T };
    int64_t Tl = T / P, Nl = B * Tl;
    sl_tensor *x = param(&t, 2, (int64_t[]){N, E}, 1.0f);
    sl_moe_route_opts o = opts(2, SL_MOE_SCORE_SOFTMAX, 1);
    o.capacity = 3; /* 24 tokens x 2 over 6 experts: 8 a expert on average, many dropped */
    sl_tensor *rt = sl_moe_route(t.ctx, x, NULL, &o);
    float ref[N * E], refc[2 * E], cnt_all[4 * B * E], got_c[2 * E] = {0};
    { /* as fwd (gradcheck.c), with the counts (the route's aux) read before the graph's memory is freed */
        sl_graph *g = sl_graph_new(t.ctx);
        sl_graph_build_forward(g, rt);
        TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK &&
                     sl_graph_compute(g, NULL, NULL) == SL_OK,
                 "one route: %s", sl_errmsg());
        memcpy(ref, rt->data, sizeof ref);
        memcpy(refc, (const char *)rt->data + sl_moe_route_counts_offset(rt), sizeof refc);
        sl_graph_free(g);
    }
    float xs[4][N * E];
    for (int p = 0; p < P; p++) /* shard p: rows (b, p Tl + i) */
        for (int64_t b = 0; b < B; b++)
            memcpy(xs[p] + b * Tl * E, t.pdata[0] + (b * T + p * Tl) * E, sizeof(float) * (size_t)(Tl * E));
    for (int p = 0; p < P; p++) {
        sl_ctx *c = sl_ctx_new(64);
        sl_tensor *xl = sl_new_tensor(c, SL_F32, 2, (int64_t[]){Nl, E});
        sl_tensor_bind(xl, xs[p]);
        sl_moe_route_opts po = o;
        po.capacity = 0;
        sl_tensor *cnt = sl_moe_route_block_counts(c, sl_moe_route(c, xl, NULL, &po), B);
        sl_set_output(cnt);
        sl_graph *g = sl_graph_new(c);
        sl_graph_build_forward(g, cnt);
        TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK &&
                     sl_graph_compute(g, NULL, NULL) == SL_OK,
                 "shard counts: %s", sl_errmsg());
        memcpy(cnt_all + p * B * E, cnt->data, sizeof(float) * B * E);
        sl_graph_free(g);
        sl_ctx_free(c);
    }
    int bad = 0;
    for (int p = 0; p < P; p++) {
        sl_ctx *c = sl_ctx_new(64);
        sl_tensor *xl = sl_new_tensor(c, SL_F32, 2, (int64_t[]){Nl, E}),
                  *ca = sl_new_tensor(c, SL_F32, 1, (int64_t[]){P * B * E});
        sl_tensor_bind(xl, xs[p]);
        sl_tensor_bind(ca, cnt_all);
        sl_tensor *w = sl_moe_route(c, xl, NULL, &o);
        sl_moe_route_shard(w, ca, p, B);
        sl_set_output(w);
        sl_graph *g = sl_graph_new(c);
        sl_graph_build_forward(g, w);
        TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK &&
                     sl_graph_compute(g, NULL, NULL) == SL_OK,
                 "shard route: %s", sl_errmsg());
        const float *wd = w->data,
                    *cd = (const float *)((const char *)w->data + sl_moe_route_counts_offset(w));
        for (int64_t b = 0; b < B; b++)
            bad += memcmp(wd + b * Tl * E, ref + (b * T + p * Tl) * E, sizeof(float) * (size_t)(Tl * E)) != 0;
        for (int e = 0; e < 2 * E; e++) got_c[e] += cd[e];
        sl_graph_free(g);
        sl_ctx_free(c);
    }
    int dropped = 0;
    for (int e = 0; e < E; e++) dropped += (int)(refc[e] - refc[E + e]);
    TU_CHECK(bad == 0 && !memcmp(got_c, refc, sizeof refc) && dropped > 0,
             "%d shards: %d batch rows' weights differ from one route's; counts %s; %d dropped", P, bad,
             memcmp(got_c, refc, sizeof refc) ? "differ" : "equal", dropped);
    tc_free(&t);
}

/* aux = E/(N^2 k) sum_e count_e sum_n p_ne and z = mean lse^2, in double */
static void test_router_loss_value(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    int64_t N = 7, E = 5;
    int k = 2;
    sl_tensor *x = param(&t, 2, (int64_t[]){N, E}, 1.0f);
    sl_moe_route_opts o = opts(k, SL_MOE_SCORE_SOFTMAX, 1);
    sl_tensor *rt = sl_moe_route(t.ctx, x, NULL, &o);
    float *got = fwd(&t, sl_moe_router_loss(t.ctx, x, rt, 0.5f, 0.25f));
    float *w = fwd(&t, rt);
    double cnt[8] = {0}, psum[8] = {0}, z = 0;
    for (int64_t r = 0; r < N; r++) {
        const float *xr = t.pdata[0] + r * E;
        double mx = -1e30, s = 0;
        for (int64_t e = 0; e < E; e++) mx = fmax(mx, xr[e]);
        for (int64_t e = 0; e < E; e++) s += exp(xr[e] - mx);
        for (int64_t e = 0; e < E; e++) psum[e] += exp(xr[e] - mx) / s, cnt[e] += w[r * E + e] != 0;
        z += pow(mx + log(s), 2);
    }
    double aux = 0;
    for (int64_t e = 0; e < E; e++) aux += cnt[e] * psum[e];
    aux *= (double)E / ((double)N * N * k);
    float ref = (float)(0.5 * aux + 0.25 * z / N);
    tu_allclose("router loss (aux + z)", got, &ref, 1, 1e-6f, 1e-5f);
    free(got), free(w);
    tc_free(&t);
}

/* dispatch equals the dense form: sum_e w[:, e] * (x We^T) with R = N (dropless) */
static void test_dispatch_dense(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(1024);
    int64_t N = 11, C = 6, E = 4;
    sl_tensor *x = param(&t, 2, (int64_t[]){N, C}, 1.0f), *lg = param(&t, 2, (int64_t[]){N, E}, 1.0f);
    sl_tensor *W = param(&t, 2, (int64_t[]){E * C, C}, 0.5f);
    sl_moe_route_opts o = opts(2, SL_MOE_SCORE_SOFTMAX, 1);
    sl_tensor *rt = sl_moe_route(t.ctx, lg, NULL, &o), *y = NULL, *d = NULL;
    for (int e = 0; e < E; e++) {
        sl_tensor *We = sl_slice(t.ctx, W, 0, e * C, C);
        sl_tensor *ye = sl_linear(t.ctx, sl_moe_gather(t.ctx, x, rt, e, N, 0), We, NULL);
        y = sl_moe_combine(t.ctx, ye, rt, y, e, 1);
        sl_tensor *de = sl_mul(t.ctx, sl_linear(t.ctx, x, We, NULL), sl_slice(t.ctx, rt, 1, e, 1));
        d = d ? sl_add(t.ctx, d, de) : de;
    }
    float *got = fwd(&t, y), *ref = fwd(&t, d);
    tu_allclose("dispatch == dense", got, ref, N * C, 1e-6f, 1e-5f);
    free(got), free(ref);
    tc_free(&t);
}

/* the routed expert (kept rows only) equals SwiGLU with matmul nodes on the gathered rows */
static void test_expert_ffn_dense(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(1024);
    int64_t N = 13, C = 6, E = 3, I = 5;
    sl_tensor *x = param(&t, 2, (int64_t[]){N, C}, 1.0f), *lg = param(&t, 2, (int64_t[]){N, E}, 1.0f);
    sl_tensor *w1 = param(&t, 2, (int64_t[]){I, C}, 0.5f), *w3 = param(&t, 2, (int64_t[]){I, C}, 0.5f);
    sl_tensor *w2 = param(&t, 2, (int64_t[]){C, I}, 0.5f);
    sl_moe_route_opts o = opts(2, SL_MOE_SCORE_SOFTMAX, 1);
    sl_tensor *rt = sl_moe_route(t.ctx, lg, NULL, &o);
    for (int e = 0; e < E; e++) {
        sl_tensor *xe = sl_moe_gather(t.ctx, x, rt, e, N, 0);
        sl_tensor *g = sl_silu(t.ctx, sl_linear(t.ctx, xe, w1, NULL)), *u = sl_linear(t.ctx, xe, w3, NULL);
        float *ref = fwd(&t, sl_linear(t.ctx, sl_mul(t.ctx, g, u), w2, NULL));
        float *got = fwd(&t, sl_moe_expert_ffn(t.ctx, xe, w1, w3, w2, rt, e));
        tu_allclose("expert_ffn == swiglu on gathered rows", got, ref, N * C, 1e-6f, 1e-5f);
        free(got), free(ref);
    }
    tc_free(&t);
}

/* ---- gradients ----
 * The selection is piecewise constant: a finite difference that flips a top-k choice sees a jump the
 * gradient rightly ignores. Router logits are therefore a small parameter plus well-separated fixed offsets
 * (gaps of 1.5 between a row's logits, perturbations of 1e-2). */
static sl_tensor *sep_logits(tc *t, int64_t N, int64_t E) {
    static float off[256]; /* one graph at a time uses it */
    SL_ASSERT(N * E <= 256);
    for (int64_t r = 0; r < N; r++)
        for (int64_t e = 0; e < E; e++) off[r * E + e] = 1.5f * (float)((e * 3 + r) % E) - 2.0f;
    sl_tensor *o = sl_new_tensor_2d(t->ctx, SL_F32, N, E);
    sl_tensor_bind(o, off);
    return sl_add(t->ctx, param(t, 2, (int64_t[]){N, E}, 0.2f), o);
}
static sl_tensor *g_route_softmax(tc *t) {
    sl_moe_route_opts o = opts(2, SL_MOE_SCORE_SOFTMAX, 0);
    return sl_moe_route(t->ctx, sep_logits(t, 6, 5), NULL, &o);
}
static sl_tensor *g_route_softmax_norm(tc *t) {
    sl_moe_route_opts o = opts(3, SL_MOE_SCORE_SOFTMAX, 1);
    o.scale = 1.5f;
    return sl_moe_route(t->ctx, sep_logits(t, 6, 5), NULL, &o);
}
static sl_tensor *g_route_sigmoid_groups(tc *t) {
    sl_moe_route_opts o = {
        .k = 2, .score = SL_MOE_SCORE_SIGMOID, .norm_topk = 1, .n_group = 2, .topk_group = 1, .scale = 2.5f};
    sl_tensor *x = param(t, 2, (int64_t[]){5, 8}, 1.5f);
    sl_tensor *b = sl_new_tensor_1d(t->ctx, SL_F32, 8); /* constant bias (not a parameter in HF) */
    static float bv[8] = {0.1f, -0.1f, 0.2f, 0, 0, 0.05f, -0.2f, 0};
    sl_tensor_bind(b, bv);
    return sl_moe_route(t->ctx, x, b, &o);
}
static sl_tensor *g_route_capacity(tc *t) {
    sl_moe_route_opts o = opts(2, SL_MOE_SCORE_SOFTMAX, 1);
    o.capacity = 3; /* 8 tokens x 2 over 4 experts: some dropped */
    return sl_moe_route(t->ctx, sep_logits(t, 8, 4), NULL, &o);
}
static sl_tensor *g_sigmoid_1(tc *t) { /* a 1-expert sigmoid route is the sigmoid (the shared-expert gate) */
    sl_moe_route_opts o = opts(1, SL_MOE_SCORE_SIGMOID, 0);
    return sl_moe_route(t->ctx, param(t, 2, (int64_t[]){7, 1}, 2.0f), NULL, &o);
}
/* The counts are constants of the selection: finite differences that flip a selection see a jump the
 * gradient rightly ignores, so the logits are a small parameter plus well-separated fixed offsets. */
static sl_tensor *router_loss_case(tc *t, sl_moe_score s) {
    static float off[9 * 4];
    for (int r = 0; r < 9; r++)
        for (int e = 0; e < 4; e++) off[r * 4 + e] = 1.5f * (float)((e + r) % 4) - 2.0f;
    sl_tensor *o4 = sl_new_tensor_2d(t->ctx, SL_F32, 9, 4);
    sl_tensor_bind(o4, off);
    sl_tensor *x = sl_add(t->ctx, param(t, 2, (int64_t[]){9, 4}, 0.2f), o4);
    sl_moe_route_opts o = opts(2, s, 1);
    return sl_moe_router_loss(t->ctx, x, sl_moe_route(t->ctx, x, NULL, &o), 0.7f, 0.3f);
}
static sl_tensor *g_router_loss(tc *t) { return router_loss_case(t, SL_MOE_SCORE_SOFTMAX); }
static sl_tensor *g_router_loss_sigmoid(tc *t) { return router_loss_case(t, SL_MOE_SCORE_SIGMOID); }
/* the whole dispatched layer: router, capacity, per-expert linear + silu, weighted combine */
static sl_tensor *g_dispatch(tc *t) {
    int64_t N = 10, C = 5, E = 3;
    sl_tensor *x = param(t, 2, (int64_t[]){N, C}, 1.0f), *wr = param(t, 2, (int64_t[]){E, C}, 1.0f);
    sl_tensor *W = param(t, 2, (int64_t[]){E * C, C}, 0.5f), *acc = param(t, 2, (int64_t[]){N, C}, 1.0f);
    sl_moe_route_opts o = opts(2, SL_MOE_SCORE_SOFTMAX, 1);
    o.capacity = 6;
    sl_tensor *rt = sl_moe_route(t->ctx, sl_linear(t->ctx, x, wr, NULL), NULL, &o), *y = acc;
    for (int e = 0; e < E; e++) {
        sl_tensor *xe = sl_moe_gather(t->ctx, x, rt, e, 6, 0);
        sl_tensor *ye = sl_silu(t->ctx, sl_linear(t->ctx, xe, sl_slice(t->ctx, W, 0, e * C, C), NULL));
        y = sl_moe_combine(t->ctx, ye, rt, y, e, 1);
    }
    return y;
}

/* the dropless layer with routed experts (kept rows only); the experts share one set of weight leaves
 * (the op takes leaves; MAXP parameters), which also checks that their gradients accumulate */
static sl_tensor *g_expert_ffn(tc *t) {
    int64_t N = 9, C = 4, E = 2, I = 3;
    sl_tensor *x = param(t, 2, (int64_t[]){N, C}, 1.0f);
    sl_tensor *W1 = param(t, 2, (int64_t[]){I, C}, 0.7f), *W3 = param(t, 2, (int64_t[]){I, C}, 0.7f);
    sl_tensor *W2 = param(t, 2, (int64_t[]){C, I}, 0.7f);
    sl_moe_route_opts o = opts(1, SL_MOE_SCORE_SOFTMAX, 0);
    sl_tensor *rt = sl_moe_route(t->ctx, sep_logits(t, N, E), NULL, &o), *y = NULL;
    for (int e = 0; e < E; e++) {
        sl_tensor *xe = sl_moe_gather(t->ctx, x, rt, e, N, 0);
        sl_tensor *ye = sl_moe_expert_ffn(t->ctx, xe, W1, W3, W2, rt, e);
        y = sl_moe_combine(t->ctx, ye, rt, y, e, 1);
    }
    return y;
}

/* Note [Packed experts]: the packed chain (MOE_EP_PACK -> MOE_PACKED_FFN per expert -> MOE_EP_UNPACK)
 * against the per-expert path on the same parameters. fp32 (against gather -> MOE_EXPERT_FFN -> combine): the
 * layer's output bitwise (the same GEMMs on the same rows, the same expert-order sum per token), every
 * gradient within 1e-6 abs + 1e-5 rel (the input's gradient sums a token's rows in another order: fp32
 * reordering; at k = 2 the two terms commute and it is bitwise too), and a smaller activation plan (E * N
 * rows per buffer against N * k). Under bf16 / fp16 autocast (against the per-expert nodes of
 * sl_llama_swiglu: rounded linears, silu and product on all R rows, Note [Packed experts under autocast]):
 * the output bitwise, and the gradients within 1e-6 abs + 2 ulps of the half type: the per-expert weight
 * gradients also sum the zero rows past the count, in other fp32 groupings, which can move a value across a
 * half rounding boundary (one ulp) before it is summed again (measured here: bitwise). */
typedef struct {
    sl_tensor *y, *loss;
} layer_out;

/* autocast's linear: half inputs and weight, fp32 accumulation, half output (sl_llama_lin) */
static sl_tensor *rnd_h(sl_ctx *c, sl_tensor *x, sl_dtype h) {
    return h == SL_F32 ? x : sl_round_half(c, x, h);
}
/* 1: under bf16, sl_llama_lin's bf16 GEMM with the fused weight cast (Note [bf16 GEMMs under autocast]),
 * and the packed chain marked to multiply the same way (sl_moe_packed_ffn_half_gemm) */
static int g_half_gemm;
static sl_tensor *lin_h(sl_ctx *c, sl_tensor *x, sl_tensor *w, sl_dtype h) {
    if (h == SL_BF16 && g_half_gemm) return rnd_h(c, sl_linear_half_w(c, sl_cast(c, x, SL_BF16), w, NULL), h);
    return rnd_h(c, sl_linear(c, rnd_h(c, x, h), rnd_h(c, w, h), NULL), h);
}

static layer_out moe_layer(tc *t, sl_tensor *x, sl_tensor *lg, sl_tensor *const *W, int64_t E, int k, int cap,
                           int packed, const float *rd, sl_dtype half) {
    sl_ctx *c = t->ctx;
    int64_t N = x->ne[0], C = x->ne[1];
    sl_moe_route_opts o = opts(k, SL_MOE_SCORE_SOFTMAX, 1);
    o.capacity = cap;
    sl_tensor *rt = sl_moe_route(c, lg, NULL, &o), *y = NULL;
    int64_t R = cap > 0 ? cap : N;
    if (packed) {
        int64_t S = cap > 0 && E * cap < N * k ? E * cap : N * k; /* as src/nn/moe.c sizes it */
        sl_tensor *xp = sl_moe_ep_pack(c, x, rt, S, 0), *yp = NULL;
        for (int e = 0; e < E; e++) {
            yp = sl_moe_packed_ffn(c, xp, W[3 * e], W[3 * e + 1], W[3 * e + 2], yp, e, 0, R, half);
            if (half == SL_BF16 && g_half_gemm) sl_moe_packed_ffn_half_gemm(yp);
        }
        y = sl_moe_ep_unpack(c, yp, rt, 1);
    } else {
        for (int e = 0; e < E; e++) {
            sl_tensor *xe = sl_moe_gather(c, x, rt, e, R, 0), *ye;
            if (half == SL_F32) {
                xe->iparams[2] = 1;
                ye = sl_moe_expert_ffn(c, xe, W[3 * e], W[3 * e + 1], W[3 * e + 2], rt, e);
            } else { /* sl_llama_swiglu under autocast */
                sl_tensor *g = rnd_h(c, sl_silu(c, lin_h(c, xe, W[3 * e], half)), half);
                sl_tensor *u = lin_h(c, xe, W[3 * e + 1], half);
                ye = lin_h(c, rnd_h(c, sl_mul(c, g, u), half), W[3 * e + 2], half);
            }
            y = sl_moe_combine(c, ye, rt, y, e, 1);
        }
    }
    sl_tensor *Rt = sl_new_tensor_2d(c, SL_F32, N, C);
    sl_tensor_bind(Rt, (void *)rd);
    return (layer_out){y, sl_sum_to(c, sl_mul(c, y, Rt), sl_new_tensor_1d(c, SL_F32, 1))};
}

static void test_packed_equals_per_expert(int cap, sl_dtype half) {
    enum { E = 4, NP = 2 + 3 * E };
    /* the bf16-GEMM case is wider: with K of 12-16 the bf16 kernels (AMX tiles, vdpbf16ps) and fp32 FMAs on
     * the rounded operands happen to give the same sums, so the case could not tell the two paths apart */
    int64_t N = 29, C = g_half_gemm ? 64 : 16, I = g_half_gemm ? 80 : 12;
    int k = 2;
    /* the harness holds MAXP parameters; the experts' weights are leaves of their own here */
    sl_ctx *ctx = sl_ctx_new(8192);
    tc t = {.ctx = ctx};
    float *pd[NP], *gd[2][NP];
    sl_tensor *P[NP];
    for (int i = 0; i < NP; i++) {
        int64_t ne[2] = {i == 0             ? N
                         : i == 1           ? N
                         : (i - 2) % 3 == 2 ? C
                                            : I,
                         i == 1             ? E
                         : (i - 2) % 3 == 2 ? I
                                            : C};
        P[i] = sl_new_tensor(ctx, SL_F32, 2, ne);
        sl_set_param(P[i]);
        int64_t n = ne[0] * ne[1];
        pd[i] = malloc(sizeof(float) * (size_t)n);
        sl_rng_fill_normal(pd[i], n, 31, (uint64_t)i + 1, 0.0f, i == 1 ? 2.0f : 0.5f);
        sl_tensor_bind(P[i], pd[i]);
        P[i]->grad = sl_new_tensor(ctx, SL_F32, 2, ne);
        P[i]->grad->flags |= SL_FLAG_GRAD;
        for (int v = 0; v < 2; v++) gd[v][i] = calloc((size_t)n, sizeof(float));
    }
    float *rd = malloc(sizeof(float) * (size_t)(N * C)), *ys[2];
    sl_rng_fill_normal(rd, N * C, 9, 99, 0.0f, 1.0f);
    size_t planned[2];
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < NP; i++) sl_tensor_bind(P[i]->grad, gd[v][i]);
        layer_out lo = moe_layer(&t, P[0], P[1], P + 2, E, k, cap, v, rd, half);
        sl_set_output(lo.y); /* read after the backward, which would reuse its storage */
        sl_graph *g = sl_graph_new(ctx);
        sl_graph_build_forward(g, lo.loss);
        sl_graph_build_backward(g, lo.loss, 1.0f);
        sl_plan_stats ps;
        TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), &ps) == SL_OK, "plan: %s", sl_errmsg());
        TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute: %s", sl_errmsg());
        planned[v] = ps.planned_bytes;
        ys[v] = malloc(sizeof(float) * (size_t)(N * C));
        memcpy(ys[v], lo.y->data, sizeof(float) * (size_t)(N * C));
        sl_graph_free(g);
    }
    const char *hn = half == SL_BF16  ? (g_half_gemm ? "bf16 (bf16 GEMM)" : "bf16")
                     : half == SL_F16 ? "fp16"
                                      : "fp32";
    TU_CHECK(!memcmp(ys[0], ys[1], sizeof(float) * (size_t)(N * C)), "%s cap %d: packed output bitwise", hn,
             cap);
    /* one ulp of the half type, relative: 2^-8 (bf16), 2^-11 (fp16) */
    float ulp = half == SL_BF16 ? 1.0f / 256 : half == SL_F16 ? 1.0f / 2048 : 0.0f;
    double worst = 0;
    for (int i = 0; i < NP; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s cap %d: gradient of parameter %d, packed == per expert", hn, cap, i);
        tu_allclose(what, gd[1][i], gd[0][i], sl_nelements(P[i]), 1e-6f, half == SL_F32 ? 1e-5f : 2 * ulp);
        double r = tu_rel_maxdiff(gd[1][i], gd[0][i], sl_nelements(P[i]));
        if (r > worst) worst = r;
        /* the bf16-GEMM chain makes the per-expert path's GEMM calls on its rows: bitwise (fp32 GEMMs on
         * rounded operands instead differ here by up to 1e-3 relative, inside the 2-ulp bar above) */
        if (g_half_gemm)
            TU_CHECK(!memcmp(gd[1][i], gd[0][i], sizeof(float) * (size_t)sl_nelements(P[i])),
                     "%s cap %d: gradient of parameter %d bitwise the per-expert path's", hn, cap, i);
    }
    printf("packed experts %s (N %lld, E %d, k %d, capacity %d): planned %zu bytes vs %zu per expert; "
           "gradients max|d|/max|ref| %.2e\n",
           hn, (long long)N, E, k, cap, planned[1], planned[0], worst);
    /* smaller where the packed rows (N k) are fewer than the per-expert ones (E x capacity, or E x N) */
    if (!g_half_gemm && (!cap || E * cap > N * k)) /* (the wider bf16-GEMM case: I > C shifts the balance) */
        TU_CHECK(planned[1] < planned[0], "%s capacity %d: the packed plan is smaller (%zu vs %zu)", hn, cap,
                 planned[1], planned[0]);
    for (int i = 0; i < NP; i++) free(pd[i]), free(gd[0][i]), free(gd[1][i]);
    free(ys[0]), free(ys[1]), free(rd);
    sl_ctx_free(ctx);
}

/* the packed chain with shared weight leaves (their gradients accumulate over the experts), dropless and
 * with capacity dropping */
static sl_tensor *packed_case(tc *t, int cap) {
    int64_t N = 9, C = 4, E = 4, I = 3; /* E = 4: sep_logits' offsets are distinct within a row */
    sl_tensor *x = param(t, 2, (int64_t[]){N, C}, 1.0f);
    sl_tensor *W1 = param(t, 2, (int64_t[]){I, C}, 0.7f), *W3 = param(t, 2, (int64_t[]){I, C}, 0.7f);
    sl_tensor *W2 = param(t, 2, (int64_t[]){C, I}, 0.7f);
    /* unnormalised top-k weights: with shared experts, normalised weights sum to 1 and the layer would not
     * depend on the router at all */
    sl_moe_route_opts o = opts(2, SL_MOE_SCORE_SOFTMAX, 0);
    o.capacity = cap;
    sl_tensor *rt = sl_moe_route(t->ctx, sep_logits(t, N, E), NULL, &o), *yp = NULL;
    sl_tensor *xp = sl_moe_ep_pack(t->ctx, x, rt, N * 2, 0);
    for (int e = 0; e < E; e++)
        yp = sl_moe_packed_ffn(t->ctx, xp, W1, W3, W2, yp, e, 0, cap ? cap : N, SL_F32);
    return sl_moe_ep_unpack(t->ctx, yp, rt, 1);
}
static sl_tensor *g_packed(tc *t) { return packed_case(t, 0); }
static sl_tensor *g_packed_capacity(tc *t) { return packed_case(t, 5); }

int main(void) {
    test_route_softmax();
    test_route_deepseek();
    test_route_capacity();
    test_route_shards(2);
    test_route_shards(4);
    test_router_loss_value();
    test_dispatch_dense();
    test_expert_ffn_dense();
    grad_check("moe_route softmax", g_route_softmax);
    grad_check("moe_route softmax+norm+scale", g_route_softmax_norm);
    grad_check("moe_route sigmoid groups", g_route_sigmoid_groups);
    grad_check("moe_route capacity", g_route_capacity);
    grad_check("moe_route sigmoid E=1", g_sigmoid_1);
    grad_check("moe_router_loss softmax", g_router_loss);
    grad_check("moe_router_loss sigmoid", g_router_loss_sigmoid);
    grad_check("moe dispatch", g_dispatch);
    grad_check("moe routed expert ffn", g_expert_ffn);
    for (int h = 0; h < 3; h++) {
        sl_dtype half = h == 0 ? SL_F32 : h == 1 ? SL_BF16 : SL_F16;
        test_packed_equals_per_expert(0, half);
        test_packed_equals_per_expert(11, half);
        test_packed_equals_per_expert(20, half);
    }
    g_half_gemm = 1; /* bf16 as the models build it where the backend fuses weight casts (the CPU) */
    test_packed_equals_per_expert(0, SL_BF16);
    test_packed_equals_per_expert(11, SL_BF16);
    test_packed_equals_per_expert(20, SL_BF16);
    g_half_gemm = 0;
    grad_check("moe packed experts", g_packed);
    grad_check("moe packed experts, capacity", g_packed_capacity);
    return tu_finish("test_moe_ops");
}
