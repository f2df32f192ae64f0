/* Micro-batch lanes (Note [Micro-batch lanes], src/train/lanes.c; `suanli train --micro-batch-lanes L`): a
 * micro-batch's rows split over L graphs run side by side. Oracles:
 * - the thread count: lanes at 1 thread (one after the other), 2 threads (side by side) and 4 (two kernel
 *   threads per lane, nested) must give the same bits, every step's loss and the final weights (the trainer
 *   may switch thread counts at any step: Note [Threads on a shared machine]);
 * - the run without lanes (one graph over all B rows): lanes change only how the sums over the rows are
 *   grouped (per lane, then added), as data parallelism does, so they are held at the DP bars: each step's
 *   loss within 1e-6 relative, the final weights within 1e-5. Dropout is on (p = 0.2, attention and hidden),
 *   so a lane that drew other masks than the single graph's rows would be ~1e-2 off (measured by a mutation
 *   check: lanes without their row offsets, 1.8e-3 to 3.0e-3 worst);
 * - bf16 autocast rounds each weight gradient once per backward pass, so a lane run is the one-graph run of
 *   micro-batch B / L with L times the accumulation (the same rows per pass), up to the order of fp32 sums;
 *   the half types turn that into a drift, so the bar there is issue 19's (see half() below).
 * GPT-2 and a GQA Llama with q/k/v biases, two micro-batches per step, 2 and 4 lanes.
 * - Data parallelism (threads as ranks, loopback): dp 2 x 2 lanes against dp 2 with one graph, ZeRO-0 and
 *   ZeRO-1, dropout on, at the same DP bars, every rank's weights equal; and against the single process with
 *   the same global batch. Mutations fail it: the lanes' sum after the buckets' reduction (each rank then
 *   adds its unreduced lanes) 1.2e-2 / 9.3e-3 loss relative (ZeRO-0 / ZeRO-1), the ranks' weights apart;
 *   ZeRO-1 without waiting for the parameter all-gathers before the lanes run, 8.2e-3.
 * Bad input: lanes that do not divide the micro-batch, out of range, on a MoE model are SL_ERR_INVALID naming
 * the flag at init; with ZeRO-2 at the first step (the CLI refuses it with exit 2 before the run). */
#include <math.h>
#include <string.h>

#include "layout_harness.h"
#include "testutil.h"

enum { STEPS = 8, B = 4, T = 16, V = 64 };
static const sl_gpt2_config CFG = {2, 2, 32, V, T};
static const sl_llama_config LCFG = {.arch = SL_ARCH_LLAMA, TU_TINY_LLAMA(2), .qkv_bias = 1};

typedef struct {
    float loss[STEPS], val;
    float *params;
    int64_t numel;
    size_t planned;
} run_out;

typedef struct {
    int llama, lanes, threads, b, accum;
    sl_dtype dt;
    int no_dropout; /* runs of another micro-batch size draw other masks (other streams and rows) */
} run_spec;

/* the data: micro-batch `micro` of step s as B rows (a run of micro-batch B / 2 reads each half) */
static sl_status data(void *user, int64_t step, int micro, int32_t *ids, int32_t *tg) {
    const run_spec *sp = user;
    static tu_layout_tokens tok = {B, T, V};
    int32_t full_ids[B * T], full_tg[B * T];
    int per = B / sp->b, m = micro / per, part = micro % per; /* which B-row batch and which part of it */
    SL_TRY(tu_layout_synth(&tok, step, m, full_ids, full_tg));
    memcpy(ids, full_ids + part * sp->b * T, sizeof(int32_t) * (size_t)(sp->b * T));
    memcpy(tg, full_tg + part * sp->b * T, sizeof(int32_t) * (size_t)(sp->b * T));
    return SL_OK;
}

/* the runs' trainer: b rows per micro-batch, accum micro-batches per step and rank, dp ranks */
static sl_trainer_config lanes_tc(int b, int accum, int lanes, int dp) {
    sl_trainer_config tc = tu_layout_tc(b, T, accum, dp, 2, STEPS);
    tc.dropout_seed = 42;
    tc.lanes = lanes;
    return tc;
}

static void run(const run_spec *sp, run_out *r) {
    sl_model *m = NULL;
    TU_CHECK((sp->llama ? sl_llama_new(&LCFG, &m) : sl_gpt2_new(&CFG, &m)) == SL_OK, "model: %s",
             sl_errmsg());
    sl_model_init_weights(m, 5);
    m->compute_dtype = sp->dt;
    m->attention_dropout = m->hidden_dropout = sp->no_dropout ? 0.0f : 0.2f;
    sl_trainer_config tc = lanes_tc(sp->b, sp->accum, sp->lanes, 1);
    if (sp->dt == SL_F16) /* dynamic loss scaling from 2^16: every lane's seed carries the scale */
        tc.loss_scale =
            (sl_loss_scale_config){.initial = 65536.0f, .min_scale = 1.0f, .window = 4, .hysteresis = 2};
    int old = sl_threads_get();
    sl_threads_set(sp->threads);
    sl_trainer tr;
    TU_CHECK(sl_trainer_init(&tr, m, &tc) == SL_OK, "trainer: %s", sl_errmsg());
    r->planned = tr.plan.planned_bytes;
    for (int s = 0; s < STEPS; s++) {
        sl_step_stats ss;
        TU_CHECK(sl_trainer_step(&tr, s, data, (void *)sp, &ss) == SL_OK, "step %d: %s", s, sl_errmsg());
        r->loss[s] = ss.loss;
    }
    TU_CHECK(sl_trainer_eval(&tr, data, (void *)sp, 2, &r->val) == SL_OK, "eval: %s", sl_errmsg());
    r->numel = m->numel;
    r->params = malloc(sizeof(float) * (size_t)m->numel);
    TU_CHECK(r->params != NULL, "oom");
    memcpy(r->params, m->params_mem, sizeof(float) * (size_t)m->numel);
    sl_trainer_free(&tr);
    sl_model_free(m);
    sl_threads_set(old);
}

static int bitwise(const run_out *a, const run_out *b) {
    return !memcmp(a->loss, b->loss, sizeof a->loss) && !memcmp(&a->val, &b->val, sizeof a->val) &&
           a->numel == b->numel && !memcmp(a->params, b->params, sizeof(float) * (size_t)a->numel);
}

/* worst per-step relative loss difference and worst weight difference of b against a */
static void diffs(const run_out *a, const run_out *b, double *loss, double *w) {
    *loss = fabs((double)a->val - b->val) / fabs((double)a->val);
    for (int s = 0; s < STEPS; s++) {
        double d = fabs((double)a->loss[s] - b->loss[s]) / fabs((double)a->loss[s]);
        if (d > *loss) *loss = d;
    }
    *w = 0;
    for (int64_t i = 0; i < a->numel; i++)
        if (fabs((double)a->params[i] - b->params[i]) > *w) *w = fabs((double)a->params[i] - b->params[i]);
}

/* lanes L at 1, 2 and 4 threads (bitwise; 4 threads and 2 lanes: two kernel threads per lane, nested),
 * against the one-graph run `ref` at the DP bars */
static void check_lanes(const char *what, run_spec sp, const run_out *ref) {
    run_out t1, t2, t4;
    sp.threads = 1;
    run(&sp, &t1);
    sp.threads = 2;
    run(&sp, &t2);
    sp.threads = 4;
    run(&sp, &t4);
    TU_CHECK(bitwise(&t1, &t2) && bitwise(&t1, &t4), "%s, %d lanes: 1, 2 and 4 threads differ", what,
             sp.lanes);
    double dl, dw;
    diffs(ref, &t2, &dl, &dw);
    TU_CHECK(dl <= 1e-6 && dw <= 1e-5, "%s, %d lanes: loss %.3g relative (bar 1e-6), weights %.3g (bar 1e-5)",
             what, sp.lanes, dl, dw);
    printf("%s, %d lanes: 1, 2 and 4 threads bitwise; against one graph: loss %.2g relative, weights %.2g; "
           "planned %.1f KiB (one graph %.1f)\n",
           what, sp.lanes, dl, dw, t2.planned / 1024.0, ref->planned / 1024.0);
    free(t1.params);
    free(t2.params);
    free(t4.params);
}

static void fp32_family(int llama) {
    const char *what = llama ? "llama fp32" : "gpt2 fp32";
    run_spec sp = {.llama = llama, .lanes = 1, .threads = 2, .b = B, .accum = 2, .dt = SL_F32};
    run_out ref;
    run(&sp, &ref);
    sp.lanes = 2;
    check_lanes(what, sp, &ref);
    sp.lanes = 4;
    check_lanes(what, sp, &ref);
    free(ref.params);
}

static double mean_step_diff(const run_out *a, const run_out *b) {
    double d = 0;
    for (int s = 0; s < STEPS; s++) d += fabs((double)a->loss[s] - b->loss[s]);
    return d / STEPS;
}

/* bf16 and fp16 (dynamic loss scaling: every lane's seed carries the scale): lanes are the one-graph run of
 * micro-batch B / 2 with twice the accumulation, up to the order of
 * the fp32 sums of the rounded weight gradients (lane by lane, then added). Measured here: the first 4 steps
 * bitwise, then a bf16 rounding flips and the runs drift (loss 9.9e-6 relative at worst, weights 2.2e-3):
 * as far as any reassociation moves bf16 (micro-batch B accum 2 against B / 2 accum 4, the same samples:
 * 2.9e-5, 9.8e-3). So the bar is issue 19's form: the mean per-step loss difference under 0.5 x the mean
 * |fp32 - bf16| (measured: 1.4e-5 against 7.5e-5, 0.19); step 0 (same weights) bitwise. */
static void half(sl_dtype dt) {
    const char *name = dt == SL_BF16 ? "bf16" : "fp16";
    run_spec small = {.lanes = 1, .threads = 2, .b = B / 2, .accum = 4, .dt = dt, .no_dropout = 1};
    run_spec f32 = {.lanes = 2, .threads = 2, .b = B, .accum = 2, .dt = SL_F32, .no_dropout = 1};
    run_spec sp = {.lanes = 2, .threads = 1, .b = B, .accum = 2, .dt = dt, .no_dropout = 1};
    run_out ref, fp, t1, t2;
    run(&small, &ref);
    run(&f32, &fp);
    run(&sp, &t1);
    sp.threads = 2;
    run(&sp, &t2);
    TU_CHECK(bitwise(&t1, &t2), "gpt2 %s, 2 lanes: 1 and 2 threads differ", name);
    double lanes = mean_step_diff(&ref, &t2), prec = mean_step_diff(&ref, &fp);
    TU_CHECK(memcmp(&ref.loss[0], &t2.loss[0], sizeof(float)) == 0, "%s step 0: lanes %.9g, one graph %.9g",
             name, t2.loss[0], ref.loss[0]);
    TU_CHECK(prec > 1e-6 && lanes < 0.5 * prec,
             "%s: mean per-step loss difference %.3g against one graph, fp32 vs %s %.3g (bar 0.5x)", name,
             lanes, name, prec);
    printf("gpt2 %s, 2 lanes: 1 and 2 threads bitwise; against one graph (micro-batch B/2, accum 4): mean "
           "per-step loss difference %.2g, %.2fx the fp32-%s difference %.2g\n",
           name, lanes, lanes / prec, name, prec);
    free(ref.params);
    free(fp.params);
    free(t1.params);
    free(t2.params);
}

static void bad_input(void) {
    struct {
        int lanes, llama_moe, dp;
        const char *want;
    } cases[] = {{3, 0, 1, "does not divide"}, {17, 0, 1, "1..16"}, {-1, 0, 1, "1..16"}, {2, 1, 1, "MoE"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sl_model *m = NULL;
        sl_llama_config moe = LCFG;
        moe.arch = SL_ARCH_QWEN2_MOE;
        moe.moe_intermediate = 16;
        moe.n_experts = 4;
        moe.n_experts_per_tok = 2;
        TU_CHECK((cases[k].llama_moe ? sl_llama_new(&moe, &m) : sl_gpt2_new(&CFG, &m)) == SL_OK, "model: %s",
                 sl_errmsg());
        sl_trainer_config tc = {
            .B = B, .T = T, .accum = 1, .dp_size = cases[k].dp, .lr = 1e-3f, .lanes = cases[k].lanes};
        sl_trainer tr;
        sl_status st = sl_trainer_init(&tr, m, &tc);
        TU_CHECK(st == SL_ERR_INVALID && strstr(sl_errmsg(), "--micro-batch-lanes") &&
                     strstr(sl_errmsg(), cases[k].want),
                 "lanes %d%s, dp %d: status %s, '%s'", cases[k].lanes, cases[k].llama_moe ? " (MoE)" : "",
                 cases[k].dp, sl_status_name(st), sl_errmsg());
        if (st == SL_OK) sl_trainer_free(&tr);
        sl_model_free(m);
    }
}

/* ---- data parallelism ---- */
typedef struct {
    sl_comm *world;
    int n, lanes, zero, accum;
    float losses[STEPS];
    float *params;
    int64_t numel;
    sl_status st;
    char msg[256];
} dp_job;

static tu_layout_tokens TOK = {B, T, V};

static sl_status dp_dropout(tu_layout_rank *R, void *u) {
    (void)u;
    R->m->attention_dropout = R->m->hidden_dropout = 0.2f;
    return SL_OK;
}

static void *dp_rank(void *arg) {
    dp_job *j = arg;
    tu_layout_spec s = {.world = j->world,
                        .gpt2 = &CFG,
                        .seed = 5,
                        .tc = lanes_tc(B, j->accum, j->lanes, j->n),
                        .dp = {.zero_stage = j->zero, .bucket_elems = 3000, .accum = j->accum},
                        .steps = STEPS,
                        .data = tu_layout_synth,
                        .data_user = &TOK,
                        .losses = j->losses,
                        .params = &j->params,
                        .numel = &j->numel,
                        .prepare = dp_dropout};
    j->st = tu_layout_run_rank(&s);
    if (j->st != SL_OK) snprintf(j->msg, sizeof j->msg, "%s", sl_errmsg());
    return NULL;
}

/* n ranks (1: the single process with accum 2, the global batch of dp 2); rank 0's job, the others' weights
 * checked equal to it */
static dp_job run_dp(int n, int lanes, int zero) {
    dp_job jobs[2];
    for (int r = 0; r < n; r++) jobs[r] = (dp_job){.n = n, .lanes = lanes, .zero = zero, .accum = 3 - n};
    TU_LAYOUT_THREADS(n, dp_rank, jobs);
    for (int r = 1; r < n; r++) {
        TU_CHECK(jobs[r].st != SL_OK ||
                     (jobs[r].params && jobs[0].params &&
                      !memcmp(jobs[r].params, jobs[0].params, sizeof(float) * (size_t)jobs[0].numel)),
                 "dp %d, %d lanes, ZeRO-%d: rank %d's weights differ from rank 0's", n, lanes, zero, r);
        free(jobs[r].params);
    }
    return jobs[0];
}

static void dp_diffs(const dp_job *a, const dp_job *b, double *loss, double *w) {
    *loss = *w = 0;
    for (int s = 0; s < STEPS; s++)
        *loss = fmax(*loss, fabs((double)a->losses[s] - b->losses[s]) / a->losses[s]);
    for (int64_t i = 0; i < a->numel; i++) *w = fmax(*w, fabs((double)a->params[i] - b->params[i]));
}

static void data_parallel(void) {
    int old = sl_threads_get();
    sl_threads_set(2); /* each rank's two lanes side by side (nested under the rank threads) */
    dp_job single = run_dp(1, 1, 0);
    TU_CHECK(single.st == SL_OK, "single: %s", single.msg);
    for (int zero = 0; zero <= 1; zero++) {
        dp_job one = run_dp(2, 1, zero), two = run_dp(2, 2, zero);
        TU_CHECK(one.st == SL_OK && two.st == SL_OK, "dp 2, ZeRO-%d: %s %s", zero, one.msg, two.msg);
        if (one.st == SL_OK && two.st == SL_OK && single.st == SL_OK) {
            double dl, dw, sl, sw;
            dp_diffs(&one, &two, &dl, &dw);
            dp_diffs(&single, &two, &sl, &sw);
            printf("dp 2 x 2 lanes, ZeRO-%d: against dp 2 with one graph: loss %.2g relative, weights %.2g; "
                   "against the single process: loss %.2g, weights %.2g\n",
                   zero, dl, dw, sl, sw);
            TU_CHECK(dl <= 1e-6 && dw <= 1e-5,
                     "dp 2 x 2 lanes, ZeRO-%d: loss %.3g (bar 1e-6), weights %.3g "
                     "(bar 1e-5)",
                     zero, dl, dw);
            TU_CHECK(sl <= 1e-6 && sw <= 1e-5,
                     "dp 2 x 2 lanes, ZeRO-%d against one process: loss %.3g, "
                     "weights %.3g",
                     zero, sl, sw);
        }
        free(one.params);
        free(two.params);
    }
    dp_job z2 = run_dp(2, 2, 2); /* ZeRO-2's gradient shards follow the one graph: refused by name */
    TU_CHECK(z2.st == SL_ERR_INVALID && strstr(z2.msg, "--micro-batch-lanes") && strstr(z2.msg, "ZeRO-2"),
             "dp 2 x 2 lanes with ZeRO-2: %s '%s'", sl_status_name(z2.st), z2.msg);
    free(z2.params);
    free(single.params);
    sl_threads_set(old);
}

int main(void) {
    setenv("SUANLI_COMM_ALGO", "direct", 1); /* rank-ordered reductions, as test_dp */
    data_parallel();
    fp32_family(0);
    fp32_family(1);
    half(SL_BF16);
    half(SL_F16);
    bad_input();
    return tu_finish("test_lanes");
}
