/* Checkpoints and fault tolerance through the CLI:
 * - resume is exact: kill -9 at a step, resume from the newest checkpoint -> bitwise-identical final
 *   weights (single process; DP=2 with ZeRO-0/1/2/3 under `suanli run --max-restarts`, a rank killed);
 * - resharding: a DP=2 ZeRO-2 checkpoint loads into one process and into DP=2 ZeRO-0 / DP=4 ZeRO-3; a DP=2
 *   ZeRO-3 checkpoint loads into one process;
 * - torn checkpoints: the writer or committer killed at every stage of the protocol leaves a loadable state;
 * - corrupt newest checkpoint (bit flip, missing shard) -> reported, the previous one is used;
 * - malformed manifest and another model's checkpoint -> one-line error, exit 2. */
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 17];
static char dir[512], data[600];
static const char *cli;

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
    char args[6000], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd %s && SUANLI_COMM_TIMEOUT=60 timeout 300 %s", dir, args);
    return tu_run(cmd, out, sizeof out);
}

/* 1 when metrics.jsonl of `run` under dir has one "loss" line for each step 1..n, each with the loss of
 * `ref` (the uninterrupted run), bitwise as printed */
static int metrics_once(const char *run, const char *ref, int n) {
    char p[700], q[700], line[4096];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", dir, run);
    snprintf(q, sizeof q, "%s/%s/metrics.jsonl", dir, ref);
    int count[64] = {0}, ok = 1;
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        int s;
        if (sscanf(line, "{\"step\": %d", &s) == 1 && s >= 1 && s < 64 && strstr(line, "\"loss\": "))
            count[s]++;
    }
    fclose(f);
    for (int s = 1; s <= n; s++)
        if (count[s] != 1 || tu_metric_at(p, s, "loss") != tu_metric_at(q, s, "loss")) {
            printf("%s step %d: %d lines, loss %.9g, uninterrupted %.9g\n", p, s, count[s],
                   tu_metric_at(p, s, "loss"), tu_metric_at(q, s, "loss"));
            ok = 0;
        }
    return ok;
}

#define TINY                                                                                                 \
    "--data-path data --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "              \
    "--micro-batch-size 2 --train-iters 12 --lr-decay-iters 12 --eval-interval 0 --eval-iters 1 --threads 1"

/* torn writes at every commit stage, a corrupt or missing newest checkpoint (fall back to the previous one),
 * malformed manifests and checkpoints of another model (run after the single-process runs: base, s1) */
static void damaged_checkpoints(void) {
    char a[700], b[700];
    int rc;
    snprintf(a, sizeof a, "%s/base/model.safetensors", dir);
    /* ---- torn checkpoints: die at every stage of the write/commit of the step-8 checkpoint ---- */
    for (int stage = 0; stage <= 5; stage++) {
        rc = run("sh -c 'rm -rf torn && %s train " TINY
                 " --save torn --save-interval 4 --train-iters 7 >/dev/null 2>&1 && "
                 "env SUANLI_FAULT_COMMIT_STAGE=%d %s train " TINY
                 " --save torn --load torn --save-interval 4'",
                 cli, stage, cli);
        TU_CHECK(rc != 0, "stage %d: the run died: %s", stage, out);
        rc = run("%s ckpt verify torn", cli);
        TU_CHECK(rc == 0 && (strstr(out, "step-0000004") || strstr(out, "step-0000008")),
                 "stage %d: a valid checkpoint remains: %s", stage, out);
        rc = run("%s train " TINY " --save torn --load torn --save-interval 4", cli);
        TU_CHECK(rc == 0, "stage %d: resume: %s", stage, out);
        snprintf(a, sizeof a, "%s/base/model.safetensors", dir);
        snprintf(b, sizeof b, "%s/torn/model.safetensors", dir);
        TU_CHECK(tu_same_file(a, b), "stage %d: final weights bitwise equal to the uninterrupted run", stage);
    }

    /* ---- a step dir copied under a newer name: its manifest's step disagrees, so it is not used (it
     * resumed "at step 4" and every later resume would have picked it again) ---- */
    rc = run("sh -c 'rm -rf cp && %s train " TINY
             " --save cp --save-interval 4 --train-iters 8 >/dev/null 2>&1 && cp -r cp/step-0000004 "
             "cp/step-0000009 && %s train " TINY " --save cp --load cp --save-interval 4'",
             cli, cli);
    TU_CHECK(rc == 0 && strstr(out, "field 'step' is 4, but the directory is step-0000009") &&
                 strstr(out, "resumed from cp/step-0000008"),
             "copied step dir refused, the real newest used: rc %d %s", rc, out);
    snprintf(b, sizeof b, "%s/cp/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b),
             "after the copied step dir, final weights bitwise equal to the uninterrupted run");

    /* ---- corrupt newest checkpoint: fall back to the previous one ---- */
    rc = run("sh -c 'rm -rf cor && %s train " TINY
             " --save cor --save-interval 4 --train-iters 8 --save-keep 0'",
             cli);
    TU_CHECK(rc == 0, "corrupt setup: %s", out);
    /* a byte in the data (64 bytes before the end: the header, padded to a multiple of 4096 for O_DIRECT,
     * can be longer than any fixed offset) */
    rc = run("sh -c 'f=cor/step-0000008/shard-r00000.safetensors; printf \"\\\\377\" | dd of=$f bs=1 "
             "seek=$(($(stat -c %%s $f) - 64)) conv=notrunc 2>/dev/null'");
    TU_CHECK(rc == 0, "flip: %s", out);
    rc = run("%s ckpt verify cor", cli);
    TU_CHECK(rc == 0 && strstr(out, "checksum mismatch") && strstr(out, "step-0000004"),
             "bit flip reported, step 4 used: %s", out);
    rc = run("%s train " TINY " --save cor --load cor --save-interval 4 --save-keep 0", cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from cor/step-0000004"), "resume from the previous: %s", out);
    snprintf(b, sizeof b, "%s/cor/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "after fallback, final weights bitwise equal to the uninterrupted run");
    /* ---- the newest step's config.json lost or damaged (it is not under a checksum; the resume reads the
     * model from it): that step is not usable, the previous one is used (it was a hard "--load: ...
     * config.json: cannot open" and, under --max-restarts, the end of the job) ---- */
    rc = run("sh -c 'rm -rf cfg && %s train " TINY
             " --save cfg --save-interval 4 --train-iters 8 --save-keep 0 >/dev/null 2>&1 && rm "
             "cfg/step-0000008/config.json && %s ckpt verify cfg'",
             cli, cli);
    TU_CHECK(rc == 0 && strstr(out, "step-0000008/config.json: cannot open") && strstr(out, "step-0000004"),
             "missing config.json reported, step 4 used: rc %d %s", rc, out);
    rc = run("%s train " TINY " --save cfg --load cfg --save-interval 4 --save-keep 0", cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from cfg/step-0000004"), "missing config.json: rc %d %s", rc,
             out);
    snprintf(b, sizeof b, "%s/cfg/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b),
             "after a lost config.json, final weights bitwise equal to the uninterrupted run");
    rc = run("sh -c 'sed -i s/32/33/ cfg/step-0000012/config.json && %s ckpt verify cfg'", cli);
    TU_CHECK(rc == 0 && strstr(out, "step-0000012/config.json: not the model config of its manifest.json") &&
                 strstr(out, "step-0000008: all checksums match"),
             "a config.json that disagrees with the manifest: rc %d %s", rc, out);

    /* ---- a resume that fell back below a damaged newest step, with --save-keep 1: the new step-6
     * checkpoint must survive its own commit (pruning kept the damaged step-10 dir, the newest by name, and
     * deleted step 6; `latest` named a deleted dir and the next resume found "no valid checkpoint"). The
     * kill after step 8 comes after the step-8 save began, which waited for step 6's commit. ---- */
    rc = run("sh -c 'rm -rf pk && %s train " TINY
             " --save pk --save-interval 2 --train-iters 10 --save-keep 0 >/dev/null 2>&1 && "
             "f=pk/step-0000010/shard-r00000.safetensors && printf \"\\\\377\" | dd of=$f bs=1 "
             "seek=$(($(stat -c %%s $f) - 64)) conv=notrunc 2>/dev/null && rm -r pk/step-0000008 "
             "pk/step-0000006 && env SUANLI_FAULT_KILL_AT_STEP=8 %s train " TINY
             " --save pk --load pk --save-interval 2 --save-keep 1'",
             cli, cli);
    TU_CHECK(rc != 0 && strstr(out, "resumed from pk/step-0000004") && strstr(out, "killing myself"),
             "resume below a damaged step, killed after step 8: rc %d %s", rc, out);
    rc = run("%s train " TINY " --save pk --load pk --save-interval 2 --save-keep 1", cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from pk/step-0000006"),
             "the step-6 checkpoint of the resumed run survived: rc %d %s", rc, out);
    snprintf(b, sizeof b, "%s/pk/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "after two resumes, final weights bitwise equal to the uninterrupted run");

    /* ---- a rewind (--load ROOT/step-4 --save ROOT, another --lr) killed after step 8 and restarted with
     * --load ROOT: it resumes the new history's step 6 (the old history's steps 10 and 12 had been kept as
     * the 2 newest, step 6 pruned, and the restart silently resumed the old history at step 12) ---- */
    rc = run(
        "sh -c 'rm -rf rw && %s train " TINY
        " --save rw --save-interval 2 --save-keep 0 >/dev/null 2>&1 && env SUANLI_FAULT_KILL_AT_STEP=8 %s "
        "train " TINY " --load rw/step-0000004 --save rw --save-interval 2 --lr 5e-4'",
        cli, cli);
    TU_CHECK(rc != 0 && strstr(out, "resumed from rw/step-0000004") && strstr(out, "killing myself"),
             "rewind to step 4, killed after step 8: rc %d %s", rc, out);
    rc = run("%s train " TINY " --load rw --save rw --save-interval 2 --lr 5e-4", cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from rw/step-0000006"), "restart after a rewind: rc %d %s", rc,
             out);

    rc = run("sh -c 'rm cor/step-0000012/shard-r00000.safetensors && %s ckpt verify cor'", cli);
    TU_CHECK(rc == 0 && strstr(out, "step-0000008") && strstr(out, "shard-r00000.safetensors"),
             "missing shard: %s", out);

    rc = run("sh -c 'truncate -s 1000 cor/step-0000008/shard-r00000.safetensors && %s ckpt verify cor'", cli);
    TU_CHECK(rc == 0 && strstr(out, "step-0000004") && strstr(out, "step-0000008"),
             "truncated shard reported, step 4 used: %s", out);

    /* ---- malformed manifest, another model ---- */
    rc = run("sh -c 'sed -i \"s/\\\"step\\\":[[:space:]]*[0-9]*/\\\"step\\\": \\\"twelve\\\"/\" "
             "cor/step-0000012/manifest.json "
             "cor/step-0000008/manifest.json cor/step-0000004/manifest.json && %s ckpt verify cor'",
             cli);
    TU_CHECK(rc == 2 && strstr(out, "'step'"), "wrong-typed manifest field: rc %d %s", rc, out);
    rc = run("%s train " TINY " --load cor", cli);
    TU_CHECK(rc == 2 && strstr(out, "'step'"), "train refuses: rc %d %s", rc, out);
    rc = run("%s train " TINY " --hidden-size 64 --load s1", cli);
    TU_CHECK(rc == 2 && strstr(out, "--hidden-size 64 conflicts"), "other model shape: %s", out);
    /* config.json and the manifest's model both say n_embd 16 (one alone is a damaged step), the tensors
     * are of 32 */
    rc = run("sh -c 'sed -i \"s/\\\"n_embd\\\":[[:space:]]*32/\\\"n_embd\\\": 16/\" "
             "s1/step-0000012/config.json s1/step-0000012/manifest.json && %s train " TINY
             " --hidden-size 16 --load s1'",
             cli);
    TU_CHECK(rc == 2 && strstr(out, "param/"), "tensors of another shape: rc %d %s", rc, out);
}

int main(void) {
    cli = tu_cli();
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("ckpt"));
    snprintf(data, sizeof data, "%s/data", dir);
    int rc = run("sh -c 'head -c 20000 %s/data/tinyshakespeare.txt > s.txt && %s data prepare --input s.txt "
                 "--output-prefix data'",
                 SL_SOURCE_DIR, cli);
    TU_CHECK(rc == 0, "prepare: %s", out);
    char a[700], b[700];

    /* ---- single process: uninterrupted vs killed at step 6 and resumed ---- */
    rc = run("%s train " TINY " --save base", cli);
    TU_CHECK(rc == 0, "baseline: %s", out);
    /* checkpoints commit asynchronously: at the kill (step 10) step 4 is surely committed (the step-8 save
     * waited for it), step 8 maybe */
    rc = run("env SUANLI_FAULT_KILL_AT_STEP=10 %s train " TINY " --save s1 --save-interval 4", cli);
    TU_CHECK(rc != 0 && strstr(out, "killing myself"), "killed run: rc %d %s", rc, out);
    rc = run("%s ckpt verify s1", cli);
    TU_CHECK(rc == 0 && (strstr(out, "step-0000004") || strstr(out, "step-0000008")), "verify after kill: %s",
             out);
    rc = run("%s train " TINY " --save s1 --load s1 --save-interval 4", cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from s1/step-000000"), "resume: %s", out);
    snprintf(a, sizeof a, "%s/base/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/s1/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b),
             "single: resumed final weights are bitwise identical to the uninterrupted run");
    /* the killed attempt logged steps up to 10; the resumed run's lines replace those after its checkpoint */
    TU_CHECK(metrics_once("s1", "base", 12), "single: metrics.jsonl holds steps 1..12 once each, the "
                                             "uninterrupted run's losses");

    /* ---- DP=2, each ZeRO stage: a rank is killed, the launcher restarts, training resumes ---- */
    for (int z = 0; z < 4; z++) {
        rc = run("%s run -n 2 -- %s train " TINY " --global-batch-size 4 --zero-stage %d --save dpbase%d",
                 cli, cli, z, z);
        TU_CHECK(rc == 0, "dp base zero %d: %s", z, out);
        rc = run("env SUANLI_FAULT_KILL_AT_STEP=8 SUANLI_FAULT_RANK=1 %s run -n 2 --max-restarts 2 -- %s "
                 "train " TINY
                 " --global-batch-size 4 --zero-stage %d --save dp%d --load dp%d --save-interval 3",
                 cli, cli, z, z, z);
        /* the launcher keeps an in-memory copy of the newest checkpoint; the restart loads it (or the disk
         * copy, when the kill lands between the disk and the memory commit) */
        TU_CHECK(rc == 0 && strstr(out, "resumed from ") && strstr(out, "killing myself"),
                 "dp zero %d restarted run: rc %d %s", z, rc, out);
        snprintf(a, sizeof a, "%s/dpbase%d/model.safetensors", dir, z);
        snprintf(b, sizeof b, "%s/dp%d/model.safetensors", dir, z);
        TU_CHECK(tu_same_file(a, b), "dp zero %d: final weights after kill + restart are bitwise identical",
                 z);
        char rn[16], bn[16];
        snprintf(rn, sizeof rn, "dp%d", z);
        snprintf(bn, sizeof bn, "dpbase%d", z);
        TU_CHECK(metrics_once(rn, bn, 12), "dp zero %d: metrics.jsonl holds steps 1..12 once each", z);
    }
    /* a ZeRO-3 checkpoint (parameters written by every rank from its shard) loads into one process */
    rc = run("%s train " TINY " --global-batch-size 4 --load dp3 --save dp3_single", cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from dp3/step-0000012"), "load dp2/zero3 into 1 process: %s",
             out);
    snprintf(a, sizeof a, "%s/dp3/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/dp3_single/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "ZeRO-3 checkpoint parameters load bitwise into one process");

    /* ---- 4 ranks, a random rank killed at a random step (seed printed; SUANLI_TEST_SEED reproduces) ---- */
    {
        const char *es = getenv("SUANLI_TEST_SEED");
        uint64_t seed = es ? strtoull(es, NULL, 10) : (uint64_t)time(NULL);
        int victim = (int)(sl_rng_u64(seed, 1, 0) % 4), at = 2 + (int)(sl_rng_u64(seed, 1, 1) % 9);
        printf("random kill: seed %llu -> rank %d at step %d of 12\n", (unsigned long long)seed, victim, at);
        rc = run("%s run -n 4 -- %s train " TINY
                 " --micro-batch-size 1 --global-batch-size 4 --zero-stage 1 --save r4base",
                 cli, cli);
        TU_CHECK(rc == 0, "4-rank base: %s", out);
        rc = run("env SUANLI_FAULT_KILL_AT_STEP=%d SUANLI_FAULT_RANK=%d %s run -n 4 --max-restarts 2 -- %s "
                 "train " TINY " --micro-batch-size 1 --global-batch-size 4 --zero-stage 1 --save r4 --load "
                 "r4 --save-interval 2",
                 at, victim, cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "killing myself"), "4-rank kill (seed %llu): rc %d %s",
                 (unsigned long long)seed, rc, out);
        snprintf(a, sizeof a, "%s/r4base/model.safetensors", dir);
        snprintf(b, sizeof b, "%s/r4/model.safetensors", dir);
        TU_CHECK(tu_same_file(a, b),
                 "4 ranks, rank %d killed at step %d (seed %llu): final weights bitwise identical", victim,
                 at, (unsigned long long)seed);
    }

    /* ---- a hung rank (SIGSTOP): the communication deadline turns it into an error, the launcher restarts
     * ---- */
    rc = run("env SUANLI_FAULT_HANG_AT_STEP=5 SUANLI_FAULT_RANK=1 SUANLI_COMM_TIMEOUT=3 %s run -n 2 "
             "--max-restarts 1 -- %s "
             "train " TINY " --global-batch-size 4 --save hang --load hang --save-interval 2",
             cli, cli);
    TU_CHECK(rc == 0 && strstr(out, "stopping myself") && strstr(out, "resumed from "),
             "hang -> timeout -> restart: rc %d %s", rc, out);
    snprintf(a, sizeof a, "%s/dpbase0/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/hang/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "after a hang and restart, final weights bitwise identical");

    /* ---- resharding: DP=2 ZeRO-2 step-6 checkpoint into other layouts ---- */
    rc =
        run("%s run -n 2 -- %s train " TINY " --global-batch-size 4 --zero-stage 2 --train-iters 6 --save rs "
            "--save-interval 6",
            cli, cli);
    TU_CHECK(rc == 0, "resharding source: %s", out);
    /* zero further steps: the loaded parameters are exactly the saved ones */
    rc = run("%s train " TINY " --global-batch-size 4 --train-iters 6 --load rs --save rs_single0", cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed"), "load dp2/zero2 into 1 process: %s", out);
    snprintf(a, sizeof a, "%s/rs/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/rs_single0/model.safetensors", dir);
    TU_CHECK(tu_same_file(a, b), "params survive resharding bitwise");
    /* continue to step 12 in three other layouts; all must agree with the uninterrupted DP=2 ZeRO-2 run */
    /* every layout of global batch 4 trains on the same samples (Note [Deterministic batches] in
     * src/data/loader.c), so rs_a, rs_b (micro-batch 2), rs_c (DP=4, ZeRO-3, micro-batch 1) and rs_d (one
     * process, micro-batch 1, accum 4) all match the uninterrupted DP=2 run; rs_c is also held to rs_d, its
     * single-process twin */
    const char *layouts[] = {
        "%s train " TINY " --global-batch-size 4 --load rs --save rs_a",
        "%s run -n 2 -- %s train " TINY " --global-batch-size 4 --zero-stage 0 --load rs --save rs_b",
        "%s run -n 4 -- %s train " TINY
        " --micro-batch-size 1 --global-batch-size 4 --zero-stage 3 --load rs --save rs_c",
        "%s train " TINY " --micro-batch-size 1 --global-batch-size 4 --load rs --save rs_d"};
    const char *outs[] = {"rs_a", "rs_b", "rs_c", "rs_d"};
    for (int k = 0; k < 4; k++) {
        rc = (k == 0 || k == 3) ? run(layouts[k], cli) : run(layouts[k], cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "resumed"), "reshard layout %d: %s", k, out);
    }
    /* different reduction layouts: compare the step-12 losses in metrics.jsonl within 1e-5 relative */
    double ref = NAN, ref_d = NAN;
    for (int k = 3; k >= -1; k--) {
        char mp[700], *t;
        size_t n;
        if (k == 3) {
            snprintf(mp, sizeof mp, "%s/rs_d/metrics.jsonl", dir);
        } else {
            snprintf(mp, sizeof mp, "%s/%s/metrics.jsonl", dir, k < 0 ? "dpbase2" : outs[k]);
        }
        if (sl_file_read_all(mp, &t, &n) != SL_OK) {
            TU_CHECK(0, "read %s", mp);
            continue;
        }
        char *p = strstr(t, "{\"step\": 12,");
        double l = NAN;
        if (p) sscanf(p, "{\"step\": 12, \"loss\": %lf", &l);
        free(t);
        if (k == 3)
            ref_d = l;
        else if (k == 2)
            TU_CHECK(fabs(l - ref_d) <= 1e-5 * fabs(ref_d), "resharded into DP=4 ZeRO-3: %.7f vs %.7f", l,
                     ref_d);
        else if (k < 0)
            ref = l;
    }
    TU_CHECK(fabs(ref_d - ref) <= 1e-5 * fabs(ref),
             "resharded into 1 process, micro-batch 1 x accum 4: step-12 loss %.7f vs %.7f", ref_d, ref);
    for (int k = 0; k < 2; k++) {
        char mp[700], *t;
        size_t n;
        double l = NAN;
        snprintf(mp, sizeof mp, "%s/%s/metrics.jsonl", dir, outs[k]);
        if (sl_file_read_all(mp, &t, &n) == SL_OK) {
            char *p = strstr(t, "{\"step\": 12,");
            if (p) sscanf(p, "{\"step\": 12, \"loss\": %lf", &l);
            free(t);
        }
        TU_CHECK(fabs(l - ref) <= 1e-5 * fabs(ref), "resharded layout %s: step-12 loss %.7f vs %.7f", outs[k],
                 l, ref);
    }

    damaged_checkpoints();

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (tu_failures == 0) TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_ckpt");
}
