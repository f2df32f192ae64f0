/* The Llama-family ops: forward against double-precision scalar references on awkward shapes (strided
 * inputs, odd sizes), backward against central finite differences of a random projection, and the
 * KV-cache attention against the double reference for chunked prefill + decode with and without a
 * sliding window. Tolerances: forward 1e-5 abs + 1e-4 rel; gradients 5e-3 rel of max |FD|. */
#include <string.h>

#include "suanli/device.h"
#include "suanli/graph.h"
#include "gradcheck.h"
#include "testutil.h"

static void test_rmsnorm_fwd(void) {
    for (int withw = 0; withw < 2; withw++) {
        tc t = {0};
        t.ctx = sl_ctx_new(256);
        int64_t R = 13, C = 67;
        sl_tensor *x = param(&t, 3, (int64_t[]){1, R, C}, 2.0f);
        sl_tensor *w = withw ? param(&t, 1, (int64_t[]){C}, 1.0f) : NULL;
        float *got = fwd(&t, sl_rmsnorm(t.ctx, x, w, 1e-5f));
        float *ref = malloc(sizeof(float) * (size_t)(R * C));
        for (int64_t r = 0; r < R; r++) {
            double ss = 0;
            for (int64_t c = 0; c < C; c++) ss += pow(t.pdata[0][r * C + c], 2);
            double rs = 1.0 / sqrt(ss / C + 1e-5);
            for (int64_t c = 0; c < C; c++)
                ref[r * C + c] = (float)(t.pdata[0][r * C + c] * rs * (withw ? t.pdata[1][c] : 1.0));
        }
        tu_allclose(withw ? "rmsnorm" : "rmsnorm (no weight)", got, ref, R * C, 1e-5f, 1e-4f);
        free(got), free(ref);
        tc_free(&t);
    }
}

/* rope over a strided view (heads of a wider projection), positions pos0.. */
static void test_rope_fwd(void) {
    int64_t B = 2, T = 5, NH = 3, hs = 6, W = 4 * hs; /* x is a (B,T,NH,hs) view into (B,T,W) */
    for (int pos0 = 0; pos0 <= 1000; pos0 += 1000) {
        tc t = {0};
        t.ctx = sl_ctx_new(256);
        sl_tensor *base = param(&t, 3, (int64_t[]){B, T, W}, 1.0f);
        sl_tensor *x = sl_view(t.ctx, base, 4, (int64_t[]){B, T, NH, hs}, (int64_t[]){T * W, W, hs, 1}, hs);
        float *got = fwd(&t, sl_rope(t.ctx, x, pos0, 10000.0f));
        float *ref = malloc(sizeof(float) * (size_t)(B * T * NH * hs));
        for (int64_t b = 0; b < B; b++)
            for (int64_t tt = 0; tt < T; tt++)
                for (int64_t h = 0; h < NH; h++)
                    for (int64_t i = 0; i < hs / 2; i++) {
                        const float *xr = t.pdata[0] + (b * T + tt) * W + hs + h * hs;
                        double ang = (double)(pos0 + tt) * pow(10000.0, -2.0 * (double)i / (double)hs);
                        double c = cos(ang), s = sin(ang);
                        float *y = ref + ((b * T + tt) * NH + h) * hs;
                        y[i] = (float)(xr[i] * c - xr[i + hs / 2] * s);
                        y[i + hs / 2] = (float)(xr[i + hs / 2] * c + xr[i] * s);
                    }
        /* at position 1000 the float32 angle (as transformers computes it) differs from the exact one
         * by up to ~1e-4 rad: the tolerance reflects that, not the kernel */
        tu_allclose(pos0 ? "rope pos0=1000" : "rope", got, ref, B * T * NH * hs, pos0 ? 5e-4f : 1e-5f, 1e-4f);
        free(got), free(ref);
        tc_free(&t);
    }
}

static void test_silu_topk_fwd(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    int64_t N = 9, E = 7;
    sl_tensor *a = param(&t, 2, (int64_t[]){N, E}, 2.0f);
    float *s = fwd(&t, sl_silu(t.ctx, a));
    float *g2 = fwd(&t, sl_topk_gate(t.ctx, a, 2));
    float *g7 = fwd(&t, sl_topk_gate(t.ctx, a, 7));
    float rs[63], r2[63], r7[63];
    for (int64_t r = 0; r < N; r++) {
        const float *x = t.pdata[0] + r * E;
        int b1 = 0, b2 = -1;
        for (int e = 1; e < E; e++)
            if (x[e] > x[b1]) b1 = e;
        for (int e = 0; e < E; e++)
            if (e != b1 && (b2 < 0 || x[e] > x[b2])) b2 = e;
        double z2 = exp(x[b1]) + exp(x[b2]), z7 = 0;
        for (int e = 0; e < E; e++) z7 += exp(x[e]);
        for (int e = 0; e < E; e++) {
            rs[r * E + e] = (float)(x[e] / (1 + exp(-(double)x[e])));
            r2[r * E + e] = (e == b1 || e == b2) ? (float)(exp(x[e]) / z2) : 0.0f;
            r7[r * E + e] = (float)(exp(x[e]) / z7);
        }
    }
    tu_allclose("silu", s, rs, N * E, 1e-6f, 1e-5f);
    tu_allclose("topk_gate k=2", g2, r2, N * E, 1e-6f, 1e-5f);
    tu_allclose("topk_gate k=E (softmax)", g7, r7, N * E, 1e-6f, 1e-5f);
    free(s), free(g2), free(g7);
    tc_free(&t);
}

/* causal GQA attention at absolute positions with an optional window, double precision */
static void ref_attn(const float *Q, const float *K, const float *V, int64_t Tq, int64_t pos0, int64_t NH,
                     int64_t NKV, int64_t hs, int64_t S, int64_t win, float *out) {
    for (int64_t t = 0; t < Tq; t++)
        for (int64_t h = 0; h < NH; h++) {
            int64_t kh = h / (NH / NKV), last = pos0 + t,
                    first = win && last - win + 1 > 0 ? last - win + 1 : 0;
            double s[64], mx = -1e30, z = 0;
            for (int64_t j = first; j <= last; j++) {
                double d = 0;
                for (int64_t e = 0; e < hs; e++)
                    d += (double)Q[(t * NH + h) * hs + e] * K[(j * NKV + kh) * hs + e];
                s[j] = d / sqrt((double)hs);
                mx = fmax(mx, s[j]);
            }
            for (int64_t j = first; j <= last; j++) z += (s[j] = exp(s[j] - mx));
            for (int64_t e = 0; e < hs; e++) {
                double o = 0;
                for (int64_t j = first; j <= last; j++) o += s[j] / z * V[(j * NKV + kh) * hs + e];
                out[(t * NH + h) * hs + e] = (float)o;
            }
            (void)S;
        }
}

/* prefill T1 tokens, then decode the remaining one at a time through the same graph (run-time pos) */
static void test_attention_kv(void) {
    int64_t NH = 4, NKV = 2, hs = 5, S = 11, T1 = 6;
    for (int win = 0; win <= 3; win += 3) {
        tc t = {0};
        t.ctx = sl_ctx_new(512);
        sl_tensor *q = param(&t, 4, (int64_t[]){1, S, NH, hs}, 1.0f);
        sl_tensor *k = param(&t, 4, (int64_t[]){1, S, NKV, hs}, 1.0f);
        sl_tensor *v = param(&t, 4, (int64_t[]){1, S, NKV, hs}, 1.0f);
        float *kc = calloc((size_t)(S * NKV * hs), 4), *vc = calloc((size_t)(S * NKV * hs), 4);
        sl_tensor *K = sl_new_tensor(t.ctx, SL_F32, 4, (int64_t[]){1, S, NKV, hs});
        sl_tensor *Vt = sl_new_tensor(t.ctx, SL_F32, 4, (int64_t[]){1, S, NKV, hs});
        sl_tensor_bind(K, kc);
        sl_tensor_bind(Vt, vc);
        float *ref = malloc(sizeof(float) * (size_t)(S * NH * hs)),
              *got = malloc(sizeof(float) * (size_t)(S * NH * hs));
        ref_attn(t.pdata[0], t.pdata[1], t.pdata[2], S, 0, NH, NKV, hs, S, win, ref);
        /* prefill */
        sl_tensor *o1 = sl_attention_kv(t.ctx, sl_slice(t.ctx, q, 1, 0, T1),
                                        sl_kv_store(t.ctx, K, sl_slice(t.ctx, k, 1, 0, T1), 0),
                                        sl_kv_store(t.ctx, Vt, sl_slice(t.ctx, v, 1, 0, T1), 0), 0, win);
        float *p1 = fwd(&t, o1);
        memcpy(got, p1, sizeof(float) * (size_t)(T1 * NH * hs));
        free(p1);
        /* decode: one graph, positions changed between runs; inputs are per-step leaves */
        float qs[NH * 5], ks[NKV * 5], vs[NKV * 5];
        sl_tensor *qd = sl_new_tensor(t.ctx, SL_F32, 4, (int64_t[]){1, 1, NH, hs});
        sl_tensor *kd = sl_new_tensor(t.ctx, SL_F32, 4, (int64_t[]){1, 1, NKV, hs});
        sl_tensor *vd = sl_new_tensor(t.ctx, SL_F32, 4, (int64_t[]){1, 1, NKV, hs});
        sl_tensor_bind(qd, qs), sl_tensor_bind(kd, ks), sl_tensor_bind(vd, vs);
        sl_tensor *o2 = sl_attention_kv(t.ctx, qd, sl_kv_store(t.ctx, K, kd, (int)T1),
                                        sl_kv_store(t.ctx, Vt, vd, (int)T1), (int)T1, win);
        sl_graph *g = sl_graph_new(t.ctx);
        sl_graph_build_forward(g, o2);
        TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
        for (int64_t p = T1; p < S; p++) {
            memcpy(qs, t.pdata[0] + p * NH * hs, sizeof qs);
            memcpy(ks, t.pdata[1] + p * NKV * hs, sizeof ks);
            memcpy(vs, t.pdata[2] + p * NKV * hs, sizeof vs);
            for (int i = 0; i < sl_graph_n_nodes(g); i++) {
                sl_tensor *nd = sl_graph_node(g, i);
                if (nd->op == SL_OP_KV_STORE || nd->op == SL_OP_ATTENTION_KV) nd->iparams[0] = (int)p;
            }
            TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute: %s", sl_errmsg());
            memcpy(got + p * NH * hs, o2->data, sizeof(float) * (size_t)(NH * hs));
        }
        /* a position past the cache is a run-time error, not a crash */
        for (int i = 0; i < sl_graph_n_nodes(g); i++) {
            sl_tensor *nd = sl_graph_node(g, i);
            if (nd->op == SL_OP_KV_STORE || nd->op == SL_OP_ATTENTION_KV) nd->iparams[0] = (int)S;
        }
        TU_CHECK(sl_graph_compute(g, NULL, NULL) != SL_OK, "kv position past capacity must fail");
        tu_allclose(win ? "attention_kv prefill+decode window 3" : "attention_kv prefill+decode", got, ref,
                    S * NH * hs, 1e-5f, 1e-4f);
        sl_graph_free(g);
        free(ref), free(got), free(kc), free(vc);
        tc_free(&t);
    }
}

static double bf(double x) { /* round to the nearest bf16 (ties to even) */
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 linear: y = bf16(x) @ w^T over bf16 weights, fp32 accumulation (double reference on the rounded
 * operands), with and without output rounding, and the input-gradient direction (transB = 0) */
static void test_linear_bf16(void) {
    int64_t M = 7, K = 37, N = 19;
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *x = param(&t, 2, (int64_t[]){M, K}, 1.0f);
    sl_tensor *w = param(&t, 2, (int64_t[]){N, K}, 1.0f);
    sl_tensor *wb = sl_cast(t.ctx, w, SL_BF16);
    for (int ro = 0; ro < 2; ro++) {
        float *got = fwd(&t, sl_linear_bf16(t.ctx, x, wb, ro));
        float ref[7 * 19];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) s += bf(t.pdata[0][i * K + k]) * bf(t.pdata[1][j * K + k]);
                ref[i * N + j] = (float)(ro ? bf(s) : s);
            }
        tu_allclose(ro ? "linear_bf16 (rounded output)" : "linear_bf16", got, ref, M * N, ro ? 2e-2f : 1e-5f,
                    ro ? 8e-3f : 1e-4f);
        free(got);
    }
    tc_free(&t);
}

/* sparse expert: only routed rows computed; equals gate * SwiGLU(h) (double reference), zero elsewhere */
static void test_moe_expert(void) {
    int64_t N = 9, C = 5, I = 6, E = 4;
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *h = param(&t, 2, (int64_t[]){N, C}, 1.0f);
    sl_tensor *lg = param(&t, 2, (int64_t[]){N, E}, 1.0f);
    sl_tensor *w1 = param(&t, 2, (int64_t[]){I, C}, 0.5f), *w3 = param(&t, 2, (int64_t[]){I, C}, 0.5f);
    sl_tensor *w2 = param(&t, 2, (int64_t[]){C, I}, 0.5f);
    sl_tensor *gate = sl_topk_gate(t.ctx, lg, 2);
    float *gv = fwd(&t, gate);
    for (int e = 0; e < E; e++) {
        float *got = fwd(&t, sl_moe_expert(t.ctx, h, gate, e, w1, w3, w2, 0));
        float ref[45];
        for (int64_t r = 0; r < N; r++) {
            double u[6];
            for (int64_t i = 0; i < I; i++) {
                double a = 0, b = 0;
                for (int64_t c = 0; c < C; c++)
                    a += (double)t.pdata[2][i * C + c] * t.pdata[0][r * C + c],
                        b += (double)t.pdata[3][i * C + c] * t.pdata[0][r * C + c];
                u[i] = a / (1 + exp(-a)) * b;
            }
            for (int64_t c = 0; c < C; c++) {
                double o = 0;
                for (int64_t i = 0; i < I; i++) o += (double)t.pdata[4][c * I + i] * u[i];
                ref[r * C + c] = (float)(gv[r * E + e] * o);
            }
        }
        char what[64];
        snprintf(what, sizeof what, "moe_expert e=%d", e);
        tu_allclose(what, got, ref, N * C, 1e-5f, 1e-4f);
        free(got);
    }
    free(gv);
    tc_free(&t);
}

/* ---------------- gradients ---------------- */

static sl_tensor *b_rmsnorm(tc *t) {
    sl_tensor *x = param(t, 3, (int64_t[]){2, 3, 13}, 1.0f);
    sl_tensor *w = param(t, 1, (int64_t[]){13}, 1.0f);
    return sl_rmsnorm(t->ctx, x, w, 1e-5f);
}
static sl_tensor *b_rmsnorm_now(tc *t) {
    sl_tensor *x = param(t, 2, (int64_t[]){5, 9}, 1.0f);
    return sl_rmsnorm(t->ctx, x, NULL, 1e-6f);
}
static sl_tensor *b_rope(tc *t) {
    sl_tensor *base = param(t, 3, (int64_t[]){2, 4, 18}, 1.0f); /* (B,T,3*6): heads view */
    sl_tensor *x = sl_view(t->ctx, base, 4, (int64_t[]){2, 4, 3, 6}, (int64_t[]){72, 18, 6, 1}, 0);
    return sl_rope(t->ctx, x, 3, 500.0f);
}
static sl_tensor *b_silu(tc *t) { return sl_silu(t->ctx, param(t, 2, (int64_t[]){7, 11}, 2.0f)); }
static sl_tensor *b_silu_strided(tc *t) {
    sl_tensor *a = param(t, 2, (int64_t[]){6, 10}, 2.0f);
    return sl_silu(t->ctx, sl_slice(t->ctx, a, 1, 3, 5));
}
static sl_tensor *b_topk(tc *t) { return sl_topk_gate(t->ctx, param(t, 2, (int64_t[]){6, 5}, 1.5f), 2); }
/* a SwiGLU MLP + RMSNorm + GQA attention with RoPE: the Llama block end to end */
static sl_tensor *b_block(tc *t) {
    int64_t B = 1, T = 4, C = 8, NH = 2, NKV = 1, hd = 4, I = 6;
    sl_tensor *x = param(t, 3, (int64_t[]){B, T, C}, 1.0f);
    sl_tensor *wn = param(t, 1, (int64_t[]){C}, 1.0f);
    sl_tensor *wqkv = param(t, 2, (int64_t[]){(NH + 2 * NKV) * hd, C}, 0.5f);
    sl_tensor *wg = param(t, 2, (int64_t[]){I, C}, 0.5f);
    sl_tensor *wu = param(t, 2, (int64_t[]){I, C}, 0.5f);
    sl_tensor *wd = param(t, 2, (int64_t[]){C, I}, 0.5f);
    sl_ctx *c = t->ctx;
    sl_tensor *h = sl_rmsnorm(c, x, wn, 1e-5f);
    sl_tensor *qkv = sl_linear(c, h, wqkv, NULL);
    int64_t nb[4] = {qkv->nb[0], qkv->nb[1], hd, 1};
    sl_tensor *q = sl_rope(c, sl_view(c, qkv, 4, (int64_t[]){B, T, NH, hd}, nb, 0), 0, 10000.0f);
    sl_tensor *k = sl_rope(c, sl_view(c, qkv, 4, (int64_t[]){B, T, NKV, hd}, nb, NH * hd), 0, 10000.0f);
    sl_tensor *v = sl_view(c, qkv, 4, (int64_t[]){B, T, NKV, hd}, nb, (NH + NKV) * hd);
    sl_tensor *a = sl_attention(c, q, k, v);
    sl_tensor *f =
        sl_linear(c, sl_mul(c, sl_silu(c, sl_linear(c, a, wg, NULL)), sl_linear(c, a, wu, NULL)), wd, NULL);
    return sl_add(c, x, f);
}

int main(void) {
    gc_set_key(11);
    test_rmsnorm_fwd();
    test_rope_fwd();
    test_silu_topk_fwd();
    test_attention_kv();
    test_moe_expert();
    test_linear_bf16();
    grad_check("rmsnorm", b_rmsnorm);
    grad_check("rmsnorm (no weight)", b_rmsnorm_now);
    grad_check("rope (strided heads view)", b_rope);
    grad_check("silu", b_silu);
    grad_check("silu (strided)", b_silu_strided);
    grad_check("topk_gate", b_topk);
    grad_check("llama block", b_block);
    return tu_finish("test_llama_ops");
}
