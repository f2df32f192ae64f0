/* transformers parity for Llama training (fixture: scripts/gen_llama_parity.py, LlamaForCausalLM fp32).
 * Bars (issue 7): loss rel err <= 1e-5; each gradient max|d|/max|ref| <= 1e-4; the 10 AdamW step losses
 * (with grad accumulation, clipping and the LR schedule) within 1e-5 relative. Also checked: logits,
 * grad norms, LRs, and final weights (max|d|/max|ref| <= 8e-5, see below).
 * bf16 (issue 7): 100 steps with PyTorch autocast-bf16 numerics (m->autocast_bf16) vs torch.autocast on
 * the same model and data: every step's loss within 1% (the bar). For scale the test also prints how far
 * PyTorch's own fp32 run is from its autocast run. */
#include <string.h>

#include "parity_fixture.h"
#include "suanli/model_io.h"
#include "suanli/safetensors.h"
#include "suanli/train.h"
#include "testutil.h"

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
    int B = meta_i("batch"), T = cfg.max_seq_len;
    sl_model *m;
    TU_CHECK(sl_llama_new(&cfg, &m) == SL_OK, "model: %s", sl_errmsg());
    /* 1 + 2. Final weights (fixture regenerated with transformers 5.24 / torch 2.15): ours vs PyTorch fp32
     * 1.3e-5 in the Release build (layers.1.self_attn.o_proj; printed "final weights worst"), 3.6e-5 in the
     * Debug ASan build (layers.1.k_proj); PyTorch fp32 vs its own float64 run 1.7e-5, ours vs fp64 3.1e-5
     * [2.1e-5] (printed below); PyTorch's fp32 run itself moved 1.3e-5 between the torch
     * that wrote the previous fixture and this one. The spread comes from AdamW dividing by sqrt(v): an
     * element whose gradient becomes small at some step turns fp32 rounding differences in that gradient
     * into a visible fraction of an lr-sized step, so it depends on the kernels' summation order (an older
     * kernel set measured 2.1e-4 in one layers.1.o_proj element). Bar 8e-5, ~2x the larger measurement (was
     * 1e-3); and ours at most 10x as far from fp64 as PyTorch's fp32 run (measured 1.8x), as
     * test_family_parity.c. */
    parity_train_check(m, 8e-5, NULL);
    parity_spread sp = parity_f64_spread(m, NULL);
    TU_CHECK(sp.our_w <= 10 * sp.ref_w + 1e-6, "final weights %.3g from fp64, reference fp32 %.3g", sp.our_w,
             sp.ref_w);

    /* 3. autocast-bf16 training, 100 steps */
    load_params(m, "param.");
    sl_trainer tr;
    m->autocast_bf16 = 1;
    int ac_steps = meta_i("ac_steps");
    sl_trainer_config tc3 = parity_train_config(B, T, 1, ac_steps, meta_i("ac_warmup"));
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
    sl_model_free(m);
    sl_safetensors_close(st);
    return tu_finish("test_llama_parity");
}
