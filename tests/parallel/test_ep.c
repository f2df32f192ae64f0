/* Expert parallelism with threads as ranks (loopback transport): a small Qwen2-MoE (8 experts, top-2, a
 * shared expert) with its experts spread over ep = 2 and 4 ranks, inside data parallelism, with tensor
 * parallelism (with and without sequence parallelism), with pipeline stages and with both (world <= 8),
 * against the single process that runs the same micro-batches one after the other (20 steps of AdamW,
 * fp32, clipping active).
 *
 * Bars (issue 17, item 3): loss within 1e-6 relative at every step, final weights within 1e-5 (max |diff|
 * / max |w| per parameter). What moves: an expert's weight gradient sums the rows of its EP group's
 * micro-batches in one GEMM where the single process accumulates them micro-batch by micro-batch, the
 * gradient reductions run over two groups (DP for the replicated parameters, expert-DP for the experts),
 * and the norm sums the experts over the EP group: reassociations of fp32 sums, ~1e-7 relative each
 * (PyTorch's own CPU-vs-CUDA fp32 spread on such shapes is 1e-6..1e-5). Every forward value is computed
 * as in one process (row-wise GEMMs, the combine in expert order), so the losses agree to a few ulps.
 * With a capacity factor, each rank drops in token order from its own micro-batch exactly as the single
 * process drops from the same micro-batch: the last rank's per-expert loads and dropped fraction equal the
 * single process's last micro-batch's at every step.
 * Also: replicated parameters stay bitwise identical on every rank, each rank holds E / ep experts, and the
 * bad splits are refused naming the flag. */
#include <string.h>

#include "layout_harness.h"
#include "testutil.h"

enum { STEPS = 20, B = 2, T = 16, V = 66, E = 8 };

static const sl_llama_config MCFG = {.arch = SL_ARCH_QWEN2_MOE,
                                     .n_layer = 2,
                                     .n_head = 4,
                                     .n_kv_head = 2,
                                     .head_dim = 8,
                                     .hidden = 32,
                                     .intermediate = 48,
                                     .moe_intermediate = 16,
                                     .shared_intermediate = 24,
                                     .n_experts = E,
                                     .n_experts_per_tok = 2,
                                     .norm_topk_prob = 0,
                                     .vocab_size = V,
                                     .max_seq_len = T,
                                     .rms_eps = 1e-6f,
                                     .rope_theta = 10000.0f,
                                     .qkv_bias = 1};

static tu_layout_tokens TOK = {B, T, V}; /* the batches (tu_layout_synth) */

typedef struct {
    sl_comm *world;
    int ep, tp, pp, sp, accum, zero, bf16;
    float capacity;
    const sl_model *ref; /* the single process's final model (NULL while running it) */
    float losses[STEPS];
    double load[STEPS][E], dropped[STEPS];
    double wdiff, wmax; /* max |w - ref| and max |ref| over this rank's parameters */
    int n_experts_held; /* expert weight matrices of layer 0 */
    float *replicated;  /* the router weight of layer 0, for the bitwise check across ranks */
    int64_t rep_numel;
    sl_model *final; /* the single process keeps its model */
    sl_status st;
} rank_job;

typedef struct {
    rank_job *j;
    const float *mine, *ref;
} run_cmp;
/* a run of a TP shard's elements against the same elements of the full parameter */
static void cmp_run(void *u, int64_t full_off, int64_t local_off, int64_t len) {
    run_cmp *c = u;
    for (int64_t k = 0; k < len; k++) {
        double a = c->mine[local_off + k], b = c->ref[full_off + k];
        if (fabs(a - b) > c->j->wdiff) c->j->wdiff = fabs(a - b);
        if (fabs(b) > c->j->wmax) c->j->wmax = fabs(b);
    }
}

static void compare_params(rank_job *j, const sl_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        const sl_param_info *p = &m->params[i], *q = sl_model_find(j->ref, p->t->name);
        TU_CHECK(q && q->numel == sl_param_full_numel(m, p), "%s: not in the single-process model",
                 p->t->name);
        if (!q) continue;
        run_cmp c = {j, m->params_mem + p->offset, j->ref->params_mem + q->offset};
        sl_param_runs(m, p, 0, p->numel, cmp_run, &c);
        if (!strcmp(p->t->name, "model.layers.0.mlp.gate.weight")) {
            j->replicated = malloc(sizeof(float) * (size_t)p->numel);
            memcpy(j->replicated, m->params_mem + p->offset, sizeof(float) * (size_t)p->numel);
            j->rep_numel = p->numel;
        }
        if (strstr(p->t->name, "layers.0.mlp.experts.") && strstr(p->t->name, "down_proj"))
            j->n_experts_held++;
    }
}

static sl_status prepare(tu_layout_rank *R, void *u) {
    const rank_job *j = u;
    R->m->sp = j->sp;
    R->m->moe.capacity_factor = j->capacity;
    R->m->autocast_bf16 = j->bf16; /* torch.autocast bf16 numerics (Note [bf16 compute] in llama.c) */
    R->m->compute_dtype = j->bf16 ? SL_BF16 : SL_F32;
    return SL_OK;
}

/* the final weights against the single process's, or (the single process) kept */
static sl_status finish(tu_layout_rank *R, void *u) {
    rank_job *j = u;
    if (R->dp) SL_TRY(sl_dp_sync_params(R->dp));
    if (j->ref)
        compare_params(j, R->m);
    else {
        j->final = R->m;
        R->m = NULL;
    }
    return SL_OK;
}

static void *run_rank(void *arg) {
    rank_job *j = arg;
    tu_layout_spec s = {.world = j->world,
                        .tp = j->tp,
                        .pp = j->pp,
                        .ep = j->ep,
                        .llama = &MCFG,
                        .seed = 11,
                        .tc = {.B = B,
                               .T = T,
                               .accum = j->accum,
                               .lr = 3e-3f,
                               .min_lr = 3e-4f,
                               .clip = 0.5f,
                               .warmup = 3,
                               .decay_iters = STEPS,
                               .hp = {0.9f, 0.95f, 1e-8f, 0.1f}},
                        .dp = {.zero_stage = j->zero, .bucket_elems = 3000, .accum = j->accum},
                        .steps = STEPS,
                        .data = tu_layout_synth,
                        .data_user = &TOK,
                        .losses = j->losses,
                        .moe_load = &j->load[0][0],
                        .moe_dropped = j->dropped,
                        .user = j,
                        .prepare = prepare,
                        .finish = finish};
    j->st = tu_layout_run_rank(&s);
    return NULL;
}

/* the single process: the world's micro-batches one after the other */
static rank_job single(int world, float capacity) {
    rank_job ref = {.ep = 1, .accum = world, .capacity = capacity};
    run_rank(&ref);
    TU_CHECK(ref.st == SL_OK, "single process: %s (%s)", sl_status_name(ref.st), sl_errmsg());
    return ref;
}

typedef struct {
    int n, ep, tp, pp, sp, accum, zero;
    float capacity;
} layout;

static void check_layout(const rank_job *ref, layout L) {
    rank_job jobs[8];
    int n = L.n;
    for (int r = 0; r < n; r++)
        jobs[r] = (rank_job){.ep = L.ep,
                             .tp = L.tp,
                             .pp = L.pp,
                             .sp = L.sp,
                             .accum = L.accum > 0 ? L.accum : 1,
                             .zero = L.zero,
                             .capacity = L.capacity,
                             .ref = ref->final};
    TU_LAYOUT_THREADS(n, run_rank, jobs);
    char what[128];
    int tpn = L.tp > 1 ? L.tp : 1, ppn = L.pp > 1 ? L.pp : 1, dpn = n / (tpn * ppn);
    snprintf(what, sizeof what, "ep=%d dp=%d tp=%d%s pp=%d zero=%d%s", L.ep, dpn, tpn, L.sp ? " (SP)" : "",
             ppn, L.zero, L.capacity > 0 ? " capacity 1.0" : "");
    double worst = 0, wd = 0, wmax = 0;
    for (int r = 0; r < n; r++) {
        TU_CHECK(jobs[r].st == SL_OK, "%s rank %d: %s (%s)", what, r, sl_status_name(jobs[r].st),
                 sl_errmsg());
        if (!jobs[r].replicated) continue; /* a later pipeline stage: layer 0 lives on the first */
        TU_CHECK(jobs[r].n_experts_held == E / L.ep, "%s rank %d holds %d experts, expected %d", what, r,
                 jobs[r].n_experts_held, E / L.ep);
        TU_CHECK(!memcmp(jobs[r].replicated, jobs[0].replicated, sizeof(float) * (size_t)jobs[0].rep_numel),
                 "%s: rank %d's router weights differ from rank 0's", what, r);
    }
    for (int r = 0; r < n; r++) {
        for (int s = 0; s < STEPS; s++) {
            TU_CHECK(jobs[r].losses[s] == jobs[0].losses[s], "%s step %d: rank %d's loss differs", what, s,
                     r);
            double e = fabs(jobs[r].losses[s] - ref->losses[s]) / fabs(ref->losses[s]);
            if (e > worst) worst = e;
        }
        if (jobs[r].wdiff > wd) wd = jobs[r].wdiff;
        if (jobs[r].wmax > wmax) wmax = jobs[r].wmax;
    }
    /* the last DP rank ran the single process's last micro-batch of every step: the same routing (the
     * statistics of layouts whose graphs see the whole micro-batch: no pipeline, no sequence split) */
    const rank_job *last = &jobs[n - 1];
    int same = 1, compared = ppn == 1 && !L.sp && jobs[0].accum == 1;
    for (int s = 0; s < STEPS && compared; s++) {
        for (int e = 0; e < E; e++) same &= last->load[s][e] == ref->load[s][e];
        same &= last->dropped[s] == ref->dropped[s];
    }
    printf("%s: worst loss rel err %.2e, final weights %.2e, routing of the last micro-batch %s; dropped "
           "fraction at step %d: %.4f\n",
           what, worst, wd / wmax,
           !compared ? "not compared"
           : same    ? "identical"
                     : "DIFFERS",
           STEPS - 1, last->dropped[STEPS - 1]);
    TU_CHECK(worst <= 1e-6, "%s loss rel err %.3g (bar 1e-6)", what, worst);
    TU_CHECK(wd / wmax <= 1e-5, "%s final weights rel err %.3g (bar 1e-5)", what, wd / wmax);
    TU_CHECK(same, "%s: per-expert loads or dropped fraction differ from the single process", what);
    if (L.capacity > 0) TU_CHECK(last->dropped[STEPS - 1] > 0, "%s: capacity dropped no token", what);
    for (int r = 0; r < n; r++) free(jobs[r].replicated);
}

/* bf16 autocast: ep x dp 2 against the single bf16 process that runs the same micro-batches. Autocast
 * rounds each backward pass's weight gradients to bf16 (as torch.autocast's bf16 matmul does) before they
 * are added in fp32; an expert of an EP group computes its gradient over the group's micro-batches in one
 * pass where the single process rounds per micro-batch, bf16(a + b) against bf16(a) + bf16(b): a bf16
 * rounding of the expert gradients each step, the same size as the bf16 - fp32 difference itself. So the
 * bars are that difference, measured in the same run: the mean per-step |ep - single| loss and the final
 * weights' max |ep - single| stay below the single process's bf16 - fp32 gap (measured here with autocast's
 * rounding points (issue 19): loss 0.35x,
 * weights 0.73x). ep = 1 (plain DP) has no such rounding: in the release build its losses match the single
 * process bitwise and its weights to 1.2e-7; the ASan build vectorizes other fp32 sums, so values cross bf16
 * rounding boundaries elsewhere (measured there: 0.066x the loss gap, 0.03x the weight gap). Its bar is a
 * quarter of the gap. All that with the half experts (half = 1: SUANLI_MOE_HALF_EXPERTS=1). Autocast's
 * default experts are fp32 (Note [Experts under autocast], src/nn/moe.c): no gradient rounding, but DP and
 * EP sum the experts' fp32 gradients in another order than the single process, and bf16 rounding elsewhere
 * turns those ulps into flipped roundings: measured (Zen 4, release) ep 1: 0.265x the loss gap, 0.108x the
 * weight gap; ep 2: 0 and 8e-4x. Bars there: issue 19's multi-step bf16 bar, half the loss gap, and the
 * weight gap. */
static void bf16_layout(const rank_job *f32, int ep, int half) {
    if (half) setenv("SUANLI_MOE_HALF_EXPERTS", "1", 1);
    rank_job b16 = {.ep = 1, .accum = 2, .bf16 = 1};
    run_rank(&b16);
    TU_CHECK(b16.st == SL_OK, "single bf16: %s", sl_errmsg());
    rank_job jobs[2];
    for (int r = 0; r < 2; r++) jobs[r] = (rank_job){.ep = ep, .accum = 1, .bf16 = 1, .ref = b16.final};
    TU_LAYOUT_THREADS(2, run_rank, jobs);
    TU_CHECK(jobs[0].st == SL_OK && jobs[1].st == SL_OK, "ep 2 bf16: %s", sl_errmsg());
    double gap = 0, dev = 0;
    for (int s = 0; s < STEPS; s++) {
        gap += fabs(b16.losses[s] - f32->losses[s]) / STEPS;
        dev += fabs(jobs[0].losses[s] - b16.losses[s]) / STEPS;
    }
    double wd = fmax(jobs[0].wdiff, jobs[1].wdiff) / fmax(jobs[0].wmax, jobs[1].wmax), wgap = 0, wmax = 0;
    const sl_model *a = b16.final, *f = f32->final;
    for (int64_t k = 0; k < a->numel; k++) {
        wgap = fmax(wgap, fabs(a->params_mem[k] - f->params_mem[k]));
        wmax = fmax(wmax, fabs(f->params_mem[k]));
    }
    wgap /= wmax;
    printf("bf16 ep=%d dp=2, %s experts: loss mean |ep - single| %.2e vs |bf16 - fp32| %.2e; final weights "
           "%.2e vs %.2e\n",
           ep, half ? "half" : "fp32", dev, gap, wd, wgap);
    TU_CHECK(gap > 0 && wgap > 0, "bf16 differs from fp32");
    TU_CHECK(!half || ep > 1 || (dev < 0.25 * gap && wd < 0.25 * wgap),
             "bf16 dp=2 without EP: %.3g / %.3g of the gap", dev / gap, wd / wgap);
    TU_CHECK(half || dev < 0.5 * gap, "bf16 ep=%d, fp32 experts: loss deviation %.3g of the gap", ep,
             dev / gap);
    TU_CHECK(dev < gap, "bf16 ep=%d loss deviation %.3g >= the bf16 - fp32 gap %.3g", ep, dev, gap);
    TU_CHECK(wd < wgap, "bf16 ep=%d weight deviation %.3g >= the bf16 - fp32 gap %.3g", ep, wd, wgap);
    for (int r = 0; r < 2; r++) free(jobs[r].replicated);
    sl_model_free(b16.final);
    unsetenv("SUANLI_MOE_HALF_EXPERTS");
}

static void bad_splits(void) {
    sl_model *m = NULL;
    sl_llama_config c = MCFG;
    TU_CHECK(sl_llama_new_par(&c, sl_backend_cpu(), &(sl_model_split){1, 0, 1, 0, 1, 0, 0, 3, 0, 0}, &m) ==
                     SL_ERR_INVALID &&
                 strstr(sl_errmsg(), "--expert-model-parallel-size 3 does not divide the 8 experts"),
             "ep 3: %s", sl_errmsg());
    TU_CHECK(sl_llama_new_par(&c, sl_backend_cpu(), &(sl_model_split){1, 0, 1, 0, 1, 0, 0, 2, 2, 0}, &m) ==
                     SL_ERR_INVALID &&
                 strstr(sl_errmsg(), "--expert-model-parallel-size 2: rank 2 out of range"),
             "ep rank: %s", sl_errmsg());
    c.arch = SL_ARCH_QWEN2;
    TU_CHECK(sl_llama_new_par(&c, sl_backend_cpu(), &(sl_model_split){1, 0, 1, 0, 1, 0, 0, 2, 0, 0}, &m) ==
                     SL_ERR_UNSUPPORTED &&
                 strstr(sl_errmsg(),
                        "--expert-model-parallel-size 2: expert parallelism needs a Mixtral, Qwen2-MoE or"),
             "dense: %s", sl_errmsg());
    TU_CHECK(m == NULL, "a refused split returned a model");
}

int main(void) {
    bad_splits();
    rank_job ref2 = single(2, 0), ref4 = single(4, 0), cap2 = single(2, 1.0f), ref8 = single(8, 0);
    check_layout(&ref2, (layout){.n = 2, .ep = 2});
    check_layout(&ref4, (layout){.n = 4, .ep = 2, .zero = 1});
    check_layout(&ref4, (layout){.n = 4, .ep = 4, .zero = 2});
    check_layout(&cap2, (layout){.n = 2, .ep = 2, .capacity = 1.0f});
    for (int half = 0; half < 2; half++) {
        bf16_layout(&ref2, 1, half);
        bf16_layout(&ref2, 2, half);
    }
    check_layout(&ref4, (layout){.n = 4, .ep = 2, .zero = 3});
    check_layout(&ref4, (layout){.n = 4, .ep = 4, .zero = 3});
    /* with tensor parallelism (experts whole on every TP rank, Note [MoE under TP]) and pipeline stages */
    check_layout(&ref2, (layout){.n = 4, .ep = 1, .tp = 2});
    check_layout(&ref2, (layout){.n = 4, .ep = 2, .tp = 2});
    check_layout(&ref2, (layout){.n = 4, .ep = 2, .tp = 2, .sp = 1, .zero = 1});
    check_layout(&ref4, (layout){.n = 8, .ep = 4, .tp = 2, .zero = 2});
    check_layout(&ref4, (layout){.n = 4, .ep = 2, .pp = 2, .accum = 2});
    check_layout(&ref8, (layout){.n = 8, .ep = 2, .pp = 2, .tp = 2, .accum = 4, .zero = 1});
    sl_model_free(ref2.final);
    sl_model_free(ref4.final);
    sl_model_free(cap2.final);
    sl_model_free(ref8.final);
    printf("expert parallelism: ok\n");
    return tu_finish("test_ep");
}
