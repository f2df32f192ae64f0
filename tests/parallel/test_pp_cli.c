/* Uneven pipeline stages through the CLI and the launcher (Note [Uneven pipeline stages]):
 *  - `--pp 2 --decoder-first-pipeline-num-layers 3` and `--pp 3 --decoder-first-pipeline-num-layers 1
 *    --decoder-last-pipeline-num-layers 1` on a 4-layer GPT-2 reproduce the single-process run: losses
 *    within 1e-6 relative at every step, saved final weights within 1e-5 (the bars of test_pp.c, where
 *    the same splits are measured at <= 1.2e-7 in the loss and 6e-7 in the weights: the stages run the
 *    single process's ops, only the tied embedding's two gradients and the norm's partial sums are
 *    reassociated);
 *  - the stage line reports each split's layers;
 *  - a checkpoint saved on the uneven split at step 8 resumes on the even split and on the mirror split
 *    (1 + 3), under the ZB-H1 schedule and on one process, and steps 9..16 match the uninterrupted single
 * process within the same bars (checkpoints name full tensors, so a split is just another layout);
 *  - pp_comm_mib / dp_comm_mib in metrics.jsonl equal their theory at every step (pp alone, with tp, with dp
 *    under ZeRO-1, dp alone under ZeRO-2);
 *  - bad splits exit 2 with one line naming the flag and the numbers, before anything is written. */
#include <string.h>
#include <sys/stat.h>

#include "suanli/model_io.h"
#include "testutil.h"

static char out[1 << 17];

#define run(...)                                                                                             \
    tu_runf(out, sizeof out, "SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 timeout 300", __VA_ARGS__)

#define TINY                                                                                                 \
    "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 "          \
    "--global-batch-size 8 --eval-interval 0 --eval-iters 1 --threads 1 --lr-decay-iters 16"

static double weights_diff(const char *a, const char *b) {
    sl_model *ma = NULL, *mb = NULL;
    double d = INFINITY;
    if (sl_model_load(a, &ma) == SL_OK && sl_model_load(b, &mb) == SL_OK && ma->numel == mb->numel)
        d = tu_rel_maxdiff(mb->params_mem, ma->params_mem, ma->numel);
    sl_model_free(ma);
    sl_model_free(mb);
    return d;
}

/* steps s0..s1 of dir/name against dir/ref: losses and the final weights */
static void same_as(const char *dir, const char *ref, const char *name, int s0, int s1, int pp, int dp) {
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/%s/metrics.jsonl", dir, ref);
    snprintf(b, sizeof b, "%s/%s/metrics.jsonl", dir, name);
    double worst = 0;
    for (int s = s0; s <= s1; s++) {
        double x = tu_metric_at(a, s, "loss"), y = tu_metric_at(b, s, "loss"), e = fabs(x - y) / fabs(x);
        if (!(e <= worst)) worst = e;
        /* the bytes the pipeline and DP sent are the schedule's and the collectives' counts (Note [Pipeline
         * communication volume], Note [DP communication volume]); metrics.jsonl prints 1e-6 MiB */
        const char *keys[2][2] = {{"pp_comm_mib", "pp_comm_theory_mib"},
                                  {"dp_comm_mib", "dp_comm_theory_mib"}};
        for (int k = 0; k < 2; k++) {
            double got = tu_metric_at(b, s, keys[k][0]), want = tu_metric_at(b, s, keys[k][1]);
            if (!(k ? dp : pp)) {
                TU_CHECK(isnan(got), "%s: no %s without %s", name, keys[k][0], k ? "DP" : "PP");
                continue;
            }
            TU_CHECK(want > 0 && fabs(got - want) <= 2e-6, "%s step %d: %s %.6f, theory %.6f", name, s,
                     keys[k][0], got, want);
        }
    }
    snprintf(a, sizeof a, "%s/%s", dir, ref);
    snprintf(b, sizeof b, "%s/%s", dir, name);
    double wd = weights_diff(a, b);
    printf("%s: steps %d-%d worst loss rel err %.2e, final weights %.2e\n", name, s0, s1, worst, wd);
    TU_CHECK(worst <= 1e-6, "%s: loss rel err %.3g (bar 1e-6)", name, worst);
    TU_CHECK(wd <= 1e-5, "%s: final weights rel err %.3g (bar 1e-5)", name, wd);
}
static void same_as_single(const char *dir, const char *name, int s0, int s1, int pp, int dp) {
    same_as(dir, "single", name, s0, s1, pp, dp);
}

int main(void) {
    const char *cli = tu_cli();
    char dir[512], data[600], p[800];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("ppcli"));
    int rc = tu_prepare_corpus(dir, 20000, data, sizeof data, out, sizeof out);
    TU_CHECK(rc == 0, "prepare: %s", out);
    rc = run("%s train --data-path %s " TINY " --train-iters 16 --save %s/single", cli, data, dir);
    TU_CHECK(rc == 0, "single: %s", out);
    /* dropout (Megatron's flags) under PP: each stage draws its layers' masks from the counters the single
     * process uses (stream = the global micro-batch, site = layer and place, element = index in the full
     * tensor), so pp 2, the interleaved schedule and pp 2 x dp 2 reproduce the single dropout run within the
     * fp32 bars above */
#define DROP " --attention-dropout 0.1 --hidden-dropout 0.1"
    rc = run("%s train --data-path %s " TINY DROP " --train-iters 6 --save %s/d_single", cli, data, dir);
    TU_CHECK(rc == 0, "dropout single: %s", out);
    rc = run("%s train --data-path %s " TINY " --train-iters 6 --save %s/d_none", cli, data, dir);
    TU_CHECK(rc == 0, "no dropout: %s", out);
    snprintf(p, sizeof p, "%s/d_single/metrics.jsonl", dir);
    {
        char q[800];
        snprintf(q, sizeof q, "%s/d_none/metrics.jsonl", dir);
        TU_CHECK(tu_metric_at(p, 1, "loss") != tu_metric_at(q, 1, "loss"), "dropout changes the step-1 loss");
    }
    const char *dl[][3] = {{"d_pp2", "-n 2", "--pp 2"},
                           {"d_vpp", "-n 2", "--pp 2 --num-layers-per-virtual-pipeline-stage 1"},
                           {"d_pp2dp2", "-n 4", "--pp 2 --zero-stage 1"},
                           {"d_zb", "-n 2", "--pp 2 --enable-zero-bubble"}};
    for (int i = 0; i < 4; i++) {
        rc = run("%s run %s -- %s train --data-path %s " TINY DROP " --train-iters 6 %s --save %s/%s", cli,
                 dl[i][1], cli, data, dl[i][2], dir, dl[i][0]);
        TU_CHECK(rc == 0, "%s: %s", dl[i][0], out);
        same_as(dir, "d_single", dl[i][0], 1, 6, 1, i == 2);
    }
#undef DROP
    /* bf16 (autocast numerics): a stage runs the single process's ops, eager-half attention included, so
     * the step-1 loss (same weights, forward only) is bitwise the single process's, and the next steps
     * differ by the reassociations above only */
    rc = run("%s train --data-path %s " TINY " --train-iters 4 --bf16 --save %s/b_single", cli, data, dir);
    TU_CHECK(rc == 0, "bf16 single: %s", out);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --train-iters 4 --bf16 --pp 2 --save %s/b_pp2",
             cli, cli, data, dir);
    TU_CHECK(rc == 0, "bf16 pp 2: %s", out);
    {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/b_single/metrics.jsonl", dir);
        snprintf(b, sizeof b, "%s/b_pp2/metrics.jsonl", dir);
        double l1 = tu_metric_at(a, 1, "loss"), l2 = tu_metric_at(b, 1, "loss");
        TU_CHECK(l1 == l2, "bf16 pp 2 step 1: loss %.8f, single %.8f (want bitwise)", l2, l1);
        for (int s = 2; s <= 4; s++) {
            double x = tu_metric_at(a, s, "loss"), y = tu_metric_at(b, s, "loss");
            TU_CHECK(fabs(x - y) <= 1e-6 * fabs(x), "bf16 pp 2 step %d: %.8f vs %.8f", s, y, x);
        }
    }
    /* uneven splits, uninterrupted */
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --train-iters 16 --pp 2 --decoder-first-pipeline-num-layers 3 --save %s/pp2-3-1",
             cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "stage 0: layers 0-2"), "pp 2, 3 + 1 layers: rc %d %s", rc, out);
    /* one line per stage: 1F1B keeps p - s slots (1 on the last stage) */
    TU_CHECK(strstr(out, "  stage 0: layers 0-2, 2 graph slots") &&
                 strstr(out, "  stage 1: layers 3-3, 1 graph slot,"),
             "pp 2, 3 + 1: the per-stage lines: %s", out);
    same_as_single(dir, "pp2-3-1", 1, 16, 1, 0);
    /* ZB-H1 (Note [Zero-bubble schedule]) on the same split: 1F1B's nodes on the same values, the weight
     * gradients deferred but accumulated in micro-batch order, so the saved weights are bitwise 1F1B's */
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --train-iters 16 --pp 2 --decoder-first-pipeline-num-layers 3 --enable-zero-bubble --save "
             "%s/zb2-3-1",
             cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "ZB-H1") && strstr(out, "2 graph slots"), "zb pp 2, 3 + 1: rc %d %s", rc,
             out);
    TU_CHECK(strstr(out, "  stage 1: layers 3-3, 2 graph slots"),
             "zb: min(m, p) slots on the last stage too: %s", out);
    same_as_single(dir, "zb2-3-1", 1, 16, 1, 0);
    {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/pp2-3-1", dir);
        snprintf(b, sizeof b, "%s/zb2-3-1", dir);
        TU_CHECK(weights_diff(a, b) == 0, "zb pp 2: weights bitwise 1F1B's (rel diff %.3g)",
                 weights_diff(a, b));
    }
    rc = run("%s run -n 3 -- %s train --data-path %s " TINY
             " --train-iters 16 --pp 3 --decoder-first-pipeline-num-layers 1 "
             "--decoder-last-pipeline-num-layers 1 --save %s/pp3-1-2-1",
             cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "pipeline parallel: 3 stages") && strstr(out, "stage 0: layers 0-0"),
             "pp 3, 1 + 2 + 1 layers: rc %d %s", rc, out);
    same_as_single(dir, "pp3-1-2-1", 1, 16, 1, 0);
    /* a checkpoint of the uneven split reshards onto other splits and one process */
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --train-iters 8 --save-interval 8 --pp 2 --decoder-first-pipeline-num-layers 3 --save %s/ck",
             cli, cli, data, dir);
    TU_CHECK(rc == 0, "uneven save: rc %d %s", rc, out);
    const char *to[][2] = {{"2", "--pp 2"},
                           {"2", "--pp 2 --decoder-last-pipeline-num-layers 3"},
                           {"4", "--pp 2 --decoder-last-pipeline-num-layers 3 --tp 2"},
                           {"4", "--pp 2 --decoder-last-pipeline-num-layers 3 --zero-stage 1"},
                           {"2", "--zero-stage 2"},
                           {"2", "--pp 2 --enable-zero-bubble"},
                           {"1", ""}};
    for (int i = 0; i < 7; i++) {
        char name[32];
        snprintf(name, sizeof name, "resume%d", i);
        if (to[i][0][0] == '1')
            rc = run("%s train --data-path %s " TINY " --train-iters 16 --load %s/ck --save %s/%s", cli, data,
                     dir, dir, name);
        else
            rc = run("%s run -n %s -- %s train --data-path %s " TINY " --train-iters 16 %s --load %s/ck "
                     "--save %s/%s",
                     cli, to[i][0], cli, data, to[i][1], dir, dir, name);
        TU_CHECK(rc == 0 && strstr(out, "resumed from"), "resume on '%s': rc %d %s", to[i][1], rc, out);
        same_as_single(dir, name, 9, 16, strstr(to[i][1], "--pp") != NULL,
                       strstr(to[i][1], "--zero") != NULL);
    }
    /* bad splits: exit 2, one line naming the flags and the numbers, nothing written */
    struct {
        int n;
        const char *flags, *msg;
    } bad[] = {
        {2, "--pp 2 --decoder-first-pipeline-num-layers 4",
         "--decoder-first-pipeline-num-layers 4 / --decoder-last-pipeline-num-layers 0: num-layers 4 leaves "
         "0 "
         "layers for 1 other pipeline stages"},
        {3, "--pp 3 --decoder-last-pipeline-num-layers 1", "leaves 3 layers for 2 other pipeline stages"},
        {1, "--decoder-first-pipeline-num-layers 2",
         "--decoder-first-pipeline-num-layers: needs --pipeline-model-parallel-size > 1"},
        {2, "--pp 2 --decoder-first-pipeline-num-layers 1 --num-layers-per-virtual-pipeline-stage 1",
         "--decoder-first-pipeline-num-layers with --num-layers-per-virtual-pipeline-stage is not supported"},
        {2, "--pp 2 --num-layers-per-virtual-pipeline-stage 1 --enable-zero-bubble",
         "--enable-zero-bubble with --num-layers-per-virtual-pipeline-stage is not supported"},
        {1, "--enable-zero-bubble", "--enable-zero-bubble needs --pipeline-model-parallel-size > 1 (got 1)"},
        /* found in sl_trainer_init: the ranks exited 1 (a runtime failure), not 2 */
        {2, "--pp 2 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 2",
         "micro-batches per step (1: --global-batch-size"},
    };
    for (int i = 0; i < 7; i++) {
        if (bad[i].n > 1)
            rc = run("%s run -n %d -- %s train --data-path %s " TINY " --train-iters 2 %s --save %s/bad", cli,
                     bad[i].n, cli, data, bad[i].flags, dir);
        else
            rc = run("%s train --data-path %s " TINY " --train-iters 2 %s --save %s/bad", cli, data,
                     bad[i].flags, dir);
        TU_CHECK(rc != 0 && strstr(out, bad[i].msg), "bad split '%s': rc %d %s", bad[i].flags, rc, out);
        if (bad[i].n == 1) TU_CHECK(rc == 2, "bad split on one process: exit 2, got %d", rc);
        if (bad[i].n > 1) TU_CHECK(strstr(out, "exited with status 2"), "bad split: ranks exit 2: %s", out);
        snprintf(p, sizeof p, "%s/bad", dir);
        TU_CHECK(stat(p, &sb) != 0, "nothing written for '%s'", bad[i].flags);
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_pp_cli");
}
