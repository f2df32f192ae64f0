/* Checkpoints across (tp, pp, dp, zero) layouts (issue 16, item 6), through the CLI and the launcher:
 *  - saved on one layout at step 8 and resumed on another to step 16, the run matches the uninterrupted
 *    single process: losses within 1e-6 relative at steps 9..16, final weights within 1e-5 (the bars of
 *    test_tp.c / test_pp.c; a resumed run does the same arithmetic as that layout uninterrupted);
 *  - reloaded weights are bitwise the saved ones (a resume that trains no step saves them again);
 *  - kill -9 of one rank of a tp 2 x pp 2 x dp 2 layout under --max-restarts resumes, and the final
 *    weights are bitwise those of the uninterrupted run of the same layout. */
#include <string.h>

#include "suanli/model_io.h"
#include "testutil.h"

static char out[1 << 17];

#define run(...)                                                                                             \
    tu_runf(out, sizeof out, "SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 timeout 300", __VA_ARGS__)

static double weights_diff(const char *a, const char *b) {
    sl_model *ma = NULL, *mb = NULL;
    double d = INFINITY;
    if (sl_model_load(a, &ma) == SL_OK && sl_model_load(b, &mb) == SL_OK && ma->numel == mb->numel)
        d = tu_rel_maxdiff(mb->params_mem, ma->params_mem, ma->numel);
    sl_model_free(ma);
    sl_model_free(mb);
    return d;
}

#define TINY                                                                                                 \
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 "          \
    "--global-batch-size 8 --eval-interval 0 --eval-iters 1 --threads 1 --lr-decay-iters 16"

/* save on layout `from` at step 8, resume on `to` up to 16, and compare with the single process. A layout
 * is a launcher prefix (the CLI itself, or `suanli run -n N -- suanli`) and the train flags. */
typedef struct {
    int n;
    const char *flags;
} layout;

static void prefix(char *buf, size_t cap, const char *cli, int n) {
    if (n > 1)
        snprintf(buf, cap, "%s run -n %d -- %s", cli, n, cli);
    else
        snprintf(buf, cap, "%s", cli);
}

static void across(const char *cli, const char *data, const char *dir, const char *name, layout from,
                   layout to) {
    char a[700], b[700], pf[1200], pt[1200];
    prefix(pf, sizeof pf, cli, from.n);
    prefix(pt, sizeof pt, cli, to.n);
    int rc = run("%s train --data-path %s " TINY " %s --train-iters 8 --save-interval 8 --save %s/%s-a", pf,
                 data, from.flags, dir, name);
    TU_CHECK(rc == 0, "%s: save: %s", name, out);
    rc = run("%s train --data-path %s " TINY " %s --train-iters 16 --load %s/%s-a --save %s/%s-b", pt, data,
             to.flags, dir, name, dir, name);
    TU_CHECK(rc == 0 && strstr(out, "resumed from"), "%s: resume: %s", name, out);
    snprintf(a, sizeof a, "%s/single/metrics.jsonl", dir);
    snprintf(b, sizeof b, "%s/%s-b/metrics.jsonl", dir, name);
    double worst = 0;
    for (int s = 9; s <= 16; s++) {
        double x = tu_metric_at(a, s, "loss"), y = tu_metric_at(b, s, "loss"), e = fabs(x - y) / fabs(x);
        if (!(e <= worst)) worst = e;
    }
    snprintf(a, sizeof a, "%s/single", dir);
    snprintf(b, sizeof b, "%s/%s-b", dir, name);
    double wd = weights_diff(a, b);
    printf("%s: steps 9-16 worst loss rel err %.2e, final weights %.2e\n", name, worst, wd);
    TU_CHECK(worst <= 1e-6, "%s: loss rel err %.3g (bar 1e-6)", name, worst);
    TU_CHECK(wd <= 1e-5, "%s: final weights rel err %.3g (bar 1e-5)", name, wd);
}

int main(void) {
    const char *cli = tu_cli();
    char dir[512], data[600], a[800], b[800];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("parckpt"));
    int rc = tu_prepare_corpus(dir, 20000, data, sizeof data, out, sizeof out);
    TU_CHECK(rc == 0, "prepare: %s", out);
    rc = run("%s train --data-path %s " TINY " --train-iters 16 --save %s/single", cli, data, dir);
    TU_CHECK(rc == 0, "single: %s", out);
    const layout single = {1, ""}, tp2pp2 = {4, "--tp 2 --pp 2"}, pp2dp2 = {4, "--pp 2 --zero-stage 1"},
                 tp2dp2 = {4, "--tp 2 --zero-stage 2"},
                 three_d = {8, "--tp 2 --pp 2 --sequence-parallel --zero-stage 1"}, tp4 = {4, "--tp 4"};
    across(cli, data, dir, "tp2pp2-to-pp2dp2", tp2pp2, pp2dp2);
    across(cli, data, dir, "tp2dp2z2-to-3d", tp2dp2, three_d);
    across(cli, data, dir, "3d-to-single", three_d, single);
    across(cli, data, dir, "single-to-tp4", single, tp4);
    /* reloaded weights are the saved ones, bitwise: resume at step 8 on tp 4 and train no step */
    rc = run("%s run -n 4 -- %s train --data-path %s " TINY
             " --tp 4 --train-iters 8 --load %s/tp2pp2-to-pp2dp2-a "
             "--save %s/reload",
             cli, cli, data, dir, dir);
    TU_CHECK(rc == 0 && strstr(out, "resumed from"), "reload: %s", out);
    snprintf(a, sizeof a, "%s/tp2pp2-to-pp2dp2-a/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/reload/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "weights saved on tp 2 x pp 2, reloaded on tp 4: bitwise equal");
    /* kill -9 of rank 5 (stage 1, dp 0, tp 1) of tp 2 x pp 2 x dp 2 after step 10, checkpoints every 4
     * steps: the step-8 save forced step 4's commit, so the restarted job resumes from step 4 or 8 (disk or
     * in-memory copy, whichever is newer and complete) and ends bitwise where the uninterrupted run does */
    const char *L3 = "--tp 2 --pp 2 --sequence-parallel --zero-stage 1 --train-iters 12 --save-interval 4";
    rc = run("%s run -n 8 -- %s train --data-path %s " TINY " %s --save %s/plain", cli, cli, data, L3, dir);
    TU_CHECK(rc == 0, "3d uninterrupted: %s", out);
    rc = run("env SUANLI_FAULT_KILL_AT_STEP=10 SUANLI_FAULT_RANK=5 %s run -n 8 --max-restarts 1 -- %s train "
             "--data-path %s " TINY " %s --save %s/killed --load %s/killed",
             cli, cli, data, L3, dir, dir);
    TU_CHECK(rc == 0 && strstr(out, "killing myself") && strstr(out, "resumed from"), "3d killed: rc %d %s",
             rc, out);
    snprintf(a, sizeof a, "%s/plain/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/killed/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b),
             "kill -9 under --max-restarts: final weights bitwise the uninterrupted run's");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_par_ckpt");
}
