/* `suanli train --fp16` (issue 19 item 1) through the CLI: dynamic loss scaling forced into overflow (a start
 * scale of 2^20 and a window of 3), the skipped steps and the scale in metrics.jsonl and the progress line;
 * data parallelism (suanli run -n 2, plain DP and ZeRO-2, where the found-inf test is the all-reduced norm)
 * skips the same steps with the same scales and reproduces the single-process losses; so do pipeline
 * parallelism (pp 2, pp 2 x dp 2 with ZeRO-1, the interleaved and the ZB-H1 schedules: the loss scale is
 * every last-stage slot's seed and the found-inf test the norm summed over the stages) on a 4-layer GPT-2;
 * bad flags exit 2 with one line naming the flag; `suanli generate --dtype f16`. (fp16 with expert
 * parallelism: tests/parallel/test_ep_cli.c.) */
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 17];

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "SUANLI_COMM_ALGO=direct SUANLI_COMM_TIMEOUT=60 timeout 300 %s", args);
    return tu_run(cmd, out, sizeof out);
}

enum { STEPS = 12 };
typedef struct {
    double loss[STEPS + 1], scale[STEPS + 1];
    int skipped[STEPS + 1], n, nskip;
} metrics;

static void read_metrics(const char *path, metrics *m) {
    memset(m, 0, sizeof *m);
    char *text = NULL;
    size_t len = 0;
    TU_CHECK(sl_file_read_all(path, &text, &len) == SL_OK, "read %s", path);
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *st = cJSON_GetObjectItem(o, "step"), *ls = cJSON_GetObjectItem(o, "loss_scale"),
                    *sk = cJSON_GetObjectItem(o, "skipped"), *gn = cJSON_GetObjectItem(o, "grad_norm");
        TU_CHECK(o && cJSON_IsNumber(st) && cJSON_IsNumber(ls) && cJSON_IsNumber(sk), "metrics line: %s",
                 line);
        if (o && cJSON_IsNumber(st) && st->valueint >= 1 && st->valueint <= STEPS) {
            int s = st->valueint;
            m->loss[s] = cJSON_GetObjectItem(o, "loss")->valuedouble;
            m->scale[s] = ls ? ls->valuedouble : 0;
            m->skipped[s] = sk ? sk->valueint : -1;
            m->nskip += m->skipped[s] == 1;
            /* an overflow step's norm is not a number: JSON null */
            TU_CHECK(m->skipped[s] ? cJSON_IsNull(gn) : cJSON_IsNumber(gn), "grad_norm of step %d: %s", s,
                     line);
            m->n++;
        }
        cJSON_Delete(o);
    }
    free(text);
}

static int one_line(void) {
    size_t n = strlen(out);
    return n > 0 && out[n - 1] == '\n' && memchr(out, '\n', n - 1) == NULL;
}

#define BASE                                                                                                 \
    "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "          \
    "--global-batch-size 4 --train-iters 12 --eval-interval 0 --eval-iters 1 --threads 1"
#define SCALER " --fp16 --initial-loss-scale 1048576 --loss-scale-window 3 --hysteresis 1"
#define TINY BASE SCALER
#define PP_TINY                                                                                              \
    "--num-layers 4 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "          \
    "--global-batch-size 8 --train-iters 12 --eval-interval 0 --eval-iters 1 --threads 1" SCALER

int main(void) {
    const char *cli = tu_cli();
    char dir[512], data[600];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("fp16cli"));
    int rc = tu_prepare_corpus(dir, 20000, data, sizeof data, out, sizeof out);
    TU_CHECK(rc == 0, "prepare: %s", out);
    /* bad input: exit 2, one line naming the flag */
    const char *bad[][2] = {{"--fp16 --bf16", "--bf16"},
                            {"--fp16 --initial-loss-scale 0", "--initial-loss-scale"},
                            {"--fp16 --initial-loss-scale -4", "--initial-loss-scale"},
                            {"--fp16 --loss-scale-window 0", "--loss-scale-window"},
                            {"--fp16 --hysteresis 0", "--hysteresis"},
                            {"--fp16 --min-loss-scale 0", "--min-loss-scale"}};
    tu_watch(dir); /* and nothing written: no entry under dir created, removed or modified */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run("%s train --data-path %s %s --save %s/never", cli, data, bad[i][0], dir);
        TU_CHECK(rc == 2 && strstr(out, bad[i][1]) && one_line(),
                 "'%s': rc %d, want 2 and one line naming %s: %s", bad[i][0], rc, bad[i][1], out);
        TU_CHECK(tu_unchanged(), "'%s': the run wrote under %s", bad[i][0], dir);
    }
    tu_watch(NULL);
    rc = run("%s train --data-path %s " TINY " --save %s/single", cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "fp16 mixed precision") && strstr(out, "loss scale") &&
                 strstr(out, "(overflow: skipped)"),
             "single: %s", out);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --save %s/dp2", cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "data parallel: 2 ranks"), "dp2: %s", out);
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --zero-stage 2 --save %s/z2", cli, cli, data,
             dir);
    TU_CHECK(rc == 0, "dp2 zero-2: %s", out);
    metrics ms, md, mz;
    char p[700];
    snprintf(p, sizeof p, "%s/single/metrics.jsonl", dir);
    read_metrics(p, &ms);
    snprintf(p, sizeof p, "%s/dp2/metrics.jsonl", dir);
    read_metrics(p, &md);
    snprintf(p, sizeof p, "%s/z2/metrics.jsonl", dir);
    read_metrics(p, &mz);
    TU_CHECK(ms.n == STEPS && md.n == STEPS && mz.n == STEPS, "metrics lines %d %d %d", ms.n, md.n, mz.n);
    /* 2^20 overflows fp16 gradients: the first steps are skipped and the scale halves each time (hysteresis
     * 1), then grows after 3 good steps */
    TU_CHECK(ms.nskip >= 2 && ms.skipped[1] == 1 && ms.scale[1] == 1048576.0 && ms.scale[2] == 524288.0,
             "overflow at the start: %d skipped, scales %g %g", ms.nskip, ms.scale[1], ms.scale[2]);
    TU_CHECK(ms.nskip < STEPS, "some steps update: %d of %d skipped", ms.nskip, STEPS);
    for (int s = 1; s <= STEPS; s++) {
        printf("step %2d: scale %-14g skipped %d loss single %.6f dp2 %.6f zero2 %.6f\n", s, ms.scale[s],
               ms.skipped[s], ms.loss[s], md.loss[s], mz.loss[s]);
        TU_CHECK(md.skipped[s] == ms.skipped[s] && mz.skipped[s] == ms.skipped[s] &&
                     md.scale[s] == ms.scale[s] && mz.scale[s] == ms.scale[s],
                 "step %d: the same skip and scale under DP", s);
        /* DP sums the same f16-rounded micro-batch gradients in another order: fp32 rounding only */
        TU_CHECK(fabs(md.loss[s] - ms.loss[s]) <= 1e-5 * fabs(ms.loss[s]) &&
                     fabs(mz.loss[s] - ms.loss[s]) <= 1e-5 * fabs(ms.loss[s]),
                 "step %d: losses single %.7f dp2 %.7f zero2 %.7f", s, ms.loss[s], md.loss[s], mz.loss[s]);
    }
    /* tensor parallelism on the 1-layer model: the sum of the ranks' partial products must overflow where the
     * single process's full product does (Note [Half sums across TP ranks]; without it tp 2 skipped other
     * steps here) */
    rc = run("%s run -n 2 -- %s train --data-path %s " TINY " --tp 2 --save %s/tp1", cli, cli, data, dir);
    TU_CHECK(rc == 0 && strstr(out, "tensor parallel"), "tp 2: %s", out);
    snprintf(p, sizeof p, "%s/tp1/metrics.jsonl", dir);
    read_metrics(p, &md);
    for (int s = 1; s <= STEPS; s++) {
        TU_CHECK(md.skipped[s] == ms.skipped[s] && md.scale[s] == ms.scale[s],
                 "tp 2 step %d: skipped %d scale %g, single %d %g", s, md.skipped[s], md.scale[s],
                 ms.skipped[s], ms.scale[s]);
        TU_CHECK(fabs(md.loss[s] - ms.loss[s]) <= 1e-5 * fabs(ms.loss[s]),
                 "tp 2 step %d: loss %.7f, single %.7f", s, md.loss[s], ms.loss[s]);
    }
    /* the scaler travels with the checkpoint (train.loss_scaler in the manifest, as Megatron keeps its grad
     * scaler in the optimizer state): resumed from step 5, steps 6..12 are the uninterrupted run's, bitwise,
     * scale and skips included; a damaged scaler state is refused, naming the file and the field */
    rc = run("%s train --data-path %s " TINY " --save %s/full --save-interval 5", cli, data, dir);
    TU_CHECK(rc == 0, "fp16 with checkpoints: %s", out);
    rc = tu_runf(
        out, sizeof out, "",
        "mkdir -p %s/res %s/bad && cp -r %s/full/step-0000005 %s/res/ && cp -r %s/full/step-0000005 "
        "%s/bad/ && echo step-0000005 | tee %s/res/latest > %s/bad/latest && sed -i "
        "'/\"loss_scaler\"/,/}/s/\"scale\":[[:space:]]*[0-9.e+]*/\"scale\": -1/' "
        "%s/bad/step-0000005/manifest.json && grep -q '\"scale\": -1' %s/bad/step-0000005/manifest.json",
        dir, dir, dir, dir, dir, dir, dir, dir, dir, dir);
    TU_CHECK(rc == 0, "copy and damage the step-5 checkpoint: %s", out);
    rc = run("%s train --data-path %s " TINY " --load %s/res --save %s/res", cli, data, dir, dir);
    TU_CHECK(rc == 0 && strstr(out, "resumed from"), "fp16 resume: %s", out);
    metrics mf, mr;
    snprintf(p, sizeof p, "%s/full/metrics.jsonl", dir);
    read_metrics(p, &mf);
    snprintf(p, sizeof p, "%s/res/metrics.jsonl", dir);
    read_metrics(p, &mr);
    TU_CHECK(mf.nskip >= 2, "the checkpointed run skipped %d steps", mf.nskip);
    for (int s = 6; s <= STEPS; s++)
        TU_CHECK(mr.loss[s] == mf.loss[s] && mr.scale[s] == mf.scale[s] && mr.skipped[s] == mf.skipped[s],
                 "resumed step %d: loss %.8f scale %g skipped %d, uninterrupted %.8f %g %d", s, mr.loss[s],
                 mr.scale[s], mr.skipped[s], mf.loss[s], mf.scale[s], mf.skipped[s]);
    rc = tu_runf(out, sizeof out, "", "cmp %s/full/model.safetensors %s/res/model.safetensors", dir, dir);
    TU_CHECK(rc == 0, "resumed fp16 run: final weights differ from the uninterrupted run's: %s", out);
    rc = run("%s train --data-path %s " TINY " --load %s/bad --save %s/bad", cli, data, dir, dir);
    TU_CHECK(rc == 2 && one_line() && strstr(out, "manifest.json") && strstr(out, "train.loss_scaler"),
             "damaged loss_scaler: rc %d, want 2 and one line naming the file and field: %s", rc, out);
    snprintf(p, sizeof p, "%s/bad/model.safetensors", dir);
    TU_CHECK(access(p, F_OK) != 0, "the refused run wrote %s", p);
    /* so is a damaged optimizer step count (it fell back to the step, a silently different bias correction)
     */
    rc = tu_runf(
        out, sizeof out, "",
        "mkdir -p %s/bad2 && cp -r %s/full/step-0000005 %s/bad2/ && echo step-0000005 > %s/bad2/latest "
        "&& sed -i 's/\"adam_t\":[[:space:]]*[0-9]*/\"adam_t\": -3/' "
        "%s/bad2/step-0000005/manifest.json && grep -q '\"adam_t\": -3' %s/bad2/step-0000005/manifest.json",
        dir, dir, dir, dir, dir, dir);
    TU_CHECK(rc == 0, "copy and damage the step-5 checkpoint's adam_t: %s", out);
    rc = run("%s train --data-path %s " TINY " --load %s/bad2 --save %s/bad2", cli, data, dir, dir);
    TU_CHECK(rc == 2 && one_line() && strstr(out, "manifest.json") && strstr(out, "train.adam_t"),
             "damaged adam_t: rc %d, want 2 and one line naming the file and field: %s", rc, out);
    /* resumed from step 7, two good steps into a growth window (step 5 overflowed, so its checkpoint has a
     * growth tracker of 0 and would not notice one lost): the scale still doubles on schedule at step 9 */
    TU_CHECK(mf.skipped[5] == 1 && mf.skipped[6] == 0 && mf.skipped[7] == 0 && mf.skipped[8] == 0 &&
                 mf.scale[9] == 2 * mf.scale[8],
             "the uninterrupted run: overflow at 5, growth at 9 (scales %g %g)", mf.scale[8], mf.scale[9]);
    rc = run("%s train --data-path %s " TINY " --save %s/full7 --save-interval 7", cli, data, dir);
    TU_CHECK(rc == 0, "fp16 with a checkpoint at step 7: %s", out);
    rc = tu_runf(
        out, sizeof out, "",
        "mkdir -p %s/res7 && cp -r %s/full7/step-0000007 %s/res7/ && echo step-0000007 > %s/res7/latest", dir,
        dir, dir, dir);
    TU_CHECK(rc == 0, "copy the step-7 checkpoint: %s", out);
    rc = run("%s train --data-path %s " TINY " --load %s/res7 --save %s/res7", cli, data, dir, dir);
    TU_CHECK(rc == 0 && strstr(out, "resumed from"), "fp16 resume from step 7: %s", out);
    snprintf(p, sizeof p, "%s/res7/metrics.jsonl", dir);
    read_metrics(p, &mr);
    for (int s = 8; s <= STEPS; s++)
        TU_CHECK(mr.loss[s] == mf.loss[s] && mr.scale[s] == mf.scale[s] && mr.skipped[s] == mf.skipped[s],
                 "resumed from 7, step %d: loss %.8f scale %g skipped %d, uninterrupted %.8f %g %d", s,
                 mr.loss[s], mr.scale[s], mr.skipped[s], mf.loss[s], mf.scale[s], mf.skipped[s]);

    /* pipeline parallelism, 4 layers: the schedule's slots carry the scale; every stage skips together;
     * and tensor parallelism, with and without sequence parallelism (under SP the row-parallel bias's
     * gradient is summed over the sequence shards: rounded after that sum too) */
    rc = run("%s train --data-path %s " PP_TINY " --save %s/pp_single", cli, data, dir);
    TU_CHECK(rc == 0, "pp single: %s", out);
    snprintf(p, sizeof p, "%s/pp_single/metrics.jsonl", dir);
    read_metrics(p, &ms);
    TU_CHECK(ms.n == STEPS && ms.nskip >= 2 && ms.nskip < STEPS, "pp single: %d lines, %d skipped", ms.n,
             ms.nskip);
    const char *layouts[][3] = {
        {"pp2", "-n 2", "--pp 2"},
        {"pp2dp2", "-n 4", "--pp 2 --zero-stage 1"},
        {"vpp", "-n 2", "--pp 2 --num-layers-per-virtual-pipeline-stage 1"},
        {"zb", "-n 2", "--pp 2 --enable-zero-bubble"}, /* W carries the seed's scale */
        {"tp2", "-n 2", "--tp 2"},
        {"tp2sp", "-n 2", "--tp 2 --sequence-parallel"}};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        rc = run("%s run %s -- %s train --data-path %s " PP_TINY " %s --save %s/%s", cli, layouts[i][1], cli,
                 data, layouts[i][2], dir, layouts[i][0]);
        TU_CHECK(rc == 0 && strstr(out, layouts[i][0][0] == 't' ? "tensor parallel" : "pipeline"), "%s: %s",
                 layouts[i][0], out);
        snprintf(p, sizeof p, "%s/%s/metrics.jsonl", dir, layouts[i][0]);
        read_metrics(p, &md);
        TU_CHECK(md.n == STEPS, "%s: %d metrics lines", layouts[i][0], md.n);
        double worst = 0;
        for (int s = 1; s <= STEPS; s++) {
            TU_CHECK(md.skipped[s] == ms.skipped[s] && md.scale[s] == ms.scale[s],
                     "%s step %d: skipped %d scale %g, single %d %g", layouts[i][0], s, md.skipped[s],
                     md.scale[s], ms.skipped[s], ms.scale[s]);
            double e = fabs(md.loss[s] - ms.loss[s]) / fabs(ms.loss[s]);
            if (!(e <= worst)) worst = e;
        }
        /* the stages run the single process's ops; the tied embedding's two gradients, the norm's partial
         * sums (and dp's micro-batch sums) are reassociated, which f16 rounding can amplify by a flip:
         * measured <= 1.3e-6; TP sums rounded partial products and rounds the sum again (Note [Half sums
         * across TP ranks], which makes it skip the single process's steps): measured 1.6e-6; the DP bar */
        printf("fp16 %s: %d skipped steps as the single process, worst loss rel err %.2e\n", layouts[i][0],
               ms.nskip, worst);
        TU_CHECK(worst <= 1e-5, "%s: loss rel err %.3g (bar 1e-5)", layouts[i][0], worst);
    }
    /* fp16 inference: f32 weights, autocast-fp16 compute; on the tiny Llama fixture its greedy ids are f32's
     */
    char ids[2][512];
    for (int f16 = 0; f16 < 2; f16++) {
        rc = run("%s generate --model %s/tests/fixtures/hf/llama --prompt-ids 5,6,7 --max-new-tokens 12 "
                 "--temperature 0 --print-ids --dtype %s",
                 cli, SL_SOURCE_DIR, f16 ? "f16" : "f32");
        TU_CHECK(rc == 0 && strstr(out, f16 ? "f16 compute" : "f32 compute"), "generate --dtype: %s", out);
        const char *j = strstr(out, "{\"prompt_ids\"");
        snprintf(ids[f16], sizeof ids[f16], "%s", j ? j : "");
    }
    TU_CHECK(ids[0][0] && !strcmp(ids[0], ids[1]), "f16 greedy ids %s vs f32 %s", ids[1], ids[0]);
    /* the fp16 run is not silently fp32: its step-1 loss (same weights, forward only) differs */
    rc = run("%s train --data-path %s " BASE " --save %s/fp32", cli, data, dir);
    TU_CHECK(rc == 0, "fp32: %s", out);
    snprintf(p, sizeof p, "%s/fp32/metrics.jsonl", dir);
    FILE *f = fopen(p, "r");
    char line[1024];
    double l32 = NAN;
    if (f && fgets(line, sizeof line, f)) sscanf(line, "{\"step\": %*d, \"loss\": %lf", &l32);
    if (f) fclose(f);
    TU_CHECK(l32 == l32 && l32 != ms.loss[1], "step-1 loss fp32 %.7f vs fp16 %.7f", l32, ms.loss[1]);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_fp16_cli");
}
