/* Tensor parallelism with threads as ranks (loopback transport): GPT-2 split tp = 2 and 4 ways against
 * the single-process run with the same batches (20 steps of AdamW, fp32, clipping active).
 *
 * Bars (issue 16, item 5): loss within 1e-6 relative at every step and final weights within 1e-5
 * (max |diff| / max |w|). What moves: the row-parallel GEMMs sum their K range in tp pieces plus an
 * all-reduce, the vocab-parallel loss combines per-shard logsumexps, and the gradient norm sums sharded and
 * replicated parts separately: each a reassociation of fp32 sums, ~1e-7 relative per op (PyTorch's own
 * CPU-vs-CUDA fp32 differences on such shapes are 1e-6..1e-5). The vocabulary (66) is not a multiple of 4,
 * so tp = 4 also checks uneven vocab shards.
 * Also: replicated parameters stay bitwise identical on every TP rank; the per-rank parameter count is the
 * 1/tp formula; the model learns; bad splits are refused with the flag named. */
#include <string.h>

#include "layout_harness.h"
#include "testutil.h"

enum { STEPS = 20, B = 2, T = 16, V = 66 };
static const sl_gpt2_config CFG = {
    .n_layer = 2, .n_head = 4, .n_embd = 32, .vocab_size = V, .max_seq_len = T};

/* a GQA Qwen2 (q/k/v biases) with an untied head: 4 query heads, 2 kv heads */
static const sl_llama_config LCFG = {
    .arch = SL_ARCH_QWEN2, TU_TINY_LLAMA(2), .tie_embeddings = 0, .qkv_bias = 1};

static tu_layout_tokens TOK = {B, T, V}; /* the batches (tu_layout_synth) */

typedef struct {
    sl_comm *world;
    int tp, accum, zero, llama, sp, bf16; /* dp = world / tp */
    size_t act_bytes;                     /* planned activations */
    float losses[STEPS], norms[STEPS];
    float *full; /* final weights, full layout */
    int64_t numel, local_numel;
    sl_status st;
} rank_job;

static sl_status prepare(tu_layout_rank *R, void *u) {
    const rank_job *j = u;
    R->m->sp = j->sp;
    R->m->compute_dtype = j->bf16 ? SL_BF16 : SL_F32;
    return SL_OK;
}

/* the final weights in the full layout (every rank gathers them) */
static sl_status gather_full(tu_layout_rank *R, void *u) {
    rank_job *j = u;
    j->local_numel = R->m->numel;
    j->numel = sl_tp_full_numel(R->m);
    j->full = malloc(sizeof(float) * (size_t)j->numel);
    return sl_tp_gather_full(R->tp, R->m, j->full);
}

static void *run_rank(void *arg) {
    rank_job *j = arg;
    tu_layout_spec s = {.world = j->world,
                        .tp = j->tp,
                        .gpt2 = j->llama ? NULL : &CFG,
                        .llama = &LCFG,
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
                        .grad_norms = j->norms,
                        .planned = &j->act_bytes,
                        .user = j,
                        .prepare = prepare,
                        .finish = gather_full};
    j->st = tu_layout_run_rank(&s);
    return NULL;
}

static rank_job run_layout_sp(int n, int tp, int accum, int zero, int llama, int sp) {
    rank_job jobs[8];
    for (int r = 0; r < n; r++)
        jobs[r] = (rank_job){.tp = tp, .accum = accum, .zero = zero, .llama = llama, .sp = sp};
    TU_LAYOUT_THREADS(n, run_rank, jobs);
    for (int r = 0; r < n; r++) {
        TU_CHECK(jobs[r].st == SL_OK, "tp=%d rank %d: %s (%s)", tp, r, sl_status_name(jobs[r].st),
                 sl_errmsg());
        if (r > 0) {
            /* every rank gathers the same full model: replicated parameters never drifted apart, and
             * DP replicas agree */
            TU_CHECK(jobs[r].full && jobs[0].full &&
                         memcmp(jobs[r].full, jobs[0].full, sizeof(float) * (size_t)jobs[0].numel) == 0,
                     "tp=%d: rank %d's gathered weights differ from rank 0's", tp, r);
            for (int s = 0; s < STEPS; s++)
                TU_CHECK(jobs[r].losses[s] == jobs[0].losses[s], "tp=%d step %d: rank %d's loss differs", tp,
                         s, r);
            free(jobs[r].full);
        }
    }
    return jobs[0];
}

static rank_job run_layout(int n, int tp, int accum, int zero, int llama) {
    return run_layout_sp(n, tp, accum, zero, llama, 0);
}

/* worst per-step loss rel error and final-weight rel error against the single process */
static void compare(const char *what, const rank_job *z, const rank_job *ref) {
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        double r = fabs(z->losses[s] - ref->losses[s]) / fabs(ref->losses[s]);
        if (r > worst) worst = r;
    }
    double wd = tu_rel_maxdiff(z->full, ref->full, ref->numel);
    printf(
        "%s: worst loss rel err %.2e, final weights %.2e; planned activations %.1f KiB (single %.1f KiB)\n",
        what, worst, wd, z->act_bytes / 1024.0, ref->act_bytes / 1024.0);
    TU_CHECK(worst <= 1e-6, "%s loss rel err %.3g (bar 1e-6)", what, worst);
    TU_CHECK(wd <= 1e-5, "%s final weights rel err %.3g (bar 1e-5)", what, wd);
}

/* sequence parallelism: tp 2 and 4, and tp 2 x dp 2, reproduce the single process; its activations are
 * smaller than plain TP's (the norm/residual regions hold T/tp tokens) */
static void sp_layouts(void) {
    for (int llama = 0; llama <= 1; llama++) {
        rank_job ref = {.world = NULL, .tp = 1, .accum = 2, .llama = llama};
        run_rank(&ref);
        TU_CHECK(ref.st == SL_OK, "single: %s", sl_errmsg());
        const int lay[3][3] = {{2, 2, 2}, {4, 4, 2}, {4, 2, 1}}; /* world, tp, accum */
        for (int li = 0; li < 3; li++) {
            int tp = lay[li][1], world = lay[li][0];

            char what[96];
            snprintf(what, sizeof what, "%s tp=%d dp=%d sequence-parallel", llama ? "qwen2" : "gpt2", tp,
                     world / tp);
            rank_job z = run_layout_sp(world, tp, lay[li][2], 1, llama, 1);
            rank_job t = run_layout_sp(world, tp, lay[li][2], 1, llama, 0);
            if (z.full && t.full) {
                compare(what, &z, &ref);
                TU_CHECK(z.act_bytes < t.act_bytes, "%s: activations %zu < plain TP's %zu", what, z.act_bytes,
                         t.act_bytes);
            }
            free(z.full);
            free(t.full);
        }
        free(ref.full);
    }
}

/* bf16 compute (matmul operands rounded to bf16, fp32 accumulation): tp 2 against the single process's
 * bf16 run. TP only reassociates fp32 sums, but a reassociation that moves a value across a bf16 rounding
 * boundary moves it by 2^-8, and training amplifies such flips to the bf16 noise level: with autocast's
 * rounding points (Note [Half autocast]) PyTorch's own autocast run moves 0.9x its fp32 distance when its
 * master weights move by one fp32 ulp (tests/e2e/test_bf16_train.c, scripts/gen_bf16_parity.py --floor).
 * TP also rounds each rank's partial row-parallel product to bf16 before the sum. So the bar is that floor
 * with the single-process bf16 run as the reference: the mean per-step |tp - single| (both bf16) under
 * 1.25 x the mean |fp32 - single bf16| (measured 0.84x since the TP graphs use the eager-half attention as
 * the single process does, 0.90x before; 0.34x when bf16 rounded GEMM operands only); and the bf16 runs must
 * differ from fp32, so the bar cannot pass vacuously. */
static void bf16_layout(void) {
    rank_job f32 = {.world = NULL, .tp = 1, .accum = 2},
             b16 = {.world = NULL, .tp = 1, .accum = 2, .bf16 = 1};
    run_rank(&f32);
    run_rank(&b16);
    TU_CHECK(f32.st == SL_OK && b16.st == SL_OK, "single bf16: %s", sl_errmsg());
    rank_job jobs[2];
    for (int r = 0; r < 2; r++) jobs[r] = (rank_job){.tp = 2, .accum = 2, .bf16 = 1};
    TU_LAYOUT_THREADS(2, run_rank, jobs);
    TU_CHECK(jobs[0].st == SL_OK && jobs[1].st == SL_OK, "tp2 bf16: %s", sl_errmsg());
    double gap = 0, dev = 0;
    for (int s = 0; s < STEPS; s++) {
        gap += fabs(b16.losses[s] - f32.losses[s]) / STEPS;
        dev += fabs(jobs[0].losses[s] - b16.losses[s]) / STEPS;
    }
    printf("bf16 tp=2: mean |tp - single| %.2e vs mean |bf16 - fp32| %.2e (ratio %.2f, bar 1.25x)\n", dev,
           gap, dev / gap);
    TU_CHECK(gap > 0, "bf16 differs from fp32");
    TU_CHECK(dev < 1.25 * gap, "bf16 tp=2 deviation %.3g >= 1.25 x bf16 gap %.3g", dev, gap);
    for (int r = 0; r < 2; r++) free(jobs[r].full);
    free(f32.full);
    free(b16.full);
}

static void bad_splits(void) {
    sl_model *m = NULL;
    sl_gpt2_config c = CFG;
    TU_CHECK(sl_gpt2_new_tp(&c, sl_backend_cpu(), 3, 0, &m) == SL_ERR_INVALID && !m &&
                 strstr(sl_errmsg(), "--tensor-model-parallel-size 3") && strstr(sl_errmsg(), "heads 4"),
             "heads not divisible by tp: %s", sl_errmsg());
    c.vocab_size = 3;
    c.n_head = 4;
    TU_CHECK(sl_gpt2_new_tp(&c, sl_backend_cpu(), 4, 0, &m) == SL_ERR_INVALID && !m &&
                 strstr(sl_errmsg(), "vocab-size 3"),
             "vocab smaller than tp: %s", sl_errmsg());
    sl_llama_config lc = LCFG;
    lc.n_head = 6;
    lc.n_kv_head = 3;
    TU_CHECK(sl_llama_new_tp(&lc, sl_backend_cpu(), 2, 0, &m) == SL_ERR_INVALID && !m &&
                 strstr(sl_errmsg(), "--tensor-model-parallel-size 2 and num-query-groups (kv heads) 3"),
             "kv heads and tp not dividing each other: %s", sl_errmsg());
}

/* the GQA Qwen2: tp = 2 (kv heads split) and tp 2 x dp 2, same bars */
static void llama_layouts(void) {
    rank_job ref = {.world = NULL, .tp = 1, .accum = 2, .llama = 1};
    run_rank(&ref);
    TU_CHECK(ref.st == SL_OK, "llama single: %s", sl_errmsg());
    TU_CHECK(ref.losses[STEPS - 1] < ref.losses[0] - 0.1f, "the GQA model learns: %g -> %g", ref.losses[0],
             ref.losses[STEPS - 1]);
    /* world, tp, accum per rank: kv heads split (tp 2), tp 2 x dp 2, and tp 4 > 2 kv heads: each kv head
     * replicated on 2 ranks, its gradient summed over them; alone (the TP norm) and x dp 2 (the DP norm,
     * which counts a replicated kv head's sum of squares once: x 2/4 on each of its 4 TP ranks) */
    const int lay[4][3] = {{2, 2, 2}, {4, 2, 1}, {4, 4, 2}, {8, 4, 1}};
    for (int li = 0; li < 4; li++) {
        rank_job z = run_layout(lay[li][0], lay[li][1], lay[li][2], lay[li][0] > lay[li][1], 1);
        if (!z.full) continue;
        double worst = 0, worst_norm = 0;
        for (int s = 0; s < STEPS; s++) {
            double r = fabs(z.losses[s] - ref.losses[s]) / fabs(ref.losses[s]);
            double rn = fabs(z.norms[s] - ref.norms[s]) / fabs(ref.norms[s]);
            if (r > worst) worst = r;
            if (rn > worst_norm) worst_norm = rn;
        }
        TU_CHECK(worst_norm <= 1e-5, "qwen2 world %d tp %d gradient norm rel err %.3g (bar 1e-5)", lay[li][0],
                 lay[li][1], worst_norm);
        double wd = tu_rel_maxdiff(z.full, ref.full, ref.numel);
        printf("qwen2 GQA tp=%d dp=%d: worst loss rel err %.2e, final weights %.2e; %lld of %lld per rank\n",
               lay[li][1], lay[li][0] / lay[li][1], worst, wd, (long long)z.local_numel,
               (long long)ref.numel);
        TU_CHECK(worst <= 1e-6, "qwen2 world %d loss rel err %.3g (bar 1e-6)", lay[li][0], worst);
        TU_CHECK(wd <= 1e-5, "qwen2 world %d final weights rel err %.3g (bar 1e-5)", lay[li][0], wd);
        free(z.full);
    }
    free(ref.full);
}

int main(void) {
    setenv("SUANLI_COMM_ALGO", "direct", 1);
    sl_threads_set(1);
    bad_splits();
    llama_layouts();
    sp_layouts();
    bf16_layout();
    for (int accum = 1; accum <= 2; accum++) {
        rank_job ref = {.world = NULL, .tp = 1, .accum = accum};
        run_rank(&ref);
        TU_CHECK(ref.st == SL_OK, "single: %s", sl_errmsg());
        TU_CHECK(ref.losses[STEPS - 1] < ref.losses[0] - 0.1f, "the model learns: %g -> %g", ref.losses[0],
                 ref.losses[STEPS - 1]);
        for (int tp = 2; tp <= 4; tp *= 2) {
            rank_job z = run_layout(tp, tp, accum, 0, 0);
            if (!z.full) continue;
            double worst = 0, worst_norm = 0;
            for (int s = 0; s < STEPS; s++) {
                double r = fabs(z.losses[s] - ref.losses[s]) / fabs(ref.losses[s]);
                double rn = fabs(z.norms[s] - ref.norms[s]) / fabs(ref.norms[s]);
                if (r > worst) worst = r;
                if (rn > worst_norm) worst_norm = rn;
            }
            double wd = tu_rel_maxdiff(z.full, ref.full, ref.numel);
            printf("tp=%d accum=%d: worst loss rel err %.2e, grad-norm rel err %.2e, final weights %.2e; "
                   "final loss %.6f (single %.6f); %lld of %lld parameters per rank\n",
                   tp, accum, worst, worst_norm, wd, z.losses[STEPS - 1], ref.losses[STEPS - 1],
                   (long long)z.local_numel, (long long)ref.numel);
            TU_CHECK(z.numel == ref.numel, "tp=%d: gathered %lld parameters, want %lld", tp,
                     (long long)z.numel, (long long)ref.numel);
            TU_CHECK(worst <= 1e-6, "tp=%d accum=%d loss rel err %.3g (bar 1e-6)", tp, accum, worst);
            TU_CHECK(worst_norm <= 1e-5, "tp=%d accum=%d gradient norm rel err %.3g (bar 1e-5)", tp, accum,
                     worst_norm);
            TU_CHECK(wd <= 1e-5, "tp=%d accum=%d final weights rel err %.3g (bar 1e-5)", tp, accum, wd);
            /* memory: the split weights are 1/tp (uneven vocab shards: within one row of wte), the
             * replicated ones (norms, wpe, row-parallel biases) are whole on every rank */
            int64_t C = CFG.n_embd, L = CFG.n_layer;
            int64_t repl = (int64_t)T * C + L * 6 * C + 2 * C;
            int64_t split = ref.numel - repl;
            TU_CHECK(llabs(z.local_numel - (repl + split / tp)) <= C,
                     "tp=%d: %lld parameters per rank, want %lld", tp, (long long)z.local_numel,
                     (long long)(repl + split / tp));
            free(z.full);
        }
        if (accum == 2) /* tp 2 x dp 2, one micro-batch per rank: the same global batch */
            for (int zero = 0; zero <= 3; zero += 3) {
                rank_job z = run_layout(4, 2, 1, zero, 0);
                if (!z.full) continue;
                double worst = 0;
                for (int s = 0; s < STEPS; s++) {
                    double r = fabs(z.losses[s] - ref.losses[s]) / fabs(ref.losses[s]);
                    if (r > worst) worst = r;
                }
                double wd = tu_rel_maxdiff(z.full, ref.full, ref.numel);
                printf("tp=2 dp=2 zero=%d: worst loss rel err %.2e, final weights %.2e\n", zero, worst, wd);
                TU_CHECK(worst <= 1e-6, "tp2 dp2 zero%d loss rel err %.3g (bar 1e-6)", zero, worst);
                TU_CHECK(wd <= 1e-5, "tp2 dp2 zero%d final weights rel err %.3g (bar 1e-5)", zero, wd);
                free(z.full);
            }
        free(ref.full);
    }
    return tu_finish("test_tp");
}
