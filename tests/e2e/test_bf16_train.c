/* bf16 mixed precision (matmul operands rounded to bf16, fp32 accumulation, fp32 master weights and AdamW)
 * against fp32 on the PyTorch parity fixture's 10 training steps: every step loss within 1% of fp32 (and
 * of PyTorch's fp32 losses), and the graph really runs bf16 matmuls. */
#include <string.h>

#include "suanli/safetensors.h"
#include "suanli/train.h"
#include "parity_fixture.h"
#include "testutil.h"

static void run(int bf16, float *losses) {
    sl_gpt2_config cfg = {meta_i("n_layer"), meta_i("n_head"), meta_i("n_embd"), meta_i("vocab_size"),
                          meta_i("seq_len")};
    int B = meta_i("batch"), T = cfg.max_seq_len, steps = meta_i("steps"), accum = meta_i("accum");
    sl_model *m;
    TU_CHECK(sl_gpt2_new(&cfg, &m) == SL_OK, "model");
    m->compute_dtype = bf16 ? SL_BF16 : SL_F32;
    load_params(m, "param.");
    sl_trainer tr;
    sl_trainer_config tc = parity_train_config(B, T, accum, steps, meta_i("warmup"));
    TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer: %s", sl_errmsg());
    int nbf = 0;
    for (int i = 0; i < sl_graph_n_nodes(tr.graph); i++) {
        sl_tensor *n = sl_graph_node(tr.graph, i);
        if (n->op == SL_OP_MATMUL && n->src[0]->dtype == SL_BF16) nbf++;
    }
    TU_CHECK(bf16 ? nbf > 0 : nbf == 0, "bf16 matmuls in the graph: %d", nbf);
    feed f = {sl_safetensors_find(g_st, "train_tokens")->data, B, T, accum};
    for (int s = 0; s < steps; s++) {
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, s, feed_fn, &f, &ss) == SL_OK, "step: %s", sl_errmsg());
        losses[s] = ss.loss;
    }
    sl_trainer_free(&tr);
    sl_model_free(m);
}

int main(void) {
    sl_threads_set(2);
    sl_safetensors *st;
    if (sl_safetensors_open(SL_SOURCE_DIR "/tests/fixtures/gpt2_parity.safetensors", &st) != SL_OK) {
        fprintf(stderr, "%s\n", sl_errmsg());
        return 1;
    }
    g_st = st;
    int steps = meta_i("steps");
    float f32[64], bf[64];
    run(0, f32);
    run(1, bf);
    const float *ref = sl_safetensors_find(st, "step_losses")->data;
    double worst = 0, differ = 0;
    for (int s = 0; s < steps; s++) {
        double r = fabs(bf[s] - f32[s]) / f32[s], rp = fabs(bf[s] - ref[s]) / ref[s];
        if (r > worst) worst = r;
        if (rp > worst) worst = rp;
        differ += bf[s] != f32[s];
        printf("step %d: fp32 %.6f bf16 %.6f pytorch-fp32 %.6f\n", s, f32[s], bf[s], ref[s]);
    }
    printf("worst relative loss difference bf16 vs fp32: %.3g\n", worst);
    TU_CHECK(worst <= 0.01, "bf16 within 1%%: %.3g", worst);
    TU_CHECK(differ > 0, "bf16 is not silently fp32");
    sl_safetensors_close(st);
    return tu_finish("test_bf16_train");
}
