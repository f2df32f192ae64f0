/* PyTorch parity of dropout (fixture: scripts/gen_dropout_parity.py): a tiny GPT-2 with attention dropout
 * 0.25 and hidden dropout 0.2 at nanoGPT's four places, where the PyTorch run draws its masks from the same
 * counters (Philox-4x32-10 reimplemented in numpy; Note [Dropout from counters] in src/ops/build.c).
 * 1. Philox known answers (Random123's vectors, also asserted by the script) against sl_philox4x32.
 * 2. One forward/backward with stream 0: loss <= 1e-5 relative, every gradient max|d|/max|ref| <= 1e-4:
 *    the bars of the dropout-free GPT-2 parity (test_gpt2_parity); dropout adds only exact multiplications
 *    by 0 or float(1/(1-p)), so fp32 summation order stays the only difference (measured below ~1e-6).
 * 3. Ten AdamW steps, 2 micro-batches each, the trainer drawing stream step * 2 + micro: step losses
 *    <= 1e-5, grad norms <= 1e-4, final weights <= 1e-4 (the GPT-2 parity's bars; its key-bias exception).
 * 4. A mask that differs from the fixture's (another seed) must miss the loss by far more than the bar,
 *    so the comparison above can fail. */
#include <string.h>

#include "parity_fixture.h"
#include "testutil.h"

static double gpt2_final_diff(const sl_model *m, int i, const float *got, const float *ref) {
    return parity_gpt2_final_diff(m, i, got, ref);
}

int main(void) {
    sl_threads_set(2);
    sl_safetensors *st;
    const char *path = SL_SOURCE_DIR "/tests/fixtures/dropout_parity.safetensors";
    if (sl_safetensors_open(path, &st) != SL_OK) {
        fprintf(stderr, "%s\n", sl_errmsg());
        return 1;
    }
    g_st = st;
    const uint32_t *kat = need("philox_kat")->data;
    uint32_t o[4];
    sl_philox4x32(0, 0, 0, o);
    for (int i = 0; i < 4; i++)
        TU_CHECK(o[i] == kat[i], "philox(0,0) word %d %08x ref %08x", i, o[i], kat[i]);
    sl_philox4x32(~0ull, ~0ull, ~0ull, o);
    for (int i = 0; i < 4; i++)
        TU_CHECK(o[i] == kat[4 + i], "philox(~0) word %d %08x ref %08x", i, o[i], kat[4 + i]);

    sl_gpt2_config cfg = {meta_i("n_layer"), meta_i("n_head"), meta_i("n_embd"), meta_i("vocab_size"),
                          meta_i("seq_len")};
    uint64_t seed = strtoull(sl_safetensors_meta(g_st, "dropout_seed"), NULL, 10);
    int B = meta_i("batch"), T = meta_i("seq_len"), steps = meta_i("steps"), accum = meta_i("accum");
    sl_model *m;
    TU_CHECK(sl_gpt2_new(&cfg, &m) == SL_OK, "model: %s", sl_errmsg());
    m->attention_dropout = meta_f("p_attn");
    m->hidden_dropout = meta_f("p_hidden");
    load_params(m, "param.");

    /* 2. one forward/backward, stream 0 */
    sl_trainer tr;
    sl_trainer_config tc = {
        .B = B, .T = T, .accum = 1, .lr = 0, .clip = 0, .decay_iters = 1, .hp = {0.9f, 0.95f, 1e-8f, 0.0f}};
    TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer: %s", sl_errmsg());
    int nd = sl_graph_set_dropout(tr.graph, 1, seed, 0);
    /* forward: 1 embedding + 3 per layer; backward: one DROPOUT per hidden site (attention's is inside
     * ATTENTION_BACK) */
    TU_CHECK(nd == 2 * (1 + 2 * cfg.n_layer) + cfg.n_layer, "dropout nodes %d", nd);
    feed f = {need("tokens")->data, B, T, 1};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * T)), *tg = malloc(sizeof(int32_t) * (size_t)(B * T));
    feed_fn(&f, 0, 0, ids, tg);
    float loss;
    TU_CHECK(sl_trainer_forward_backward(&tr, ids, tg, &loss) == SL_OK, "fwd/bwd: %s", sl_errmsg());
    float ref_loss = ((const float *)need("loss")->data)[0];
    double lrel = fabs(loss - ref_loss) / fabs(ref_loss);
    printf("loss %.7f ref %.7f rel %.2e\n", loss, ref_loss, lrel);
    TU_CHECK(lrel <= 1e-5, "loss rel err %.3g", lrel);
    double worst = 0;
    for (int i = 0; i < m->n_params; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "grad.%s", m->params[i].t->name);
        double r = tu_rel_maxdiff(m->grads_mem + m->params[i].offset, need(nm)->data, m->params[i].numel);
        if (r > worst) worst = r;
        TU_CHECK(r <= 1e-4, "%s max|d|/max|ref| = %.3g", nm, r);
    }
    printf("worst gradient max|d|/max|ref| %.2e over %d tensors\n", worst, m->n_params);
    /* 4. another key: different masks, a loss far off the bar */
    sl_graph_set_dropout(tr.graph, 1, seed + 1, 0);
    float other;
    TU_CHECK(sl_trainer_forward_backward(&tr, ids, tg, &other) == SL_OK, "fwd/bwd: %s", sl_errmsg());
    printf("loss with another seed %.7f (rel %.2e)\n", other, fabs(other - ref_loss) / fabs(ref_loss));
    TU_CHECK(fabs(other - ref_loss) / fabs(ref_loss) > 1e-3, "another seed's masks give the same loss");
    sl_trainer_free(&tr);

    /* 3. training: the trainer draws stream step * accum + micro */
    load_params(m, "param.");
    sl_trainer_config tc2 = parity_train_config(B, T, accum, steps, meta_i("warmup"));
    tc2.dropout_seed = seed;
    TU_CHECK(sl_trainer_init(&tr, m, &tc2) == SL_OK, "trainer: %s", sl_errmsg());
    feed f2 = {need("train_tokens")->data, B, T, accum};
    const float *rls = need("step_losses")->data, *rns = need("step_grad_norms")->data;
    for (int s = 0; s < steps; s++) {
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, s, feed_fn, &f2, &ss) == SL_OK, "step: %s", sl_errmsg());
        double r = fabs(ss.loss - rls[s]) / fabs(rls[s]);
        printf("step %d loss %.7f ref %.7f rel %.2e | norm %.6f ref %.6f\n", s, ss.loss, rls[s], r,
               ss.grad_norm, rns[s]);
        TU_CHECK(r <= 1e-5, "step %d loss rel err %.3g", s, r);
        TU_CHECK(fabs(ss.grad_norm - rns[s]) <= 1e-4 * fabs(rns[s]), "step %d grad norm", s);
    }
    worst = 0;
    for (int i = 0; i < m->n_params; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "final.%s", m->params[i].t->name);
        double r = gpt2_final_diff(m, i, m->params_mem + m->params[i].offset, need(nm)->data);
        if (r > worst) worst = r;
        TU_CHECK(r <= 1e-4, "%s max|d|/max|ref| = %.3g", nm, r);
    }
    printf("final weights worst max|d|/max|ref| %.2e\n", worst);
    sl_trainer_free(&tr);
    free(ids);
    free(tg);
    sl_model_free(m);
    sl_safetensors_close(st);
    return tu_finish("test_dropout_parity");
}
