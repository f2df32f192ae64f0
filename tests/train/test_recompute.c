/* Full activation recomputation (Note [Full recomputation], src/graph/autodiff.c; `suanli train
 * --recompute-granularity full`): every layer is computed again in the backward from its kept input. The
 * oracle is the same run without it: the copies run the same kernels on the same bits, so each step's loss
 * and the final weights must be bitwise equal (no tolerance: any difference means a copy read another
 * value), for GPT-2 with attention and hidden dropout (the masks drawn again from the same counters) and a
 * GQA Llama with q/k/v biases, in fp32 and bf16 autocast, with two micro-batches per step. The planned
 * activation memory must shrink (printed: the forward's intermediates die in the forward), the graph must
 * hold recomputed nodes, and a MoE model is refused. */
#include <string.h>

#include "suanli/train.h"
#include "testutil.h"

enum { STEPS = 6, B = 2, T = 16, V = 64 };
static const sl_gpt2_config CFG = {3, 2, 32, V, T};
static const sl_llama_config LCFG = {.arch = SL_ARCH_LLAMA,
                                     .n_layer = 3,
                                     .n_head = 4,
                                     .n_kv_head = 2,
                                     .head_dim = 8,
                                     .hidden = 32,
                                     .intermediate = 48,
                                     .vocab_size = V,
                                     .max_seq_len = T,
                                     .rms_eps = 1e-5f,
                                     .rope_theta = 10000.0f,
                                     .qkv_bias = 1};

static sl_status synth(void *u, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    (void)u;
    tu_synth_tokens(B, T, V, step, micro, ids, tg);
    return SL_OK;
}

typedef struct {
    float loss[STEPS];
    float *params;
    int64_t numel;
    size_t planned;
    int recomputed; /* nodes flagged SL_FLAG_RECOMPUTED */
} run_out;

static void run(int llama, sl_dtype dt, int recompute, run_out *r) {
    sl_model *m = NULL;
    TU_CHECK((llama ? sl_llama_new(&LCFG, &m) : sl_gpt2_new(&CFG, &m)) == SL_OK, "model: %s", sl_errmsg());
    sl_model_init_weights(m, 5);
    m->compute_dtype = dt;
    if (!llama) m->attention_dropout = m->hidden_dropout = 0.2f;
    sl_trainer_config tc = {.B = B,
                            .T = T,
                            .accum = 2,
                            .lr = 3e-3f,
                            .min_lr = 3e-4f,
                            .clip = 1.0f,
                            .warmup = 2,
                            .decay_iters = STEPS,
                            .hp = {0.9f, 0.95f, 1e-8f, 0.1f},
                            .dropout_seed = 42,
                            .recompute = recompute};
    sl_trainer tr;
    TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer: %s", sl_errmsg());
    r->planned = tr.plan.planned_bytes;
    r->recomputed = 0;
    for (int i = 0; i < sl_graph_n_nodes(tr.graph); i++)
        r->recomputed += (sl_graph_node(tr.graph, i)->flags & SL_FLAG_RECOMPUTED) != 0;
    for (int s = 0; s < STEPS; s++) {
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, s, synth, NULL, &ss) == SL_OK, "step %d: %s", s, sl_errmsg());
        r->loss[s] = ss.loss;
    }
    r->numel = m->numel;
    r->params = malloc(sizeof(float) * (size_t)m->numel);
    TU_CHECK(r->params != NULL, "oom");
    memcpy(r->params, m->params_mem, sizeof(float) * (size_t)m->numel);
    sl_trainer_free(&tr);
    sl_model_free(m);
}

static void compare(int llama, sl_dtype dt) {
    const char *what =
        llama ? (dt == SL_F32 ? "llama fp32" : "llama bf16") : (dt == SL_F32 ? "gpt2 fp32" : "gpt2 bf16");
    run_out a, b;
    run(llama, dt, 0, &a);
    run(llama, dt, 1, &b);
    TU_CHECK(a.recomputed == 0 && b.recomputed > 0, "%s: recomputed nodes %d / %d", what, a.recomputed,
             b.recomputed);
    for (int s = 0; s < STEPS; s++)
        TU_CHECK(memcmp(&a.loss[s], &b.loss[s], sizeof(float)) == 0, "%s: step %d loss %.9g, recomputed %.9g",
                 what, s, a.loss[s], b.loss[s]);
    TU_CHECK(a.numel == b.numel && memcmp(a.params, b.params, sizeof(float) * (size_t)a.numel) == 0,
             "%s: final weights differ", what);
    TU_CHECK(b.planned < a.planned, "%s: planned activations %zu bytes with recomputation, %zu without", what,
             b.planned, a.planned);
    printf(
        "%s: %d nodes recomputed; planned activations %.1f -> %.1f KiB (%.2fx); losses and weights bitwise\n",
        what, b.recomputed, a.planned / 1024.0, b.planned / 1024.0, (double)b.planned / (double)a.planned);
    free(a.params);
    free(b.params);
}

/* a layer with routed experts (counts, capacity, all-to-all under EP) is not recomputed: refused */
static void moe_refused(void) {
    sl_llama_config c = LCFG;
    c.arch = SL_ARCH_MIXTRAL;
    c.n_experts = 2;
    c.n_experts_per_tok = 1;
    sl_model *m = NULL;
    TU_CHECK(sl_llama_new(&c, &m) == SL_OK, "mixtral: %s", sl_errmsg());
    sl_trainer_config tc = {.B = B, .T = T, .accum = 1, .lr = 1e-3f, .decay_iters = 1, .recompute = 1};
    sl_trainer tr;
    sl_status st = sl_trainer_init(&tr, m, &tc);
    TU_CHECK(st == SL_ERR_INVALID && strstr(sl_errmsg(), "--recompute-granularity"), "MoE: %s (%s)",
             sl_status_name(st), sl_errmsg());
    sl_model_free(m);
}

int main(void) {
    compare(0, SL_F32);
    compare(1, SL_F32);
    compare(0, SL_BF16);
    compare(1, SL_BF16);
    moe_refused();
    return tu_finish("test_recompute");
}
