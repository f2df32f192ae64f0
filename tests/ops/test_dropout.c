/* Dropout (issue 20; Note [Dropout from counters] in src/ops/build.c).
 * - the DROPOUT kernel against an independent evaluation of the rule with sl_philox4x32 (exact);
 * - finite differences through DROPOUT and through ATTENTION with dropout of its probabilities, the mask
 *   fixed by the counters (grad_check's 5e-3 bar, tests/gradcheck.c);
 * - statistics: the kept fraction of 2^20 elements, overall and per Philox word lane, within 6 binomial
 *   standard deviations (a false alarm has probability ~2e-9 per check); E[dropout(x)] = x: attention
 *   outputs averaged over 400 streams lie within 6 standard errors of the dropout-free output;
 * - the same values on 1 and 2 threads (bitwise), forward and backward;
 * - res + dropout(x) as one node (sl_dropout_add, Note [Hidden dropout bits]): bitwise add(res, dropout(x)),
 *   whole tensors and a sequence shard; its backward reads the forward's mask bits (complemented bits give
 *   the complement mask), draws the mask again when the header names another mask or was cleared by a run
 *   with dropout off, and both give the drawn backward bit for bit; finite differences through it;
 * - p = 0, or dropout off (the state evaluation and generation run in): bitwise the dropout-free values,
 *   also for a whole GPT-2 through the trainer's evaluation (a model with p = 0.5 evaluates exactly like the
 *   same weights without dropout, while its gradients differ; the same for a GQA Llama); the generation
 *   graph has no dropout. */
#include <omp.h>
#include <string.h>

#include "device/cpu/kernels/kernels.h"
#include "gradcheck.h"
#include "suanli/nn.h"
#include "suanli/train.h"
#include "testutil.h"

static sl_tensor *on(sl_tensor *t, uint64_t seed, uint64_t stream) {
    t->iparams[SL_DROPOUT_IP_ON] = 1;
    t->iparams[SL_DROPOUT_IP_SEED_LO] = (int32_t)(uint32_t)seed;
    t->iparams[SL_DROPOUT_IP_SEED_HI] = (int32_t)(uint32_t)(seed >> 32);
    t->iparams[SL_DROPOUT_IP_STREAM_LO] = (int32_t)(uint32_t)stream;
    t->iparams[SL_DROPOUT_IP_STREAM_HI] = (int32_t)(uint32_t)(stream >> 32);
    return t;
}

static void test_rule(void) {
    const int64_t N = 1001; /* not a multiple of 4 nor of the kernel's chunk */
    const float p = 0.3f;
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *x = param(&t, 2, (int64_t[]){7, 143}, 1.0f);
    uint64_t seed = 0x123456789abcull, stream = 5;
    float *y = fwd(&t, on(sl_dropout(t.ctx, x, p, 9), seed, stream));
    uint32_t thr = (uint32_t)((double)p * 4294967296.0);
    float keep = (float)(1.0 / (1.0 - (double)p));
    int bad = 0;
    for (int64_t e = 0; e < N; e++) {
        uint32_t o[4];
        sl_philox4x32(seed, (stream << 16) | 9, (uint64_t)e / 4, o);
        float want = o[e % 4] >= thr ? t.pdata[0][e] * keep : t.pdata[0][e] * 0.0f;
        bad += memcmp(&want, &y[e], sizeof want) != 0;
    }
    TU_CHECK(bad == 0, "%d of %lld elements differ from the counter rule", bad, (long long)N);
    free(y);
    tc_free(&t);
}

static sl_tensor *b_dropout(tc *t) {
    sl_tensor *x = param(t, 3, (int64_t[]){2, 5, 7}, 1.0f);
    return on(sl_dropout(t->ctx, sl_gelu(t->ctx, x), 0.4f, 3), 77, 2);
}
static sl_tensor *b_attention_dropout(tc *t) { /* GQA, the probabilities dropped with p = 0.3 */
    sl_tensor *q = param(t, 4, (int64_t[]){2, 6, 4, 3}, 1), *k = param(t, 4, (int64_t[]){2, 6, 2, 3}, 1),
              *v = param(t, 4, (int64_t[]){2, 6, 2, 3}, 1);
    return on(sl_attention_dropout(sl_attention(t->ctx, q, k, v), 0.3f, 4), 99, 1);
}
static sl_tensor *b_attention_window_dropout(tc *t) {
    sl_tensor *q = param(t, 4, (int64_t[]){1, 7, 2, 4}, 1), *k = param(t, 4, (int64_t[]){1, 7, 2, 4}, 1),
              *v = param(t, 4, (int64_t[]){1, 7, 2, 4}, 1);
    return on(sl_attention_dropout(sl_attention_window(t->ctx, q, k, v, 3), 0.5f, 4), 5, 8);
}

static sl_tensor *b_dropout_add(tc *t) {
    sl_tensor *x = param(t, 3, (int64_t[]){2, 5, 7}, 1.0f), *r = param(t, 3, (int64_t[]){2, 5, 7}, 1.0f);
    return on(sl_dropout_add(t->ctx, sl_gelu(t->ctx, x), sl_gelu(t->ctx, r), 0.4f, 3), 77, 2);
}

static float *node_buf(sl_tensor *n) {
    n->data = calloc(1, sl_nbytes(n) + n->aux_bytes);
    return n->data;
}
static void set_shard(sl_tensor *n, int64_t t0, int64_t seq) {
    n->iparams[SL_DROPOUT_IP_T0] = (int32_t)t0;
    n->iparams[SL_DROPOUT_IP_SEQ] = (int32_t)seq;
}

/* Note [Hidden dropout bits]: the fused forward, and the backward from the forward's bits */
static void test_dropout_add_bits(void) {
    const int64_t B = 3, T = 37, C = 29, N = B * T * C; /* chunks of 1,024 that straddle rows */
    const float p = 0.3f, keep = (float)(1.0 / (1.0 - (double)p));
    const uint64_t seed = 0xfeedull, stream = 12;
    for (int shard = 0; shard < 2; shard++) {
        sl_ctx *ctx = sl_ctx_new(64);
        const int64_t ne[3] = {B, T, C};
        sl_tensor *x = sl_new_tensor(ctx, SL_F32, 3, ne), *res = sl_new_tensor(ctx, SL_F32, 3, ne),
                  *g = sl_new_tensor(ctx, SL_F32, 3, ne);
        float *px = malloc(sizeof(float) * (size_t)N), *pr = malloc(sizeof(float) * (size_t)N),
              *pg = malloc(sizeof(float) * (size_t)N);
        sl_rng_fill_normal(px, N, 1, 1, 0.0f, 1.0f);
        sl_rng_fill_normal(pr, N, 1, 2, 0.0f, 1.0f);
        sl_rng_fill_normal(pg, N, 1, 3, 0.0f, 1.0f);
        sl_tensor_bind(x, px);
        sl_tensor_bind(res, pr);
        sl_tensor_bind(g, pg);
        sl_tensor *y = on(sl_dropout_add(ctx, x, res, p, 5), seed, stream);
        sl_tensor *d = on(sl_dropout(ctx, x, p, 5), seed, stream), *s = sl_add(ctx, res, d);
        /* the backward, as the rule builds it (linked to y), and the same node drawing its mask (unlinked) */
        sl_tensor *bl = sl_dropout(ctx, g, p, 5), *bd = sl_dropout(ctx, g, p, 5);
        memcpy(bl->iparams, y->iparams, sizeof bl->iparams);
        memcpy(bd->iparams, y->iparams, sizeof bd->iparams);
        bl->src[2] = y;
        if (shard) /* positions [T, 2 T) of a 4 T sequence: the third rank of a sequence-parallel 4 */
            for (sl_tensor **n = (sl_tensor *[]){y, d, bl, bd, NULL}; *n; n++) set_shard(*n, 2 * T, 4 * T);
        TU_CHECK(y->aux_bytes == sl_dropout_bits_bytes(y) && !bd->aux_bytes, "aux: room for the bits (%zu)",
                 y->aux_bytes);
        float *py = node_buf(y), *pd = node_buf(d), *ps = node_buf(s), *pbl = node_buf(bl),
              *pbd = node_buf(bd);
        const char *what = shard ? "a sequence shard" : "whole";
        for (int th = 1; th <= 2; th++) {
            omp_set_num_threads(th);
            TU_CHECK(sl_k_dropout(y) == SL_OK && sl_k_dropout(d) == SL_OK && sl_k_add(s) == SL_OK, "forward");
            TU_CHECK(!memcmp(py, ps, sizeof(float) * (size_t)N),
                     "%s, %d thread(s): dropout_add is not add(res, dropout(x)) bit for bit", what, th);
            TU_CHECK(sl_k_dropout(bd) == SL_OK && sl_k_dropout(bl) == SL_OK, "backward");
            TU_CHECK(!memcmp(pbl, pbd, sizeof(float) * (size_t)N),
                     "%s, %d thread(s): the backward from the bits differs from the drawn one", what, th);
        }
        /* the backward writing bf16 itself (Note [Half outputs], src/graph/fuse.c): the drawn values rounded
         */
        sl_tensor *bh = sl_dropout(ctx, g, p, 5);
        memcpy(bh->iparams, bl->iparams, sizeof bh->iparams);
        bh->src[2] = y;
        bh->dtype = SL_BF16;
        uint16_t *pbh = (uint16_t *)(void *)node_buf(bh);
        for (int off = 0; off < 2; off++) {
            bh->iparams[SL_DROPOUT_IP_ON] = !off;
            TU_CHECK(sl_k_dropout(bh) == SL_OK, "bf16 backward");
            int64_t nbad = 0;
            for (int64_t i = 0; i < N; i++) nbad += pbh[i] != sl_f32_to_bf16(off ? pg[i] : pbd[i]);
            TU_CHECK(nbad == 0, "%s: %lld bf16 backward values (dropout %s) are not the rounded f32 ones",
                     what, (long long)nbad, off ? "off" : "on");
        }
        free(pbh);
        /* the bits are what the backward reads: complemented, they give the complement mask */
        unsigned char *aux = (unsigned char *)py + sl_nbytes(y);
        uint16_t *bits = (uint16_t *)(void *)(aux + 32);
        size_t nw = (y->aux_bytes - 32) / 2;
        for (size_t i = 0; i < nw; i++) bits[i] = (uint16_t)~bits[i];
        TU_CHECK(sl_k_dropout(bl) == SL_OK, "backward");
        int64_t bad = 0;
        for (int64_t i = 0; i < N; i++) {
            float want = pg[i] * (pbd[i] == 0.0f && pg[i] != 0.0f ? keep : 0.0f);
            bad += memcmp(&want, &pbl[i], 4) != 0;
        }
        TU_CHECK(bad == 0, "%s: %lld elements ignore the complemented bits", what, (long long)bad);
        /* another micro-batch's mask named in the header: drawn again */
        bl->iparams[SL_DROPOUT_IP_STREAM_LO]++;
        bd->iparams[SL_DROPOUT_IP_STREAM_LO]++;
        TU_CHECK(sl_k_dropout(bl) == SL_OK && sl_k_dropout(bd) == SL_OK &&
                     !memcmp(pbl, pbd, sizeof(float) * (size_t)N),
                 "%s: a stale header's bits were read", what);
        /* dropout off (evaluation): res + x, and the header cleared, so the backward draws */
        bl->iparams[SL_DROPOUT_IP_STREAM_LO]--;
        bd->iparams[SL_DROPOUT_IP_STREAM_LO]--;
        y->iparams[SL_DROPOUT_IP_ON] = 0;
        TU_CHECK(sl_k_dropout(y) == SL_OK, "off");
        bad = 0;
        for (int64_t i = 0; i < N; i++) bad += py[i] != pr[i] + px[i];
        TU_CHECK(bad == 0, "%s, off: %lld elements are not res + x", what, (long long)bad);
        TU_CHECK(sl_k_dropout(bl) == SL_OK && sl_k_dropout(bd) == SL_OK &&
                     !memcmp(pbl, pbd, sizeof(float) * (size_t)N),
                 "%s: the bits of a run with dropout off were read", what);
        free(py), free(pd), free(ps), free(pbl), free(pbd), free(px), free(pr), free(pg);
        sl_ctx_free(ctx);
    }
    omp_set_num_threads(2);
}

/* keep fraction of n = 2^20 ones: 6 sigma of Binomial(n, 1 - p) / n; per lane (e % 4) with n / 4 */
static void test_statistics(void) {
    const int64_t N = 1 << 20;
    const float p = 0.2f;
    sl_ctx *ctx = sl_ctx_new(64);
    sl_tensor *x = sl_new_tensor_1d(ctx, SL_F32, N);
    float *ones = malloc(sizeof(float) * (size_t)N);
    for (int64_t i = 0; i < N; i++) ones[i] = 1.0f;
    sl_tensor_bind(x, ones);
    sl_tensor *y = on(sl_dropout(ctx, x, p, 1), 2026, 11);
    sl_graph *g = sl_graph_new(ctx);
    sl_graph_build_forward(g, y);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute");
    const float *o = y->data, keep = (float)(1.0 / (1.0 - (double)p));
    int64_t kept = 0, lane[4] = {0}, other = 0;
    double sum = 0;
    for (int64_t i = 0; i < N; i++) {
        if (o[i] == keep) {
            kept++;
            lane[i % 4]++;
        } else if (o[i] != 0.0f) {
            other++;
        }
        sum += o[i];
    }
    TU_CHECK(other == 0, "%lld values are neither 0 nor 1/(1-p)", (long long)other);
    double q = 1.0 - p, sd = sqrt(p * q / (double)N), f = (double)kept / (double)N;
    printf("kept %.6f (expected %.4f, 6 sd %.2e)\n", f, q, 6 * sd);
    TU_CHECK(fabs(f - q) <= 6 * sd, "kept fraction %.6f, expected %.4f +- %.2e", f, q, 6 * sd);
    for (int l = 0; l < 4; l++) {
        double fl = (double)lane[l] / (double)(N / 4), sdl = sqrt(p * q / (double)(N / 4));
        TU_CHECK(fabs(fl - q) <= 6 * sdl, "lane %d kept %.6f, expected %.4f +- %.2e", l, fl, q, 6 * sdl);
    }
    /* the mean of the output is kept / N / q = 1 in expectation; its sd is sd / q */
    double mean = sum / (double)N;
    TU_CHECK(fabs(mean - 1.0) <= 6 * sd / q, "mean %.6f, expected 1 +- %.2e", mean, 6 * sd / q);
    /* a second stream is a different mask (agreement ~ p^2 + q^2 = 0.68 of the elements, not 1) */
    on(y, 2026, 12);
    float *first = malloc(sizeof(float) * (size_t)N);
    memcpy(first, o, sizeof(float) * (size_t)N);
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute");
    int64_t same = 0;
    for (int64_t i = 0; i < N; i++) same += (first[i] == 0) == (o[i] == 0);
    double fs = (double)same / (double)N, es = p * p + q * q;
    TU_CHECK(fabs(fs - es) <= 6 * sqrt(es * (1 - es) / (double)N), "streams agree on %.4f (expected %.4f)",
             fs, es);
    free(first);
    sl_graph_free(g);
    free(ones);
    sl_ctx_free(ctx);
}

/* E over masks of attention-with-dropout = attention without it, per output element */
static void test_attention_mean(void) {
    const int S = 400;
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *q = param(&t, 4, (int64_t[]){1, 40, 2, 8}, 1), *k = param(&t, 4, (int64_t[]){1, 40, 2, 8}, 1),
              *v = param(&t, 4, (int64_t[]){1, 40, 2, 8}, 1);
    sl_tensor *a0 = sl_attention(t.ctx, q, k, v),
              *a1 = sl_attention_dropout(sl_attention(t.ctx, q, k, v), 0.3f, 2);
    float *ref = fwd(&t, a0);
    int64_t n = sl_nelements(a1);
    sl_graph *g = sl_graph_new(t.ctx);
    sl_graph_build_forward(g, a1);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
    double *s1 = calloc((size_t)n, sizeof(double)), *s2 = calloc((size_t)n, sizeof(double));
    for (int s = 0; s < S; s++) {
        TU_CHECK(sl_graph_set_dropout(g, 1, 31, (uint64_t)s) == 1, "one dropout node");
        TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute");
        const float *o = a1->data;
        for (int64_t i = 0; i < n; i++) s1[i] += o[i], s2[i] += (double)o[i] * o[i];
    }
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double m = s1[i] / S, var = s2[i] / S - m * m, se = sqrt(var > 0 ? var / S : 0) + 1e-7;
        double z = fabs(m - ref[i]) / se;
        if (z > worst) worst = z;
    }
    printf("attention dropout mean: worst |mean - no-dropout| / standard error %.2f over %lld elements\n",
           worst, (long long)n);
    TU_CHECK(worst < 6, "attention with dropout is biased: z = %.2f", worst);
    free(s1), free(s2), free(ref);
    sl_graph_free(g);
    tc_free(&t);
}

/* forward + backward values of a small graph (dropout, attention dropout) on `threads` threads */
static float *run_threads(int threads, int64_t *n_out) {
    omp_set_num_threads(threads);
    tc t = {0};
    t.ctx = sl_ctx_new(512);
    sl_tensor *q = param(&t, 4, (int64_t[]){3, 70, 4, 16}, 1),
              *k = param(&t, 4, (int64_t[]){3, 70, 2, 16}, 1),
              *v = param(&t, 4, (int64_t[]){3, 70, 2, 16}, 1);
    sl_tensor *a = sl_attention_dropout(sl_attention(t.ctx, q, k, v), 0.2f, 1);
    sl_tensor *y = sl_dropout(t.ctx, sl_gelu(t.ctx, a), 0.2f, 2);
    sl_tensor *loss = sl_sum_to(t.ctx, sl_mul(t.ctx, y, y), sl_new_tensor_1d(t.ctx, SL_F32, 1));
    sl_graph *g = sl_graph_new(t.ctx);
    sl_graph_build_forward(g, loss);
    sl_graph_build_backward(g, loss, 1.0f);
    TU_CHECK(sl_graph_plan(g, sl_backend_cpu(), NULL) == SL_OK, "plan");
    TU_CHECK(sl_graph_set_dropout(g, 1, 8, 3) == 3, "dropout nodes: attention, DROPOUT and its backward");
    int64_t n = 0;
    for (int i = 0; i < t.np;
         i++) { /* the same inputs on every call (param() draws a new stream each time) */
        sl_rng_fill_normal(t.pdata[i], sl_nelements(t.params[i]), 41, (uint64_t)i, 0.0f, 1.0f);
        n += sl_nelements(t.params[i]);
    }
    TU_CHECK(sl_graph_compute(g, NULL, NULL) == SL_OK, "compute");
    float *out = malloc(sizeof(float) * (size_t)(n + 1)), *w = out;
    for (int i = 0; i < t.np; i++) {
        memcpy(w, t.gdata[i], sizeof(float) * (size_t)sl_nelements(t.params[i]));
        w += sl_nelements(t.params[i]);
    }
    *w = ((float *)loss->data)[0];
    *n_out = n + 1;
    sl_graph_free(g);
    tc_free(&t);
    return out;
}

static void test_threads(void) {
    int64_t n1, n2;
    float *a = run_threads(1, &n1), *b = run_threads(2, &n2);
    TU_CHECK(n1 == n2 && memcmp(a, b, sizeof(float) * (size_t)n1) == 0, "1 and 2 threads differ");
    free(a), free(b);
    omp_set_num_threads(2);
}

/* p = 0 and dropout off: bitwise the values without dropout */
static void test_identity(void) {
    tc t = {0};
    t.ctx = sl_ctx_new(256);
    sl_tensor *x = param(&t, 2, (int64_t[]){5, 301}, 1.0f);
    float *y0 = fwd(&t, on(sl_dropout(t.ctx, x, 0.0f, 1), 3, 3)),
          *y1 = fwd(&t, sl_dropout(t.ctx, x, 0.6f, 1));
    TU_CHECK(!memcmp(y0, t.pdata[0], sizeof(float) * 5 * 301), "p = 0 is not the identity");
    TU_CHECK(!memcmp(y1, t.pdata[0], sizeof(float) * 5 * 301), "dropout off is not the identity");
    sl_tensor *q = param(&t, 4, (int64_t[]){2, 9, 2, 4}, 1), *k = param(&t, 4, (int64_t[]){2, 9, 2, 4}, 1),
              *v = param(&t, 4, (int64_t[]){2, 9, 2, 4}, 1);
    float *r = fwd(&t, sl_attention(t.ctx, q, k, v));
    float *a0 = fwd(&t, on(sl_attention_dropout(sl_attention(t.ctx, q, k, v), 0.0f, 1), 1, 1));
    float *a1 = fwd(&t, sl_attention_dropout(sl_attention(t.ctx, q, k, v), 0.5f, 1));
    TU_CHECK(!memcmp(a0, r, sizeof(float) * 2 * 9 * 8), "attention with p = 0 differs");
    TU_CHECK(!memcmp(a1, r, sizeof(float) * 2 * 9 * 8), "attention with dropout off differs");
    free(y0), free(y1), free(r), free(a0), free(a1);
    tc_free(&t);
}

static sl_status batch(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    (void)u;
    tu_synth_tokens(4, 16, 64, step, micro, ids, tg);
    return SL_OK;
}

/* a GPT-2 (llama = 0) or a GQA Llama (1) with p = 0.5 against the same weights with p = 0: evaluation
 * bitwise equal, training not; the dropout nodes are where sl_model_dropout_site says */
static void test_model_eval(int llama) {
    sl_gpt2_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 64, .max_seq_len = 16};
    sl_llama_config lc = {.arch = SL_ARCH_LLAMA,
                          .n_layer = 2,
                          .n_head = 4,
                          .n_kv_head = 2,
                          .hidden = 32,
                          .intermediate = 48,
                          .vocab_size = 64,
                          .max_seq_len = 16,
                          .rms_eps = 1e-5f,
                          .rope_theta = 10000.0f,
                          .head_dim = 8};
    float ev[2], tl[2], gn[2], *gr[2];
    int64_t n_grad = 0;
    for (int d = 0; d < 2; d++) {
        sl_model *m;
        TU_CHECK((llama ? sl_llama_new(&lc, &m) : sl_gpt2_new(&cfg, &m)) == SL_OK, "model: %s", sl_errmsg());
        sl_model_init_weights(m, 5);
        m->attention_dropout = m->hidden_dropout = d ? 0.5f : 0.0f;
        sl_trainer tr;
        sl_trainer_config tc = {
            .B = 4, .T = 16, .accum = 1, .lr = 1e-3f, .decay_iters = 10, .dropout_seed = 9};
        TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer: %s", sl_errmsg());
        /* forward: embedding + 3 per layer; backward: the hidden ones again (attention's is in
         * ATTENTION_BACK) */
        int nd = sl_graph_set_dropout(tr.graph, 0, 0, 0);
        TU_CHECK(nd == (d ? 2 * (1 + 2 * 2) + 2 : 0), "%s: %d dropout nodes", llama ? "llama" : "gpt2", nd);
        TU_CHECK(sl_trainer_eval(&tr, batch, NULL, 2, &ev[d]) == SL_OK, "eval: %s", sl_errmsg());
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, 0, batch, NULL, &ss) == SL_OK, "step: %s", sl_errmsg());
        tl[d] = ss.loss;
        gn[d] = ss.grad_norm;
        gr[d] = malloc(sizeof(float) * (size_t)m->numel);
        memcpy(gr[d], m->grads_mem, sizeof(float) * (size_t)m->numel);
        n_grad = m->numel;
        /* the KV-cache generation graph of the same model carries no dropout */
        if (!llama) {
            sl_kv_cache kv;
            TU_CHECK(sl_kv_cache_new(m, 1, 16, &kv) == SL_OK, "kv: %s", sl_errmsg());
            sl_tensor *ids = sl_new_tensor_2d(m->ctx, SL_I32, 1, 4);
            sl_graph *g = sl_graph_new(m->ctx);
            sl_graph_build_forward(g, sl_gpt2_build_kv(m, ids, &kv, 0));
            TU_CHECK(sl_graph_set_dropout(g, 1, 1, 1) == 0, "the generation graph has dropout nodes");
            sl_graph_free(g);
            sl_kv_cache_free(&kv);
        }
        sl_trainer_free(&tr);
        sl_model_free(m);
    }
    printf("eval %.7f / %.7f (p = 0 / 0.5); train loss %.7f / %.7f, grad norm %.5f / %.5f\n", ev[0], ev[1],
           tl[0], tl[1], gn[0], gn[1]);
    TU_CHECK(!memcmp(&ev[0], &ev[1], sizeof(float)), "evaluation with dropout differs: %.9g vs %.9g", ev[0],
             ev[1]);
    /* at initialisation the loss is ~log V either way; the gradient shows the dropped units */
    double gd = tu_rel_maxdiff(gr[1], gr[0], n_grad);
    printf("gradients with p = 0.5: max|d|/max|p=0| %.3f\n", gd);
    TU_CHECK(tl[0] != tl[1] && gd > 0.3, "training with p = 0.5 looks like p = 0 (%.3g)", gd);
    free(gr[0]), free(gr[1]);
}

int main(void) {
    omp_set_num_threads(2);
    test_rule();
    grad_check("dropout", b_dropout);
    grad_check("dropout_add", b_dropout_add);
    test_dropout_add_bits();
    grad_check("attention_dropout", b_attention_dropout);
    grad_check("attention_window_dropout", b_attention_window_dropout);
    test_statistics();
    test_attention_mean();
    test_threads();
    test_identity();
    test_model_eval(0);
    test_model_eval(1);
    return tu_finish("test_dropout");
}
