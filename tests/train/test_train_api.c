/* The run-level training API (suanli/train.h) from a C program, public headers only: a tiny GPT-2 trained
 * with checkpoints, stopped by its step callback, resumed from the checkpoint, must end with the same loss
 * and the same weights (bitwise) as an uninterrupted run; and a missing data path is bad input that writes
 * nothing. */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>

#include "suanli/base.h"
#include "suanli/data.h"
#include "suanli/safetensors.h"
#include "suanli/train.h"
#include "testutil.h"

static char dir[512], data[600];

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void tiny_opts(sl_train_opts *o, const char *save, const char *load) {
    sl_train_opts_default(o);
    o->train_iters = 6;
    o->seed = 7;
    o->threads = 2;
    o->model.num_layers = 1;
    o->model.hidden_size = 32;
    o->model.num_heads = 2;
    o->data.path = data;
    o->data.seq_length = 16;
    o->data.micro_batch_size = 2;
    o->data.global_batch_size = 4; /* 2 micro-batches per step */
    o->optim.warmup_iters = 2;
    o->eval.interval = 3;
    o->eval.iters = 2;
    o->ckpt.save_dir = save;
    o->ckpt.load_dir = load;
    o->ckpt.save_interval = 2;
    o->ckpt.keep = 0;
    o->log.out = NULL; /* silent */
}

typedef struct {
    int64_t stop_after; /* 0: run to the end */
    int64_t usr1_at;    /* raise SIGUSR1 in this step's callback (0: never) */
    int steps_seen;
    int64_t last_ckpt;
    float last_loss;
    double last_t;     /* sl_time_sec() at the last callback */
    const char *plant; /* a directory made in step 1's callback (after setup: it removes stale temp dirs) */
} observer;

static int on_step(void *user, const sl_train_progress *p) {
    observer *ob = user;
    ob->steps_seen++;
    ob->last_loss = p->stats.loss;
    ob->last_t = sl_time_sec();
    if (ob->usr1_at && p->step == ob->usr1_at) raise(SIGUSR1);
    if (ob->plant && p->step == 1) TU_CHECK(sl_mkdirs(ob->plant) == SL_OK, "plant %s", ob->plant);
    return ob->stop_after && p->step >= ob->stop_after;
}

static void on_checkpoint(void *user, int64_t step, const char *root) {
    (void)root;
    ((observer *)user)->last_ckpt = step;
}

/* Every tensor of a/model.safetensors equals b's, bitwise. */
static int same_weights(const char *a, const char *b) {
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b);
    sl_safetensors *sa = NULL, *sb = NULL;
    int ok = sl_safetensors_open(pa, &sa) == SL_OK && sl_safetensors_open(pb, &sb) == SL_OK;
    ok = ok && sl_safetensors_count(sa) == sl_safetensors_count(sb) && sl_safetensors_count(sa) > 0;
    for (int i = 0; ok && i < sl_safetensors_count(sa); i++) {
        const sl_st_tensor *x = sl_safetensors_get(sa, i), *y = sl_safetensors_find(sb, x->name);
        ok = y && x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0;
        if (!ok) fprintf(stderr, "tensor %s differs\n", x->name);
    }
    sl_safetensors_close(sa);
    sl_safetensors_close(sb);
    return ok;
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("train_api"));
    snprintf(data, sizeof data, "%s/data", dir);
    /* a small corpus: the first 20 KB of tinyshakespeare, byte tokenizer */
    char text[700], cmd[2048];
    snprintf(text, sizeof text, "%s/small.txt", dir);
    snprintf(cmd, sizeof cmd, "head -c 20000 %s/data/tinyshakespeare.txt > %s", SL_SOURCE_DIR, text);
    TU_CHECK(system(cmd) == 0, "corpus");
    sl_prepare_opts po = {.input = text, .output_dir = data, .tokenizer_type = "byte"};
    TU_CHECK(sl_data_prepare(&po) == SL_OK, "prepare: %s", sl_errmsg());

    /* uninterrupted: 6 steps, checkpoints at 2, 4, 6 */
    char full[700], part[700];
    snprintf(full, sizeof full, "%s/full", dir);
    snprintf(part, sizeof part, "%s/part", dir);
    sl_train_opts o;
    tiny_opts(&o, full, NULL);
    observer ob = {0};
    sl_train_callbacks cb = {.user = &ob, .on_step = on_step, .on_checkpoint = on_checkpoint};
    sl_train_result ra, rb, rc;
    sl_status st = sl_train_run(&o, &cb, &ra);
    TU_CHECK(st == SL_OK, "uninterrupted run: %s", sl_errmsg());
    TU_CHECK(ra.steps == 6 && ob.steps_seen == 6 && ra.resumed_step == -1, "steps %lld, callbacks %d",
             (long long)ra.steps, ob.steps_seen);
    TU_CHECK(ob.last_ckpt == 6 && isfinite(ra.loss) && ra.loss == ob.last_loss && isfinite(ra.val_loss),
             "last checkpoint %lld, loss %f, val loss %f", (long long)ob.last_ckpt, ra.loss, ra.val_loss);

    /* interrupted: the callback stops it after step 4 (checkpoint 4 is committed on the way out) */
    tiny_opts(&o, part, part);
    ob = (observer){.stop_after = 4};
    st = sl_train_run(&o, &cb, &rb);
    TU_CHECK(st == SL_OK && rb.steps == 4 && ob.last_ckpt == 4, "interrupted run: %s (steps %lld, ckpt %lld)",
             st == SL_OK ? "ok" : sl_errmsg(), (long long)rb.steps, (long long)ob.last_ckpt);
    char ck[800];
    snprintf(ck, sizeof ck, "%s/step-0000004/manifest.json", part);
    TU_CHECK(exists(ck), "checkpoint %s committed", ck);

    /* resumed: from step 4 to 6, same final loss and weights as the uninterrupted run */
    ob = (observer){0};
    st = sl_train_run(&o, &cb, &rc);
    TU_CHECK(st == SL_OK, "resumed run: %s", sl_errmsg());
    TU_CHECK(rc.resumed_step == 4 && rc.steps == 6 && ob.steps_seen == 2,
             "resumed at %lld, steps %lld, seen %d", (long long)rc.resumed_step, (long long)rc.steps,
             ob.steps_seen);
    TU_CHECK(memcmp(&rc.loss, &ra.loss, sizeof ra.loss) == 0, "final loss: resumed %.9g, uninterrupted %.9g",
             rc.loss, ra.loss);
    TU_CHECK(memcmp(&rc.val_loss, &ra.val_loss, sizeof ra.val_loss) == 0, "val loss: %.9g vs %.9g",
             rc.val_loss, ra.val_loss);
    TU_CHECK(same_weights(full, part),
             "final weights of the resumed run equal the uninterrupted run's bitwise");

    /* resumed at step 6 of --train-iters 6: no step to run; the result's val loss was NaN, now the loaded
     * weights' (Note [No steps to run]): eval step i draws val batch i, so bitwise the step-6 evaluation's */
    ob = (observer){0};
    sl_train_result rd;
    st = sl_train_run(&o, &cb, &rd);
    TU_CHECK(st == SL_OK && rd.resumed_step == 6 && rd.steps == 6 && ob.steps_seen == 0,
             "no-step resume: %s, resumed at %lld, steps %lld, seen %d", st == SL_OK ? "ok" : sl_errmsg(),
             (long long)rd.resumed_step, (long long)rd.steps, ob.steps_seen);
    TU_CHECK(memcmp(&rd.val_loss, &ra.val_loss, sizeof ra.val_loss) == 0,
             "no-step resume: val loss %.9g, the step-6 evaluation's %.9g", rd.val_loss, ra.val_loss);

    /* SIGUSR1 during step 3 (Note [SIGUSR1: checkpoint and exit for requeue]): checkpoint 3 committed off the
     * --save-interval 2 grid, result->requeue set, result->steps 3 (not 2: the step loop counts the step it
     * stopped after); the next run resumes there and ends bitwise the uninterrupted run */
    char usr[700];
    snprintf(usr, sizeof usr, "%s/usr1", dir);
    tiny_opts(&o, usr, usr);
    ob = (observer){.usr1_at = 3};
    sl_train_result re;
    st = sl_train_run(&o, &cb, &re);
    TU_CHECK(st == SL_OK && re.requeue == 1 && re.steps == 3 && ob.steps_seen == 3 && ob.last_ckpt == 3,
             "SIGUSR1 at step 3: %s, requeue %d, steps %lld, seen %d, last checkpoint %lld",
             st == SL_OK ? "ok" : sl_errmsg(), re.requeue, (long long)re.steps, ob.steps_seen,
             (long long)ob.last_ckpt);
    snprintf(ck, sizeof ck, "%s/model.safetensors", usr);
    TU_CHECK(!exists(ck), "no final save before a requeue");
    ob = (observer){0};
    st = sl_train_run(&o, &cb, &re);
    TU_CHECK(st == SL_OK && re.requeue == 0 && re.resumed_step == 3 && re.steps == 6 && ob.steps_seen == 3,
             "after SIGUSR1: %s, resumed at %lld, steps %lld, seen %d", st == SL_OK ? "ok" : sl_errmsg(),
             (long long)re.resumed_step, (long long)re.steps, ob.steps_seen);
    TU_CHECK(
        memcmp(&re.loss, &ra.loss, sizeof ra.loss) == 0 && same_weights(full, usr),
        "after SIGUSR1: final loss %.9g (uninterrupted %.9g) and weights bitwise the uninterrupted run's",
        re.loss, ra.loss);

    /* --exit-duration-in-mins 0.01: the run stops after the first step that ends 0.6 s after the loop
     * started (so no earlier than 0.6 s after sl_train_run was called), evaluated there */
    tiny_opts(&o, NULL, NULL);
    o.train_iters = 1000000;
    o.ckpt.save_interval = 0;
    o.exit_duration_mins = 0.01;
    o.eval.interval = 0; /* the val loss comes from the evaluation at the stop */
    ob = (observer){0};
    double t0 = sl_time_sec();
    st = sl_train_run(&o, &cb, &re);
    TU_CHECK(
        st == SL_OK && re.steps > 0 && re.steps < o.train_iters && re.steps == ob.steps_seen &&
            ob.last_t - t0 >= 0.6 && isfinite(re.val_loss),
        "--exit-duration-in-mins 0.01: %s, %lld steps (seen %d), stopped %.3f s after the call, val loss %g",
        st == SL_OK ? "ok" : sl_errmsg(), (long long)re.steps, ob.steps_seen, ob.last_t - t0, re.val_loss);

    /* a checkpoint whose background write fails (a directory where its shard file goes) is not committed:
     * the run fails at the next poll, with no step-0000002 and no `latest` published (committing it anyway
     * survived a mutation audit: no test made the writer fail); planted during step 1, since a run's setup
     * removes step-N.tmp dirs left by interrupted saves (Note [Stale temp dirs] in src/ckpt/ckpt.c) */
    char obst[700], plant[800];
    snprintf(obst, sizeof obst, "%s/obst", dir);
    snprintf(plant, sizeof plant, "%s/step-0000002.tmp/shard-r00000.safetensors", obst);
    tiny_opts(&o, obst, NULL);
    ob = (observer){.plant = plant};
    st = sl_train_run(&o, &cb, &re);
    TU_CHECK(st != SL_OK && st != SL_ERR_INVALID && ob.last_ckpt == 0,
             "failed checkpoint write: status %s, last checkpoint %lld (%s)", sl_status_name(st),
             (long long)ob.last_ckpt, sl_errmsg());
    snprintf(ck, sizeof ck, "%s/step-0000002", obst);
    TU_CHECK(!exists(ck), "the failed checkpoint step 2 was committed");
    snprintf(ck, sizeof ck, "%s/latest", obst);
    TU_CHECK(!exists(ck), "`latest` written for a failed checkpoint");

    /* bad input: a missing data path is SL_ERR_INVALID, names the path, and nothing is written */
    char missing[700], never[700];
    snprintf(missing, sizeof missing, "%s/no-such-data", dir);
    snprintf(never, sizeof never, "%s/never", dir);
    tiny_opts(&o, never, NULL);
    o.data.path = missing;
    st = sl_train_run(&o, NULL, NULL);
    TU_CHECK(st == SL_ERR_INVALID && strstr(sl_errmsg(), missing) && !strchr(sl_errmsg(), '\n'),
             "missing data: status %s, message '%s'", sl_status_name(st), sl_errmsg());
    TU_CHECK(!exists(never), "nothing written on a rejected run");
    /* a model option that conflicts with the data: also bad input, nothing written */
    tiny_opts(&o, never, NULL);
    o.model.vocab_size = 300;
    st = sl_train_run(&o, NULL, NULL);
    TU_CHECK(st == SL_ERR_INVALID && strstr(sl_errmsg(), "vocab"), "vocab mismatch: %s", sl_errmsg());
    TU_CHECK(!exists(never), "nothing written on a rejected run (vocab)");

    if (tu_failures == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        TU_CHECK(system(cmd) == 0, "cleanup");
    }
    return tu_finish("test_train_api");
}
