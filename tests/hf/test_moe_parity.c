/* transformers parity for MoE training (fixtures: scripts/gen_moe_fixtures.py):
 *   qwen2_moe_train: Qwen2MoeForCausalLM fp32 (4 experts, top-2 renormalised, a sigmoid-gated shared
 *     expert, q/k/v biases), trained on cross-entropy plus each layer's Switch load-balancing loss
 *     (coefficient 0.01) and router z-loss (0.001);
 *   deepseek_v3_train: Llama attention + transformers' DeepseekV3MoE (8 experts in 4 groups, top-2 of the
 *     best 2 groups by sigmoid score + a fixed e_score_correction_bias, renormalised, x2.5, a shared
 *     expert; the first layer dense), trained on cross-entropy.
 * Bars (the GPT-2 bars of issue 2, parity_train_check): one forward/backward: loss and logits <= 1e-5
 * relative, every gradient max|d|/max|ref| <= 1e-4; 10 AdamW steps (accumulation 2, clipping, warmup +
 * cosine): each step loss <= 1e-5 relative, grad norm <= 1e-4, final weights <= FINAL_TOL (below).
 * Tolerances are set against how far the PyTorch reference itself moves in fp32: the fixture holds the
 * same run in float64, and the test prints (and bounds) both the reference's fp32-vs-fp64 spread and ours. */
#include <string.h>

#include "parity_fixture.h"
#include "suanli/hf.h"
#include "suanli/model_io.h"
#include "testutil.h"

/* one fixture: parity_train_check, then the fp32-vs-fp64 spreads */
static void check_fixture(const char *name) {
    char path[1024], dir[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/hf/%s.safetensors", SL_SOURCE_DIR, name);
    snprintf(dir, sizeof dir, "%s/tests/fixtures/hf/%s", SL_SOURCE_DIR, name);
    sl_safetensors *st;
    if (sl_safetensors_open(path, &st) != SL_OK) {
        TU_CHECK(0, "%s", sl_errmsg());
        return;
    }
    g_st = st;
    sl_llama_config cfg;
    TU_CHECK(sl_hf_load_config(dir, &cfg, NULL) == SL_OK, "config: %s", sl_errmsg());
    sl_model *m;
    TU_CHECK(sl_llama_new(&cfg, &m) == SL_OK, "model: %s", sl_errmsg());
    m->moe.aux_coeff = meta_f("aux_coeff");
    m->moe.z_coeff = meta_f("z_coeff");
    printf("== %s\n", name);
    /* Measured (transformers 5.24, torch 2.15), ours vs PyTorch fp32:
     *   qwen2_moe:   loss 8.8e-8, logits 3.8e-7, worst gradient 1.0e-6, step losses <= 2.0e-7, final weights
     *                3.8e-6; PyTorch's own fp32 run ends 1.1e-5 from its fp64 run (ours 9.7e-6).
     *   deepseek_v3: loss 0, logits 6.3e-7, worst gradient 1.5e-6, step losses <= 5.8e-7; final
     * weights 2.6e-4, all of it one element (embed_tokens[47][41], 9.7e-5 absolute; the next worst element of
     * any tensor is 1.1e-6): AdamW divides by sqrt(v), so where an element's gradient passes near zero at
     * some step, fp32 rounding differences in that gradient become a visible fraction of an lr-sized update
     * (the effect test_llama_parity.c describes). PyTorch fp32 ends 3.0e-5 from its fp64 run, ours 2.4e-4
     * (8x, that one element). The loss (1e-5) and gradient (1e-4) bars of parity_train_check are >= 50x what
     * is measured. Final weights: the GPT-2 bar 1e-4 (~10x PyTorch's own fp32 spread) for Qwen2-MoE;
     * DeepSeek-V3 is held to the Llama family's 1e-3 (test_llama_parity.c) for the element above, ~4x its
     * measurement. */
    const double FINAL_TOL = strstr(name, "deepseek") ? 1e-3 : 1e-4;
    parity_train_check(m, FINAL_TOL, NULL);

    /* the reference's own fp32 spread: torch fp32 vs torch fp64, next to ours vs torch fp64 */
    parity_spread sp = parity_f64_spread(m, NULL);
    double ref_w = sp.ref_w, our_w = sp.our_w;
    /* ours may be as far from exact as PyTorch's fp32 run is, with a margin of 20x for the summation order
     * (measured 0.9x for Qwen2-MoE, 8x for DeepSeek-V3: the one element above) */
    TU_CHECK(our_w <= 20 * ref_w + 1e-6, "%s: suanli's final weights %.3g from fp64, reference fp32 %.3g",
             name, our_w, ref_w);
    sl_model_free(m);
    sl_safetensors_close(st);
}

int main(void) {
    sl_threads_set(2);
    check_fixture("qwen2_moe_train");
    check_fixture("deepseek_v3_train");
    return tu_finish("test_moe_parity");
}
