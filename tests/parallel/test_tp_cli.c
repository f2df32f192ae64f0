/* Tensor parallelism through the CLI and the launcher: `suanli run -n 2 -- suanli train --tp 2` and
 * `run -n 4 ... --tp 2` (tp 2 x dp 2) reproduce the single-process run: losses within 1e-6 relative at every
 * step, saved final weights within 1e-5 (the bars and why: tests/parallel/test_tp.c); the per-rank
 * accounting line and the TP communication per step are reported; the gathered model samples; bad TP
 * layouts exit 2 with one line naming the flag, before anything is written. */
#include <string.h>
#include <sys/stat.h>

#include "suanli/model_io.h"
#include "testutil.h"

static char out[1 << 17];

#define run(...)                                                                                             \
    tu_runf(out, sizeof out, "SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 timeout 300", __VA_ARGS__)

static void same_run_as(const char *dir, const char *ref, const char *name, const char *key);
static void same_run(const char *dir, const char *name) { same_run_as(dir, "single", name, "tp_comm_mib"); }
static void same_run_as(const char *dir, const char *ref, const char *name, const char *key) {
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/%s/metrics.jsonl", dir, ref);
    snprintf(b, sizeof b, "%s/%s/metrics.jsonl", dir, name);
    for (int s = 1; s <= 8; s++) {
        double x = tu_metric_at(a, s, "loss"), y = tu_metric_at(b, s, "loss");
        TU_CHECK(fabs(x - y) <= 1e-6 * fabs(x), "%s step %d: single %.7f vs %.7f", name, s, x, y);
        TU_CHECK(tu_metric_at(b, s, key) >= 0, "%s step %d: %s logged", name, s, key);
        /* the collectives the graph ran are Megatron's count (Note [TP communication volume]) */
        double got = tu_metric_at(b, s, "tp_comm_mib"), want = tu_metric_at(b, s, "tp_comm_theory_mib");
        if (!isnan(want))
            TU_CHECK(fabs(got - want) <= 1e-3 * want, "%s step %d: TP communication %.4f MiB, theory %.4f",
                     name, s, got, want);
    }
    snprintf(a, sizeof a, "%s/%s", dir, ref);
    snprintf(b, sizeof b, "%s/%s", dir, name);
    sl_model *ma = NULL, *mb = NULL;
    TU_CHECK(sl_model_load(a, &ma) == SL_OK && sl_model_load(b, &mb) == SL_OK, "load saved: %s", sl_errmsg());
    if (ma && mb) {
        TU_CHECK(ma->numel == mb->numel, "%s: whole model saved (%lld parameters)", name,
                 (long long)mb->numel);
        double d = ma->numel == mb->numel ? tu_rel_maxdiff(mb->params_mem, ma->params_mem, ma->numel) : 1;
        printf("%s: saved weights vs single, max rel diff %.2e\n", name, d);
        TU_CHECK(d <= 1e-5, "%s: final weights rel diff %.3g (bar 1e-5)", name, d);
    }
    sl_model_free(ma);
    sl_model_free(mb);
}

#define TINY                                                                                                 \
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 "          \
    "--global-batch-size 4 --train-iters 8 --eval-interval 4 --eval-iters 1 --threads 1"

int main(void) {
    const char *cli = tu_cli();
    char dir[512], data[600], p[800];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("tpcli"));
    int rc = tu_prepare_corpus(dir, 20000, data, sizeof data, out, sizeof out);
    TU_CHECK(rc == 0, "prepare: %s", out);
    rc = run("%s train --data-path %s " TINY " --save %s/single", cli, data, dir);
    TU_CHECK(rc == 0, "single: %s", out);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --tp 2 --save %s/tp2 --sample-tokens 8", cli,
             cli, data, dir);
    TU_CHECK(rc == 0, "tp2: %s", out);
    TU_CHECK(strstr(out, "tensor parallel: 2 ranks | per rank: params") && strstr(out, "tp comm") &&
                 strstr(out, "---- sample"),
             "tp2 reports accounting, TP comm and samples: %s", out);
    same_run(dir, "tp2");
    rc = run("%s run -n 4 -- %s train --data-path %s " TINY " --tp 2 --zero-stage 1 --save %s/tp2dp2", cli,
             cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "data parallel: 2 ranks") && strstr(out, "tensor parallel: 2 ranks"),
             "tp2 x dp2: %s", out);
    same_run(dir, "tp2dp2");
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --tp 2 --sequence-parallel --save %s/tp2sp",
             cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "tensor parallel: 2 ranks, sequence parallel"), "tp2 + SP: %s", out);
    same_run(dir, "tp2sp");
    /* full recomputation under SP gathers the sequence again in the backward (Note [Full recomputation]):
     * the same run, with the extra all-gathers counted in the theory (same_run checks the volume) */
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --tp 2 --sequence-parallel --recompute-granularity full --save %s/tp2sprc",
             cli, cli, data, dir);
    TU_CHECK(rc == 0, "tp2 + SP + recomputation: %s", out);
    same_run(dir, "tp2sprc");
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --tp 2 --sequence-parallel --recompute-granularity full --recompute-method block "
             "--recompute-num-layers 1 --save %s/tp2sprcb",
             cli, cli, data, dir);
    TU_CHECK(rc == 0, "tp2 + SP + block recomputation of 1 layer: %s", out);
    same_run(dir, "tp2sprcb");
    /* dropout under TP (Note [Dropout from counters]): a rank's attention node draws its heads' masks at
     * their index in the full (B, NH, T, T) probabilities, and under SP a dropout node on a sequence shard
     * at the shard's positions in the full (B, T, C) stream; replicated streams draw the full mask as they
     * are. So tp 2, tp 2 + SP, tp 2 x dp 2 and tp 2 x pp 2 reproduce the single dropout run at the fp32
     * bars (the masks are the same; only sums reassociate) */
#define DROP " --attention-dropout 0.1 --hidden-dropout 0.1"
    rc = run("%s train --data-path %s " TINY DROP " --save %s/d_single", cli, data, dir);
    TU_CHECK(rc == 0, "dropout single: %s", out);
    {
        char q[800];
        snprintf(p, sizeof p, "%s/d_single/metrics.jsonl", dir);
        snprintf(q, sizeof q, "%s/single/metrics.jsonl", dir);
        TU_CHECK(tu_metric_at(p, 1, "loss") != tu_metric_at(q, 1, "loss"), "dropout changes the step-1 loss");
    }
    const char *dl[][3] = {{"d_tp2", "-n 2", "--tp 2"},
                           {"d_tp2sp", "-n 2", "--tp 2 --sequence-parallel"},
                           {"d_tp2dp2", "-n 4", "--tp 2 --zero-stage 1"},
                           {"d_tp2pp2", "-n 4", "--tp 2 --pp 2 --sequence-parallel"}};
    for (int i = 0; i < 4; i++) {
        rc = run("%s run %s -- %s train --data-path %s " TINY DROP " %s --save %s/%s", cli, dl[i][1], cli,
                 data, dl[i][2], dir, dl[i][0]);
        TU_CHECK(rc == 0, "%s: %s", dl[i][0], out);
        same_run_as(dir, "d_single", dl[i][0], "tp_comm_mib");
    }
#undef DROP
    /* pipeline parallelism: 8 micro-batches per step; pp 2, and tp 2 x pp 2 x dp 2 with SP and ZeRO-1 on 8
     * processes */
    rc = run("%s train --data-path %s " TINY " --global-batch-size 16 --save %s/single16", cli, data, dir);
    TU_CHECK(rc == 0, "single16: %s", out);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --global-batch-size 16 --pp 2 --save %s/pp2 "
             "--sample-tokens 8",
             cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "pipeline parallel: 2 stages, 1F1B, 8 micro-batches") &&
                 strstr(out, "bubble (p-1)/(m+p-1) = 0.111") && strstr(out, "---- sample"),
             "pp2: %s", out);
    same_run_as(dir, "single16", "pp2", "pipe_wait_ms");
    rc = run("%s run -n 8 -- %s train --data-path %s " TINY
             " --global-batch-size 16 --tp 2 --pp 2 --sequence-parallel --zero-stage 1 --save %s/3d",
             cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "pipeline parallel: 2 stages") && strstr(out, "data parallel: 2 ranks"),
             "tp2 x pp2 x dp2: %s", out);
    same_run_as(dir, "single16", "3d", "tp_comm_mib");
    /* interleaved 1F1B: 4 layers, 2 stages of 2 model chunks of 1 layer */
    rc = run("%s train --data-path %s " TINY " --num-layers 4 --global-batch-size 16 --save %s/single16L4",
             cli, data, dir);
    TU_CHECK(rc == 0, "single16L4: %s", out);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --num-layers 4 --global-batch-size 16 --pp 2 "
             "--num-layers-per-virtual-pipeline-stage 1 --save %s/ipp2",
             cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "interleaved 1F1B with 2 model chunks per stage of 1 layers") &&
                 strstr(out, "bubble (p-1)/(vm+p-1) = 0.059"),
             "interleaved pp2: %s", out);
    same_run_as(dir, "single16L4", "ipp2", "pipe_wait_ms");
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --pp 2 --num-layers-per-virtual-pipeline-stage 1",
             cli, cli, data);
    TU_CHECK(rc != 0 && strstr(out, "--num-layers-per-virtual-pipeline-stage 1: num-layers 2 is not"),
             "interleaving needs 2+ chunks: rc %d %s", rc, out);
    /* bad layouts: exit 2, the flag and the numbers named, nothing written (each has a --save; tu_watch) */
    tu_watch(dir);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --pp 2 --num-layers 3 --save %s/never", cli,
             cli, data, dir);
    TU_CHECK(rc != 0 && strstr(out, "--pipeline-model-parallel-size 2 does not divide num-layers 3"),
             "layers not divisible by pp: rc %d %s", rc, out);
    TU_CHECK(tu_unchanged(), "bad layout: the run wrote under %s", dir);
    rc = run("%s run -n 4 -- %s train --data-path %s " TINY " --pp 2 --zero-stage 3 --save %s/never", cli,
             cli, data, dir);
    TU_CHECK(rc != 0 && strstr(out, "--zero-stage 3 with --pipeline-model-parallel-size 2 is not supported"),
             "ZeRO-3 with pp: rc %d %s", rc, out);
    TU_CHECK(tu_unchanged(), "bad layout: the run wrote under %s", dir);
    rc = run("%s run -n 6 -- %s train --data-path %s " TINY " --tp 2 --pp 2 --save %s/never", cli, cli, data,
             dir);
    TU_CHECK(rc != 0 && strstr(out, "world size 6 is not divisible by tensor x pipeline parallel size 2 x 2"),
             "world not dp x pp x tp: rc %d %s", rc, out);
    TU_CHECK(tu_unchanged(), "bad layout: the run wrote under %s", dir);
    rc = run("%s train --data-path %s " TINY " --sequence-parallel --save %s/never", cli, data, dir);
    TU_CHECK(rc == 2 && strstr(out, "--sequence-parallel needs --tensor-model-parallel-size > 1"),
             "SP without TP: rc %d %s", rc, out);
    TU_CHECK(tu_unchanged(), "bad layout: the run wrote under %s", dir);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY
             " --tp 2 --sequence-parallel --seq-length 15 --save %s/never",
             cli, cli, data, dir);
    TU_CHECK(rc != 0 && strstr(out, "--seq-length 15 is not divisible by --tensor-model-parallel-size 2"),
             "SP with seq not divisible: rc %d %s", rc, out);
    TU_CHECK(tu_unchanged(), "bad layout: the run wrote under %s", dir);
    rc =
        run("%s run -n 2 -- %s train --data-path %s " TINY " --tp 2 --num-attention-heads 1 --hidden-size 32 "
            "--save %s/bad1",
            cli, cli, data, dir);
    TU_CHECK(rc != 0 && strstr(out, "--tensor-model-parallel-size 2 does not divide num-attention-heads 1"),
             "heads not divisible by tp: rc %d %s", rc, out);
    TU_CHECK(tu_unchanged(), "bad layout: the run wrote under %s", dir);
    snprintf(p, sizeof p, "%s/bad1", dir);
    TU_CHECK(stat(p, &sb) != 0, "nothing written for a bad layout");
    rc = run("%s train --data-path %s " TINY " --tp 2 --save %s/never", cli, data, dir);
    TU_CHECK(rc == 2 && strstr(out, "not divisible by tensor"), "tp 2 on one process: rc %d %s", rc, out);
    TU_CHECK(tu_unchanged(), "bad layout: the run wrote under %s", dir);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_tp_cli");
}
