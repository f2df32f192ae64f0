/* Shared access to the parity fixtures written by scripts/gen_gpt2_parity.py and scripts/gen_llama_parity.py
 * (PyTorch / transformers reference runs saved as safetensors with metadata), and the checks every model's
 * training parity test makes: one forward/backward (loss, logits, every gradient) and ten AdamW steps with
 * accumulation, clipping and the LR schedule (losses, grad norms, LRs, final weights). */
#ifndef SL_TESTS_PARITY_FIXTURE_H
#define SL_TESTS_PARITY_FIXTURE_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/safetensors.h"
#include "suanli/train.h"
#include "testutil.h"

static const sl_safetensors *g_st;
static inline int meta_i(const char *k) { return atoi(sl_safetensors_meta(g_st, k)); }
static inline float meta_f(const char *k) { return (float)atof(sl_safetensors_meta(g_st, k)); }

static inline const sl_st_tensor *need(const char *name) {
    const sl_st_tensor *t = sl_safetensors_find(g_st, name);
    if (!t) {
        fprintf(stderr, "fixture lacks %s\n", name);
        exit(1);
    }
    return t;
}

/* copy PREFIX<param name> tensors into the model's parameters */
static inline void load_params(sl_model *m, const char *prefix) {
    for (int i = 0; i < m->n_params; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s%s", prefix, m->params[i].t->name);
        const sl_st_tensor *t = need(nm);
        TU_CHECK(t->nbytes == sizeof(float) * (size_t)m->params[i].numel, "%s size", nm);
        memcpy(m->params_mem + m->params[i].offset, t->data, t->nbytes);
    }
}

/* micro-batches from a (steps, accum, B, T+1) token tensor */
/* the fixture's tiny GPT-2 or Llama (meta n_layer, n_head, ...) with its param.* weights (the bf16 and fp16
 * parity tests) */
static inline sl_model *parity_tiny_model(int llama) {
    sl_model *m = NULL;
    if (llama) {
        sl_llama_config cfg = {.arch = SL_ARCH_LLAMA,
                               .n_layer = meta_i("n_layer"),
                               .n_head = meta_i("n_head"),
                               .n_kv_head = meta_i("n_kv_head"),
                               .hidden = meta_i("n_embd"),
                               .intermediate = meta_i("intermediate"),
                               .vocab_size = meta_i("vocab_size"),
                               .max_seq_len = meta_i("seq_len"),
                               .rms_eps = 1e-5f,
                               .rope_theta = 10000.0f};
        cfg.head_dim = cfg.hidden / cfg.n_head;
        TU_CHECK(sl_llama_new(&cfg, &m) == SL_OK, "llama: %s", sl_errmsg());
    } else {
        sl_gpt2_config cfg = {meta_i("n_layer"), meta_i("n_head"), meta_i("n_embd"), meta_i("vocab_size"),
                              meta_i("seq_len")};
        TU_CHECK(sl_gpt2_new(&cfg, &m) == SL_OK, "gpt2: %s", sl_errmsg());
    }
    if (m) load_params(m, "param.");
    return m;
}

typedef struct {
    const int32_t *tok;
    int B, T, accum;
} feed;

static inline sl_status feed_fn(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    feed *f = u;
    const int32_t *base = f->tok + ((step * f->accum + micro) * f->B) * (int64_t)(f->T + 1);
    for (int b = 0; b < f->B; b++)
        for (int t = 0; t < f->T; t++) {
            ids[b * f->T + t] = base[b * (f->T + 1) + t];
            tg[b * f->T + t] = base[b * (f->T + 1) + t + 1];
        }
    return SL_OK;
}

/* the fixture's optimizer settings (lr, min_lr, clip, AdamW hyper-parameters) for `steps` steps */
static inline sl_trainer_config parity_train_config(int B, int T, int accum, int64_t steps, int64_t warmup) {
    return (sl_trainer_config){
        .B = B,
        .T = T,
        .accum = accum,
        .lr = meta_f("lr"),
        .min_lr = meta_f("min_lr"),
        .clip = meta_f("clip"),
        .warmup = warmup,
        .decay_iters = steps,
        .hp = {meta_f("beta1"), meta_f("beta2"), meta_f("eps"), meta_f("weight_decay")}};
}

/* max|d|/max|ref| of parameter i's final weights; a test may override it for one tensor (NULL: plain) */
typedef double (*parity_final_fn)(const sl_model *m, int i, const float *got, const float *ref);

/* 1. one forward/backward on `tokens`: loss and logits (<= 1e-5 relative), every gradient (<= 1e-4);
 * 2. `steps` AdamW steps on `train_tokens` (accumulation, clipping, warmup + cosine): each step's loss
 *    (<= 1e-5), grad norm (1e-4) and LR (1e-6), then every final weight (<= final_tol).
 * Loads the fixture's initial parameters first; leaves the model trained. Returns the worst final weight's
 * max|d|/max|ref| (printed with its tensor). */
static inline double parity_train_check(sl_model *m, double final_tol, parity_final_fn final_diff) {
    int B = meta_i("batch"), T = meta_i("seq_len"), steps = meta_i("steps"), accum = meta_i("accum");
    load_params(m, "param.");
    sl_trainer tr;
    sl_trainer_config tc = {
        .B = B, .T = T, .accum = 1, .lr = 0, .clip = 0, .decay_iters = 1, .hp = {0.9f, 0.95f, 1e-8f, 0.0f}};
    TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer: %s", sl_errmsg());
    feed f = {need("tokens")->data, B, T, 1};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * T)), *tg = malloc(sizeof(int32_t) * (size_t)(B * T));
    feed_fn(&f, 0, 0, ids, tg);
    memset(m->grads_mem, 0, sizeof(float) * (size_t)m->numel);
    float loss;
    TU_CHECK(sl_trainer_forward_backward(&tr, ids, tg, &loss) == SL_OK, "fwd/bwd: %s", sl_errmsg());
    float ref_loss = ((const float *)need("loss")->data)[0];
    double lrel = fabs(loss - ref_loss) / fabs(ref_loss);
    printf("loss %.7f ref %.7f rel %.2e\n", loss, ref_loss, lrel);
    TU_CHECK(lrel <= 1e-5, "loss rel err %.3g", lrel);
    /* logits' buffer is reused by the backward pass (planner); re-run the forward part to read them */
    TU_CHECK(sl_graph_compute_range(tr.graph, 0, tr.n_forward, NULL, NULL) == SL_OK, "forward");
    const sl_st_tensor *rl = need("logits");
    double lg_rel = tu_rel_maxdiff(tr.logits->data, rl->data, (int64_t)(rl->nbytes / 4));
    printf("logits max rel %.2e\n", lg_rel);
    TU_CHECK(lg_rel <= 1e-5, "logits max|d|/max|ref| %.3g", lg_rel);
    double worst = 0;
    for (int i = 0; i < m->n_params; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "grad.%s", m->params[i].t->name);
        const sl_st_tensor *g = need(nm);
        double r = tu_rel_maxdiff(m->grads_mem + m->params[i].offset, g->data, m->params[i].numel);
        if (r > worst) worst = r;
        TU_CHECK(r <= 1e-4, "%s max|d|/max|ref| = %.3g", nm, r);
    }
    printf("worst gradient max|d|/max|ref| %.2e over %d tensors\n", worst, m->n_params);
    sl_trainer_free(&tr);
    free(ids);
    free(tg);

    load_params(m, "param.");
    sl_trainer_config tc2 = parity_train_config(B, T, accum, steps, meta_i("warmup"));
    TU_CHECK(sl_trainer_init(&tr, m, &tc2) == SL_OK, "trainer: %s", sl_errmsg());
    feed f2 = {need("train_tokens")->data, B, T, accum};
    const float *rls = need("step_losses")->data, *rns = need("step_grad_norms")->data,
                *rlr = need("step_lrs")->data;
    for (int s = 0; s < steps; s++) {
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, s, feed_fn, &f2, &ss) == SL_OK, "step: %s", sl_errmsg());
        double r = fabs(ss.loss - rls[s]) / fabs(rls[s]);
        printf("step %d loss %.7f ref %.7f rel %.2e | norm %.6f ref %.6f | lr %.3g ref %.3g\n", s, ss.loss,
               rls[s], r, ss.grad_norm, rns[s], ss.lr, rlr[s]);
        TU_CHECK(r <= 1e-5, "step %d loss rel err %.3g", s, r);
        TU_CHECK(fabs(ss.grad_norm - rns[s]) <= 1e-4 * fabs(rns[s]), "step %d grad norm", s);
        TU_CHECK(fabs(ss.lr - rlr[s]) <= 1e-6 * rlr[s], "step %d lr", s);
    }
    worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < m->n_params; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "final.%s", m->params[i].t->name);
        const float *got = m->params_mem + m->params[i].offset, *ref = need(nm)->data;
        double r = final_diff ? final_diff(m, i, got, ref) : tu_rel_maxdiff(got, ref, m->params[i].numel);
        if (r > worst) {
            worst = r;
            worst_name = m->params[i].t->name;
        }
        TU_CHECK(r <= final_tol, "%s max|d|/max|ref| = %.3g", nm, r);
    }
    printf("final weights worst max|d|/max|ref| %.2e (%s)\n", worst, worst_name);
    sl_trainer_free(&tr);
    return worst;
}

/* GPT-2's key bias has an exactly-zero true gradient (softmax is shift-invariant per query), so its computed
 * gradient is rounding noise that AdamW normalises into O(lr) updates in both implementations: compare only
 * the query and value thirds of c_attn.bias (a parity_final_fn). */
static inline double parity_gpt2_final_diff(const sl_model *m, int i, const float *got, const float *ref) {
    if (!strstr(m->params[i].t->name, "c_attn.bias")) return tu_rel_maxdiff(got, ref, m->params[i].numel);
    int64_t C = m->cfg.n_embd;
    double rq = tu_rel_maxdiff(got, ref, C), rv = tu_rel_maxdiff(got + 2 * C, ref + 2 * C, C);
    return rq > rv ? rq : rv;
}

/* The reference's own fp32 spread, from the float64 run of the same script the fixture holds
 * (f64_step_losses, f64_final.<name>): PyTorch fp32 vs fp64 (step losses, worst final weight) and ours vs
 * fp64 (worst final weight), printed. Call after parity_train_check (the model holds its final weights). */
typedef struct {
    double ref_loss, ref_w, our_w;
} parity_spread;

static inline parity_spread parity_f64_spread(const sl_model *m, parity_final_fn final_diff) {
    parity_spread s = {0, 0, 0};
    int steps = meta_i("steps");
    const float *r32 = need("step_losses")->data, *r64 = need("f64_step_losses")->data;
    for (int k = 0; k < steps; k++) {
        double d = fabs(r32[k] - r64[k]) / fabs(r64[k]);
        if (d > s.ref_loss) s.ref_loss = d;
    }
    for (int i = 0; i < m->n_params; i++) {
        char n32[128], n64[128];
        snprintf(n32, sizeof n32, "final.%s", m->params[i].t->name);
        snprintf(n64, sizeof n64, "f64_final.%s", m->params[i].t->name);
        const float *w32 = need(n32)->data, *w64 = need(n64)->data,
                    *got = m->params_mem + m->params[i].offset;
        double a = final_diff ? final_diff(m, i, w32, w64) : tu_rel_maxdiff(w32, w64, m->params[i].numel),
               b = final_diff ? final_diff(m, i, got, w64) : tu_rel_maxdiff(got, w64, m->params[i].numel);
        if (a > s.ref_w) s.ref_w = a;
        if (b > s.our_w) s.our_w = b;
    }
    printf("reference fp32 vs fp64: step losses max rel %.2e, final weights worst max|d|/max|ref| %.2e\n",
           s.ref_loss, s.ref_w);
    printf("suanli   fp32 vs fp64: final weights worst max|d|/max|ref| %.2e\n", s.our_w);
    return s;
}
#endif
