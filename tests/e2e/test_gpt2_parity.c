/* PyTorch parity for GPT-2 (fixture: scripts/gen_gpt2_parity.py).
 * Bars (issue 2): loss rel err <= 1e-5; each gradient max|d|/max|ref| <= 1e-4; the 10 AdamW step losses
 * (with grad accumulation, clipping and the LR schedule) within 1e-5 relative. Also checked: logits,
 * grad norms, LRs, and final weights (max|d|/max|ref| <= 1e-4). The checks are parity_train_check. */
#include <string.h>

#include "parity_fixture.h"
#include "testutil.h"

int main(void) {
    sl_threads_set(2);
    sl_safetensors *st;
    const char *path = SL_SOURCE_DIR "/tests/fixtures/gpt2_parity.safetensors";
    if (sl_safetensors_open(path, &st) != SL_OK) {
        fprintf(stderr, "%s\n", sl_errmsg());
        return 1;
    }
    g_st = st;
    sl_gpt2_config cfg = {meta_i("n_layer"), meta_i("n_head"), meta_i("n_embd"), meta_i("vocab_size"),
                          meta_i("seq_len")};
    sl_model *m;
    TU_CHECK(sl_gpt2_new(&cfg, &m) == SL_OK, "model: %s", sl_errmsg());
    parity_train_check(m, 1e-4, parity_gpt2_final_diff);
    sl_model_free(m);
    sl_safetensors_close(st);
    return tu_finish("test_gpt2_parity");
}
