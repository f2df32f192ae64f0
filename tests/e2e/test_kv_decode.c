/* test_kv_decode — KV-cache inference against full recomputation, on small random models: GPT-2 (suanli's
 * own, the `--load` path), a GQA Llama in f32 and the same Llama with bf16 weights and compute.
 *   - batched prompt: the prefill graph over all S tokens (one forward, M = S rows) gives every row's logits
 *     as the full-recompute graph (sl_model_build, no cache);
 *   - token by token: a 1-token prefill then S-1 decode steps through the cache (M = 1: the GEMV path,
 *     Note [GEMV for decoding]) give each row's logits as the full recompute;
 *   - greedy: sl_model_generate (prefill + KV decode) picks the argmax of the full recompute's logits at
 *     every step (teacher forcing over prompt + generated tokens), and for GPT-2 the same tokens as the
 *     cache-free path of generate.c (sl_gpt2_generate), token for token;
 *   - GPT-2 past its positions: the windowed cache (Note [GPT-2 past its positions]) against the full
 *     recompute of each window;
 *   - `suanli bench generate` refuses bad flags (exit 2, the flag named).
 * Tolerances (f32): the two paths differ only in fp32 summation order (GEMV vs blocked GEMM, cached vs
 * full attention); measured max |d| 1.9e-7 (GPT-2, max |logit| 1.0) and 1.8e-7 (Llama, 0.55), bound 2e-6
 * (10x). bf16: each linear output and the residual stream are rounded to bf16 (Note [bf16 compute]), so a
 * 1-ulp fp32 difference before a rounding becomes a 2^-8 relative step after it; measured max |d| 2.9e-3 on
 * logits of max |l| 0.52 (1.5 bf16 ulps there: the logits are bf16 values too), bound 1e-2 (3.4x). Greedy in
 * bf16 is checked only where the top-2 gap is above that bound (a closer pair may legitimately swap). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/device.h"
#include "suanli/nn.h"
#include "testutil.h"

/* computes out's graph and copies out into dst (before the graph's arena goes) */
static sl_status run_graph(sl_model *m, sl_tensor *out, float *dst) {
    sl_graph *g = sl_graph_new(m->ctx);
    sl_graph_build_forward(g, out);
    sl_status st = sl_graph_plan(g, m->backend, NULL);
    if (st == SL_OK) st = sl_graph_compute(g, NULL, NULL);
    if (st == SL_OK) st = sl_tensor_copy_out(out, dst);
    sl_graph_free(g);
    return st;
}

/* full recompute: logits (S, V) of ids[0..S) in one graph without a cache */
static void full_logits(sl_model *m, const int32_t *ids, int S, float *out) {
    int mark = sl_ctx_mark(m->ctx);
    sl_tensor *x = sl_new_tensor_2d(m->ctx, SL_I32, 1, S);
    sl_tensor_bind(x, (void *)ids);
    sl_tensor *logits = NULL;
    sl_model_build(m, x, NULL, &logits);
    TU_CHECK(run_graph(m, logits, out) == SL_OK, "full: %s", sl_errmsg());
    sl_ctx_reset(m->ctx, mark);
}

/* KV cache: a prefill of n0 tokens, then one decode step per remaining token; logits (S, V) */
static void kv_logits(sl_model *m, const int32_t *ids, int S, int n0, float *out) {
    int V = m->cfg.vocab_size, mark = sl_ctx_mark(m->ctx);
    sl_kv_cache kv;
    TU_CHECK(sl_kv_cache_new(m, 1, S, &kv) == SL_OK, "kv cache: %s", sl_errmsg());
    sl_tensor *xp = sl_new_tensor_2d(m->ctx, SL_I32, 1, n0);
    sl_tensor_bind(xp, (void *)ids);
    sl_tensor *lp = sl_model_build_kv(m, xp, &kv, 0);
    TU_CHECK(run_graph(m, lp, out) == SL_OK, "prefill: %s", sl_errmsg());
    if (n0 < S) {
        int32_t cur = 0;
        sl_tensor *xd = sl_new_tensor_2d(m->ctx, SL_I32, 1, 1);
        sl_tensor_bind(xd, &cur);
        sl_tensor *ld = sl_model_build_kv(m, xd, &kv, n0);
        sl_graph *g = sl_graph_new(m->ctx);
        sl_graph_build_forward(g, ld);
        TU_CHECK(sl_graph_plan(g, m->backend, NULL) == SL_OK, "plan: %s", sl_errmsg());
        for (int p = n0; p < S; p++) {
            cur = ids[p];
            TU_CHECK(sl_kv_graph_set_pos(g, p) == SL_OK && sl_graph_compute(g, NULL, NULL) == SL_OK,
                     "decode %d: %s", p, sl_errmsg());
            sl_tensor_copy_out(ld, out + (size_t)p * (size_t)V);
        }
        sl_graph_free(g);
    }
    sl_kv_cache_free(&kv);
    sl_ctx_reset(m->ctx, mark);
}

static double maxabs_d(const float *a, const float *b, int64_t n, double *amax) {
    double d = 0;
    *amax = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs((double)a[i] - b[i]) > d || isnan(a[i]))
            d = isnan(a[i]) ? INFINITY : fabs((double)a[i] - b[i]);
        if (fabs((double)b[i]) > *amax) *amax = fabs((double)b[i]);
    }
    return d;
}

static int argmax(const float *r, int V, float *gap) {
    int b = 0;
    for (int j = 1; j < V; j++)
        if (r[j] > r[b]) b = j;
    float second = -INFINITY;
    for (int j = 0; j < V; j++)
        if (j != b && r[j] > second) second = r[j];
    *gap = r[b] - second;
    return b;
}

typedef struct {
    int32_t *t;
    int n;
} sink;
static int collect(void *u, int32_t t) {
    sink *s = u;
    s->t[s->n++] = t;
    return 0;
}

static void check_model(const char *name, sl_model *m, double tol) {
    enum { S = 24, P = 6, NEW = 18 };
    int V = m->cfg.vocab_size;
    int32_t ids[S];
    for (int i = 0; i < S; i++) ids[i] = (int32_t)(sl_rng_u64(11, 0, (uint64_t)i) % (uint64_t)V);
    float *full = malloc(sizeof(float) * S * (size_t)V), *kv = malloc(sizeof(float) * S * (size_t)V);
    double amax;
    full_logits(m, ids, S, full);
    kv_logits(m, ids, S, S, kv);
    double d = maxabs_d(kv, full, (int64_t)S * V, &amax);
    printf("%-10s batched prompt (M=%d) vs full recompute: max|d| = %.3g (max|logit| %.3g)\n", name, S, d,
           amax);
    TU_CHECK(d <= tol, "%s: batched prompt logits max|d| %.3g > %.3g", name, d, tol);
    kv_logits(m, ids, S, 1, kv);
    d = maxabs_d(kv, full, (int64_t)S * V, &amax);
    printf("%-10s token by token (M=1)  vs full recompute: max|d| = %.3g\n", name, d);
    TU_CHECK(d <= tol, "%s: token-by-token logits max|d| %.3g > %.3g", name, d, tol);

    /* greedy: KV generation vs the argmax of the full recompute over prompt + generated */
    int32_t out[NEW], seq[P + NEW];
    sl_sample_opts so = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1};
    sl_gen_stats gs;
    TU_CHECK(sl_model_generate(m, ids, P, NEW, &so, NULL, 0, NULL, NULL, out, &gs) == SL_OK &&
                 gs.n_generated == NEW,
             "%s generate: %s", name, sl_errmsg());
    memcpy(seq, ids, sizeof(int32_t) * P);
    memcpy(seq + P, out, sizeof out);
    full_logits(m, seq, P + NEW, full);
    int bad = 0, checked = 0;
    for (int t = 0; t < NEW; t++) {
        float gap;
        int a = argmax(full + (size_t)(P - 1 + t) * (size_t)V, V, &gap);
        if (gap <= tol) continue; /* a near tie: either pick is right */
        checked++;
        if (a != out[t]) bad++;
    }
    printf("%-10s greedy: %d of %d steps checked against the full recompute's argmax, %d differ\n", name,
           checked, NEW, bad);
    TU_CHECK(bad == 0 && checked >= NEW / 2, "%s: greedy KV tokens differ from recompute (%d of %d)", name,
             bad, checked);
    if (m->arch == SL_ARCH_GPT2) { /* the old cache-free path: token for token */
        int32_t old[NEW];
        sink s = {old, 0};
        TU_CHECK(sl_gpt2_generate(m, ids, P, NEW, &so, collect, &s) == SL_OK && s.n == NEW, "gpt2_generate");
        TU_CHECK(memcmp(old, out, sizeof out) == 0, "%s: KV greedy differs from the cache-free path", name);
    }
    free(full);
    free(kv);
}

/* GPT-2 past its W positions (Note [GPT-2 past its positions]): until the first refill the tokens are the
 * cache-free sliding window's; every token is the argmax of a full recompute over the window the cache
 * holds (start a: the prompt's last W tokens, then the last W/2 whenever the W positions are used up). */
static void check_gpt2_long(sl_model *m) {
    enum { P = 6, NEW = 90 };
    int W = m->cfg.max_seq_len, V = m->cfg.vocab_size, keep = W / 2;
    int32_t seq[P + NEW], out[NEW], old[NEW];
    for (int i = 0; i < P; i++) seq[i] = (int32_t)(sl_rng_u64(12, 0, (uint64_t)i) % (uint64_t)V);
    sl_sample_opts so = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1};
    sl_gen_stats gs;
    TU_CHECK(sl_model_generate(m, seq, P, NEW, &so, NULL, 0, NULL, NULL, out, &gs) == SL_OK &&
                 gs.n_generated == NEW,
             "gpt2 long generate: %s", sl_errmsg());
    sink sk = {old, 0};
    TU_CHECK(sl_gpt2_generate(m, seq, P, NEW, &so, collect, &sk) == SL_OK, "gpt2 sliding");
    int same = W - P; /* tokens produced before the first refill: the same context */
    TU_CHECK(memcmp(out, old, sizeof(int32_t) * (size_t)same) == 0,
             "gpt2 long: the first %d tokens differ from the sliding window", same);
    memcpy(seq + P, out, sizeof out);
    float *lg = malloc(sizeof(float) * (size_t)W * (size_t)V);
    int a = 0, bad = 0, checked = 0, refills = 0;
    for (int t = 0; t < NEW; t++) {
        int n = P + t; /* tokens known before out[t]; the window is seq[a, n) */
        if (n - a > W) a = n - keep, refills++;
        full_logits(m, seq + a, n - a, lg);
        float gap;
        int b = argmax(lg + (size_t)(n - a - 1) * (size_t)V, V, &gap);
        if (gap <= 2e-6) continue;
        checked++;
        bad += b != out[t];
    }
    printf("gpt2 W=%d, %d tokens: %d refills, %d of %d checked tokens differ from the windowed recompute\n",
           W, NEW, refills, bad, checked);
    TU_CHECK(refills >= 2 && bad == 0 && checked >= NEW / 2, "gpt2 long: windowed KV differs (%d)", bad);
    free(lg);
}

int main(void) {
    sl_threads_set(2);
    sl_model *m = NULL;
    sl_gpt2_config gc = {2, 4, 64, 97, 32};
    TU_CHECK(sl_gpt2_new(&gc, &m) == SL_OK, "gpt2: %s", sl_errmsg());
    sl_model_init_weights(m, 7);
    check_model("gpt2", m, 2e-6);
    check_gpt2_long(m);
    sl_model_free(m);

    sl_llama_config lc = {.arch = SL_ARCH_LLAMA,
                          .n_layer = 2,
                          .n_head = 4,
                          .n_kv_head = 2,
                          .head_dim = 16,
                          .hidden = 64,
                          .intermediate = 160,
                          .vocab_size = 101,
                          .max_seq_len = 64,
                          .rms_eps = 1e-5f,
                          .rope_theta = 10000.0f};
    TU_CHECK(sl_llama_new(&lc, &m) == SL_OK, "llama: %s", sl_errmsg());
    sl_model_init_weights(m, 7);
    check_model("llama f32", m, 2e-6);
    sl_model_free(m);

    TU_CHECK(sl_llama_new_ex(&lc, SL_BF16, &m) == SL_OK && sl_model_init_bf16_random(m, 7) == SL_OK,
             "llama bf16: %s", sl_errmsg());
    check_model("llama bf16", m, 1e-2);
    /* the random init refuses a model that already has bf16 storage */
    TU_CHECK(sl_model_init_bf16_random(m, 7) == SL_ERR_INVALID, "second init_bf16_random refused");
    sl_model_free(m);

    /* suanli bench generate: bad flags are one line naming the flag, exit 2, before any model is built */
    char out[4096];
    int rc = tu_cli_run(out, sizeof out, "bench generate --size 3b");
    TU_CHECK(rc == 2 && strstr(out, "--size") && strstr(out, "3b"), "bench --size 3b: rc %d: %s", rc, out);
    rc = tu_cli_run(out, sizeof out, "bench generate --size small --prompt-length 4000 --decode-tokens 200");
    TU_CHECK(rc == 2 && strstr(out, "--prompt-length"), "bench past positions: rc %d: %s", rc, out);
    rc = tu_cli_run(out, sizeof out, "bench generate --threads 0");
    TU_CHECK(rc == 2 && strstr(out, "threads"), "bench --threads 0: rc %d: %s", rc, out);
    return tu_finish("test_kv_decode");
}
