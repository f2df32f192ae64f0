/* transformers parity for Llama training (fixture: scripts/gen_llama_parity.py, LlamaForCausalLM fp32).
 * Bars (issue 7): loss rel err <= 1e-5; each gradient max|d|/max|ref| <= 1e-4; the 10 AdamW step losses
 * (with grad accumulation, clipping and the LR schedule) within 1e-5 relative. Also checked: logits,
 * grad norms, LRs, and final weights (max|d|/max|ref| <= 1e-3, see below).
 * bf16 (issue 7): 100 steps with PyTorch autocast-bf16 numerics (m->autocast_bf16) vs torch.autocast on
 * the same model and data: every step's loss within 1% (the bar). For scale the test also prints how far
 * PyTorch's own fp32 run is from its autocast run. */
#include <string.h>

#include "suanli/hf.h"
#include "suanli/safetensors.h"
#include "suanli/train.h"
#include "testutil.h"

static const sl_safetensors *g_st;

static const sl_st_tensor *need(const char *name) {
    const sl_st_tensor *t = sl_safetensors_find(g_st, name);
    if (!t) {
        fprintf(stderr, "fixture lacks %s\n", name);
        exit(1);
    }
    return t;
}

static int meta_i(const char *k) { return atoi(sl_safetensors_meta(g_st, k)); }
static float meta_f(const char *k) { return (float)atof(sl_safetensors_meta(g_st, k)); }

typedef struct {
    const int32_t *tok;
    int B, T, accum;
} feed;

static sl_status feed_fn(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    feed *f = u;
    const int32_t *base = f->tok + ((step * f->accum + micro) * f->B) * (int64_t)(f->T + 1);
    for (int b = 0; b < f->B; b++)
        for (int t = 0; t < f->T; t++) {
            ids[b * f->T + t] = base[b * (f->T + 1) + t];
            tg[b * f->T + t] = base[b * (f->T + 1) + t + 1];
        }
    return SL_OK;
}

static void load_params(sl_model *m, const char *prefix) {
    for (int i = 0; i < m->n_params; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s%s", prefix, m->params[i].t->name);
        const sl_st_tensor *t = need(nm);
        TU_CHECK(t->nbytes == sizeof(float) * (size_t)m->params[i].numel, "%s size", nm);
        memcpy(m->params_mem + m->params[i].offset, t->data, t->nbytes);
    }
}

int main(void) {
    sl_threads_set(2);
    sl_safetensors *st;
    const char *path = SL_SOURCE_DIR "/tests/fixtures/hf/llama_train.safetensors";
    if (sl_safetensors_open(path, &st) != SL_OK) {
        fprintf(stderr, "%s\n", sl_errmsg());
        return 1;
    }
    g_st = st;
    sl_llama_config cfg = {.arch = SL_ARCH_LLAMA,
                           .n_layer = meta_i("n_layer"),
                           .n_head = meta_i("n_head"),
                           .n_kv_head = meta_i("n_kv_head"),
                           .hidden = meta_i("hidden"),
                           .intermediate = meta_i("intermediate"),
                           .vocab_size = meta_i("vocab_size"),
                           .max_seq_len = meta_i("seq_len"),
                           .rms_eps = meta_f("rms_eps"),
                           .rope_theta = meta_f("rope_theta")};
    cfg.head_dim = cfg.hidden / cfg.n_head;
    int B = meta_i("batch"), T = cfg.max_seq_len, steps = meta_i("steps"), accum = meta_i("accum");
    sl_model *m;
    TU_CHECK(sl_llama_new(&cfg, &m) == SL_OK, "model: %s", sl_errmsg());
    load_params(m, "param.");

    /* 1. one forward/backward on `tokens` */
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

    /* 2. ten AdamW steps with accumulation, clipping, warmup+cosine */
    load_params(m, "param.");
    sl_trainer_config tc2 = {.B = B,
                             .T = T,
                             .accum = accum,
                             .lr = meta_f("lr"),
                             .min_lr = meta_f("min_lr"),
                             .clip = meta_f("clip"),
                             .warmup = meta_i("warmup"),
                             .decay_iters = steps,
                             .hp = {meta_f("beta1"), meta_f("beta2"), meta_f("eps"), meta_f("weight_decay")}};
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
    for (int i = 0; i < m->n_params; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "final.%s", m->params[i].t->name);
        const sl_st_tensor *g = need(nm);
        const float *got = m->params_mem + m->params[i].offset, *ref = g->data;
        double r = tu_rel_maxdiff(got, ref, m->params[i].numel);
        if (r > worst) worst = r;
        /* Every tensor but one lands within 6e-6; in layers.1.o_proj one element ends 7.6e-5 from PyTorch's
         * (2.1e-4 of max|w|): AdamW divides by sqrt(v), so an element whose gradient becomes small at some
         * step turns fp32 rounding differences in that gradient into a visible fraction of an lr-sized step.
         * The step losses above (1e-5) are the bar; final weights are held to 1e-3. */
        TU_CHECK(r <= 1e-3, "%s max|d|/max|ref| = %.3g", nm, r);
    }
    printf("final weights worst max|d|/max|ref| %.2e\n", worst);
    sl_trainer_free(&tr);

    /* 3. autocast-bf16 training, 100 steps */
    load_params(m, "param.");
    m->autocast_bf16 = 1;
    int ac_steps = meta_i("ac_steps");
    sl_trainer_config tc3 = {.B = B,
                             .T = T,
                             .accum = 1,
                             .lr = meta_f("lr"),
                             .min_lr = meta_f("min_lr"),
                             .clip = meta_f("clip"),
                             .warmup = meta_i("ac_warmup"),
                             .decay_iters = ac_steps,
                             .hp = {meta_f("beta1"), meta_f("beta2"), meta_f("eps"), meta_f("weight_decay")}};
    TU_CHECK(sl_trainer_init(&tr, m, &tc3) == SL_OK, "trainer: %s", sl_errmsg());
    feed f3 = {need("ac_tokens")->data, B, T, 1};
    const float *ral = need("ac_losses")->data, *rfl = need("fp32_losses")->data;
    double worst_ac = 0, sum_ac = 0, worst_torch = 0;
    for (int s = 0; s < ac_steps; s++) {
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, s, feed_fn, &f3, &ss) == SL_OK, "step: %s", sl_errmsg());
        double r = fabs(ss.loss - ral[s]) / fabs(ral[s]), rt = fabs(rfl[s] - ral[s]) / fabs(ral[s]);
        if (r > worst_ac) worst_ac = r;
        if (rt > worst_torch) worst_torch = rt;
        sum_ac += r;
        TU_CHECK(r <= 1e-2, "autocast step %d loss %.5f ref %.5f rel %.3g", s, ss.loss, ral[s], r);
        if (s % 20 == 0 || s == ac_steps - 1)
            printf("bf16 step %3d loss %.5f torch autocast %.5f rel %.2e\n", s, ss.loss, ral[s], r);
    }
    printf(
        "bf16 autocast %d steps: loss rel err max %.2e mean %.2e (torch fp32 vs torch autocast: max %.2e)\n",
        ac_steps, worst_ac, sum_ac / ac_steps, worst_torch);
    sl_trainer_free(&tr);
    m->autocast_bf16 = 0;
    free(ids);
    free(tg);
    sl_model_free(m);
    sl_safetensors_close(st);
    return tu_finish("test_llama_parity");
}
