/* The planner (src/plan) against suanli itself and against the analytic failure model.
 * 1. Memory: for GPT-2 and Llama configurations, single process and DP = 2 / 4 with ZeRO-0..3 (threads as
 *    ranks on loopback), the planner's per-device bytes against the real allocation sizes computed by the
 *    library: 16 B x numel + sl_graph_plan's planned arena (one process), sl_dp_memory_report + planned
 *    arena (DP). Bar: total within 5 %, activations within 5 %.
 * 2. Young/Daly and the simulation: the simulated goodput at Young's interval within 1 % (relative) of
 *    Daly's analytic expectation (unlimited spares, ~20,000 failures); the simulated optimum over a sweep is
 *    within 0.2 goodput points of Daly's interval's and lies within [0.5, 2] x Daly's interval; the
 *    simulation is deterministic in its seed; spares that run out cost waiting time.
 * 3. Cluster files: every malformed or inconsistent field fails with SL_ERR_INVALID naming the field. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/parallel.h"
#include "suanli/plan.h"
#include "suanli/train.h"
#include "plan_cluster.h"
#include "testutil.h"

typedef struct {
    sl_comm *world;
    int llama, zero, accum, B, T;
    int tp, pp;    /* > 1: the rank's part of a tp x pp split (dp 1) */
    int recompute; /* full recomputation (Note [Full recomputation]) */
    int layers;    /* > 0: this many layers instead of the default config's */
    int wide;      /* the Llama with a wider MLP and one kv head (other ratios of F, kv_dim and C) */
    int vocab;     /* > 0: this vocabulary instead of the default config's */
    int first_layers, last_layers; /* the planner's uneven pipeline split (0: even) */
    int sp;                        /* sequence parallelism (tp > 1) */
    int vpp;                       /* > 1: interleaved 1F1B with this many model chunks per stage */
    int64_t bucket;
    double real_total, real_act;
    sl_dp_memory mem;
    int64_t numel;
    sl_status st;
} rank_job;

static const sl_gpt2_config GCFG = {3, 4, 64, 96, 32};
static const sl_llama_config LCFG = {.arch = SL_ARCH_LLAMA,
                                     .n_layer = 2,
                                     .n_head = 4,
                                     .n_kv_head = 2,
                                     .head_dim = 16,
                                     .hidden = 64,
                                     .intermediate = 160,
                                     .vocab_size = 128,
                                     .max_seq_len = 32,
                                     .rms_eps = 1e-5f,
                                     .rope_theta = 10000.0f};

static sl_gpt2_config gcfg(int layers, int vocab) {
    sl_gpt2_config c = GCFG;
    if (layers > 0) c.n_layer = layers;
    if (vocab > 0) c.vocab_size = vocab;
    return c;
}

static sl_llama_config lcfg(int layers, int wide, int vocab) {
    sl_llama_config c = LCFG;
    if (layers > 0) c.n_layer = layers;
    if (wide) c.intermediate = 256, c.n_kv_head = 1;
    if (vocab > 0) c.vocab_size = vocab;
    return c;
}

static sl_plan_model plan_model_v(int llama, int layers, int wide, int vocab) {
    sl_gpt2_config GCFG = gcfg(layers, vocab);
    sl_llama_config LCFG = lcfg(layers, wide, vocab);
    if (llama)
        return (sl_plan_model){"llama",
                               SL_PLAN_LLAMA,
                               LCFG.n_layer,
                               LCFG.hidden,
                               LCFG.n_head,
                               LCFG.n_kv_head,
                               LCFG.head_dim,
                               LCFG.intermediate,
                               LCFG.vocab_size,
                               LCFG.max_seq_len,
                               0,
                               0,
                               0,
                               0,
                               0,
                               0,
                               0};
    return (sl_plan_model){"gpt2",
                           SL_PLAN_GPT2,
                           GCFG.n_layer,
                           GCFG.n_embd,
                           GCFG.n_head,
                           GCFG.n_head,
                           GCFG.n_embd / GCFG.n_head,
                           4 * GCFG.n_embd,
                           GCFG.vocab_size,
                           GCFG.max_seq_len,
                           1,
                           0,
                           0,
                           0,
                           0,
                           0,
                           0};
}

static sl_plan_model plan_model(int llama) { return plan_model_v(llama, 0, 0, 0); }

static sl_status new_model(const rank_job *j, sl_model **m) {
    sl_gpt2_config g = gcfg(j->layers, j->vocab);
    sl_llama_config l = lcfg(j->layers, j->wide, j->vocab);
    return j->llama ? sl_llama_new(&l, m) : sl_gpt2_new(&g, m);
}

static void *run_rank(void *arg) {
    rank_job *j = arg;
    sl_model *m = NULL;
    sl_trainer tr;
    sl_mesh mesh;
    sl_dp *dp = NULL;
    j->st = new_model(j, &m);
    if (j->st != SL_OK) return NULL;
    int n = j->world ? sl_comm_size(j->world) : 1;
    sl_trainer_config tc = {.B = j->B,
                            .T = j->T,
                            .accum = j->accum,
                            .dp_size = n,
                            .lr = 1e-3f,
                            .hp = {0.9f, 0.95f, 1e-8f, 0.1f},
                            .recompute = j->recompute};
    if ((j->st = sl_trainer_init(&tr, m, &tc)) != SL_OK) goto out_model;
    j->numel = m->numel;
    j->real_act = (double)tr.plan.planned_bytes;
    if (!j->world) {
        j->real_total = 16.0 * (double)m->numel + j->real_act; /* params, grads, two AdamW moments, f32 */
        goto out_tr;
    }
    if ((j->st = sl_mesh_init(&mesh, j->world, (sl_mesh_dims){1, 1, 1})) != SL_OK) goto out_tr;
    sl_dp_opts o = {.zero_stage = j->zero, .bucket_elems = j->bucket, .accum = j->accum};
    if ((j->st = sl_dp_new(&dp, &mesh, m, tr.graph, &o)) == SL_OK) {
        sl_dp_memory_report(dp, &j->mem);
        j->real_total = (double)(j->mem.param_bytes + j->mem.slot_bytes + j->mem.grad_bytes +
                                 j->mem.grad_shard_bytes + j->mem.optim_bytes) +
                        j->real_act;
        sl_dp_free(dp);
    }
    sl_mesh_free(&mesh);
out_tr:
    sl_trainer_free(&tr);
out_model:
    sl_model_free(m);
    return NULL;
}

/* Tensor and pipeline parallelism (dp 1): rank 0 (TP rank 0 of the first stage, the stage the planner
 * models) holds its part of the model, 16 B per parameter, and its graph's (or 1F1B slots') planned arena */
static void *run_split_rank(void *arg) {
    rank_job *j = arg;
    sl_model *whole = NULL, *m = NULL;
    sl_tp *tp = NULL;
    sl_mesh mesh;
    sl_trainer tr;
    if ((j->st = sl_mesh_init(&mesh, j->world, (sl_mesh_dims){j->tp, j->pp, 1})) != SL_OK) return NULL;
    j->st = new_model(j, &whole);
    sl_model_split sp = {j->tp,
                         mesh.tp_rank,
                         j->pp,
                         mesh.pp_rank,
                         j->vpp > 1 ? j->vpp : 1,
                         j->first_layers,
                         j->last_layers,
                         1,
                         0,
                         0};
    if (j->st == SL_OK) j->st = sl_model_new_split(whole, sl_backend_cpu(), &sp, &m);
    if (j->st == SL_OK && j->tp > 1) j->st = sl_tp_new(&tp, &mesh);
    if (j->st == SL_OK) m->sp = j->sp;
    if (j->st == SL_OK) {
        sl_trainer_config tc = {.B = j->B,
                                .T = j->T,
                                .accum = j->accum,
                                .dp_size = 1,
                                .lr = 1e-3f,
                                .hp = {0.9f, 0.95f, 1e-8f, 0.1f},
                                .mesh = &mesh,
                                .recompute = j->recompute};
        j->st = sl_trainer_init(&tr, m, &tc);
        if (j->st == SL_OK) {
            j->real_act = (double)tr.plan.planned_bytes;
            j->real_total = 16.0 * (double)m->numel + j->real_act;
            sl_trainer_free(&tr);
        }
    }
    sl_tp_free(tp);
    sl_model_free(m);
    sl_model_free(whole);
    sl_mesh_free(&mesh);
    return NULL;
}

typedef struct {
    int llama, layers, wide, vocab;
} model_v;

static void check_split_memory_v(model_v v, int tp, int pp, int vpp, int accum, int B, int T, int rc,
                                 int sp) {
    int llama = v.llama;
    int n = tp * pp;
    rank_job jobs[4];
    sl_comm *comms[4] = {0};
    pthread_t th[4];
    /* the planner first: the real run splits the layers as it does (a costly LM head moves layers to the
     * first stage: sl_pp_balanced_split) */
    sl_plan_model md = plan_model_v(llama, v.layers, v.wide, v.vocab);
    sl_plan_cluster cl = local_cluster(n);
    sl_plan_job job = {.global_batch = (int64_t)B * accum, .seq_len = T};
    sl_plan_layout l = {
        .dp = 1, .tp = tp, .pp = pp, .ep = 1, .vpp = vpp, .micro_batch = B, .recompute = rc, .sp = sp};
    TU_CHECK(sl_plan_evaluate(&md, &cl, &job, &l) == SL_OK, "evaluate: %s", sl_errmsg());
    TU_CHECK(sl_comm_init_loopback(n, comms, NULL) == SL_OK, "loopback: %s", sl_errmsg());
    for (int r = 0; r < n; r++) {
        jobs[r] = (rank_job){.world = comms[r],
                             .llama = llama,
                             .accum = accum,
                             .B = B,
                             .T = T,
                             .tp = tp,
                             .pp = pp,
                             .recompute = rc,
                             .layers = v.layers,
                             .wide = v.wide,
                             .vocab = v.vocab,
                             .first_layers = l.first_layers,
                             .last_layers = l.last_layers,
                             .sp = sp,
                             .vpp = vpp};
        pthread_create(&th[r], NULL, run_split_rank, &jobs[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) sl_comm_free(comms[r]);
    /* the planner's device is the fullest one: the rank with the most memory */
    rank_job *j = &jobs[0];
    for (int r = 0; r < n; r++) {
        TU_CHECK(jobs[r].st == SL_OK, "split run rank %d: %s", r, sl_status_name(jobs[r].st));
        if (jobs[r].st != SL_OK) return;
        printf("  rank %d: %9.0f B, activations %8.0f\n", r, jobs[r].real_total, jobs[r].real_act);
        if (jobs[r].real_total > j->real_total) j = &jobs[r];
    }
    TU_CHECK(!rc || l.runnable, "%s tp %d pp %d: a recomputing layout is runnable", md.name, tp, pp);
    double et = l.mem.total / j->real_total - 1.0, ea = l.mem.activations / j->real_act - 1.0;
    printf(
        "memory %-5s L%d V%d%s tp %d%s pp %d%s accum %d B %2d T %2d%s: plan %9.0f real %9.0f B (%+.2f%%) | "
        "activations %8.0f vs %8.0f (%+.2f%%)\n",
        md.name, (int)md.n_layer, (int)md.vocab, v.wide ? " wide" : "", tp, sp ? " sp" : "", pp,
        vpp > 1 ? (vpp == 2   ? " vpp 2"
                   : vpp == 3 ? " vpp 3"
                              : " vpp 4")
                : "",
        accum, B, T, rc ? " recompute" : "", l.mem.total, j->real_total, 100 * et, l.mem.activations,
        j->real_act, 100 * ea);
    TU_CHECK(fabs(et) <= 0.05, "%s tp %d pp %d: total memory off by %.2f%%", md.name, tp, pp, 100 * et);
    TU_CHECK(fabs(ea) <= 0.05, "%s tp %d pp %d: activations off by %.2f%%", md.name, tp, pp, 100 * ea);
}

static void check_split_memory_sp(model_v v, int tp, int pp, int accum, int B, int T, int rc, int sp) {
    check_split_memory_v(v, tp, pp, 1, accum, B, T, rc, sp);
}

static void check_split_memory_rc(model_v v, int tp, int pp, int accum, int B, int T, int rc) {
    check_split_memory_sp(v, tp, pp, accum, B, T, rc, 0);
}

static void check_split_memory(int llama, int tp, int pp, int accum, int B, int T) {
    check_split_memory_rc((model_v){llama, 0, 0, 0}, tp, pp, accum, B, T, 0);
}

static void check_memory_rc(int llama, int n, int zero, int accum, int B, int T, int64_t bucket, int rc) {
    rank_job jobs[4];
    sl_comm *comms[4] = {0};
    pthread_t th[4];
    if (n > 1) TU_CHECK(sl_comm_init_loopback(n, comms, NULL) == SL_OK, "loopback: %s", sl_errmsg());
    for (int r = 0; r < n; r++) {
        jobs[r] = (rank_job){.world = comms[r],
                             .llama = llama,
                             .zero = zero,
                             .accum = accum,
                             .B = B,
                             .T = T,
                             .bucket = bucket,
                             .recompute = rc};
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) sl_comm_free(comms[r]);
    rank_job *j = &jobs[0];
    TU_CHECK(j->st == SL_OK, "run: %s", sl_status_name(j->st));
    if (j->st != SL_OK) return;
    sl_plan_model md = plan_model(llama);
    sl_plan_cluster cl = local_cluster(n);
    sl_plan_job job = {.global_batch = (int64_t)B * accum * n, .seq_len = T, .bucket_elems = bucket};
    sl_plan_layout l = {.dp = n, .tp = 1, .pp = 1, .ep = 1, .micro_batch = B, .zero = zero, .recompute = rc};
    TU_CHECK(sl_plan_evaluate(&md, &cl, &job, &l) == SL_OK, "evaluate: %s", sl_errmsg());
    TU_CHECK(!rc || l.runnable, "%s dp %d: a recomputing layout is runnable", md.name, n);
    TU_CHECK(sl_plan_model_params(&md) == j->numel, "%s params: plan %lld, model %lld", md.name,
             (long long)sl_plan_model_params(&md), (long long)j->numel);
    double et = l.mem.total / j->real_total - 1.0, ea = l.mem.activations / j->real_act - 1.0;
    printf("memory %-5s dp %d zero %d accum %d B %d T %2d%s: plan %9.0f real %9.0f B (%+.2f%%) | activations "
           "%8.0f vs %8.0f (%+.2f%%)",
           md.name, n, zero, accum, B, T, rc ? " recompute" : "", l.mem.total, j->real_total, 100 * et,
           l.mem.activations, j->real_act, 100 * ea);
    if (n > 1)
        printf(" | params %.0f/%zu slots %.0f/%zu grads %.0f/%zu shard %.0f/%zu optim %.0f/%zu", l.mem.params,
               j->mem.param_bytes, l.mem.slots, j->mem.slot_bytes, l.mem.grads, j->mem.grad_bytes,
               l.mem.grad_shard, j->mem.grad_shard_bytes, l.mem.optim, j->mem.optim_bytes);
    printf("\n");
    TU_CHECK(fabs(et) <= 0.05, "%s dp %d zero %d: total memory off by %.2f%%", md.name, n, zero, 100 * et);
    TU_CHECK(fabs(ea) <= 0.05, "%s dp %d: activations off by %.2f%%", md.name, n, 100 * ea);
}

static void check_memory(int llama, int n, int zero, int accum, int B, int T, int64_t bucket) {
    check_memory_rc(llama, n, zero, accum, B, T, bucket, 0);
}

static void test_memory(void) {

    /* TP and PP on rank 0: GPT-2 (3 layers) under tp 2, the Llama (2 layers) under tp 2, pp 2, tp 2 x pp 2,
     * one and two micro-batches per step (1F1B keeps min(m, p) in flight on the first stage) */
    check_split_memory(0, 2, 1, 1, 4, 32);
    check_split_memory(0, 2, 1, 1, 16, 32);
    check_split_memory(1, 2, 1, 1, 4, 32);
    check_split_memory(1, 1, 2, 1, 4, 32);
    check_split_memory(1, 1, 2, 2, 4, 32);
    check_split_memory(1, 2, 2, 2, 4, 32);
    /* more TP ranks than kv heads: each kv head on tp / kv ranks (the Llama with one kv head) */
    check_split_memory_rc((model_v){1, 4, 1, 0}, 2, 1, 1, 4, 32, 0);
    check_split_memory_rc((model_v){1, 4, 1, 0}, 4, 1, 1, 4, 32, 0);
    /* full recomputation (Note [Recomputation memory] in src/plan/model.c): 4 layers (2 per stage), GPT-2
     * and two Llamas whose F, kv width and heads differ, tp 1 / 2 / 4 (the Llamas' kv heads split and
     * shared), pp 2 with one and two micro-batches in flight (four micro-batches: still two), tp 2 x pp 2;
     * GPT-2 on 3 stages of one layer with two and three in flight (a middle stage); the per-token scaling
     * at B 16; vocabularies of 32 C, where the LM head's backward is the peak. Two or more slots in flight
     * share a scratch region (Note [Shared scratch], src/graph/graph.c): the planner's per-slot term is
     * checked by the growth from one slot to two and three */
    model_v vs[] = {{0, 4, 0, 0}, {1, 4, 0, 0}, {1, 4, 1, 0}, {0, 8, 0, 2048}, {1, 4, 0, 2048}};
    for (int i = 0; i < 5; i++) {
        for (int tp = 1; tp <= 4; tp *= 2) check_split_memory_rc(vs[i], tp, 1, 1, 4, 32, 1);
        check_split_memory_rc(vs[i], 1, 2, 1, 4, 32, 1);
        check_split_memory_rc(vs[i], 1, 2, 2, 4, 32, 1);
        check_split_memory_rc(vs[i], 2, 2, 2, 4, 32, 1);
        check_split_memory_rc(vs[i], 1, 2, 4, 4, 32, 1);
    }
    check_split_memory_rc((model_v){0, 0, 0, 0}, 1, 3, 2, 4, 32, 1);
    check_split_memory_rc((model_v){0, 0, 0, 0}, 1, 3, 3, 4, 32, 1);
    /* sequence parallelism (Note [Sequence-parallel memory]), with and without recomputation: GPT-2 and
     * the Llama at 8 / 4 layers, vocabularies 2 C and 32 C, tp 2 / 4, tp 2 x pp 2 */
    model_v ss[] = {{0, 8, 0, 128}, {1, 4, 0, 0}, {0, 8, 0, 2048}, {1, 4, 0, 2048}};
    for (int i = 0; i < 4; i++)
        for (int rc = 0; rc <= 1; rc++) {
            check_split_memory_sp(ss[i], 2, 1, 1, 4, 32, rc, 1);
            check_split_memory_sp(ss[i], 4, 1, 1, 4, 32, rc, 1);
            check_split_memory_sp(ss[i], 2, 2, 2, 4, 32, rc, 1);
        }
    check_split_memory_rc((model_v){1, 0, 0, 0}, 2, 1, 1, 16, 32, 1);
    /* interleaved 1F1B */
    for (int rc = 0; rc <= 1; rc++) {
        model_v g8 = {0, 8, 0, 0}, l8 = {1, 8, 0, 0};
        check_split_memory_v(g8, 1, 2, 2, 4, 4, 32, rc, 0);
        check_split_memory_v(g8, 1, 2, 4, 4, 4, 32, rc, 0);
        check_split_memory_v(g8, 1, 2, 2, 8, 4, 32, rc, 0);
        check_split_memory_v(l8, 1, 2, 2, 4, 4, 32, rc, 0);
        check_split_memory_v(g8, 2, 2, 2, 4, 4, 32, rc, 0);
        check_split_memory_v((model_v){0, 8, 0, 2048}, 1, 2, 2, 4, 4, 32, rc, 0);
    }
    for (int llama = 0; llama <= 1; llama++) {
        check_memory(llama, 1, 0, 1, 4, 32, 0);
        check_memory(llama, 1, 0, 1, 16, 32, 0);
        check_memory_rc(llama, 1, 0, 1, 4, 32, 0, 1); /* Note [Full recomputation] */
        check_memory_rc(llama, 1, 0, 1, 16, 32, 0, 1);
        check_memory_rc(llama, 2, 1, 1, 16, 32, 0, 1);
        for (int z = 0; z <= 3; z++) {
            check_memory(llama, 2, z, 1, 4, 32, 5000);
            check_memory(llama, 2, z, 2, 4, 32, 5000);
            check_memory(llama, 4, z, 1, 2, 32, 5000);
        }
        /* every parameter in one bucket: ZeRO-3 gathers it once and holds it (plus the one gradient slot) */
        for (int z = 2; z <= 3; z++) check_memory(llama, 2, z, 1, 4, 32, (int64_t)1 << 30);
    }
}

static void test_failures(void) {
    /* job MTBF 1 h (100 hosts x 100 h), save 60 s, restore 120 s */
    sl_plan_ckpt ck = {.save_sec = 60, .restore_sec = 120, .mtbf_sec = 3600};
    double ty = sl_plan_young_interval(60, 3600), td = sl_plan_daly_interval(60, 3600);
    TU_CHECK(fabs(ty - 657.3) < 0.1, "Young: sqrt(2 * 60 * 3600) = 657.3, got %g", ty);
    TU_CHECK(td > 600 && td < ty, "Daly's interval %.1f: below Young's %.1f minus delta's share", td, ty);
    sl_plan_sim_opts o = {.work_sec = 20000 * 3600.0,
                          .interval_sec = ty,
                          .hosts = 100,
                          .host_mtbf_sec = 360000,
                          .save_sec = 60,
                          .restore_sec = 120,
                          .spares = 1 << 30,
                          .repair_sec = 0,
                          .seed = 7};
    sl_plan_sim_result r, r2;
    TU_CHECK(sl_plan_simulate(&o, &r) == SL_OK, "simulate: %s", sl_errmsg());
    double g = sl_plan_expected_goodput(&ck, ty);
    printf("failures: Young %.1f s, Daly %.1f s; simulated goodput at Young %.4f vs analytic %.4f (%+.3f%%), "
           "%lld failures\n",
           ty, td, r.goodput, g, 100 * (r.goodput / g - 1), (long long)r.failures);
    TU_CHECK(fabs(r.goodput / g - 1) < 0.01, "goodput at Young's interval: simulated %.4f, analytic %.4f",
             r.goodput, g);
    TU_CHECK(r.failures > 10000, "enough failures for the 1%% bar: %lld", (long long)r.failures);
    TU_CHECK(sl_plan_simulate(&o, &r2) == SL_OK && r2.wall_sec == r.wall_sec && r2.failures == r.failures,
             "deterministic in the seed");
    o.seed = 8;
    TU_CHECK(sl_plan_simulate(&o, &r2) == SL_OK && r2.wall_sec != r.wall_sec, "another seed, another run");
    /* the simulated optimum (common random numbers) against Young/Daly */
    double best_tau = 0, best_g = -1, g_daly = 0;
    o.seed = 7;
    o.work_sec = 5000 * 3600.0;
    for (int i = 0; i <= 40; i++) {
        double tau = td * pow(2.0, -2.0 + 4.0 * i / 40.0);
        o.interval_sec = tau;
        sl_plan_simulate(&o, &r);
        if (r.goodput > best_g) best_g = r.goodput, best_tau = tau;
    }
    o.interval_sec = td;
    sl_plan_simulate(&o, &r);
    g_daly = r.goodput;
    printf("failures: simulated optimum %.1f s (%.2fx Daly), goodput %.4f; at Daly's interval %.4f\n",
           best_tau, best_tau / td, best_g, g_daly);
    TU_CHECK(best_g - g_daly < 0.002,
             "Daly's interval within 0.2 points of the simulated optimum: %.4f vs %.4f", g_daly, best_g);
    TU_CHECK(best_tau > 0.5 * td && best_tau < 2 * td, "simulated optimum %.1f s near Daly's %.1f s",
             best_tau, td);
    /* one spare, a week's repair: failures wait for hosts */
    o.spares = 1;
    o.repair_sec = 7 * 86400.0;
    o.work_sec = 500 * 3600.0;
    TU_CHECK(sl_plan_simulate(&o, &r) == SL_OK && r.waits_for_spare > 0 && r.wait_sec > 0,
             "spares run out: %lld waits", (long long)r.waits_for_spare);
    o.interval_sec = 0;
    TU_CHECK(sl_plan_simulate(&o, &r) == SL_ERR_INVALID, "interval 0 is bad input");
}

/* Daly's interval against the optimum of the analytic expectation it approximates (golden-section search on
 * sl_plan_expected_goodput: within 0.2 %; the higher-order terms matter at delta / M = 1/6), its cap at M
 * once delta >= 2 M, and the simulation's edge cases against exact answers */
static double argmax_goodput(const sl_plan_ckpt *c) {
    double a = 1, b = 20 * c->mtbf_sec, r = (sqrt(5.0) - 1) / 2;
    while (b - a > 1e-3) {
        double x1 = b - r * (b - a), x2 = a + r * (b - a);
        if (sl_plan_expected_goodput(c, x1) > sl_plan_expected_goodput(c, x2))
            b = x2;
        else
            a = x1;
    }
    return (a + b) / 2;
}

static void test_failures_exact(void) {
    const double deltas[] = {60, 600};
    for (int i = 0; i < 2; i++) {
        sl_plan_ckpt ck = {.save_sec = deltas[i], .restore_sec = 0, .mtbf_sec = 3600};
        double td = sl_plan_daly_interval(deltas[i], 3600), opt = argmax_goodput(&ck);
        TU_CHECK(fabs(td / opt - 1) < 0.002, "Daly's interval at delta %.0f, M 3600: %.2f s, optimum %.2f s",
                 deltas[i], td, opt);
    }
    TU_CHECK(sl_plan_daly_interval(8000, 3600) == 3600, "delta >= 2 M: tau = M, got %g",
             sl_plan_daly_interval(8000, 3600));
    /* no failures: 3 full segments and a last of 100 s without a save, exactly */
    sl_plan_sim_opts o = {.work_sec = 1000,
                          .interval_sec = 300,
                          .hosts = 4,
                          .host_mtbf_sec = 1e300,
                          .save_sec = 60,
                          .restore_sec = 120,
                          .spares = 0,
                          .seed = 3};
    sl_plan_sim_result r;
    TU_CHECK(sl_plan_simulate(&o, &r) == SL_OK && r.failures == 0 && r.wall_sec == 3 * 360.0 + 100 &&
                 r.checkpoints == 4,
             "no failures: wall %.3f s (want 1180), %lld checkpoints", r.wall_sec, (long long)r.checkpoints);
    /* no spares: every failure (in a segment or a restore) waits for its own host's repair, and the waits are
     * part of the wall time */
    o.host_mtbf_sec = 4 * 3600.0;
    o.work_sec = 100 * 3600.0;
    o.repair_sec = 1800;
    TU_CHECK(sl_plan_simulate(&o, &r) == SL_OK && r.failures > 50 && r.waits_for_spare == r.failures &&
                 fabs(r.wait_sec - 1800.0 * (double)r.failures) < 1e-6 &&
                 r.wall_sec >= o.work_sec + r.wait_sec,
             "no spares: %lld failures, %lld waits, %.0f s waited, wall %.0f s", (long long)r.failures,
             (long long)r.waits_for_spare, r.wait_sec, r.wall_sec);
    /* a restore as long as the job MTBF: failures during restores (restarting it) dominate; Daly's e^{R/M} */
    sl_plan_ckpt ck = {.save_sec = 60, .restore_sec = 3600, .mtbf_sec = 3600};
    o = (sl_plan_sim_opts){.work_sec = 5000 * 3600.0,
                           .interval_sec = 600,
                           .hosts = 10,
                           .host_mtbf_sec = 36000,
                           .save_sec = 60,
                           .restore_sec = 3600,
                           .spares = 1 << 30,
                           .seed = 11};
    double g = sl_plan_expected_goodput(&ck, 600);
    TU_CHECK(sl_plan_simulate(&o, &r) == SL_OK && fabs(r.goodput / g - 1) < 0.02,
             "restore = MTBF: simulated goodput %.4f, analytic %.4f (%lld failures)", r.goodput, g,
             (long long)r.failures);
}

/* the time model's terms against their formulas (Note [Planner time model]) on one host of 4 devices with
 * distinct intra / inter links: FLOPs per token (Kaplan et al. 2020: 6 N + 6 L T C, N the matmul weights
 * with the LM head), the DP all-reduce and ZeRO-1's all-gather, the optimizer's 32 B per parameter, the TP
 * all-reduces (4 per layer, with recomputation too) on the intra link when tp fills the host, the pipeline's
 * 2 m sends; and a ZeRO shard's < dp tail (one bucket of P: P / dp + P % dp) */
static void test_time_terms(void) {
    sl_plan_model g;
    TU_CHECK(sl_plan_model_load("gpt2-124m", &g) == SL_OK, "gpt2-124m: %s", sl_errmsg());
    double L = (double)g.n_layer, C = (double)g.hidden, V = (double)g.vocab, T = 64;
    double f = 6.0 * (12.0 * L * C * C + V * C) + 6.0 * L * T * C;
    TU_CHECK(fabs(sl_plan_flops_per_token(&g, 64) / f - 1) < 1e-12, "FLOPs per token %.6g, want %.6g",
             sl_plan_flops_per_token(&g, 64), f);
    double ai = 2e-6, bi = 4e9, ax = 50e-6, bx = 1e8, bw = 1.5e10;
    sl_plan_cluster cl = local_cluster(4);
    cl.hosts = 2;
    cl.intra = (sl_plan_link){ai, bi};
    cl.inter = (sl_plan_link){ax, bx};
    cl.mem_bytes = 1e12;
    cl.overlap = 0;
    cl.mem_bw_Bps = bw;
    sl_plan_job job = {.global_batch = 16, .seq_len = 64, .bucket_elems = 1LL << 40, .devices = 4};
    double P = (double)sl_plan_model_params(&g), N = 4.0 * P;
    sl_plan_layout z0 = {.dp = 4, .tp = 1, .pp = 1, .micro_batch = 2}, z1 = z0;
    z1.zero = 1;
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job, &z0) == SL_OK && sl_plan_evaluate(&g, &cl, &job, &z1) == SL_OK,
             "dp 4: %s", sl_errmsg());
    double ar = 2.0 * 3.0 / 4.0 * N / bi + 6.0 * ai, ag = 3.0 / 4.0 * N / bi;
    TU_CHECK(fabs(z0.t_dp_comm / ar - 1) < 1e-9, "ZeRO-0 all-reduce %.6f s, formula %.6f s", z0.t_dp_comm,
             ar);
    TU_CHECK(fabs(z1.t_dp_comm / (ar + ag) - 1) < 1e-9,
             "ZeRO-1 all-reduce + all-gather %.6f s, formula %.6f s", z1.t_dp_comm, ar + ag);
    TU_CHECK(fabs(z0.t_optim / (32.0 * P / bw) - 1) < 1e-9, "optimizer %.6f s, formula %.6f s", z0.t_optim,
             32.0 * P / bw);
    double x = 4.0 * 2.0 * T * C, tp_ar = 2.0 * 3.0 * ai + 2.0 * 3.0 / 4.0 * x / bi;
    sl_plan_layout t4 = {.dp = 1, .tp = 4, .pp = 1, .micro_batch = 2}, t4r = t4;
    t4r.recompute = 1;
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job, &t4) == SL_OK && sl_plan_evaluate(&g, &cl, &job, &t4r) == SL_OK,
             "tp 4: %s", sl_errmsg());
    TU_CHECK(fabs(t4.t_tp_comm / (8.0 * L * 4.0 * tp_ar) - 1) < 1e-9, "TP all-reduces %.6f s, formula %.6f s",
             t4.t_tp_comm, 8.0 * L * 4.0 * tp_ar);
    TU_CHECK(fabs(t4r.t_tp_comm / (8.0 * L * 4.0 * tp_ar) - 1) < 1e-9,
             "TP all-reduces with recomputation %.6f s, formula %.6f s (the collectives' outputs are kept)",
             t4r.t_tp_comm, 8.0 * L * 4.0 * tp_ar);
    sl_plan_layout p2 = {.dp = 2, .tp = 1, .pp = 2, .micro_batch = 2};
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job, &p2) == SL_OK, "pp 2: %s", sl_errmsg());
    TU_CHECK(fabs(p2.t_pp_comm / (2.0 * 4.0 * (ai + x / bi)) - 1) < 1e-9, "PP sends %.6g s, formula %.6g s",
             p2.t_pp_comm, 2.0 * 4.0 * (ai + x / bi));
    int64_t Pi = sl_plan_model_params(&g);
    TU_CHECK(Pi % 7 != 0, "test bug: P %% 7 must leave a tail");
    sl_plan_job job7 = {.global_batch = 14, .seq_len = 64, .bucket_elems = 1LL << 40, .devices = 7};
    sl_plan_layout d7 = {.dp = 7, .tp = 1, .pp = 1, .micro_batch = 2, .zero = 1};
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job7, &d7) == SL_OK, "dp 7: %s", sl_errmsg());
    TU_CHECK(d7.mem.optim == 8.0 * (double)(Pi / 7 + Pi % 7),
             "ZeRO-1 moments %.0f B, want 8 (P/7 + P%%7) = %.0f B", d7.mem.optim,
             8.0 * (double)(Pi / 7 + Pi % 7));
}

static const char *GOOD =
    "{\"hosts\": 2, \"devices_per_host\": 4, \"device\": {\"peak_TFLOPs\": 100, \"memory_GiB\": 40, "
    "\"mem_bw_GBps\": 1000}, \"links\": {\"intra_host\": {\"alpha_us\": 2, \"beta_GBps\": 100}, "
    "\"inter_host\": {\"alpha_us\": 5, \"beta_GBps\": 25}}, \"reliability\": {\"host_mtbf_hours\": "
    "1000, \"ckpt_write_GBps\": 1, \"ckpt_read_GBps\": 2}}";

static void cluster_case(const char *dir, const char *from, const char *to, const char *field) {
    char path[512], text[2048];
    snprintf(path, sizeof path, "%s/c.json", dir);
    const char *at = from ? strstr(GOOD, from) : NULL;
    if (from && !at) {
        TU_CHECK(0, "test bug: '%s' not in GOOD", from);
        return;
    }
    if (at)
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - GOOD), GOOD, to, at + strlen(from));
    else
        snprintf(text, sizeof text, "%s", GOOD);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    sl_plan_cluster cl;
    sl_status st = sl_plan_cluster_load(path, &cl);
    if (!field) {
        TU_CHECK(st == SL_OK && cl.hosts == 2 && cl.inter.beta_Bps == 25e9, "good file: %s", sl_errmsg());
        return;
    }
    TU_CHECK(st == SL_ERR_INVALID && strstr(sl_errmsg(), field) && !strchr(sl_errmsg(), '\n'),
             "%s -> %s: expected one line naming '%s', got '%s'", from, to, field, sl_errmsg());
}

static void test_cluster_files(void) {
    const char *d = tu_tmpdir("plan-cluster");
    cluster_case(d, NULL, NULL, NULL);
    cluster_case(d, "\"hosts\": 2", "\"hosts\": 0", "hosts");
    cluster_case(d, "\"hosts\": 2", "\"hosts\": 1.5", "hosts");
    cluster_case(d, "\"devices_per_host\": 4, ", "", "devices_per_host");
    cluster_case(d, "\"peak_TFLOPs\": 100", "\"peak_TFLOPs\": \"fast\"", "device.peak_TFLOPs");
    cluster_case(d, "\"memory_GiB\": 40, ", "", "device.memory_GiB");
    cluster_case(d, "\"inter_host\": {\"alpha_us\": 5, \"beta_GBps\": 25}", "\"inter_host\": 3",
                 "links.inter_host");
    cluster_case(d, "\"beta_GBps\": 25", "\"beta_GBps\": 400", "links.inter_host.beta_GBps");
    cluster_case(d, "\"alpha_us\": 2", "\"alpha_us\": -1", "links.intra_host.alpha_us");
    cluster_case(d, "\"host_mtbf_hours\": 1000", "\"host_mtbf_hours\": 0", "reliability.host_mtbf_hours");
    cluster_case(d, "\"beta_GBps\": 25}", "\"beta_GBps\": 25, \"nics_per_host\": 0}",
                 "links.inter_host.nics_per_host");
    cluster_case(d, "\"beta_GBps\": 25}", "\"beta_GBps\": 25, \"nics_per_host\": 1.5}",
                 "links.inter_host.nics_per_host");
    cluster_case(d, "{\"hosts\"", "[{\"hosts\"", "not a JSON object");
    sl_plan_cluster cl;
    TU_CHECK(sl_plan_cluster_load("/nonexistent/c.json", &cl) == SL_ERR_INVALID &&
                 strstr(sl_errmsg(), "/nonexistent/c.json"),
             "missing file named: %s", sl_errmsg());
    sl_plan_model md;
    TU_CHECK(sl_plan_model_load("no-such-model", &md) == SL_ERR_INVALID &&
                 strstr(sl_errmsg(), "no-such-model"),
             "unknown model: %s", sl_errmsg());
    TU_CHECK(sl_plan_model_load("llama-70b", &md) == SL_OK && sl_plan_model_params(&md) > 69e9 &&
                 sl_plan_model_params(&md) < 72e9,
             "llama-70b has ~70.6B parameters: %lld", (long long)sl_plan_model_params(&md));
    TU_CHECK(sl_plan_model_load("gpt2-124m", &md) == SL_OK && sl_plan_model_params(&md) == 124439808,
             "gpt2-124m: %lld", (long long)sl_plan_model_params(&md));
}

/* DP across hosts (Note [Planner DP across hosts]): the planner charges the hierarchical all-reduce suanli
 * runs when the DP group has r > 1 ranks on each of its hosts, a flat ring otherwise, and the flows leaving
 * a host share its NICs. Oracle: the formulas written out here from the algorithm (intra reduce-scatter,
 * inter all-reduce of an N/r shard, intra all-gather), on the links of BENCHMARKS-comm.md's namespace
 * cluster (shm 0.5 us / 7.85 GB/s, 1 Gbit/s TCP 14 us / 0.1194 GB/s, one NIC per host). One bucket, so the
 * latency terms count once; ZeRO-0, no overlap. */
static void test_dp_across_hosts(void) {
    sl_plan_model g;
    sl_plan_model_load("gpt2-124m", &g);
    double N = 4.0 * (double)sl_plan_model_params(&g), ai = 0.5e-6, bi = 7.85e9, ax = 14e-6, bx = 0.1194e9;
    sl_plan_cluster cl = local_cluster(2);
    cl.hosts = 2;
    cl.intra = (sl_plan_link){ai, bi};
    cl.inter = (sl_plan_link){ax, bx};
    cl.nics_per_host = 1;
    cl.mem_bytes = 1e11;
    sl_plan_job job = {.global_batch = 24, .seq_len = 64, .bucket_elems = 1LL << 30};
    sl_plan_layout a = {.dp = 4, .tp = 1, .pp = 1, .micro_batch = 2};
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job, &a) == SL_OK, "dp 4 on 2 x 2: %s", sl_errmsg());
    /* two ranks of a host send their N/2 shards at once through its one NIC: bx / 2 each */
    double hier = 2.0 * 0.5 * N / bi + 2.0 * 0.5 * (N / 2) / (bx / 2) + 2.0 * ai + 2.0 * ax;
    TU_CHECK(a.dp_hier == 1 && a.dp_per_host == 2 && fabs(a.t_dp_comm / hier - 1) < 1e-9,
             "hierarchical all-reduce over 2 hosts x 2: %.6f s, formula %.6f s (hier %d, %lld per host)",
             a.t_dp_comm, hier, a.dp_hier, (long long)a.dp_per_host);
    /* a NIC per device: the shards no longer share one */
    cl.nics_per_host = 2;
    sl_plan_layout b = {.dp = 4, .tp = 1, .pp = 1, .micro_batch = 2};
    double hier2 = 2.0 * 0.5 * N / bi + 2.0 * 0.5 * (N / 2) / bx + 2.0 * ai + 2.0 * ax;
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job, &b) == SL_OK && fabs(b.t_dp_comm / hier2 - 1) < 1e-9,
             "two NICs per host: %.6f s, formula %.6f s", b.t_dp_comm, hier2);
    /* the flat ring that 2 x 2 would take without it: 1.5 N over one crossing per host, 6 latency steps per
     * bucket; measured 52.7 ms against hier's 35.1 ms at 4 MiB (1.50x) */
    cl.nics_per_host = 1;
    double ring = 2.0 * 3.0 / 4.0 * N / bx + 6.0 * ax;
    TU_CHECK(hier / ring > 0.6 && hier / ring < 0.7, "hier / ring on 2 x 2 with one NIC: %.3f (1/1.5)",
             hier / ring);
    /* uneven hosts (3 ranks, 2 per host): suanli's leaders form; the planner keeps the flat ring */
    sl_plan_job job3 = job;
    job3.devices = 3;
    sl_plan_layout c = {.dp = 3, .tp = 1, .pp = 1, .micro_batch = 2};
    double ring3 = 2.0 * 2.0 / 3.0 * N / bx + 4.0 * ax;
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job3, &c) == SL_OK && c.dp_hier == 0 &&
                 fabs(c.t_dp_comm / ring3 - 1) < 1e-9,
             "dp 3 over 2 + 1: flat ring %.6f s, formula %.6f s (hier %d): %s", c.t_dp_comm, ring3, c.dp_hier,
             sl_errmsg());
    /* one DP rank per host (tp fills the host): a ring over the hosts */
    sl_plan_layout e = {.dp = 2, .tp = 2, .pp = 1, .micro_batch = 2};
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job, &e) == SL_OK && e.dp_hier == 0 && e.dp_per_host == 1,
             "tp 2 fills the host: no hierarchy (%d, %lld)", e.dp_hier, (long long)e.dp_per_host);
    /* ZeRO-3 with every parameter in one bucket gathers it once per step and holds it (Note [ZeRO-3 gather
     * schedule]): the reduce-scatter and all-gather of ZeRO-2, and the whole model gathered in memory;
     * with many buckets, a second gather for backward. Measured on the namespace cluster: ZeRO-3 151.9 ms,
     * ZeRO-2 153.0 ms (docs/PLANNER.md) */
    sl_plan_layout z2 = {.dp = 4, .tp = 1, .pp = 1, .micro_batch = 2, .zero = 2}, z3 = z2, z3m = z2;
    z3.zero = z3m.zero = 3;
    sl_plan_job many = job;
    many.bucket_elems = 1 << 20;
    TU_CHECK(sl_plan_evaluate(&g, &cl, &job, &z2) == SL_OK && sl_plan_evaluate(&g, &cl, &job, &z3) == SL_OK &&
                 sl_plan_evaluate(&g, &cl, &many, &z3m) == SL_OK,
             "ZeRO 2 / 3: %s", sl_errmsg());
    TU_CHECK(fabs(z3.t_dp_comm / z2.t_dp_comm - 1) < 1e-9 && z3m.t_dp_comm > 1.4 * z3.t_dp_comm,
             "ZeRO-3, one bucket: one gather like ZeRO-2 (%.6f vs %.6f s); many buckets two (%.6f s)",
             z3.t_dp_comm, z2.t_dp_comm, z3m.t_dp_comm);
    TU_CHECK(fabs(z3.mem.slots - z2.mem.slots - N) < 1,
             "ZeRO-3, one bucket: the gathered parameters (%.0f B) on top of ZeRO-2's slots (%.0f B): %.0f B",
             N, z2.mem.slots, z3.mem.slots);
}

/* model-only parts: the pipeline bubble formulas and TP/PP memory splits */
static void test_model_only(void) {
    sl_plan_model md;
    sl_plan_model_load("llama-70b", &md);
    sl_plan_cluster cl = local_cluster(8);
    cl.hosts = 64;
    cl.mem_bytes = 80.0 * (1 << 30);
    sl_plan_job job = {.global_batch = 64, .seq_len = 4096};
    sl_plan_layout a = {.dp = 8, .tp = 8, .pp = 8, .micro_batch = 1, .zero = 1};
    TU_CHECK(sl_plan_evaluate(&md, &cl, &job, &a) == SL_OK, "70b 8x8x8: %s", sl_errmsg());
    TU_CHECK(fabs(a.bubble - 7.0 / (8 + 7)) < 1e-12, "1F1B bubble (p-1)/(m+p-1) = 7/15: %g", a.bubble);
    sl_plan_layout b = a;
    b.vpp = 2;
    TU_CHECK(sl_plan_evaluate(&md, &cl, &job, &b) == SL_OK && fabs(b.bubble - 7.0 / (16 + 7)) < 1e-12,
             "interleaved (p-1)/(v m+p-1) = 7/23: %g", b.bubble);
    TU_CHECK(b.step_sec < a.step_sec, "interleaving shortens the step: %g vs %g", b.step_sec, a.step_sec);
    /* the split that balances the LM head: GPT-2 124M on 2 stages, 9 + 3 layers (test_pp.c checks the rule);
     * the pipeline's step is then the first stage's 9 layers, not 6 layers + the head's ~5.4 */
    sl_plan_model g;
    sl_plan_model_load("gpt2-124m", &g);
    sl_plan_cluster c2 = local_cluster(2);
    sl_plan_job gj = {.global_batch = 8, .seq_len = 64};
    sl_plan_layout u = {.dp = 1, .tp = 1, .pp = 2, .micro_batch = 2};
    TU_CHECK(sl_plan_evaluate(&g, &c2, &gj, &u) == SL_OK && u.first_layers == 9 && u.last_layers == 3,
             "124m pp 2: split %lld + %lld", (long long)u.first_layers, (long long)u.last_layers);
    sl_plan_layout w = {.dp = 1, .tp = 1, .pp = 2, .vpp = 2, .micro_batch = 2};
    TU_CHECK(sl_plan_evaluate(&g, &c2, &gj, &w) == SL_OK && w.first_layers == 0 && w.last_layers == 0,
             "interleaving keeps the even split");
    sl_plan_layout c = a;
    c.tp = 3;
    c.dp = 64 * 8 / 24;
    TU_CHECK(sl_plan_evaluate(&md, &cl, &job, &c) == SL_ERR_INVALID, "tp 3 does not divide 64 heads");
    sl_plan_layout *v;
    int n;
    TU_CHECK(sl_plan_enumerate(&md, &cl, &job, &v, &n) == SL_OK && n > 10 && v[0].fits, "enumerate 70b");
    if (n > 0) {
        for (int i = 1; i < n; i++)
            if (v[i].fits && v[i - 1].fits && v[i].step_sec < v[i - 1].step_sec) {
                TU_CHECK(0, "ranked by step time at %d", i);
                break;
            }
        free(v);
    }
}

static void test_probe(void) {
    double gf = 0, bw = 0;
    TU_CHECK(sl_plan_probe(1, &gf, &bw) == SL_OK, "probe: %s", sl_errmsg());
    printf("probe: GEMM %.1f GFLOP/s, copy %.1f GB/s (1 thread)\n", gf / 1e9, bw / 1e9);
    TU_CHECK(gf > 1e9 && gf < 1e13 && bw > 1e9 && bw < 1e13, "probe numbers are plausible: %g FLOP/s, %g B/s",
             gf, bw);
}

int main(void) {
    setenv("SUANLI_COMM_ALGO", "direct", 1);
    sl_threads_set(1);
    test_memory();
    test_failures();
    test_failures_exact();
    test_time_terms();
    test_cluster_files();
    test_model_only();
    test_dp_across_hosts();
    test_probe();
    return tu_finish("test_plan");
}
