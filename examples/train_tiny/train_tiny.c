/* train_tiny — train a tiny GPT-2 on a text file with checkpoints and resume, suanli's public API only.
 *
 *   train_tiny TEXT_FILE OUT_DIR [STEPS [EVERY]]      (defaults: 100 steps, a checkpoint every 20)
 *
 * 1. tokenizes the text (byte level, the last 10% for validation) into OUT_DIR/data (sl_data_prepare);
 * 2. trains a 2-layer GPT-2 to STEPS optimizer steps with sl_train_run: AdamW, warmup + cosine LR, gradient
 *    clipping, the val loss every 10 steps, a checkpoint OUT_DIR/model/step-NNNNNNN every EVERY steps, and
 *    at the end OUT_DIR/model/{model.safetensors, config.json, tokenizer.json} (what
 *    `suanli generate --load OUT_DIR/model` reads). One line per step comes from the on_step callback.
 * 3. Run it again on the same OUT_DIR (with a larger STEPS to train further) and it resumes from the newest
 *    checkpoint there; the tokens of step 1 are reused.
 * 4. prints the val loss (first and last evaluation of this run) and a short sample of the saved model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <suanli/suanli.h>

typedef struct {
    int64_t first_eval_step, last_eval_step;
    float first_val, last_val;
} progress;

/* after every step: one line; remember the first and last val loss of this run */
static int on_step(void *user, const sl_train_progress *p) {
    progress *pr = user;
    printf("step %4lld/%lld  loss %.4f  lr %.2e  grad norm %.3f  %5.1f ms", (long long)p->step,
           (long long)p->train_iters, p->stats.loss, p->stats.lr, p->stats.grad_norm, p->stats.seconds * 1e3);
    if (p->evaluated) {
        printf("  val loss %.4f", p->val_loss);
        if (pr->first_eval_step < 0) pr->first_eval_step = p->step, pr->first_val = p->val_loss;
        pr->last_eval_step = p->step, pr->last_val = p->val_loss;
    }
    printf("\n");
    fflush(stdout);
    return 0; /* non-zero would stop here (the pending checkpoint and the final files are still written) */
}

static void on_checkpoint(void *user, int64_t step, const char *dir) {
    (void)user;
    printf("checkpoint: %s/step-%07lld\n", dir, (long long)step);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TEXT_FILE OUT_DIR [STEPS [EVERY]]\n", argv[0]);
        return 2;
    }
    const char *text = argv[1], *out = argv[2];
    int64_t steps = argc > 3 ? atoll(argv[3]) : 100, every = argc > 4 ? atoll(argv[4]) : 20;
    char data_dir[4096], model_dir[4096], shard[4200];
    snprintf(data_dir, sizeof data_dir, "%s/data", out);
    snprintf(model_dir, sizeof model_dir, "%s/model", out);
    snprintf(shard, sizeof shard, "%s/train_000.bin", data_dir);
    sl_model *m = NULL;
    sl_tokenizer *tok = NULL;
    int rc = 1;

    /* 1. data: byte-level token shards + tokenizer.json (kept for a resumed run) */
    if (access(shard, F_OK) != 0) {
        sl_prepare_stats ps;
        sl_prepare_opts po = {.input = text,
                              .output_dir = data_dir,
                              .tokenizer_type = "byte",
                              .val_fraction = 0.1,
                              .stats = &ps};
        if (sl_data_prepare(&po) != SL_OK) goto fail;
        printf("train_tiny: %s -> %s: %lld train / %lld val tokens\n", text, data_dir,
               (long long)ps.train_tokens, (long long)ps.val_tokens);
    }

    /* 2. the job: a 2-layer GPT-2, batches of 8 x 64 tokens, checkpoints in OUT_DIR/model */
    sl_train_opts o;
    sl_train_opts_default(&o);
    o.train_iters = steps;
    o.seed = 1337;
    o.model.num_layers = 2;
    o.model.num_heads = 2;
    o.model.hidden_size = 64;
    o.data.path = data_dir;
    o.data.seq_length = 64;
    o.data.micro_batch_size = 8;
    o.optim.lr = 3e-3;
    o.optim.min_lr = 3e-4;
    o.optim.warmup_iters = 10;
    o.eval.interval = 10;
    o.eval.iters = 8;
    o.ckpt.save_dir = o.ckpt.load_dir = model_dir; /* 3. resume from its newest checkpoint, if any */
    o.ckpt.save_interval = every;
    o.log.out = NULL; /* the callbacks print the progress */
    progress pr = {.first_eval_step = -1, .first_val = NAN, .last_val = NAN};
    sl_train_callbacks cb = {.user = &pr, .on_step = on_step, .on_checkpoint = on_checkpoint};
    sl_train_result r;
    printf("train_tiny: suanli %s, %lld steps into %s\n", sl_version(), (long long)steps, model_dir);
    if (sl_train_run(&o, &cb, &r) != SL_OK) goto fail;
    if (r.resumed_step >= 0) printf("train_tiny: resumed from step %lld\n", (long long)r.resumed_step);
    if (r.steps == r.resumed_step)
        printf("train_tiny: already at step %lld; pass a larger STEPS to train further\n",
               (long long)r.steps);
    else
        printf("train_tiny: %lld steps in %.1f s; final val loss %.4f\n",
               (long long)(r.steps - (r.resumed_step > 0 ? r.resumed_step : 0)), r.seconds, r.val_loss);
    if (pr.first_eval_step >= 0)
        printf("train_tiny: val loss %.4f -> %.4f (steps %lld -> %lld)\n", pr.first_val, pr.last_val,
               (long long)pr.first_eval_step, (long long)pr.last_eval_step);

    /* 4. a sample of the saved model */
    if (sl_model_load(model_dir, &m) != SL_OK || sl_tokenizer_load(model_dir, &tok) != SL_OK) goto fail;
    if (sl_train_sample_print(m, tok, "ROMEO:", 48, 0.8f, 40, 7, stdout, NULL) != SL_OK) goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "train_tiny: %s\n", sl_errmsg());
done:
    sl_tokenizer_free(tok);
    sl_model_free(m);
    return rc;
}
