/* The CLI end to end: a tiny training run (files, metrics, generate) and every bad-input path of
 * `suanli train`: one line naming the problem, exit status 2, no crash, nothing half-written. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "suanli/base.h"
#include "suanli/data.h"
#include "testutil.h"

static char out[1 << 16];
static char dir[512], data[600];

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

#define run(...) tu_cli_run(out, sizeof out, __VA_ARGS__)

static int one_line(void) {
    size_t n = strlen(out);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += out[i] == '\n';
    return lines == 1 && n > 0 && out[n - 1] == '\n';
}

/* expect exit 2 with a one-line message containing `needle`, and nothing written: the bad train runs
 * all get --save DIR/never, and no entry under DIR was created, removed or modified (tu_watch) */
static void bad(const char *what, const char *needle, int rc) {
    TU_CHECK(rc == 2, "%s: exit %d (want 2); output: %s", what, rc, out);
    TU_CHECK(tu_unchanged(), "%s: something was written under %s", what, dir);
    TU_CHECK(strstr(out, needle) != NULL, "%s: message lacks '%s': %s", what, needle, out);
    TU_CHECK(one_line(), "%s: not exactly one line: %s", what, out);
}

#define TINY "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"

/* the JSON record of `bench train` (its last line that parses), or NULL */
static cJSON *bench_record(void) {
    cJSON *o = NULL;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (j) {
            cJSON_Delete(o);
            o = j;
        }
    }
    return o;
}

/* `bench train --json` reports peak RSS and MFU against the GEMMs' dtype (issue 20 items 2, 5); --fp16
 * (autocast fp16 with dynamic loss scaling) reports its dtype, a loss scale, and MFU against the fp32 peak
 * (its GEMMs run widened to fp32: Note [f16 GEMM]: peak_dtype says so, and mfu equals mfu_f32_peak); --fp16
 * with --bf16 is
 * refused;
 * `--plan-only` shows the planner's donation (Note [Donated storage]): without it (SUANLI_PLAN_DONATE=0)
 * the arena holds the logits' gradient beside the logits, B * T * V floats more (2 * 16 * 4096 * 4 B =
 * 0.5 MiB here); GELU's gradient may take a buffer too, so "at least" */
static void test_bench_train(void) {
    static const char *flag[3] = {"", " --bf16", " --fp16"}, *dtype[3] = {"f32", "bf16-mixed", "fp16-mixed"};
    for (int k = 0; k < 3; k++) {
        int rc =
            run("bench train " TINY " --vocab-size 256 --steps 2 --warmup 0 --threads 1 --json%s", flag[k]);
        cJSON *o = rc == 0 ? bench_record() : NULL;
        const cJSON *rss = cJSON_GetObjectItem(o, "peak_rss_mib"), *dt = cJSON_GetObjectItem(o, "dtype"),
                    *mfu = cJSON_GetObjectItem(o, "mfu"), *mfu32 = cJSON_GetObjectItem(o, "mfu_f32_peak"),
                    *ls = cJSON_GetObjectItem(o, "loss_scale"), *pk = cJSON_GetObjectItem(o, "peak_dtype");
        TU_CHECK(o && cJSON_IsNumber(rss) && rss->valuedouble > 0 && cJSON_IsNumber(mfu) &&
                     cJSON_IsNumber(mfu32) && cJSON_IsString(dt) && !strcmp(dt->valuestring, dtype[k]) &&
                     cJSON_IsNumber(ls),
                 "bench train --json%s: rc %d, record %s", flag[k], rc, out);
        if (k == 2) /* 2^32 overflows at once here: the scaler halves and skips, as train --fp16 does */
            TU_CHECK(cJSON_IsNumber(mfu) && cJSON_IsNumber(mfu32) && mfu->valuedouble == mfu32->valuedouble &&
                         ls->valuedouble >= 1 && ls->valuedouble <= 4294967296.0 && cJSON_IsString(pk) &&
                         !strcmp(pk->valuestring, "fp32 (f16 widened)") &&
                         cJSON_IsNumber(cJSON_GetObjectItem(o, "skipped_steps")),
                     "bench train --fp16: MFU against the fp32 peak, a loss scale: %s", out);
        else
            TU_CHECK(cJSON_IsNumber(ls) && ls->valuedouble == 1, "bench train%s: loss scale 1: %s", flag[k],
                     out);
        cJSON_Delete(o);
    }
    TU_CHECK(run("bench train " TINY " --vocab-size 256 --steps 1 --json --bf16 --fp16") == 2 &&
                 strstr(out, "--fp16 and --bf16 exclude each other"),
             "bench train --bf16 --fp16 refused: %s", out);
    double mib[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        if (k) setenv("SUANLI_PLAN_DONATE", "0", 1);
        int rc = run("bench train --plan-only --num-layers 1 --hidden-size 32 --num-attention-heads 2 "
                     "--vocab-size 4096 --seq-length 16 --micro-batch-size 2 --threads 1");
        unsetenv("SUANLI_PLAN_DONATE");
        cJSON *o = rc == 0 ? bench_record() : NULL;
        const cJSON *a = cJSON_GetObjectItem(o, "activation_mib");
        TU_CHECK(cJSON_IsNumber(a), "bench train --plan-only: rc %d %s", rc, out);
        mib[k] = cJSON_IsNumber(a) ? a->valuedouble : 0;
        cJSON_Delete(o);
    }
    TU_CHECK(mib[1] - mib[0] >= 0.5 - 0.01, "donation saves the logits' 0.5 MiB: %.2f MiB with, %.2f without",
             mib[0], mib[1]);
}

/* --config files: unknown keys, wrong types, malformed or trailing JSON, a directory, an empty value */
static void test_bad_config(void) {
    char cfgp[700];
    snprintf(cfgp, sizeof cfgp, "%s/cfg.json", dir);
    FILE *f;
    f = fopen(cfgp, "w");
    fprintf(f, "{\"num_layers\": 1, \"learning_rate\": 0.1}\n");
    fclose(f);
    bad("unknown config key", "learning_rate",
        run("train --save %s/never --config %s --data-path %s", dir, cfgp, data));
    f = fopen(cfgp, "w");
    fprintf(f, "{\"num_layers\": 1.5}\n");
    fclose(f);
    bad("non-integer config value", "num_layers",
        run("train --save %s/never --config %s --data-path %s", dir, cfgp, data));
    f = fopen(cfgp, "w");
    fprintf(f, "{not json\n");
    fclose(f);
    bad("malformed config", "cfg.json",
        run("train --save %s/never --config %s --data-path %s", dir, cfgp, data));
    f = fopen(cfgp, "w"); /* the second object's keys were silently ignored */
    fprintf(f, "{\"num_layers\": 1}\n{\"train_iters\": 5}\n");
    fclose(f);
    bad("text after the config object", "cfg.json: not a JSON object (text after it)",
        run("train --save %s/never --config %s --data-path %s " TINY, dir, cfgp, data));
    f = fopen(cfgp, "w"); /* true was read as 1: a run at lr 1 */
    fprintf(f, "{\"lr\": true}\n");
    fclose(f);
    bad("boolean for a number key", "cfg.json: key 'lr' is a boolean, expected a number",
        run("train --save %s/never --config %s --data-path %s " TINY, dir, cfgp, data));
    f = fopen(cfgp, "w"); /* was "'1000...5411' is not an integer" (the digits cut at 64 bytes) */
    fprintf(f, "{\"train_iters\": 1e300}\n");
    fclose(f);
    bad("huge integer in a config", "cfg.json: --train-iters: 1e+300 out of range [0, 1000000000000]",
        run("train --save %s/never --config %s --data-path %s " TINY, dir, cfgp, data));
    bad("config is a directory", "is a directory",
        run("train --save %s/never --config %s --data-path %s", dir, data, data));
    bad("empty --config=", "--config: empty value",
        run("train --save %s/never --config= --data-path %s", dir, data));
}

/* every bad-input path: exit 2, one line naming the problem, nothing written (bad()) */
/* the bench subcommands' help and their refused flags (exit 2, one line naming the flag) */
static void test_bench_flags(void) {
    int rc;
    const char *suites[] = {"train", "moe", "generate", "kernels"};
    for (int k = 0; k < 4; k++) {
        rc = run("bench %s --help", suites[k]);
        TU_CHECK(rc == 0 && strstr(out, "usage: suanli bench") && strstr(out, "--json"),
                 "bench %s --help: %d %s", suites[k], rc, out);
    }
    bad("bench kernels --only", "--only 'nosuch' matches no kernel", run("bench kernels --only nosuch"));
    bad("bench moe --recompute-granularity", "--recompute-granularity: expected full, got 'selective'",
        run("bench moe --recompute-granularity selective"));
    /* --mixtral: a Mixtral block (no shared expert), named in the record */
    rc = run(
        "bench moe --mixtral --num-layers 1 --hidden-size 32 --num-attention-heads 2 --num-query-groups 1 "
        "--moe-ffn-hidden-size 16 --vocab-size 64 --seq-length 8 --micro-batch-size 2 --steps 1 --warmup 0 "
        "--bf16 --json");
    TU_CHECK(rc == 0 && strstr(out, "\"model\": \"mixtral\"") && strstr(out, "\"shared\": 0"),
             "bench moe --mixtral: %d %s", rc, out);
    /* 2^44 MiB wrapped to 0 bytes and "measured" 0 GB/s, exit 0 */
    bad("bench ec --mib", "--mib: 17592186044416 out of range [1, 65536]",
        run("bench ec --mib 17592186044416 --reps 1"));
    /* the messages named the value ("bad flag '0'"), not the flag */
    bad("bench ec --reps", "--reps: 0 out of range [1, 100]", run("bench ec --reps 0"));
    bad("bench ckpt-io --mib", "--mib: '12abc' is not an integer",
        run("bench ckpt-io --mib 12abc --dir %s", dir));
    bad("bench ckpt-io --dir", "--dir: missing value", run("bench ckpt-io --dir"));
    /* no size between them: empty tables, exit 0; inf and 1e30 became size 0 (an undefined conversion) */
    bad("bench comm min > max", "--max-bytes 10 is below --min-bytes 100",
        run("bench comm --min-bytes 100 --max-bytes 10"));
    bad("bench comm inf", "--max-bytes: expected a size", run("bench comm --max-bytes inf"));
    bad("bench comm 1e30", "--min-bytes: expected a size", run("bench comm --min-bytes 1e30"));
    bad("bench comm --iters", "--iters: expected an integer in 1..1073741824, got '5abc'",
        run("bench comm --iters 5abc")); /* atoi: 5 */
    bad("bench comm -n", "-n: expected an integer in 1..4096, got '99999999999'",
        run("bench comm -n 99999999999"));
    bad("bench comm --reps", "--reps: missing value", run("bench comm --reps"));
    bad("bench ops --device", "--device: missing value", run("bench ops --quick --device"));
    /* atoi: '1x' ran the whole suite on 1 thread, and a missing value was an "unknown flag" */
    bad("bench ops --threads", "--threads: expected an integer in 1..1024, got '1x'",
        run("bench ops --quick --threads 1x"));
    bad("bench ops --reps", "--reps: expected an integer in 1..1024, got ''",
        run("bench ops --quick --reps"));
}

/* found by a bad-input audit of every subcommand (each: exit 2, one line naming the flag or file, nothing
 * written under DIR): the ckpt usage text for a wrong subcommand, an extra argument or --step without a
 * value; --step 1e20 taken as LLONG_MAX; a file as --output of convert and as --ckpt-local-dir (train ran,
 * then exit 1 at the first checkpoint with --save written); a bad --tokenizer-file and data info of a
 * missing DIR exited 1; topo --export-xml "" */
static void test_input_audit(void) {
    bad("ckpt unknown subcommand", "suanli ckpt: unknown subcommand 'bogus'", run("ckpt bogus %s", dir));
    bad("ckpt extra argument", "suanli ckpt inspect: unexpected argument 'extra'",
        run("ckpt inspect %s/run1 extra", dir));
    bad("ckpt gather without OUT", "suanli ckpt gather: expected POOL and OUT",
        run("ckpt gather %s/run1", dir));
    bad("ckpt gather --step at the end", "suanli ckpt gather: --step: missing value",
        run("ckpt gather %s/run1 %s/g --step", dir, dir));
    bad("ckpt gather huge --step", "--step: expected a step number, got '99999999999999999999'",
        run("ckpt gather %s/run1 %s/g --step 99999999999999999999", dir, dir));
    bad("convert --output a file", "small.txt: not a directory",
        run("convert --model %s/tests/fixtures/hf/gpt2 --output %s/small.txt", SL_SOURCE_DIR, dir));
    bad("convert --to hf-gpt2 --output a file", "--output ",
        run("convert --from suanli --to hf-gpt2 --input %s/run1 --output %s/small.txt/x", dir, dir));
    bad("bad --tokenizer-file", "prepare: --tokenizer-file: ",
        run("data prepare --input %s/small.txt --output-prefix %s/never --tokenizer-file %s/nothing", dir,
            dir, dir));
    bad("data info of a missing dir", "data info: ", run("data info %s/nothing", dir));
    bad("empty --export-xml", "--export-xml: empty value", run("topo --export-xml ''"));
    bad("--ckpt-local-dir a file", "--ckpt-local-dir: ",
        run("train --save %s/never --data-path %s " TINY
            " --train-iters 1 --save-interval 1 --ckpt-local-dir "
            "%s/small.txt",
            dir, data, dir));
}

/* bad values of the recomputation, lanes and pipeline-chunk flags (exit 2, nothing written) */
static void test_bad_layout_flags(void) {
    /* full recomputation takes Megatron's value full; selective is refused with the reason */
    bad("recompute selective", "--recompute-granularity: expected full, got 'selective' (selective is what",
        run("train --save %s/never --data-path %s " TINY " --recompute-granularity selective", dir, data));
    bad("recompute bogus", "--recompute-granularity: expected full, got 'layer'",
        run("train --save %s/never --data-path %s " TINY " --recompute-granularity layer", dir, data));
    bad("recompute method alone", "--recompute-method needs --recompute-granularity full",
        run("train --save %s/never --data-path %s " TINY " --recompute-method block", dir, data));
    bad("recompute layers alone", "--recompute-num-layers needs --recompute-granularity full",
        run("train --save %s/never --data-path %s " TINY " --recompute-num-layers 2", dir, data));
    bad("recompute method bogus", "--recompute-method: expected uniform or block, got 'all'",
        run("train --save %s/never --data-path %s " TINY
            " --recompute-granularity full --recompute-method all",
            dir, data));
    /* micro-batch lanes (Note [Micro-batch lanes]): a count that does not divide the micro-batch, and one out
     * of range, are bad input checked before anything is written (the first exited 1 at the trainer) */
    bad("lanes not dividing", "--micro-batch-lanes 3 does not divide --micro-batch-size 2",
        run("train --save %s/never --data-path %s " TINY " --micro-batch-lanes 3", dir, data));
    bad("lanes out of range", "--micro-batch-lanes",
        run("train --save %s/never --data-path %s " TINY " --micro-batch-lanes 17", dir, data));
    /* interleaving without a pipeline was accepted (the check sat under tp > 1 || pp > 1) */
    bad("virtual stages without pp", "--num-layers-per-virtual-pipeline-stage needs",
        run("train --save %s/never --data-path %s " TINY " --num-layers 2 "
            "--num-layers-per-virtual-pipeline-stage 1",
            dir, data));
}

static void test_bad_input(void) {
    int rc;
    char cmd[2048], cfgp[700];
    snprintf(cfgp, sizeof cfgp, "%s/cfg.json", dir);
    FILE *f;
    bad("missing data dir", "nonexistent",
        run("train --save %s/never --data-path %s/nonexistent " TINY, dir, dir));
    bad("no data path", "--data-path", run("train --save %s/never " TINY, dir));
    bad("malformed number", "--lr", run("train --save %s/never --data-path %s --lr abc", dir, data));
    bad("out of range", "--num-layers",
        run("train --save %s/never --data-path %s --num-layers 0", dir, data));
    bad("unknown flag", "--frobnicate",
        run("train --save %s/never --data-path %s --frobnicate 3", dir, data));
    bad("missing value", "--seed", run("train --save %s/never --data-path %s --seed", dir, data));
    bad("batch multiple", "--global-batch-size",
        run("train --save %s/never --data-path %s --micro-batch-size 3 --global-batch-size 8", dir, data));
    /* --save-interval without --save saved nothing and exited 0; also with an in-memory checkpoint root
     * (SUANLI_MEM_CKPT_DIR: the copy is written beside the --save commit, never alone) */
    bad("--save-interval without --save", "--save-interval 2 needs --save (",
        run("train --data-path %s " TINY " --train-iters 2 --save-interval 2", data));
    char memenv[700];
    snprintf(memenv, sizeof memenv, "env SUANLI_MEM_CKPT_DIR=%s/mem", dir);
    bad("--save-interval without --save, in-memory root", "--save-interval 3 needs --save (",
        tu_runf(out, sizeof out, memenv, "%s train --data-path %s " TINY " --train-iters 2 --save-interval 3",
                tu_cli(), data));
    /* the LR schedule's checks (both survived a mutation audit: no test gave such flags) */
    bad("min lr above lr", "--min-lr 0.01 exceeds --lr 0.001",
        run("train --save %s/never --data-path %s " TINY " --lr 0.001 --min-lr 0.01", dir, data));
    bad("warmup past decay", "--lr-warmup-iters 10 exceeds the decay length 5",
        run("train --save %s/never --data-path %s " TINY " --lr-warmup-iters 10 --lr-decay-iters 5", dir,
            data));
    {
        /* a window of seq-length tokens needs seq-length + 1 (its targets): a split of exactly N tokens
         * refuses --seq-length N (the bound checked as seq-length survived) */
        sl_dataset *ds = NULL;
        TU_CHECK(sl_dataset_open(data, "val", &ds) == SL_OK, "open val: %s", sl_errmsg());
        long long n = ds ? (long long)sl_dataset_num_tokens(ds) : 0;
        sl_dataset_close(ds);
        char msg[96];
        snprintf(msg, sizeof msg, "a split has fewer than seq-length+1 = %lld tokens", n + 1);
        bad("split of seq-length tokens", msg,
            run("train --save %s/never --data-path %s --num-layers 1 --hidden-size 32 --num-attention-heads "
                "2 "
                "--micro-batch-size 1 --seq-length %lld",
                dir, data, n));
    }
    test_bad_layout_flags();
    bad("heads divide", "divisible",
        run("train --save %s/never --data-path %s --hidden-size 30 --num-attention-heads 4", dir, data));
    bad("vocab mismatch", "vocab",
        run("train --data-path %s " TINY " --vocab-size 300 --save %s/never", data, dir));
    char never[700];
    snprintf(never, sizeof never, "%s/never", dir);
    TU_CHECK(!exists(never), "nothing written on a rejected run");
    test_bad_config();
    /* output dir under a regular file cannot be created (we run as root, so permissions would not stop us) */
    bad("unwritable save dir", "run1/metrics.jsonl/x",
        run("train --data-path %s " TINY " --train-iters 1 --save %s/run1/metrics.jsonl/x", data, dir));
    /* a refused --tensorboard-dir had already made --save and its metrics.jsonl */
    bad("tensorboard dir under a file", "--tensorboard-dir",
        run("train --data-path %s " TINY
            " --train-iters 1 --save %s/never --tensorboard-dir %s/run1/metrics.jsonl/tb",
            data, dir, dir));
    /* and a refused --save leaves no TensorBoard file (made then removed: the test dir's mtime changes) */
    rc = run("train --data-path %s " TINY
             " --train-iters 1 --save %s/run1/metrics.jsonl/x --tensorboard-dir %s/tbnever",
             data, dir, dir);
    snprintf(cmd, sizeof cmd, "%s/tbnever", dir);
    TU_CHECK(rc == 2 && one_line() && strstr(out, "--save") && !exists(cmd),
             "refused --save with --tensorboard-dir: rc %d, %s left: %d: %s", rc, cmd, exists(cmd), out);
    /* Note [A refused output removes what it made]: the directories a refused run had made (mkdir -p)
     * stayed: tbnew/a of a --tensorboard-dir before a refused --save (only its leaf was removed), and the
     * parents made before a component too long to create (ENAMETOOLONG) of --save or --tensorboard-dir;
     * now none is left (made then removed: the test dir's mtime changes, so not bad()) */
    {
        char longc[300];
        memset(longc, 'a', 299);
        longc[299] = 0;
        const char *what[] = {"--tensorboard-dir tbnew/a/b before a refused --save",
                              "--save savenew/<299 chars>", "--tensorboard-dir tbnew2/<299 chars>"};
        const char *left[] = {"tbnew", "savenew", "tbnew2"};
        for (int k = 0; k < 3; k++) {
            if (k == 0)
                rc = run("train --data-path %s " TINY " --train-iters 1 --tensorboard-dir %s/tbnew/a/b "
                         "--save %s/run1/metrics.jsonl/x",
                         data, dir, dir);
            else if (k == 1)
                rc = run("train --data-path %s " TINY " --train-iters 1 --save %s/savenew/%s", data, dir,
                         longc);
            else
                rc = run("train --data-path %s " TINY
                         " --train-iters 1 --save %s/never --tensorboard-dir %s/tbnew2/%s",
                         data, dir, dir, longc);
            snprintf(cmd, sizeof cmd, "%s/%s", dir, left[k]);
            TU_CHECK(rc == 2 && one_line() && strstr(out, k == 2 ? "--tensorboard-dir" : "--save") &&
                         !exists(cmd),
                     "%s: rc %d, %s left: %d: %s", what[k], rc, cmd, exists(cmd), out);
        }
        snprintf(cmd, sizeof cmd, "%s/never", dir);
        TU_CHECK(!exists(cmd), "refused --tensorboard-dir left --save %s", cmd);
        /* an event file whose first record cannot be written (a file size limit of 0: EFBIG, SIGXFSZ
         * ignored) stayed, empty, and so did its directory */
        rc = tu_runf(out, sizeof out, "trap '' XFSZ; ulimit -f 0;",
                     "%s train --data-path %s " TINY " --train-iters 1 --tensorboard-dir %s/tbfull", tu_cli(),
                     data, dir);
        snprintf(cmd, sizeof cmd, "%s/tbfull", dir);
        TU_CHECK(rc == 2 && one_line() && strstr(out, "--tensorboard-dir") && !exists(cmd),
                 "event file not writable: rc %d, %s left: %d: %s", rc, cmd, exists(cmd), out);
    }
    /* Note [Notes after the checks]: the notes setup finds ("no checkpoint in X yet", "--zero-stage has no
     * effect") came before the error line of a run refused later in setup: two lines */
    bad("fresh --load = --save, then a vocab mismatch", "vocab",
        run("train --data-path %s " TINY " --vocab-size 300 --load %s/never --save %s/never", data, dir,
            dir));
    bad("--zero-stage note, then a refused --save", "--save",
        run("train --data-path %s " TINY " --zero-stage 1 --save %s/run1/metrics.jsonl/x", data, dir));
    rc = run("train --data-path %s " TINY " --train-iters 1 --eval-iters 1 --zero-stage 1 --load %s/fresh "
             "--save %s/fresh",
             data, dir, dir);
    TU_CHECK(rc == 0 && strstr(out, "note: no checkpoint in") &&
                 strstr(out, "note: --zero-stage 1 has no effect"),
             "the notes of an accepted run: rc %d: %s", rc, out);
    /* --save naming a checkpoint step dir nested step-0000004 inside step-0000002 and wrote the final
     * weights and metrics.jsonl into it (Note [--save is a run directory]); refused, naming the run dir */
    rc = run("train --data-path %s " TINY " --train-iters 2 --save-interval 2 --eval-iters 1 --save %s/ck",
             data, dir);
    TU_CHECK(rc == 0, "checkpointed run: %s", out);
    snprintf(cmd, sizeof cmd, "--save %s/ck)", dir);
    bad("--save is a step dir", cmd,
        run("train --data-path %s " TINY " --train-iters 4 --save-interval 2 --eval-iters 1 "
            "--load %s/ck/step-0000002 --save %s/ck/step-0000002",
            data, dir, dir));
    TU_CHECK(strstr(out, "is a checkpoint step directory"), "--save is a step dir: %s", out);
    /* corrupt shards: truncated, foreign */
    char cp[2048];
    snprintf(cp, sizeof cp, "cp -r %s %s/trunc && truncate -s 20 %s/trunc/train_000.bin", data, dir, dir);
    TU_CHECK(system(cp) == 0, "copy");
    bad("truncated shard header", "train_000.bin",
        run("train --save %s/never --data-path %s/trunc " TINY, dir, dir));
    snprintf(cp, sizeof cp, "cp -r %s %s/foreign && head -c 4096 /dev/urandom > %s/foreign/val_000.bin", data,
             dir, dir);
    TU_CHECK(system(cp) == 0, "copy");
    bad("foreign shard", "val_000.bin", run("train --save %s/never --data-path %s/foreign " TINY, dir, dir));
    snprintf(cp, sizeof cp, "cp -r %s %s/short && truncate -s -100 %s/short/train_000.bin", data, dir, dir);
    TU_CHECK(system(cp) == 0, "copy");
    bad("truncated shard payload", "train_000.bin",
        run("train --save %s/never --data-path %s/short " TINY, dir, dir));
    bad("generate without weights", "config.json", run("generate --load %s/nothing", dir));
    rc = run("ckpt --help");
    TU_CHECK(rc == 0 && strstr(out, "usage: suanli ckpt"), "ckpt --help: exit %d: %s", rc, out);
    rc = run("ckpt inspect --help");
    TU_CHECK(rc == 0 && strstr(out, "usage: suanli ckpt"), "ckpt inspect --help: exit %d: %s", rc, out);
    rc = run("ckpt verify -h");
    TU_CHECK(rc == 0 && strstr(out, "usage: suanli ckpt"), "ckpt verify -h: exit %d: %s", rc, out);
    /* the help says what runs: --expert-tensor-parallel-size combines with --ep (test_ep_cli's etp2ep2
     * cases), so the help must not call it missing */
    rc = run("train --help");
    TU_CHECK(rc == 0 && strstr(out, "--expert-tensor-parallel-size") && !strstr(out, "no --ep yet"),
             "train --help on --expert-tensor-parallel-size: %d %s", rc, out);
    /* a fresh run (no --load) into an earlier run's --save is refused and leaves it as it was: it used to
     * overwrite its model and prune its own first checkpoint below the earlier run's newer ones */
    snprintf(cmd, sizeof cmd, "%s/prev/step-0000005", dir);
    TU_CHECK(sl_mkdirs(cmd) == SL_OK, "mkdir %s", cmd);
    bad("fresh run over checkpoints", "already holds an earlier run's checkpoints (newest step-0000005)",
        run("train --save %s/prev --data-path %s " TINY, dir, data));
    snprintf(cmd, sizeof cmd, "%s/prevm", dir);
    TU_CHECK(sl_mkdirs(cmd) == SL_OK, "mkdir %s", cmd);
    snprintf(cmd, sizeof cmd, "%s/prevm/model.safetensors", dir);
    TU_CHECK((f = fopen(cmd, "w")) && fputs("x", f) >= 0 && fclose(f) == 0, "write %s", cmd);
    bad("fresh run over a model", "already holds an earlier run's model.safetensors: pass --load",
        run("train --save %s/prevm --data-path %s " TINY, dir, data));
    /* a refused gather keeps the empty OUT it was given (it removed it; bad() checks nothing changed) */
    snprintf(cmd, sizeof cmd, "%s/pool/host-0", dir);
    TU_CHECK(sl_mkdirs(cmd) == SL_OK, "mkdir %s", cmd);
    snprintf(cmd, sizeof cmd, "%s/gout", dir);
    TU_CHECK(sl_mkdirs(cmd) == SL_OK, "mkdir %s", cmd);
    bad("gather from an empty pool", "no pooled checkpoint", run("ckpt gather %s/pool %s", dir, cmd));
    /* --load of a model with another shape: flags conflict */
    bad("load conflict", "--hidden-size",
        run("train --save %s/never --data-path %s --load %s/run1 --hidden-size 64", dir, data, dir));
}

/* generate --load of a checkpoint step (train --save-interval) failed with only "model.safetensors:
 * cannot open": the step's parameters (resharded whole) give the final model's sample, the run root
 * without a model.safetensors loads its latest step, the tokenizer comes from the run dir (one line when
 * absent), and an --init-from model's checkpoint is refused naming how to make a model of it */
static void test_generate_checkpoint(const char *data, const char *dir) {
    int rc;
    static char gs[2][1 << 16];
    char c[4096];
    rc = run("train --data-path %s " TINY " --train-iters 4 --save-interval 2 --eval-iters 1 --save %s/gck "
             "--threads 2",
             data, dir);
    TU_CHECK(rc == 0, "train --save-interval: %s", out);
    for (int k = 0; k < 2; k++) {
        snprintf(c, sizeof c,
                 "{ %s generate --load %s/gck%s --prompt ROMEO --max-new-tokens 24 --temperature 1 --seed 5 "
                 "2>/dev/null; }",
                 tu_cli(), dir, k ? "/step-0000004" : "");
        rc = tu_run(c, out, sizeof out);
        TU_CHECK(rc == 0 && !strncmp(out, "ROMEO", 5), "generate --load gck%s: rc %d %s",
                 k ? "/step-0000004" : "", rc, out);
        memcpy(gs[k], out, sizeof out);
    }
    TU_CHECK(!strcmp(gs[0], gs[1]), "step-0000004 samples as the final model: '%s' vs '%s'", gs[1], gs[0]);
    snprintf(c, sizeof c, "mkdir -p %s/gck2 && cp -r %s/gck/step-0000004 %s/gck/latest %s/gck2/", dir, dir,
             dir, dir);
    rc = tu_run(c, out, sizeof out);
    TU_CHECK(rc == 0, "copy a checkpoint: %s", out);
    tu_watch(dir);
    bad("checkpoint without a tokenizer", "no tokenizer.json",
        run("generate --load %s/gck2 --max-new-tokens 2", dir));
    snprintf(c, sizeof c,
             "cp %s/gck/tokenizer.json %s/gck2/ && { %s generate --load %s/gck2 --prompt ROMEO "
             "--max-new-tokens 24 "
             "--temperature 1 --seed 5 2>/dev/null; }",
             dir, dir, tu_cli(), dir);
    rc = tu_run(c, out, sizeof out);
    TU_CHECK(rc == 0 && !strcmp(out, gs[0]), "the root's latest step: rc %d '%s'", rc, out);
    { /* the step's config.json as an --init-from run writes it: another architecture */
        char cp[700];
        snprintf(cp, sizeof cp, "%s/gck2/step-0000004/config.json", dir);
        FILE *f = fopen(cp, "w");
        TU_CHECK(f && fputs("{\"architecture\": \"llama\"}", f) >= 0, "write %s", cp);
        if (f) fclose(f);
    }
    tu_watch(dir);
    bad("checkpoint of an --init-from model", "--init-from llama model; make a model dir of it with",
        run("generate --load %s/gck2/step-0000004 --max-new-tokens 2", dir));
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("cli"));
    snprintf(data, sizeof data, "%s/data", dir);
    tu_watch(dir); /* every run records the tree before it (bad() checks that nothing changed) */
    /* a small corpus: the first 20 KB of tinyshakespeare */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "head -c 20000 %s/data/tinyshakespeare.txt > %s/small.txt", SL_SOURCE_DIR, dir);
    TU_CHECK(system(cmd) == 0, "corpus");
    int rc = run("data prepare --input %s/small.txt --output-prefix %s --tokenizer-type byte", dir, data);
    TU_CHECK(rc == 0, "prepare: %s", out);

    /* happy path: train, save, metrics, generate */
    rc = run("train --data-path %s " TINY " --train-iters 6 --eval-interval 3 --eval-iters 2 --save %s/run1 "
             "--sample-tokens 8 --threads 2",
             data, dir);
    TU_CHECK(rc == 0, "train: %s", out);
    TU_CHECK(strstr(out, "step 6/6") && strstr(out, "val loss") && strstr(out, "tokens/s") &&
                 strstr(out, "ETA"),
             "progress lines: %s", out);
    const char *files[] = {"model.safetensors", "config.json", "tokenizer.json", "metrics.jsonl"};
    for (int i = 0; i < 4; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/run1/%s", dir, files[i]);
        TU_CHECK(exists(p), "missing %s", p);
    }
    char mp[700], *mtext = NULL;
    size_t mlen = 0;
    snprintf(mp, sizeof mp, "%s/run1/metrics.jsonl", dir);
    TU_CHECK(sl_file_read_all(mp, &mtext, &mlen) == SL_OK, "read metrics");
    int nlines = 0, nval = 0;
    for (char *line = mtext ? strtok(mtext, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        TU_CHECK(o && cJSON_IsNumber(cJSON_GetObjectItem(o, "step")) &&
                     cJSON_IsNumber(cJSON_GetObjectItem(o, "loss")) &&
                     cJSON_IsNumber(cJSON_GetObjectItem(o, "lr")) &&
                     cJSON_IsNumber(cJSON_GetObjectItem(o, "grad_norm")) &&
                     cJSON_IsNumber(cJSON_GetObjectItem(o, "tokens_per_s")),
                 "metrics line: %s", line);
        nval += cJSON_GetObjectItem(o, "val_loss") != NULL;
        cJSON_Delete(o);
        nlines++;
    }
    free(mtext);
    TU_CHECK(nlines == 6 && nval == 2, "metrics: %d lines, %d with val_loss", nlines, nval);
    /* --min-lr defaults to --lr / 10 (Megatron's 0.1 x): past --lr-decay-iters the schedule holds it */
    rc = run("train --data-path %s " TINY " --train-iters 3 --lr-decay-iters 1 --lr 0.002 --eval-interval 0 "
             "--save %s/lrmin --threads 1",
             data, dir);
    TU_CHECK(rc == 0, "train lrmin: %s", out);
    snprintf(mp, sizeof mp, "%s/lrmin/metrics.jsonl", dir);
    TU_CHECK(fabs(tu_metric_at(mp, 3, "lr") - 2e-4) <= 1e-9, "lr after the decay: %g, expected min-lr 2e-4",
             tu_metric_at(mp, 3, "lr"));
    /* the last step is evaluated whatever the interval (here none): val_loss on step 3 only */
    TU_CHECK(isnan(tu_metric_at(mp, 1, "val_loss")) && isnan(tu_metric_at(mp, 2, "val_loss")) &&
                 isfinite(tu_metric_at(mp, 3, "val_loss")),
             "--eval-interval 0: val_loss at steps 1-3: %g %g %g", tu_metric_at(mp, 1, "val_loss"),
             tu_metric_at(mp, 2, "val_loss"), tu_metric_at(mp, 3, "val_loss"));
    /* --train-iters 0 printed "final val loss nan" (Note [No steps to run]): now the val loss of the initial
     * weights, the same number in metrics.jsonl (an eval-only line) and config.json; suanli plot takes it */
    rc = run("train --data-path %s " TINY " --train-iters 0 --eval-iters 2 --save %s/run0 --threads 2", data,
             dir);
    double v0 = -1;
    const char *nl = strstr(out, "no steps to train (--train-iters 0); val loss ");
    TU_CHECK(rc == 0 && nl && sscanf(nl, "no steps to train (--train-iters 0); val loss %lf", &v0) == 1 &&
                 v0 > 1 && v0 < 10 && !strstr(out, "nan"),
             "--train-iters 0: rc %d: %s", rc, out);
    snprintf(mp, sizeof mp, "%s/run0/metrics.jsonl", dir);
    TU_CHECK(sl_file_read_all(mp, &mtext, &mlen) == SL_OK, "read %s", mp);
    {
        cJSON *o = mtext ? cJSON_Parse(mtext) : NULL;
        const cJSON *st = cJSON_GetObjectItem(o, "step"), *vl = cJSON_GetObjectItem(o, "val_loss");
        TU_CHECK(o && cJSON_IsNumber(st) && st->valuedouble == 0 && cJSON_IsNumber(vl) &&
                     fabs(vl->valuedouble - v0) < 1e-4 && !cJSON_GetObjectItem(o, "loss") &&
                     strchr(mtext, '\n') == mtext + mlen - 1,
                 "--train-iters 0: metrics.jsonl: %s", mtext ? mtext : "(none)");
        cJSON_Delete(o);
        free(mtext);
        mtext = NULL;
    }
    snprintf(mp, sizeof mp, "%s/run0/config.json", dir);
    TU_CHECK(sl_file_read_all(mp, &mtext, &mlen) == SL_OK, "read %s", mp);
    {
        cJSON *o = mtext ? cJSON_Parse(mtext) : NULL;
        const cJSON *vl = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "train"), "val_loss");
        TU_CHECK(cJSON_IsNumber(vl) && fabs(vl->valuedouble - v0) < 1e-4, "--train-iters 0: config.json: %s",
                 mtext ? mtext : "(none)");
        cJSON_Delete(o);
        free(mtext);
        mtext = NULL;
    }
    rc = run("plot %s/run0", dir);
    TU_CHECK(rc == 0, "plot of a --train-iters 0 run: %s", out);
    rc = run("generate --load %s/run1 --prompt ROMEO --max-new-tokens 12 --temperature 0", dir);
    TU_CHECK(rc == 0 && strncmp(out, "ROMEO", 5) == 0, "generate: %s", out);
    test_generate_checkpoint(data, dir);
    /* dropout (issue 20): trains with both flags; out-of-range probabilities are bad input, before any write
     */
    rc = run("train --data-path %s " TINY " --train-iters 3 --eval-interval 3 --eval-iters 1 "
             "--attention-dropout 0.1 --hidden-dropout 0.2 --threads 2",
             data);
    TU_CHECK(rc == 0 && strstr(out, "step 3/3"), "train with dropout: %s", out);
    bad("attention dropout 1", "--attention-dropout 1 is not in [0, 1)",
        run("train --data-path %s " TINY " --train-iters 1 --attention-dropout 1 --save %s/nodrop", data,
            dir));
    bad("hidden dropout < 0", "--hidden-dropout -0.1 is not in [0, 1)",
        run("train --data-path %s " TINY " --train-iters 1 --hidden-dropout -0.1 --save %s/nodrop", data,
            dir));
    {
        char nd[700];
        snprintf(nd, sizeof nd, "%s/nodrop", dir);
        TU_CHECK(!exists(nd), "a refused dropout run wrote %s", nd);
    }
    /* the --model-only flags are refused with --load (exit 2, one line naming the flag), not ignored */
    {
        const char *model_only[] = {"--dtype bf16", "--top-p 0.9", "--stop 10",
                                    "--ignore-eos", "--print-ids", "--prompt-ids 1,2"};
        const char *names[] = {"--dtype", "--top-p", "--stop", "--ignore-eos", "--print-ids", "--prompt-ids"};
        for (int k = 0; k < 6; k++) {
            char what[64];
            snprintf(what, sizeof what, "generate --load %s", model_only[k]);
            bad(what, names[k], run("generate --load %s/run1 --max-new-tokens 4 %s", dir, model_only[k]));
            TU_CHECK(strstr(out, "--model only"), "%s: %s", what, out);
        }
    }
    /* config.json that disagrees with the weights: fewer layers loaded the first ones and dropped the rest
     * without a word; a config the model refuses did not name the file */
    {
        rc =
            run("train --data-path %s " TINY " --num-layers 2 --train-iters 1 --eval-iters 1 --save %s/run2l",
                data, dir);
        TU_CHECK(rc == 0, "train a 2-layer model: %s", out);
        const char *edits[][2] = {{"n_layer", "1"}, {"n_head", "3"}};
        const char *want[] = {"'h.1.", "run2l/config.json: hidden-size 32 is not divisible"};
        for (int k = 0; k < 2; k++) {
            char cp[700], *text = NULL;
            size_t n;
            snprintf(cp, sizeof cp, "%s/run2l/config.json", dir);
            cJSON *o = sl_file_read_all(cp, &text, &n) == SL_OK ? cJSON_Parse(text) : NULL;
            free(text);
            cJSON_SetNumberValue(cJSON_GetObjectItem(o, edits[k][0]), atoi(edits[k][1]));
            text = cJSON_Print(o);
            TU_CHECK(text && sl_file_write_atomic(cp, text, strlen(text)) == SL_OK, "edit %s", cp);
            free(text);
            cJSON_Delete(o);
            char what[64];
            snprintf(what, sizeof what, "generate, config.json %s %s", edits[k][0], edits[k][1]);
            bad(what, want[k], run("generate --load %s/run2l --max-new-tokens 2", dir));
            snprintf(what, sizeof what, "train --load, config.json %s %s", edits[k][0], edits[k][1]);
            if (k == 0)
                bad(what, want[k],
                    run("train --data-path %s " TINY " --num-layers 1 --train-iters 1 --load %s/run2l", data,
                        dir));
        }
    }
    /* determinism: the same seed gives the same loss trajectory */
    rc = run("train --data-path %s " TINY " --train-iters 3 --eval-interval 0 --eval-iters 1 --threads 2",
             data);
    char first[4096];
    snprintf(first, sizeof first, "%s", strstr(out, "step 3/3") ? strstr(out, "step 3/3") : "");
    *strstr(first, " | lr") = 0;
    run("train --data-path %s " TINY " --train-iters 3 --eval-interval 0 --eval-iters 1 --threads 2", data);
    TU_CHECK(strstr(out, first) != NULL, "same seed, same loss: '%s' vs %s", first, out);
    /* --eval-iters 1000000 over the 2000-token val split ran 1e6 forwards per evaluation; capped at one pass,
     * ceil(1999 / (2 x 16)) = 63 global batches of 2, with a one-line note; the same val loss as --eval-iters
     * 63 (Note [Evaluation is at most one pass over the val split]) */
    {
        char capped[256] = "", pass[256] = "";
        rc = tu_runf(out, sizeof out, "timeout 60",
                     "%s train --data-path %s " TINY " --train-iters 1 --eval-iters 1000000 --threads 2",
                     tu_cli(), data);
        const char *v = strstr(out, "final val loss");
        if (v) snprintf(capped, sizeof capped, "%.*s", (int)strcspn(v, "\n"), v);
        TU_CHECK(rc == 0 && v &&
                     strstr(out, "note: --eval-iters 1000000 is more than one pass over the 2000 "
                                 "val tokens; evaluating 63 batches of 2 x 16 (one pass)"),
                 "--eval-iters 1000000: rc %d: %s", rc, out);
        rc = run("train --data-path %s " TINY " --train-iters 1 --eval-iters 63 --threads 2", data);
        v = strstr(out, "final val loss");
        if (v) snprintf(pass, sizeof pass, "%.*s", (int)strcspn(v, "\n"), v);
        TU_CHECK(rc == 0 && v && !strcmp(capped, pass) && !strstr(out, "note: --eval-iters"),
                 "--eval-iters 63: rc %d, '%s' vs capped '%s': %s", rc, pass, capped, out);
    }
    /* a config file gives the same run */
    char cfgp[700];
    snprintf(cfgp, sizeof cfgp, "%s/cfg.json", dir);
    FILE *f = fopen(cfgp, "w");
    fprintf(f, "{\"num_layers\": 1, \"hidden-size\": 32, \"num_attention_heads\": 2, \"seq_length\": 16,"
               " \"micro_batch_size\": 2, \"train_iters\": 3, \"eval_interval\": 0, \"eval_iters\": 1}\n");
    fclose(f);
    rc = run("train --config %s --data-path %s --threads 2", cfgp, data);
    TU_CHECK(rc == 0 && strstr(out, first) != NULL, "config run matches flags run: %s", out);

    test_bad_input();
    test_input_audit();
    test_bench_flags();
    test_bench_train();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_cli");
}
