/* Faults under data parallelism that do not come from the job's own hooks:
 * - an external `kill -9` of a random rank at a random moment of a DP=2 ZeRO-1 run under
 *   `suanli run --max-restarts` (the moment is uniform over the uninterrupted run's measured duration, so
 *   it lands in a forward/backward, an all-reduce, the optimizer, a checkpoint write or a commit); the
 *   launcher restarts the job, which resumes from the newest valid checkpoint;
 * - torn writes under DP: (a) the writer or committer of every rank dying inside the commit protocol
 *   (SUANLI_FAULT_COMMIT_STAGE, one random stage per run), (b) the newest checkpoint's shard of rank 1
 *   truncated mid-file and the previous one's shard of rank 0 bit-flipped, as a crash or a disk would leave
 *   them: resume must skip both and use the newest valid one.
 * In every case the final weights must be bitwise equal to the uninterrupted run's (the oracle: same
 * seed, same layout, deterministic reductions). The seed is printed; SUANLI_TEST_SEED reproduces it. */
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "suanli/base.h"
#include "testutil.h"

static char out[1 << 17];
static char dir[512];
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

#define ITERS 24
#define DP2                                                                                                  \
    "run -n 2 --max-restarts 3 -- %s train --data-path data --num-layers 1 --hidden-size 32 "                \
    "--num-attention-heads 2 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --zero-stage 1 "     \
    "--lr-decay-iters 24 --eval-interval 0 --eval-iters 1 --threads 1"

static int same_weights(const char *a, const char *b) {
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", dir, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", dir, b);
    return tu_same_file(pa, pb);
}

/* the step of "resumed from [in-memory copy ]DIR/step-NNNNNNN" (or "pooled checkpoint LOCAL step-NNNNNNN")
 * in out, -1 when the run did not resume (Note [Where a resume came from] in src/train/job.c) */
static int resumed_step(void) {
    const char *p = strstr(out, "resumed from ");
    const char *s = p ? strstr(p, "step-") : NULL;
    return s ? atoi(s + 5) : -1;
}

int main(void) {
    cli = tu_cli();
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("ckpt_kill"));
    const char *es = getenv("SUANLI_TEST_SEED");
    uint64_t seed = es ? strtoull(es, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (SUANLI_TEST_SEED reproduces)\n", (unsigned long long)seed);
    int rc = run("sh -c 'head -c 20000 %s/data/tinyshakespeare.txt > s.txt && %s data prepare --input s.txt "
                 "--output-prefix data'",
                 SL_SOURCE_DIR, cli);
    TU_CHECK(rc == 0, "prepare: %s", out);

    /* the oracle: uninterrupted, with the same checkpoint cadence (saving does not change the numbers) */
    double t0 = sl_time_sec();
    rc = run("%s " DP2 " --train-iters %d --save base --save-interval 2", cli, cli, ITERS);
    double base_s = sl_time_sec() - t0;
    TU_CHECK(rc == 0, "baseline: %s", out);
    printf("uninterrupted DP=2 run: %.2f s\n", base_s);

    /* ---- external kill -9 at a random moment, three times ---- */
    for (int k = 0; k < 3; k++) {
        /* uniform in [5%, 85%] of the uninterrupted run; the rank is picked among the launcher's children
         * that run `train` (under the sanitizers the exiting launcher forks LeakSanitizer's tracer, a copy of
         * itself: killing that one leaves the launcher spinning in StopTheWorld until the timeout) */
        double frac = 0.05 + 0.8 * (double)(sl_rng_u64(seed, 7, (uint64_t)k) % 1000) / 1000.0;
        int victim = (int)(sl_rng_u64(seed, 8, (uint64_t)k) % 2) + 1;
        char name[32];
        snprintf(name, sizeof name, "kill%d", k);
        rc = run("sh -c '%s " DP2
                 " --train-iters %d --save %s --load %s --save-interval 2 & L=$!; sleep %.3f; "
                 "V=$(pgrep -P $L -f \"^[^ ]+ train \" | sed -n %dp); S=$(cut -d\" \" -f3 /proc/$V/stat "
                 "2>/dev/null); "
                 "if [ -n \"$V\" ] && [ \"$S\" != Z ]; then kill -9 $V && echo \"killed pid $V (state $S)\"; "
                 "fi; wait $L'",
                 cli, cli, ITERS, name, name, frac * base_s, victim);
        int killed = strstr(out, "killed pid") != NULL;
        printf("kill %d: rank #%d of the launcher's children at %.0f%% (%.2f s): %s, resumed at step %d\n", k,
               victim, 100 * frac, frac * base_s,
               killed ? "killed" : "no rank alive to kill (not yet forked, or done)", resumed_step());
        TU_CHECK(rc == 0, "kill %d (seed %llu): the restarted job must finish: rc %d %s", k,
                 (unsigned long long)seed, rc, out);
        /* a kill restarts the job, unless it hit a rank already past its last step (the job had trained:
         * a process inside exit keeps its exit status under SIGKILL). The shell's "killed pid" line and the
         * ranks' output reach `out` through different pipes, in either order, so "trained" may follow it. */
        TU_CHECK(!killed || strstr(out, "restart") || strstr(out, "trained "),
                 "kill %d: the launcher restarted the job: %s", k, out);
        TU_CHECK(same_weights("base", name),
                 "kill %d at %.2f s (seed %llu): final weights bitwise equal to the uninterrupted run", k,
                 frac * base_s, (unsigned long long)seed);
    }

    /* ---- (a) every rank dies inside the commit of the step-6 checkpoint, at a random stage ---- */
    {
        int stage = (int)(sl_rng_u64(seed, 9, 0) % 6);
        rc = run(
            "sh -c 'rm -rf torn && %s " DP2 " --train-iters 5 --save torn --save-interval 2 >/dev/null "
            "2>&1 && env SUANLI_FAULT_COMMIT_STAGE=%d %s run -n 2 -- %s train --data-path data "
            "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "
            "--global-batch-size 4 --zero-stage 1 --lr-decay-iters 24 --eval-interval 0 --eval-iters 1 "
            "--threads 1 --train-iters %d --save torn --load torn --save-interval 2'",
            cli, cli, stage, cli, cli, ITERS);
        TU_CHECK(rc != 0 && strstr(out, "dying inside the checkpoint commit"), "stage %d: the job died: %s",
                 stage, out);
        rc = run("%s ckpt verify torn", cli);
        TU_CHECK(rc == 0, "stage %d: a valid checkpoint remains: %s", stage, out);
        rc = run("%s " DP2 " --train-iters %d --save torn --load torn --save-interval 2", cli, cli, ITERS);
        int from = resumed_step();
        printf("commit stage %d killed under DP=2: resumed from step %d\n", stage, from);
        TU_CHECK(rc == 0 && from >= 4, "stage %d: resume from step >= 4: rc %d %s", stage, rc, out);
        TU_CHECK(same_weights("base", "torn"),
                 "stage %d: final weights bitwise equal to the uninterrupted run", stage);
    }

    /* ---- (b) torn and corrupted shard files: newest truncated mid-file (rank 1), previous bit-flipped
     * (rank 0): the one before them is used ---- */
    rc = run("sh -c 'rm -rf cut && %s " DP2 " --train-iters 8 --save cut --save-interval 2 --save-keep 0'",
             cli, cli);
    TU_CHECK(rc == 0, "torn-file setup: %s", out);
    rc = run("sh -c 'f=cut/step-0000008/shard-r00001.safetensors && truncate -s $(( $(stat -c %%s $f) / 2 )) "
             "$f && printf \"\\\\377\" | dd of=cut/step-0000006/shard-r00000.safetensors bs=1 seek=3000 "
             "conv=notrunc 2>/dev/null'");
    TU_CHECK(rc == 0, "tear: %s", out);
    rc = run("%s ckpt verify cut", cli);
    TU_CHECK(rc == 0 && strstr(out, "step-0000008") && strstr(out, "step-0000006") &&
                 strstr(out, "step-0000004"),
             "verify names the two damaged checkpoints and the valid one: %s", out);
    rc = run("%s " DP2 " --train-iters %d --save cut --load cut --save-interval 2 --save-keep 0", cli, cli,
             ITERS);
    TU_CHECK(rc == 0 && resumed_step() == 4, "torn files: resumed from step 4: rc %d %s", rc, out);
    TU_CHECK(same_weights("base", "cut"), "torn files: final weights bitwise equal to the uninterrupted run");

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (tu_failures == 0) TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_ckpt_kill");
}
