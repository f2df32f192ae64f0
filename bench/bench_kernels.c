/* suanli bench kernels — SIMD non-GEMM kernels vs their scalar references (see bench_kernels.h). */
#include "bench_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/flags.h"
#include "device/cpu/kernels/kernels.h"
#include "device/cpu/kernels/simd_math.h"
#include "suanli/graph.h"
#include "suanli/nn.h"
#include "suanli/optim.h"

typedef sl_status (*kfn)(sl_tensor *);

typedef struct {
    int json, first;
    int64_t reps;
    const char *only; /* --only: rows whose name starts with it (NULL: all) */
} bk_ctx;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *rnd(int64_t n, uint64_t stream, float scale) {
    float *p = sl_malloc_aligned(sizeof(float) * (size_t)(n ? n : 1));
    if (p) sl_rng_fill_normal(p, n, 5, stream, 0.0f, scale);
    return p;
}

static sl_tensor *leaf(sl_ctx *ctx, int ndim, const int64_t *ne, uint64_t stream, float scale) {
    sl_tensor *t = sl_new_tensor(ctx, SL_F32, ndim, ne);
    sl_tensor_bind(t, rnd(sl_nelements(t), stream, scale));
    return t;
}

static void report(bk_ctx *c, const char *name, const char *shape, double tr, double tf, double bytes,
                   double flops) {
    double gbs = bytes > 0 ? bytes / tf * 1e-9 : 0, gfl = flops > 0 ? flops / tf * 1e-9 : 0;
    if (c->json) {
        printf("%s{\"kernel\": \"%s\", \"shape\": \"%s\", \"ref_ms\": %.4f, \"simd_ms\": %.4f, \"speedup\": "
               "%.2f, "
               "\"simd_gbs\": %.2f, \"simd_gflops\": %.2f}",
               c->first ? "" : ",\n", name, shape, tr * 1e3, tf * 1e3, tr / tf, gbs, gfl);
        c->first = 0;
    } else {
        printf("%-20s %-24s %10.3f %10.3f %8.2fx", name, shape, tr * 1e3, tf * 1e3, tr / tf);
        if (bytes > 0) printf(" %8.1f GB/s", gbs);
        if (flops > 0) printf(" %8.1f GFLOP/s", gfl);
        printf("\n");
    }
    fflush(stdout);
}

/* Times ref and fast alternately (after one warm-up each); `init` (may be NULL) restores in-place outputs. */
static void bench_pair(bk_ctx *c, const char *name, const char *shape, sl_tensor *n, kfn fast, kfn ref,
                       double bytes, double flops, const float *init, int64_t init_n) {
    size_t sz = sl_nbytes(n) + n->aux_bytes;
    void *buf = sl_malloc_aligned(sz + 64);
    n->data = buf;
    if (n->view_src) n->view_src->data = buf;                 /* in-place ops (acc) */
    if (c->only && strncmp(name, c->only, strlen(c->only))) { /* not timed: run once for the nodes after it */
        if (init) memcpy(buf, init, sizeof(float) * (size_t)init_n);
        if (fast(n) != SL_OK) fprintf(stderr, "bench kernels: %s: %s\n", name, sl_errmsg());
        return;
    }
    double *tr = malloc(sizeof(double) * (size_t)c->reps), *tf = malloc(sizeof(double) * (size_t)c->reps);
    for (int64_t r = -1; r < c->reps; r++)
        for (int k = 0; k < 2; k++) {
            if (init) memcpy(buf, init, sizeof(float) * (size_t)init_n);
            double t0 = sl_time_sec();
            sl_status st = (k ? fast : ref)(n);
            double dt = sl_time_sec() - t0;
            if (st != SL_OK) fprintf(stderr, "bench kernels: %s: %s\n", name, sl_errmsg());
            if (r >= 0) (k ? tf : tr)[r] = dt;
        }
    qsort(tr, (size_t)c->reps, sizeof(double), cmp_d);
    qsort(tf, (size_t)c->reps, sizeof(double), cmp_d);
    report(c, name, shape, tr[c->reps / 2], tf[c->reps / 2], bytes, flops);
    free(tr);
    free(tf);
    /* keep the output alive for backward nodes built on n: they read n->data */
}

/* AdamW: the library's step (threaded, SIMD) vs the plain scalar loop over the same buffers */
static void bench_adamw(bk_ctx *c, int64_t numel) {
    enum { NP = 4 };
    sl_param_info pi[NP];
    for (int i = 0; i < NP; i++)
        pi[i] = (sl_param_info){.offset = numel / NP * i, .numel = numel / NP, .decay = i % 2};
    sl_model m = {.params = pi, .n_params = NP, .numel = numel / NP * NP, .backend = sl_backend_cpu()};
    m.params_mem = rnd(m.numel, 1, 1.0f);
    m.grads_mem = rnd(m.numel, 2, 1.0f);
    static sl_tensor f32_leaf = {.dtype = SL_F32}; /* the spans' dtype */
    for (int i = 0; i < NP; i++) pi[i].t = &f32_leaf;
    sl_adamw o;
    size_t bytes = sizeof(float) * (size_t)m.numel;
    if (!m.params_mem || !m.grads_mem ||
        sl_backend_wrap_host(m.backend, m.params_mem, bytes, &m.params_buf) ||
        sl_backend_wrap_host(m.backend, m.grads_mem, bytes, &m.grads_buf) ||
        sl_adamw_init(&o, &m, (sl_adamw_hparams){0.9f, 0.95f, 1e-8f, 0.1f}) != SL_OK) {
        fprintf(stderr, "bench kernels: adamw: out of memory\n");
        sl_free_aligned(m.params_mem);
        sl_free_aligned(m.grads_mem);
        return;
    }
    double *tr = malloc(sizeof(double) * (size_t)c->reps), *tf = malloc(sizeof(double) * (size_t)c->reps);
    for (int64_t r = -1; r < c->reps; r++) {
        double t0 = sl_time_sec();
        /* scalar reference: the formula of Note [AdamW order of operations], serial */
        float lr = 1e-4f, b1 = 0.9f, b2 = 0.95f, ss = lr / 0.1f, bs = 0.2f;
        for (int i = 0; i < NP; i++) {
            float decay = pi[i].decay ? 1.0f - lr * 0.1f : 1.0f;
            float *p = m.params_mem + pi[i].offset, *g = m.grads_mem + pi[i].offset;
            float *mm = (float *)sl_buffer_map(o.m) + pi[i].offset,
                  *vv = (float *)sl_buffer_map(o.v) + pi[i].offset;
            for (int64_t k = 0; k < pi[i].numel; k++) {
                float gk = g[k];
                p[k] *= decay;
                mm[k] += (1.0f - b1) * (gk - mm[k]);
                vv[k] = vv[k] * b2 + (1.0f - b2) * gk * gk;
                p[k] += -ss * (mm[k] / (sqrtf(vv[k]) / bs + 1e-8f));
            }
        }
        double t1 = sl_time_sec();
        (void)sl_adamw_step(&o, &m, lr);
        double t2 = sl_time_sec();
        if (r >= 0) {
            tr[r] = t1 - t0;
            tf[r] = t2 - t1;
        }
    }
    qsort(tr, (size_t)c->reps, sizeof(double), cmp_d);
    qsort(tf, (size_t)c->reps, sizeof(double), cmp_d);
    char shape[64];
    snprintf(shape, sizeof shape, "%lld params", (long long)m.numel);
    report(c, "adamw", shape, tr[c->reps / 2], tf[c->reps / 2], 28.0 * (double)m.numel, 0);
    free(tr);
    free(tf);
    sl_adamw_free(&o);
    sl_backend_free(m.backend, m.params_buf);
    sl_backend_free(m.backend, m.grads_buf);
    sl_free_aligned(m.params_mem);
    sl_free_aligned(m.grads_mem);
}

int sl_bench_kernels(int argc, char **argv) {
    int64_t threads = 2, reps = 5, B = 4, T = 64, C = 768, NH = 12, V = 50257;
    int json = 0;
    const char *only = NULL;
    sl_flag flags[] = {
        {"threads", SL_FLAG_INT, &threads, 1, 1024, "(2)", 0},
        {"reps", SL_FLAG_INT, &reps, 1, 1000, "median of R timed runs (5)", 0},
        {"micro-batch-size", SL_FLAG_INT, &B, 1, 4096, "(4)", 0},
        {"seq-length", SL_FLAG_INT, &T, 1, 1 << 16, "(64)", 0},
        {"hidden-size", SL_FLAG_INT, &C, 1, 65536, "(768)", 0},
        {"num-attention-heads", SL_FLAG_INT, &NH, 1, 1024, "(12)", 0},
        {"vocab-size", SL_FLAG_INT, &V, 2, 1 << 24, "(50257)", 0},
        {"json", SL_FLAG_BOOL, &json, 0, 1, "machine-readable output", 0},
        {"only", SL_FLAG_STR, &only, 0, 0, "only the kernels whose name starts with S (e.g. attention)", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    if (sl_flags_help(flags, nf, argc, argv, "usage: suanli bench kernels [flags]")) return 0;
    if (sl_flags_parse(flags, nf, argc, argv, 1) != SL_OK) {
        fprintf(stderr, "suanli bench kernels: %s\n", sl_errmsg());
        return 2;
    }
    if (C % NH) {
        fprintf(stderr, "suanli bench kernels: --hidden-size must be a multiple of --num-attention-heads\n");
        return 2;
    }
    static const char *const names[] = {"add (residual)",
                                        "acc",
                                        "add (bias)",
                                        "sum_to (bias grad)",
                                        "gelu",
                                        "gelu_back",
                                        "layernorm",
                                        "layernorm_back_x",
                                        "layernorm_back_wb",
                                        "cross_entropy",
                                        "cross_entropy_back",
                                        "embedding_back",
                                        "attention",
                                        "attention_back",
                                        "attention bf16 eager",
                                        "attention_back bf16",
                                        "adamw"};
    int matched = !only;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !matched; i++)
        matched = !strncmp(names[i], only, strlen(only));
    if (!matched) {
        fprintf(stderr, "suanli bench kernels: --only '%s' matches no kernel (e.g. gelu, attention, adamw)\n",
                only);
        return 2;
    }
    sl_threads_set((int)threads);
    bk_ctx c = {json, 1, reps, only};
    int64_t BT = B * T, hs = C / NH;
    const char *isa = sl_kern_isa_name(sl_kern_isa());
    if (json)
        printf("{\"bench\": \"kernels\", \"isa\": \"%s\", \"threads\": %lld, \"B\": %lld, \"T\": %lld, "
               "\"C\": %lld, "
               "\"V\": %lld, \"results\": [\n",
               isa, (long long)threads, (long long)B, (long long)T, (long long)C, (long long)V);
    else
        printf("suanli bench kernels: isa %s, %lld threads, B=%lld T=%lld C=%lld NH=%lld V=%lld, median of "
               "%lld\n"
               "%-20s %-24s %10s %10s %9s\n",
               isa, (long long)threads, (long long)B, (long long)T, (long long)C, (long long)NH, (long long)V,
               (long long)reps, "kernel", "shape", "ref ms", "simd ms", "speedup");
    sl_ctx *ctx = sl_ctx_new(256);
    char shape[64];
    double f4 = 4.0;
    /* residual add (BT, C) + (BT, C); bias add (BT, 3C) + (3C); acc; sum_to (BT, 4C) -> (4C) */
    sl_tensor *x = leaf(ctx, 2, (int64_t[]){BT, C}, 1, 1.0f), *y = leaf(ctx, 2, (int64_t[]){BT, C}, 2, 1.0f);
    sl_tensor *h = leaf(ctx, 2, (int64_t[]){BT, 4 * C}, 3, 1.0f),
              *hg = leaf(ctx, 2, (int64_t[]){BT, 4 * C}, 4, 1.0f);
    sl_tensor *b3 = leaf(ctx, 1, (int64_t[]){3 * C}, 5, 1.0f),
              *q3 = leaf(ctx, 2, (int64_t[]){BT, 3 * C}, 6, 1.0f);
    sl_tensor *w = leaf(ctx, 1, (int64_t[]){C}, 7, 1.0f), *bb = leaf(ctx, 1, (int64_t[]){C}, 8, 1.0f);
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)BT, (long long)C);
    bench_pair(&c, "add (residual)", shape, sl_add(ctx, x, y), sl_k_add, sl_k_add_ref, 3 * f4 * BT * C, 0,
               NULL, 0);
    sl_tensor *dst = sl_new_tensor(ctx, SL_F32, 2, (int64_t[]){BT, C});
    sl_tensor *acc = sl_acc(ctx, dst, x);
    bench_pair(&c, "acc", shape, acc, sl_k_acc, sl_k_acc_ref, 3 * f4 * BT * C, 0, NULL, 0);
    snprintf(shape, sizeof shape, "%lldx%lld + %lld", (long long)BT, (long long)(3 * C), (long long)(3 * C));
    bench_pair(&c, "add (bias)", shape, sl_bias(ctx, q3, b3), sl_k_add, sl_k_add_ref, 2 * f4 * BT * 3 * C, 0,
               NULL, 0);
    snprintf(shape, sizeof shape, "%lldx%lld -> %lld", (long long)BT, (long long)(4 * C), (long long)(4 * C));
    bench_pair(&c, "sum_to (bias grad)", shape, sl_sum_to(ctx, h, sl_new_tensor_1d(ctx, SL_F32, 4 * C)),
               sl_k_sum_to, sl_k_sum_to_ref, f4 * BT * 4 * C, 0, NULL, 0);
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)BT, (long long)(4 * C));
    bench_pair(&c, "gelu", shape, sl_gelu(ctx, h), sl_k_gelu, sl_k_gelu_ref, 2 * f4 * BT * 4 * C, 0, NULL, 0);
    sl_tensor *gb = sl_new_op(ctx, SL_OP_GELU_BACK, SL_F32, 2, h->ne);
    gb->src[0] = h;
    gb->src[1] = hg;
    bench_pair(&c, "gelu_back", shape, gb, sl_k_gelu_back, sl_k_gelu_back_ref, 3 * f4 * BT * 4 * C, 0, NULL,
               0);
    /* layernorm */
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)BT, (long long)C);
    sl_tensor *ln = sl_layernorm(ctx, x, w, bb, 1e-5f);
    bench_pair(&c, "layernorm", shape, ln, sl_k_layernorm, sl_k_layernorm_ref, 2 * f4 * BT * C, 0, NULL, 0);
    sl_tensor *lx = sl_new_op(ctx, SL_OP_LAYERNORM_BACK_X, SL_F32, 2, x->ne);
    lx->src[0] = ln, lx->src[1] = x, lx->src[2] = w, lx->src[3] = y;
    bench_pair(&c, "layernorm_back_x", shape, lx, sl_k_layernorm_back_x, sl_k_layernorm_back_x_ref,
               3 * f4 * BT * C, 0, NULL, 0);
    sl_tensor *lw = sl_new_op(ctx, SL_OP_LAYERNORM_BACK_WB, SL_F32, 2, (int64_t[]){2, C});
    lw->src[0] = ln, lw->src[1] = x, lw->src[2] = y;
    bench_pair(&c, "layernorm_back_wb", shape, lw, sl_k_layernorm_back_wb, sl_k_layernorm_back_wb_ref,
               2 * f4 * BT * C, 0, NULL, 0);
    /* cross-entropy over (BT, V) */
    sl_tensor *lg = leaf(ctx, 2, (int64_t[]){BT, V}, 9, 2.0f);
    sl_tensor *tg = sl_new_tensor(ctx, SL_I32, 1, (int64_t[]){BT});
    int32_t *tid = malloc(sizeof(int32_t) * (size_t)BT);
    for (int64_t i = 0; i < BT; i++) tid[i] = (int32_t)(sl_rng_u64(5, 10, (uint64_t)i) % (uint64_t)V);
    sl_tensor_bind(tg, tid);
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)BT, (long long)V);
    sl_tensor *ce = sl_cross_entropy(ctx, lg, tg);
    bench_pair(&c, "cross_entropy", shape, ce, sl_k_cross_entropy, sl_k_cross_entropy_ref, f4 * BT * V, 0,
               NULL, 0);
    float dl1 = 1.0f;
    sl_tensor *dl = sl_new_tensor(ctx, SL_F32, 1, (int64_t[]){1});
    sl_tensor_bind(dl, &dl1);
    sl_tensor *cb = sl_new_op(ctx, SL_OP_CROSS_ENTROPY_BACK, SL_F32, 2, lg->ne);
    cb->src[0] = ce, cb->src[1] = lg, cb->src[2] = tg, cb->src[3] = dl;
    bench_pair(&c, "cross_entropy_back", shape, cb, sl_k_cross_entropy_back, sl_k_cross_entropy_back_ref,
               2 * f4 * BT * V, 0, NULL, 0);
    /* embedding backward into a zeroed (V, C) gradient */
    sl_tensor *eb = sl_new_op(ctx, SL_OP_EMBEDDING_BACK, SL_F32, 2, (int64_t[]){V, C});
    eb->src[1] = tg, eb->src[2] = x;
    float *zero = calloc((size_t)(V * C), sizeof(float));
    snprintf(shape, sizeof shape, "%lld ids x %lld", (long long)BT, (long long)C);
    bench_pair(&c, "embedding_back", shape, eb, sl_k_embedding_back, sl_k_embedding_back_ref, 3 * f4 * BT * C,
               0, zero, V * C);
    free(zero);
    /* attention: q, k, v are views of the fused (B, T, 3C) projection */
    sl_tensor *qkv = leaf(ctx, 4, (int64_t[]){B, T, 3 * NH, hs}, 11, 1.0f);
    sl_tensor *qv = sl_slice(ctx, qkv, 2, 0, NH), *kv = sl_slice(ctx, qkv, 2, NH, NH),
              *vv = sl_slice(ctx, qkv, 2, 2 * NH, NH);
    qv->data = qkv->data;
    kv->data = (float *)qkv->data + NH * hs;
    vv->data = (float *)qkv->data + 2 * NH * hs;
    sl_tensor *at = sl_attention(ctx, qv, kv, vv);
    double causal = (double)B * NH * hs * (double)T * (T + 1) / 2.0;
    snprintf(shape, sizeof shape, "B%lld T%lld NH%lld hs%lld", (long long)B, (long long)T, (long long)NH,
             (long long)hs);
    bench_pair(&c, "attention", shape, at, sl_k_attention, sl_k_attention_ref, 0, 4.0 * causal, NULL, 0);
    sl_tensor *ag = leaf(ctx, 3, at->ne, 12, 1.0f);
    sl_tensor *ab = sl_new_op(ctx, SL_OP_ATTENTION_BACK, SL_F32, 4, (int64_t[]){B, T, 3 * NH, hs});
    ab->src[0] = at, ab->src[1] = qv, ab->src[2] = kv, ab->src[3] = vv, ab->src[4] = ag;
    bench_pair(&c, "attention_back", shape, ab, sl_k_attention_back, sl_k_attention_back_ref, 0, 8.0 * causal,
               NULL, 0);
    /* GPT-2 under --bf16: the eager-half numerics (Note [Eager half attention numerics]); same inputs */
    sl_tensor *ah = sl_attention(ctx, qv, kv, vv);
    ah->iparams[2] = 1;
    bench_pair(&c, "attention bf16 eager", shape, ah, sl_k_attention, sl_k_attention_ref, 0, 4.0 * causal,
               NULL, 0);
    sl_tensor *abh = sl_new_op(ctx, SL_OP_ATTENTION_BACK, SL_F32, 4, (int64_t[]){B, T, 3 * NH, hs});
    abh->src[0] = ah, abh->src[1] = qv, abh->src[2] = kv, abh->src[3] = vv, abh->src[4] = ag;
    bench_pair(&c, "attention_back bf16", shape, abh, sl_k_attention_back, sl_k_attention_back_ref, 0,
               8.0 * causal, NULL, 0);
    if (!only || !strncmp("adamw", only, strlen(only))) bench_adamw(&c, 16 << 20);
    if (json) printf("\n]}\n");
    /* free every buffer allocated above: leaves' random data (not views, not the acc alias, not dl) and
     * the outputs allocated by bench_pair */
    for (int i = 0; i < sl_ctx_count(ctx); i++) {
        sl_tensor *t = sl_ctx_tensor(ctx, i);
        if (!t->data || t->op == SL_OP_VIEW || t == dl || t == dst || t->dtype != SL_F32) continue;
        sl_free_aligned(t->data);
    }
    free(tid);
    sl_ctx_free(ctx);
    return 0;
}
