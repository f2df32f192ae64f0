/* ZeRO-1/2/3 bitwise equal to plain DP under the DEFAULT collective algorithm choice (issue 19 item 6): no
 * SUANLI_COMM_ALGO override (it is removed from the environment), 2 ranks through `suanli run -n 2`, a few
 * steps of a tiny GPT-2; the saved weights of every stage must equal plain DP's byte for byte, and so must
 * the loss of every step. Why it holds: ZeRO-0/1 all-reduce a bucket, ZeRO-2/3 reduce-scatter it (and
 * all-reduce its < dp-element tail); on 2 ranks every element is one fp32 addition of the two ranks'
 * values, whatever the algorithm (ring, recursive doubling, direct, the shm in-place path of
 * Note [Gradients in a window] in src/parallel/dp.c), and a + b == b + a exactly; the gradient norm is summed
 * per rank part and then over ranks at every stage. Also run-to-run: the same stage twice is bitwise equal.
 */
#include <string.h>

#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 17];

#define run(...)                                                                                             \
    tu_runf(out, sizeof out, "env -u SUANLI_COMM_ALGO SUANLI_COMM_TIMEOUT=60 timeout 300", __VA_ARGS__)

/* the "loss" fields of metrics.jsonl, as text (bitwise comparison of what was printed) */
static int losses(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1024];
    size_t n = 0;
    int steps = 0;
    buf[0] = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"loss\": "), *q = p ? strchr(p, ',') : NULL;
        if (!p || !q || n + (size_t)(q - p) + 2 >= cap) continue;
        memcpy(buf + n, p, (size_t)(q - p));
        n += (size_t)(q - p);
        buf[n++] = ';';
        buf[n] = 0;
        steps++;
    }
    fclose(f);
    return steps;
}

#define TINY                                                                                                 \
    "--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "          \
    "--train-iters 5 --eval-interval 0 --eval-iters 1 --threads 1 --seed 5 --ddp-bucket-size 1001"

int main(void) {
    const char *cli = tu_cli();
    char dir[512], data[600];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("zero_default"));
    int rc = tu_prepare_corpus(dir, 20000, data, sizeof data, out, sizeof out);
    TU_CHECK(rc == 0, "prepare: %s", out);
    /* global batch 4: one micro-batch per rank (ZeRO-2/3 keep gradients in slots); global batch 8: two,
     * accumulated (ZeRO-0/1 only: the slots need one micro-batch per step) */
    struct {
        int global, max_stage;
    } cfg[] = {{4, 3}, {8, 1}};
    for (int c = 0; c < 2; c++) {
        char ref_w[700], ref_l[4096] = "";
        for (int z = 0; z <= cfg[c].max_stage + 1; z++) {
            int stage = z <= cfg[c].max_stage ? z : cfg[c].max_stage; /* the last run repeats a stage */
            const char *tag = z <= cfg[c].max_stage ? "" : "_again";
            rc = run("%s run -n 2 -- %s train --data-path %s " TINY
                     " --global-batch-size %d --zero-stage %d --save %s/g%d_z%d%s",
                     cli, cli, data, cfg[c].global, stage, dir, cfg[c].global, stage, tag);
            TU_CHECK(rc == 0 && strstr(out, "data parallel: 2 ranks"), "global %d zero %d%s: %s",
                     cfg[c].global, stage, tag, out);
            char w[700], mp[700], l[4096];
            snprintf(w, sizeof w, "%s/g%d_z%d%s/model.safetensors", dir, cfg[c].global, stage, tag);
            snprintf(mp, sizeof mp, "%s/g%d_z%d%s/metrics.jsonl", dir, cfg[c].global, stage, tag);
            int steps = losses(mp, l, sizeof l);
            TU_CHECK(steps == 5, "global %d zero %d%s: %d steps in %s", cfg[c].global, stage, tag, steps, mp);
            if (z == 0) {
                snprintf(ref_w, sizeof ref_w, "%s", w);
                snprintf(ref_l, sizeof ref_l, "%s", l);
                continue;
            }
            TU_CHECK(tu_same_file(ref_w, w), "global %d: ZeRO-%d%s saved weights differ from plain DP's",
                     cfg[c].global, stage, tag);
            TU_CHECK(!strcmp(ref_l, l), "global %d: ZeRO-%d%s losses %s vs plain DP %s", cfg[c].global, stage,
                     tag, l, ref_l);
        }
    }
    if (tu_failures == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        TU_CHECK(system(cmd) == 0, "cleanup");
    }
    return tu_finish("test_zero_default");
}
