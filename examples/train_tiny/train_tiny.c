/* train_tiny — train a tiny GPT-2 on a text file, with suanli's public API only.
 *
 *   train_tiny TEXT_FILE OUT_DIR [STEPS]
 *
 * 1. tokenizes the text (byte level) into OUT_DIR/data (token shards + tokenizer.json; train/val split);
 * 2. trains a 2-layer GPT-2 with AdamW, warmup + cosine LR and gradient clipping (sl_trainer_step), printing
 *    the loss, and measures the validation loss before and after;
 * 3. saves OUT_DIR/model/{model.safetensors, config.json, tokenizer.json}, which
 *    `suanli generate --load OUT_DIR/model` reads, and prints a short sample.
 *
 * The loop below (steps, eval, save) is what sl_train_run will own (examples/README.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <suanli/suanli.h>

typedef struct {
    sl_dataset *ds;
    int B, T;
    uint64_t seed;
} batches;

/* sl_batch_fn: micro-batch `micro` of step `step`, a pure function of (seed, step, micro) */
static sl_status next_batch(void *user, int64_t step, int micro, int32_t *ids, int32_t *targets) {
    batches *b = user;
    return sl_dataset_batch(b->ds, b->B, b->T, b->seed, (uint64_t)step, 0, micro, ids, targets);
}

static int print_token(void *user, int32_t id) {
    char buf[64];
    int n = sl_tokenizer_decode_token(user, id, buf, (int)sizeof buf);
    if (n > 0) fwrite(buf, 1, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf), stdout);
    return 0;
}

#define CHECK(x)                                                                                             \
    do {                                                                                                     \
        if ((x) != SL_OK) goto fail;                                                                         \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TEXT_FILE OUT_DIR [STEPS]\n", argv[0]);
        return 2;
    }
    const char *text = argv[1], *out = argv[2];
    int steps = argc > 3 ? atoi(argv[3]) : 100;
    char data_dir[4096], model_dir[4096], tok_path[4200];
    snprintf(data_dir, sizeof data_dir, "%s/data", out);
    snprintf(model_dir, sizeof model_dir, "%s/model", out);
    sl_dataset *train = NULL, *val = NULL;
    sl_tokenizer *tok = NULL;
    sl_model *m = NULL;
    sl_trainer tr;
    int have_tr = 0, rc = 1;

    /* 1. data: byte-level tokens, last 10% of the text for validation */
    sl_prepare_opts po = {
        .input = text, .output_dir = data_dir, .tokenizer_type = "byte", .val_fraction = 0.1};
    CHECK(sl_data_prepare(&po));
    CHECK(sl_dataset_open(data_dir, "train", &train));
    CHECK(sl_dataset_open(data_dir, "val", &val));
    CHECK(sl_tokenizer_load(data_dir, &tok));

    /* 2. model and trainer */
    sl_gpt2_config cfg = {.n_layer = 2,
                          .n_head = 2,
                          .n_embd = 64,
                          .vocab_size = sl_dataset_vocab_size(train),
                          .max_seq_len = 64};
    CHECK(sl_gpt2_new(&cfg, &m));
    sl_model_init_weights(m, 1337);
    sl_trainer_config tc = {.B = 8,
                            .T = 64,
                            .accum = 1,
                            .lr = 3e-3f,
                            .min_lr = 3e-4f,
                            .clip = 1.0f,
                            .warmup = 10,
                            .decay_iters = steps,
                            .hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f}};
    CHECK(sl_trainer_init(&tr, m, &tc));
    have_tr = 1;
    batches tb = {train, tc.B, tc.T, 1}, vb = {val, tc.B, tc.T, 2};
    float val0, val1;
    CHECK(sl_trainer_eval(&tr, next_batch, &vb, 8, &val0));
    printf("train_tiny: suanli %s, %lld parameters, %d steps of %d x %d tokens\n", sl_version(),
           (long long)m->numel, steps, tc.B, tc.T);
    for (int64_t step = 0; step < steps; step++) {
        sl_step_stats ss;
        CHECK(sl_trainer_step(&tr, step, next_batch, &tb, &ss));
        if (step % 20 == 0 || step == steps - 1)
            printf("step %4lld/%d  loss %.4f  lr %.2e  grad norm %.3f  %.1f ms\n", (long long)step + 1, steps,
                   ss.loss, ss.lr, ss.grad_norm, ss.seconds * 1e3);
    }
    CHECK(sl_trainer_eval(&tr, next_batch, &vb, 8, &val1));
    printf("train_tiny: val loss %.4f -> %.4f nats/byte\n", val0, val1);

    /* 3. save (weights + config; the tokenizer beside them) and sample */
    CHECK(sl_mkdirs(model_dir));
    CHECK(sl_model_save(m, model_dir, NULL));
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", model_dir);
    CHECK(sl_tokenizer_save(tok, tok_path));
    printf("train_tiny: saved %s\n", model_dir);
    const char *prompt = "ROMEO:";
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK(sl_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n));
    sl_sample_opts so = {.temperature = 0.8f, .top_k = 40, .top_p = 1.0f, .seed = 7};
    fputs(prompt, stdout);
    sl_status gst = sl_model_generate(m, ids, (int)n, 48, &so, NULL, 0, print_token, tok, NULL, NULL);
    free(ids);
    printf("\n");
    CHECK(gst);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "train_tiny: %s\n", sl_errmsg());
done:
    if (have_tr) sl_trainer_free(&tr);
    sl_model_free(m);
    sl_tokenizer_free(tok);
    sl_dataset_close(val);
    sl_dataset_close(train);
    return rc;
}
