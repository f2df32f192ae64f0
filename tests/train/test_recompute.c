/* Full activation recomputation (Note [Full recomputation], src/graph/autodiff.c; `suanli train
 * --recompute-granularity full`): every layer is computed again in the backward from its kept input. The
 * oracle is the same run without it: the copies run the same kernels on the same bits, so each step's loss
 * and the final weights must be bitwise equal (no tolerance: any difference means a copy read another
 * value), for GPT-2 with attention and hidden dropout (the masks drawn again from the same counters) and a
 * GQA Llama with q/k/v biases, in fp32 and bf16 autocast, with two micro-batches per step; and on every
 * rank of tp 2 (with and without sequence parallelism), pp 2 (1F1B and ZB-H1, two micro-batches), and
 * tp 2 x pp 2 x dp 2 with ZeRO-1 (threads as ranks on loopback). The planned activation memory must shrink
 * (printed: the forward's intermediates die in the forward), the graph must hold recomputed nodes, and a
 * MoE model is refused. */
#include <pthread.h>
#include <string.h>

#include "suanli/parallel.h"
#include "suanli/train.h"
#include "testutil.h"

enum { STEPS = 6, B = 2, T = 16, V = 64 };
static const sl_gpt2_config CFG = {4, 2, 32, V, T};
static const sl_llama_config LCFG = {.arch = SL_ARCH_LLAMA,
                                     .n_layer = 4,
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

/* one rank of a tp x pp x dp layout (dp = world / (tp pp)) */
typedef struct {
    sl_comm *world;
    int tp, pp, sp, llama, recompute, zb;
    float loss[STEPS];
    float *full; /* this rank's stage, TP-gathered */
    int64_t full_numel;
    size_t planned;
    sl_status st;
} rank_job;

static void *run_rank(void *arg) {
    rank_job *j = arg;
    sl_mesh mesh;
    sl_model *whole = NULL, *m = NULL;
    sl_tp *tp = NULL;
    sl_dp *dp = NULL;
    sl_trainer tr;
    int have_tr = 0;
    if ((j->st = sl_mesh_init(&mesh, j->world, (sl_mesh_dims){j->tp, j->pp, 1})) != SL_OK) return NULL;
    if ((j->st = j->llama ? sl_llama_new(&LCFG, &whole) : sl_gpt2_new(&CFG, &whole)) != SL_OK) goto out;
    sl_model_init_weights(whole, 5);
    sl_model_split split = {j->tp, mesh.tp_rank, j->pp, mesh.pp_rank, 1, 0, 0, 1, 0, 0};
    if ((j->st = sl_model_new_split(whole, sl_backend_cpu(), &split, &m)) != SL_OK) goto out;
    if ((j->st = sl_tp_load_full(m, whole)) != SL_OK) goto out;
    if (j->tp > 1 && (j->st = sl_tp_new(&tp, &mesh)) != SL_OK) goto out;
    m->sp = j->sp;
    if (!j->llama) m->attention_dropout = m->hidden_dropout = 0.2f;
    sl_trainer_config tc = {.B = B,
                            .T = T,
                            .accum = 2,
                            .dp_size = mesh.dp,
                            .lr = 3e-3f,
                            .min_lr = 3e-4f,
                            .clip = 1.0f,
                            .warmup = 2,
                            .decay_iters = STEPS,
                            .hp = {0.9f, 0.95f, 1e-8f, 0.1f},
                            .mesh = &mesh,
                            .dropout_seed = 42,
                            .pipe_schedule = j->zb ? SL_PIPE_ZB_H1 : SL_PIPE_1F1B,
                            .recompute = j->recompute};
    if ((j->st = sl_trainer_init(&tr, m, &tc)) != SL_OK) goto out;
    have_tr = 1;
    j->planned = tr.plan.planned_bytes;
    if (tp && (j->st = sl_trainer_set_tp(&tr, tp)) != SL_OK) goto out;
    if (mesh.dp > 1) {
        sl_dp_opts o = {.zero_stage = 1,
                        .bucket_elems = 3000,
                        .accum = 2,
                        .ready = sl_trainer_dp_ready,
                        .ready_user = &tr};
        if ((j->st = sl_dp_new(&dp, &mesh, m, tr.graph, &o)) != SL_OK) goto out;
        tr.dp = dp;
    }
    for (int s = 0; s < STEPS; s++) {
        sl_step_stats ss;
        if ((j->st = sl_trainer_step(&tr, s, synth, NULL, &ss)) != SL_OK) goto out;
        j->loss[s] = ss.loss;
    }
    if (dp && (j->st = sl_dp_gather_params(dp)) != SL_OK) goto out;
    j->full_numel = sl_tp_full_numel(m);
    j->full = malloc(sizeof(float) * (size_t)j->full_numel);
    j->st = j->full ? sl_tp_gather_full(tp, m, j->full) : SL_ERR_NOMEM;
out:
    sl_dp_free(dp);
    if (have_tr) sl_trainer_free(&tr);
    sl_tp_free(tp);
    sl_model_free(m);
    sl_model_free(whole);
    sl_mesh_free(&mesh);
    return NULL;
}

static void run_layout(int world, int tp, int pp, int sp, int llama, int zb, int recompute, rank_job *jobs) {
    sl_comm *comms[8];
    pthread_t th[8];
    TU_CHECK(sl_comm_init_loopback(world, comms, NULL) == SL_OK, "loopback: %s", sl_errmsg());
    for (int r = 0; r < world; r++) {
        jobs[r] = (rank_job){.world = comms[r],
                             .tp = tp,
                             .pp = pp,
                             .sp = sp,
                             .llama = llama,
                             .zb = zb,
                             .recompute = recompute};
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < world; r++) sl_comm_free(comms[r]);
}

/* every rank of the layout with recomputation: its losses, its stage's weights bitwise the run without */
static void compare_layout(int world, int tp, int pp, int sp, int llama, int zb) {
    rank_job a[8], b[8];
    run_layout(world, tp, pp, sp, llama, zb, 0, a);
    run_layout(world, tp, pp, sp, llama, zb, 1, b);
    char what[96];
    snprintf(what, sizeof what, "%s tp %d%s pp %d%s dp %d", llama ? "llama" : "gpt2", tp, sp ? " (sp)" : "",
             pp, zb ? " (ZB-H1)" : "", world / (tp * pp));
    for (int r = 0; r < world; r++) {
        TU_CHECK(a[r].st == SL_OK && b[r].st == SL_OK, "%s rank %d: %s / %s (%s)", what, r,
                 sl_status_name(a[r].st), sl_status_name(b[r].st), sl_errmsg());
        if (a[r].st != SL_OK || b[r].st != SL_OK) continue;
        TU_CHECK(memcmp(a[r].loss, b[r].loss, sizeof a[r].loss) == 0, "%s rank %d: losses differ", what, r);
        TU_CHECK(a[r].full_numel == b[r].full_numel &&
                     memcmp(a[r].full, b[r].full, sizeof(float) * (size_t)a[r].full_numel) == 0,
                 "%s rank %d: final weights differ", what, r);
        /* ZB-H1 defers the weight gradients (Note [Splitting the backward]): the copies they read live
         * until then, so the last stage (one micro-batch in flight) saves nothing; the first still does */
        TU_CHECK(b[r].planned < a[r].planned || (zb && r > 0 && b[r].planned == a[r].planned),
                 "%s rank %d: planned %zu with recomputation, %zu without", what, r, b[r].planned,
                 a[r].planned);
        if (r == 0)
            printf("%s: rank 0 planned activations %.1f -> %.1f KiB (%.2fx); every rank bitwise\n", what,
                   a[r].planned / 1024.0, b[r].planned / 1024.0, (double)b[r].planned / (double)a[r].planned);
    }
    for (int r = 0; r < world; r++) {
        free(a[r].full);
        free(b[r].full);
    }
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
    compare_layout(2, 2, 1, 0, 0, 0);
    compare_layout(2, 2, 1, 1, 0, 0);
    compare_layout(2, 1, 2, 0, 0, 0);
    compare_layout(2, 1, 2, 0, 0, 1);
    compare_layout(2, 2, 1, 0, 1, 0);
    compare_layout(2, 1, 2, 0, 1, 0);
    compare_layout(8, 2, 2, 0, 0, 0);
    moe_refused();
    return tu_finish("test_recompute");
}
