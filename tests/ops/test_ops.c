/* Every op: forward against an independent double-precision scalar reference on awkward shapes, and
 * backward against central finite differences of a random projection of the output.
 * Tolerances: forward 1e-5 abs + 1e-4 rel (f32 vs double); gradients 5e-3 rel of max |grad| (f32 FD). */
#include <string.h>

#include "suanli/device.h"
#include "suanli/graph.h"
#include "gradcheck.h"
#include "testutil.h"

/* -------- forward references (double) -------- */

static void ref_matmul(int tA, int tB, int64_t Bt, int64_t M, int64_t N, int64_t K, const float *A,
                       const float *B, float *C) {
    for (int64_t b = 0; b < Bt; b++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    double a = tA ? A[b * M * K + k * M + i] : A[b * M * K + i * K + k];
                    double bb = tB ? B[b * N * K + j * K + k] : B[b * N * K + k * N + j];
                    s += a * bb;
                }
                C[b * M * N + i * N + j] = (float)s;
            }
}

static void test_matmul_fwd(void) {
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {1, 3, 17, 5}, {2, 17, 3, 63}, {3, 65, 7, 1}, {1, 63, 65, 17}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tA = 0; tA < 2; tA++)
            for (int tB = 0; tB < 2; tB++) {
                int64_t Bt = shapes[s][0], M = shapes[s][1], N = shapes[s][2], K = shapes[s][3];
                tc t = {0};
                t.ctx = sl_ctx_new(256);
                sl_tensor *A = param(&t, 3, tA ? (int64_t[]){Bt, K, M} : (int64_t[]){Bt, M, K}, 1.0f);
                sl_tensor *B = param(&t, 3, tB ? (int64_t[]){Bt, N, K} : (int64_t[]){Bt, K, N}, 1.0f);
                float *got = fwd(&t, sl_matmul(t.ctx, A, B, tA, tB));
                float *ref = malloc(sizeof(float) * (size_t)(Bt * M * N));
                ref_matmul(tA, tB, Bt, M, N, K, t.pdata[0], t.pdata[1], ref);
                char what[96];
                snprintf(what, sizeof what, "matmul B%lld M%lld N%lld K%lld tA%d tB%d", (long long)Bt,
                         (long long)M, (long long)N, (long long)K, tA, tB);
                tu_allclose(what, got, ref, Bt * M * N, 1e-5f, 1e-4f);
                free(got);
                free(ref);
                for (int i = 0; i < t.np; i++) free(t.pdata[i]), free(t.gdata[i]);
                sl_ctx_free(t.ctx);
            }
}

static void test_elementwise_fwd(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *a = param(&t, 3, (int64_t[]){3, 5, 7}, 1.0f);
    sl_tensor *b = param(&t, 2, (int64_t[]){1, 7}, 1.0f);
    sl_tensor *c = param(&t, 3, (int64_t[]){3, 1, 7}, 1.0f);
    float *add = fwd(&t, sl_add(t.ctx, a, b));
    float *mul = fwd(&t, sl_mul(t.ctx, a, c));
    float *gl = fwd(&t, sl_gelu(t.ctx, a));
    float *sm = fwd(&t, sl_softmax(t.ctx, a));
    float ra[105], rm[105], rg[105], rs[105];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) {
            double mx = -1e30, s = 0;
            for (int k = 0; k < 7; k++) mx = fmax(mx, t.pdata[0][(i * 5 + j) * 7 + k]);
            for (int k = 0; k < 7; k++) s += exp(t.pdata[0][(i * 5 + j) * 7 + k] - mx);
            for (int k = 0; k < 7; k++) {
                int idx = (i * 5 + j) * 7 + k;
                double x = t.pdata[0][idx];
                ra[idx] = (float)(x + t.pdata[1][k]);
                rm[idx] = (float)(x * t.pdata[2][i * 7 + k]);
                rg[idx] = (float)(0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))));
                rs[idx] = (float)(exp(x - mx) / s);
            }
        }
    tu_allclose("add broadcast", add, ra, 105, 1e-6f, 1e-6f);
    tu_allclose("mul broadcast", mul, rm, 105, 1e-6f, 1e-6f);
    tu_allclose("gelu", gl, rg, 105, 1e-6f, 1e-5f);
    tu_allclose("softmax", sm, rs, 105, 1e-6f, 1e-5f);
    free(add), free(mul), free(gl), free(sm);
    for (int i = 0; i < t.np; i++) free(t.pdata[i]), free(t.gdata[i]);
    sl_ctx_free(t.ctx);
}

static void test_layernorm_fwd(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    int64_t R = 17, C = 65;
    sl_tensor *x = param(&t, 2, (int64_t[]){R, C}, 2.0f);
    sl_tensor *w = param(&t, 1, (int64_t[]){C}, 1.0f);
    sl_tensor *b = param(&t, 1, (int64_t[]){C}, 1.0f);
    float *got = fwd(&t, sl_layernorm(t.ctx, x, w, b, 1e-5f));
    float *ref = malloc(sizeof(float) * (size_t)(R * C));
    for (int64_t r = 0; r < R; r++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; c++) m += t.pdata[0][r * C + c];
        m /= C;
        for (int64_t c = 0; c < C; c++) v += pow(t.pdata[0][r * C + c] - m, 2);
        v /= C;
        for (int64_t c = 0; c < C; c++)
            ref[r * C + c] =
                (float)((t.pdata[0][r * C + c] - m) / sqrt(v + 1e-5) * t.pdata[1][c] + t.pdata[2][c]);
    }
    tu_allclose("layernorm", got, ref, R * C, 1e-5f, 1e-4f);
    free(got), free(ref);
    for (int i = 0; i < t.np; i++) free(t.pdata[i]), free(t.gdata[i]);
    sl_ctx_free(t.ctx);
}

/* window 0: causal; else a sliding window (query i sees keys i - window < j <= i), in double precision */
static void test_attention_fwd(int window) {
    int64_t B = 2, T = 7, NH = 4, NKV = 2, hs = 5;
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *q = param(&t, 4, (int64_t[]){B, T, NH, hs}, 1.0f);
    sl_tensor *k = param(&t, 4, (int64_t[]){B, T, NKV, hs}, 1.0f);
    sl_tensor *v = param(&t, 4, (int64_t[]){B, T, NKV, hs}, 1.0f);
    float *got = fwd(&t, sl_attention_window(t.ctx, q, k, v, window));
    float *ref = calloc((size_t)(B * T * NH * hs), 4);
    const float *Q = t.pdata[0], *K = t.pdata[1], *V = t.pdata[2];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                int64_t kh = h / (NH / NKV);
                double s[16], mx = -1e30, z = 0;
                int64_t j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                for (int64_t j = j0; j <= i; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < hs; e++)
                        d +=
                            (double)Q[((b * T + i) * NH + h) * hs + e] * K[((b * T + j) * NKV + kh) * hs + e];
                    s[j] = d / sqrt((double)hs);
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = j0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
                for (int64_t e = 0; e < hs; e++) {
                    double o = 0;
                    for (int64_t j = j0; j <= i; j++) o += s[j] / z * V[((b * T + j) * NKV + kh) * hs + e];
                    ref[((b * T + i) * NH + h) * hs + e] = (float)o;
                }
            }
    tu_allclose(window ? "attention gqa window 3" : "attention gqa", got, ref, B * T * NH * hs, 1e-5f, 1e-4f);
    free(got), free(ref);
    for (int i = 0; i < t.np; i++) free(t.pdata[i]), free(t.gdata[i]);
    sl_ctx_free(t.ctx);
}

static void test_embed_ce_fwd(void) {
    int64_t V = 11, C = 6, N = 9;
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *tab = param(&t, 2, (int64_t[]){V, C}, 1.0f);
    sl_tensor *ids = sl_new_tensor_1d(t.ctx, SL_I32, N);
    int32_t idv[9] = {0, 10, 3, 3, 7, 1, 0, 9, 5}, tgv[9] = {1, 2, -1, 4, 10, 0, 0, 3, 5};
    sl_tensor_bind(ids, idv);
    float *emb = fwd(&t, sl_embedding(t.ctx, tab, ids));
    for (int64_t i = 0; i < N; i++)
        tu_allclose("embedding row", emb + i * C, t.pdata[0] + idv[i] * C, C, 0, 0);
    sl_tensor *lg = param(&t, 2, (int64_t[]){N, V}, 3.0f);
    sl_tensor *tg = sl_new_tensor_1d(t.ctx, SL_I32, N);
    sl_tensor_bind(tg, tgv);
    float *loss = fwd(&t, sl_cross_entropy(t.ctx, lg, tg));
    double tot = 0;
    int cnt = 0;
    for (int64_t i = 0; i < N; i++) {
        if (tgv[i] < 0) continue;
        double mx = -1e30, z = 0;
        for (int64_t j = 0; j < V; j++) mx = fmax(mx, t.pdata[1][i * V + j]);
        for (int64_t j = 0; j < V; j++) z += exp(t.pdata[1][i * V + j] - mx);
        tot += mx + log(z) - t.pdata[1][i * V + tgv[i]];
        cnt++;
    }
    float ref = (float)(tot / cnt);
    tu_allclose("cross entropy (ignore -1)", loss, &ref, 1, 1e-6f, 1e-5f);
    /* out-of-range id is a runtime error, not a crash */
    idv[2] = 11;
    sl_graph *g = sl_graph_new(t.ctx);
    sl_graph_build_forward(g, sl_embedding(t.ctx, tab, ids));
    sl_graph_plan(g, sl_backend_cpu(), NULL);
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_ERR_INVALID, "bad id rejected");
    TU_CHECK(strstr(sl_errmsg(), "out of range") != NULL, "message: %s", sl_errmsg());
    sl_graph_free(g);
    free(emb), free(loss);
    for (int i = 0; i < t.np; i++) free(t.pdata[i]), free(t.gdata[i]);
    sl_ctx_free(t.ctx);
}

static void test_views_fwd(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *a = param(&t, 3, (int64_t[]){2, 3, 4}, 1.0f);
    sl_tensor *b = param(&t, 3, (int64_t[]){2, 2, 4}, 1.0f);
    float *pm = fwd(&t, sl_cont(t.ctx, sl_permute(t.ctx, a, (int[]){2, 0, 1}))); /* (4,2,3) */
    float *cc = fwd(&t, sl_concat(t.ctx, a, b, 1));                              /* (2,5,4) */
    float *sl = fwd(&t, sl_cont(t.ctx, sl_slice(t.ctx, a, 2, 1, 2)));            /* (2,3,2) */
    float rp[24], rc[40], rsl[12];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) rp[(k * 2 + i) * 3 + j] = t.pdata[0][(i * 3 + j) * 4 + k];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++)
            for (int k = 0; k < 4; k++)
                rc[(i * 5 + j) * 4 + k] =
                    j < 3 ? t.pdata[0][(i * 3 + j) * 4 + k] : t.pdata[1][(i * 2 + j - 3) * 4 + k];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) rsl[(i * 3 + j) * 2 + k] = t.pdata[0][(i * 3 + j) * 4 + k + 1];
    tu_allclose("permute+cont", pm, rp, 24, 0, 0);
    tu_allclose("concat", cc, rc, 40, 0, 0);
    tu_allclose("slice+cont", sl, rsl, 12, 0, 0);
    free(pm), free(cc), free(sl);
    for (int i = 0; i < t.np; i++) free(t.pdata[i]), free(t.gdata[i]);
    sl_ctx_free(t.ctx);
}

/* -------- gradient builders -------- */
static sl_tensor *b_matmul_nn(tc *t) {
    return sl_matmul(t->ctx, param(t, 3, (int64_t[]){2, 3, 5}, 1), param(t, 3, (int64_t[]){2, 5, 4}, 1), 0,
                     0);
}
static sl_tensor *b_matmul_tt(tc *t) {
    return sl_matmul(t->ctx, param(t, 3, (int64_t[]){2, 5, 3}, 1), param(t, 3, (int64_t[]){2, 4, 5}, 1), 1,
                     1);
}
static sl_tensor *b_matmul_tn(tc *t) {
    return sl_matmul(t->ctx, param(t, 2, (int64_t[]){5, 3}, 1), param(t, 2, (int64_t[]){5, 4}, 1), 1, 0);
}
static sl_tensor *b_linear(tc *t) { /* folded (B,T,C) @ W^T + b */
    return sl_linear(t->ctx, param(t, 3, (int64_t[]){2, 3, 5}, 1), param(t, 2, (int64_t[]){4, 5}, 1),
                     param(t, 1, (int64_t[]){4}, 1));
}
static sl_tensor *b_linear_nn(tc *t) {
    return sl_matmul(t->ctx, param(t, 3, (int64_t[]){2, 3, 5}, 1), param(t, 2, (int64_t[]){5, 4}, 1), 0, 0);
}
static sl_tensor *b_add_bcast(tc *t) {
    return sl_add(t->ctx, param(t, 3, (int64_t[]){3, 4, 5}, 1), param(t, 2, (int64_t[]){4, 1}, 1));
}
static sl_tensor *b_mul_bcast(tc *t) {
    return sl_mul(t->ctx, param(t, 3, (int64_t[]){3, 4, 5}, 1), param(t, 3, (int64_t[]){3, 1, 5}, 1));
}
static sl_tensor *b_scale_gelu(tc *t) {
    return sl_gelu(t->ctx, sl_scale(t->ctx, param(t, 2, (int64_t[]){7, 9}, 1), 1.7f));
}
static sl_tensor *b_layernorm(tc *t) {
    return sl_layernorm(t->ctx, param(t, 3, (int64_t[]){2, 3, 17}, 1), param(t, 1, (int64_t[]){17}, 1),
                        param(t, 1, (int64_t[]){17}, 1), 1e-5f);
}
static sl_tensor *b_softmax(tc *t) { return sl_softmax(t->ctx, param(t, 2, (int64_t[]){5, 13}, 1)); }
static sl_tensor *b_attention_qkv(tc *t) {
    /* GPT-2 style: q,k,v are strided views of one (B,T,3,NH,hs) projection; exercises view scatter */
    int64_t B = 2, T = 5, NH = 2, hs = 3;
    sl_tensor *qkv = param(t, 3, (int64_t[]){B, T, 3 * NH * hs}, 1);
    sl_tensor *x = sl_scale(t->ctx, qkv, 1.0f); /* make it a non-leaf so views scatter */
    sl_tensor *r = sl_reshape(t->ctx, x, 5, (int64_t[]){B, T, 3, NH, hs});
    sl_tensor *q =
        sl_view(t->ctx, r, 4, (int64_t[]){B, T, NH, hs}, (int64_t[]){r->nb[0], r->nb[1], r->nb[3], 1}, 0);
    sl_tensor *k = sl_view(t->ctx, r, 4, (int64_t[]){B, T, NH, hs},
                           (int64_t[]){r->nb[0], r->nb[1], r->nb[3], 1}, r->nb[2]);
    sl_tensor *v = sl_view(t->ctx, r, 4, (int64_t[]){B, T, NH, hs},
                           (int64_t[]){r->nb[0], r->nb[1], r->nb[3], 1}, 2 * r->nb[2]);
    return sl_attention(t->ctx, q, k, v);
}
static sl_tensor *b_attention_gqa(tc *t) {
    return sl_attention(t->ctx, param(t, 4, (int64_t[]){2, 6, 4, 3}, 1),
                        param(t, 4, (int64_t[]){2, 6, 2, 3}, 1), param(t, 4, (int64_t[]){2, 6, 2, 3}, 1));
}
static sl_tensor *b_attention_window(tc *t) { /* Mistral's sliding window (3 < T = 6), GQA */
    return sl_attention_window(t->ctx, param(t, 4, (int64_t[]){2, 6, 4, 3}, 1),
                               param(t, 4, (int64_t[]){2, 6, 2, 3}, 1),
                               param(t, 4, (int64_t[]){2, 6, 2, 3}, 1), 3);
}
static sl_tensor *b_view_of_slice(tc *t) {
    /* Baichuan's W_pack: (B,T,NH,hs) head views of column slices of one (B,T,3*NH*hs) projection, a view of
     * a strided view (the autodiff scatter once placed its gradient with the wrong strides) */
    int64_t B = 2, T = 4, NH = 2, hs = 4, D = NH * hs;
    sl_tensor *x = sl_scale(t->ctx, param(t, 3, (int64_t[]){B, T, 3 * D}, 1), 1.0f);
    sl_tensor *hv[3];
    for (int j = 0; j < 3; j++) {
        sl_tensor *sl = sl_slice(t->ctx, x, 2, j * D, D);
        hv[j] =
            sl_view(t->ctx, sl, 4, (int64_t[]){B, T, NH, hs}, (int64_t[]){sl->nb[0], sl->nb[1], hs, 1}, 0);
    }
    return sl_attention(t->ctx, sl_rope(t->ctx, hv[0], 0, 10000.0f), hv[1], hv[2]);
}
static int32_t g_ids[10] = {3, 0, 3, 6, 1, 3, 2, 6, 0, 5};
static sl_tensor *b_embedding(tc *t) {
    sl_tensor *ids = sl_new_tensor_2d(t->ctx, SL_I32, 2, 5);
    sl_tensor_bind(ids, g_ids);
    sl_tensor *tab = param(t, 2, (int64_t[]){7, 4}, 1);
    /* the table is used twice (tied embedding pattern): lookup and as a projection */
    sl_tensor *e = sl_embedding(t->ctx, tab, ids); /* (2,5,4) */
    return sl_matmul(t->ctx, e, tab, 0, 1);        /* (2,5,7) */
}
static int32_t g_tg[12] = {1, 4, 0, -1, 2, 2, 6, 5, 3, 0, 1, 6};
static sl_tensor *b_ce(tc *t) {
    sl_tensor *tg = sl_new_tensor_2d(t->ctx, SL_I32, 3, 4);
    sl_tensor_bind(tg, g_tg);
    return sl_cross_entropy(t->ctx, param(t, 3, (int64_t[]){3, 4, 7}, 2), tg);
}
static sl_tensor *b_views(tc *t) {
    sl_tensor *a = param(t, 3, (int64_t[]){2, 3, 4}, 1);
    sl_tensor *b = param(t, 3, (int64_t[]){2, 2, 4}, 1);
    sl_tensor *c = sl_concat(t->ctx, a, b, 1);                               /* (2,5,4) */
    sl_tensor *p = sl_cont(t->ctx, sl_permute(t->ctx, c, (int[]){2, 0, 1})); /* (4,2,5) */
    sl_tensor *parts[2];
    sl_split(t->ctx, p, 0, 2, parts);
    return sl_mul(t->ctx, sl_cont(t->ctx, parts[0]), sl_cont(t->ctx, parts[1]));
}
static sl_tensor *b_reuse(tc *t) { /* a node consumed three times: gradient accumulation */
    sl_tensor *a = sl_gelu(t->ctx, param(t, 2, (int64_t[]){3, 4}, 1));
    return sl_add(t->ctx, sl_mul(t->ctx, a, a), a);
}

int main(void) {
    sl_threads_set(2);
    test_matmul_fwd();
    test_elementwise_fwd();
    test_layernorm_fwd();
    test_attention_fwd(0);
    test_attention_fwd(3);
    test_embed_ce_fwd();
    test_views_fwd();
    grad_check("matmul_nn", b_matmul_nn);
    grad_check("matmul_tt", b_matmul_tt);
    grad_check("matmul_tn", b_matmul_tn);
    grad_check("linear", b_linear);
    grad_check("linear_nn", b_linear_nn);
    grad_check("add_bcast", b_add_bcast);
    grad_check("mul_bcast", b_mul_bcast);
    grad_check("scale_gelu", b_scale_gelu);
    grad_check("layernorm", b_layernorm);
    grad_check("softmax", b_softmax);
    grad_check("attention_qkv_views", b_attention_qkv);
    grad_check("attention_gqa", b_attention_gqa);
    grad_check("attention_window", b_attention_window);
    grad_check("view_of_strided_slice", b_view_of_slice);
    grad_check("embedding_tied", b_embedding);
    grad_check("cross_entropy", b_ce);
    grad_check("concat_permute_split", b_views);
    grad_check("reuse", b_reuse);
    return tu_finish("test_ops");
}
