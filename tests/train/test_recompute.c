/* Full activation recomputation (Note [Full recomputation], src/graph/autodiff.c; `suanli train
 * --recompute-granularity full`): every layer is computed again in the backward from its kept input. The
 * oracle is the same run without it: the copies run the same kernels on the same bits, so each step's loss
 * and the final weights must be bitwise equal (no tolerance: any difference means a copy read another
 * value), for GPT-2 with attention and hidden dropout (the masks drawn again from the same counters) and a
 * GQA Llama with q/k/v biases, in fp32 and bf16 autocast, with two micro-batches per step; and on every
 * rank of tp 2 (with and without sequence parallelism), pp 2 (1F1B and ZB-H1, two micro-batches), and
 * tp 2 x pp 2 x dp 2 with ZeRO-1 (threads as ranks on loopback); and a Qwen2-MoE (shared expert, top-2 of
 * 8) dropless and with capacity dropping, whose per-step expert loads and dropped fraction must also be
 * the same (the routing runs once: no double counts), in one process and with ep 2. The planned activation
 * memory must shrink (printed: the forward's intermediates die in the forward) and the graph must hold
 * recomputed nodes. */
#include <string.h>

#include "layout_harness.h"
#include "testutil.h"

enum { STEPS = 6, B = 2, T = 16, V = 64 };
static const sl_gpt2_config CFG = {4, 2, 32, V, T};
static const sl_llama_config LCFG = {.arch = SL_ARCH_LLAMA, TU_TINY_LLAMA(4), .qkv_bias = 1};

static const sl_llama_config MCFG = {.arch = SL_ARCH_QWEN2_MOE,
                                     .n_layer = 2,
                                     .n_head = 4,
                                     .n_kv_head = 2,
                                     .head_dim = 8,
                                     .hidden = 32,
                                     .intermediate = 48,
                                     .moe_intermediate = 16,
                                     .shared_intermediate = 24,
                                     .n_experts = 8,
                                     .n_experts_per_tok = 2,
                                     .vocab_size = V,
                                     .max_seq_len = T,
                                     .rms_eps = 1e-6f,
                                     .rope_theta = 10000.0f,
                                     .qkv_bias = 1};

static tu_layout_tokens TOK = {B, T, V}; /* the batches (tu_layout_synth) */

typedef struct {
    float loss[STEPS];
    float *params;
    int64_t numel;
    size_t planned;
    int recomputed; /* nodes flagged SL_FLAG_RECOMPUTED */
} run_out;

/* the training of every run: two micro-batches per step, dropout drawn from seed 42; recompute / layers:
 * sl_graph_set_recompute's */
static sl_trainer_config tcfg(int recompute, int layers) {
    sl_trainer_config tc = tu_layout_tc(B, T, 2, 0, 2, STEPS);
    tc.dropout_seed = 42;
    tc.recompute = recompute;
    tc.recompute_layers = layers;
    return tc;
}

static void run(int llama, sl_dtype dt, int recompute, int layers, run_out *r) {
    sl_model *m = NULL;
    TU_CHECK((llama ? sl_llama_new(&LCFG, &m) : sl_gpt2_new(&CFG, &m)) == SL_OK, "model: %s", sl_errmsg());
    sl_model_init_weights(m, 5);
    m->compute_dtype = dt;
    if (!llama) m->attention_dropout = m->hidden_dropout = 0.2f;
    sl_trainer_config tc = tcfg(recompute, layers);
    sl_trainer tr;
    TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer: %s", sl_errmsg());
    r->planned = tr.plan.planned_bytes;
    r->recomputed = 0;
    for (int i = 0; i < sl_graph_n_nodes(tr.graph); i++)
        r->recomputed += (sl_graph_node(tr.graph, i)->flags & SL_FLAG_RECOMPUTED) != 0;
    for (int s = 0; s < STEPS; s++) {
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, s, tu_layout_synth, &TOK, &ss) == SL_OK, "step %d: %s", s, sl_errmsg());
        r->loss[s] = ss.loss;
    }
    r->numel = m->numel;
    r->params = malloc(sizeof(float) * (size_t)m->numel);
    TU_CHECK(r->params != NULL, "oom");
    memcpy(r->params, m->params_mem, sizeof(float) * (size_t)m->numel);
    sl_trainer_free(&tr);
    sl_model_free(m);
}

/* method / layers: sl_graph_set_recompute's; *planned: the recomputing run's planned bytes */
static void compare_m(int llama, sl_dtype dt, int method, int layers, size_t *planned) {
    char what[96];
    snprintf(what, sizeof what, "%s %s, %s %d", llama ? "llama" : "gpt2", dt == SL_F32 ? "fp32" : "bf16",
             method == SL_RECOMPUTE_BLOCK ? "block" : "uniform", layers);
    run_out a, b;
    run(llama, dt, SL_RECOMPUTE_NONE, 0, &a);
    run(llama, dt, method, layers, &b);
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
    if (planned) *planned = b.planned;
    free(a.params);
    free(b.params);
}

static void compare(int llama, sl_dtype dt) { compare_m(llama, dt, SL_RECOMPUTE_UNIFORM, 1, NULL); }

/* Megatron's methods on the 4-layer GPT-2: uniform groups of 2 (two checkpoints, two layers recomputed at
 * once) and block 1 / 3 (only the first layers recomputed) are bitwise too; block keeps more the fewer
 * layers it recomputes, and recomputing every layer keeps the least */
static void methods(void) {
    size_t u1, u2, b1, b3, b4;
    compare_m(0, SL_F32, SL_RECOMPUTE_UNIFORM, 1, &u1);
    compare_m(0, SL_F32, SL_RECOMPUTE_UNIFORM, 2, &u2);
    compare_m(0, SL_F32, SL_RECOMPUTE_BLOCK, 1, &b1);
    compare_m(0, SL_F32, SL_RECOMPUTE_BLOCK, 3, &b3);
    compare_m(0, SL_F32, SL_RECOMPUTE_BLOCK, 4, &b4);
    TU_CHECK(b1 > b3 && b3 > b4 && b4 == u1 && u2 > u1,
             "planned bytes: uniform 1 %zu, 2 %zu; block 1 %zu, 3 %zu, 4 %zu", u1, u2, b1, b3, b4);
}

/* one rank of a tp x pp x dp layout (dp = world / (tp pp); ep inside dp) */
typedef struct {
    sl_comm *world;
    int tp, pp, ep, sp, llama, recompute, rc_layers, zb; /* llama 2: the MoE model */
    float capacity;                                      /* MoE capacity factor (0: dropless) */
    float loss[STEPS];
    double load[STEPS][8], dropped[STEPS]; /* MoE: per-step expert loads and dropped fraction */
    float *params;                         /* this rank's parameters */
    int64_t numel;
    size_t planned, scratch;
    sl_status st;
} rank_job;

static sl_status prepare(tu_layout_rank *R, void *u) {
    const rank_job *j = u;
    R->m->sp = j->sp;
    R->m->moe.capacity_factor = j->capacity;
    if (!j->llama) R->m->attention_dropout = R->m->hidden_dropout = 0.2f;
    return SL_OK;
}

static void *run_rank(void *arg) {
    rank_job *j = arg;
    tu_layout_spec s = {
        .world = j->world,
        .tp = j->tp,
        .pp = j->pp,
        .ep = j->ep,
        .gpt2 = j->llama ? NULL : &CFG,
        .llama = j->llama == 2 ? &MCFG : &LCFG,
        .seed = 5,
        .tc = tcfg(j->recompute, j->rc_layers),
        .dp = {.zero_stage = 1, .bucket_elems = 3000, .accum = 2, .ready = sl_trainer_dp_ready},
        .steps = STEPS,
        .data = tu_layout_synth,
        .data_user = &TOK,
        .losses = j->loss,
        /* read after the step from the routing nodes, as metrics.jsonl's */
        .moe_load = j->llama == 2 ? &j->load[0][0] : NULL,
        .moe_dropped = j->llama == 2 ? j->dropped : NULL,
        .planned = &j->planned,
        .scratch = &j->scratch,
        .params = &j->params,
        .numel = &j->numel,
        .user = j,
        .prepare = prepare};
    s.tc.pipe_schedule = j->zb ? SL_PIPE_ZB_H1 : SL_PIPE_1F1B;
    j->st = tu_layout_run_rank(&s);
    return NULL;
}

typedef struct {
    int world, tp, pp, ep, sp, llama, zb;
    float capacity;
    int block; /* > 0: the block method on this many layers per stage (else uniform, 1) */
} layout;

static void run_layout(layout L, int recompute, rank_job *jobs) {
    for (int r = 0; r < L.world; r++)
        jobs[r] = (rank_job){.tp = L.tp,
                             .pp = L.pp,
                             .ep = L.ep,
                             .sp = L.sp,
                             .llama = L.llama,
                             .zb = L.zb,
                             .capacity = L.capacity,
                             .recompute = !recompute ? SL_RECOMPUTE_NONE
                                          : L.block  ? SL_RECOMPUTE_BLOCK
                                                     : SL_RECOMPUTE_UNIFORM,
                             .rc_layers = L.block};
    TU_LAYOUT_THREADS(L.world, run_rank, jobs);
}

/* two runs of a layout on every rank: losses, parameters and MoE statistics bitwise */
static void check_bitwise(const char *what, const char *how, const rank_job *a, const rank_job *b,
                          int world) {
    for (int r = 0; r < world; r++) {
        TU_CHECK(a[r].st == SL_OK && b[r].st == SL_OK, "%s rank %d: %s / %s (%s)", what, r,
                 sl_status_name(a[r].st), sl_status_name(b[r].st), sl_errmsg());
        if (a[r].st != SL_OK || b[r].st != SL_OK) continue;
        TU_CHECK(memcmp(a[r].loss, b[r].loss, sizeof a[r].loss) == 0, "%s rank %d: losses differ %s", what, r,
                 how);
        TU_CHECK(a[r].numel == b[r].numel &&
                     memcmp(a[r].params, b[r].params, sizeof(float) * (size_t)a[r].numel) == 0,
                 "%s rank %d: final weights differ %s", what, r, how);
        TU_CHECK(memcmp(a[r].load, b[r].load, sizeof a[r].load) == 0 &&
                     memcmp(a[r].dropped, b[r].dropped, sizeof a[r].dropped) == 0,
                 "%s rank %d: MoE loads or dropped fractions differ %s", what, r, how);
    }
}

/* Note [Shared scratch] (src/graph/graph.c): a recomputing pipeline's first stage, two micro-batches in
 * flight, plans its slots' transient storages in one shared region; the run is bitwise the one with a
 * whole arena per slot (SUANLI_PLAN_SCRATCH=0), in less memory */
static void check_scratch(const char *what, layout L, const rank_job *b) {
    rank_job c[8];
    setenv("SUANLI_PLAN_SCRATCH", "0", 1);
    run_layout(L, 1, c);
    unsetenv("SUANLI_PLAN_SCRATCH");
    check_bitwise(what, "with and without the shared scratch", b, c, L.world);
    TU_CHECK(b[0].scratch > 0 && c[0].scratch == 0 && b[0].planned < c[0].planned,
             "%s: rank 0 scratch %zu of %zu planned, %zu without", what, b[0].scratch, b[0].planned,
             c[0].planned);
    printf("%s: rank 0 recomputing with a shared scratch %.1f KiB (of which %.1f scratch), %.1f KiB without; "
           "bitwise\n",
           what, b[0].planned / 1024.0, b[0].scratch / 1024.0, c[0].planned / 1024.0);
    for (int r = 0; r < L.world; r++) free(c[r].params);
}

/* every rank of the layout with recomputation: its losses, its parameters (and MoE statistics) bitwise the
 * run without */
static void compare_layout(layout L) {
    rank_job a[8], b[8];
    run_layout(L, 0, a);
    run_layout(L, 1, b);
    char what[128];
    snprintf(what, sizeof what, "%s tp %d%s pp %d%s%s dp %d ep %d%s",
             L.llama == 2 ? "qwen2-moe"
             : L.llama    ? "llama"
                          : "gpt2",
             L.tp, L.sp ? " (sp)" : "", L.pp, L.zb ? " (ZB-H1)" : "", L.block ? " (block 1)" : "",
             L.world / (L.tp * L.pp), L.ep > 1 ? L.ep : 1,
             L.llama != 2     ? ""
             : L.capacity > 0 ? ", capacity 1.0"
                              : ", dropless");
    check_bitwise(what, "with and without recomputation", a, b, L.world);
    for (int r = 0; r < L.world; r++) {
        if (a[r].st != SL_OK || b[r].st != SL_OK) continue;
        /* ZB-H1 defers the weight gradients (Note [Splitting the backward]): the copies they read live
         * until then, so the last stage saves nothing; the first still does. The last stage's two slots
         * may or may not share a scratch region (Note [Shared scratch], src/graph/graph.c: whichever plan
         * is smaller), so there the two plans may differ by that choice: 448 B of 398 KiB measured, 1 %
         * allowed */
        TU_CHECK(b[r].planned < a[r].planned ||
                     (L.zb && r > 0 && (double)b[r].planned <= 1.01 * (double)a[r].planned),
                 "%s rank %d: planned %zu with recomputation, %zu without", what, r, b[r].planned,
                 a[r].planned);
        if (r == 0)
            printf("%s: rank 0 planned activations %.1f -> %.1f KiB (%.2fx); every rank bitwise\n", what,
                   a[r].planned / 1024.0, b[r].planned / 1024.0, (double)b[r].planned / (double)a[r].planned);
    }
    /* the statistics compared are real: tokens routed, and dropped exactly when a capacity is set (not
     * recorded under a pipeline: tu_layout_spec) */
    if (L.llama == 2 && L.pp == 1 && a[0].st == SL_OK) {
        double routed = 0, dropped = 0;
        for (int s = 0; s < STEPS; s++) dropped += a[0].dropped[s];
        for (int e = 0; e < 8; e++) routed += a[0].load[STEPS - 1][e];
        TU_CHECK(routed > 0 && (L.capacity > 0) == (dropped > 0), "%s: loads %g, dropped %g", what, routed,
                 dropped);
    }
    /* (block 1 recomputes one layer of two: most of a slot is kept, and the pipeline keeps one arena each) */
    if (L.pp > 1 && !L.block && b[0].st == SL_OK) check_scratch(what, L, b);
    for (int r = 0; r < L.world; r++) {
        free(a[r].params);
        free(b[r].params);
    }
}

int main(void) {
    compare(0, SL_F32);
    compare(1, SL_F32);
    compare(0, SL_BF16);
    compare(1, SL_BF16);
    methods();
    compare_layout((layout){.world = 2, .tp = 2, .pp = 1});
    compare_layout((layout){.world = 2, .tp = 2, .pp = 1, .sp = 1});
    compare_layout((layout){.world = 2, .tp = 1, .pp = 2});
    compare_layout((layout){.world = 2, .tp = 1, .pp = 2, .zb = 1});
    compare_layout((layout){.world = 2, .tp = 1, .pp = 2, .block = 1});
    compare_layout((layout){.world = 2, .tp = 2, .pp = 1, .llama = 1});
    compare_layout((layout){.world = 2, .tp = 1, .pp = 2, .llama = 1});
    compare_layout((layout){.world = 8, .tp = 2, .pp = 2});
    compare_layout((layout){.world = 1, .tp = 1, .pp = 1, .llama = 2});
    compare_layout((layout){.world = 1, .tp = 1, .pp = 1, .llama = 2, .capacity = 1.0f});
    compare_layout((layout){.world = 2, .tp = 1, .pp = 1, .ep = 2, .llama = 2});
    compare_layout((layout){.world = 2, .tp = 1, .pp = 1, .ep = 2, .llama = 2, .capacity = 1.0f});
    compare_layout((layout){.world = 4, .tp = 1, .pp = 2, .ep = 2, .llama = 2});
    return tu_finish("test_recompute");
}
